//! What the database envelope's Rust side costs per transaction: the task that owns the
//! connection, the channel that answers the caller, and the token that tells the task
//! its caller has gone (the `db` module's docs). Each is measured on its own, around a body
//! that is already done, so the numbers are the machinery alone; compare them with a
//! transaction's round trips (hundreds of microseconds on loopback).
//!
//! `cargo bench -p deadline-propagation --bench db_task`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

async fn body() -> u64 {
    black_box(42)
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("db_task");
    group.bench_function("inline", |b| b.to_async(&runtime).iter(body));
    group.bench_function("task", |b| {
        b.to_async(&runtime)
            .iter(|| async { tokio::spawn(body()).await.unwrap() })
    });
    group.bench_function("task_and_channel", |b| {
        b.to_async(&runtime).iter(|| async {
            let (reply, answer) = oneshot::channel();
            tokio::spawn(async move {
                let _ = reply.send(body().await);
            });
            answer.await.unwrap()
        })
    });
    group.bench_function("task_channel_and_token", |b| {
        b.to_async(&runtime).iter(|| async {
            let (reply, answer) = oneshot::channel();
            let stop = CancellationToken::new();
            let _stop_when_dropped = stop.clone().drop_guard();
            tokio::spawn(async move {
                tokio::select! {
                    biased;
                    value = body() => {
                        let _ = reply.send(value);
                    }
                    () = stop.cancelled() => {}
                }
            });
            answer.await.unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
