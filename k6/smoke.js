// A few-second check that both services answer correctly, without any fault injection.
// Run it before the load experiment, or after a deploy:
//
//   k6 run k6/smoke.js
//
// It fails (exit code 99) on any non-2xx answer, any failed check, or p99 > 1000 ms.

import http from 'k6/http';
import { check } from 'k6';
import { envInt, envString } from './lib/env.js';

const VUS = envInt('VUS', 5);
const DURATION = envString('DURATION', '5s');
const ORDERS_URL = envString('ORDERS_URL', 'http://127.0.0.1:8080').replace(/\/+$/, '');
const CATALOG_URL = envString('CATALOG_URL', 'http://127.0.0.1:8081').replace(/\/+$/, '');
const SKU_COUNT = 1000; // SKU-00001 .. SKU-01000

// Only 2xx is a success here (k6's default would also accept 3xx).
http.setResponseCallback(http.expectedStatuses({ min: 200, max: 299 }));

export const options = {
  scenarios: {
    smoke: { executor: 'constant-vus', vus: VUS, duration: DURATION },
  },
  thresholds: {
    http_req_failed: ['rate==0'],
    checks: ['rate==1'],
    http_req_duration: ['p(99)<1000'],
  },
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)'],
};

function randomSku() {
  const n = 1 + Math.floor(Math.random() * SKU_COUNT);
  return `SKU-${String(n).padStart(5, '0')}`;
}

function json(res) {
  try {
    return res.json();
  } catch (_) {
    return null;
  }
}

export default function () {
  const item = http.get(`${CATALOG_URL}/catalog/SKU-00001`, {
    tags: { name: 'GET /catalog/{sku}' },
  });
  check(item, {
    'catalog: 200': (r) => r.status === 200,
    'catalog: body has sku, name, price_cents': (r) => {
      const b = json(r);
      return b !== null && b.sku === 'SKU-00001' && typeof b.name === 'string' &&
        typeof b.price_cents === 'number';
    },
  });

  const sku = randomSku();
  const order = http.post(`${ORDERS_URL}/api/orders`, JSON.stringify({ sku, quantity: 1 }), {
    headers: {
      'Content-Type': 'application/json',
      'Idempotency-Key': `k6-smoke-${__VU}-${__ITER}-${Date.now()}`,
    },
    tags: { name: 'POST /api/orders' },
  });
  check(order, {
    'orders: 201': (r) => r.status === 201,
    'orders: body has id, sku, quantity': (r) => {
      const b = json(r);
      return b !== null && b.id !== undefined && b.id !== null && b.sku === sku && b.quantity === 1;
    },
  });
}
