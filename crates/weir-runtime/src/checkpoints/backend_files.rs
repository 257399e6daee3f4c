//! Bringing a checkpoint's persistent-backend files (RocksDB's) back to local disk for a
//! restore, and handing each new subtask the old instances whose key groups overlap its own.
//!
//! Local recovery first: a process restarted on the same machine finds the local copy its
//! predecessor kept of the checkpoint (the directory the backend took it in, which the
//! state file records) and, when that copy holds exactly the checkpoint's files (names and
//! sizes), moves it into the attempt's restore directory instead of fetching anything.
//! Otherwise every file is fetched from checkpoint storage, several at once
//! ([`CheckpointStorage::fetch_file`]: hard links out of a local storage directory on the
//! same file system, else streamed copies or downloads). What a backend does with the files
//! is the backend's.
//!
//! A process that runs only some of the job's subtasks (a cluster worker) brings back only
//! the old instances whose key groups overlap those of its own subtasks ([`needed_by`]):
//! without a rescale exactly its own subtasks' instances.

use super::{STORE_THREADS, parallel_map, storage_err};
use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use weir_checkpoint::{CheckpointStorage, FileEntry};
use weir_core::checkpoint::{LocalFile, RestoredInstance};
use weir_core::{Error, Result};

/// One old subtask's backend instance, before its files are local.
pub(crate) struct OldInstance {
    /// The node it belongs to.
    pub node: usize,
    /// The old subtask.
    pub subtask: usize,
    /// The key groups it owned.
    pub key_groups: Range<u32>,
    /// Its files as its snapshot listed them (`path`: where the old process had them).
    pub files: Vec<LocalFile>,
    /// Their manifest entries, in the same order.
    pub entries: Vec<FileEntry>,
}

/// Keeps the instances of `old` that a process running the subtasks `runs` ((node,
/// subtask) pairs; `None`: every subtask) needs: those whose key groups overlap the key
/// groups of one of its subtasks of the same operator, at the operator's new parallelism
/// `parallelism[node]`. Without a rescale that is exactly the instances of its own
/// subtasks; with one, those overlapping them.
pub(crate) fn needed_by(
    old: Vec<OldInstance>,
    runs: Option<&HashSet<(usize, usize)>>,
    parallelism: &[usize],
    max_parallelism: usize,
) -> Vec<OldInstance> {
    let Some(runs) = runs else { return old };
    old.into_iter()
        .filter(|inst| {
            let p = parallelism[inst.node];
            (0..p).any(|s| {
                let range = weir_core::data::key_group_range(s, max_parallelism, p);
                runs.contains(&(inst.node, s))
                    && inst.key_groups.start < range.end
                    && range.start < inst.key_groups.end
            })
        })
        .collect()
}

/// How the old instances' files came back (for the log, and tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fetched {
    /// Instances restored from the local copy of local recovery.
    pub local: usize,
    /// Instances whose files were fetched from checkpoint storage.
    pub fetched: usize,
    /// Files fetched from checkpoint storage.
    pub files: usize,
    /// Bytes of the files fetched from checkpoint storage.
    pub bytes: u64,
}

/// Brings the files of `old` into `local` (one directory per instance) and returns the
/// instances as backends receive them, in the order of `old`.
pub(crate) fn fetch(
    storage: &CheckpointStorage,
    checkpoint: &Path,
    old: Vec<OldInstance>,
    local: &Path,
    local_recovery: bool,
) -> Result<(Vec<(usize, RestoredInstance)>, Fetched)> {
    let mut out = Vec::with_capacity(old.len());
    let mut figures = Fetched::default();
    // (target, entry) of every file to fetch.
    let mut work: Vec<(PathBuf, FileEntry)> = Vec::new();
    for inst in old {
        let dir = local.join(format!("op{}-{}", inst.node, inst.subtask));
        let moved = if local_recovery {
            recover_locally(&inst, &dir)
        } else {
            None
        };
        let local_copy = moved.is_some();
        let files = match moved {
            Some(files) => {
                figures.local += 1;
                tracing::info!(node = inst.node, subtask = inst.subtask, dir = %dir.display(), "restoring from the local copy of the checkpoint (local recovery)");
                files
            }
            None => {
                figures.fetched += 1;
                std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
                let mut files = Vec::with_capacity(inst.files.len());
                for (f, entry) in inst.files.iter().zip(&inst.entries) {
                    let target = dir.join(local_name(f)?);
                    work.push((target.clone(), entry.clone()));
                    files.push(LocalFile {
                        path: target,
                        name: f.name.clone(),
                        shared: f.shared,
                    });
                }
                files
            }
        };
        out.push((
            inst.node,
            RestoredInstance {
                key_groups: inst.key_groups,
                files,
                local_copy,
            },
        ));
    }
    figures.files = work.len();
    figures.bytes = work.iter().map(|(_, e)| e.size).sum();
    for r in parallel_map(&mut work, STORE_THREADS, |(target, entry)| {
        storage
            .fetch_file(checkpoint, entry, target)
            .map_err(storage_err)
    }) {
        r?;
    }
    Ok((out, figures))
}

/// The file name the backend gave `f` (the last component of where it had it).
///
/// A cluster coordinator before this release recorded a file a restored worker had left
/// out at its stored copy, whose last component is the storage name
/// (`<instance>-000008.sst`): that name is cut back to the backend's (`000008.sst`, the
/// part after the instance; a shared file's own name has no `-`), so such checkpoints
/// restore too.
fn local_name(f: &LocalFile) -> Result<&std::ffi::OsStr> {
    let name = f
        .path
        .file_name()
        .ok_or_else(|| Error::Config(format!("checkpoint file {} has no local name", f.name)))?;
    if f.shared
        && name == f.name.as_str()
        && let Some((_, own)) = f.name.rsplit_once('-')
    {
        return Ok(std::ffi::OsStr::new(own));
    }
    Ok(name)
}

/// Local recovery: when every file of `inst` is still where the old process kept it, with
/// the size the checkpoint records, moves that directory to `dir` and returns the files
/// there. `None` (and nothing moved) when the copy is missing, stale, or elsewhere.
fn recover_locally(inst: &OldInstance, dir: &Path) -> Option<Vec<LocalFile>> {
    let kept = inst.files.first()?.path.parent()?.to_path_buf();
    let matches = inst.files.iter().zip(&inst.entries).all(|(f, e)| {
        f.path.parent() == Some(kept.as_path())
            && std::fs::metadata(&f.path).is_ok_and(|m| m.is_file() && m.len() == e.size)
    });
    // Nothing else in the directory either (a copy of another checkpoint into the same
    // place would not be this one).
    let count = std::fs::read_dir(&kept).map_or(0, |d| d.count());
    if !matches || count != inst.files.len() {
        tracing::info!(node = inst.node, subtask = inst.subtask, dir = %kept.display(), "no usable local copy of the checkpoint; fetching its files from checkpoint storage");
        return None;
    }
    // Moved, so that the old process's leftovers can be removed meanwhile (any process
    // removes the working directories of dead ones) without touching it.
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).ok()?;
    }
    std::fs::rename(&kept, dir).ok()?;
    Some(
        inst.files
            .iter()
            .filter_map(|f| {
                Some(LocalFile {
                    path: dir.join(f.path.file_name()?),
                    name: f.name.clone(),
                    shared: f.shared,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_checkpoint::{CheckpointKind, Manifest};
    use weir_core::ids::CheckpointId;

    /// A checkpoint whose one old instance kept its files in `kept` (an SST file and a
    /// manifest file, as RocksDB's checkpoint has them), stored in `storage`.
    fn checkpoint(root: &Path) -> (CheckpointStorage, PathBuf, OldInstance) {
        let storage = CheckpointStorage::open(root.join("checkpoints")).unwrap();
        let kept = root.join("local").join("op1-0-owner-0-1").join("chk-1");
        std::fs::create_dir_all(&kept).unwrap();
        std::fs::write(kept.join("000009.sst"), vec![7u8; 10_000]).unwrap();
        std::fs::write(kept.join("MANIFEST-000005"), b"manifest").unwrap();
        let writer = storage
            .begin(CheckpointId(1), CheckpointKind::Checkpoint)
            .unwrap();
        let files = vec![
            LocalFile {
                path: kept.join("000009.sst"),
                name: "op1-0-owner-0-1-000009.sst".into(),
                shared: true,
            },
            LocalFile {
                path: kept.join("MANIFEST-000005"),
                name: "op1-0-owner-0-1-1-MANIFEST-000005".into(),
                shared: false,
            },
        ];
        let entries = vec![
            writer.link_shared(&files[0].name, &files[0].path).unwrap(),
            writer
                .write_file(&files[1].name, &std::fs::read(&files[1].path).unwrap())
                .unwrap(),
        ];
        let mut manifest = Manifest::new("job", CheckpointId(1), CheckpointKind::Checkpoint, 128);
        manifest.operators.push(weir_checkpoint::OperatorManifest {
            uid: "op".into(),
            name: "op".into(),
            parallelism: 1,
            subtasks: vec![weir_checkpoint::SubtaskManifest {
                subtask: 0,
                files: entries.clone(),
                operator_state: None,
                watermark: None,
            }],
        });
        let path = writer.finish(manifest).unwrap();
        let inst = OldInstance {
            node: 1,
            subtask: 0,
            key_groups: 0..128,
            files,
            entries,
        };
        (storage, path, inst)
    }

    fn contents(r: &RestoredInstance) -> Vec<(String, Vec<u8>)> {
        r.files
            .iter()
            .map(|f| (f.name.clone(), std::fs::read(&f.path).unwrap()))
            .collect()
    }

    fn want() -> Vec<(String, Vec<u8>)> {
        vec![
            ("op1-0-owner-0-1-000009.sst".into(), vec![7u8; 10_000]),
            (
                "op1-0-owner-0-1-1-MANIFEST-000005".into(),
                b"manifest".to_vec(),
            ),
        ]
    }

    /// Old instances of node 1 at parallelism `p` (128 key groups), without files.
    fn instances(p: usize) -> Vec<OldInstance> {
        (0..p)
            .map(|s| OldInstance {
                node: 1,
                subtask: s,
                key_groups: weir_core::data::key_group_range(s, 128, p),
                files: Vec::new(),
                entries: Vec::new(),
            })
            .collect()
    }

    fn subtasks(old: &[OldInstance]) -> Vec<usize> {
        old.iter().map(|i| i.subtask).collect()
    }

    #[test]
    fn a_process_needs_only_the_instances_of_its_own_subtasks() {
        let runs: HashSet<(usize, usize)> = [(1, 0), (1, 3), (2, 1)].into();
        let kept = needed_by(instances(4), Some(&runs), &[1, 4, 4], 128);
        assert_eq!(subtasks(&kept), vec![0, 3]);
        let all = needed_by(instances(4), None, &[1, 4, 4], 128);
        assert_eq!(subtasks(&all), vec![0, 1, 2, 3]);
        let none = needed_by(instances(4), Some(&HashSet::new()), &[1, 4, 4], 128);
        assert!(none.is_empty());
    }

    #[test]
    fn after_a_rescale_a_process_needs_the_instances_overlapping_its_subtasks() {
        // 4 -> 3: key groups 0..32, 32..64, 64..96, 96..128 become 0..43, 43..86, 86..128.
        let at = |runs: &[(usize, usize)]| {
            let runs: HashSet<(usize, usize)> = runs.iter().copied().collect();
            subtasks(&needed_by(instances(4), Some(&runs), &[1, 3], 128))
        };
        assert_eq!(at(&[(1, 0)]), vec![0, 1]);
        assert_eq!(at(&[(1, 1)]), vec![1, 2]);
        assert_eq!(at(&[(1, 2)]), vec![2, 3]);
        assert_eq!(at(&[(1, 0), (1, 2)]), vec![0, 1, 2, 3]);
        // 4 -> 8: each new subtask lies within one old instance.
        let runs: HashSet<(usize, usize)> = [(1, 5)].into();
        let kept = needed_by(instances(4), Some(&runs), &[1, 8], 128);
        assert_eq!(subtasks(&kept), vec![2]);
    }

    #[test]
    fn an_intact_local_copy_is_used_without_fetching() {
        let tmp = tempfile::tempdir().unwrap();
        let (storage, path, inst) = checkpoint(tmp.path());
        let kept = inst.files[0].path.parent().unwrap().to_path_buf();
        let restore = tmp.path().join("restore");
        let (got, figures) = fetch(&storage, &path, vec![inst], &restore, true).unwrap();
        assert_eq!(
            figures,
            Fetched {
                local: 1,
                fetched: 0,
                files: 0,
                bytes: 0
            }
        );
        assert_eq!(contents(&got[0].1), want());
        assert!(got[0].1.files[0].path.starts_with(&restore));
        assert!(!kept.exists(), "the local copy was moved, not copied");
    }

    #[test]
    fn a_stale_local_copy_falls_back_to_checkpoint_storage() {
        let tmp = tempfile::tempdir().unwrap();
        let (storage, path, inst) = checkpoint(tmp.path());
        // The process went on after the checkpoint: a file of another size under that name.
        std::fs::write(&inst.files[1].path, b"a longer manifest").unwrap();
        let restore = tmp.path().join("restore");
        let (got, figures) = fetch(&storage, &path, vec![inst], &restore, true).unwrap();
        assert_eq!((figures.local, figures.fetched, figures.files), (0, 1, 2));
        assert_eq!(contents(&got[0].1), want());
    }

    #[test]
    fn a_local_copy_with_another_file_falls_back_to_checkpoint_storage() {
        let tmp = tempfile::tempdir().unwrap();
        let (storage, path, inst) = checkpoint(tmp.path());
        let kept = inst.files[0].path.parent().unwrap().to_path_buf();
        std::fs::write(kept.join("000010.sst"), b"later").unwrap();
        let (got, figures) =
            fetch(&storage, &path, vec![inst], &tmp.path().join("r"), true).unwrap();
        assert_eq!((figures.local, figures.fetched), (0, 1));
        assert_eq!(contents(&got[0].1), want());
    }

    #[test]
    fn a_missing_local_copy_falls_back_to_checkpoint_storage() {
        let tmp = tempfile::tempdir().unwrap();
        let (storage, path, inst) = checkpoint(tmp.path());
        std::fs::remove_dir_all(tmp.path().join("local")).unwrap();
        let (got, figures) =
            fetch(&storage, &path, vec![inst], &tmp.path().join("r"), true).unwrap();
        assert_eq!((figures.local, figures.fetched, figures.files), (0, 1, 2));
        assert_eq!(contents(&got[0].1), want());
    }

    #[test]
    fn without_local_recovery_files_come_from_checkpoint_storage() {
        let tmp = tempfile::tempdir().unwrap();
        let (storage, path, inst) = checkpoint(tmp.path());
        let kept = inst.files[0].path.parent().unwrap().to_path_buf();
        let (got, figures) =
            fetch(&storage, &path, vec![inst], &tmp.path().join("r"), false).unwrap();
        assert_eq!((figures.local, figures.fetched), (0, 1));
        assert_eq!(contents(&got[0].1), want());
        assert!(kept.exists());
    }

    /// A checkpoint a cluster coordinator wrote after a restore, before this release,
    /// recorded a restored file at its stored copy (the storage name as its last
    /// component): it is fetched under the backend's own name all the same.
    #[test]
    fn a_restored_file_recorded_at_its_stored_copy_gets_its_own_name_back() {
        let tmp = tempfile::tempdir().unwrap();
        let (storage, path, mut inst) = checkpoint(tmp.path());
        inst.files[0].path = storage.dir().join("shared").join(&inst.files[0].name);
        let (got, _) = fetch(&storage, &path, vec![inst], &tmp.path().join("r"), false).unwrap();
        let names: Vec<_> = got[0]
            .1
            .files
            .iter()
            .map(|f| f.path.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["000009.sst", "MANIFEST-000005"]);
        assert_eq!(contents(&got[0].1), want());
    }

    #[test]
    fn a_file_missing_from_storage_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let (storage, path, inst) = checkpoint(tmp.path());
        let stored = storage.dir().join("shared").join(&inst.files[0].name);
        std::fs::remove_file(&stored).unwrap();
        let e = fetch(&storage, &path, vec![inst], &tmp.path().join("r"), false)
            .expect_err("fails")
            .to_string();
        assert!(
            e.contains(&stored.display().to_string()) && e.contains("missing"),
            "{e}"
        );
    }
}
