//! Tests of the storage: layout, loading, verification, fallback, discarding. The helpers
//! here are shared with the other modules' tests.

use super::*;
use crate::FileProblem;
use std::fs;
use std::path::Path;

pub(crate) fn storage() -> (tempfile::TempDir, CheckpointStorage) {
    let tmp = tempfile::tempdir().unwrap();
    let storage = CheckpointStorage::open(tmp.path().join("cp")).unwrap();
    (tmp, storage)
}

pub(crate) fn manifest(id: u64, kind: CheckpointKind, files: Vec<FileEntry>) -> Manifest {
    let mut m = Manifest::new("job", CheckpointId(id), kind, 128);
    m.operators.push(OperatorManifest {
        uid: "op".into(),
        name: "op".into(),
        parallelism: 1,
        subtasks: vec![SubtaskManifest {
            subtask: 0,
            files,
            operator_state: Some(serde_json::json!({ "offset": id })),
            watermark: None,
        }],
    });
    m
}

/// Writes checkpoint `id` with one own file and the given shared files.
pub(crate) fn write(s: &CheckpointStorage, id: u64, shared: &[&str]) -> PathBuf {
    let w = s
        .begin(CheckpointId(id), CheckpointKind::Checkpoint)
        .unwrap();
    let mut files = vec![
        w.write_file("own", format!("state of {id}").as_bytes())
            .unwrap(),
    ];
    for name in shared {
        files.push(w.write_shared(name, name.as_bytes()).unwrap());
    }
    w.finish(manifest(id, CheckpointKind::Checkpoint, files))
        .unwrap()
}

fn corrupt_problem(r: Result<Manifest>) -> (PathBuf, FileProblem) {
    match r {
        Err(Error::Corrupt { file, problem, .. }) => (file, problem),
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn open_creates_the_directory_or_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let s = CheckpointStorage::open(tmp.path().join("a/b")).unwrap();
    assert!(s.dir().join("shared").is_dir());
    assert!(s.dir().is_absolute());
    let file = tmp.path().join("file");
    fs::write(&file, b"").unwrap();
    let e = CheckpointStorage::open(&file).unwrap_err();
    assert!(e.to_string().contains(&*file.to_string_lossy()), "{e}");
}

#[test]
fn round_trip() {
    let (_tmp, s) = storage();
    let path = write(&s, 1, &["sst-1"]);
    assert_eq!(path, s.dir().join("chk-00000000000000000001"));
    let m = s.load(&path).unwrap();
    assert_eq!(m, {
        let mut expected = manifest(1, CheckpointKind::Checkpoint, m.files().cloned().collect());
        expected.created_unix_ms = m.created_unix_ms;
        expected
    });
    let entries: Vec<FileEntry> = m.files().cloned().collect();
    assert_eq!(s.read_file(&path, &entries[0]).unwrap(), b"state of 1");
    assert_eq!(s.read_file(&path, &entries[1]).unwrap(), b"sst-1");
    assert!(entries[1].shared && !entries[0].shared);
    let json = fs::read_to_string(path.join("_metadata")).unwrap();
    assert!(json.contains("\n  \"job\": \"job\""), "pretty JSON: {json}");
    assert!(!path.join("_metadata.tmp").exists());
}

#[test]
fn load_accepts_the_three_path_forms() {
    let (_tmp, s) = storage();
    let chk = write(&s, 3, &[]);
    let w = s.savepoint(CheckpointId(4), "before-upgrade").unwrap();
    let f = w.write_file("x", b"x").unwrap();
    let sp = w
        .finish(manifest(4, CheckpointKind::Savepoint, vec![f]))
        .unwrap();
    assert_eq!(sp.file_name().unwrap(), "sp-4-before-upgrade");
    for path in [
        chk.clone(),
        chk.join("_metadata"),
        sp.clone(),
        sp.join("_metadata"),
    ] {
        let m = s.load(&path).unwrap();
        assert_eq!(
            m.checkpoint_id.0,
            if path.starts_with(&chk) { 3 } else { 4 }
        );
        let entry = m.files().next().unwrap();
        s.read_file(&path, entry).unwrap();
    }
    // a savepoint moved elsewhere by a user still loads
    let moved = s.dir().parent().unwrap().join("my-savepoint");
    fs::rename(&sp, &moved).unwrap();
    assert_eq!(s.load(&moved).unwrap().kind, CheckpointKind::Savepoint);
}

#[test]
fn corrupt_files_are_named() {
    let (_tmp, s) = storage();
    let path = write(&s, 1, &["sst-a"]);
    let own = path.join("own");
    let good = fs::read(&own).unwrap();

    let mut flipped = good.clone();
    flipped[0] ^= 0x01;
    fs::write(&own, &flipped).unwrap();
    let (file, problem) = corrupt_problem(s.load(&path));
    assert_eq!(file, own);
    assert!(matches!(problem, FileProblem::Checksum { .. }));
    let msg = s.load(&path).unwrap_err().to_string();
    assert!(
        msg.contains("chk-00000000000000000001 is corrupt")
            && msg.contains("own: the file's crc32"),
        "{msg}"
    );

    fs::write(&own, &good[..good.len() - 1]).unwrap();
    let (_, problem) = corrupt_problem(s.load(&path));
    assert_eq!(
        problem,
        FileProblem::Size {
            expected: good.len() as u64,
            actual: good.len() as u64 - 1
        }
    );

    fs::write(&own, &good).unwrap();
    s.load(&path).unwrap();
    let shared = s.dir().join("shared/sst-a");
    fs::remove_file(&shared).unwrap();
    assert_eq!(
        corrupt_problem(s.load(&path)),
        (shared, FileProblem::Missing)
    );
}

#[test]
fn read_file_verifies_again() {
    let (_tmp, s) = storage();
    let path = write(&s, 1, &[]);
    let m = s.load(&path).unwrap();
    let entry = m.files().next().unwrap().clone();
    fs::write(path.join("own"), b"state of 2").unwrap(); // same size, other bytes
    let e = s.read_file(&path, &entry).unwrap_err();
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
    let escape = FileEntry {
        name: "../x".into(),
        ..entry
    };
    assert!(matches!(
        s.read_file(&path, &escape),
        Err(Error::InvalidName { .. })
    ));
}

#[test]
fn latest_complete_falls_back_past_corrupt_checkpoints() {
    let (_tmp, s) = storage();
    assert!(s.latest_complete().unwrap().checkpoint.is_none());
    write(&s, 1, &[]);
    let p2 = write(&s, 2, &[]);
    let p3 = write(&s, 3, &[]);
    s.savepoint(CheckpointId(4), "sp").unwrap(); // savepoints are not candidates
    let latest = s.latest_complete().unwrap();
    assert_eq!(latest.checkpoint.unwrap().path, p3);

    fs::write(p3.join("own"), b"garbage!!!").unwrap();
    fs::write(p2.join("_metadata"), b"{ truncated").unwrap();
    let latest = s.latest_complete().unwrap();
    let found = latest.checkpoint.unwrap();
    assert_eq!(found.manifest.checkpoint_id, CheckpointId(1));
    let skipped: Vec<&Path> = latest.skipped.iter().map(|s| s.path.as_path()).collect();
    assert_eq!(skipped, [p3.as_path(), p2.as_path()]);
    assert!(matches!(latest.skipped[0].error, Error::Corrupt { .. }));
    assert!(matches!(
        latest.skipped[1].error,
        Error::ManifestParse { .. }
    ));
}

/// A savepoint that stopped the job committed its sinks: it is a recovery point like a
/// checkpoint. An intermediate savepoint committed nothing and is not.
#[test]
fn a_stop_savepoint_is_a_recovery_point_and_an_intermediate_one_is_not() {
    let (_tmp, s) = storage();
    write(&s, 1, &[]);
    let savepoint = |id: u64, stops_job: bool| {
        let w = s
            .begin(CheckpointId(id), CheckpointKind::Savepoint)
            .unwrap();
        let f = w.write_file("own", b"sp").unwrap();
        let mut m = manifest(id, CheckpointKind::Savepoint, vec![f]);
        m.stops_job = stops_job;
        w.finish(m).unwrap()
    };
    savepoint(2, false);
    let latest = s.latest_complete().unwrap().checkpoint.unwrap();
    assert_eq!(latest.manifest.checkpoint_id, CheckpointId(1));
    let stop = savepoint(3, true);
    let latest = s.latest_complete().unwrap().checkpoint.unwrap();
    assert_eq!(
        (latest.manifest.checkpoint_id, latest.path),
        (CheckpointId(3), stop)
    );
    assert!(latest.manifest.stops_job);
    write(&s, 4, &[]);
    let latest = s.latest_complete().unwrap().checkpoint.unwrap();
    assert_eq!(latest.manifest.checkpoint_id, CheckpointId(4));
}

#[test]
fn partial_checkpoint_is_not_complete_and_skipped() {
    let (_tmp, s) = storage();
    let p1 = write(&s, 1, &[]);
    let w = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    w.write_file("own", b"half").unwrap();
    drop(w); // crashed before finish
    let list = s.list().unwrap();
    assert_eq!(list.len(), 2);
    assert!(list[0].complete && !list[1].complete);
    assert_eq!(list[1].id, CheckpointId(2));
    let latest = s.latest_complete().unwrap();
    assert_eq!(latest.checkpoint.unwrap().path, p1);
    assert!(latest.skipped.is_empty(), "incomplete is not corrupt");
    let e = s
        .load(s.dir().join("chk-00000000000000000002"))
        .unwrap_err();
    assert!(matches!(e, Error::NotComplete { .. }));
    assert!(e.to_string().contains("no _metadata"), "{e}");
    // a new attempt at the same id may overwrite the leftovers
    let w = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    let f = w.write_file("own", b"whole").unwrap();
    w.finish(manifest(2, CheckpointKind::Checkpoint, vec![f]))
        .unwrap();
    assert_eq!(
        s.latest_complete()
            .unwrap()
            .checkpoint
            .unwrap()
            .manifest
            .checkpoint_id
            .0,
        2
    );
}

#[test]
fn list_sorts_and_ignores_strangers_and_next_id_skips_everything() {
    let (_tmp, s) = storage();
    assert_eq!(s.next_id().unwrap(), CheckpointId(1));
    write(&s, 10, &[]);
    write(&s, 9, &[]);
    s.begin(CheckpointId(12), CheckpointKind::Checkpoint)
        .unwrap();
    let sp = s
        .begin(CheckpointId(11), CheckpointKind::Savepoint)
        .unwrap();
    assert!(
        sp.path()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("sp-11-")
    );
    fs::create_dir(s.dir().join("chk-junk")).unwrap();
    fs::write(
        s.dir().join("chk-00000000000000000099"),
        b"a file, not a dir",
    )
    .unwrap();
    let ids: Vec<(u64, CheckpointKind, bool)> = s
        .list()
        .unwrap()
        .iter()
        .map(|c| (c.id.0, c.kind, c.complete))
        .collect();
    assert_eq!(
        ids,
        [
            (9, CheckpointKind::Checkpoint, true),
            (10, CheckpointKind::Checkpoint, true),
            (11, CheckpointKind::Savepoint, false),
            (12, CheckpointKind::Checkpoint, false),
        ]
    );
    assert_eq!(s.next_id().unwrap(), CheckpointId(13));
}

#[test]
fn begin_refuses_to_overwrite() {
    let (_tmp, s) = storage();
    write(&s, 1, &[]);
    let e = s.begin(CheckpointId(1), CheckpointKind::Final).unwrap_err();
    assert!(matches!(e, Error::AlreadyExists { .. }), "{e}");
    let _w = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    assert!(matches!(
        s.begin(CheckpointId(2), CheckpointKind::Checkpoint),
        Err(Error::AlreadyExists { .. })
    ));
    s.savepoint(CheckpointId(3), "x").unwrap();
    assert!(matches!(
        s.savepoint(CheckpointId(3), "x"),
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        s.savepoint(CheckpointId(3), "../x"),
        Err(Error::InvalidName { .. })
    ));
}

#[test]
fn discard_removes_only_incomplete_checkpoints() {
    let (_tmp, s) = storage();
    let done = write(&s, 1, &[]);
    let w = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    w.write_file("own", b"x").unwrap();
    assert!(s.discard(CheckpointId(2)).unwrap());
    assert!(!w.path().exists());
    assert!(!s.discard(CheckpointId(2)).unwrap());
    assert!(!s.discard(CheckpointId(1)).unwrap());
    assert!(done.join("_metadata").exists());
    // a writer of a discarded checkpoint fails cleanly
    assert!(matches!(w.write_file("more", b"x"), Err(Error::Io { .. })));
}

#[test]
fn inconsistent_manifest_is_rejected() {
    let (_tmp, s) = storage();
    let p1 = write(&s, 1, &[]);
    let p2 = write(&s, 2, &[]);
    fs::copy(p1.join("_metadata"), p2.join("_metadata")).unwrap();
    let e = s.load(&p2).unwrap_err();
    assert!(e.to_string().contains("records checkpoint 1"), "{e}");
    assert_eq!(s.latest_complete().unwrap().checkpoint.unwrap().path, p1);
}

/// The first position of `needle` in `_metadata` of `dir`.
fn metadata_pos(dir: &Path, needle: &str) -> usize {
    let text = fs::read_to_string(dir.join("_metadata")).unwrap();
    text.find(needle)
        .unwrap_or_else(|| panic!("{needle} not in {text}"))
}

#[test]
fn a_changed_byte_in_metadata_is_corrupt_and_restore_falls_back() {
    let (_tmp, s) = storage();
    let p1 = write(&s, 1, &[]);
    let p2 = write(&s, 2, &[]);
    // The source position recorded for checkpoint 2 becomes 3: valid JSON, consistent
    // with the directory and every file; only the checksum can tell.
    let meta = p2.join("_metadata");
    let mut bytes = fs::read(&meta).unwrap();
    let pos = metadata_pos(&p2, "\"offset\": 2") + "\"offset\": ".len();
    bytes[pos] = b'3';
    fs::write(&meta, &bytes).unwrap();

    let (file, problem) = corrupt_problem(s.load(&p2));
    assert_eq!(file, meta);
    assert!(matches!(problem, FileProblem::Checksum { .. }), "{problem}");
    let msg = s.load(&p2).unwrap_err().to_string();
    assert!(
        msg.contains("chk-00000000000000000002 is corrupt")
            && msg.contains("chk-00000000000000000002/_metadata: the file's crc32 is"),
        "{msg}"
    );
    let latest = s.latest_complete().unwrap();
    assert_eq!(latest.checkpoint.unwrap().path, p1);
    assert_eq!(latest.skipped.len(), 1);
    assert_eq!(latest.skipped[0].path, p2);
    assert!(matches!(
        latest.skipped[0].error,
        Error::Corrupt {
            problem: FileProblem::Checksum { .. },
            ..
        }
    ));
}

#[test]
fn every_flipped_byte_of_metadata_makes_the_checkpoint_unusable() {
    let (_tmp, s) = storage();
    let p = write(&s, 7, &["sst-x"]);
    let meta = p.join("_metadata");
    let good = fs::read(&meta).unwrap();
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        fs::write(&meta, &bad).unwrap();
        match s.load(&p) {
            Err(e) if e.is_unusable_checkpoint() => {}
            other => panic!(
                "flipping byte {i} ({:?}) went unnoticed: {other:?}",
                good[i] as char
            ),
        }
    }
    fs::write(&meta, &good).unwrap();
    s.load(&p).unwrap();
}

#[test]
fn metadata_checksum_line_format() {
    let (_tmp, s) = storage();
    let p = write(&s, 1, &[]);
    let text = fs::read_to_string(p.join("_metadata")).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("{"));
    let line = lines.next().unwrap();
    let crc: u32 = line
        .strip_prefix("  \"metadata_crc32\": ")
        .and_then(|l| l.strip_suffix(','))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected second line {line:?}"));
    // The checksum covers the file without its own line.
    let without: String = text.replacen(&format!("{line}\n"), "", 1);
    assert_eq!(crc32fast::hash(without.as_bytes()), crc);
    assert!(
        without.contains("\n  \"format_version\": 2,\n"),
        "{without}"
    );
    // Still plain JSON for other tools.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["metadata_crc32"], crc);
}

#[test]
fn format_1_manifests_without_a_checksum_still_load() {
    let (_tmp, s) = storage();
    let p = write(&s, 1, &["sst-a"]);
    let meta = p.join("_metadata");
    let text = fs::read_to_string(&meta).unwrap();
    let line = text.lines().nth(1).unwrap().to_string();
    let without = text.replacen(&format!("{line}\n"), "", 1);

    // As written by weir before the checksum existed: format 1, no checksum line.
    let v1 = without.replacen("\"format_version\": 2", "\"format_version\": 1", 1);
    fs::write(&meta, &v1).unwrap();
    let m = s.load(&p).unwrap();
    assert_eq!(m.format_version, 1);
    assert_eq!(m.checkpoint_id, CheckpointId(1));
    // Its state files are verified as always.
    fs::write(s.dir().join("shared/sst-a"), b"sst-b").unwrap();
    assert!(matches!(s.load(&p), Err(Error::Corrupt { .. })));
    fs::write(s.dir().join("shared/sst-a"), b"sst-a").unwrap();

    // Format 2 requires the line: without it (or with an unreadable one) it is corrupt.
    fs::write(&meta, &without).unwrap();
    let (file, problem) = corrupt_problem(s.load(&p));
    assert_eq!(
        (file, problem),
        (meta.clone(), FileProblem::ManifestChecksumMissing)
    );
    let msg = s.load(&p).unwrap_err().to_string();
    assert!(
        msg.contains("\"metadata_crc32\") is missing or unreadable"),
        "{msg}"
    );
    fs::write(&meta, text.replacen(": ", ": x", 1)).unwrap();
    assert_eq!(
        corrupt_problem(s.load(&p)).1,
        FileProblem::ManifestChecksumMissing
    );
    assert!(s.latest_complete().unwrap().checkpoint.is_none());
}

#[test]
fn new_directories_are_fsynced_in_their_parent() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("a").join("cp");
    layout::take_synced_dirs();
    let s = CheckpointStorage::open(&root).unwrap();
    let synced = layout::take_synced_dirs();
    for dir in [tmp.path().to_path_buf(), tmp.path().join("a"), root.clone()] {
        assert!(
            synced.contains(&dir),
            "{} not fsynced: {synced:?}",
            dir.display()
        );
    }

    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    assert_eq!(
        layout::take_synced_dirs(),
        std::slice::from_ref(&root),
        "the new checkpoint directory's entry"
    );
    let f = w.write_file("own", b"x").unwrap();
    let p = w
        .finish(manifest(1, CheckpointKind::Checkpoint, vec![f]))
        .unwrap();
    assert_eq!(layout::take_synced_dirs(), [p], "the renamed _metadata");

    let w = s.savepoint(CheckpointId(2), "before-upgrade").unwrap();
    assert_eq!(layout::take_synced_dirs(), std::slice::from_ref(&root));
    let f = w.write_file("own", b"x").unwrap();
    let sp = w
        .finish(manifest(2, CheckpointKind::Savepoint, vec![f]))
        .unwrap();
    assert_eq!(layout::take_synced_dirs(), [sp]);
    let w = s.begin(CheckpointId(3), CheckpointKind::Savepoint).unwrap();
    assert_eq!(layout::take_synced_dirs(), [root]);
    drop(w);
}

#[test]
fn discard_removes_an_aborted_savepoint_but_not_a_complete_one() {
    let (_tmp, s) = storage();
    let w = s.begin(CheckpointId(4), CheckpointKind::Savepoint).unwrap();
    w.write_file("own", b"half").unwrap();
    w.write_shared("sst-a", b"a").unwrap();
    let named = s.savepoint(CheckpointId(4), "named").unwrap();
    assert_eq!(s.list().unwrap().len(), 2);
    assert!(s.discard(CheckpointId(4)).unwrap());
    assert_eq!(s.list().unwrap(), [], "no sp-4-… directory is left");
    assert!(matches!(w.write_file("more", b"x"), Err(Error::Io { .. })));
    drop((w, named));

    let w = s.savepoint(CheckpointId(5), "kept").unwrap();
    let f = w.write_file("own", b"x").unwrap();
    let sp = w
        .finish(manifest(5, CheckpointKind::Savepoint, vec![f]))
        .unwrap();
    assert!(!s.discard(CheckpointId(5)).unwrap());
    s.load(&sp).unwrap();
    assert!(!s.discard(CheckpointId(6)).unwrap());
}

/// A shared file in `shared/` as a state backend stores it: linked from a local file.
fn link(w: &CheckpointWriter, local: &Path, name: &str) -> FileEntry {
    let src = local.join(name);
    fs::write(&src, format!("contents of {name}")).unwrap();
    w.link_shared(name, &src).unwrap()
}

#[test]
fn reuse_shared_never_hands_out_a_file_retention_deleted() {
    let (tmp, s) = storage();
    let local = tmp.path().join("local");
    fs::create_dir(&local).unwrap();
    let shared = s.dir().join("shared");

    // Checkpoint 1 stores sst-a; checkpoint 2 reuses it without storing it again.
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    assert_eq!(w.reuse_shared("sst-a").unwrap(), None, "never stored");
    let a = link(&w, &local, "sst-a");
    w.finish(manifest(1, CheckpointKind::Checkpoint, vec![a.clone()]))
        .unwrap();
    let w = s
        .begin(CheckpointId(2), CheckpointKind::Checkpoint)
        .unwrap();
    assert_eq!(w.reuse_shared("sst-a").unwrap(), Some(a.clone()));
    w.finish(manifest(2, CheckpointKind::Checkpoint, vec![a.clone()]))
        .unwrap();
    // A savepoint keeps its own copies.
    let sp = s.begin(CheckpointId(3), CheckpointKind::Savepoint).unwrap();
    assert_eq!(sp.reuse_shared("sst-a").unwrap(), None);
    drop(sp);

    // Checkpoints 4 and 5 no longer need sst-a; retention deletes it.
    write(&s, 4, &[]);
    write(&s, 5, &[]);
    assert_eq!(s.retain(1).unwrap().deleted_shared, ["sst-a"]);
    assert!(!shared.join("sst-a").exists());

    // A later checkpoint that needs sst-a again must store it again, and then verifies
    // and restores.
    let w = s
        .begin(CheckpointId(6), CheckpointKind::Checkpoint)
        .unwrap();
    assert_eq!(
        w.reuse_shared("sst-a").unwrap(),
        None,
        "deleted by retention"
    );
    let again = link(&w, &local, "sst-a");
    let p6 = w
        .finish(manifest(6, CheckpointKind::Checkpoint, vec![again.clone()]))
        .unwrap();
    s.load(&p6).unwrap();
    assert_eq!(s.read_file(&p6, &again).unwrap(), b"contents of sst-a");

    // Deleted by anyone else: noticed too.
    fs::remove_file(shared.join("sst-a")).unwrap();
    let w = s
        .begin(CheckpointId(7), CheckpointKind::Checkpoint)
        .unwrap();
    assert_eq!(w.reuse_shared("sst-a").unwrap(), None, "deleted by hand");
}

#[test]
fn a_reused_shared_file_is_protected_while_its_checkpoint_is_written() {
    let (tmp, s) = storage();
    let local = tmp.path().join("local");
    fs::create_dir(&local).unwrap();
    let w = s
        .begin(CheckpointId(1), CheckpointKind::Checkpoint)
        .unwrap();
    let b = link(&w, &local, "sst-b");
    w.finish(manifest(1, CheckpointKind::Checkpoint, vec![b.clone()]))
        .unwrap();
    // Checkpoint 3 reuses sst-b; meanwhile checkpoint 2, which does not need it, completes
    // and retention runs.
    let w3 = s
        .begin(CheckpointId(3), CheckpointKind::Checkpoint)
        .unwrap();
    assert_eq!(w3.reuse_shared("sst-b").unwrap(), Some(b.clone()));
    write(&s, 2, &[]);
    let report = s.retain(1).unwrap();
    assert_eq!(report.deleted_shared, Vec::<String>::new());
    let p3 = w3
        .finish(manifest(3, CheckpointKind::Checkpoint, vec![b.clone()]))
        .unwrap();
    s.load(&p3).unwrap();
}

/// Checksums are verified several files at once: every file is still read, and with
/// several corrupt files the first in the manifest's order is named, every time.
#[test]
fn checksums_of_many_files_are_all_verified_and_the_first_bad_one_is_named() {
    let (_tmp, s) = storage();
    let names: Vec<String> = (0..40).map(|i| format!("sst-{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let path = write(&s, 1, &refs);
    s.load(&path).unwrap();
    let flip = |name: &str| {
        let file = s.dir().join("shared").join(name);
        let mut bytes = fs::read(&file).unwrap();
        bytes[0] ^= 0x20;
        fs::write(&file, bytes).unwrap();
        file
    };
    let last = flip("sst-39");
    let (file, problem) = corrupt_problem(s.load(&path));
    assert_eq!(file, last);
    assert!(matches!(problem, FileProblem::Checksum { .. }));
    let first = flip("sst-07");
    flip("sst-23");
    for _ in 0..5 {
        assert_eq!(corrupt_problem(s.load(&path)).0, first);
    }
    // A missing file is named before any checksum is read.
    let gone = s.dir().join("shared").join("sst-30");
    fs::remove_file(&gone).unwrap();
    assert_eq!(corrupt_problem(s.load(&path)), (gone, FileProblem::Missing));
}

/// `load_unread` checks the manifest and the files' sizes, not their contents: it is for a
/// process restoring what another one verified with `load`.
#[test]
fn load_unread_checks_sizes_but_reads_no_file() {
    let (_tmp, s) = storage();
    let path = write(&s, 1, &["sst-a"]);
    let shared = s.dir().join("shared").join("sst-a");
    fs::write(&shared, b"sst-b").unwrap();
    assert_eq!(s.load_unread(&path).unwrap().checkpoint_id, CheckpointId(1));
    assert!(matches!(
        corrupt_problem(s.load(&path)).1,
        FileProblem::Checksum { .. }
    ));
    fs::write(&shared, b"sst").unwrap();
    assert_eq!(
        corrupt_problem(s.load_unread(&path)),
        (
            shared.clone(),
            FileProblem::Size {
                expected: 5,
                actual: 3
            }
        )
    );
    fs::remove_file(&shared).unwrap();
    assert_eq!(
        corrupt_problem(s.load_unread(&path)),
        (shared, FileProblem::Missing)
    );
    // The manifest itself is verified.
    let meta = path.join("_metadata");
    let text = fs::read_to_string(&meta)
        .unwrap()
        .replace("\"job\"", "\"jab\"");
    fs::write(&meta, text).unwrap();
    assert!(s.load_unread(&path).is_err());
}
