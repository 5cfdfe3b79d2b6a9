"""What schemathesis counts as a defect in this project (scripts/schemathesis.sh).

Loaded through SCHEMATHESIS_HOOKS. Every built-in check stays on but one:
`not_a_server_error` is replaced by `only_promised_server_errors` below, because a
deadline service answers some 5xx by design (docs/design.md §3.6), and a fuzzer that
counts each of them as a bug would bury the real ones. The rules here are the document's
own promises, so a failure is a defect of the service or of the document, never noise:

- 500 is a defect unless its problem type is `urn:problem:outcome-unknown` (a COMMIT
  whose outcome could not be learned in time).
- 503 and 504 are true answers to a request whose smallest budget header was under
  TIGHT_MS: the client asked for less time than the work takes. With a larger budget,
  or none (the service's default), against a healthy stack, they are defects.
- Any other 5xx is a defect.

Two expected answers are also taken out of the positive and negative data checks, for
the same reasons, and nothing else:

- `positive_data_acceptance`: a schema-valid request refused with 503/504 because its
  budget was under TIGHT_MS (`0` is a valid budget), or with 422 for an
  `Idempotency-Key` that an earlier generated order had already used for another body.
- `negative_data_rejection`: a request to the catalog marked `X-Deadline-Mode: observe`,
  which by design refuses nothing because of a budget header, malformed or not
  (docs/design.md §4.3): what propagate would refuse is counted instead.
"""

from __future__ import annotations

import json
import os
import re

import schemathesis

# Below this, a happy order on a loaded two-core machine (debug build) may not finish.
TIGHT_MS = 250

BUDGET_HEADERS = ("x-request-timeout-ms", "grpc-timeout", "x-envoy-expected-rq-timeout-ms")
GRPC_UNITS_MS = {"H": 3_600_000, "M": 60_000, "S": 1_000, "m": 1, "u": 1e-3, "n": 1e-6}
MS = re.compile(r"[ \t]*([0-9]+)[ \t]*")
GRPC = re.compile(r"[ \t]*([0-9]{1,8})([HMSmun])[ \t]*")


def _headers(case) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in (case.headers or {}).items()}


def smallest_budget_ms(case) -> float | None:
    """The budget the request asked for (the smallest well-formed header), or None."""
    budgets = []
    for name, value in _headers(case).items():
        if name not in BUDGET_HEADERS:
            continue
        if name == "grpc-timeout":
            match = GRPC.fullmatch(value)
            if match:
                budgets.append(int(match[1]) * GRPC_UNITS_MS[match[2]])
        else:
            match = MS.fullmatch(value)
            if match:
                budgets.append(int(match[1]))
    return min(budgets) if budgets else None


def asked_for_too_little(case) -> bool:
    budget = smallest_budget_ms(case)
    return budget is not None and budget < TIGHT_MS


def problem_type(response) -> str | None:
    try:
        body = json.loads(response.content)
    except (ValueError, TypeError):
        return None
    return body.get("type") if isinstance(body, dict) else None


@schemathesis.check
def only_promised_server_errors(ctx, response, case):
    """A 5xx only where docs/design.md §3.6 promises one (the module's doc says which)."""
    status = response.status_code
    if status < 500:
        return None
    kind = problem_type(response)
    if status == 500 and kind == "urn:problem:outcome-unknown":
        return None
    if status in (503, 504) and asked_for_too_little(case):
        return None
    raise AssertionError(
        f"{status} {kind or '(no problem type)'} for a request whose smallest budget was "
        f"{smallest_budget_ms(case)} ms; only 500 outcome-unknown, and 503/504 under "
        f"{TIGHT_MS} ms, are promised"
    )


def expected(failure, case, response) -> str | None:
    """Why this failure is an expected answer (the module's doc), or None."""
    checks = getattr(failure, "checks", ())
    if "positive_data_acceptance" in checks:
        if response.status_code in (503, 504) and asked_for_too_little(case):
            return f"positive data: {response.status_code} for a budget under {TIGHT_MS} ms"
        if response.status_code == 422 and "Idempotency-Key" in response.text:
            return "positive data: 422 for an Idempotency-Key already used"
    if "negative_data_rejection" in checks:
        if _headers(case).get("x-deadline-mode", "").strip().lower() == "observe":
            return "negative data: accepted in observe mode"
    return None


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    reason = expected(failure, case, response)
    if reason is None:
        return True
    # What was dropped, and why, one line each: docs/testing.md#schemathesis counts them.
    log = os.environ.get("SCHEMATHESIS_DROPPED_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{case.operation.label}\t{reason}\n")
    return False
