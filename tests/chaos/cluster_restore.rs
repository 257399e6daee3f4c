//! Restoring a cluster's RocksDB state: `file_sum` as a coordinator and two workers, each
//! with its own temporary directory (where its RocksDB instances and its restore directory
//! are). After a restore each worker has brought back only the old instances of its own
//! subtasks (with every byte of their files), not those of the other worker's, and after a
//! rescale from 4 to 3 only those whose key groups overlap its subtasks'; the first
//! checkpoint after the restore stores only what changed since the restored one (also
//! when the workers upload to object storage themselves); and the committed output holds
//! every key's prefix sums exactly once.

use super::cluster::{Cluster, expect_success, read, wait_checkpoint_after, wait_log};
use crate::harness::{Scenario, latest_checkpoint, wait_for};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;
use weir_checkpoint::{CheckpointStorage, Manifest};
use weir_tests::s3;

/// Starts a worker of 2 slots whose temporary directory is `tmp`.
fn worker_in(cl: &mut Cluster<'_>, tmp: &Path) -> (Child, PathBuf) {
    std::fs::create_dir_all(tmp).expect("worker temp dir");
    cl.env = vec![("TMPDIR".into(), tmp.display().to_string())];
    let w = cl.worker(2);
    cl.env.clear();
    w
}

/// Directories `tmp-1` to `tmp-n` in the scenario's directory, one per worker to start.
fn worker_dirs(s: &Scenario, n: usize) -> Vec<PathBuf> {
    (1..=n)
        .map(|i| s._dir.path().join(format!("tmp-{i}")))
        .collect()
}

/// Starts a worker in each of `dirs`, each once the one before has joined.
pub(super) fn join_workers(
    cl: &mut Cluster<'_>,
    coord_log: &Path,
    dirs: &[PathBuf],
) -> Vec<(Child, PathBuf)> {
    let mut workers = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        workers.push(worker_in(cl, dir));
        wait_log(coord_log, &format!("worker {} joined", i + 1), 1);
    }
    workers
}

/// The instances (`op<node>-<subtask>`) whose RocksDB databases a worker runs now.
fn running(tmp: &Path) -> BTreeSet<String> {
    std::fs::read_dir(tmp.join("weir-rocksdb"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("db").is_dir())
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let mut parts = name.splitn(3, '-');
                    Some(format!("{}-{}", parts.next()?, parts.next()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The old instances a worker brought back for its restore (the directories of its one
/// restore directory), with the bytes of their files.
fn restored(tmp: &Path) -> BTreeMap<String, u64> {
    let dirs: Vec<PathBuf> = std::fs::read_dir(tmp)
        .expect("worker temp dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("weir-restore-"))
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "one restore directory in {}", tmp.display());
    std::fs::read_dir(&dirs[0])
        .expect("restore dir")
        .flatten()
        .map(|inst| {
            let bytes = std::fs::read_dir(inst.path())
                .expect("instance dir")
                .flatten()
                .map(|f| f.metadata().expect("file size").len())
                .sum();
            (inst.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect()
}

/// The RocksDB instances of checkpoint `m` (`op<node>-<subtask>`, from each subtask's
/// state file name) with the bytes of their files.
fn instances_of(m: &Manifest) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for st in m.operators.iter().flat_map(|o| &o.subtasks) {
        let Some(state) = st.files.iter().find(|f| f.name.ends_with(".state")) else {
            continue;
        };
        let bytes: u64 = st
            .files
            .iter()
            .filter(|f| !f.name.ends_with(".state"))
            .map(|f| f.size)
            .sum();
        if bytes > 0 {
            out.insert(state.name.trim_end_matches(".state").to_string(), bytes);
        }
    }
    out
}

/// The checkpoint id of the coordinator's (last) "resuming from checkpoint N" line.
fn resumed_from(coord_log: &Path) -> u64 {
    let log = read(coord_log);
    log.lines()
        .rev()
        .find_map(|l| l.split("resuming from checkpoint ").nth(1))
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no resume line in the coordinator's log:\n{log}"))
}

/// The key groups of subtask `s` of `p` (of `max`), as weir assigns them.
fn key_groups(s: usize, max: usize, p: usize) -> std::ops::Range<usize> {
    (s * max).div_ceil(p)..((s + 1) * max).div_ceil(p)
}

/// While the restored attempt runs at parallelism `p`: each worker restored exactly the old
/// instances whose key groups overlap those of the subtasks it runs (its own, without a
/// rescale), with all their bytes, and together they restored every instance. Then the
/// first checkpoint after the restore stores only what changed since. Returns the
/// restored checkpoint's id.
fn check_restore(s: &Scenario, coord_log: &Path, workers: &[&Path], p: usize) -> u64 {
    wait_log(coord_log, "resuming from checkpoint", 1);
    let from = resumed_from(coord_log);
    // The first checkpoint of the restored attempt: the restore is done, its files stay.
    wait_checkpoint_after(s, from);
    let storage = CheckpointStorage::open(&s.checkpoints).expect("checkpoint storage");
    let load = |id: u64| {
        storage
            .load(s.checkpoints.join(format!("chk-{id:020}")))
            .expect("a complete checkpoint")
    };
    let old = load(from);
    let all = instances_of(&old);
    assert_eq!(all.len(), 4, "four RocksDB instances in {all:?}");
    let node = all
        .keys()
        .next()
        .unwrap()
        .split('-')
        .next()
        .unwrap()
        .to_string();
    let subtask = |i: &str| -> usize { i.rsplit('-').next().unwrap().parse().unwrap() };
    let max = old.max_parallelism;
    let mut running_now: Vec<BTreeSet<String>> = Vec::new();
    wait_for(
        "the workers' RocksDB instances",
        Duration::from_secs(60),
        || {
            running_now = workers
                .iter()
                .map(|tmp| {
                    running(tmp)
                        .into_iter()
                        .filter(|i| i.starts_with(&format!("{node}-")))
                        .collect()
                })
                .collect();
            running_now.iter().map(BTreeSet::len).sum::<usize>() == p
        },
    );
    let mut seen = BTreeMap::new();
    // At least one worker needs only part of the state (else nothing would be checked).
    let mut partial = false;
    for (tmp, own) in workers.iter().zip(&running_now) {
        let got = restored(tmp);
        let want: BTreeMap<String, u64> = all
            .iter()
            .filter(|(old, _)| {
                let had = key_groups(subtask(old), max, 4);
                own.iter().any(|i| {
                    let has = key_groups(subtask(i), max, p);
                    had.start < has.end && has.start < had.end
                })
            })
            .map(|(i, b)| (i.clone(), *b))
            .collect();
        partial |= want.len() < all.len();
        assert_eq!(
            got,
            want,
            "{} (running {own:?}) restored other instances than those its subtasks need",
            tmp.display()
        );
        seen.extend(got);
    }
    assert!(
        partial,
        "every worker needs every instance: {running_now:?}"
    );
    assert_eq!(seen, all, "together the workers restored every instance");

    // The first complete checkpoint after the restored one was taken after the restore
    // (any between them had not completed when the coordinator chose it).
    let next = (from + 1..=latest_checkpoint(&s.checkpoints).expect("a checkpoint"))
        .find(|id| {
            s.checkpoints
                .join(format!("chk-{id:020}"))
                .join("_metadata")
                .exists()
        })
        .expect("a checkpoint after the restored one");
    let next = load(next);
    let before: BTreeSet<&str> = old
        .files()
        .filter(|f| f.shared)
        .map(|f| f.name.as_str())
        .collect();
    let kept: u64 = next
        .files()
        .filter(|f| f.shared && before.contains(f.name.as_str()))
        .map(|f| f.size)
        .sum();
    assert!(
        kept > 0,
        "the checkpoint after the restore shares no file with the restored one"
    );
    let new: u64 = next
        .files()
        .filter(|f| !(f.shared && before.contains(f.name.as_str())))
        .map(|f| f.size)
        .sum();
    assert_eq!(
        next.stats.bytes, new,
        "checkpoint {} after restoring {from} stores exactly its new files",
        next.checkpoint_id
    );
    assert_eq!(next.stats.full_bytes, new + kept);
    from
}

#[test]
fn after_a_coordinator_restart_each_worker_restores_only_its_own_instances() {
    let s = Scenario::new(40_000, 2_000, 71);
    let mut cl = Cluster::new(&s);
    cl.workers = 2;
    // About 20 s of input: the restored attempt runs long enough to be looked at.
    cl.max_rate = 2_000;
    let (mut coord, coord_log) = cl.coordinator();
    let tmp = worker_dirs(&s, 2);
    let workers = join_workers(&mut cl, &coord_log, &tmp);
    wait_checkpoint_after(&s, 2);
    coord.kill().expect("SIGKILL the coordinator");
    coord.wait().expect("reap the coordinator");
    for (_, log) in &workers {
        wait_log(log, "reconnecting", 1);
    }
    // A new coordinator knows nothing of the files the old one stored.
    let (mut coord, coord_log) = cl.coordinator();
    let dirs: Vec<&Path> = tmp.iter().map(PathBuf::as_path).collect();
    check_restore(&s, &coord_log, &dirs, 4);
    expect_success(&mut coord, &coord_log, "the restarted coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    s.check();
}

#[test]
fn after_a_worker_is_replaced_each_worker_restores_only_its_own_instances() {
    let s = Scenario::new(40_000, 2_000, 72);
    let mut cl = Cluster::new(&s);
    cl.workers = 2;
    cl.max_rate = 2_000;
    let (mut coord, coord_log) = cl.coordinator();
    let tmp = worker_dirs(&s, 3);
    let mut workers = join_workers(&mut cl, &coord_log, &tmp[..2]);
    wait_checkpoint_after(&s, 2);
    let (mut victim, _) = workers.remove(1);
    victim.kill().expect("SIGKILL a worker");
    victim.wait().expect("reap the worker");
    wait_log(&coord_log, "worker 2 (", 1);
    workers.push(worker_in(&mut cl, &tmp[2]));
    check_restore(&s, &coord_log, &[&tmp[0], &tmp[2]], 4);
    expect_success(&mut coord, &coord_log, "the coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    s.check();
}

#[test]
fn after_a_rescale_from_4_to_3_each_worker_restores_only_the_instances_its_subtasks_overlap() {
    let s = Scenario::new(40_000, 2_000, 73);
    let mut cl = Cluster::new(&s);
    cl.workers = 2;
    cl.max_rate = 2_000;
    let (mut coord, coord_log) = cl.coordinator();
    let tmp = worker_dirs(&s, 4);
    let mut workers = join_workers(&mut cl, &coord_log, &tmp[..2]);
    wait_checkpoint_after(&s, 2);
    // The whole cluster dies; it is started again at parallelism 3 (workers join only the
    // job they were started for, so they are new too).
    for child in std::iter::once(&mut coord).chain(workers.iter_mut().map(|(c, _)| c)) {
        child.kill().expect("SIGKILL a process");
        child.wait().expect("reap it");
    }
    let (mut coord, coord_log) = cl.coordinator_env(&["--parallelism", "3"], &[]);
    let workers = join_workers(&mut cl, &coord_log, &tmp[2..]);
    check_restore(&s, &coord_log, &[&tmp[2], &tmp[3]], 3);
    expect_success(&mut coord, &coord_log, "the restarted coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    s.check();
}

/// The shared files (name, size) and the own bytes of a manifest read as JSON, with its
/// `stats.bytes` and `stats.full_bytes`.
fn files_and_stats(m: &serde_json::Value) -> (Vec<(String, u64, bool)>, u64, u64) {
    let files = m["operators"]
        .as_array()
        .expect("operators")
        .iter()
        .flat_map(|o| o["subtasks"].as_array().expect("subtasks"))
        .flat_map(|st| st["files"].as_array().expect("files"))
        .map(|f| {
            (
                f["name"].as_str().expect("name").to_string(),
                f["size"].as_u64().expect("size"),
                f["shared"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    let stat = |k: &str| m["stats"][k].as_u64().expect("a stats figure");
    (files, stat("bytes"), stat("full_bytes"))
}

/// With checkpoints on object storage the workers upload their files themselves: after a
/// worker is replaced, the first checkpoint uploads only the files written since the
/// restored checkpoint, not the SST files the workers were restored with.
#[test]
fn on_object_storage_the_first_checkpoint_after_a_restore_uploads_only_new_files() {
    use super::object_storage::{complete_on_server, prefix_of};
    let server = s3::shared();
    let mut s = Scenario::new(40_000, 2_000, 74);
    s.checkpoints = PathBuf::from(s3::url("cluster-restore-uploads"));
    let prefix = prefix_of(&s.checkpoints);
    let mut cl = Cluster::new(&s);
    cl.env = server.env();
    cl.workers = 2;
    cl.max_rate = 2_000;
    // A checkpoint a second: retention (3 kept) leaves the restored checkpoint and the next
    // one on the server for seconds, long enough to read them.
    let (mut coord, coord_log) = cl.coordinator_env(&["--checkpoint-interval-ms", "1000"], &[]);
    let mut workers = Vec::new();
    for i in 1..=2 {
        workers.push(cl.worker(2));
        wait_log(&coord_log, &format!("worker {i} joined"), 1);
    }
    wait_for(
        "two checkpoints on the server",
        Duration::from_secs(60),
        || complete_on_server(server, &prefix).len() >= 2,
    );
    let (mut victim, _) = workers.remove(1);
    victim.kill().expect("SIGKILL a worker");
    victim.wait().expect("reap the worker");
    wait_log(&coord_log, "worker 2 (", 1);
    workers.push(cl.worker(2));
    wait_log(&coord_log, "resuming from checkpoint", 1);
    let from = resumed_from(&coord_log);
    let manifest = |id: u64| -> Option<serde_json::Value> {
        let suffix = format!("chk-{id:020}/_metadata");
        let path = server
            .files(s3::BUCKET, &prefix)
            .into_iter()
            .find(|f| f.ends_with(&suffix))?;
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
    };
    let old = manifest(from).expect("the restored checkpoint on the server");
    let mut next = None;
    wait_for(
        "a checkpoint after the restore",
        Duration::from_secs(60),
        || {
            next = complete_on_server(server, &prefix)
                .into_iter()
                .find(|&id| id > from)
                .and_then(manifest);
            next.is_some()
        },
    );
    let (old_files, _, _) = files_and_stats(&old);
    let (files, bytes, full) = files_and_stats(&next.expect("checked"));
    let before: BTreeSet<&str> = old_files
        .iter()
        .filter(|(_, _, shared)| *shared)
        .map(|(n, _, _)| n.as_str())
        .collect();
    let (kept, new): (Vec<_>, Vec<_>) = files
        .iter()
        .partition(|(n, _, shared)| *shared && before.contains(n.as_str()));
    let size = |v: &[&(String, u64, bool)]| v.iter().map(|(_, s, _)| s).sum::<u64>();
    assert!(
        size(&kept) > 0,
        "the checkpoint after the restore shares no file with the restored one"
    );
    assert_eq!(
        bytes,
        size(&new),
        "the first checkpoint after restoring {from} uploads exactly its new files"
    );
    assert_eq!(full, size(&new) + size(&kept));
    expect_success(&mut coord, &coord_log, "the coordinator");
    for (mut w, log) in workers {
        expect_success(&mut w, &log, "a worker");
    }
    s.check();
}
