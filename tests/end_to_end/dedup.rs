//! `dedup_by`: repeats of an idempotency key are dropped and counted, a reused key with a
//! different payload goes to the error output, and the remembered keys are checkpointed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use weir::metrics;
use weir::prelude::*;
use weir_tests::run;

type Payment = (String, i64);

fn pay(id: &str, amount: i64) -> Payment {
    (id.to_string(), amount)
}

fn by_key(mut errors: Vec<IdempotencyError<Payment>>) -> Vec<IdempotencyError<Payment>> {
    errors.sort_by(|a, b| (&a.key, &a.record).cmp(&(&b.key, &b.record)));
    errors
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Retries of p1 and p2 are dropped; p1 and p3 come back with other amounts, which is an
/// error, not a duplicate. Every series is checked by the operator's name.
fn dedups_with(backend: &str, name: &str) {
    let before = now_ms();
    let env = Env::new()
        .parallelism(2)
        .state_backend(BackendKind::parse(backend).unwrap());
    let errors = OutputTag::<IdempotencyError<Payment>>::new("idempotency-errors");
    let input = vec![
        pay("p1", 100),
        pay("p2", 50),
        pay("p1", 100),
        pay("p3", 7),
        pay("p1", 999),
        pay("p2", 50),
        pay("p2", 50),
        pay("p3", 8),
    ];
    let unique = env
        .from_collection(input)
        .dedup_by(|(id, _)| id.clone(), Duration::from_secs(3600), &errors)
        .name(name);
    let applied = unique.collect();
    let rejected = unique.side_output(&errors).collect();
    run(&env).unwrap();
    let after = now_ms();

    assert_eq!(
        applied.sorted(),
        vec![pay("p1", 100), pay("p2", 50), pay("p3", 7)]
    );
    let mut rejected = by_key(rejected.values());
    for e in &rejected {
        assert!(
            (before..=after).contains(&e.first_seen_ms),
            "first seen {} outside the run [{before}, {after}]",
            e.first_seen_ms
        );
        assert_eq!(
            e.message,
            format!(
                "idempotency_error: key {} was first seen at {} (Unix ms) with a different \
                 payload; the record was not applied",
                e.key, e.first_seen_ms
            )
        );
    }
    let got: Vec<(String, Payment)> = rejected.drain(..).map(|e| (e.key, e.record)).collect();
    assert_eq!(
        got,
        vec![
            ("\"p1\"".to_string(), pay("p1", 999)),
            ("\"p3\"".to_string(), pay("p3", 8))
        ]
    );
    let op = [("operator", name)];
    assert_eq!(metrics::sum("duplicates_suppressed_total", &op), 3.0);
    assert_eq!(metrics::sum("idempotency_errors_total", &op), 2.0);
    // Nothing expired within the hour: three keys remembered, over both subtasks.
    assert_eq!(metrics::sum("dedup_state_entries", &op), 3.0);
    for subtask in ["0", "1"] {
        let age = metrics::value(
            "dedup_oldest_entry_age_seconds",
            &[("operator", name), ("subtask", subtask)],
        )
        .expect("registered for every subtask");
        assert!(
            age >= 0.0 && age <= (now_ms() - before) as f64 / 1000.0,
            "subtask {subtask}: oldest entry {age} s old, the test ran {} ms",
            now_ms() - before
        );
    }
    let text = metrics::render();
    assert!(
        text.contains("# TYPE duplicates_suppressed_total counter\n"),
        "{text}"
    );
}

#[test]
fn duplicates_are_dropped_and_reused_keys_are_errors_on_the_memory_backend() {
    dedups_with("memory", "dedup-memory");
}

#[test]
fn duplicates_are_dropped_and_reused_keys_are_errors_on_rocksdb() {
    dedups_with("rocksdb", "dedup-rocksdb");
}

/// With no retention, a key is forgotten as soon as it is seen: nothing is suppressed.
#[test]
fn a_zero_retention_remembers_nothing() {
    let env = Env::new().parallelism(1);
    let errors = OutputTag::<IdempotencyError<Payment>>::new("errors");
    let unique = env
        .from_collection(vec![pay("a", 1), pay("a", 1), pay("a", 2)])
        .dedup_by(|(id, _)| id.clone(), Duration::ZERO, &errors)
        .name("dedup-zero");
    let applied = unique.collect();
    let rejected = unique.side_output(&errors).collect();
    run(&env).unwrap();
    assert_eq!(
        applied.sorted(),
        vec![pay("a", 1), pay("a", 1), pay("a", 2)]
    );
    assert!(rejected.is_empty());
    assert_eq!(
        metrics::sum("duplicates_suppressed_total", &[("operator", "dedup-zero")]),
        0.0
    );
}

/// The remembered keys are state: a job resumed from its checkpoint still drops retries
/// of keys it saw before the restart.
#[test]
fn remembered_keys_survive_a_restart_from_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let first = vec![pay("p1", 100), pay("p2", 50)];
    let mut both = first.clone();
    both.extend([pay("p1", 100), pay("p3", 1), pay("p2", 51)]);
    let job = |input: Vec<Payment>, name: &str| {
        let env = Env::new()
            .parallelism(2)
            .checkpoints(CheckpointConfig::new(dir.path()).interval(Duration::ZERO));
        let errors = OutputTag::<IdempotencyError<Payment>>::new("errors");
        let unique = env
            .from_collection(input)
            .uid("payments")
            .dedup_by(|(id, _)| id.clone(), Duration::from_secs(3600), &errors)
            .uid("dedup")
            .name(name);
        let applied = unique.collect();
        let rejected = unique.side_output(&errors).collect();
        env.execute("payments").unwrap();
        let rejected: Vec<Payment> = by_key(rejected.values())
            .into_iter()
            .map(|e| e.record)
            .collect();
        (applied.sorted(), rejected)
    };
    assert_eq!(
        job(first, "dedup-run-1"),
        (vec![pay("p1", 100), pay("p2", 50)], vec![])
    );
    // The second run resumes after the first two records: only the new ones arrive.
    assert_eq!(
        job(both, "dedup-run-2"),
        (vec![pay("p3", 1)], vec![pay("p2", 51)])
    );
    let op = [("operator", "dedup-run-2")];
    assert_eq!(metrics::sum("duplicates_suppressed_total", &op), 1.0);
    assert_eq!(metrics::sum("dedup_state_entries", &op), 3.0);
}
