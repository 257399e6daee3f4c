use super::*;
use proptest::prelude::*;
use std::io;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// `min(cap, base × 2^(retry-1))` in nanoseconds, computed independently of the code
/// under test (in u128, where nothing here can overflow).
fn bound_nanos(p: &RetryPolicy, retry: u32) -> u128 {
    let doublings = retry.max(1) - 1;
    let cap = p.cap.as_nanos();
    if doublings >= 64 {
        return cap;
    }
    (p.base.as_nanos() << doublings).min(cap)
}

/// The largest f64 below 1.
const ALMOST_ONE: f64 = 1.0 - f64::EPSILON / 2.0;

fn retryable() -> Outcome {
    Outcome::Retryable { retry_after: None }
}

/// A policy with a budget that never runs out in these tests.
fn unbudgeted(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        budget_reserve: 1e9,
        ..RetryPolicy::default()
    }
}

#[test]
fn backoff_is_full_jitter_under_the_capped_exponential_bound() {
    let p = RetryPolicy::default();
    let units = [0.0, 1e-9, 0.1, 0.25, 0.5, 0.75, 0.9, 0.999_999, ALMOST_ONE];
    for retry in 1..=80 {
        let bound = bound_nanos(&p, retry);
        assert_eq!(p.max_backoff(retry).as_nanos(), bound, "retry {retry}");
        for unit in units {
            let d = p.backoff(retry, unit).as_nanos();
            assert!(d <= bound, "retry {retry} unit {unit}: {d} > {bound}");
            // Uniform scaling: the delay is the unit's share of the bound.
            let want = bound as f64 * unit;
            assert!(
                (d as f64 - want).abs() <= 1.0,
                "retry {retry} unit {unit}: {d} vs {want}"
            );
        }
        assert_eq!(p.backoff(retry, 0.0), Duration::ZERO, "retry {retry}");
        let near = p.backoff(retry, ALMOST_ONE).as_nanos();
        assert!(
            bound - near <= 1,
            "retry {retry}: {near} does not approach {bound}"
        );
    }
}

#[test]
fn backoff_bound_doubles_then_stops_at_the_cap() {
    let p = RetryPolicy::default(); // base 100 ms, cap 10 s
    let want = [
        100, 200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000, 10_000,
    ];
    for (i, ms) in want.into_iter().enumerate() {
        let retry = i as u32 + 1;
        assert_eq!(p.max_backoff(retry), MS(ms), "retry {retry}");
        assert_eq!(p.backoff(retry, 0.5), MS(ms / 2), "retry {retry}");
    }
    // Retry 0 is read as the first retry.
    assert_eq!(p.max_backoff(0), MS(100));
    assert_eq!(p.backoff(0, 0.5), MS(50));
    // Units outside [0, 1] are clamped.
    assert_eq!(p.backoff(1, -3.0), Duration::ZERO);
    assert_eq!(p.backoff(1, f64::NAN), Duration::ZERO);
    assert_eq!(p.backoff(1, 7.0), MS(100));
}

#[test]
fn backoff_does_not_overflow_for_huge_retry_numbers() {
    let p = RetryPolicy::default();
    for retry in [32, 33, 63, 64, 65, 1_000, u32::MAX - 1, u32::MAX] {
        assert_eq!(
            p.max_backoff(retry),
            Duration::from_secs(10),
            "retry {retry}"
        );
        assert_eq!(
            p.backoff(retry, 0.5),
            Duration::from_secs(5),
            "retry {retry}"
        );
    }
    // Even the largest durations saturate instead of overflowing or panicking.
    let huge = RetryPolicy {
        base: Duration::MAX / 2,
        cap: Duration::MAX,
        ..RetryPolicy::default()
    };
    assert_eq!(huge.max_backoff(2), Duration::MAX - Duration::from_nanos(1));
    assert_eq!(huge.max_backoff(3), Duration::MAX);
    assert_eq!(huge.max_backoff(u32::MAX), Duration::MAX);
    // f64 seconds near 2^64 are 2048 s apart: close to the top, never past it.
    let near_top = huge.backoff(u32::MAX, ALMOST_ONE);
    assert!(
        near_top >= Duration::MAX - Duration::from_secs(4_096),
        "{near_top:?}"
    );
    assert_eq!(huge.backoff(u32::MAX, 1.0), Duration::MAX);
    assert_eq!(huge.backoff(u32::MAX, 0.0), Duration::ZERO);
}

proptest! {
    #[test]
    fn backoff_stays_within_bounds(
        base_ns in 1u64..=1_000_000_000_000,
        cap_extra_ns in 0u64..=1_000_000_000_000,
        retry in prop_oneof![0u32..=80, any::<u32>()],
        unit in 0.0f64..1.0,
    ) {
        let p = RetryPolicy {
            base: Duration::from_nanos(base_ns),
            cap: Duration::from_nanos(base_ns + cap_extra_ns),
            ..RetryPolicy::default()
        };
        prop_assert!(p.validate().is_ok());
        let bound = bound_nanos(&p, retry);
        let d = p.backoff(retry, unit).as_nanos();
        prop_assert!(d <= bound, "{} > {}", d, bound);
        let want = bound as f64 * unit;
        prop_assert!((d as f64 - want).abs() <= 2.0, "{} vs {}", d, want);
    }
}

#[test]
fn jitter_is_uniform_over_the_range() {
    // Deterministic: the seed fixes every draw.
    let mut r = Retrier::new(unbudgeted(10), 0x5EED);
    let bound = r.policy().max_backoff(3).as_secs_f64(); // 400 ms
    let delays: Vec<f64> = (0..10_000)
        .map(|_| match r.decide(3, &retryable()) {
            Decision::Retry { after } => after.as_secs_f64(),
            other => panic!("{other:?}"),
        })
        .collect();
    let mean = delays.iter().sum::<f64>() / delays.len() as f64;
    assert!(
        (mean - bound / 2.0).abs() <= 0.05 * bound / 2.0,
        "mean {mean} vs {}",
        bound / 2.0
    );
    // Full jitter reaches both ends of the range and fills each quarter evenly.
    let min = delays.iter().copied().fold(f64::INFINITY, f64::min);
    let max = delays.iter().copied().fold(0.0, f64::max);
    assert!(
        min < 0.01 * bound && max > 0.99 * bound && max <= bound,
        "{min} {max}"
    );
    for q in 0..4 {
        let (lo, hi) = (q as f64 * bound / 4.0, (q + 1) as f64 * bound / 4.0);
        let n = delays.iter().filter(|&&d| lo <= d && d < hi).count();
        assert!((2_300..=2_700).contains(&n), "quarter {q}: {n}");
    }
}

#[test]
fn the_seed_fixes_the_delays() {
    let draw = |seed| {
        let mut r = Retrier::new(unbudgeted(10), seed);
        (0..20)
            .map(|_| r.decide(5, &retryable()))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(1), draw(1));
    assert_ne!(draw(1), draw(2));
}

/// Runs `op` through `r`, recording the attempt numbers it saw and the sleeps.
fn run_recorded(
    r: &mut Retrier,
    mut op: impl FnMut(u32) -> Result<&'static str, Outcome>,
) -> (
    Result<&'static str, Failed<Outcome>>,
    Vec<u32>,
    Vec<Duration>,
) {
    let (mut seen, mut sleeps) = (Vec::new(), Vec::new());
    let result = r.run(
        |attempt| {
            seen.push(attempt);
            op(attempt)
        },
        |outcome| *outcome,
        |d| sleeps.push(d),
    );
    (result, seen, sleeps)
}

#[test]
fn run_sleeps_once_per_failure_then_succeeds() {
    for k in 0..5u32 {
        let mut r = Retrier::new(RetryPolicy::default(), u64::from(k));
        let (result, seen, sleeps) = run_recorded(&mut r, |attempt| {
            if attempt <= k {
                Err(retryable())
            } else {
                Ok("done")
            }
        });
        assert_eq!(result, Ok("done"), "k {k}");
        assert_eq!(seen, (1..=k + 1).collect::<Vec<_>>(), "k {k}");
        assert_eq!(sleeps.len(), k as usize, "k {k}");
        for (i, d) in sleeps.iter().enumerate() {
            let retry = i as u32 + 1;
            assert!(
                *d <= r.policy().max_backoff(retry),
                "k {k} retry {retry}: {d:?}"
            );
        }
        assert_eq!((r.requests(), r.retries()), (1, u64::from(k)));
    }
}

#[test]
fn run_stops_at_the_attempt_limit() {
    let mut r = Retrier::new(RetryPolicy::default(), 9);
    let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(retryable()));
    assert_eq!(
        result,
        Err(Failed {
            error: retryable(),
            attempts: 5,
            reason: GiveUp::AttemptsExhausted
        })
    );
    assert_eq!(seen, [1, 2, 3, 4, 5]);
    assert_eq!(sleeps.len(), 4);
    for (i, d) in sleeps.iter().enumerate() {
        assert!(*d <= r.policy().max_backoff(i as u32 + 1), "{i}: {d:?}");
    }
    // One attempt only: never a retry.
    let mut once = Retrier::new(unbudgeted(1), 9);
    let (result, seen, sleeps) = run_recorded(&mut once, |_| Err(retryable()));
    assert_eq!(result.unwrap_err().reason, GiveUp::AttemptsExhausted);
    assert_eq!((seen.len(), sleeps.len()), (1, 0));
}

#[test]
fn permanent_failures_are_not_retried() {
    let mut r = Retrier::new(RetryPolicy::default(), 1);
    let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(Outcome::Permanent));
    assert_eq!(
        result,
        Err(Failed {
            error: Outcome::Permanent,
            attempts: 1,
            reason: GiveUp::NotRetryable
        })
    );
    assert_eq!((seen, sleeps), (vec![1], vec![]));
    assert_eq!((r.requests(), r.retries()), (1, 0));
}

#[test]
fn fenced_writes_are_never_retried() {
    let mut r = Retrier::new(unbudgeted(100), 1);
    let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(Outcome::Fenced));
    assert_eq!(
        result,
        Err(Failed {
            error: Outcome::Fenced,
            attempts: 1,
            reason: GiveUp::Fenced
        })
    );
    assert_eq!((seen, sleeps), (vec![1], vec![]));
    // Not even mid-way through a request whose earlier failures were retryable.
    let mut n = 0;
    let (result, seen, sleeps) = run_recorded(&mut r, |_| {
        n += 1;
        Err(if n < 3 { retryable() } else { Outcome::Fenced })
    });
    assert_eq!(result.unwrap_err().reason, GiveUp::Fenced);
    assert_eq!((seen.len(), sleeps.len()), (3, 2));
    assert_eq!(r.retries(), 2);
}

#[test]
fn retry_after_is_honoured_above_the_cap() {
    let mut r = Retrier::new(RetryPolicy::default(), 4);
    let wait = Duration::from_secs(30); // cap is 10 s
    let mut first = true;
    let (result, _, sleeps) = run_recorded(&mut r, |_| {
        if std::mem::take(&mut first) {
            Err(Outcome::Retryable {
                retry_after: Some(wait),
            })
        } else {
            Ok("ok")
        }
    });
    assert_eq!(result, Ok("ok"));
    assert_eq!(sleeps, [wait]);
    // A Retry-After shorter than the drawn backoff does not shorten it.
    let p = RetryPolicy {
        base: Duration::from_secs(1),
        cap: Duration::from_secs(1),
        ..unbudgeted(100)
    };
    let mut r = Retrier::new(p, 4);
    let short = Outcome::Retryable {
        retry_after: Some(MS(500)),
    };
    let mut above_half = 0;
    for _ in 0..100 {
        let Decision::Retry { after } = r.decide(1, &short) else {
            panic!("budgeted out")
        };
        assert!(MS(500) <= after && after <= MS(1_000), "{after:?}");
        above_half += usize::from(after > MS(500));
    }
    // About half the draws exceed 500 ms: the backoff, not the Retry-After, wins.
    assert!((30..=70).contains(&above_half), "{above_half}");
}

#[test]
fn the_budget_limits_retries_to_a_share_of_requests() {
    // Defaults: ratio 0.1, reserve 10, 5 attempts; every attempt fails.
    let mut r = Retrier::new(RetryPolicy::default(), 11);
    let (mut attempts_exhausted, mut budget_exhausted) = (0, 0);
    for _ in 0..1000 {
        let (result, seen, sleeps) = run_recorded(&mut r, |_| Err(retryable()));
        let failed = result.unwrap_err();
        assert_eq!(failed.attempts as usize, seen.len());
        assert_eq!(sleeps.len(), seen.len() - 1);
        match failed.reason {
            GiveUp::AttemptsExhausted => attempts_exhausted += 1,
            GiveUp::BudgetExhausted => budget_exhausted += 1,
            other => panic!("{other:?}"),
        }
    }
    // 10 reserve + 0.1 × 1000 deposits, each used up (exact in millionths): requests 1
    // and 2 retry 4 times each on the reserve, request 3 twice, then one retry every
    // tenth request.
    assert_eq!(r.requests(), 1000);
    assert_eq!(r.retries(), 110);
    assert!(r.retries() as f64 <= 10.0 + 0.1 * 1000.0);
    assert_eq!((attempts_exhausted, budget_exhausted), (2, 998));
    assert_eq!(r.retry_ratio(), 110.0 / 1000.0);
    assert!(r.budget() < 1.0, "{}", r.budget());
}

#[test]
fn the_budget_saves_up_no_more_than_its_capacity() {
    let mut r = Retrier::new(RetryPolicy::default(), 12);
    // It starts at the reserve; each request adds the ratio.
    assert_eq!(r.budget(), 10.0);
    r.begin();
    assert_eq!(r.budget(), 10.1);
    for _ in 0..100_000 {
        r.run(|_| Ok::<_, Outcome>(()), |o| *o, |_| {}).unwrap();
    }
    // 10 reserve + 0.1 × BUDGET_WINDOW (1000) requests' worth.
    assert_eq!(r.budget(), 110.0);
    let mut retries = 0;
    while let Decision::Retry { .. } = r.decide(1, &retryable()) {
        retries += 1;
        assert!(retries <= 110, "the budget grants more than its capacity");
    }
    assert_eq!(retries, 110);
    assert_eq!(
        r.decide(1, &retryable()),
        Decision::GiveUp(GiveUp::BudgetExhausted)
    );
    // A new request deposits a tenth of a token: not yet a retry.
    r.begin();
    assert_eq!(
        r.decide(1, &retryable()),
        Decision::GiveUp(GiveUp::BudgetExhausted)
    );
    // With no ratio, the reserve is all there ever is.
    let mut r = Retrier::new(
        RetryPolicy {
            budget_ratio: 0.0,
            budget_reserve: 2.0,
            ..unbudgeted(100)
        },
        13,
    );
    for _ in 0..1000 {
        r.begin();
    }
    assert!(matches!(r.decide(1, &retryable()), Decision::Retry { .. }));
    assert!(matches!(r.decide(1, &retryable()), Decision::Retry { .. }));
    assert_eq!(
        r.decide(1, &retryable()),
        Decision::GiveUp(GiveUp::BudgetExhausted)
    );
}

#[test]
fn decide_checks_the_outcome_before_the_limits() {
    let mut r = Retrier::new(
        RetryPolicy {
            budget_reserve: 0.0,
            ..RetryPolicy::default()
        },
        14,
    );
    // Out of attempts and out of budget, but the outcome says why first.
    assert_eq!(
        r.decide(9, &Outcome::Permanent),
        Decision::GiveUp(GiveUp::NotRetryable)
    );
    assert_eq!(
        r.decide(9, &Outcome::Fenced),
        Decision::GiveUp(GiveUp::Fenced)
    );
    // Attempts before budget.
    assert_eq!(
        r.decide(5, &retryable()),
        Decision::GiveUp(GiveUp::AttemptsExhausted)
    );
    assert_eq!(
        r.decide(4, &retryable()),
        Decision::GiveUp(GiveUp::BudgetExhausted)
    );
    assert_eq!(r.retries(), 0);
}

#[test]
fn retry_ratio_is_retries_over_requests() {
    let mut r = Retrier::new(RetryPolicy::default(), 15);
    assert_eq!(r.retry_ratio(), 0.0);
    let labels = [("operator", "retry-test-sink"), ("subtask", "3")];
    let mut r2 = Retrier::new(RetryPolicy::default(), 15).with_metric(retry_ratio_gauge(&labels));
    assert_eq!(
        crate::metrics::value(RETRY_RATIO_METRIC, &labels),
        Some(0.0)
    );
    for fails in [0, 2, 1] {
        for r in [&mut r, &mut r2] {
            let mut left = fails;
            r.run(
                |_| {
                    if left > 0 {
                        left -= 1;
                        Err(retryable())
                    } else {
                        Ok(())
                    }
                },
                |o| *o,
                |_| {},
            )
            .unwrap();
        }
    }
    assert_eq!((r.requests(), r.retries()), (3, 3));
    assert_eq!(r.retry_ratio(), 1.0);
    assert_eq!(r2.retry_ratio(), 1.0);
    assert_eq!(
        crate::metrics::value(RETRY_RATIO_METRIC, &labels),
        Some(1.0)
    );
    r2.begin();
    assert_eq!(
        crate::metrics::value(RETRY_RATIO_METRIC, &labels),
        Some(0.75)
    );
}

#[test]
fn policy_validation_names_the_bad_field() {
    let d = RetryPolicy::default();
    assert_eq!(d.validate(), Ok(()));
    let bad = [
        (
            RetryPolicy {
                base: Duration::ZERO,
                ..d.clone()
            },
            "base",
        ),
        (
            RetryPolicy {
                cap: MS(99),
                ..d.clone()
            },
            "cap",
        ),
        (
            RetryPolicy {
                max_attempts: 0,
                ..d.clone()
            },
            "max_attempts",
        ),
        (
            RetryPolicy {
                budget_ratio: -0.1,
                ..d.clone()
            },
            "budget_ratio",
        ),
        (
            RetryPolicy {
                budget_ratio: 1.5,
                ..d.clone()
            },
            "budget_ratio",
        ),
        (
            RetryPolicy {
                budget_ratio: f64::NAN,
                ..d.clone()
            },
            "budget_ratio",
        ),
        (
            RetryPolicy {
                budget_reserve: -1.0,
                ..d.clone()
            },
            "budget_reserve",
        ),
        (
            RetryPolicy {
                budget_reserve: f64::INFINITY,
                ..d.clone()
            },
            "budget_reserve",
        ),
    ];
    for (p, field) in bad {
        let e = p.validate().unwrap_err();
        assert!(
            e.starts_with(&format!("retry policy: {field} ")),
            "{field}: {e}"
        );
        assert_eq!(Retrier::try_new(p, 0).unwrap_err(), e);
    }
    // Edge values that are fine.
    let edge = RetryPolicy {
        cap: d.base,
        max_attempts: 1,
        budget_ratio: 1.0,
        budget_reserve: 0.0,
        ..d
    };
    assert_eq!(edge.validate(), Ok(()));
}

#[test]
#[should_panic(expected = "retry policy: max_attempts")]
fn new_rejects_an_invalid_policy() {
    let _ = Retrier::new(
        RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        },
        0,
    );
}

#[test]
fn failures_and_reasons_read_clearly() {
    let f = Failed {
        error: "HTTP 503",
        attempts: 5,
        reason: GiveUp::AttemptsExhausted,
    };
    assert_eq!(
        f.to_string(),
        "gave up after 5 attempts (the attempt limit was reached): HTTP 503"
    );
    let f = Failed {
        error: io::Error::from(io::ErrorKind::PermissionDenied),
        attempts: 1,
        reason: GiveUp::NotRetryable,
    };
    assert!(
        f.to_string()
            .starts_with("gave up after 1 attempt (the failure is not retryable): "),
        "{f}"
    );
    assert!(std::error::Error::source(&f).is_some());
    assert!(
        GiveUp::Fenced
            .to_string()
            .contains("fencing token is stale")
    );
    assert!(GiveUp::BudgetExhausted.to_string().contains("retry budget"));
}
