//! What a downstream sends back: a `Server-Timing` line and a problem body, read as the
//! budgeted client reads them. The checks live in `deadline_fuzz::downstream_answer` so
//! that `cargo test` replays the corpus through the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deadline_fuzz::downstream_answer(data));
