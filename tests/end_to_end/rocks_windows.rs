//! Window state in RocksDB is checkpointed incrementally: a job holding 20,000 open
//! window panes (and their timers) changes ten of them between two checkpoints, and the
//! second checkpoint writes only the files with those changes, sharing every other file
//! with the first. On the heap the whole window state was encoded at every checkpoint.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weir::RocksDbConfig;
use weir::prelude::*;

const KEYS: u32 = 20_000;
const CHANGED: u32 = 10;

/// The complete checkpoints in `dir`: (id, manifest).
fn complete(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let id = name.strip_prefix("chk-")?.parse().ok()?;
            let m = e.path().join("_metadata");
            m.exists().then_some((id, m))
        })
        .collect();
    out.sort();
    out
}

/// Emits one record for each of `KEYS` keys, waits until a checkpoint taken after them
/// completed and keeps its manifest, emits `CHANGED` more records, waits again and keeps
/// that checkpoint's manifest, then ends.
struct TwoPhases {
    dir: PathBuf,
    phase: usize,
    /// The checkpoint to wait for in the current phase.
    wait_for: u64,
    since: Instant,
    manifests: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl TwoPhases {
    /// A checkpoint whose barrier left the source after everything emitted so far: the
    /// third after the newest one that exists now.
    fn arm(&mut self) {
        self.wait_for = complete(&self.dir).last().map_or(0, |(id, _)| *id) + 3;
        self.since = Instant::now();
    }
}

impl SourceFunction<(u32, i64)> for TwoPhases {
    fn poll(&mut self, out: &mut SourceOutput<'_, (u32, i64)>) -> weir::Result<SourceStatus> {
        match self.phase {
            0 => {
                for k in 0..KEYS {
                    out.emit_at((k, i64::from(k)), 10)?;
                }
                self.arm();
                self.phase = 1;
                return Ok(SourceStatus::More);
            }
            2 => {
                for k in 0..CHANGED {
                    out.emit_at((k * 1_000, 1_000_000), 20)?;
                }
                self.arm();
                self.phase = 3;
                return Ok(SourceStatus::More);
            }
            4 => return Ok(SourceStatus::Finished),
            _ => {}
        }
        if let Some((_, m)) = complete(&self.dir)
            .into_iter()
            .find(|(id, _)| *id >= self.wait_for)
        {
            let bytes = std::fs::read(&m).map_err(|e| Error::io(m.display(), e))?;
            let json = serde_json::from_slice(&bytes).expect("a manifest is JSON");
            self.manifests.lock().unwrap().push(json);
            self.phase += 1;
            return Ok(SourceStatus::More);
        }
        if self.since.elapsed() > Duration::from_secs(120) {
            return Err(Error::user("no checkpoint completed within 120 s"));
        }
        Ok(SourceStatus::Idle(10))
    }
}

/// (file name, size, shared) of every file of a manifest's subtasks.
fn files(m: &serde_json::Value) -> Vec<(String, u64)> {
    m["operators"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|o| o["subtasks"].as_array().unwrap())
        .flat_map(|s| s["files"].as_array().unwrap())
        .map(|f| {
            (
                f["name"].as_str().unwrap().to_string(),
                f["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_checkpoint_of_large_window_state_writes_only_the_changed_files() {
    let dir = tempfile::tempdir().unwrap();
    let ck = CheckpointConfig::new(dir.path()).interval(Duration::from_millis(50));
    let mut rocks = RocksDbConfig {
        local_dir: dir.path().join("local"),
        ..RocksDbConfig::default()
    };
    // Far fewer cache entries than panes: the panes live in RocksDB.
    rocks.cache_entries = 64;
    let env = Env::new()
        .parallelism(1)
        .state_backend(BackendKind::RocksDb(rocks))
        .checkpoints(ck);
    let manifests = Arc::new(Mutex::new(Vec::new()));
    let (m, ckdir) = (manifests.clone(), dir.path().to_path_buf());
    let sums = env
        .source("two-phases", move |_| TwoPhases {
            dir: ckdir.clone(),
            phase: 0,
            wait_for: 0,
            since: Instant::now(),
            manifests: m.clone(),
        })
        .parallelism(1)
        .with_watermarks(WatermarkStrategy::bounded_out_of_orderness(0))
        .key_by(|(k, _)| *k)
        .window(WindowAssigner::tumbling(1_000))
        .reduce(|a, b| (a.0, a.1 + b.1))
        .uid("windows")
        .collect();
    env.execute("incremental windows").unwrap();

    // The windows fired once, at the end, with every record.
    let want: Vec<(u32, i64)> = (0..KEYS)
        .map(|k| {
            let extra = if k % 1_000 == 0 && k / 1_000 < CHANGED {
                1_000_000
            } else {
                0
            };
            (k, i64::from(k) + extra)
        })
        .collect();
    assert_eq!(sums.sorted(), want);

    let manifests = manifests.lock().unwrap();
    let [first, second] = &manifests[..] else {
        panic!("expected two manifests, got {}", manifests.len())
    };
    let before: std::collections::BTreeMap<String, u64> = files(first).into_iter().collect();
    let after = files(second);
    let full: u64 = after.iter().map(|(_, s)| s).sum();
    let sst = |f: &[(String, u64)]| -> u64 {
        f.iter()
            .filter(|(n, _)| n.ends_with(".sst"))
            .map(|(_, s)| s)
            .sum()
    };
    let new: Vec<(String, u64)> = after
        .iter()
        .filter(|(n, _)| !before.contains_key(n))
        .cloned()
        .collect();
    // 20,000 panes and their timers take far more than the ten changed panes.
    assert!(
        sst(&files(first)) > 200_000,
        "the first checkpoint's SST files hold the window state: {first}"
    );
    // Every SST file of the first checkpoint is still referenced: nothing was rewritten.
    for (name, size) in before.iter().filter(|(n, _)| n.ends_with(".sst")) {
        assert!(
            after.contains(&(name.clone(), *size)),
            "{name} of the first checkpoint is not shared by the second: {after:?}"
        );
    }
    // The new SST files hold the ten changes; the checkpoint wrote a small share of its size.
    assert!(
        sst(&new) * 50 < sst(&after),
        "new SST files {new:?} against {} bytes of SST files",
        sst(&after)
    );
    let written = second["stats"]["bytes"].as_u64().unwrap();
    eprintln!(
        "incremental windows: first checkpoint {} bytes of SST files; second wrote {written} of \
         {full} bytes, new SST files {new:?}",
        sst(&files(first))
    );
    assert_eq!(second["stats"]["full_bytes"].as_u64(), Some(full));
    assert!(
        written * 10 < full,
        "the second checkpoint wrote {written} of its {full} bytes: {second}"
    );
}
