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

fn per_op_ns(start: Instant, ops: u64) -> f64 {
    start.elapsed().as_nanos() as f64 / ops.max(1) as f64
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

    let start = Instant::now();
    for i in 0..ops {
        list.add(size + i)?;
    }
    db.checkpoint()?;
    let list_add_ns = per_op_ns(start, ops);

    let start = Instant::now();
    for i in 0..ops {
        map.put(size + i, i)?;
    }
    db.checkpoint()?;
    let map_put_ns = per_op_ns(start, ops);

    let start = Instant::now();
    let mut n = 0u64;
    for v in list.iter() {
        std::hint::black_box(v?);
        n += 1;
    }
    anyhow::ensure!(n == size + ops, "read {n} elements, wrote {}", size + ops);
    let list_iter_ns = per_op_ns(start, n);

    let start = Instant::now();
    let mut n = 0u64;
    for e in map.iter() {
        std::hint::black_box(e?);
        n += 1;
    }
    anyhow::ensure!(n == size + ops, "read {n} entries, wrote {}", size + ops);
    let map_iter_ns = per_op_ns(start, n);
    drop((list, map));

    // The one-value layout: the list is a value, read, appended to and written back.
    let one_value_ops = ops.min((20_000_000 / size.max(1)).max(10));
    let mut db = Instance::new()?;
    let mut whole = db.ctx.value_state::<Vec<u64>>("whole")?;
    whole.set((0..size).collect())?;
    db.checkpoint()?;
    let start = Instant::now();
    for i in 0..one_value_ops {
        let mut l = whole.get()?.unwrap_or_default();
        l.push(size + i);
        whole.set(l)?;
    }
    db.checkpoint()?;
    let one_value_list_add_ns = per_op_ns(start, one_value_ops);

    Ok(serde_json::json!({
        "bench": "state-collections",
        "size": size,
        "ops": ops,
        "list_add_ns": list_add_ns.round(),
        "map_put_ns": map_put_ns.round(),
        "list_iter_ns_per_element": list_iter_ns.round(),
        "map_iter_ns_per_entry": map_iter_ns.round(),
        "one_value_ops": one_value_ops,
        "one_value_list_add_ns": one_value_list_add_ns.round(),
    })
    .to_string())
}
