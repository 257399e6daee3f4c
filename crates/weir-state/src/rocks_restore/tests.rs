use crate::{RocksDbBackend, RocksDbConfig};
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use weir_core::checkpoint::{LocalFile, OperatorSnapshot, RestoredInstance};
use weir_core::data::{key_group, key_group_range};
use weir_core::ids::CheckpointId;
use weir_core::state::{KeyContext, StateContext};

const MAX: usize = 128;
const KEYS: u64 = 3_000;

fn config(dir: &Path) -> RocksDbConfig {
    RocksDbConfig {
        local_dir: dir.join("local"),
        cache_entries: 64,
        ..RocksDbConfig::default()
    }
}

fn open(
    cfg: &RocksDbConfig,
    subtask: usize,
    parallelism: usize,
    from: &[RestoredInstance],
) -> weir_core::Result<(Rc<KeyContext<u64>>, StateContext<u64>)> {
    let label = format!("op1-{subtask}");
    let backend = RocksDbBackend::open(
        cfg,
        &label,
        MAX,
        subtask,
        parallelism,
        BTreeMap::new(),
        from,
    )?;
    let key = KeyContext::<u64>::new();
    Ok((key.clone(), StateContext::new(key, Box::new(backend))))
}

fn owned(k: u64, subtask: usize, parallelism: usize) -> bool {
    key_group_range(subtask, MAX, parallelism).contains(&key_group(&k, MAX).0)
}

/// Copies a snapshot's files out of the instance (which removes its own when dropped), as
/// the runtime brings them back from checkpoint storage.
pub(crate) fn keep(
    snap: &OperatorSnapshot,
    dir: &Path,
    key_groups: std::ops::Range<u32>,
) -> RestoredInstance {
    std::fs::create_dir_all(dir).unwrap();
    let files = snap
        .files
        .iter()
        .map(|f| {
            let path = dir.join(f.path.file_name().unwrap());
            std::fs::copy(&f.path, &path).unwrap();
            LocalFile {
                path,
                name: f.name.clone(),
                shared: f.shared,
            }
        })
        .collect();
    RestoredInstance {
        key_groups,
        files,
        local_copy: false,
    }
}

/// Runs `parallelism` old subtasks, each holding value `10 k` and map entry `(1, k)` for
/// every key `k < KEYS` it owns (some cleared), and checkpoints them.
fn old_instances(root: &Path, parallelism: usize) -> Vec<RestoredInstance> {
    old_instances_with(root, parallelism, &[], KEYS)
}

/// [`old_instances`] for keys below `keys`, each subtask restored from `from` first.
fn old_instances_with(
    root: &Path,
    parallelism: usize,
    from: &[RestoredInstance],
    keys: u64,
) -> Vec<RestoredInstance> {
    let cfg = config(&root.join(format!("run-{parallelism}-{keys}")));
    (0..parallelism)
        .map(|s| {
            let (key, mut ctx) = open(&cfg, s, parallelism, from).unwrap();
            let mut value = ctx.value_state::<u64>("value").unwrap();
            let mut map = ctx.map_state::<u32, u64>("map").unwrap();
            for k in (0..keys).filter(|k| owned(*k, s, parallelism)) {
                key.set(k);
                value.set(10 * k).unwrap();
                map.put(1, k).unwrap();
                if k % 13 == 0 {
                    value.clear().unwrap();
                }
            }
            let hooks = ctx.hooks();
            let mut snap = hooks.borrow_mut().snapshot(CheckpointId(1)).unwrap();
            snap.resolve_files().unwrap();
            let dir = root.join(format!("stored-{parallelism}-{keys}-{s}"));
            keep(&snap, &dir, key_group_range(s, MAX, parallelism))
        })
        .collect()
}

/// Every key the new subtask owns has exactly its old value and map entry; no other key
/// has any (the clipped key groups are gone).
fn check(cfg: &RocksDbConfig, subtask: usize, parallelism: usize, from: &[RestoredInstance]) {
    let (key, mut ctx) = open(cfg, subtask, parallelism, from).unwrap();
    let value = ctx.value_state::<u64>("value").unwrap();
    let map = ctx.map_state::<u32, u64>("map").unwrap();
    let mut owned_keys = 0;
    for k in 0..KEYS {
        key.set(k);
        if owned(k, subtask, parallelism) {
            owned_keys += 1;
            let want = (k % 13 != 0).then_some(10 * k);
            assert_eq!(value.get().unwrap(), want, "key {k} of subtask {subtask}");
            assert_eq!(map.entries().unwrap(), vec![(1, k)], "key {k}");
        } else {
            assert_eq!(
                value.get().unwrap(),
                None,
                "key {k} is not subtask {subtask}'s"
            );
            assert_eq!(map.entries().unwrap(), vec![], "key {k}");
        }
    }
    assert!(owned_keys > 0);
}

fn rescale(from: usize, to: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let old = old_instances(tmp.path(), from);
    let cfg = config(&tmp.path().join("new"));
    for s in 0..to {
        check(&cfg, s, to, &old);
    }
}

#[test]
fn restores_exact_contents_at_the_same_parallelism() {
    rescale(2, 2);
}

#[test]
fn restores_exact_contents_from_2_to_3_subtasks() {
    rescale(2, 3);
}

#[test]
fn restores_exact_contents_from_3_to_2_subtasks() {
    rescale(3, 2);
}

fn sst_names(snap: &OperatorSnapshot) -> Vec<String> {
    let mut v: Vec<String> = snap
        .files
        .iter()
        .filter(|f| f.shared)
        .map(|f| f.name.clone())
        .collect();
    v.sort();
    v
}

/// The first checkpoint after a restore names the SST files it restored with as the
/// checkpoint it restored from did, so storage keeps them once; only new files get new
/// names.
#[test]
fn the_first_checkpoint_after_a_restore_reuses_the_restored_files() {
    let tmp = tempfile::tempdir().unwrap();
    let old = old_instances(tmp.path(), 1);
    let before: Vec<String> = {
        let mut v: Vec<String> = old[0]
            .files
            .iter()
            .filter(|f| f.shared)
            .map(|f| f.name.clone())
            .collect();
        v.sort();
        v
    };
    assert!(!before.is_empty());
    let cfg = config(&tmp.path().join("new"));
    let (key, mut ctx) = open(&cfg, 0, 1, &old).unwrap();
    let mut value = ctx.value_state::<u64>("value").unwrap();
    let hooks = ctx.hooks();
    let mut snap = hooks.borrow_mut().snapshot(CheckpointId(2)).unwrap();
    snap.resolve_files().unwrap();
    assert_eq!(
        sst_names(&snap),
        before,
        "nothing changed: every file is shared"
    );
    key.set(7);
    value.set(1).unwrap();
    let mut snap = hooks.borrow_mut().snapshot(CheckpointId(3)).unwrap();
    snap.resolve_files().unwrap();
    let after = sst_names(&snap);
    let new: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(new.len(), 1, "one new file for the one change: {after:?}");
    assert!(before.iter().all(|n| after.contains(n)), "{after:?}");
}

#[test]
fn a_missing_checkpoint_file_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let old = old_instances(tmp.path(), 1);
    let sst = old[0]
        .files
        .iter()
        .find(|f| f.shared)
        .expect("an SST file")
        .clone();
    std::fs::remove_file(&sst.path).unwrap();
    let cfg = config(&tmp.path().join("new"));
    let e = open(&cfg, 0, 1, &old).err().expect("fails");
    assert!(e.is_unrestorable(), "{e}");
    let e = e.to_string();
    assert!(
        e.contains(&sst.path.display().to_string()) && e.contains("is missing"),
        "{e}"
    );
    assert!(e.contains(&sst.name), "{e}");
}

/// A restore that failed left nothing in the backends' working directory.
fn nothing_left_in(cfg: &RocksDbConfig) {
    let left: Vec<_> = std::fs::read_dir(&cfg.local_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Cuts an SST file of `old` to half its length.
fn truncate_an_sst(old: &RestoredInstance) -> String {
    let sst = old.files.iter().find(|f| f.shared).expect("an SST file");
    let len = std::fs::metadata(&sst.path).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&sst.path)
        .unwrap();
    f.set_len(len / 2).unwrap();
    sst.path.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn files_that_do_not_open_condemn_the_checkpoint_unless_they_are_the_local_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(&tmp.path().join("new"));
    // Fetched from checkpoint storage: restoring them again would fail the same way.
    let mut old = old_instances(tmp.path(), 1);
    truncate_an_sst(&old[0]);
    let e = open(&cfg, 0, 1, &old).err().expect("fails");
    assert!(e.is_unrestorable(), "{e}");
    assert!(e.to_string().contains("RocksDB open"), "{e}");
    // The copy local recovery kept: the copy may be what is damaged.
    old[0].local_copy = true;
    let e = open(&cfg, 0, 1, &old).err().expect("fails");
    assert!(!e.is_unrestorable() && !e.is_deterministic(), "{e}");
    assert!(
        e.to_string()
            .contains("the next attempt fetches them from checkpoint storage"),
        "{e}"
    );
    // A rescale that reads another old instance's damaged files.
    let old = old_instances(&tmp.path().join("two"), 2);
    truncate_an_sst(&old[1]);
    let e = open(&cfg, 0, 1, &old).err().expect("fails");
    assert!(e.is_unrestorable(), "{e}");
    nothing_left_in(&cfg);
}

#[test]
fn a_truncated_sst_file_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let old = old_instances(tmp.path(), 1);
    let local = truncate_an_sst(&old[0]);
    let cfg = config(&tmp.path().join("new"));
    let e = open(&cfg, 0, 1, &old).err().expect("fails").to_string();
    assert!(
        e.contains("restoring RocksDB state of key groups 0..128") && e.contains(&local),
        "{e}"
    );
    // The failed instance left nothing behind.
    nothing_left_in(&cfg);
}

/// The file naming the key encoding in an instance's checkpoint.
fn encoding_file(old: &RestoredInstance) -> Option<&LocalFile> {
    old.files
        .iter()
        .find(|f| f.path.file_name().unwrap() == crate::rocks_restore::KEY_ENCODING_FILE)
}

/// Drops the key encoding's file from checkpointed instances: what weir wrote before it
/// named the encoding.
fn as_before_the_encoding_file(mut old: Vec<RestoredInstance>) -> Vec<RestoredInstance> {
    for o in &mut old {
        let f = encoding_file(o)
            .expect("a checkpoint names its key encoding")
            .clone();
        std::fs::remove_file(&f.path).unwrap();
        o.files.retain(|g| g.path != f.path);
    }
    old
}

/// Every store key of the instance checkpointed in `old` (its files are a whole RocksDB
/// database), read with RocksDB itself.
fn store_keys(old: &RestoredInstance) -> Vec<Vec<u8>> {
    let dir = old.files[0].path.parent().unwrap();
    let db = rocksdb::DB::open_for_read_only(&rocksdb::Options::default(), dir, false).unwrap();
    db.iterator(rocksdb::IteratorMode::Start)
        .map(|e| e.unwrap().0.to_vec())
        .collect()
}

/// The store key of key `k` in table `value`, its key encoded by `encode`.
fn value_key(k: u64, encode: fn(&u64, &mut Vec<u8>) -> weir_core::Result<()>) -> Vec<u8> {
    let mut out = (key_group(&k, MAX).0 as u16).to_be_bytes().to_vec();
    out.extend_from_slice(b"value\0");
    encode(&k, &mut out).unwrap();
    out
}

/// Checkpoints as the weir releases before ordered keys wrote them: keys in the value
/// codec (little-endian integers), no file naming the encoding. Made by running today's
/// instances restored from such a checkpoint (empty), which keep its encoding.
fn little_endian_instances(root: &Path, parallelism: usize) -> Vec<RestoredInstance> {
    let empty = old_instances_with(root, 1, &[], 0);
    let empty = as_before_the_encoding_file(empty);
    as_before_the_encoding_file(old_instances_with(root, parallelism, &empty, KEYS))
}

#[test]
fn a_new_instance_keeps_integer_keys_in_numeric_order_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let old = old_instances(tmp.path(), 1);
    let file = encoding_file(&old[0]).expect("the checkpoint names its key encoding");
    assert_eq!(std::fs::read_to_string(&file.path).unwrap(), "ordered");
    let keys = store_keys(&old[0]);
    let ordered = value_key(300, weir_core::codec::encode_ordered_into);
    assert!(keys.contains(&ordered), "key 300 stored as {ordered:?}");
    // Within a key group, the value table's keys lie in numeric order.
    let group = key_group(&300u64, MAX).0;
    let mut in_group: Vec<u64> = (0..KEYS)
        .filter(|k| k % 13 != 0 && key_group(k, MAX).0 == group)
        .collect();
    let stored: Vec<Vec<u8>> = keys
        .into_iter()
        .filter(|k| k.starts_with(&(group as u16).to_be_bytes()) && k[2..].starts_with(b"value\0"))
        .collect();
    in_group.sort();
    let want: Vec<Vec<u8>> = in_group
        .iter()
        .map(|k| value_key(*k, weir_core::codec::encode_ordered_into))
        .collect();
    assert_eq!(stored, want);
}

/// Tried as a user upgrading weir would: checkpoints of a release before ordered keys
/// restore with every value, at their own parallelism and rescaled, and the restored
/// instance goes on in their encoding (its own checkpoints say so).
#[test]
fn checkpoints_with_little_endian_keys_restore_exactly_and_keep_their_encoding() {
    let tmp = tempfile::tempdir().unwrap();
    let old = little_endian_instances(tmp.path(), 2);
    // What the releases before wrote: the value codec's encoding of the key.
    let keys = store_keys(&old[0]);
    let k = (0..KEYS)
        .find(|k| *k > 300 && k % 13 != 0 && owned(*k, 0, 2))
        .unwrap();
    assert!(keys.contains(&value_key(k, weir_core::codec::encode_into)));
    assert!(!keys.contains(&value_key(k, weir_core::codec::encode_ordered_into)));
    for (to, name) in [(2, "same"), (3, "rescaled")] {
        let cfg = config(&tmp.path().join(name));
        for s in 0..to {
            check(&cfg, s, to, &old);
        }
    }
    let cfg = config(&tmp.path().join("again"));
    let (key, mut ctx) = open(&cfg, 0, 1, &old).unwrap();
    let mut value = ctx.value_state::<u64>("value").unwrap();
    key.set(k);
    value.set(1).unwrap();
    let hooks = ctx.hooks();
    let mut snap = hooks.borrow_mut().snapshot(CheckpointId(2)).unwrap();
    snap.resolve_files().unwrap();
    let again = keep(&snap, &tmp.path().join("again-stored"), 0..MAX as u32);
    let file = encoding_file(&again).expect("named");
    assert_eq!(
        std::fs::read_to_string(&file.path).unwrap(),
        "little-endian"
    );
    let (key, mut ctx) = open(&config(&tmp.path().join("last")), 0, 1, &[again]).unwrap();
    let value = ctx.value_state::<u64>("value").unwrap();
    key.set(k);
    assert_eq!(value.get().unwrap(), Some(1));
    // A key the restore kept and the job did not touch since.
    let untouched = k + 1 + u64::from((k + 1) % 13 == 0);
    key.set(untouched);
    assert_eq!(value.get().unwrap(), Some(10 * untouched));
}

#[test]
fn an_unknown_key_encoding_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let old = old_instances(tmp.path(), 1);
    let file = encoding_file(&old[0]).unwrap().clone();
    std::fs::write(&file.path, "zigzag").unwrap();
    let cfg = config(&tmp.path().join("new"));
    let e = open(&cfg, 0, 1, &old).err().expect("fails").to_string();
    assert!(
        e.contains(&file.name) && e.contains("\"zigzag\"") && e.contains("does not know"),
        "{e}"
    );
}

#[test]
fn instances_of_different_key_encodings_are_not_merged() {
    let tmp = tempfile::tempdir().unwrap();
    let little = little_endian_instances(&tmp.path().join("le"), 2);
    let ordered = old_instances(&tmp.path().join("ordered"), 2);
    let mixed = vec![little[0].clone(), ordered[1].clone()];
    let cfg = config(&tmp.path().join("new"));
    let e = open(&cfg, 0, 1, &mixed).err().expect("fails").to_string();
    assert!(
        e.contains("encode their keys differently (little-endian and ordered)"),
        "{e}"
    );
}

#[test]
fn an_ingest_cuts_its_key_groups_into_parts_that_cover_them_once_in_order() {
    use crate::rocks_restore::split;
    assert_eq!(split(&(43..64), 2), vec![43..53, 53..64]);
    assert_eq!(split(&(0..128), 4), vec![0..32, 32..64, 64..96, 96..128]);
    assert_eq!(split(&(5..6), 4), vec![5..6]);
    assert_eq!(split(&(7..10), 0), vec![7..10]);
    assert_eq!(split(&(3..3), 2), Vec::<std::ops::Range<u32>>::new());
    for parts in 1..6 {
        for start in 0..5 {
            for len in 0..12 {
                let got = split(&(start..start + len), parts);
                let mut next = start;
                for r in &got {
                    assert!(!r.is_empty() && r.start == next, "{got:?}");
                    next = r.end;
                }
                assert_eq!(next, start + len, "{got:?}");
                assert!(got.len() <= parts, "{got:?}");
            }
        }
    }
}

#[test]
fn a_rescales_background_compaction_waits_for_the_processs_restores() {
    let restoring = super::Restoring::start();
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        super::wait_for_restores();
        done.send(()).unwrap();
    });
    assert_eq!(
        finished.recv_timeout(std::time::Duration::from_millis(200)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout),
        "returned while a restore ran"
    );
    drop(restoring);
    finished.recv().unwrap();
    waiter.join().unwrap();
}

/// Waits (up to a minute) until `gone` holds; false if it never did.
fn eventually(mut gone: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if gone() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    gone()
}

#[test]
fn a_dead_processs_directories_are_moved_aside_at_open_and_deleted_in_the_background() {
    if !Path::new("/proc/self").exists() {
        return; // liveness is not judged without /proc: nothing is removed
    }
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let local = &cfg.local_dir;
    let tag = weir_core::scratch::owner_tag();
    let hash = tag.rsplit('.').next().unwrap();
    // A process killed with -9 left an instance directory with a database, and an earlier
    // process ended while it was still emptying the trash.
    let dead = local.join(format!("op1-0-4294967295.0.{hash}-0-1"));
    std::fs::create_dir_all(dead.join("db")).unwrap();
    std::fs::write(dead.join("db").join("000007.sst"), vec![1u8; 4096]).unwrap();
    let left = local
        .join(crate::rocks::TRASH_DIR)
        .join("op2-1-4294967294.0.0-3-4");
    std::fs::create_dir_all(left.join("db")).unwrap();
    // A running process's directory (this one's, as another instance) stays.
    let alive = local.join(format!("op3-0-{tag}-99-5"));
    std::fs::create_dir_all(alive.join("db")).unwrap();

    let (key, ctx) = open(&cfg, 0, 1, &[]).unwrap();
    assert!(
        !dead.exists(),
        "the dead process's directory is still in place"
    );
    assert!(
        eventually(|| !local.join(crate::rocks::TRASH_DIR).exists()),
        "the trash was not emptied: {:?}",
        std::fs::read_dir(local.join(crate::rocks::TRASH_DIR))
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    assert!(
        alive.join("db").is_dir(),
        "a running process's directory was removed"
    );
    drop((key, ctx));
    std::fs::remove_dir_all(&alive).unwrap();
    nothing_left_in(&cfg);
}
