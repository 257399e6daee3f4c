//! Checkpoint storage on object storage, against the in-process `memory://` store (the
//! workspace's tests run the same against a real S3-compatible server).

use super::tests::{manifest, write};
use super::*;
use crate::FileProblem;
use weir_objstore::Store;

fn remote(name: &str) -> (Store, CheckpointStorage) {
    let url = format!("memory://{name}/jobs/ck");
    (
        Store::open(&url).unwrap(),
        CheckpointStorage::open(&url).unwrap(),
    )
}

fn names(store: &Store) -> Vec<String> {
    store
        .list("")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect()
}

#[test]
fn a_checkpoint_is_complete_once_its_manifest_is_written_and_reads_back() {
    let (store, s) = remote("complete");
    assert!(s.is_remote());
    assert_eq!(s.dir(), Path::new("memory://complete/jobs/ck"));
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let own = w.write_file("op-0.state", b"sums").unwrap();
    let shared = w.write_shared("inst-1.sst", b"table").unwrap();
    // Before the manifest: listed as incomplete, never restored.
    let listed = s.list().unwrap();
    assert_eq!((listed.len(), listed[0].complete), (1, false));
    assert!(s.latest_complete().unwrap().checkpoint.is_none());
    let path = w
        .finish(manifest(
            1,
            CheckpointKind::Checkpoint,
            vec![own.clone(), shared.clone()],
        ))
        .unwrap();
    assert_eq!(
        path,
        Path::new("memory://complete/jobs/ck/chk-00000000000000000001")
    );
    let latest = s.latest_complete().unwrap().checkpoint.unwrap();
    assert_eq!(latest.path, path);
    let token = latest.manifest.objects.clone().expect("the writer's token");
    let mut expected = vec![
        format!("chk-00000000000000000001/{token}/op-0.state"),
        "chk-00000000000000000001/_metadata".to_string(),
        "shared/inst-1.sst".to_string(),
    ];
    expected.sort();
    assert_eq!(names(&store), expected);
    assert_eq!(s.read_file(&path, &own).unwrap(), b"sums");
    assert_eq!(
        s.read_file(path.join("_metadata"), &shared).unwrap(),
        b"table"
    );
    // Another process (a fresh storage on the same URL) reads it too.
    let other = CheckpointStorage::open("memory://complete/jobs/ck").unwrap();
    assert_eq!(other.load(&path).unwrap(), latest.manifest);
    assert_eq!(other.next_id().unwrap(), CheckpointId(2));
}

#[test]
fn two_writers_of_one_checkpoint_never_mix_their_files() {
    let (_store, a) = remote("two-writers");
    let b = CheckpointStorage::open("memory://two-writers/jobs/ck").unwrap();
    let wa = a
        .begin(CheckpointId(5), CheckpointKind::Checkpoint)
        .unwrap();
    let wb = b
        .begin(CheckpointId(5), CheckpointKind::Checkpoint)
        .unwrap();
    let fa = wa.write_file("op-0.state", b"written by a").unwrap();
    let fb = wb.write_file("op-0.state", b"b's bytes").unwrap();
    wa.finish(manifest(5, CheckpointKind::Checkpoint, vec![fa]))
        .unwrap();
    // b's manifest lands last: the checkpoint is b's, whole.
    let path = wb
        .finish(manifest(5, CheckpointKind::Checkpoint, vec![fb.clone()]))
        .unwrap();
    let fresh = CheckpointStorage::open("memory://two-writers/jobs/ck").unwrap();
    let m = fresh.load(&path).unwrap();
    let entry = &m.operators[0].subtasks[0].files[0];
    assert_eq!(entry, &fb);
    assert_eq!(fresh.read_file(&path, entry).unwrap(), b"b's bytes");
    // Completing it again is refused.
    let e = a
        .begin(CheckpointId(5), CheckpointKind::Checkpoint)
        .unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
}

#[test]
fn a_missing_or_truncated_object_skips_the_checkpoint_for_an_older_one() {
    let (store, s) = remote("corrupt");
    write(&s, 1, &["a.sst"]);
    let newest = write(&s, 2, &["a.sst", "b.sst"]);
    store.put("shared/b.sst", b"b".to_vec()).unwrap();
    let latest = s.latest_complete().unwrap();
    assert_eq!(
        latest.checkpoint.unwrap().manifest.checkpoint_id,
        CheckpointId(1)
    );
    assert_eq!(latest.skipped.len(), 1);
    assert_eq!(latest.skipped[0].path, newest);
    let Error::Corrupt { file, problem, .. } = &latest.skipped[0].error else {
        panic!("{}", latest.skipped[0].error)
    };
    assert_eq!(file, Path::new("memory://corrupt/jobs/ck/shared/b.sst"));
    assert_eq!(
        problem,
        &FileProblem::Size {
            expected: 5,
            actual: 1
        }
    );
    store.delete("shared/a.sst").unwrap();
    let latest = s.latest_complete().unwrap();
    assert!(latest.checkpoint.is_none());
    assert_eq!(latest.skipped.len(), 2);
    assert!(
        latest
            .skipped
            .iter()
            .all(|c| c.error.is_unusable_checkpoint())
    );
    // A damaged object of the right size is caught when it is read.
    let (store, s) = remote("corrupt-crc");
    let path = write(&s, 1, &["c.sst"]);
    store.put("shared/c.sst", b"C.SST".to_vec()).unwrap();
    let m = s.load(&path).unwrap();
    let entry = m.files().find(|f| f.shared).unwrap();
    let e = s.read_file(&path, entry).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Corrupt {
                problem: FileProblem::Checksum { .. },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn retention_keeps_the_newest_and_their_shared_objects_and_never_savepoints() {
    let (store, s) = remote("retain");
    write(&s, 1, &["old.sst", "kept.sst"]);
    write(&s, 2, &["kept.sst"]);
    let sp = s.savepoint(CheckpointId(3), "before-upgrade").unwrap();
    let f = sp.write_shared("kept.sst", b"kept.sst").unwrap();
    assert!(!f.shared, "a savepoint keeps its own copy");
    sp.finish(manifest(3, CheckpointKind::Savepoint, vec![f]))
        .unwrap();
    write(&s, 4, &["kept.sst", "new.sst"]);
    // An abandoned attempt older than the newest complete checkpoint.
    store
        .put("chk-00000000000000000000/x/own", vec![1])
        .unwrap();
    let report = s.retain(2).unwrap();
    assert_eq!(report.deleted_shared, ["old.sst"]);
    let ids: Vec<(u64, bool)> = s
        .list()
        .unwrap()
        .iter()
        .map(|c| (c.id.0, c.complete))
        .collect();
    assert_eq!(ids, [(2, true), (3, true), (4, true)]);
    let left: Vec<String> = names(&store)
        .into_iter()
        .filter(|n| n.starts_with("shared/"))
        .collect();
    assert_eq!(left, ["shared/kept.sst", "shared/new.sst"]);
    let sp_path = s.list().unwrap()[1].path.clone();
    assert!(s.load(&sp_path).is_ok());
}

#[test]
fn shared_objects_are_uploaded_once_and_reused_by_name() {
    let (store, s) = remote("reuse");
    let tmp = tempfile::tempdir().unwrap();
    let sst = tmp.path().join("000009.sst");
    std::fs::write(&sst, b"immutable table").unwrap();
    let before = weir_objstore::stats().bytes_written;
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let e1 = w.link_shared("i-000009.sst", &sst).unwrap();
    w.finish(manifest(1, CheckpointKind::Checkpoint, vec![e1.clone()]))
        .unwrap();
    let w = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    let e2 = w
        .reuse_shared("i-000009.sst")
        .unwrap()
        .expect("stored by checkpoint 1");
    assert_eq!(e1, e2);
    let p2 = w
        .finish(manifest(2, CheckpointKind::Checkpoint, vec![e2.clone()]))
        .unwrap();
    assert_eq!(s.read_file(&p2, &e2).unwrap(), b"immutable table");
    // Deleted by someone else: not reused, stored again.
    store.delete("shared/i-000009.sst").unwrap();
    let w = s
        .begin(CheckpointId(3), CheckpointKind::Checkpoint)
        .unwrap();
    assert_eq!(w.reuse_shared("i-000009.sst").unwrap(), None);
    assert_eq!(w.link_shared("i-000009.sst", &sst).unwrap(), e1);
    assert!(store.head("shared/i-000009.sst").unwrap().is_some());
    assert!(weir_objstore::stats().bytes_written >= before + 2 * 15);
}

#[test]
fn discard_stop_record_and_savepoints_by_url() {
    let (store, s) = remote("discard");
    let w = s
        .begin(CheckpointId(7), CheckpointKind::Checkpoint)
        .unwrap();
    w.write_file("own", b"x").unwrap();
    drop(w);
    assert!(s.discard(CheckpointId(7)).unwrap());
    assert!(names(&store).is_empty());
    assert_eq!(s.next_id().unwrap(), CheckpointId(1));
    assert_eq!(s.stop_record().unwrap(), None);
    let w = s.savepoint(CheckpointId(8), "stop").unwrap();
    let f = w.write_file("own", b"y").unwrap();
    let sp = w
        .finish(manifest(8, CheckpointKind::Savepoint, vec![f]))
        .unwrap();
    s.record_stop(CheckpointId(8), &sp).unwrap();
    let r = s.stop_record().unwrap().unwrap();
    assert_eq!(
        (r.checkpoint_id, r.path.clone()),
        (CheckpointId(8), sp.clone())
    );
    let e = s.savepoint(CheckpointId(8), "stop").unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    // A local storage restores a savepoint by its URL (restore elsewhere).
    let tmp = tempfile::tempdir().unwrap();
    let local = CheckpointStorage::open(tmp.path()).unwrap();
    let m = local.load(&sp).unwrap();
    assert_eq!(
        local
            .read_file(&sp, &m.operators[0].subtasks[0].files[0])
            .unwrap(),
        b"y"
    );
    assert!(matches!(
        local
            .load("memory://discard/jobs/ck/sp-9-none")
            .unwrap_err(),
        Error::NotComplete { .. }
    ));
}

#[test]
fn file_urls_are_local_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}", tmp.path().join("ck").display());
    let s = CheckpointStorage::open(&url).unwrap();
    assert!(!s.is_remote());
    assert!(tmp.path().join("ck/shared").is_dir());
}

/// A worker of a cluster: its own storage handle on the URL (another process), writing one
/// task's files of checkpoint `id` — a state file and the given shared files — and
/// returning their entries, as it acknowledges.
fn worker_files(url: &str, id: u64, task: &str, shared: &[&str]) -> Vec<FileEntry> {
    let worker = CheckpointStorage::open(url).unwrap();
    let w = worker.task_files(CheckpointId(id)).unwrap();
    let mut files = vec![
        w.write_file(
            &format!("{task}.state"),
            format!("{task} at {id}").as_bytes(),
        )
        .unwrap(),
    ];
    for name in shared {
        files.push(w.write_shared(name, name.as_bytes()).unwrap());
    }
    files
}

/// The coordinator: adopts the workers' entries and writes only the manifest.
fn coordinator_finish(
    s: &CheckpointStorage,
    id: u64,
    kind: CheckpointKind,
    refs: &[FileEntry],
) -> Result<PathBuf> {
    let w = s.begin(CheckpointId(id), kind)?;
    let files = refs
        .iter()
        .map(|f| w.adopt(f))
        .collect::<Result<Vec<_>>>()?;
    w.finish(manifest(id, kind, files))
}

#[test]
fn workers_store_their_task_files_and_the_coordinator_writes_only_the_manifest() {
    let url = "memory://workers/jobs/ck";
    let (store, s) = remote("workers");
    let mut refs = worker_files(url, 1, "op1-0", &["inst-a-1.sst"]);
    refs.extend(worker_files(url, 1, "op1-1", &["inst-b-1.sst"]));
    let tokens: std::collections::BTreeSet<String> =
        refs.iter().filter_map(|f| f.objects.clone()).collect();
    assert_eq!(
        tokens.len(),
        2,
        "each worker stores under its own token: {refs:?}"
    );
    assert!(
        refs.iter()
            .filter(|f| f.shared)
            .all(|f| f.objects.is_none())
    );
    let path = coordinator_finish(&s, 1, CheckpointKind::Checkpoint, &refs).unwrap();
    // Another process restores it: every file verifies and reads back.
    let other = CheckpointStorage::open(url).unwrap();
    let latest = other.latest_complete().unwrap().checkpoint.unwrap();
    assert_eq!(latest.path, path);
    let m = &latest.manifest;
    let coordinator_token = m.objects.clone().unwrap();
    assert!(!tokens.contains(&coordinator_token));
    assert_eq!(other.read_file(&path, &refs[0]).unwrap(), b"op1-0 at 1");
    assert_eq!(other.read_file(&path, &refs[2]).unwrap(), b"op1-1 at 1");
    assert_eq!(other.read_file(&path, &refs[3]).unwrap(), b"inst-b-1.sst");
    // The coordinator stored nothing of its own: only the manifest.
    let names = names(&store);
    assert!(
        !names
            .iter()
            .any(|n| n.contains(&format!("/{coordinator_token}/"))),
        "{names:?}"
    );
    assert!(names.contains(&"chk-00000000000000000001/_metadata".to_string()));
    // The next checkpoint reuses the shared files by name; old manifests stay readable.
    let refs2 = worker_files(url, 2, "op1-0", &["inst-a-1.sst"]);
    coordinator_finish(&s, 2, CheckpointKind::Checkpoint, &refs2).unwrap();
    other.load(&path).unwrap();
    // Without workers' entries the manifest's JSON has no `objects` per file.
    let single = write(&s, 3, &["x"]);
    let json = String::from_utf8(
        store
            .get(&format!(
                "{}/_metadata",
                single.file_name().unwrap().to_str().unwrap()
            ))
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(json.matches("\"objects\"").count(), 1, "{json}");
}

#[test]
fn a_missing_or_wrong_referenced_object_is_refused_at_finish() {
    let url = "memory://missing-ref/jobs/ck";
    let (store, s) = remote("missing-ref");
    let refs = worker_files(url, 1, "op1-0", &["inst-a-1.sst"]);
    // The worker's state object is lost (or never written: a worker that died mid-write).
    let token = refs[0].objects.clone().unwrap();
    let object = format!("chk-00000000000000000001/{token}/op1-0.state");
    store.delete(&object).unwrap();
    let e = coordinator_finish(&s, 1, CheckpointKind::Checkpoint, &refs).unwrap_err();
    match &e {
        Error::Corrupt {
            file,
            problem: FileProblem::Missing,
            ..
        } => assert_eq!(file, Path::new(&format!("{url}/{object}"))),
        other => panic!("expected a missing file, got {other:?}"),
    }
    assert!(e.to_string().contains(&object), "{e}");
    // A reference with the wrong size, too.
    let refs = worker_files(url, 2, "op1-0", &[]);
    let wrong = FileEntry {
        size: refs[0].size + 1,
        ..refs[0].clone()
    };
    let e = coordinator_finish(&s, 2, CheckpointKind::Checkpoint, &[wrong]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Corrupt {
                problem: FileProblem::Size { .. },
                ..
            }
        ),
        "{e}"
    );
    // An own file that names no writer is refused when adopted.
    let anonymous = FileEntry {
        objects: None,
        ..refs[0].clone()
    };
    let e = coordinator_finish(&s, 2, CheckpointKind::Checkpoint, &[anonymous]).unwrap_err();
    assert!(e.to_string().contains("names no writer"), "{e}");
    assert!(
        s.latest_complete().unwrap().checkpoint.is_none(),
        "nothing was published"
    );
    // A task-files writer never finishes a checkpoint, and needs object storage.
    let w = s.task_files(CheckpointId(3)).unwrap();
    let e = w
        .finish(manifest(3, CheckpointKind::Checkpoint, vec![]))
        .unwrap_err();
    assert!(e.to_string().contains("does not finish"), "{e}");
    let (_tmp, local) = super::tests::storage();
    assert!(matches!(
        local.task_files(CheckpointId(1)),
        Err(Error::InvalidConfig(_))
    ));
}

#[test]
fn retention_leaves_shared_objects_alone_while_a_worker_writes_a_newer_checkpoint() {
    let url = "memory://retain-worker/jobs/ck";
    let (store, s) = remote("retain-worker");
    let refs = worker_files(url, 1, "op1-0", &["inst-old.sst"]);
    coordinator_finish(&s, 1, CheckpointKind::Checkpoint, &refs).unwrap();
    let refs = worker_files(url, 2, "op1-0", &[]);
    coordinator_finish(&s, 2, CheckpointKind::Checkpoint, &refs).unwrap();
    // A worker (another process: nothing in the coordinator's registry) writes checkpoint 3,
    // a shared file first, before any file of its own.
    let worker = CheckpointStorage::open(url).unwrap();
    let w = worker.task_files(CheckpointId(3)).unwrap();
    let new = w.write_shared("inst-new.sst", b"new table").unwrap();
    let marker: Vec<String> = names(&store)
        .into_iter()
        .filter(|n| n.starts_with("chk-00000000000000000003/"))
        .collect();
    assert_eq!(
        marker.len(),
        1,
        "the checkpoint is visible first: {marker:?}"
    );
    assert!(marker[0].ends_with("/_in_flight"), "{marker:?}");
    // Retention after checkpoint 2 (keeping 1) sees checkpoint 3 in flight.
    let report = s.retain(1).unwrap();
    assert!(
        report
            .shared_skipped
            .as_deref()
            .is_some_and(|r| r.contains("chk-00000000000000000003")),
        "{report:?}"
    );
    assert!(names(&store).contains(&"shared/inst-new.sst".to_string()));
    assert!(names(&store).contains(&"shared/inst-old.sst".to_string()));
    // The worker goes on: its own file, then the coordinator completes checkpoint 3.
    let own = w.write_file("op1-0.state", b"state").unwrap();
    coordinator_finish(&s, 3, CheckpointKind::Checkpoint, &[own, new]).unwrap();
    // Now retention cleans: the file only checkpoint 1 used goes, the new one stays.
    let report = s.retain(1).unwrap();
    assert_eq!(report.deleted_shared, ["inst-old.sst"]);
    assert_eq!(report.shared_skipped, None);
    s.load(s.latest_complete().unwrap().checkpoint.unwrap().path)
        .unwrap();
    // An aborted checkpoint's worker objects are discarded with it.
    worker_files(url, 4, "op1-0", &["inst-aborted.sst"]);
    assert!(s.discard(CheckpointId(4)).unwrap());
    assert!(
        !names(&store)
            .iter()
            .any(|n| n.starts_with("chk-00000000000000000004/"))
    );
    worker_files(url, 5, "op1-0", &[]);
    let refs = worker_files(url, 6, "op1-0", &[]);
    coordinator_finish(&s, 6, CheckpointKind::Checkpoint, &refs).unwrap();
    let report = s.retain(1).unwrap();
    assert!(
        report
            .deleted
            .iter()
            .any(|p| p.ends_with("chk-00000000000000000005")),
        "{report:?}"
    );
    assert!(
        report
            .deleted_shared
            .contains(&"inst-aborted.sst".to_string()),
        "{report:?}"
    );
}

#[test]
fn a_savepoint_from_workers_files_is_self_contained() {
    let url = "memory://sp-workers/jobs/ck";
    let (store, s) = remote("sp-workers");
    let refs = worker_files(url, 7, "op1-0", &["inst-a-1.sst"]);
    let path = coordinator_finish(&s, 7, CheckpointKind::Savepoint, &refs).unwrap();
    // The workers' objects for id 7 go once the savepoint is written.
    assert!(s.discard(CheckpointId(7)).unwrap());
    store.delete("shared/inst-a-1.sst").unwrap();
    let m = s.load(&path).unwrap();
    assert!(m.files().all(|f| !f.shared && f.objects.is_none()), "{m:?}");
    let files: Vec<FileEntry> = m.files().cloned().collect();
    assert_eq!(s.read_file(&path, &files[0]).unwrap(), b"op1-0 at 7");
    assert_eq!(s.read_file(&path, &files[1]).unwrap(), b"inst-a-1.sst");
    let sp = path.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        names(&store)
            .iter()
            .all(|n| n.starts_with(&format!("{sp}/"))),
        "{:?}",
        names(&store)
    );
}
