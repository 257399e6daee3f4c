//! A keyed state renamed in a new job version, tried as an operator meets it: the new
//! version starts that state empty, and the old state stays in every checkpoint the new
//! version takes, so rolling back to the old version finds it where it was, at any
//! parallelism. On the memory backend and on RocksDB.

use weir::prelude::*;
use weir_tests::run;

/// Emits (key, running sum), the sum kept in a value state named `name`.
struct Sum {
    sum: ValueState<i64>,
}

impl KeyedProcessFunction<String, (String, i64), (String, i64)> for Sum {
    fn process(
        &mut self,
        (key, v): (String, i64),
        ctx: &mut KeyedContext<'_, String, (String, i64)>,
    ) -> Result<()> {
        let sum = self.sum.update(|s| s.unwrap_or(0) + v)?;
        ctx.emit((key, sum));
        Ok(())
    }
}

/// Runs the job with its sum in state `name` at `parallelism` over `input` (the records
/// read before are skipped: the source resumes after them); returns what it emitted.
fn version(
    dir: &std::path::Path,
    backend: &str,
    name: &'static str,
    parallelism: usize,
    input: &[(&str, i64)],
) -> Vec<(String, i64)> {
    let env = Env::new()
        .parallelism(parallelism)
        .state_backend(BackendKind::parse(backend).unwrap())
        .checkpoints(CheckpointConfig::new(dir).interval(std::time::Duration::ZERO));
    let input: Vec<(String, i64)> = input.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let sums = env
        .from_collection(input)
        .uid("input")
        .key_by(|(k, _)| k.clone())
        .process_with_state(move |state| {
            Ok(Sum {
                sum: state.value_state(name)?,
            })
        })
        .uid("sum")
        .collect();
    run(&env).unwrap();
    sums.sorted()
}

fn renamed_then_rolled_back(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let first = [("a", 1), ("b", 2), ("a", 3), ("c", 4)];
    let second = [("a", 10), ("b", 20)];
    let third = [("a", 100), ("c", 300)];
    let upto = |parts: &[&[(&'static str, i64)]]| parts.concat();

    let out = version(dir.path(), backend, "sum", 2, &first);
    assert_eq!(out, pairs(&[("a", 1), ("a", 4), ("b", 2), ("c", 4)]));

    // Version 2 calls the state "total" (a rename by mistake), at parallelism 3: its
    // sums start from nothing.
    let out = version(dir.path(), backend, "total", 3, &upto(&[&first, &second]));
    assert_eq!(out, pairs(&[("a", 10), ("b", 20)]));

    // Rolled back to version 1, at parallelism 1, on version 2's checkpoint: "sum" goes on
    // from where version 1 left it, without version 2's records.
    let out = version(
        dir.path(),
        backend,
        "sum",
        1,
        &upto(&[&first, &second, &third]),
    );
    assert_eq!(out, pairs(&[("a", 104), ("c", 304)]));
}

fn pairs(p: &[(&str, i64)]) -> Vec<(String, i64)> {
    p.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn a_renamed_state_is_kept_for_a_rollback_on_the_memory_backend() {
    renamed_then_rolled_back("memory");
}

#[test]
fn a_renamed_state_is_kept_for_a_rollback_on_rocksdb() {
    renamed_then_rolled_back("rocksdb");
}
