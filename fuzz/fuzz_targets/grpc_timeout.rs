//! `grpc-timeout`: arbitrary bytes into `parse_grpc_value` and, as one or more header
//! values, into `parse_grpc_timeout` and `read_budget`. The checks live in
//! `deadline_fuzz::grpc_timeout` so that `cargo test` replays the corpus through the same
//! code.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deadline_fuzz::grpc_timeout(data));
