//! `X-Request-Timeout-Ms`: arbitrary bytes into `parse_millis` and, as one or more header
//! values, into `parse_request_timeout`. The checks live in `deadline_fuzz::timeout_header`
//! so that `cargo test` replays the corpus through the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deadline_fuzz::timeout_header(data));
