//! Failures: user functions that return errors or panic fail the job promptly with the
//! operator's name and the cause; cancellation; invalid configurations and pipelines.

use weir::prelude::*;
use weir_tests::{JOB_DEADLINE, join_within, run, run_failing};

fn assert_mentions(e: &Error, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} should mention {p:?}");
    }
}

#[test]
fn try_map_error_fails_the_job_with_the_operator_name_and_cause() {
    let env = Env::new().parallelism(1);
    env.from_collection((0..100i64).collect::<Vec<_>>())
        .try_map(|x| {
            if x == 42 {
                Err(Error::user(format!("record {x} is invalid")))
            } else {
                Ok(x)
            }
        })
        .name("validate")
        .discard();
    let e = run_failing(&env);
    assert_eq!(
        e.to_string(),
        "operator 'validate' (subtask 1/1) failed: record 42 is invalid"
    );
    // `fn main() -> weir::Result<()>` prints "Error: " and the error's Debug form: the same
    // message, not the enum's structure.
    assert_eq!(
        format!("Error: {e:?}"),
        "Error: operator 'validate' (subtask 1/1) failed: record 42 is invalid"
    );
    match e {
        Error::Operator { location, cause } => {
            assert_eq!(location.operator, "validate");
            assert!(matches!(*cause, Error::User(_)), "{cause:?}");
        }
        other => panic!("expected an operator error, got {other:?}"),
    }
}

#[test]
fn a_panic_in_map_fails_the_job_with_the_operator_name_and_message() {
    let env = Env::new().parallelism(2);
    env.from_collection((0..10i64).collect::<Vec<_>>())
        .map(|x| {
            if x == 7 {
                panic!("boom at {x}");
            }
            x
        })
        .name("exploder")
        .discard();
    let e = run_failing(&env);
    assert_mentions(&e, &["operator 'exploder'", "panicked: boom at 7"]);
}

struct FailOn {
    key: &'static str,
    panic: bool,
}

impl KeyedProcessFunction<String, String, String> for FailOn {
    fn process(&mut self, v: String, ctx: &mut KeyedContext<'_, String, String>) -> Result<()> {
        if v == self.key {
            if self.panic {
                panic!("cannot handle key {v}");
            }
            return Err(Error::user(format!("refusing key {v}")));
        }
        ctx.emit(v);
        Ok(())
    }
}

#[test]
fn a_keyed_process_function_error_or_panic_fails_the_job() {
    for panic in [false, true] {
        let env = Env::new().parallelism(2);
        env.from_collection(vec![
            "a".to_string(),
            "b".into(),
            "poison".into(),
            "c".into(),
        ])
        .key_by(|s| s.clone())
        .process(move || FailOn {
            key: "poison",
            panic,
        })
        .name("keyed-check")
        .discard();
        let e = run_failing(&env);
        let cause = if panic {
            "panicked: cannot handle key poison"
        } else {
            "refusing key poison"
        };
        assert_mentions(&e, &["operator 'keyed-check'", cause]);
    }
}

#[test]
fn a_panic_in_a_sink_fails_the_job() {
    let env = Env::new().parallelism(2);
    env.from_collection((0..10i64).collect::<Vec<_>>())
        .for_each(|| {
            |v: i64, _ts| {
                if v == 3 {
                    panic!("sink cannot store {v}");
                }
                Ok(())
            }
        })
        .name("fragile-sink");
    let e = run_failing(&env);
    assert_mentions(
        &e,
        &["operator 'fragile-sink'", "panicked: sink cannot store 3"],
    );
}

/// Emits 0, 1, 2, ... forever (one batch per poll); fails at `fail_at` if set.
struct Endless {
    next: i64,
    fail_at: Option<(i64, bool)>,
}

impl SourceFunction<i64> for Endless {
    fn poll(&mut self, out: &mut SourceOutput<'_, i64>) -> Result<SourceStatus> {
        for _ in 0..100 {
            if let Some((at, panic)) = self.fail_at
                && self.next == at
            {
                if panic {
                    panic!("source broke at {at}");
                }
                return Err(Error::user(format!("source gave up at {at}")));
            }
            out.emit(self.next)?;
            self.next += 1;
        }
        Ok(SourceStatus::More)
    }
}

#[test]
fn a_failing_source_fails_the_job() {
    for panic in [false, true] {
        let env = Env::new().parallelism(2);
        env.source("flaky-source", move |_| Endless {
            next: 0,
            fail_at: Some((1000, panic)),
        })
        .key_by(|x| x % 10)
        .reduce(|a, b| a + b)
        .discard();
        let e = run_failing(&env);
        let cause = if panic {
            "panicked: source broke at 1000"
        } else {
            "source gave up at 1000"
        };
        assert_mentions(&e, &["operator 'flaky-source'", cause]);
    }
}

#[test]
fn a_panic_in_a_key_selector_fails_the_job() {
    let env = Env::new().parallelism(2);
    env.from_collection(vec![1i64, 2, 3])
        .key_by(|x| {
            if *x == 2 {
                panic!("no key for {x}");
            }
            *x
        })
        .reduce(|a, b| a + b)
        .discard();
    // The key selector also runs in the upstream task (to route the record), so the
    // operator named is whichever ran it first; the cause is always there.
    let e = run_failing(&env);
    assert_mentions(&e, &["panicked: no key for 2"]);
}

#[test]
fn an_infinite_source_with_a_failing_downstream_operator_fails_promptly() {
    let env = Env::new().parallelism(2);
    env.source("endless", |_| Endless {
        next: 0,
        fail_at: None,
    })
    .key_by(|x| x % 7)
    .process(|| FailAbove(50_000))
    .name("limit")
    .discard();
    // run_failing waits at most JOB_DEADLINE: the infinite source must be stopped.
    let e = run_failing(&env);
    // Whichever subtask fails first, it fails on a value at or above the limit.
    assert_mentions(&e, &["operator 'limit'", "is above the limit of 50000"]);
}

struct FailAbove(i64);

impl KeyedProcessFunction<i64, i64, i64> for FailAbove {
    fn process(&mut self, v: i64, ctx: &mut KeyedContext<'_, i64, i64>) -> Result<()> {
        if v >= self.0 {
            return Err(Error::user(format!("{v} is above the limit of {}", self.0)));
        }
        ctx.emit(v);
        Ok(())
    }
}

#[test]
fn cancel_stops_a_job_with_an_infinite_source() {
    // Repeated: the outcome must not depend on which task notices the cancellation first.
    for _ in 0..5 {
        let env = Env::new().parallelism(2);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        env.source("endless", |_| Endless {
            next: 0,
            fail_at: None,
        })
        .key_by(|x| x % 3)
        .reduce(|a, b| a.wrapping_add(b))
        .for_each(move || {
            let tx = tx.clone();
            let mut told = false;
            move |_, _| {
                if !told {
                    told = true;
                    let _ = tx.send(());
                }
                Ok(())
            }
        });
        let handle = env.execute_async("endless").unwrap();
        rx.recv_timeout(JOB_DEADLINE)
            .expect("records reach the sink");
        assert!(!handle.is_finished());
        handle.cancel();
        let r = join_within(handle, JOB_DEADLINE);
        assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    }
}

#[test]
fn parallelism_zero_is_a_config_error() {
    let env = Env::new().parallelism(0);
    env.from_collection(vec![1]).discard();
    let e = env.execute("zero").unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert_mentions(&e, &["parallelism must be at least 1"]);
}

#[test]
fn keyed_parallelism_above_max_parallelism_is_a_config_error() {
    let env = Env::new().parallelism(2).max_parallelism(4);
    env.from_collection(vec![1i64, 2])
        .key_by(|x| *x)
        .reduce(|a, b| a + b)
        .name("sum")
        .parallelism(8)
        .discard();
    let e = env.execute("too-parallel").unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert_mentions(
        &e,
        &[
            "'sum'",
            "parallelism 8",
            "max parallelism 4",
            "raise max_parallelism",
        ],
    );

    // The job default applies to keyed operators too.
    let env = Env::new().parallelism(8).max_parallelism(4);
    env.from_collection(vec![1i64])
        .key_by(|x| *x)
        .reduce(|a, b| a + b)
        .discard();
    let e = env.execute("too-parallel").unwrap_err();
    assert_mentions(&e, &["'reduce'", "raise max_parallelism"]);
}

#[test]
fn other_invalid_configs_say_what_to_change() {
    let cases: Vec<(Env, &str)> = vec![
        (
            Env::new().max_parallelism(0),
            "max parallelism must be between 1 and 32768",
        ),
        (Env::new().exchange(0, 4), "batch size must be at least 1"),
        (
            Env::new().exchange(16, 0),
            "channel capacity must be at least 1",
        ),
    ];
    for (env, msg) in cases {
        env.from_collection(vec![1]).discard();
        let e = env.execute("bad").unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        assert_mentions(&e, &[msg]);
    }
}

#[test]
fn an_empty_or_already_executed_pipeline_is_a_config_error() {
    let env = Env::new().parallelism(1);
    let e = env.execute("empty").unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    env.from_collection(vec![1]).discard();
    run(&env).unwrap();
    let e = env.execute("again").unwrap_err();
    assert_mentions(&e, &["already executed"]);
}

#[test]
#[should_panic(expected = "parallelism must be at least 1")]
fn operator_parallelism_zero_panics_at_build_time() {
    let env = Env::new();
    let _ = env.from_collection(vec![1]).map(|x| x + 1).parallelism(0);
}

#[test]
#[should_panic(expected = "is not parallel")]
fn a_collection_source_cannot_be_parallel() {
    let env = Env::new();
    let _ = env.from_collection(vec![1]).parallelism(2);
}

#[test]
#[should_panic(expected = "no side output named 'never-declared'")]
fn reading_an_undeclared_side_output_panics() {
    let env = Env::new();
    let tag = OutputTag::<i64>::new("never-declared");
    let _ = env.from_collection(vec![1i64]).map(|x| x).side_output(&tag);
}

#[test]
fn read_text_file_of_a_missing_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("does-not-exist.txt");
    let env = Env::new().parallelism(2);
    env.read_text_file(&path).discard();
    let e = run_failing(&env);
    assert_mentions(&e, &["operator 'text-file'", &path.display().to_string()]);
}

#[test]
fn a_window_on_records_without_timestamps_explains_the_fix() {
    let env = Env::new().parallelism(1);
    env.from_collection(vec![1i64, 2])
        .key_by(|x| x % 2)
        .window(WindowAssigner::tumbling(10))
        .reduce(|a, b| a + b)
        .discard();
    let e = run_failing(&env);
    assert_mentions(&e, &["without a timestamp", "with_watermarks"]);
}

#[test]
fn a_failure_in_a_co_process_function_names_it() {
    struct Picky;
    impl CoProcessFunction<(), i64, i64, i64> for Picky {
        fn process1(&mut self, v: i64, ctx: &mut CoContext<'_, (), i64>) -> Result<()> {
            ctx.emit(v);
            Ok(())
        }
        fn process2(&mut self, v: i64, _ctx: &mut CoContext<'_, (), i64>) -> Result<()> {
            Err(Error::user(format!("second input rejected {v}")))
        }
    }
    let env = Env::new().parallelism(2);
    let a = env.from_collection(vec![1i64, 2]);
    let b = env.from_collection(vec![9i64]);
    a.connect(&b).process(|| Picky).name("picky").discard();
    let e = run_failing(&env);
    assert_mentions(&e, &["operator 'picky'", "second input rejected 9"]);
}

/// A checkpoint directory holds one job's checkpoints: another job started on it is refused
/// (its state would be mixed into the wrong job), naming both jobs; an explicit restore of
/// that checkpoint is allowed.
#[test]
fn a_checkpoint_directory_of_another_job_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let job = |name: &str, restore_from: Option<std::path::PathBuf>| {
        let mut ck = CheckpointConfig::new(dir.path()).interval(std::time::Duration::ZERO);
        ck.restore_from = restore_from;
        let env = Env::new().parallelism(1).checkpoints(ck);
        let sums = env
            .from_collection(vec![("a".to_string(), 1i64), ("a".into(), 2)])
            .key_by(|(k, _)| k.clone())
            .reduce(|a, b| (a.0, a.1 + b.1))
            .uid("sum")
            .collect();
        (env.execute(name), sums)
    };
    let (first, sums) = job("orders", None);
    first.unwrap();
    assert_eq!(sums.sorted(), vec![("a".into(), 1), ("a".into(), 3)]);

    let (second, sums) = job("payments", None);
    let e = second.unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert_mentions(
        &e,
        &[
            "job 'orders'",
            "not of job 'payments'",
            "own checkpoint directory",
        ],
    );
    assert!(sums.sorted().is_empty());

    let checkpoint = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("chk-"))
        .expect("the first job left a checkpoint");
    let (explicit, _) = job("payments", Some(checkpoint));
    explicit.unwrap();
}

/// A new version of a job drops its watermark assigner (which kept nothing but its
/// watermark) and resumes from the old version's checkpoint; dropping an operator that
/// holds state is still refused, naming it.
#[test]
fn dropping_a_watermark_assigner_keeps_the_checkpoint_usable() {
    let dir = tempfile::tempdir().unwrap();
    let job = |with_watermarks: bool, with_sums: bool| {
        let env = Env::new()
            .parallelism(1)
            .checkpoints(CheckpointConfig::new(dir.path()).interval(std::time::Duration::ZERO));
        let mut input = env
            .from_timestamped(vec![(("a".to_string(), 1i64), 10), (("a".into(), 2), 20)])
            .uid("input");
        if with_watermarks {
            input = input.with_watermarks(WatermarkStrategy::monotonous());
        }
        let out = if with_sums {
            input
                .key_by(|(k, _)| k.clone())
                .reduce(|a, b| (a.0, a.1 + b.1))
                .uid("sum")
                .collect()
        } else {
            input.collect()
        };
        (env.execute("versions"), out)
    };
    let (first, sums) = job(true, true);
    first.unwrap();
    assert_eq!(sums.sorted(), vec![("a".into(), 1), ("a".into(), 3)]);

    // The final checkpoint holds the assigner's watermark; the new version has no
    // assigner, resumes after the end and reads nothing more.
    let (second, sums) = job(false, true);
    second.expect("a checkpoint whose only missing operator kept no state must restore");
    assert!(sums.sorted().is_empty());

    let (third, _) = job(false, false);
    let e = third.unwrap_err();
    assert_mentions(
        &e,
        &[
            "holds state of operator 'sum'",
            "give the operator the same uid",
        ],
    );
}

/// A new version of a job keeps a keyed state's name but changes its type: the checkpoint's
/// entries do not decode. Tried as a user would: run version 1 to its final checkpoint,
/// then start version 2 on the same directory. The restore fails at once, naming the
/// state, instead of restarting the job over the same checkpoint without end (an older
/// checkpoint would hold the same type). Version 1 still restores it. On the heap the
/// restore itself fails; on RocksDB, values decode when read: the first read of an old
/// entry fails.
fn keyed_state_whose_type_changed_fails_naming_it(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let env = || {
        Env::new()
            .parallelism(1)
            .state_backend(BackendKind::parse(backend).unwrap())
            .checkpoints(CheckpointConfig::new(dir.path()).interval(std::time::Duration::ZERO))
    };
    let input = vec![("a".to_string(), 1i64), ("b".into(), 2), ("a".into(), 3)];
    let version_1 = |input: Vec<(String, i64)>| {
        let env = env();
        let sums = env
            .from_collection(input)
            .uid("input")
            .key_by(|(k, _)| k.clone())
            .reduce(|a, b| (a.0, a.1 + b.1))
            .uid("sum")
            .collect();
        (run(&env), sums)
    };
    let (first, sums) = version_1(input.clone());
    first.unwrap();
    assert_eq!(
        sums.sorted(),
        vec![("a".to_string(), 1), ("a".into(), 4), ("b".into(), 2)]
    );

    // Version 2 keeps the sum as text: (String, String) where (String, i64) was stored.
    // Its input has one more record, for key "a".
    let mut more = input.clone();
    more.push(("a".into(), 10));
    let env2 = env();
    let _texts = env2
        .from_collection(more.clone())
        .uid("input")
        .map(|(k, v)| (k, v.to_string()))
        .key_by(|(k, _)| k.clone())
        .reduce(|a, b| (a.0, format!("{}+{}", a.1, b.1)))
        .uid("sum")
        .collect();
    let e = run_failing(&env2);
    assert_mentions(
        &e,
        &[
            "state 'reduce' does not decode as the type the job declares",
            "it was written with another type",
            "restore with the job version that wrote it",
        ],
    );

    // Nothing was lost: version 1, given the same four records, resumes after the three it
    // read and its sum goes on.
    let (again, sums) = version_1(more);
    again.unwrap();
    assert_eq!(sums.sorted(), vec![("a".to_string(), 14)]);
}

#[test]
fn keyed_state_whose_type_changed_fails_the_restore_naming_it() {
    keyed_state_whose_type_changed_fails_naming_it("memory");
}

#[test]
fn keyed_state_whose_type_changed_fails_its_first_read_on_rocksdb_naming_it() {
    keyed_state_whose_type_changed_fails_naming_it("rocksdb");
}
