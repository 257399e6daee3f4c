//! Ownership of directories: one run of one job at a time writes into a checkpoint
//! directory or an exactly-once sink's output directory.
//!
//! A run takes a **lease** on each of its directories ([`Ownership::acquire`]) before it
//! restores, cleans up or writes anything, renews it on a background thread every third of
//! the lease, checks it before each durable act ([`Ownership::verify`]: writing a
//! checkpoint's manifest, deleting checkpoints, committing sink output) and gives it up when
//! it ends. A second run pointed at an owned directory is refused with the owner's job, pid,
//! host and start time. A run that was SIGKILLed is taken over at once by the next run on
//! its machine (its pid is gone); one that is frozen, or on another host of a shared volume,
//! once it has not renewed its lease for the lease's duration — and if it thaws, its next
//! check fails and it stops ([`Error::OwnershipLost`]).
//!
//! Owns the protocol ([`lease`], sans-IO), the record files ([`record`]) and the renewal
//! thread. It does not know what the directories hold; the runtime decides which to claim
//! and [`CheckpointStorage`](crate::CheckpointStorage) calls `verify`. See
//! docs/decisions/0019-directory-ownership.md for the choices.
//!
//! ```
//! use std::time::Duration;
//! use weir_checkpoint::{Claim, Error, Ownership};
//!
//! let tmp = tempfile::tempdir()?;
//! let claims = vec![Claim::new(tmp.path().join("ck"), "checkpoint directory")];
//! let first = Ownership::acquire("sums", claims.clone(), Duration::from_secs(15), &mut |_| {})?;
//! let second = Ownership::acquire("sums", claims.clone(), Duration::from_secs(15), &mut |_| {});
//! let Err(Error::Owned { message, .. }) = second else { panic!() };
//! assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
//! first.verify()?;
//! drop(first); // gives the directories up
//! Ownership::acquire("sums", claims, Duration::from_secs(15), &mut |_| {})?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod lease;
mod record;

pub use record::OwnerRecord;

use crate::error::{Error, Result};
use lease::{Lease, Next, Outcome, Refusal};
use record::Seen;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The lease a run holds on its directories unless configured otherwise. A frozen owner or
/// one on a dead host is taken over after this long; a SIGKILLed one on the same machine at
/// once.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(15);

/// The shortest lease accepted (renewals every third of it).
pub const MIN_LEASE: Duration = Duration::from_millis(300);

/// A directory to own, and what it is to the job (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The directory; created if missing.
    pub dir: PathBuf,
    /// What it is, e.g. "checkpoint directory" or "output directory of sink 'out'".
    pub what: String,
}

impl Claim {
    /// A claim on `dir`, described as `what`.
    pub fn new(dir: impl Into<PathBuf>, what: impl Into<String>) -> Claim {
        Claim {
            dir: dir.into(),
            what: what.into(),
        }
    }
}

/// Leases on a set of directories, held by this run until the last clone is dropped.
///
/// Cheap to clone; clones share the leases.
#[derive(Clone)]
pub struct Ownership {
    guard: Arc<Guard>,
}

impl std::fmt::Debug for Ownership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dirs: Vec<&Path> = self
            .guard
            .shared
            .dirs
            .iter()
            .map(|d| d.claim.dir.as_path())
            .collect();
        f.debug_struct("Ownership")
            .field("token", &self.guard.shared.token)
            .field("dirs", &dirs)
            .finish()
    }
}

struct Guard {
    shared: Arc<Shared>,
    renewer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Shared {
    token: String,
    job: String,
    me: &'static weir_core::scratch::ProcessId,
    lease: Duration,
    since_ms: u64,
    dirs: Vec<Owned>,
    stop: Mutex<bool>,
    wake: Condvar,
    /// Set once a lease is lost: the error's message.
    lost: Mutex<Option<(PathBuf, String)>>,
}

struct Owned {
    claim: Claim,
    lease: Mutex<Lease>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Ownership {
    /// Takes a lease on every claimed directory for a run of job `job`, or fails with
    /// [`Error::Owned`] naming the owner when another live run holds one (the leases taken
    /// so far are given up again). Waits (up to one lease of the owner's) only when an owner
    /// has stopped renewing without being provably gone: a frozen process, or one on
    /// another host; `notify` is told so, in a sentence for the user.
    pub fn acquire(
        job: &str,
        claims: Vec<Claim>,
        lease: Duration,
        notify: &mut dyn FnMut(&str),
    ) -> Result<Ownership> {
        if lease < MIN_LEASE {
            return Err(Error::InvalidConfig(format!(
                "the ownership lease of {lease:?} is too short; use at least {MIN_LEASE:?} \
                 (the default is {DEFAULT_LEASE:?})"
            )));
        }
        let mut dirs: Vec<Claim> = Vec::new();
        for c in claims {
            let dir = if let Some(local) = c.dir.to_str().and_then(|d| d.strip_prefix("file://")) {
                PathBuf::from(local)
            } else {
                c.dir.clone()
            };
            let dir = if crate::storage::remote::is_remote(&dir) {
                // Object storage has no directories to create; the URL in its normal form.
                PathBuf::from(crate::storage::remote::open(&dir)?.url())
            } else {
                std::fs::create_dir_all(&dir)
                    .map_err(|e| Error::io("create directory", &dir, e))?;
                std::path::absolute(&dir).map_err(|e| Error::io("resolve path", &dir, e))?
            };
            if !dirs.iter().any(|d| d.dir == dir) {
                dirs.push(Claim { dir, what: c.what });
            }
        }
        let token = new_token();
        let shared = Arc::new(Shared {
            job: job.to_string(),
            me: record::me(),
            lease,
            since_ms: crate::storage::layout::unix_millis(),
            dirs: dirs
                .into_iter()
                .map(|claim| Owned {
                    claim,
                    lease: Mutex::new(Lease::new(&token, lease)),
                })
                .collect(),
            token,
            stop: Mutex::new(false),
            wake: Condvar::new(),
            lost: Mutex::new(None),
        });
        // From here on, dropping the guard (an error included) gives up what was taken.
        let guard = Guard {
            shared: shared.clone(),
            renewer: Mutex::new(None),
        };
        let start = Instant::now();
        let mut pending: Vec<Next> = shared
            .dirs
            .iter()
            .map(|_| Next::Look {
                at: start,
                until: start,
                started: false,
            })
            .collect();
        loop {
            let mut wake_at: Option<Instant> = None;
            for (owned, next) in shared.dirs.iter().zip(pending.iter_mut()) {
                let mut lease = lock(&owned.lease);
                loop {
                    let now = Instant::now();
                    *next = match std::mem::replace(next, Next::Held) {
                        Next::Held => break,
                        Next::Look { at, until, started } if now < at => {
                            *next = Next::Look { at, until, started };
                            wake_at = Some(wake_at.map_or(at, |w| w.min(at)));
                            break;
                        }
                        Next::Look { .. } => {
                            let seen = record::read_current(&owned.claim.dir)?;
                            let live = seen
                                .record()
                                .map_or(record::Liveness::Unknown, record::probe);
                            let wall = crate::storage::layout::unix_millis();
                            let n = lease.observe(now, wall, &seen, live);
                            if let Next::Look {
                                until,
                                started: true,
                                ..
                            } = n
                            {
                                notify(&shared.waiting(&owned.claim, &seen, until - now));
                            }
                            n
                        }
                        Next::Write { seq, released } => {
                            let outcome = shared.write(&owned.claim.dir, seq, released);
                            lease.wrote(Instant::now(), outcome?)
                        }
                        Next::Refused(r) => {
                            drop(lease);
                            drop(guard);
                            return Err(shared.refused(&owned.claim, &r));
                        }
                        Next::Lost(_) | Next::Released => {
                            return Err(Error::InvalidConfig(
                                "internal: a lease being acquired was lost".into(),
                            ));
                        }
                    };
                }
            }
            match wake_at {
                None => break,
                Some(at) => std::thread::sleep(at.saturating_duration_since(Instant::now())),
            }
        }
        let renewer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("weir-ownership".into())
                .spawn(move || shared.renew_loop())
                .map_err(|e| {
                    Error::io("start the lease renewal thread for", shared_dir(&guard), e)
                })?
        };
        *lock(&guard.renewer) = Some(renewer);
        tracing::debug!(token = %guard.shared.token, dirs = guard.shared.dirs.len(), "directories owned");
        Ok(Ownership {
            guard: Arc::new(guard),
        })
    }

    /// Checks, right before a durable act, that this run still owns every directory
    /// (renewing a lease first when half of it has passed). [`Error::OwnershipLost`] when
    /// another run took one over: the act must not happen, and the run must stop.
    pub fn verify(&self) -> Result<()> {
        let shared = &self.guard.shared;
        if let Some(e) = self.lost() {
            return Err(e);
        }
        for owned in &shared.dirs {
            let mut lease = lock(&owned.lease);
            let seen = match record::read_current(&owned.claim.dir) {
                Ok(seen) => seen,
                // A store that does not answer for a moment (object storage being restarted)
                // does not stop a run whose lease is fresh.
                Err(e) if lease.held_without_reading(Instant::now()) => {
                    tracing::warn!(dir = %owned.claim.dir.display(), error = %e, "cannot read the owner record; the lease was renewed recently, so the run still owns the directory");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut next = lease.verify(Instant::now(), &seen);
            if let Next::Write { seq, released } = next {
                let outcome = shared.write(&owned.claim.dir, seq, released);
                next = lease.wrote(
                    Instant::now(),
                    *outcome.as_ref().unwrap_or(&Outcome::Failed),
                );
                outcome?;
            }
            match next {
                Next::Held => {}
                Next::Lost(now_owner) => return Err(shared.lose(&owned.claim, now_owner)),
                other => {
                    return Err(Error::InvalidConfig(format!(
                        "internal: unexpected lease state {other:?}"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The error to stop with, once the renewal thread (or [`verify`](Self::verify)) found
    /// that another run took a directory over.
    pub fn lost(&self) -> Option<Error> {
        lock(&self.guard.shared.lost)
            .as_ref()
            .map(|(dir, message)| Error::OwnershipLost {
                dir: dir.clone(),
                message: message.clone(),
            })
    }

    /// The random token of this run, written into every owner record.
    pub fn token(&self) -> &str {
        &self.guard.shared.token
    }

    /// The owned directories (absolute).
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.guard.shared.dirs.iter().map(|d| d.claim.dir.as_path())
    }
}

fn shared_dir(guard: &Guard) -> PathBuf {
    guard
        .shared
        .dirs
        .first()
        .map_or_else(PathBuf::new, |d| d.claim.dir.clone())
}

/// The current record of `dir`, if a run holds it (released records say nobody does). For
/// read-only tools that want to show who writes into a directory.
pub fn current_owner(dir: &Path) -> Result<Option<OwnerRecord>> {
    Ok(match record::read_current(dir)? {
        Seen::Record { record, .. } if !record.released => Some(record),
        _ => None,
    })
}

impl Drop for Guard {
    fn drop(&mut self) {
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(t) = lock(&self.renewer).take() {
            let _ = t.join();
        }
        for owned in &self.shared.dirs {
            let mut lease = lock(&owned.lease);
            if let Next::Write { seq, released } = lease.release(Instant::now())
                && let Ok(outcome) = self.shared.write(&owned.claim.dir, seq, released)
            {
                lease.wrote(Instant::now(), outcome);
            }
        }
    }
}

impl Shared {
    fn record(&self, released: bool) -> OwnerRecord {
        OwnerRecord {
            token: self.token.clone(),
            job: self.job.clone(),
            host: self.me.host.clone(),
            machine: self.me.machine.clone(),
            pid: self.me.pid,
            pid_start: self.me.start,
            since_ms: self.since_ms,
            renewed_ms: crate::storage::layout::unix_millis(),
            lease_ms: self.lease.as_millis() as u64,
            released,
            dirs: self.dirs.iter().map(|d| d.claim.dir.clone()).collect(),
        }
    }

    /// Creates record `seq`; on success, removes the records before the previous one.
    fn write(&self, dir: &Path, seq: u64, released: bool) -> Result<Outcome> {
        if !record::create(dir, seq, &self.record(released))? {
            return Ok(Outcome::Exists);
        }
        let current = record::list(dir)?.last().copied().unwrap_or(seq);
        if current == seq {
            record::delete_below(dir, seq.saturating_sub(1), &self.token);
        }
        Ok(Outcome::Created { current })
    }

    fn renew_loop(&self) {
        let period = self.lease / 3;
        loop {
            {
                let stop = lock(&self.stop);
                if *stop {
                    return;
                }
                let (stop, _) = self
                    .wake
                    .wait_timeout(stop, period / 4)
                    .unwrap_or_else(PoisonError::into_inner);
                if *stop {
                    return;
                }
            }
            for owned in &self.dirs {
                let mut lease = lock(&owned.lease);
                if !lease.renew_due(Instant::now()) {
                    continue;
                }
                let Next::Write { seq, released } = lease.renew(Instant::now()) else {
                    continue;
                };
                match self.write(&owned.claim.dir, seq, released) {
                    Ok(outcome) => {
                        if let Next::Lost(_) = lease.wrote(Instant::now(), outcome) {
                            let now_owner = record::read_current(&owned.claim.dir)
                                .ok()
                                .and_then(|s| s.record().cloned().map(Box::new));
                            drop(lease);
                            let e = self.lose(&owned.claim, now_owner);
                            tracing::error!(error = %e, "lease lost");
                        }
                    }
                    Err(e) => {
                        // Try again at the next tick; verify() renews too. A lease that runs
                        // out meanwhile is found lost at the next attempt.
                        lease.wrote(Instant::now(), Outcome::Failed);
                        tracing::warn!(dir = %owned.claim.dir.display(), error = %e, "renewing the lease failed");
                    }
                }
            }
        }
    }

    /// Records that `claim` was lost and returns the error saying so.
    fn lose(&self, claim: &Claim, now_owner: Option<Box<OwnerRecord>>) -> Error {
        let who = match &now_owner {
            Some(r) if r.released => format!(
                "{} took it over and has since ended",
                describe(r, &claim.dir)
            ),
            Some(r) => format!("it is now owned by {}", describe(r, &claim.dir)),
            None => "its owner record is gone".to_string(),
        };
        let message = format!(
            "this process lost ownership of the {} {}: {who}. It was probably paused (SIGSTOP, \
             a suspended VM, an overloaded host) for longer than its lease of {}, and another \
             run took over; this run stops without writing a checkpoint or committing output. \
             Let the other run go on",
            claim.what,
            claim.dir.display(),
            secs(self.lease)
        );
        let mut lost = lock(&self.lost);
        lost.get_or_insert((claim.dir.clone(), message.clone()));
        Error::OwnershipLost {
            dir: claim.dir.clone(),
            message,
        }
    }

    fn refused(&self, claim: &Claim, r: &Refusal) -> Error {
        let (owner, why, lease) = match &r.record {
            Some(rec) => {
                let age = crate::storage::layout::unix_millis().saturating_sub(rec.renewed_ms);
                let why = if r.renewed_while_watched {
                    "it renewed its lease while this run waited".to_string()
                } else {
                    format!(
                        "it renewed its lease {} ago",
                        secs(Duration::from_millis(age))
                    )
                };
                (
                    describe(rec, &claim.dir),
                    why,
                    Duration::from_millis(rec.lease_ms),
                )
            }
            None => (
                "a run whose owner record cannot be read".to_string(),
                "its record changed while this run waited".to_string(),
                self.lease,
            ),
        };
        Error::Owned {
            dir: claim.dir.clone(),
            message: format!(
                "the {} {} is owned by {owner}, and {why}. Two runs writing into one directory \
                 would delete each other's files and commit output twice. Stop that run (or let \
                 it finish) before starting this one, or give this run directories of its own. \
                 If that process is frozen or its host is down, a new run takes over once it \
                 has not renewed its lease for {}",
                claim.what,
                claim.dir.display(),
                secs(lease)
            ),
        }
    }

    fn waiting(&self, claim: &Claim, seen: &Seen, wait: Duration) -> String {
        let owner = seen.record().map_or_else(
            || "a run whose owner record cannot be read".to_string(),
            |r| describe(r, &claim.dir),
        );
        format!(
            "the {} {} is owned by {owner}, which has not renewed its lease in time; waiting up \
             to {} to make sure it is gone before taking over",
            claim.what,
            claim.dir.display(),
            secs(wait)
        )
    }
}

/// "job 'x' (pid 1 on host h, since …; it also owns /out)".
fn describe(r: &OwnerRecord, dir: &Path) -> String {
    let others: Vec<String> = r
        .dirs
        .iter()
        .filter(|d| d.as_path() != dir)
        .map(|d| d.display().to_string())
        .collect();
    let also = if others.is_empty() {
        String::new()
    } else {
        format!("; it also owns {}", others.join(", "))
    };
    format!(
        "job '{}' (pid {} on host {}, since {}{also})",
        r.job,
        r.pid,
        r.host,
        record::utc(r.since_ms)
    )
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// A token unique to one run.
fn new_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::storage::layout::unix_millis());
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    h.write_u32(nanos);
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests;
