//! Checking the checksum of every file of a checkpoint in a directory, several files at
//! once: the slow part of [`super::CheckpointStorage::load`], which reads the whole state.
//! A restore may run it while the job already runs
//! ([`super::CheckpointStorage::verify_checksums`]), so it can be stopped part-way.

use super::layout;
use super::manifest::Manifest;
use crate::error::Result;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, PoisonError};

/// Checksums verified at once (at most; no more than the machine's cores).
const VERIFY_THREADS: usize = 4;

/// Verifies the size and checksum of every file `manifest` (of checkpoint `dir`) lists, on
/// up to [`VERIFY_THREADS`] threads: `Ok(true)` when all verify, `Ok(false)` when `stop`
/// was set first, else the error of the first bad file in the manifest's order.
pub(super) fn checksums(dir: &Path, manifest: &Manifest, stop: &AtomicBool) -> Result<bool> {
    // Tests hold the reading back (`sleep:MS`), before a restore or while a job runs.
    weir_core::failpoint::hit("restore.verify");
    let shared = layout::shared_dir_of(dir);
    let files: Vec<(PathBuf, u64, u32)> = manifest
        .files()
        .map(|f| {
            let file = if f.shared {
                shared.join(&f.name)
            } else {
                dir.join(&f.name)
            };
            (file, f.size, f.crc32)
        })
        .collect();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, VERIFY_THREADS)
        .min(files.len().max(1));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let errors = Mutex::new(Vec::new());
    let work = || {
        while !failed.load(Relaxed) && !stop.load(Relaxed) {
            let i = next.fetch_add(1, Relaxed);
            let Some((file, size, crc32)) = files.get(i) else {
                break;
            };
            if let Err(e) = layout::verify(dir, file, *size, *crc32) {
                failed.store(true, Relaxed);
                errors
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((i, e));
            }
        }
    };
    if threads <= 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(work);
            }
        });
    }
    let errors = errors.into_inner().unwrap_or_else(PoisonError::into_inner);
    match errors.into_iter().min_by_key(|(i, _)| *i) {
        Some((_, e)) => Err(e),
        None => Ok(next.load(Relaxed) >= files.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CheckpointKind, CheckpointStorage};

    /// A checkpoint with `n` shared files of 1 KiB each.
    fn checkpoint(n: usize) -> (tempfile::TempDir, CheckpointStorage, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(tmp.path().join("ck")).unwrap();
        let id = storage.next_id().unwrap();
        let writer = storage.begin(id, CheckpointKind::Checkpoint).unwrap();
        let mut manifest = Manifest::new("job", id, CheckpointKind::Checkpoint, 128);
        let files = (0..n)
            .map(|i| {
                writer
                    .write_shared(&format!("{i:06}.sst"), &vec![i as u8; 1024])
                    .unwrap()
            })
            .collect();
        manifest.operators.push(crate::OperatorManifest {
            uid: "op".into(),
            name: "op".into(),
            parallelism: 1,
            subtasks: vec![crate::SubtaskManifest {
                subtask: 0,
                files,
                operator_state: None,
                watermark: None,
            }],
        });
        let path = writer.finish(manifest).unwrap();
        (tmp, storage, path)
    }

    #[test]
    fn every_file_is_read_and_the_first_bad_one_in_order_is_named() {
        let (tmp, storage, path) = checkpoint(12);
        assert!(
            storage
                .verify_checksums(&path, &AtomicBool::new(false))
                .unwrap()
        );
        // Two files altered in place, sizes kept: the earlier one is reported, whichever
        // thread read it.
        for i in [9, 4] {
            let f = tmp.path().join(format!("ck/shared/{i:06}.sst"));
            std::fs::write(&f, vec![0xff; 1024]).unwrap();
        }
        let e = storage
            .verify_checksums(&path, &AtomicBool::new(false))
            .unwrap_err();
        assert!(e.to_string().contains("000004.sst"), "{e}");
        assert!(e.is_unusable_checkpoint(), "{e}");
    }

    #[test]
    fn a_stopped_verification_says_it_did_not_finish() {
        let (_tmp, storage, path) = checkpoint(3);
        assert!(
            !storage
                .verify_checksums(&path, &AtomicBool::new(true))
                .unwrap()
        );
    }
}
