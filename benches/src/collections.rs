//! `state-collections`: what one list append and one map put cost on the RocksDB backend
//! as the key's collection grows.
//!
//! For each size S, a fresh RocksDB backend (default settings) gets one key whose list
//! holds S elements and whose map holds S entries, checkpointed so that they are in
//! RocksDB. Then `ops` appends to that list and `ops` puts of new user keys into that map
//! are timed, each followed by a checkpoint (its synchronous part and its background SST
//! write), so the time includes writing the changes back: a cost per operation that does
//! not grow with S is what lists and maps stored entry by entry are for. Reading the whole
//! list back with `ListState::iter` gives a cost per element.
//!
//! For comparison, `one_value_list_add_ns` times the layout lists had before (the whole
//! list as one value: each append reads, changes and writes back the list) with a value
//! state holding a `Vec`, over fewer operations at large sizes (`one_value_ops`).
//!
//! Each figure is given twice: wall-clock nanoseconds per operation (`*_ns`) and CPU
//! nanoseconds of the whole process per operation (`*_cpu_ns`, RocksDB's background
//! threads included; Linux only), which other load on a shared host disturbs less.

use anyhow::Result;
use std::collections::BTreeMap;
use std::time::Instant;
use weir::ids::CheckpointId;
use weir::state::{KeyContext, StateContext};

const KEY: u64 = 7;

struct Instance {
    _dir: tempfile::TempDir,
    ctx: StateContext<u64>,
    checkpoints: u64,
}

impl Instance {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let cfg = weir::RocksDbConfig {
            local_dir: dir.path().join("local"),
            ..weir::RocksDbConfig::default()
        };
        let backend = weir_state::RocksDbBackend::open(
            &cfg,
            "op1-0",
            weir::data::DEFAULT_MAX_PARALLELISM,
            0,
            1,
            BTreeMap::new(),
            &[],
        )?;
        let key = KeyContext::<u64>::new();
        let ctx = StateContext::new(key.clone(), Box::new(backend));
        key.set(KEY);
        Ok(Instance {
            _dir: dir,
            ctx,
            checkpoints: 0,
        })
    }

    /// A checkpoint, waited for to the end of its background write.
    fn checkpoint(&mut self) -> Result<()> {
        self.checkpoints += 1;
        let hooks = self.ctx.hooks();
        let mut snap = hooks
            .borrow_mut()
            .snapshot(CheckpointId(self.checkpoints))?;
        snap.resolve_files()?;
        Ok(())
    }
}

/// A measurement's start: wall clock and the process's CPU time (all threads, RocksDB's
/// background work included), which a busy shared host disturbs less than wall time.
struct Start(Instant, Option<f64>);

fn start() -> Start {
    Start(
        Instant::now(),
        weir_bench::nexmark::run::process_cpu_seconds(),
    )
}

/// Wall and CPU nanoseconds per operation since `s`.
fn per_op(s: Start, ops: u64) -> (f64, f64) {
    let ops = ops.max(1) as f64;
    let wall = s.0.elapsed().as_nanos() as f64 / ops;
    let cpu = match (s.1, weir_bench::nexmark::run::process_cpu_seconds()) {
        (Some(a), Some(b)) => (b - a) * 1e9 / ops,
        _ => f64::NAN,
    };
    (wall.round(), cpu.round())
}

/// One size's figures, as a JSON line.
pub fn run(size: u64, ops: u64) -> Result<String> {
    let mut db = Instance::new()?;
    let mut list = db.ctx.list_state::<u64>("list")?;
    let mut map = db.ctx.map_state::<u64, u64>("map")?;
    for i in 0..size {
        list.add(i)?;
        map.put(i, i)?;
        if i % 1_000_000 == 999_999 {
            db.checkpoint()?;
        }
    }
    db.checkpoint()?;

    let s = start();
    for i in 0..ops {
        list.add(size + i)?;
    }
    db.checkpoint()?;
    let list_add = per_op(s, ops);

    let s = start();
    for i in 0..ops {
        map.put(size + i, i)?;
    }
    db.checkpoint()?;
    let map_put = per_op(s, ops);

    let s = start();
    let mut n = 0u64;
    for v in list.iter() {
        std::hint::black_box(v?);
        n += 1;
    }
    anyhow::ensure!(n == size + ops, "read {n} elements, wrote {}", size + ops);
    let list_iter = per_op(s, n);

    let s = start();
    let mut n = 0u64;
    for e in map.iter() {
        std::hint::black_box(e?);
        n += 1;
    }
    anyhow::ensure!(n == size + ops, "read {n} entries, wrote {}", size + ops);
    let map_iter = per_op(s, n);
    drop((list, map));

    // The one-value layout: the list is a value, read, appended to and written back.
    let one_value_ops = ops.min((20_000_000 / size.max(1)).max(10));
    let mut db = Instance::new()?;
    let mut whole = db.ctx.value_state::<Vec<u64>>("whole")?;
    whole.set((0..size).collect())?;
    db.checkpoint()?;
    let s = start();
    for i in 0..one_value_ops {
        let mut l = whole.get()?.unwrap_or_default();
        l.push(size + i);
        whole.set(l)?;
    }
    db.checkpoint()?;
    let one_value = per_op(s, one_value_ops);

    Ok(serde_json::json!({
        "bench": "state-collections",
        "size": size,
        "ops": ops,
        "list_add_ns": list_add.0,
        "list_add_cpu_ns": list_add.1,
        "map_put_ns": map_put.0,
        "map_put_cpu_ns": map_put.1,
        "list_iter_ns_per_element": list_iter.0,
        "map_iter_ns_per_entry": map_iter.0,
        "one_value_ops": one_value_ops,
        "one_value_list_add_ns": one_value.0,
        "one_value_list_add_cpu_ns": one_value.1,
    })
    .to_string())
}
