//! Unit tests of the restart strategies, driven with explicit instants (no sleeping).

use super::*;
use proptest::prelude::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn exact(e: ExponentialDelay) -> RestartStrategy {
    RestartStrategy::ExponentialDelay(ExponentialDelay { jitter: 0.0, ..e })
}

/// The delay of a restart decision; panics on a give-up.
fn delay(d: Decision) -> Duration {
    match d {
        Decision::Restart { delay, .. } => delay,
        Decision::GiveUp { reason } => panic!("gave up: {reason}"),
    }
}

fn reason(d: Decision) -> String {
    match d {
        Decision::GiveUp { reason } => reason,
        Decision::Restart { delay, note } => panic!("restarts after {delay:?} ({note})"),
    }
}

/// Fails a job right after each restart (a burst): the delays decided.
fn burst(r: &mut Restarts, t0: Instant, n: usize) -> Vec<Duration> {
    let mut now = t0;
    (0..n)
        .map(|_| {
            let d = delay(r.on_failure(now));
            now += d;
            d
        })
        .collect()
}

#[test]
fn the_default_doubles_from_100_ms_to_one_minute_and_never_gives_up() {
    let t0 = Instant::now();
    let mut r = Restarts::new(exact(ExponentialDelay::default()), t0, 1);
    let delays = burst(&mut r, t0, 1000);
    let want: Vec<Duration> = [
        100, 200, 400, 800, 1600, 3200, 6400, 12_800, 25_600, 51_200, 60_000, 60_000,
    ]
    .into_iter()
    .map(ms)
    .collect();
    assert_eq!(delays[..12], want[..]);
    assert!(delays[12..].iter().all(|d| *d == ms(60_000)));
    assert_eq!(
        RestartStrategy::default(),
        RestartStrategy::ExponentialDelay(ExponentialDelay::default())
    );
}

#[test]
fn the_note_counts_restarts_in_a_row() {
    let t0 = Instant::now();
    let mut r = Restarts::new(exact(ExponentialDelay::default()), t0, 1);
    let Decision::Restart { note, .. } = r.on_failure(t0) else {
        panic!("no restart")
    };
    assert_eq!(
        note,
        "exponential delay: restart 1 in a row; the delay resets after 10 min without failure"
    );
    let mut r = Restarts::new(
        exact(ExponentialDelay {
            max_attempts: Some(3),
            ..ExponentialDelay::default()
        }),
        t0,
        1,
    );
    let _ = r.on_failure(t0);
    let Decision::Restart { note, .. } = r.on_failure(t0 + ms(100)) else {
        panic!("no restart")
    };
    assert_eq!(
        note,
        "exponential delay: restart 2 of 3 in a row; the delay resets after 10 min without failure"
    );
}

#[test]
fn a_stable_period_resets_the_delay_and_the_count() {
    let t0 = Instant::now();
    let e = ExponentialDelay {
        reset_threshold: ms(1000),
        max_attempts: Some(2),
        ..ExponentialDelay::default()
    };
    let mut r = Restarts::new(exact(e), t0, 1);
    // Restart 1 at t0 (100 ms), restart 2 right after it resumed (200 ms).
    assert_eq!(delay(r.on_failure(t0)), ms(100));
    assert_eq!(delay(r.on_failure(t0 + ms(100))), ms(200));
    // Resumed at 300 ms; ran 999 ms: not stable yet, and the limit of 2 is used.
    let gave_up = reason(r.clone().on_failure(t0 + ms(1299)));
    assert_eq!(
        gave_up,
        "the exponential-delay strategy allows at most 2 restarts in a row, and the job failed \
         again after running 999 ms (the count resets after 1 s without failure)"
    );
    // Ran exactly the threshold: the delay and the count start over.
    assert_eq!(delay(r.on_failure(t0 + ms(1300))), ms(100));
    assert_eq!(delay(r.on_failure(t0 + ms(1400))), ms(200));
    let gave_up = reason(r.on_failure(t0 + ms(1600)));
    assert!(
        gave_up.contains("after running 0 ms"),
        "a failure right after the restart: {gave_up}"
    );
}

#[test]
fn five_failures_each_after_a_stable_period_never_reach_a_limit_of_one() {
    let t0 = Instant::now();
    let e = ExponentialDelay {
        reset_threshold: ms(500),
        max_attempts: Some(1),
        ..ExponentialDelay::default()
    };
    let mut r = Restarts::new(exact(e), t0, 1);
    let mut now = t0;
    for _ in 0..5 {
        now += ms(700);
        let d = delay(r.on_failure(now));
        assert_eq!(d, ms(100));
        now += d;
    }
}

#[test]
fn the_first_failure_counts_the_run_since_the_start() {
    let t0 = Instant::now();
    let e = ExponentialDelay {
        reset_threshold: ms(1000),
        max_attempts: Some(0),
        ..ExponentialDelay::default()
    };
    let mut r = Restarts::new(exact(e), t0, 1);
    let gave_up = reason(r.on_failure(t0 + ms(1500)));
    assert!(gave_up.contains("at most 0 restarts in a row"), "{gave_up}");
}

#[test]
fn jitter_spreads_each_delay_within_its_fraction() {
    let t0 = Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let mut r = Restarts::new(RestartStrategy::default(), t0, seed);
        let d = delay(r.on_failure(t0));
        assert!(d >= ms(90) && d <= ms(110), "seed {seed}: {d:?}");
        seen.insert(d);
        let d = delay(r.on_failure(t0 + d));
        assert!(d >= ms(180) && d <= ms(220), "seed {seed}: {d:?}");
    }
    assert!(seen.len() > 100, "jitter barely varies: {seen:?}");
}

#[test]
fn a_zero_initial_backoff_restarts_at_once() {
    let t0 = Instant::now();
    let e = ExponentialDelay {
        initial_backoff: Duration::ZERO,
        ..ExponentialDelay::default()
    };
    let mut r = Restarts::new(RestartStrategy::ExponentialDelay(e), t0, 7);
    assert_eq!(burst(&mut r, t0, 5), vec![Duration::ZERO; 5]);
}

#[test]
fn failure_rate_gives_up_on_the_failure_past_its_limit_within_the_interval() {
    let t0 = Instant::now();
    let s = RestartStrategy::failure_rate(2, ms(10_000), ms(50));
    let mut r = Restarts::new(s, t0, 1);
    let Decision::Restart { delay: first, note } = r.on_failure(t0) else {
        panic!()
    };
    assert_eq!(
        (first, note.as_str()),
        (ms(50), "failure rate: failure 1 of at most 2 per 10 s")
    );
    assert_eq!(delay(r.on_failure(t0 + ms(1000))), ms(50));
    assert_eq!(
        reason(r.on_failure(t0 + ms(2500))),
        "the failure-rate strategy allows at most 2 failures per 10 s, and this is failure 3 \
         within 2.5 s"
    );
}

#[test]
fn failure_rate_forgets_failures_older_than_the_interval() {
    let t0 = Instant::now();
    let s = RestartStrategy::failure_rate(2, ms(10_000), ms(50));
    let mut r = Restarts::new(s, t0, 1);
    // Failures at 0, 5 and 10 s: the first is a whole interval before the third.
    for at in [0, 5_000, 10_000, 15_000, 20_000, 25_000] {
        assert_eq!(delay(r.on_failure(t0 + ms(at))), ms(50), "at {at} ms");
    }
    // A third failure 100 ms after the one at 25 s: with the one at 20 s, three within 5.1 s.
    assert!(reason(r.on_failure(t0 + ms(25_100))).contains("failure 3 within 5.1 s"));
}

#[test]
fn fixed_delay_counts_over_the_whole_run() {
    let t0 = Instant::now();
    let mut r = Restarts::new(RestartStrategy::fixed_delay(3, ms(20)), t0, 1);
    for i in 1..=3u64 {
        // A day of stable running between failures changes nothing.
        let Decision::Restart { delay, note } = r.on_failure(t0 + Duration::from_secs(86_400 * i))
        else {
            panic!()
        };
        assert_eq!(delay, ms(20));
        assert_eq!(note, format!("fixed delay: restart {i} of 3"));
    }
    assert_eq!(
        reason(r.on_failure(t0 + Duration::from_secs(86_400 * 4))),
        "the fixed-delay strategy allows 3 restarts over the whole run, and all are used"
    );
    let mut one = Restarts::new(RestartStrategy::fixed_delay(1, ms(20)), t0, 1);
    let _ = one.on_failure(t0);
    assert_eq!(
        reason(one.on_failure(t0 + ms(100))),
        "the fixed-delay strategy allows 1 restart over the whole run, and it is used"
    );
    let mut none = Restarts::new(RestartStrategy::fixed_delay(0, ms(20)), t0, 1);
    assert!(reason(none.on_failure(t0)).contains("allows 0 restarts"));
}

#[test]
fn none_never_restarts() {
    let t0 = Instant::now();
    let mut r = Restarts::new(RestartStrategy::None, t0, 1);
    assert_eq!(
        reason(r.on_failure(t0 + Duration::from_secs(3600))),
        "restarts are turned off (RestartStrategy::None)"
    );
}

#[test]
fn invalid_settings_are_refused_with_what_to_change() {
    let exp = |f: fn(&mut ExponentialDelay)| {
        let mut e = ExponentialDelay::default();
        f(&mut e);
        RestartStrategy::ExponentialDelay(e)
            .validate()
            .unwrap_err()
            .to_string()
    };
    assert!(
        exp(|e| e.multiplier = 0.5)
            .contains("multiplier must be a number of at least 1.0, got 0.5")
    );
    assert!(exp(|e| e.multiplier = f64::NAN).contains("multiplier"));
    assert!(exp(|e| e.jitter = 1.5).contains("jitter must be between 0.0 and 1.0, got 1.5"));
    assert!(
        exp(|e| e.initial_backoff = ms(120_000))
            .contains("the initial backoff (2 min) is longer than the maximum backoff (1 min)")
    );
    assert!(
        exp(|e| e.reset_threshold = Duration::ZERO).contains("reset threshold must be positive")
    );
    let e = RestartStrategy::failure_rate(0, ms(1000), ms(10))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("use RestartStrategy::None"), "{e}");
    let e = RestartStrategy::failure_rate(1, Duration::ZERO, ms(10))
        .validate()
        .unwrap_err()
        .to_string();
    assert!(e.contains("interval must be positive"), "{e}");
    RestartStrategy::default().validate().unwrap();
    RestartStrategy::fixed_delay(0, Duration::ZERO)
        .validate()
        .unwrap();
    RestartStrategy::None.validate().unwrap();
}

#[test]
fn strategies_describe_themselves() {
    assert_eq!(
        RestartStrategy::default().to_string(),
        "exponential delay (100 ms growing ×2 up to 1 min, reset after 10 min without failure, unlimited restarts)"
    );
    assert_eq!(
        RestartStrategy::fixed_delay(3, ms(1500)).to_string(),
        "fixed delay (3 restarts over the run, 1.5 s apart)"
    );
    assert_eq!(RestartStrategy::None.to_string(), "no restarts");
    assert_eq!(human(ms(7_200_000)), "2 h");
    assert_eq!(human(ms(90_000)), "1.5 min");
    assert_eq!(human(ms(999)), "999 ms");
}

proptest! {
    /// Failure rate against a reference that keeps every failure: the job gives up at the
    /// first failure that has more than `max` failures (itself included) less than
    /// `interval` before it.
    #[test]
    fn failure_rate_matches_a_reference(
        max in 1u32..5,
        interval in 1u64..2_000,
        gaps in proptest::collection::vec(0u64..1_000, 1..40),
    ) {
        let t0 = Instant::now();
        let mut r = Restarts::new(RestartStrategy::failure_rate(max, ms(interval), ms(5)), t0, 3);
        let mut at = Vec::new();
        let mut now = 0u64;
        for g in gaps {
            now += g;
            at.push(now);
            let recent = at.iter().filter(|t| now - **t < interval).count() as u32;
            let gave_up = matches!(r.on_failure(t0 + ms(now)), Decision::GiveUp { .. });
            prop_assert_eq!(gave_up, recent > max, "failures at {:?}", at);
            if gave_up {
                break;
            }
        }
    }

    /// Exponential delay (no jitter) against a reference: the delay is the initial one
    /// times the multiplier to the number of earlier restarts in a row, capped; a failure
    /// after at least the threshold of running since the last restart starts a new row.
    #[test]
    fn exponential_delay_matches_a_reference(
        initial in 0u64..500,
        extra in 0u64..10_000,
        multiplier in 1.0f64..4.0,
        threshold in 1u64..5_000,
        limit in proptest::option::of(0u32..6),
        runs in proptest::collection::vec(0u64..8_000, 1..40),
    ) {
        let e = ExponentialDelay {
            initial_backoff: ms(initial),
            max_backoff: ms(initial + extra),
            multiplier,
            reset_threshold: ms(threshold),
            jitter: 0.0,
            max_attempts: limit,
        };
        let t0 = Instant::now();
        let mut r = Restarts::new(RestartStrategy::ExponentialDelay(e), t0, 3);
        let mut now = t0;
        let mut row = 0u32;
        let mut backoff = ms(initial);
        for ran in runs {
            now += ms(ran);
            if ran >= threshold {
                row = 0;
                backoff = ms(initial);
            }
            let d = r.on_failure(now);
            if limit.is_some_and(|l| row >= l) {
                prop_assert!(matches!(d, Decision::GiveUp { .. }), "{:?}", d);
                break;
            }
            row += 1;
            prop_assert_eq!(d.clone(), Decision::Restart {
                delay: backoff,
                note: match &d { Decision::Restart { note, .. } => note.clone(), _ => String::new() },
            });
            now += backoff;
            backoff = backoff.mul_f64(multiplier).min(ms(initial + extra)).max(ms(initial));
        }
    }
}
