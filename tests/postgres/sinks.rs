//! Jobs writing through the apply-once and fenced sinks: duplicates, poison records, retries,
//! dead letters and their replay, stale tokens, and an unreachable server.

use crate::support::{Schema, unique, url};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use weir::prelude::*;
use weir::retry::RetryPolicy;
use weir_postgres::{ApplyOnce, FencedWrites};
use weir_tests::{run, run_failing};

type Credit = (String, String, i64); // (key, account, amount)

/// An apply-once sink crediting accounts in `schema`, as handler `credits`.
fn credits(schema: &str) -> ApplyOnce<Credit> {
    let s = schema.to_string();
    ApplyOnce::new(url(), "credits", |c: &Credit| c.0.clone())
        .table(&format!("{schema}.processed_messages"))
        .retry(fast_retries(4))
        .effect(move |tx, (key, account, amount): &Credit| {
            tx.execute(
                &format!(
                    "INSERT INTO {s}.accounts (id, balance) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance"
                ),
                &[account, amount],
            )?;
            tx.execute(
                &format!("INSERT INTO {s}.ledger (key, account, amount) VALUES ($1, $2, $3)"),
                &[key, account, amount],
            )?;
            Ok(json!({ "credited": amount }))
        })
}

fn fast_retries(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        base: Duration::from_millis(1),
        cap: Duration::from_millis(5),
        max_attempts: attempts,
        ..RetryPolicy::default()
    }
}

fn c(key: &str, account: &str, amount: i64) -> Credit {
    (key.to_string(), account.to_string(), amount)
}

fn metric(name: &str, operator: &str) -> f64 {
    weir::metrics::sum(name, &[("operator", operator)])
}

#[test]
fn duplicates_in_the_input_are_applied_once() {
    let mut s = Schema::new("sink_dups");
    let op = unique("credits");
    // 40 credits over 4 accounts, each sent 1-3 times, interleaved.
    let mut input = Vec::new();
    for round in 0..3 {
        for i in 0..40 {
            if round == 0 || i % (round + 1) == 0 {
                input.push(c(&format!("k{i}"), &format!("a{}", i % 4), 1 + i as i64));
            }
        }
    }
    let total = input.len();
    let env = Env::new().parallelism(2);
    // Copies of one key reach both subtasks, so one may find the key being applied by the
    // other ("being applied right now") and retry until that transaction ends: give it
    // retries enough for a loaded machine (up to about 2 s), where 4 fast ones ran out.
    let patient = RetryPolicy {
        base: Duration::from_millis(1),
        cap: Duration::from_millis(50),
        max_attempts: 40,
        ..RetryPolicy::default()
    };
    env.from_iter(input)
        .rebalance()
        .sink(&op, credits(&s.name).retry(patient).make());
    run(&env).unwrap();
    let ledger = s.ledger_counts();
    assert_eq!(ledger.len(), 40);
    assert!(ledger.values().all(|n| *n == 1), "{ledger:?}");
    let mut want: BTreeMap<String, i64> = BTreeMap::new();
    for i in 0..40 {
        *want.entry(format!("a{}", i % 4)).or_default() += 1 + i as i64;
    }
    assert_eq!(s.balances(), want);
    assert_eq!(metric("apply_once_applied_total", &op), 40.0);
    assert_eq!(
        metric("duplicates_suppressed_total", &op),
        (total - 40) as f64
    );
}

#[test]
fn a_poison_record_goes_to_the_dead_letters_with_its_key_and_replay_applies_it_once() {
    let mut s = Schema::new("sink_dlq");
    let dir = tempfile::tempdir().unwrap();
    let op = unique("credits");
    let input = vec![
        c("k1", "a", 10),
        c("bad", "a", -5),
        c("k2", "b", 7),
        c("k1", "a", 10),
    ];
    let env = Env::new().parallelism(1);
    env.from_iter(input).sink(
        &op,
        credits(&s.name)
            .dead_letters(weir::dlq::to_dir(dir.path()))
            .make(),
    );
    run(&env).unwrap();
    // The job went on: the good records are applied once.
    assert_eq!(
        s.ledger_counts(),
        BTreeMap::from([("k1".to_string(), 1), ("k2".to_string(), 1)])
    );
    let letters = weir::dlq::read_dir(dir.path()).unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let l = &letters[0];
    assert_eq!(
        (l.handler.as_str(), l.idempotency_key.as_str(), l.attempts),
        ("credits", "bad", 1)
    );
    assert!(
        l.error.contains("positive") && l.error.contains("not retryable"),
        "{}",
        l.error
    );
    assert_eq!(l.payload_as::<Credit>().unwrap(), c("bad", "a", -5));

    // The operator fixes the cause (here: negative credits become allowed) and replays the
    // dead letters — twice, as a careless operator might. The key is applied once.
    s.db.batch_execute(&format!(
        "ALTER TABLE {}.ledger DROP CONSTRAINT positive",
        s.name
    ))
    .unwrap();
    for _ in 0..2 {
        let replay: Vec<Credit> = letters.iter().map(|l| l.payload_as().unwrap()).collect();
        let env = Env::new();
        env.from_iter(replay)
            .sink(&unique("replay"), credits(&s.name).make());
        run(&env).unwrap();
    }
    assert_eq!(
        s.ledger_counts(),
        BTreeMap::from([
            ("bad".to_string(), 1),
            ("k1".to_string(), 1),
            ("k2".to_string(), 1)
        ])
    );
    assert_eq!(
        s.balances(),
        BTreeMap::from([("a".to_string(), 5), ("b".to_string(), 7)])
    );
}

#[test]
fn retries_run_out_into_the_dead_letters_and_the_ratio_is_published() {
    let mut s = Schema::new("sink_retry");
    let dir = tempfile::tempdir().unwrap();
    let op = unique("credits");
    let sc = s.name.clone();
    // "slow" takes longer than the statement timeout every time: a retryable failure.
    let sink = credits(&s.name)
        .statement_timeout(Duration::from_millis(100))
        .retry(fast_retries(3))
        .dead_letters(weir::dlq::to_dir(dir.path()))
        .effect(move |tx, (key, account, amount): &Credit| {
            if key == "slow" {
                tx.execute("SELECT pg_sleep(2)", &[])?;
            }
            tx.execute(
                &format!("INSERT INTO {sc}.ledger (key, account, amount) VALUES ($1, $2, $3)"),
                &[key, account, amount],
            )?;
            Ok(json!(null))
        });
    let env = Env::new().parallelism(1);
    env.from_iter(vec![
        c("k1", "a", 1),
        c("slow", "a", 1),
        c("k2", "a", 1),
        c("k3", "a", 1),
    ])
    .sink(&op, sink.make());
    run(&env).unwrap();
    let letters = weir::dlq::read_dir(dir.path()).unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].idempotency_key.as_str(), letters[0].attempts),
        ("slow", 3)
    );
    assert!(
        letters[0].error.contains("statement timeout")
            && letters[0].error.contains("attempt limit"),
        "{}",
        letters[0].error
    );
    assert_eq!(s.ledger_counts().len(), 3);
    // 2 retries over 4 records.
    assert_eq!(metric("retry_ratio", &op), 0.5);
}

#[test]
fn without_dead_letters_a_poison_record_fails_the_job_naming_its_key() {
    let s = Schema::new("sink_fail");
    let env = Env::new();
    env.from_iter(vec![c("k1", "a", 1), c("poison-7", "a", 0)])
        .sink(&unique("credits"), credits(&s.name).make());
    let e = run_failing(&env).to_string();
    assert!(
        e.contains("'poison-7'") && e.contains("positive") && e.contains("dead-letter"),
        "{e}"
    );
}

#[test]
fn the_same_key_with_another_payload_is_an_idempotency_error() {
    let mut s = Schema::new("sink_reuse");
    let dir = tempfile::tempdir().unwrap();
    let op = unique("credits");
    let env = Env::new().parallelism(1);
    env.from_iter(vec![c("k1", "a", 1), c("k1", "a", 2)]).sink(
        &op,
        credits(&s.name)
            .dead_letters(weir::dlq::to_dir(dir.path()))
            .make(),
    );
    run(&env).unwrap();
    assert_eq!(s.balances(), BTreeMap::from([("a".to_string(), 1)]));
    let letters = weir::dlq::read_dir(dir.path()).unwrap();
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0].error.contains("idempotency_error"),
        "{}",
        letters[0].error
    );
    assert_eq!(letters[0].payload_as::<Credit>().unwrap(), c("k1", "a", 2));
    assert_eq!(metric("idempotency_errors_total", &op), 1.0);
}

#[test]
fn an_unreachable_server_is_a_clear_error() {
    let env = Env::new();
    env.from_iter(vec![c("k", "a", 1)]).sink(
        "credits",
        ApplyOnce::new(
            "postgres://weir:secret@127.0.0.1:1/weir",
            "h",
            |c: &Credit| c.0.clone(),
        )
        .effect_sql("SELECT 1", |_| vec![])
        .make(),
    );
    let e = run_failing(&env).to_string();
    assert!(
        e.contains("cannot connect to PostgreSQL at postgres://weir:***@127.0.0.1:1/weir"),
        "{e}"
    );
    assert!(!e.contains("secret"), "{e}");
}

#[test]
fn an_invalid_retry_policy_is_refused_naming_the_setting() {
    let env = Env::new();
    env.from_iter(vec![c("k", "a", 1)]).sink(
        "credits",
        ApplyOnce::new(url(), "h", |c: &Credit| c.0.clone())
            .effect_sql("SELECT 1", |_| vec![])
            .retry(fast_retries(0))
            .make(),
    );
    let e = run_failing(&env).to_string();
    assert!(
        e.contains("sink 'credits': retry policy: max_attempts must be at least 1")
            && !e.contains("retry policy: retry policy"),
        "{e}"
    );
}

#[test]
fn a_sink_without_an_effect_is_refused() {
    let env = Env::new();
    env.from_iter(vec![c("k", "a", 1)]).sink(
        "credits",
        ApplyOnce::new(url(), "h", |c: &Credit| c.0.clone()).make(),
    );
    let e = run_failing(&env).to_string();
    assert!(e.contains("no effect: set one with .effect"), "{e}");
}

#[test]
fn fenced_writes_keep_the_newest_token_and_give_up_stale_ones() {
    let mut s = Schema::new("sink_fence");
    s.db.batch_execute(&format!(
        "CREATE TABLE {}.items (id TEXT PRIMARY KEY, value TEXT NOT NULL, fence BIGINT NOT NULL)",
        s.name
    ))
    .unwrap();
    let op = unique("items");
    // (item, value, token): x's writes arrive out of order (a paused writer's late write).
    let writes = [
        ("x", "v1", 1),
        ("x", "v3", 3),
        ("y", "w1", 1),
        ("x", "v2", 2),
        ("x", "v3-again", 3),
        ("y", "w2", 2),
    ];
    let input: Vec<(String, String, i64)> = writes
        .iter()
        .map(|(k, v, f)| (k.to_string(), v.to_string(), *f))
        .collect();
    let t = format!("{}.items", s.name);
    let sink = FencedWrites::new(
        url(),
        "items",
        &format!(
            "INSERT INTO {t} AS cur (id, value, fence) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence
             WHERE cur.fence < EXCLUDED.fence"
        ),
        |r: &(String, String, i64)| {
            vec![Box::new(r.0.clone()), Box::new(r.1.clone()), Box::new(r.2)]
        },
    )
    .key(|r| format!("{}@{}", r.0, r.2));
    let env = Env::new().parallelism(1);
    env.from_iter(input).sink(&op, sink.make());
    run(&env).unwrap();
    let rows: Vec<(String, String, i64)> =
        s.db.query(
            &format!("SELECT id, value, fence FROM {t} ORDER BY id"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        vec![("x".into(), "v3".into(), 3), ("y".into(), "w2".into(), 2)]
    );
    assert_eq!(metric("fencing_stale_writes_total", &op), 2.0);
    assert_eq!(metric("fenced_writes_applied_total", &op), 4.0);
    // Stale tokens are given up, not retried.
    assert_eq!(metric("retry_ratio", &op), 0.0);
}

#[test]
fn the_cleanup_task_deletes_keys_past_the_retention_while_the_job_runs() {
    let mut s = Schema::new("sink_cleanup");
    let t = s.keys_table();
    let op = unique("credits");
    let sink = credits(&s.name).retention(Duration::from_secs(3600));
    // The sink creates the table when it opens; create it first to plant old keys.
    weir_postgres::Store::new(&t, Duration::from_secs(60))
        .unwrap()
        .ensure_schema(&mut s.db)
        .unwrap();
    s.db.execute(
        &format!(
            "INSERT INTO {t} (handler, idempotency_key, state, created_at) VALUES
             ('credits', 'old-1', 'DONE', now() - interval '2 hours'),
             ('credits', 'old-2', 'DONE', now() - interval '61 minutes'),
             ('other', 'old-3', 'DONE', now() - interval '2 hours')"
        ),
        &[],
    )
    .unwrap();
    let env = Env::new().parallelism(1);
    env.from_iter(vec![c("k1", "a", 1)]).sink(&op, sink.make());
    run(&env).unwrap();
    // The task's first round starts when the sink opens and runs on its own connection.
    weir_tests::wait_for("the cleanup round", Duration::from_secs(20), || {
        weir::metrics::sum(
            "apply_once_keys_deleted_total",
            &[("operator", op.as_str())],
        ) == 2.0
    });
    assert_eq!(s.keys(), ["k1", "old-3"]);
}
