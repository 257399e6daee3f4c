//! Scratch directories named after the process that owns them (RocksDB working
//! directories, local copies of a checkpoint being restored, a coordinator's staging area),
//! and telling from a file name or record whether its process still runs.
//!
//! A process killed with SIGKILL cannot remove its scratch directories; the next weir
//! process on the machine removes those whose owner is gone. A directory may be shared by
//! processes that cannot see each other's pids — containers with their own pid namespace,
//! or hosts mounting one volume — so a name carries an owner tag
//! (`<pid>.<start time>.<machine>`, [`owner_tag`]) and only entries of this very machine
//! and pid namespace are ever judged. Owns no other I/O.

use std::path::Path;
use std::sync::OnceLock;

/// A process as other processes can recognise it later: host, machine, pid, start time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessId {
    /// Host name.
    pub host: String,
    /// Kernel boot id and pid namespace (`None` without `/proc`): two processes compare pids
    /// only when these are equal.
    pub machine: Option<String>,
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/<pid>/stat`), so that a reused pid is
    /// not taken for the process.
    pub start: Option<u64>,
}

/// Whether a process still runs, as far as this one can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Same machine and pid namespace, and that process (pid and start time) runs; it may be
    /// stopped.
    Alive,
    /// Same machine and pid namespace, and no such process runs (the pid is free, reused,
    /// or a zombie).
    Gone,
    /// Another host or pid namespace, or no way to tell.
    Unknown,
}

impl ProcessId {
    /// This process.
    pub fn current() -> &'static ProcessId {
        static ME: OnceLock<ProcessId> = OnceLock::new();
        ME.get_or_init(|| {
            let read = |p: &str| {
                std::fs::read_to_string(p)
                    .ok()
                    .map(|s| s.trim().to_string())
            };
            let host = read("/proc/sys/kernel/hostname")
                .filter(|h| !h.is_empty())
                .or_else(|| std::env::var("HOSTNAME").ok())
                .unwrap_or_else(|| "unknown".into());
            let boot = read("/proc/sys/kernel/random/boot_id");
            let ns = std::fs::read_link("/proc/self/ns/pid")
                .ok()
                .map(|p| p.to_string_lossy().into_owned());
            let machine = match (boot, ns) {
                (Some(b), Some(n)) => Some(format!("{b}/{n}")),
                _ => None,
            };
            let pid = std::process::id();
            ProcessId {
                host,
                machine,
                pid,
                start: process_start(pid).ok().flatten(),
            }
        })
    }

    /// Whether the process `other` still runs, seen from this one.
    pub fn liveness_of(&self, other: &ProcessId) -> Liveness {
        if self.machine.is_none() || other.machine != self.machine || other.host != self.host {
            return Liveness::Unknown;
        }
        match process_start(other.pid) {
            Ok(None) => Liveness::Gone,
            Ok(Some(start)) if other.start.is_some_and(|s| s != start) => Liveness::Gone,
            Ok(Some(_)) => Liveness::Alive,
            Err(()) => Liveness::Unknown,
        }
    }

    /// A short stable fingerprint of host and machine (FNV-1a, hex).
    fn machine_hash(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let text = format!("{}/{}", self.host, self.machine.as_deref().unwrap_or(""));
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// The start time of process `pid`: `Ok(None)` when it does not run (or is a zombie),
/// `Err` when this system cannot tell.
fn process_start(pid: u32) -> Result<Option<u64>, ()> {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return if Path::new("/proc/self/stat").exists() {
                Ok(None)
            } else {
                Err(())
            };
        }
        Err(_) => return Err(()),
    };
    // "pid (comm) state ppid ..." — comm may hold spaces and parentheses: split after the
    // last ')'. Field 3 is the state, field 22 the start time.
    let rest = stat.rsplit_once(')').ok_or(())?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if matches!(fields.first(), Some(&"Z") | Some(&"X") | Some(&"x")) {
        return Ok(None);
    }
    fields
        .get(19)
        .and_then(|f| f.parse().ok())
        .map(Some)
        .ok_or(())
}

/// This process's owner tag for scratch names: `<pid>.<start time>.<machine>` (no `-`, so
/// it is one field of a dash-separated name).
pub fn owner_tag() -> String {
    let me = ProcessId::current();
    format!("{}.{}.{}", me.pid, me.start.unwrap_or(0), me.machine_hash())
}

/// Removes the entries of `dir` whose owner tag (as `tag_of` reads it from the entry's
/// name) names a process of this machine and pid namespace that no longer runs. Entries of
/// this process, of running processes, of other hosts or pid namespaces, with names
/// `tag_of` does not recognise, and everything on a system without `/proc` are left alone.
///
/// ```
/// use weir_core::scratch::{owner_tag, remove_orphans};
/// let dir = tempfile::tempdir().unwrap();
/// let tag = owner_tag();
/// let hash = tag.rsplit('.').next().unwrap();
/// let mine = dir.path().join(format!("scratch-{tag}"));
/// let gone = dir.path().join(format!("scratch-4294967295.0.{hash}"));
/// let elsewhere = dir.path().join("scratch-4294967295.0.0123456789abcdef");
/// for d in [&mine, &gone, &elsewhere] {
///     std::fs::create_dir(d).unwrap();
/// }
/// remove_orphans(dir.path(), |name| name.strip_prefix("scratch-"));
/// assert!(mine.exists());
/// assert!(elsewhere.exists(), "another machine's entries are never judged");
/// assert_eq!(gone.exists(), !std::path::Path::new("/proc/self").exists());
/// ```
pub fn remove_orphans(dir: &Path, tag_of: impl Fn(&str) -> Option<&str>) {
    for orphan in orphans(dir, tag_of) {
        let _ = std::fs::remove_dir_all(orphan);
    }
}

/// The entries of `dir` that [`remove_orphans`] would remove: those whose owner tag names
/// a process of this machine and pid namespace that no longer runs.
///
/// ```
/// use weir_core::scratch::{orphans, owner_tag};
/// let dir = tempfile::tempdir().unwrap();
/// let mine = dir.path().join(format!("scratch-{}", owner_tag()));
/// std::fs::create_dir(&mine).unwrap();
/// assert!(orphans(dir.path(), |name| name.strip_prefix("scratch-")).is_empty());
/// ```
pub fn orphans(dir: &Path, tag_of: impl Fn(&str) -> Option<&str>) -> Vec<std::path::PathBuf> {
    let me = ProcessId::current();
    let mut found = Vec::new();
    if me.machine.is_none() {
        return found;
    }
    let my_hash = me.machine_hash();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(tag) = tag_of(&name) else { continue };
        let mut fields = tag.split('.');
        let (Some(pid), Some(start), Some(hash), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
            continue;
        };
        if hash != my_hash || pid == me.pid {
            continue;
        }
        let owner = ProcessId {
            host: me.host.clone(),
            machine: me.machine.clone(),
            pid,
            start: (start != 0).then_some(start),
        };
        if me.liveness_of(&owner) == Liveness::Gone {
            found.push(e.path());
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_others_are_judged_only_on_this_machine() {
        let me = ProcessId::current();
        if me.machine.is_none() {
            return;
        }
        assert_eq!(me.liveness_of(me), Liveness::Alive);
        let reused = ProcessId {
            start: me.start.map(|s| s + 1),
            ..me.clone()
        };
        assert_eq!(me.liveness_of(&reused), Liveness::Gone, "a reused pid");
        let gone = ProcessId {
            pid: u32::MAX - 1,
            ..me.clone()
        };
        assert_eq!(me.liveness_of(&gone), Liveness::Gone);
        let elsewhere = ProcessId {
            host: "another-host".into(),
            ..gone.clone()
        };
        assert_eq!(me.liveness_of(&elsewhere), Liveness::Unknown);
        let other_ns = ProcessId {
            machine: Some("boot/pid:[1]".into()),
            ..gone
        };
        assert_eq!(me.liveness_of(&other_ns), Liveness::Unknown);
    }

    #[test]
    fn a_live_process_of_this_machine_keeps_its_entries() {
        let me = ProcessId::current();
        if me.machine.is_none() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // pid 1 runs in every pid namespace; with its real start time it is alive.
        let init_start = process_start(1).ok().flatten().unwrap_or(0);
        let init = dir
            .path()
            .join(format!("s-1.{init_start}.{}", me.machine_hash()));
        let reused = dir
            .path()
            .join(format!("s-1.{}.{}", init_start + 1, me.machine_hash()));
        let odd = dir.path().join("s-12345");
        for d in [&init, &reused, &odd] {
            std::fs::create_dir(d).unwrap();
        }
        remove_orphans(dir.path(), |n| n.strip_prefix("s-"));
        assert!(init.exists());
        assert!(
            !reused.exists(),
            "pid 1 now is another process than the one named"
        );
        assert!(odd.exists(), "names without a full tag are left alone");
    }
}
