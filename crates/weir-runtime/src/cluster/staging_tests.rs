//! Unit tests of the staging area, with real files in a temporary directory.

use super::*;
use weir_core::checkpoint::LocalFile;

const T: Task = (2, 0);

/// An acknowledgement's snapshot and the file contents it carries.
type Ack = (BTreeMap<String, OperatorSnapshot>, Vec<(String, Vec<u8>)>);

/// One acknowledgement: the snapshot of one operator referring to `names` (files ending in
/// `.sst` are immutable and shared), and the contents sent for `sent`.
fn ack(names: &[&str], sent: &[&str]) -> Ack {
    let files = names
        .iter()
        .map(|n| LocalFile {
            path: PathBuf::from(format!("/worker/db/chk/{}", n.rsplit('-').next().unwrap())),
            name: n.to_string(),
            shared: n.ends_with(".sst"),
        })
        .collect();
    let snap = OperatorSnapshot {
        files,
        ..OperatorSnapshot::default()
    };
    let data = sent
        .iter()
        .map(|n| (n.to_string(), format!("contents of {n}").into_bytes()))
        .collect();
    (BTreeMap::from([("op".to_string(), snap)]), data)
}

/// Names of the files on disk under the staging root (`<name>/<file>`), sorted.
fn on_disk(root: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for d in std::fs::read_dir(root).unwrap().flatten() {
        let files: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().collect();
        assert_eq!(
            files.len(),
            1,
            "one file per name in {}",
            d.path().display()
        );
        names.push(d.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    names
}

fn area() -> (tempfile::TempDir, Staging) {
    let dir = tempfile::tempdir().unwrap();
    let s = Staging::new(dir.path().join("staging"), "staging-test").unwrap();
    s.begin_attempt(1);
    (dir, s)
}

#[test]
fn a_staged_snapshot_points_at_its_files_under_their_own_names() {
    let (_d, s) = area();
    let (mut snap, files) = ack(
        &["i-1-MANIFEST", "i-000007.sst"],
        &["i-1-MANIFEST", "i-000007.sst"],
    );
    s.stage(1, T, 1, &mut snap, files).unwrap();
    let paths: Vec<PathBuf> = snap["op"].files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        paths,
        vec![
            s.root.join("i-1-MANIFEST/MANIFEST"),
            s.root.join("i-000007.sst/000007.sst")
        ]
    );
    assert_eq!(
        std::fs::read(&paths[1]).unwrap(),
        b"contents of i-000007.sst"
    );
    assert_eq!(s.usage(), (2, 48));
}

/// A RocksDB-like life over 200 checkpoints: each adds an immutable file and per-checkpoint
/// files, and compaction drops the oldest immutable file once there are 3. The area holds
/// exactly the latest completed checkpoint's files and the in-flight one's.
#[test]
fn the_area_holds_the_latest_completed_checkpoint_and_the_ones_in_flight_only() {
    let (_d, s) = area();
    let mut live: Vec<String> = Vec::new();
    let mut basis: Vec<String> = Vec::new();
    for c in 1..=200u64 {
        live.push(format!("i-{c:06}.sst"));
        if live.len() > 3 {
            live.remove(0);
        }
        let mut names: Vec<String> = live.clone();
        names.push(format!("i-{c}-MANIFEST"));
        names.push(format!("i-{c}-OPTIONS"));
        // The worker leaves out the immutable files of its basis.
        let sent: Vec<&str> = names
            .iter()
            .filter(|n| !basis.contains(n))
            .map(String::as_str)
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (mut snap, files) = ack(&refs, &sent);
        s.stage(1, T, c, &mut snap, files).unwrap();
        // In flight: the previous checkpoint's files (the basis) and this one's.
        let mut want: BTreeSet<String> = basis.iter().cloned().collect();
        want.extend(names.iter().cloned());
        assert_eq!(
            on_disk(&s.root),
            want.iter().cloned().collect::<Vec<_>>(),
            "checkpoint {c} in flight"
        );
        if c % 10 == 0 {
            s.aborted(c);
        } else {
            s.completed(c);
            basis = names;
        }
        let want: Vec<String> = basis
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(on_disk(&s.root), want, "after checkpoint {c}");
        assert_eq!(s.usage().0, want.len());
    }
}

#[test]
fn a_failed_staging_leaves_nothing_and_the_files_sent_again_are_staged() {
    let (_d, s) = area();
    let (mut snap, files) = ack(&["i-1.sst"], &["i-1.sst"]);
    s.stage(1, T, 1, &mut snap, files).unwrap();
    s.completed(1);
    // Checkpoint 2 brings two new files; the second cannot be written (a directory is in
    // the way), so the first, written already, is removed again.
    std::fs::create_dir_all(s.root.join("i-3.sst/3.sst/in-the-way")).unwrap();
    let (mut snap, files) = ack(&["i-1.sst", "i-2.sst", "i-3.sst"], &["i-2.sst", "i-3.sst"]);
    let e = s.stage(1, T, 2, &mut snap, files).unwrap_err().to_string();
    assert!(e.contains("i-3.sst"), "{e}");
    std::fs::remove_dir_all(s.root.join("i-3.sst")).unwrap();
    assert_eq!(on_disk(&s.root), vec!["i-1.sst"]);
    s.aborted(2);
    // The worker's basis is still checkpoint 1: it sends both again, and they stage.
    let (mut snap, files) = ack(&["i-1.sst", "i-2.sst", "i-3.sst"], &["i-2.sst", "i-3.sst"]);
    s.stage(1, T, 3, &mut snap, files).unwrap();
    s.completed(3);
    assert_eq!(on_disk(&s.root), vec!["i-1.sst", "i-2.sst", "i-3.sst"]);
}

#[test]
fn a_file_left_out_that_is_not_staged_fails_the_acknowledgement() {
    let (_d, s) = area();
    let (mut snap, files) = ack(&["i-1-MANIFEST", "i-9.sst"], &["i-1-MANIFEST"]);
    let e = s.stage(1, T, 1, &mut snap, files).unwrap_err().to_string();
    assert_eq!(
        e,
        "invalid configuration: the worker left out checkpoint file i-9.sst, which the coordinator does not hold"
    );
    assert!(
        on_disk(&s.root).is_empty(),
        "the file it did send is gone too"
    );
    assert_eq!(s.usage(), (0, 0));
}

#[test]
fn a_file_sent_again_while_staged_is_kept_as_it_is() {
    let (_d, s) = area();
    let (mut snap, files) = ack(&["i-1.sst"], &["i-1.sst"]);
    s.stage(1, T, 1, &mut snap, files).unwrap();
    let path = snap["op"].files[0].path.clone();
    // Checkpoint 2 is triggered before the worker learns that 1 completed.
    let (mut snap, files) = ack(&["i-1.sst"], &["i-1.sst"]);
    s.stage(1, T, 2, &mut snap, files).unwrap();
    assert_eq!(snap["op"].files[0].path, path);
    s.completed(1);
    s.completed(2);
    assert_eq!(on_disk(&s.root), vec!["i-1.sst"]);
}

#[test]
fn acknowledgements_of_another_attempt_stage_nothing() {
    let (_d, s) = area();
    let (mut snap, files) = ack(&["i-1.sst"], &["i-1.sst"]);
    s.stage(1, T, 1, &mut snap, files).unwrap();
    s.begin_attempt(2);
    assert!(on_disk(&s.root).is_empty(), "a new attempt starts empty");
    let (mut snap, files) = ack(&["i-2.sst"], &["i-2.sst"]);
    let e = s.stage(1, T, 2, &mut snap, files).unwrap_err();
    assert!(e.is_secondary(), "{e}");
    assert!(on_disk(&s.root).is_empty());
}

#[test]
fn an_intermediate_savepoint_is_released_by_the_next_completed_checkpoint() {
    let (_d, s) = area();
    let (mut snap, files) = ack(&["i-1-MANIFEST"], &["i-1-MANIFEST"]);
    s.stage(1, T, 1, &mut snap, files).unwrap();
    // Savepoint 1 is written but never notified; checkpoint 2 completes.
    let (mut snap, files) = ack(&["i-2-MANIFEST"], &["i-2-MANIFEST"]);
    s.stage(1, T, 2, &mut snap, files).unwrap();
    s.completed(2);
    assert_eq!(on_disk(&s.root), vec!["i-2-MANIFEST"]);
}

#[test]
fn tasks_keep_their_own_basis() {
    let (_d, s) = area();
    let other: Task = (2, 1);
    let (mut a, fa) = ack(&["a-1.sst"], &["a-1.sst"]);
    let (mut b, fb) = ack(&["b-1.sst"], &["b-1.sst"]);
    s.stage(1, T, 1, &mut a, fa).unwrap();
    s.stage(1, other, 1, &mut b, fb).unwrap();
    s.completed(1);
    let (mut a, fa) = ack(&["a-1.sst", "a-2.sst"], &["a-2.sst"]);
    let (mut b, fb) = ack(&["b-2.sst"], &["b-2.sst"]);
    s.stage(1, T, 2, &mut a, fa).unwrap();
    s.stage(1, other, 2, &mut b, fb).unwrap();
    s.completed(2);
    assert_eq!(on_disk(&s.root), vec!["a-1.sst", "a-2.sst", "b-2.sst"]);
}

/// After a restore, a worker leaves out the files its task was restored with: the area
/// accepts them, keeps them under the name the backend gave them (a restore of the new
/// checkpoint needs it: `000007.sst`, not its storage name), never copies or deletes the
/// stored copies, and still refuses a left-out file it knows nothing of.
#[test]
fn files_of_the_restored_checkpoint_keep_their_own_names_and_are_never_deleted() {
    let (d, s) = area();
    let stored = d.path().join("checkpoints").join("shared");
    std::fs::create_dir_all(&stored).unwrap();
    std::fs::write(stored.join("i-000007.sst"), b"stored").unwrap();
    s.restored(1, ["i-000007.sst".to_string()]);
    // An older attempt's hint is ignored.
    s.restored(0, ["i-000099.sst".to_string()]);
    let (mut snap, files) = ack(
        &["i-2-MANIFEST", "i-000007.sst", "i-000008.sst"],
        &["i-2-MANIFEST", "i-000008.sst"],
    );
    s.stage(1, T, 2, &mut snap, files).unwrap();
    let paths: Vec<PathBuf> = snap["op"].files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        paths,
        vec![
            s.root.join("i-2-MANIFEST/MANIFEST"),
            PathBuf::from("/worker/db/chk/000007.sst"),
            s.root.join("i-000008.sst/000008.sst")
        ]
    );
    assert_eq!(
        on_disk(&s.root),
        vec!["i-000008.sst".to_string(), "i-2-MANIFEST".to_string()]
    );
    s.completed(2);
    // Compaction dropped the restored file: nothing refers to it, it stays in storage.
    let (mut snap, files) = ack(&["i-3-MANIFEST", "i-000008.sst"], &["i-3-MANIFEST"]);
    s.stage(1, T, 3, &mut snap, files).unwrap();
    s.completed(3);
    assert_eq!(
        on_disk(&s.root),
        vec!["i-000008.sst".to_string(), "i-3-MANIFEST".to_string()]
    );
    assert_eq!(
        std::fs::read(stored.join("i-000007.sst")).unwrap(),
        b"stored"
    );
    let (mut snap, files) = ack(&["i-4-MANIFEST", "i-000099.sst"], &["i-4-MANIFEST"]);
    let e = s.stage(1, T, 4, &mut snap, files).unwrap_err().to_string();
    assert!(e.contains("left out checkpoint file i-000099.sst"), "{e}");
    // A new attempt forgets the hint.
    s.begin_attempt(2);
    let (mut snap, files) = ack(&["i-000007.sst"], &[]);
    assert!(s.stage(2, T, 5, &mut snap, files).is_err());
    assert_eq!(
        std::fs::read(stored.join("i-000007.sst")).unwrap(),
        b"stored"
    );
}
