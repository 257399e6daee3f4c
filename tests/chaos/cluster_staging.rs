//! The cluster coordinator's staging area (the checkpoint files workers send with their
//! acknowledgements), watched from outside while a real cluster of `file_sum` processes
//! runs on RocksDB state:
//!
//! - over some 70 checkpoints it only ever holds files of the checkpoints around the
//!   latest complete one (the one before it, in case the coordinator has not moved on
//!   yet, and the one in flight): nothing that retention has long deleted, so it does not
//!   grow with the run time;
//! - when staging a worker's files fails, exactly that checkpoint fails, the worker sends
//!   the files again, the next checkpoint completes, the job never restarts, and the
//!   output is exact.
//!
//! The coordinator runs with its own temporary directory (`TMPDIR`), where it keeps the
//! staging area as `weir-coordinator-<pid>-<nanos>/<file name in storage>/<file>`.

use crate::cluster::{Cluster, Processes, expect_success, read, start_workers};
use crate::harness::Scenario;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What the watcher saw.
#[derive(Default)]
struct Seen {
    /// Every complete checkpoint and the file names its manifest mentions.
    checkpoints: BTreeMap<u64, BTreeSet<String>>,
    /// Staging samples: the newest complete checkpoint before and after listing the
    /// staging area, and what it held.
    samples: Vec<(u64, u64, BTreeSet<String>)>,
}

/// Records complete checkpoints of `ck` not seen yet; returns the newest.
fn record_checkpoints(ck: &Path, seen: &mut Seen) -> u64 {
    if let Ok(rd) = std::fs::read_dir(ck) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok()) else {
                continue;
            };
            if seen.checkpoints.contains_key(&id) {
                continue;
            }
            // Every string after `"name":` (file names, and operator names, harmlessly).
            if let Ok(text) = std::fs::read_to_string(e.path().join("_metadata")) {
                let names = text
                    .split("\"name\":")
                    .skip(1)
                    .filter_map(|rest| rest.split('"').nth(1))
                    .map(str::to_string)
                    .collect();
                seen.checkpoints.insert(id, names);
            }
        }
    }
    seen.checkpoints.keys().next_back().copied().unwrap_or(0)
}

/// The names staged under the coordinator's staging area in `tmp` (none when it has none).
fn staged(tmp: &Path) -> Option<BTreeSet<String>> {
    let root = std::fs::read_dir(tmp)
        .ok()?
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("weir-coordinator-")
        })?
        .path();
    let names = std::fs::read_dir(root)
        .ok()?
        .flatten()
        .filter(|d| {
            // A name whose file is in place (not one being written or removed).
            std::fs::read_dir(d.path()).is_ok_and(|mut f| {
                f.any(|f| f.is_ok_and(|f| !f.file_name().to_string_lossy().starts_with('.')))
            })
        })
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    Some(names)
}

/// Watches `ck` and the staging area in `tmp` every few milliseconds until `stop`.
fn watch(ck: PathBuf, tmp: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut seen = Seen::default();
        while !stop.load(Ordering::SeqCst) {
            let before = record_checkpoints(&ck, &mut seen);
            if let Some(names) = staged(&tmp) {
                let after = record_checkpoints(&ck, &mut seen);
                seen.samples.push((before, after, names));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        record_checkpoints(&ck, &mut seen);
        seen
    })
}

/// Runs the cluster job to the end with the coordinator's `TMPDIR` in the scenario and
/// `failpoints` set on it; returns the watcher's findings, the coordinator's log and `TMPDIR`.
fn run(s: &Scenario, failpoints: Option<&str>) -> (Seen, String, PathBuf) {
    let tmp = s.output.with_file_name("coordinator-tmp");
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let mut cl = Cluster::new(s);
    let mut env = vec![("TMPDIR", tmp.as_os_str())];
    if let Some(f) = failpoints {
        env.push(("WEIR_FAILPOINTS", std::ffi::OsStr::new(f)));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(s.checkpoints.clone(), tmp.clone(), stop.clone());
    let mut procs = Processes(vec![cl.coordinator_env(&[], &env)]);
    let coord_log = procs.0[0].1.clone();
    procs.0.extend(start_workers(&mut cl, &coord_log));
    for (i, (child, log)) in procs.0.iter_mut().enumerate() {
        let what = if i == 0 {
            "the coordinator"
        } else {
            "a worker"
        };
        expect_success(child, log, what);
    }
    stop.store(true, Ordering::SeqCst);
    let seen = watcher.join().expect("the watcher");
    (seen, read(&coord_log), tmp)
}

#[test]
fn the_staging_area_holds_only_the_checkpoints_around_the_latest_complete_one() {
    // Long enough for dozens of checkpoints; on a loaded machine fewer complete in the same
    // time, and 20 still show whether staged files pile up.
    let s = Scenario::new(60_000, 40, 61);
    let (seen, log, tmp) = run(&s, None);
    s.check();
    assert!(!log.contains("restarting"), "{log}");
    let last = *seen.checkpoints.keys().next_back().expect("checkpoints");
    assert!(
        last >= 20,
        "only {last} checkpoints: the test saw too little"
    );
    let ids: Vec<u64> = seen.checkpoints.keys().copied().collect();
    assert_eq!(
        ids,
        (1..=last).collect::<Vec<_>>(),
        "the watcher missed a complete checkpoint (or one failed)"
    );
    let mut checked = 0;
    let mut most = 0;
    for (before, after, names) in &seen.samples {
        // The coordinator may not have moved on from the checkpoint before `before` yet,
        // and one checkpoint may be in flight after `after`.
        let around = before.saturating_sub(1)..=after + 1;
        let allowed: BTreeSet<&String> = seen
            .checkpoints
            .range(around.clone())
            .flat_map(|(_, n)| n)
            .collect();
        let stray: Vec<&String> = names.iter().filter(|n| !allowed.contains(n)).collect();
        assert!(
            stray.is_empty(),
            "with checkpoints {around:?} around, the staging area held files of none of them: {stray:?}"
        );
        checked += 1;
        most = most.max(names.len());
    }
    assert!(checked >= 30, "only {checked} samples of the staging area");
    assert!(most > 0, "the staging area never held a file");
    eprintln!("{checked} samples over {last} checkpoints; at most {most} files staged at once");
    assert_eq!(
        staged(&tmp),
        None,
        "the coordinator removes its staging area when the job ends"
    );
}

#[test]
fn a_staging_failure_fails_that_checkpoint_only_and_the_files_are_sent_again() {
    let s = Scenario::new(40_000, 40, 62);
    let (seen, log, _) = run(&s, Some("cluster.stage=error"));
    s.check();
    assert!(log.contains("fail point 'cluster.stage': error"), "{log}");
    // The coordinator's line for the failure (the abort of that checkpoint quotes it too).
    let failures: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("the worker sends the files again"))
        .filter_map(|l| l.split("staging the checkpoint ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap().parse().expect("an id"))
        .collect();
    assert_eq!(failures.len(), 1, "one staging failure:\n{log}");
    let failed = failures[0];
    assert!(
        log.contains(&format!(
            "checkpoint {failed} fails, and the worker sends the files again with the next one"
        )),
        "{log}"
    );
    assert!(
        !log.contains("restarting"),
        "the job must not restart:\n{log}"
    );
    let last = *seen.checkpoints.keys().next_back().expect("checkpoints");
    let ids: BTreeSet<u64> = seen.checkpoints.keys().copied().collect();
    let want: BTreeSet<u64> = (1..=last).filter(|c| *c != failed).collect();
    assert_eq!(
        ids, want,
        "every checkpoint but {failed} completes (the next one too)"
    );
    assert!(last > failed + 1, "the job went on checkpointing");
}
