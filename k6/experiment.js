// The load of `cargo xtask experiment` (docs/design.md §9), of the compose stack's `k6`
// service, and for running by hand: `k6 run k6/experiment.js` against the services.
// xtask runs this script once per mode with the same settings, injects and removes the
// catalog fault itself, and computes every figure from the request log it asks for.
//
//   MODEL=open   RATE=150 DURATION=30s   an open model: RATE orders per second arrive
//                                        whatever the service does (constant-arrival-rate)
//   MODEL=closed VUS=250 THINK_MS=750    a closed loop: each user sends its next order
//                                        THINK_MS (±1/3, random) after its last answer
//
// The client gives up after TIMEOUT_MS (k6's request timeout), by default a second past
// its budget: a client that gave up at the budget would cut every latency there, and the
// p99 threshold could never fail. THINK_MS is the same after every answer, whatever its
// status, so both modes see the same client behaviour.
//
// Run by hand or by `docker compose --profile load run --rm k6`, with DELAY_MS set
// (and CATALOG_ADMIN_URL), setup() makes the catalog slow through its admin API
// (`PUT /admin/faults`, DELAY_MS ± JITTER_MS) and teardown() removes the fault; both
// fail the run if the admin API is unreachable. xtask leaves DELAY_MS unset.
//
// With LOG_REQUESTS=1 (xtask sets it), each answer is one console line
// `arrival_ms,status,elapsed_ms` (status 0: the client gave up; 1: a transport error;
// elapsed_ms with three decimals for an answer), and `,budget_ms` where each order has
// its own (BUDGET_MIN, BUDGET_MAX); xtask writes them to a file with `--log-format raw
// --console-output FILE`. Without it the console stays quiet.
//
// Thresholds carry the acceptance criteria, so k6 exits non-zero (99) when they fail:
// no status other than 201, 503, 504 or a client timeout (with OUTCOME_UNKNOWN_OK=1,
// as when the link to the database is cut, also a 500 whose problem type is
// urn:problem:outcome-unknown); every check() passes (a 201 carries the order's id, a
// 503 or 504 is application/problem+json); in propagate mode, p99 within BUDGET_MS +
// MARGIN_MS. Observe refuses nothing, so it has legacy's thresholds.
//
// The end-of-test summary is k6's own (thresholds, checks, metrics on stdout); the same
// as JSON with k6's `--summary-export FILE` (or K6_SUMMARY_EXPORT=FILE).

import http from 'k6/http';
import { check, sleep } from 'k6';
import { Rate } from 'k6/metrics';
import { envChoice, envInt, envString } from './lib/env.js';

const MODE = envChoice('MODE', 'propagate', ['propagate', 'observe', 'legacy']);
const MODEL = envChoice('MODEL', 'open', ['open', 'closed']);
const RATE = envInt('RATE', 150);
const VUS = envInt('VUS', 50);
const DURATION = envString('DURATION', '30s');
const BUDGET_MS = envInt('BUDGET_MS', 700);
// BUDGET_MIN and BUDGET_MAX (both, ms): each order's budget drawn uniformly from them,
// logged with its answer; BUDGET_MS is then the largest, for the p99 threshold.
const BUDGET_MIN = envInt('BUDGET_MIN', 0);
const BUDGET_MAX = envInt('BUDGET_MAX', 0);
const TIMEOUT_MS = envInt('TIMEOUT_MS', BUDGET_MS + 1000);
const MARGIN_MS = envInt('MARGIN_MS', 50);
const THINK_MS = envInt('THINK_MS', 0);
const ORDERS_URL = envString('ORDERS_URL', 'http://127.0.0.1:8080').replace(/\/+$/, '');
const DELAY_MS = envInt('DELAY_MS', 0);
const JITTER_MS = envInt('JITTER_MS', 0);
const CATALOG_ADMIN_URL = envString('CATALOG_ADMIN_URL', 'http://127.0.0.1:9081').replace(/\/+$/, '');
const OUTCOME_UNKNOWN_OK = envInt('OUTCOME_UNKNOWN_OK', 0) === 1;
const LOG_REQUESTS = envInt('LOG_REQUESTS', 0) === 1;
const SKU_COUNT = 1000; // SKU-00001 .. SKU-01000 exist in catalog and inventory

const unexpectedStatus = new Rate('unexpected_status');
const DESIGNED = OUTCOME_UNKNOWN_OK
  ? 'status is 201, 503, 504, 500 outcome-unknown or a client timeout'
  : 'status is 201, 503, 504 or a client timeout';

// 201 is an order, 504 "the deadline ran out", 503 "refused early": the service doing
// its job, so none of them counts in http_req_failed.
http.setResponseCallback(http.expectedStatuses(201, 503, 504));

const scenario =
  MODEL === 'open'
    ? {
        executor: 'constant-arrival-rate',
        rate: RATE,
        timeUnit: '1s',
        duration: DURATION,
        // Enough users for every arrival to wait its whole timeout: k6 never has to
        // drop an arrival (dropped_iterations) for want of a free user.
        preAllocatedVUs: Math.ceil((RATE * TIMEOUT_MS) / 1000) + 10,
        maxVUs: Math.ceil((RATE * TIMEOUT_MS) / 1000) * 2 + 20,
        gracefulStop: `${Math.ceil(TIMEOUT_MS / 1000) + 1}s`,
      }
    : {
        executor: 'constant-vus',
        vus: VUS,
        duration: DURATION,
        gracefulStop: `${Math.ceil(TIMEOUT_MS / 1000) + 1}s`,
      };

const p99 = MODE === 'propagate' ? [`p(99)<${BUDGET_MS + MARGIN_MS}`] : ['max>=0'];

export const options = {
  scenarios: { orders: { ...scenario, exec: 'createOrder' } },
  thresholds: {
    unexpected_status: ['rate==0'],
    checks: ['rate==1'],
    'http_req_duration{endpoint:create_order}': p99,
  },
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)'],
  tags: { mode: MODE },
  discardResponseBodies: true,
};

function setFault(method, body) {
  const url = `${CATALOG_ADMIN_URL}/admin/faults`;
  const res = http.request(method, url, body && JSON.stringify(body), {
    headers: { 'Content-Type': 'application/json' },
    responseType: 'text',
  });
  if (res.status < 200 || res.status > 299) {
    throw new Error(`${method} ${url} answered ${res.status} ${res.error || res.body}`);
  }
}

export function setup() {
  if (DELAY_MS > 0) {
    setFault('PUT', { delay_ms: DELAY_MS, jitter_ms: JITTER_MS, error_rate: 0.0 });
  }
}

export function teardown() {
  if (DELAY_MS > 0) {
    setFault('DELETE', null);
  }
}

function randomSku() {
  const n = 1 + Math.floor(Math.random() * SKU_COUNT);
  return `SKU-${String(n).padStart(5, '0')}`;
}

function orderBudget() {
  if (BUDGET_MAX > 0) {
    return BUDGET_MIN + Math.floor(Math.random() * (BUDGET_MAX - BUDGET_MIN + 1));
  }
  return BUDGET_MS;
}

export function createOrder() {
  const budget = orderBudget();
  const arrival = Date.now();
  const res = http.post(
    `${ORDERS_URL}/api/orders`,
    JSON.stringify({ sku: randomSku(), quantity: 1 }),
    {
      headers: {
        'Content-Type': 'application/json',
        'X-Request-Timeout-Ms': String(budget),
      },
      timeout: `${TIMEOUT_MS}ms`,
      // Read, for the checks below (and a 500's problem type); the rest stay discarded.
      responseType: 'text',
      tags: { name: 'POST /api/orders', endpoint: 'create_order' },
    },
  );
  // k6 reports a request it cut at its timeout as status 0 with error code 1050.
  const status = res.status !== 0 ? res.status : res.error_code === 1050 ? 0 : 1;
  // An answer's time from k6's own timings (microseconds, so a p50 can be compared to a
  // tenth of a millisecond); a request without an answer by the wall clock.
  const t = res.timings;
  const elapsed =
    status > 1
      ? (t.blocked + t.connecting + t.tls_handshaking + t.duration).toFixed(3)
      : String(Date.now() - arrival);
  const unknown =
    OUTCOME_UNKNOWN_OK && status === 500 && String(res.body).includes('urn:problem:outcome-unknown');
  const designed = [0, 201, 503, 504].includes(status) || unknown;
  unexpectedStatus.add(!designed);
  checkAnswer(res, status, designed);
  if (LOG_REQUESTS) {
    console.log(BUDGET_MAX > 0 ? `${arrival},${status},${elapsed},${budget}` : `${arrival},${status},${elapsed}`);
  }
  if (MODEL === 'closed' && THINK_MS > 0) {
    sleep((THINK_MS * (2 / 3 + (2 / 3) * Math.random())) / 1000);
  }
}

// The answer's shape, by its status: what a client of orders-service relies on.
function checkAnswer(res, status, designed) {
  const checks = { [DESIGNED]: () => designed };
  if (status === 201) {
    checks['201 carries the order, with its id'] = (r) => {
      try {
        return Number.isInteger(JSON.parse(r.body).id);
      } catch (_) {
        return false;
      }
    };
  } else if (status === 503 || status === 504) {
    checks['503 and 504 are application/problem+json'] = (r) =>
      String(r.headers['Content-Type']).startsWith('application/problem+json');
  }
  check(res, checks);
}
