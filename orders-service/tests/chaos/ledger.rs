//! The chaos run's clients and their ledger: what they were told, key by key, and the
//! verdict of holding it against the `orders` table.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::{Faults, MS, SKUS};
use crate::stack::Stack;

/// What the clients were told about one order (one `Idempotency-Key`), attempt by
/// attempt: the record the table is held against at the end.
#[derive(Debug, Default)]
pub(crate) struct Told {
    pub(crate) sku: String,
    pub(crate) quantity: i32,
    /// The order ids of the 201s whose whole body arrived.
    pub(crate) ids: Vec<i64>,
    /// Answers 502, 503 or 504: each promises that this attempt wrote nothing.
    pub(crate) refusals: u32,
    /// Attempts whose answer promised nothing: disconnects, a 201 whose body was cut, a
    /// 500 `outcome-unknown`.
    pub(crate) unanswered: u32,
}

#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) statuses: BTreeMap<String, u64>,
    pub(crate) keys: HashMap<String, Told>,
    pub(crate) unexpected: Vec<String>,
}

impl Tally {
    pub(crate) fn told(&mut self, key: &str) -> &mut Told {
        self.keys.get_mut(key).expect("the key was registered")
    }
}

/// The clients' record held against the rows of the `orders` table.
#[derive(Default)]
pub(crate) struct Verdict {
    pub(crate) confirmed: usize,
    pub(crate) refused_only: usize,
    pub(crate) unanswered: usize,
    pub(crate) unanswered_written: usize,
    /// Keys told 201 whose row is missing or differs, or that were told two ids.
    pub(crate) lost: Vec<String>,
    /// Keys told only 502/503/504 that have a row anyway.
    pub(crate) refused_but_written: Vec<String>,
    /// Rows whose key no client used.
    pub(crate) unknown_rows: Vec<String>,
}

pub(crate) fn hold_against_the_table(
    tally: &Tally,
    rows: &[(i64, String, i32, Option<String>)],
) -> Verdict {
    let by_key: HashMap<&str, (i64, &str, i32)> = rows
        .iter()
        .filter_map(|(id, sku, q, key)| Some((key.as_deref()?, (*id, sku.as_str(), *q))))
        .collect();
    let mut verdict = Verdict::default();
    for (key, told) in &tally.keys {
        let row = by_key.get(key.as_str()).copied();
        match told.ids.first() {
            Some(&id) => {
                verdict.confirmed += 1;
                let same = told.ids.iter().all(|&other| other == id);
                if !same || row != Some((id, told.sku.as_str(), told.quantity)) {
                    verdict
                        .lost
                        .push(format!("{key}: told {:?}, table has {row:?}", told.ids));
                }
            }
            None if told.unanswered == 0 => {
                verdict.refused_only += 1;
                if row.is_some() {
                    verdict.refused_but_written.push(format!(
                        "{key}: {} refusal(s), table has {row:?}",
                        told.refusals
                    ));
                }
            }
            None => {
                verdict.unanswered += 1;
                verdict.unanswered_written += usize::from(row.is_some());
            }
        }
    }
    for (key, row) in &by_key {
        if !tally.keys.contains_key(*key) {
            verdict.unknown_rows.push(format!("{key}: {row:?}"));
        }
    }
    verdict
}

/// One logical order: retried with the same key until it is confirmed or we give up.
pub(crate) async fn place_order(
    stack: &Stack,
    rng: &mut StdRng,
    key: String,
    tally: &Mutex<Tally>,
    faults: &Faults,
) {
    let sku = SKUS[rng.random_range(0..SKUS.len())];
    let quantity = rng.random_range(1..=3);
    tally.lock().unwrap().keys.insert(
        key.clone(),
        Told {
            sku: sku.to_owned(),
            quantity,
            ..Told::default()
        },
    );
    let body = json!({"sku": sku, "quantity": quantity});
    for _attempt in 0..10 {
        let budget = rng.random_range(100..=900u64);
        let mut request = stack
            .client
            .post(format!("{}/api/orders", stack.orders_url))
            .header("X-Request-Timeout-Ms", budget)
            .header("Idempotency-Key", &key)
            .json(&body);
        // One request in ten disconnects at a random point.
        if rng.random_bool(0.1) {
            request = request.timeout(MS(rng.random_range(1..=400)));
        }
        let outcome = request.send().await;
        let label = match &outcome {
            Ok(r) => r.status().as_u16().to_string(),
            Err(_) => "disconnected".to_owned(),
        };
        if label != "500" {
            *tally.lock().unwrap().statuses.entry(label).or_default() += 1;
        }
        match outcome {
            Ok(response) if response.status().as_u16() == 201 => {
                // A 201 counts only with its whole body: a client whose timeout cut the
                // body does not know its order id, so it retries with the same key and
                // gets the first order back.
                if let Ok(order) = response.json::<Value>().await
                    && let Some(id) = order["id"].as_i64()
                {
                    tally.lock().unwrap().told(&key).ids.push(id);
                    return;
                }
                faults.disconnects.fetch_add(1, Ordering::Relaxed);
                tally.lock().unwrap().told(&key).unanswered += 1;
            }
            Ok(response) if [502, 503, 504].contains(&response.status().as_u16()) => {
                tally.lock().unwrap().told(&key).refusals += 1;
            }
            Ok(response) if response.status().as_u16() == 500 => {
                // A COMMIT whose connection was lost while PostgreSQL restarted: the
                // answer promises nothing, and the contract says to retry with the same
                // key to learn the outcome. Any other 500 is a bug.
                let text = response.text().await.unwrap_or_default();
                let unknown = text.contains("urn:problem:outcome-unknown");
                let label = if unknown {
                    "500 outcome-unknown"
                } else {
                    "500"
                };
                let mut tally = tally.lock().unwrap();
                *tally.statuses.entry(label.to_owned()).or_default() += 1;
                if !unknown {
                    tally.unexpected.push(format!("500: {text}"));
                    return;
                }
                tally.told(&key).unanswered += 1;
            }
            Ok(response) => {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                tally
                    .lock()
                    .unwrap()
                    .unexpected
                    .push(format!("{status}: {text}"));
                return;
            }
            Err(_) => {
                faults.disconnects.fetch_add(1, Ordering::Relaxed);
                tally.lock().unwrap().told(&key).unanswered += 1;
            }
        }
        tokio::time::sleep(MS(rng.random_range(20..=150))).await;
    }
}
