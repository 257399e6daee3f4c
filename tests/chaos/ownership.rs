//! One owner per directory, with real `file_sum` processes: a second run on the same
//! checkpoint directory, or a second job on the same output directory, is refused with the
//! owner named; a SIGKILLed owner is taken over at once; a frozen owner (SIGSTOP) is taken
//! over once its lease has run out, and when thawed it stops without writing a checkpoint
//! or committing output. The committed output is checked as everywhere in these tests: for
//! every key, exactly its prefix sums, once.

use crate::harness::{Scenario, has_complete_checkpoint, stderr_of, wait_for, wait_within};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;
use weir_checkpoint::ownership::current_owner;

/// A child process that is thawed and killed if the test ends early, so that a failing
/// test leaves no stopped process behind.
struct Guarded(Option<Child>);

impl Guarded {
    fn new(c: Child) -> Self {
        Guarded(Some(c))
    }
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("child")
    }
    fn id(&self) -> u32 {
        self.0.as_ref().expect("child").id()
    }
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.id().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }
    /// Waits for the process to exit; returns its success and standard error.
    fn finish(mut self, limit: Duration) -> (bool, String) {
        let mut c = self.0.take().expect("child");
        let status = wait_within(&mut c, limit);
        (status.success(), stderr_of(&mut c))
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut()
            && c.try_wait().ok().flatten().is_none()
        {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(c.id().to_string())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// The pid of the run that owns `dir` now, if one does.
fn owner_pid(dir: &Path) -> Option<u32> {
    current_owner(dir).ok().flatten().map(|r| r.pid)
}

/// The pid in the newest owner record of `dir`, released or not.
fn last_pid(dir: &Path) -> Option<u32> {
    let newest = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix(".weir-owner-")
                .is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit()))
        })
        .max()?;
    let text = std::fs::read_to_string(dir.join(newest)).ok()?;
    let record: weir_checkpoint::OwnerRecord = serde_json::from_str(&text).ok()?;
    Some(record.pid)
}

/// Starts a throttled `file_sum` (2 subtasks) and waits until it owns its directories and
/// has completed a checkpoint.
fn start_owner(s: &Scenario, lease_ms: u64) -> Guarded {
    let child = s
        .command(2, Some(8_000), 50)
        .arg("--lease-ms")
        .arg(lease_ms.to_string())
        .spawn()
        .expect("start file_sum");
    let owner = Guarded::new(child);
    wait_for("a first checkpoint", Duration::from_secs(30), || {
        has_complete_checkpoint(&s.checkpoints)
    });
    assert_eq!(owner_pid(&s.checkpoints), Some(owner.id()));
    assert_eq!(owner_pid(&s.output), Some(owner.id()));
    owner
}

#[test]
fn a_second_run_on_the_same_checkpoint_directory_is_refused_naming_the_owner() {
    let s = Scenario::new(30_000, 30, 31);
    let owner = start_owner(&s, 15_000);
    let out = s
        .command(2, None, 50)
        .output()
        .expect("run a second file_sum");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the second run must be refused:\n{err}"
    );
    let expected = format!(
        "the checkpoint directory {} is owned by job 'file_sum' (pid {} on host ",
        s.checkpoints.display(),
        owner.id()
    );
    assert!(err.contains(&expected), "expected {expected:?} in:\n{err}");
    assert!(err.contains("Stop that run"), "no advice in:\n{err}");
    // The refused run touched nothing: the owner finishes with exact output.
    let (ok, err) = owner.finish(Duration::from_secs(120));
    assert!(ok, "the owner failed:\n{err}");
    s.check();
}

#[test]
fn a_second_job_writing_into_the_same_output_directory_is_refused() {
    let s = Scenario::new(30_000, 30, 32);
    let owner = start_owner(&s, 15_000);
    let other_checkpoints = s.checkpoints.with_file_name("ck-other");
    let out = s
        .command(2, None, 50)
        .arg("--checkpoint-dir")
        .arg(&other_checkpoints)
        .output()
        .expect("run a second file_sum");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the second job must be refused:\n{err}"
    );
    let expected = format!(
        "{} is owned by job 'file_sum' (pid {} on host ",
        s.output.display(),
        owner.id()
    );
    assert!(err.contains("output directory of sink"), "{err}");
    assert!(err.contains(&expected), "expected {expected:?} in:\n{err}");
    assert!(
        err.contains(&format!("it also owns {}", s.checkpoints.display())),
        "the owner's checkpoint directory is not named:\n{err}"
    );
    // The refused job gave its own checkpoint directory back.
    assert_eq!(owner_pid(&other_checkpoints), None);
    let (ok, err) = owner.finish(Duration::from_secs(120));
    assert!(ok, "the owner failed:\n{err}");
    s.check();
}

#[test]
fn a_sigkilled_owner_is_taken_over_at_once() {
    let s = Scenario::new(30_000, 30, 33);
    // A lease of an hour: waiting for it would time the test out.
    let mut owner = start_owner(&s, 3_600_000);
    owner.child().kill().expect("SIGKILL file_sum");
    owner.child().wait().expect("reap file_sum");
    let next = s
        .command(2, None, 50)
        .arg("--lease-ms")
        .arg("3600000")
        .spawn()
        .expect("restart file_sum");
    let (ok, err) = Guarded::new(next).finish(Duration::from_secs(120));
    assert!(ok, "the restart failed:\n{err}");
    assert!(!err.contains("waiting up to"), "the restart waited:\n{err}");
    s.check();
}

#[test]
fn a_frozen_owner_is_taken_over_after_its_lease_and_stops_when_thawed() {
    let s = Scenario::new(40_000, 40, 34);
    let lease_ms = 1_500;
    let owner = start_owner(&s, lease_ms);
    owner.signal("STOP");
    // The frozen owner's last record runs out (by the wall clock) ...
    wait_for(
        "the frozen owner's lease to run out",
        Duration::from_secs(30),
        || {
            current_owner(&s.checkpoints)
                .expect("read the owner record")
                .is_some_and(|r| unix_millis() > r.renewed_ms + r.lease_ms)
        },
    );
    // ... then a new run watches it for a whole lease and takes over.
    let next = s
        .command(2, Some(8_000), 50)
        .arg("--lease-ms")
        .arg(lease_ms.to_string())
        .spawn()
        .expect("start the replacement");
    let mut next = Guarded::new(next);
    let next_pid = next.id();
    wait_for(
        "the replacement to take over",
        Duration::from_secs(30),
        || {
            let exited = next.child().try_wait().expect("poll the replacement");
            if let Some(status) = exited {
                // It may only have finished after taking over (its last records say so).
                let mut c = next.0.take().expect("child");
                assert!(
                    status.success() && last_pid(&s.checkpoints) == Some(next_pid),
                    "the replacement ended without taking over ({status}):\n{}",
                    stderr_of(&mut c)
                );
                next.0 = Some(c);
                return true;
            }
            last_pid(&s.checkpoints) == Some(next_pid) && last_pid(&s.output) == Some(next_pid)
        },
    );
    // Thawed while the replacement runs, the old owner must stop on its own.
    owner.signal("CONT");
    let (ok, err) = owner.finish(Duration::from_secs(60));
    assert!(!ok, "the thawed owner went on:\n{err}");
    assert!(
        err.contains("this process lost ownership of the")
            && err.contains(&format!("job 'file_sum' (pid {next_pid}")),
        "the thawed owner did not say why it stopped:\n{err}"
    );
    let (ok, err) = next.finish(Duration::from_secs(120));
    assert!(ok, "the replacement failed:\n{err}");
    assert!(
        err.contains("waiting up to"),
        "the replacement did not wait:\n{err}"
    );
    // The thawed owner may have started an in-progress file before it noticed; readers
    // skip it like every dot file, and the next restore removes it.
    s.check_committed();
}
