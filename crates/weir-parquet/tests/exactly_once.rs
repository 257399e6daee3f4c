//! A real weir job writes Parquet through a failure and a restart from its last checkpoint:
//! the committed files hold every row exactly once, each is a complete Parquet file, and
//! several files per subtask and checkpoint show the rolling by size.
//!
//! The source emits its rows in bursts and starts a burst only once a checkpoint taken after
//! the previous one completed, so the rows span several checkpoints and the failure, on a
//! row of the fourth burst, comes after committed output exists, whatever the machine's
//! speed.

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::prelude::*;
use weir_parquet::{ParquetOptions, ParquetSinkExt};

const ROWS: u64 = 3_000;
const BURST: u64 = 500;
const FAIL_AT: u64 = 1_700;
const MAX_ROWS: u64 = 64;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Reading {
    id: u64,
    sensor: String,
    value: Option<f64>,
    tags: Vec<String>,
    place: Place,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Place {
    site: u32,
    floor: Option<i16>,
}

fn reading(id: u64) -> Reading {
    Reading {
        id,
        sensor: format!("sensor-{}", id % 17),
        value: (!id.is_multiple_of(5)).then_some(id as f64 / 4.0),
        tags: (0..id % 3).map(|t| format!("t{t}")).collect(),
        place: Place {
            site: (id % 7) as u32,
            floor: (id.is_multiple_of(2)).then_some(-(id as i16 % 4)),
        },
    }
}

/// Emits ids `0..ROWS` in bursts of [`BURST`]; after each burst it waits (idle) until a
/// checkpoint taken after the burst completed: two snapshots after the burst, then a
/// completion (checkpoints complete in order, so that one covers the burst).
struct Gated {
    next: u64,
    waiting: bool,
    snapshots_since_burst: u32,
    /// Where the source resumed from, for the test to see (0: from the start).
    restored_at: Arc<AtomicU64>,
}

impl SourceFunction<u64> for Gated {
    fn restore(&mut self, states: &[Vec<u8>], _ctx: &SourceContext) -> Result<()> {
        for s in states {
            self.next = weir::codec::decode(s)?;
        }
        self.restored_at.store(self.next, Ordering::SeqCst);
        Ok(())
    }
    fn poll(&mut self, out: &mut SourceOutput<'_, u64>) -> Result<SourceStatus> {
        if self.next >= ROWS {
            return Ok(SourceStatus::Finished);
        }
        if self.waiting {
            return Ok(SourceStatus::Idle(1));
        }
        let end = (self.next + BURST).min(ROWS);
        while self.next < end {
            out.emit(self.next)?;
            self.next += 1;
        }
        self.waiting = true;
        self.snapshots_since_burst = 0;
        Ok(SourceStatus::More)
    }
    fn snapshot(&mut self) -> Result<Option<(Vec<u8>, String)>> {
        self.snapshots_since_burst += 1;
        Ok(Some((
            weir::codec::encode(&self.next)?,
            format!("next {}", self.next),
        )))
    }
    fn notify_complete(&mut self, _id: weir::ids::CheckpointId) -> Result<()> {
        if self.snapshots_since_burst >= 2 {
            self.waiting = false;
        }
        Ok(())
    }
}

/// A committed file's rows, read with the parquet crate's reader; fails on an incomplete file.
fn read_file(path: &Path) -> std::result::Result<Vec<Reading>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| e.to_string())?;
    let declared = builder.metadata().file_metadata().num_rows() as usize;
    let mut rows = Vec::new();
    for batch in builder.build().map_err(|e| e.to_string())? {
        let batch = batch.map_err(|e| e.to_string())?;
        rows.extend(
            serde_arrow::from_record_batch::<Vec<Reading>>(&batch).map_err(|e| e.to_string())?,
        );
    }
    if rows.len() != declared {
        return Err(format!("{} rows, footer says {declared}", rows.len()));
    }
    Ok(rows)
}

/// (subtask, checkpoint, n) of a committed name, or `None` for any other name.
fn committed(name: &str) -> Option<(usize, u64, u32)> {
    let rest = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    let f: Vec<&str> = rest.split('-').collect();
    match f[..] {
        [w, c, n] if c.len() == 20 && n.len() == 6 => {
            Some((w.parse().ok()?, c.parse().ok()?, n.parse().ok()?))
        }
        _ => None,
    }
}

/// Every file of `dir` whose name does not start with a dot must be a committed part and a
/// complete Parquet file; returns their rows by name.
fn committed_files(dir: &Path) -> std::result::Result<BTreeMap<String, Vec<Reading>>, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())? {
        let name = e.map_err(|e| e.to_string())?.file_name();
        let name = name.to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if committed(&name).is_none() {
            return Err(format!("{name} is visible but not a committed part's name"));
        }
        let rows = read_file(&dir.join(&name)).map_err(|e| format!("{name}: {e}"))?;
        out.insert(name, rows);
    }
    Ok(out)
}

#[test]
fn a_failure_mid_run_leaves_every_row_committed_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let ck = CheckpointConfig::new(tmp.path().join("ck")).interval(Duration::from_millis(20));
    let env = Env::new().parallelism(2).checkpoints(ck);

    let restored_at = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    // What a reader saw in the output directory at the moment of the failure.
    let seen_at_failure: Arc<Mutex<Option<std::result::Result<usize, String>>>> =
        Arc::new(Mutex::new(None));

    let r = restored_at.clone();
    let (f, seen, dir) = (failed.clone(), seen_at_failure.clone(), out.clone());
    env.source("gated", move |_ctx| Gated {
        next: 0,
        waiting: false,
        snapshots_since_burst: 0,
        restored_at: r.clone(),
    })
    .parallelism(1)
    .uid("source")
    .try_map(move |id: u64| {
        if id == FAIL_AT && !f.swap(true, Ordering::SeqCst) {
            let files = committed_files(&dir).map(|files| files.len());
            *seen.lock().unwrap() = Some(files);
            return Err(Error::user(format!("injected failure at row {id}")));
        }
        Ok(reading(id))
    })
    .uid("readings")
    .write_parquet_exactly_once(&out, ParquetOptions::default().max_rows(MAX_ROWS))
    .uid("sink");

    let result = env.execute("parquet-exactly-once").unwrap();
    assert_eq!(
        result.restarts, 1,
        "the injected failure restarted the job once"
    );
    let resumed = restored_at.load(Ordering::SeqCst);
    assert!(
        (BURST..=FAIL_AT).contains(&resumed),
        "the restart resumed from a checkpoint after the first burst, before the failure \
         ({resumed})"
    );
    let at_failure = seen_at_failure
        .lock()
        .unwrap()
        .clone()
        .expect("the failure happened");
    let visible = at_failure.expect("every visible file was complete at the failure");
    assert!(visible > 0, "committed output existed before the failure");

    let files = committed_files(&out).unwrap();
    let hidden: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".part-"))
        .collect();
    // (The runtime's lease on the directory, `.weir-owner-*`, is hidden too.)
    assert!(hidden.is_empty(), "nothing is left uncommitted: {hidden:?}");

    let mut rows: Vec<Reading> = files.values().flatten().cloned().collect();
    rows.sort_by_key(|r| r.id);
    assert_eq!(rows.len() as u64, ROWS, "every row once, no duplicate");
    assert_eq!(rows, (0..ROWS).map(reading).collect::<Vec<_>>());

    // Rolling by size: no file over the limit, and some subtask closed several files
    // within one checkpoint.
    let mut per_checkpoint: BTreeMap<(usize, u64), Vec<u32>> = BTreeMap::new();
    for (name, rows) in &files {
        assert!(
            rows.len() as u64 <= MAX_ROWS,
            "{name} has {} rows",
            rows.len()
        );
        let (w, c, n) = committed(name).unwrap();
        per_checkpoint.entry((w, c)).or_default().push(n);
    }
    for (key, ns) in &per_checkpoint {
        let expected: Vec<u32> = (0..ns.len() as u32).collect();
        assert_eq!(
            ns, &expected,
            "files of {key:?} are numbered from 0 without gaps"
        );
    }
    assert!(
        per_checkpoint.values().any(|ns| ns.len() > 1),
        "several files per checkpoint: {per_checkpoint:?}"
    );
    let checkpoints: std::collections::BTreeSet<u64> =
        per_checkpoint.keys().map(|(_, c)| *c).collect();
    assert!(
        checkpoints.len() >= 4,
        "the rows span several checkpoints: {checkpoints:?}"
    );
}

/// A row type without a Parquet mapping fails the job before it writes anything, naming
/// the field, and is not restarted.
#[test]
fn a_type_without_a_parquet_mapping_fails_the_job_naming_the_field() {
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    enum Shape {
        Circle(f64),
        Square { side: f64 },
    }
    #[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
    struct Drawing {
        id: u64,
        shape: Shape,
    }
    let tmp = tempfile::tempdir().unwrap();
    let env = Env::new().parallelism(1);
    env.from_collection(vec![Drawing {
        id: 1,
        shape: Shape::Circle(1.0),
    }])
    .write_parquet_exactly_once(tmp.path().join("out"), ParquetOptions::default());
    let e = env.execute("bad-type").unwrap_err();
    let msg = e.to_string();
    assert!(e.is_deterministic(), "{msg}");
    assert!(msg.contains("Drawing") && msg.contains("`shape`"), "{msg}");
    let _ = Shape::Square { side: 1.0 };
}
