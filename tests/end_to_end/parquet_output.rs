//! A weir job writes Parquet to a real S3-compatible server (S3Proxy, see tests/s3.rs)
//! through a failure and a restart from its last checkpoint: every row is committed exactly
//! once, every object visible under a committed name is a complete Parquet file from the
//! moment it appears, rolling by rows closes several objects per checkpoint, and nothing
//! else (no markers, no parts) is left below the prefix.
//!
//! The source emits its rows in bursts and starts a burst only once a checkpoint taken after
//! the previous one completed, so the rows span several checkpoints and the failure, on a
//! row of the fourth burst, comes after committed output exists, whatever the machine's
//! speed.

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weir::prelude::*;
use weir_parquet::{ParquetOptions, ParquetSinkExt};
use weir_tests::s3;

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
}

fn reading(id: u64) -> Reading {
    Reading {
        id,
        sensor: format!("sensor-{}", id % 17),
        value: (!id.is_multiple_of(5)).then_some(id as f64 / 4.0),
        tags: (0..id % 3).map(|t| format!("t{t}")).collect(),
    }
}

/// Emits ids `0..ROWS` in bursts of [`BURST`]; after each burst it waits (idle) until a
/// checkpoint taken after the burst completed: two snapshots after the burst, then a
/// completion (checkpoints complete in order, so that one covers the burst).
struct Gated {
    next: u64,
    waiting: bool,
    snapshots_since_burst: u32,
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

/// A reader's view of the prefix: the committed objects with their rows, or why it failed.
type View = std::result::Result<BTreeMap<String, Vec<Reading>>, String>;

/// (writer, counter) of a committed object's name, or `None` for any other name.
fn committed_name(name: &str) -> Option<(usize, u64)> {
    let rest = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
    let (w, c) = rest.split_once('-')?;
    (c.len() == 20).then_some(())?;
    Some((w.parse().ok()?, c.parse().ok()?))
}

/// Every object below the prefix except markers (`_uploads/`) must be a committed object
/// and a complete Parquet file (its footer's row count matching the rows read); returns
/// their rows by name.
fn committed(store: &weir_objstore::Store) -> View {
    let mut out = BTreeMap::new();
    for o in store.list("").map_err(|e| e.to_string())? {
        if o.name.starts_with("_uploads/")
            || o.name.starts_with(".weir-owners/")
            || s3::is_server_temporary(&o.name)
        {
            continue;
        }
        if committed_name(&o.name).is_none() {
            return Err(format!("{} is visible but not a committed name", o.name));
        }
        let bytes = store
            .get(&o.name)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{} vanished", o.name))?;
        let read = || -> std::result::Result<Vec<Reading>, String> {
            let builder = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
                .map_err(|e| e.to_string())?;
            let declared = builder.metadata().file_metadata().num_rows() as usize;
            let mut rows = Vec::new();
            for batch in builder.build().map_err(|e| e.to_string())? {
                let batch = batch.map_err(|e| e.to_string())?;
                rows.extend(
                    serde_arrow::from_record_batch::<Vec<Reading>>(&batch)
                        .map_err(|e| e.to_string())?,
                );
            }
            if rows.len() != declared {
                return Err(format!("{} rows, footer says {declared}", rows.len()));
            }
            Ok(rows)
        };
        out.insert(
            o.name.clone(),
            read().map_err(|e| format!("{}: {e}", o.name))?,
        );
    }
    Ok(out)
}

#[test]
fn parquet_on_s3_through_a_failure_commits_every_row_exactly_once() {
    let server = s3::shared();
    let url = s3::url("e2e-parquet-s3");
    let store = weir_objstore::Store::open(&url).unwrap();
    let ck = tempfile::tempdir().unwrap();
    let env = Env::new().parallelism(2).checkpoints(
        CheckpointConfig::new(ck.path().join("ck")).interval(Duration::from_millis(20)),
    );

    let restored_at = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    // What a reader saw below the prefix while the job ran (at the start of every burst and
    // at the failure): each read must succeed, every object complete.
    let seen: Arc<Mutex<Vec<View>>> = Arc::default();

    let r = restored_at.clone();
    let (f, seen_in_job, observer) = (failed.clone(), seen.clone(), store.clone());
    env.source("gated", move |_ctx| Gated {
        next: 0,
        waiting: false,
        snapshots_since_burst: 0,
        restored_at: r.clone(),
    })
    .parallelism(1)
    .uid("source")
    .try_map(move |id: u64| {
        let failing = id == FAIL_AT && !f.swap(true, Ordering::SeqCst);
        if id.is_multiple_of(BURST) || failing {
            seen_in_job.lock().unwrap().push(committed(&observer));
        }
        if failing {
            return Err(Error::user(format!("injected failure at row {id}")));
        }
        Ok(reading(id))
    })
    .uid("readings")
    .write_parquet_exactly_once(&url, ParquetOptions::default().max_rows(MAX_ROWS))
    .uid("sink");

    let result = env.execute("parquet-s3").unwrap();
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

    let objects = committed(&store).unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(seen.len() >= 2, "observed while running: {}", seen.len());
    let mut visible_before_failure = 0;
    for view in seen {
        let view = view.expect("every visible object was complete");
        visible_before_failure = visible_before_failure.max(view.len());
        for (name, rows) in view {
            assert_eq!(
                Some(&rows),
                objects.get(&name),
                "{name} was visible with other content than its final one"
            );
        }
    }
    assert!(
        visible_before_failure > 0,
        "committed output existed while the job ran"
    );

    let mut rows: Vec<Reading> = objects.values().flatten().cloned().collect();
    rows.sort_by_key(|r| r.id);
    assert_eq!(rows.len() as u64, ROWS, "every row once, no duplicate");
    assert_eq!(rows, (0..ROWS).map(reading).collect::<Vec<_>>());
    for (name, rows) in &objects {
        assert!(
            (1..=MAX_ROWS as usize).contains(&rows.len()),
            "{name} has {} rows",
            rows.len()
        );
    }
    assert!(
        objects.len() as u64 > ROWS / MAX_ROWS,
        "rolling by rows closed many objects: {}",
        objects.len()
    );

    assert_eq!(
        store.list("_uploads/").unwrap().len(),
        0,
        "no marker is left"
    );
    let prefix = url.strip_prefix(&format!("s3://{}/", s3::BUCKET)).unwrap();
    let files = server.object_names(s3::BUCKET, prefix);
    assert_eq!(
        files,
        objects.keys().cloned().collect::<Vec<_>>(),
        "the server holds exactly the committed objects below the prefix"
    );
}
