//! Scratch directories named after the process that owns them (RocksDB working
//! directories, local copies of a checkpoint being restored). A process killed with
//! SIGKILL cannot remove its own; the next weir process on the machine removes those whose
//! owner is gone.

use std::path::Path;

/// Removes the entries of `dir` whose owner process, as `pid_of` reads it from the entry's
/// name, no longer runs. Entries of this process, entries `pid_of` does not recognise, and
/// everything on a system without `/proc` are left alone.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let mine = dir.path().join(format!("scratch-{}", std::process::id()));
/// let gone = dir.path().join("scratch-4294967295");
/// std::fs::create_dir(&mine).unwrap();
/// std::fs::create_dir(&gone).unwrap();
/// weir_core::scratch::remove_orphans(dir.path(), |name| {
///     name.strip_prefix("scratch-")?.parse().ok()
/// });
/// assert!(mine.exists());
/// assert!(!gone.exists());
/// ```
pub fn remove_orphans(dir: &Path, pid_of: impl Fn(&str) -> Option<u32>) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(pid) = pid_of(&name)
            && pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
