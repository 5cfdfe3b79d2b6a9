// The before/after experiment (docs/design.md §9).
//
//   k6 run k6/deadline-load.js                                # propagate, both models
//   MODE=legacy k6 run k6/deadline-load.js                    # the "before"
//   k6 run --vus 250 --duration 5m k6/deadline-load.js        # the seed's command
//
// MODE does not switch the service: it must match the DEADLINE_MODE orders-service
// runs with. It only chooses the thresholds and labels the summary.
//
// setup() makes the catalog slow through its admin API (1 s by default), then
// POST /api/orders is driven with a 700 ms budget by two workload models:
//
// - closed_loop (constant-vus): 250 users, each sends its next request only when the
//   previous one has answered. This is the seed's run. Its weakness: when the service
//   slows down, the users slow down with it, so the load drops exactly when the queue
//   grows and the queueing delay never shows up in the numbers (coordinated omission).
// - open_model (constant-arrival-rate): RATE requests per second arrive whatever the
//   service does, as real clients do. Queueing shows up as latency, and as
//   `dropped_iterations` when even 2 x VUS users are all stuck waiting.
//
// The acceptance criteria are thresholds, so k6 exits non-zero (99) when they fail:
// - propagate: p99 of each scenario < BUDGET_MS + MARGIN_MS. 504 (deadline ran out)
//   and 503 (refused early) are the designed outcome and count as expected statuses;
// - both modes: no status other than 201/503/504 (`unexpected_status` rate is 0).
// Legacy is expected to blow the budget, so it has no latency threshold.
//
// Every setting is an environment variable; see k6/README.md. `--vus/--duration` on the
// command line replace both scenarios with k6's single closed-loop `default` scenario
// (k6 warns about it); the thresholds still apply. `SCENARIO=closed VUS=250
// DURATION=5m` is the same run under its own name.

import http from 'k6/http';
import exec from 'k6/execution';
import { check, sleep } from 'k6';
import { Counter, Rate } from 'k6/metrics';
import { envChoice, envInt, envString } from './lib/env.js';

// ---------------------------------------------------------------- settings

// "30s", "2m", "5m", "1m30s", "1h", "500ms" -> milliseconds. Throws on anything else,
// so a typo fails at start-up instead of producing a wrong startTime.
export function parseDurationMs(text) {
  const units = { h: 3600000, m: 60000, s: 1000, ms: 1 };
  const part = /(\d+(?:\.\d+)?)(ms|h|m|s)/g;
  let total = 0;
  let consumed = '';
  let match;
  while ((match = part.exec(text)) !== null) {
    total += parseFloat(match[1]) * units[match[2]];
    consumed += match[0];
  }
  if (text === '' || consumed !== text) {
    throw new Error(`cannot parse duration "${text}" (use e.g. 30s, 5m, 1m30s)`);
  }
  return Math.round(total);
}

function formatDuration(ms) {
  return `${ms / 1000}s`;
}

const MODE = envChoice('MODE', 'propagate', ['propagate', 'legacy']);
const SCENARIO = envChoice('SCENARIO', 'both', ['closed', 'open', 'both']);
const VUS = envInt('VUS', 250);
const DURATION = envString('DURATION', '5m');
const DURATION_MS = parseDurationMs(DURATION);
// How long a scenario's in-flight requests may finish after its DURATION. With
// SCENARIO=both the open model starts only after this, so the two never overlap and
// the service gets a pause to drain. 30s is k6's own default and matches legacy's fixed
// 30 s client timeout; a request still running after it is cut by k6 and not recorded.
const GRACEFUL_STOP = envString('GRACEFUL_STOP', '30s');
const GRACEFUL_STOP_MS = parseDurationMs(GRACEFUL_STOP);
const RATE = envInt('RATE', 200);
const BUDGET_MS = envInt('BUDGET_MS', 700);
const MARGIN_MS = envInt('MARGIN_MS', 50);
// A closed-loop user that gets 503 waits for its Retry-After (at most 1 s, with jitter)
// before its next request, as a well-behaved client does. Without it, 250 users that
// are refused in a few milliseconds turn into a retry storm of tens of thousands of
// requests per second, which measures the load generator, not the technique.
// RETRY_AFTER=ignore restores the hammering. The open model never waits: its arrivals
// do not depend on answers.
const RETRY_AFTER = envChoice('RETRY_AFTER', 'honor', ['honor', 'ignore']);
const DELAY_MS = envInt('DELAY_MS', 1000);
const ORDERS_URL = envString('ORDERS_URL', 'http://127.0.0.1:8080').replace(/\/+$/, '');
const CATALOG_ADMIN_URL = envString('CATALOG_ADMIN_URL', 'http://127.0.0.1:9081')
  .replace(/\/+$/, '');
const SUMMARY_PATH = envString('SUMMARY_PATH', `results/k6-summary-${MODE}.json`);

const SKU_COUNT = 1000; // SKU-00001 .. SKU-01000 exist in catalog and inventory

// ---------------------------------------------------------------- metrics

const unexpectedStatus = new Rate('unexpected_status'); // not 201, 503 or 504
const overBudget = new Rate('over_budget'); // took longer than BUDGET_MS + MARGIN_MS
const status201 = new Counter('status_201');
const status503 = new Counter('status_503');
const status504 = new Counter('status_504');
const statusOther = new Counter('status_other');

// 201 is an order, 504 is "the deadline ran out", 503 is "refused early": all three
// are the service doing its job, so none of them counts in http_req_failed.
http.setResponseCallback(http.expectedStatuses(201, 503, 504));

// ---------------------------------------------------------------- scenarios

const CLOSED = 'closed_loop';
const OPEN = 'open_model';

function buildScenarios() {
  const scenarios = {};
  let startMs = 0;
  if (SCENARIO === 'closed' || SCENARIO === 'both') {
    scenarios[CLOSED] = {
      executor: 'constant-vus',
      exec: 'createOrder',
      vus: VUS,
      duration: DURATION,
      gracefulStop: GRACEFUL_STOP,
      tags: { model: 'closed' },
    };
    startMs += DURATION_MS + GRACEFUL_STOP_MS;
  }
  if (SCENARIO === 'open' || SCENARIO === 'both') {
    scenarios[OPEN] = {
      executor: 'constant-arrival-rate',
      exec: 'createOrder',
      rate: RATE,
      timeUnit: '1s',
      duration: DURATION,
      preAllocatedVUs: Math.max(1, VUS),
      maxVUs: Math.max(1, 2 * VUS),
      gracefulStop: GRACEFUL_STOP,
      startTime: formatDuration(startMs),
      tags: { model: 'open' },
    };
  }
  return scenarios;
}

const scenarios = buildScenarios();

// Scenarios that get thresholds and summary lines. `default` is the scenario k6 runs
// instead of the ones above when `--vus/--duration` are given on the command line (the
// seed's command); a scenario without samples passes its thresholds.
const REPORTED = [...Object.keys(scenarios), 'default'];

function buildThresholds() {
  const thresholds = {
    // Both modes: the service answers only with the statuses the design allows.
    unexpected_status: ['rate==0'],
  };
  // All order requests together (not the admin calls of setup/teardown).
  const orders = 'http_req_duration{endpoint:create_order}';
  thresholds[orders] = MODE === 'propagate' ? [`p(99)<${BUDGET_MS + MARGIN_MS}`] : ['max>=0'];
  for (const name of REPORTED) {
    const metric = `http_req_duration{scenario:${name}}`;
    thresholds[`unexpected_status{scenario:${name}}`] = ['rate==0'];
    if (MODE === 'propagate') {
      // The acceptance criterion: p99 within the ingress budget plus a few ms.
      thresholds[metric] = [`p(99)<${BUDGET_MS + MARGIN_MS}`];
    } else {
      // Legacy is expected to blow the budget. This always-true threshold only makes
      // k6 keep the per-scenario numbers, so the summary can show them.
      thresholds[metric] = ['max>=0'];
    }
    for (const status of ['201', '503', '504']) {
      thresholds[`http_reqs{scenario:${name},status:${status}}`] = ['count>=0'];
    }
    thresholds[`over_budget{scenario:${name}}`] = ['rate>=0'];
  }
  return thresholds;
}

export const options = {
  scenarios,
  thresholds: buildThresholds(),
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)'],
  // Every metric carries the mode, so outputs (Prometheus remote write, JSON) of the
  // two runs can be told apart.
  tags: { mode: MODE },
  // The load only looks at status codes; reading bodies would cost CPU on the k6 host.
  discardResponseBodies: true,
  setupTimeout: '30s',
  teardownTimeout: '30s',
};

// ---------------------------------------------------------------- setup / teardown

const ADMIN_OK = { responseCallback: http.expectedStatuses({ min: 200, max: 299 }) };

export function setup() {
  const fault = { delay_ms: DELAY_MS, jitter_ms: 0, error_rate: 0.0 };
  const res = http.put(`${CATALOG_ADMIN_URL}/admin/faults`, JSON.stringify(fault), {
    ...ADMIN_OK,
    headers: { 'Content-Type': 'application/json' },
    responseType: 'text',
    tags: { name: 'PUT /admin/faults' },
  });
  if (res.status === 0) {
    throw new Error(
      `catalog admin API unreachable at ${CATALOG_ADMIN_URL}: ${res.error}. ` +
        'Start catalog-service (admin address CATALOG_ADMIN_ADDR) or set CATALOG_ADMIN_URL.',
    );
  }
  const ok = check(res, { 'fault injected (PUT /admin/faults is 200)': (r) => r.status === 200 });
  if (!ok) {
    throw new Error(`PUT ${CATALOG_ADMIN_URL}/admin/faults answered ${res.status}: ${res.body}`);
  }
  const injected = res.json();
  // The scenarios k6 actually runs, after command-line flags were applied.
  const running = exec.test.options.scenarios;
  console.log(
    `mode=${MODE} budget=${BUDGET_MS}ms fault=${JSON.stringify(injected)} ` +
      `scenarios=${Object.keys(running).join(',')} orders=${ORDERS_URL}`,
  );
  return { fault: injected, injected_at: new Date().toISOString(), scenarios: running };
}

export function teardown() {
  const res = http.del(`${CATALOG_ADMIN_URL}/admin/faults`, null, {
    ...ADMIN_OK,
    tags: { name: 'DELETE /admin/faults' },
  });
  const ok = check(res, {
    'fault removed (DELETE /admin/faults is 2xx)': (r) => r.status >= 200 && r.status < 300,
  });
  if (!ok) {
    console.error(
      `could not remove the catalog fault (status ${res.status} ${res.error || ''}); ` +
        `run: curl -X DELETE ${CATALOG_ADMIN_URL}/admin/faults`,
    );
  }
}

// ---------------------------------------------------------------- the request

function randomSku() {
  const n = 1 + Math.floor(Math.random() * SKU_COUNT);
  return `SKU-${String(n).padStart(5, '0')}`;
}

let warnedUnexpected = 0; // per VU: each VU has its own copy of the script's globals

export function createOrder() {
  const scenario = exec.scenario.name;
  const body = JSON.stringify({ sku: randomSku(), quantity: 1 });
  const res = http.post(`${ORDERS_URL}/api/orders`, body, {
    headers: {
      'Content-Type': 'application/json',
      'X-Request-Timeout-Ms': String(BUDGET_MS),
      // Unique per iteration: every request is a new order, never a replay.
      'Idempotency-Key': `k6-${scenario}-${__VU}-${__ITER}-${Date.now()}`,
    },
    // k6's own default (60s) made explicit: k6 must never cut a request itself, or
    // legacy's slow answers would disappear from the numbers instead of showing up.
    timeout: '60s',
    tags: { name: 'POST /api/orders', endpoint: 'create_order' },
  });

  const tags = { status: String(res.status) };
  switch (res.status) {
    case 201:
      status201.add(1, tags);
      break;
    case 503:
      status503.add(1, tags);
      break;
    case 504:
      status504.add(1, tags);
      break;
    default:
      statusOther.add(1, tags);
      // The first few per VU only, so a broken run does not flood the console.
      if (warnedUnexpected < 3) {
        warnedUnexpected += 1;
        console.warn(`unexpected status ${res.status} from POST /api/orders ${res.error || ''}`);
      }
  }
  const expected = res.status === 201 || res.status === 503 || res.status === 504;
  unexpectedStatus.add(!expected, tags);
  overBudget.add(res.timings.duration > BUDGET_MS + MARGIN_MS, tags);

  if (res.status === 503 && RETRY_AFTER === 'honor' && scenario !== OPEN) {
    const seconds = Math.min(parseFloat(res.headers['Retry-After'] || '1') || 1, 1);
    sleep(seconds * (0.5 + Math.random() / 2));
  }
}

// The seed's command line (`--vus 250 --duration 5m`) replaces the scenarios with k6's
// default one, which runs `default`.
export default createOrder;

// ---------------------------------------------------------------- summary

function ms(value) {
  return value === undefined || value === null ? '-' : `${value.toFixed(1)}ms`;
}

function count(data, name) {
  const m = data.metrics[name];
  return m && m.values ? m.values.count || 0 : 0;
}

function rate(data, name) {
  const m = data.metrics[name];
  if (!m || !m.values || m.values.rate === undefined) return '-';
  return `${(m.values.rate * 100).toFixed(2)}%`;
}

function trendLine(label, metric) {
  if (!metric || !metric.values) return `  ${label}: no data`;
  const v = metric.values;
  return `  ${label}: p50=${ms(v.med)} p90=${ms(v['p(90)'])} p99=${ms(v['p(99)'])} ` +
    `max=${ms(v.max)}`;
}

function thresholdLines(data, ran) {
  const lines = [];
  for (const name of Object.keys(data.metrics).sort()) {
    // Thresholds of scenarios that did not run pass vacuously; do not list them.
    const scenario = /scenario:([^,}]+)/.exec(name);
    if (scenario && !ran.includes(scenario[1])) continue;
    for (const [expr, result] of Object.entries(data.metrics[name].thresholds || {})) {
      // The always-true helper thresholds only keep sub-metrics; do not list them.
      if (/^(max|count|rate)>=0$/.test(expr)) continue;
      lines.push(`  ${result.ok ? 'PASS' : 'FAIL'} ${name} ${expr}`);
    }
  }
  return lines;
}

// Scenarios that sent at least one order request.
function ranScenarios(data) {
  return REPORTED.filter((name) => {
    const m = data.metrics[`unexpected_status{scenario:${name}}`];
    return m && m.values && (m.values.passes || 0) + (m.values.fails || 0) > 0;
  });
}

export function textSummary(data) {
  const ran = ranScenarios(data);
  const lines = [];
  lines.push('');
  lines.push(
    `deadline-load  mode=${MODE}  budget=${BUDGET_MS}ms (+${MARGIN_MS}ms margin)  ` +
      `catalog delay=${DELAY_MS}ms  scenarios=${ran.join(',') || 'none'}`,
  );
  lines.push('http_req_duration of POST /api/orders:');
  lines.push(trendLine('all', data.metrics['http_req_duration{endpoint:create_order}']));
  for (const name of ran) {
    lines.push(trendLine(name, data.metrics[`http_req_duration{scenario:${name}}`]));
  }
  lines.push('statuses:');
  lines.push(
    `  201=${count(data, 'status_201')} 503=${count(data, 'status_503')} ` +
      `504=${count(data, 'status_504')} other=${count(data, 'status_other')}  ` +
      `unexpected=${rate(data, 'unexpected_status')} over budget=${rate(data, 'over_budget')}`,
  );
  for (const name of ran) {
    const per = (s) => count(data, `http_reqs{scenario:${name},status:${s}}`);
    lines.push(
      `  ${name}: 201=${per('201')} 503=${per('503')} 504=${per('504')}  ` +
        `over budget=${rate(data, `over_budget{scenario:${name}}`)}`,
    );
  }
  lines.push(
    `dropped_iterations=${count(data, 'dropped_iterations')} ` +
      '(open model: arrivals k6 could not send because every VU was still waiting)',
  );
  lines.push('thresholds:');
  const thresholds = thresholdLines(data, ran);
  lines.push(...(thresholds.length ? thresholds : ['  none']));
  lines.push(`summary JSON: ${SUMMARY_PATH}`);
  lines.push('');
  return lines.join('\n');
}

export function handleSummary(data) {
  const summary = {
    experiment: {
      mode: MODE,
      scenario: SCENARIO,
      scenarios_run: ranScenarios(data),
      scenarios_config: data.setup_data ? data.setup_data.scenarios : scenarios,
      vus: VUS,
      duration: DURATION,
      rate_per_s: RATE,
      budget_ms: BUDGET_MS,
      margin_ms: MARGIN_MS,
      delay_ms: DELAY_MS,
      orders_url: ORDERS_URL,
      catalog_admin_url: CATALOG_ADMIN_URL,
      fault_injected: data.setup_data ? data.setup_data.fault : null,
    },
    ...data,
  };
  return {
    [SUMMARY_PATH]: JSON.stringify(summary, null, 2),
    stdout: textSummary(data),
  };
}
