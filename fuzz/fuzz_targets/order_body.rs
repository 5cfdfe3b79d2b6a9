//! `POST /api/orders`: arbitrary bytes as the JSON body, deserialized into
//! `NewOrderRequest` and validated; the same bytes as an `Idempotency-Key`. The checks
//! live in `deadline_fuzz::order_body` so that `cargo test` replays the corpus through
//! the same code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deadline_fuzz::order_body(data));
