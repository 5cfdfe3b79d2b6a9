//! The figures of a run, computed from k6's request log: pure functions, unit-tested.
//!
//! Everything is counted by *arrival*: a request belongs to the second it was sent in,
//! whenever it was answered. That is what a caller sees, and it keeps a slow answer
//! from being credited to the second in which the service finally produced it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// One order request as k6 logged it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Request {
    /// When it was sent, in ms since the Unix epoch.
    pub arrival_ms: u64,
    /// The HTTP status; 0 when the client gave up at its timeout, 1 on a transport error.
    pub status: u16,
    /// How long the client waited, in whole ms (rounded down).
    pub elapsed_ms: u64,
    /// The same in µs (k6 logs an answer's time to the µs).
    pub elapsed_us: u64,
    /// The budget this request carried, where the load gives each its own (`tight`).
    pub budget_ms: Option<u64>,
}

impl Request {
    /// An order created within the client's budget (its own, else `budget_ms`): goodput.
    pub fn good(&self, budget_ms: u64) -> bool {
        self.status == 201 && self.elapsed_ms <= self.budget_ms.unwrap_or(budget_ms)
    }
}

/// Parses k6's request log (`arrival_ms,status,elapsed_ms[,budget_ms]`), other lines skipped.
pub fn parse_request_log(text: &str) -> Vec<Request> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.trim().split(',');
            let arrival = fields.next()?.parse().ok()?;
            let status = fields.next()?.parse().ok()?;
            let elapsed: f64 = fields.next()?.parse().ok()?;
            let budget_ms = match fields.next() {
                Some(budget) => Some(budget.parse().ok()?),
                None => None,
            };
            (elapsed.is_finite() && elapsed >= 0.0).then_some(Request {
                arrival_ms: arrival,
                status,
                elapsed_ms: elapsed as u64,
                elapsed_us: (elapsed * 1000.0).round() as u64,
                budget_ms,
            })
        })
        .collect()
}

/// Now, in ms since the Unix epoch (k6 logs arrivals on the same clock).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Median (the mean of the middle two for an even count), smallest and largest of a
/// figure over the repeats of one side.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The spread of `values`; `None` when there are none.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    Some(Spread {
        median,
        min: sorted[0],
        max: sorted[n - 1],
    })
}

/// `median (min to max)` with `digits` decimals, or `n/a` for no spread.
pub fn median_range(s: Option<Spread>, digits: usize) -> String {
    s.map_or("n/a".into(), |s| {
        format!(
            "{:.d$} ({:.d$} to {:.d$})",
            s.median,
            s.min,
            s.max,
            d = digits
        )
    })
}

/// Two sides in the order of pair `n`: alternated, so that neither always runs on a
/// machine the other has just warmed (or tired).
pub fn alternate<T>(n: usize, [a, b]: [T; 2]) -> [T; 2] {
    if n.is_multiple_of(2) { [a, b] } else { [b, a] }
}

/// The `q` quantile (0..=1) of `values` by nearest rank, as k6 reports it.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

/// Orders created and answered within `budget_ms`, per second of `seconds`.
pub fn goodput(requests: &[Request], budget_ms: u64, seconds: f64) -> f64 {
    let good = requests.iter().filter(|r| r.good(budget_ms)).count();
    good as f64 / seconds.max(f64::EPSILON)
}

/// The requests of one second of arrivals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Second {
    /// Seconds since the first arrival; requests sent in this second; of them, orders
    /// created within the budget.
    pub t: u64,
    pub arrivals: u64,
    pub good: u64,
    /// p50 of their client-side latency, in ms (0 in runs published before it was kept).
    #[serde(default)]
    pub p50_ms: f64,
    /// p99 of their client-side latency, in ms.
    pub p99_ms: f64,
}

/// Groups `requests` by the second of their arrival, counted from `start_ms`.
pub fn per_second(requests: &[Request], start_ms: u64, budget_ms: u64) -> Vec<Second> {
    let Some(last) = requests.iter().map(|r| r.arrival_ms).max() else {
        return Vec::new();
    };
    let count = last.saturating_sub(start_ms) / 1000 + 1;
    let mut latencies: Vec<Vec<f64>> = vec![Vec::new(); count as usize];
    let mut seconds: Vec<Second> = (0..count)
        .map(|t| Second {
            t,
            ..Second::default()
        })
        .collect();
    for r in requests.iter().filter(|r| r.arrival_ms >= start_ms) {
        let i = ((r.arrival_ms - start_ms) / 1000) as usize;
        seconds[i].arrivals += 1;
        seconds[i].good += u64::from(r.good(budget_ms));
        latencies[i].push(r.elapsed_ms as f64);
    }
    for (second, values) in seconds.iter_mut().zip(&latencies) {
        second.p50_ms = quantile(values, 0.5).unwrap_or(0.0);
        second.p99_ms = quantile(values, 0.99).unwrap_or(0.0);
    }
    seconds
}

/// Recovery: from `removed_ms` (the fault removed) to the first whole second of arrivals
/// at least `share` served within the budget (the window slides in 50 ms steps).
pub fn recovery_ms(
    requests: &[Request],
    removed_ms: u64,
    budget_ms: u64,
    share: f64,
) -> Option<u64> {
    let last = requests.iter().map(|r| r.arrival_ms).max()?;
    let mut after: Vec<&Request> = requests
        .iter()
        .filter(|r| r.arrival_ms >= removed_ms)
        .collect();
    after.sort_by_key(|r| r.arrival_ms);
    let mut start = removed_ms;
    while start + 1000 <= last + 1 {
        let window = after
            .iter()
            .skip_while(|r| r.arrival_ms < start)
            .take_while(|r| r.arrival_ms < start + 1000);
        let (mut total, mut good) = (0u64, 0u64);
        for r in window {
            total += 1;
            good += u64::from(r.good(budget_ms));
        }
        if total > 0 && good as f64 >= share * total as f64 {
            return Some(start - removed_ms);
        }
        start += 50;
    }
    None
}

/// A [`std::time::Duration`] as seconds (`f64`) in JSON.
pub mod secs {
    pub fn serialize<S: serde::Serializer>(
        d: &std::time::Duration,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<std::time::Duration, D::Error> {
        let secs: f64 = serde::Deserialize::deserialize(d)?;
        Ok(std::time::Duration::from_secs_f64(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(arrival_ms: u64, status: u16, elapsed_ms: u64) -> Request {
        Request {
            arrival_ms,
            status,
            elapsed_ms,
            elapsed_us: elapsed_ms * 1000,
            budget_ms: None,
        }
    }

    #[test]
    fn a_request_with_its_own_budget_is_good_within_that_budget() {
        let log = "1000,201,50,40\n1001,201,50,80\n";
        let requests = parse_request_log(log);
        assert_eq!(requests[0].budget_ms, Some(40));
        assert!(!requests[0].good(700), "late for its own 40 ms");
        assert!(requests[1].good(10), "in time for its own 80 ms");
    }

    #[test]
    fn an_answer_time_is_read_to_the_microsecond() {
        let requests = parse_request_log("1000,201,1.2345\n1001,0,1700\n1002,201,-1\n");
        assert_eq!(requests.len(), 2, "a negative time is not a time");
        assert_eq!((requests[0].elapsed_ms, requests[0].elapsed_us), (1, 1235));
        assert_eq!(
            (requests[1].elapsed_ms, requests[1].elapsed_us),
            (1700, 1_700_000)
        );
    }

    #[test]
    fn parses_the_request_log_and_skips_other_lines() {
        let log = "1000,201,12\nRequest Failed\n1001,0,700\n1002,504,699\n";
        let requests = parse_request_log(log);
        assert_eq!(
            requests,
            vec![req(1000, 201, 12), req(1001, 0, 700), req(1002, 504, 699)]
        );
    }

    #[test]
    fn spread_has_median_min_and_max() {
        let s = spread(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(spread(&[]).is_none());
    }

    #[test]
    fn quantile_is_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.99), Some(99.0));
        assert_eq!(quantile(&values, 0.5), Some(50.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile(&[], 0.99), None);
    }

    #[test]
    fn goodput_counts_only_201s_within_the_budget() {
        let requests = [
            req(0, 201, 100),
            req(1, 201, 701),
            req(2, 504, 100),
            req(3, 201, 700),
        ];
        assert_eq!(goodput(&requests, 700, 2.0), 1.0);
    }

    #[test]
    fn per_second_groups_by_arrival() {
        let requests = [req(1000, 201, 10), req(1999, 503, 40), req(3500, 201, 900)];
        let seconds = per_second(&requests, 1000, 700);
        assert_eq!(seconds.len(), 3);
        assert_eq!(
            (seconds[0].arrivals, seconds[0].good, seconds[0].p99_ms),
            (2, 1, 40.0)
        );
        assert_eq!((seconds[1].arrivals, seconds[1].good), (0, 0));
        assert_eq!((seconds[2].arrivals, seconds[2].good), (1, 0));
        assert_eq!((seconds[2].p50_ms, seconds[2].p99_ms), (900.0, 900.0));
    }

    #[test]
    fn recovery_is_the_first_whole_good_second_after_the_removal() {
        // Bad until 10_400 ms, good from then on, one arrival every 10 ms.
        let requests: Vec<Request> = (0..400)
            .map(|i| 9_000 + i * 10)
            .map(|t| {
                if t < 10_400 {
                    req(t, 504, 700)
                } else {
                    req(t, 201, 20)
                }
            })
            .collect();
        assert_eq!(recovery_ms(&requests, 10_000, 700, 0.95), Some(350));
        // 5% of failures inside the window still count as recovered.
        assert_eq!(recovery_ms(&requests, 10_400, 700, 0.95), Some(0));
        let never: Vec<Request> = (0..300).map(|i| req(i * 10, 504, 700)).collect();
        assert_eq!(recovery_ms(&never, 0, 700, 0.95), None);
    }
}
