//! `X-Deadline-Mode: observe`: the mode travels with the budget.
//!
//! Observe mode refuses nothing and counts what propagate would refuse. A budget sent
//! downstream in observe mode would still be *enforced* there: the downstream, running
//! in propagate, answers 504 when the budget runs out, and the edge that only meant to
//! watch passes a real refusal on. So a call made in observe mode carries this marker
//! beside its budget, and a downstream whose ingress honours it runs that request in
//! observe too: it counts its own would-refusals and refuses nothing.
//!
//! Only an ingress told to honour the marker reads it
//! ([`DeadlineLayer::honour_mode_header`](crate::DeadlineLayer::honour_mode_header)):
//! a service that outside clients reach must not let them switch its protection off for
//! their own requests.

use http::HeaderName;

/// The marker's name, as sent.
pub const DEADLINE_MODE_HEADER: HeaderName = HeaderName::from_static("x-deadline-mode");

/// The marker's name as problems spell it.
pub(crate) const DEADLINE_MODE_HEADER_DISPLAY: &str = "X-Deadline-Mode";

/// The one value the marker has (the client sends it).
#[cfg(feature = "http-client")]
pub(crate) const OBSERVE: http::HeaderValue = http::HeaderValue::from_static("observe");

/// Whether `headers` ask for the request to be observed: `Ok(true)` for `observe`
/// (ASCII case-insensitive, surrounding whitespace ignored, repeats allowed), `Ok(false)`
/// without the header, and an error naming the value for anything else: a marker that
/// is misspelt would otherwise be enforced without anyone noticing. The ingress reads it.
pub(crate) fn observe_requested(headers: &http::HeaderMap) -> Result<bool, String> {
    let mut observe = false;
    for value in headers.get_all(DEADLINE_MODE_HEADER) {
        if !value
            .as_bytes()
            .trim_ascii()
            .eq_ignore_ascii_case(b"observe")
        {
            return Err(format!(
                "{DEADLINE_MODE_HEADER_DISPLAY} must be \"observe\", got {:?}",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
        observe = true;
    }
    Ok(observe)
}
