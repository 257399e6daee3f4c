//! Named fail points for fault-injection tests.
//!
//! Set `WEIR_FAILPOINTS=name=action[,name=action...]`; actions: `kill` (the process
//! sends itself SIGKILL, exactly as `kill -9` from outside would), `stop` (the process
//! sends itself SIGSTOP and goes on after a SIGCONT: a frozen cluster worker), `exit`
//! (exit status 86 at once, without flushing or cleanup), `panic`, `sleep:MS` (the thread
//! that hit it waits MS milliseconds, then goes on: a slow network or machine), and `error`
//! (the operation at the fail point fails with an I/O error, where the code asks with
//! [`check`]). A fail point fires the first time it is hit; `N*action` (e.g.
//! `kafka.before_commit=4*kill`) fires it the N-th time, letting the hits before pass, and
//! `every*action` (e.g. `kafka.during_replay=every*sleep:3000`) at every hit.
//! Names used by weir: `checkpoint.before_metadata`, `checkpoint.after_metadata`,
//! `checkpoint.after_metadata_with_channel_state` (only checkpoints that stored in-flight
//! records), `savepoint.before_metadata` (job coordinator), `sink.after_precommit`,
//! `sink.before_commit`, `sink.after_commit` (exactly-once file sink), and in the Kafka
//! sink `kafka.after_precommit`, `kafka.before_commit`, `kafka.during_commit` (fires on
//! another thread while the commit is in flight), `kafka.after_commit`,
//! `kafka.during_replay` (half-way through re-producing an epoch on restore), and
//! `cluster.stage` (a cluster coordinator staging the checkpoint files a worker sent; use
//! `error`), `cluster.final_notice` (a cluster worker handing its tasks the notice that a
//! checkpoint is the final one; use `sleep:MS`), `rocksdb.snapshot` (the RocksDB backend's
//! background snapshot of an instance starts; `sleep:MS` makes one hang).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

fn table() -> &'static Mutex<HashMap<String, String>> {
    static T: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    T.get_or_init(|| {
        let spec = std::env::var("WEIR_FAILPOINTS").unwrap_or_default();
        let map = spec
            .split(',')
            .filter_map(|p| p.split_once('='))
            .map(|(n, a)| (n.trim().to_string(), a.trim().to_string()))
            .collect();
        Mutex::new(map)
    })
}

/// True when `WEIR_FAILPOINTS` turns on `name` and it has not fired yet (for fail points
/// that fire on another thread, racing the operation they interrupt).
///
/// ```
/// assert!(!weir_core::failpoint::armed("not.configured"));
/// ```
pub fn armed(name: &str) -> bool {
    table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(name)
}

/// Fires the fail point `name` if `WEIR_FAILPOINTS` turns it on.
///
/// ```
/// weir_core::failpoint::hit("not.configured"); // no-op unless WEIR_FAILPOINTS names it
/// ```
pub fn hit(name: &str) {
    if let Some(action) = take(name) {
        fire(name, &action);
    }
}

/// Fires the fail point `name` like [`hit`]; with the action `error` it returns an I/O
/// error instead, for the caller to handle as it would a real failure at this point.
///
/// ```
/// assert!(weir_core::failpoint::check("not.configured").is_ok());
/// ```
pub fn check(name: &str) -> crate::Result<()> {
    match take(name) {
        Some(action) if action == "error" => {
            tracing::warn!(
                fail_point = name,
                action = "error",
                "fail point '{name}': error"
            );
            Err(crate::Error::io(
                format!("fail point '{name}'"),
                std::io::Error::other("injected failure"),
            ))
        }
        Some(action) => {
            fire(name, &action);
            Ok(())
        }
        None => Ok(()),
    }
}

/// The action of fail point `name` when this hit fires it (once).
fn take(name: &str) -> Option<String> {
    let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
    let (fire, keep) = step(t.get(name)?);
    match keep {
        Some(k) => {
            t.insert(name.to_string(), k);
        }
        None => {
            t.remove(name);
        }
    }
    fire
}

/// One hit of a fail point set to `action`: what fires now, and what stays set for the
/// next hit. `N*action` lets the first N-1 hits pass; `every*action` fires at every hit.
fn step(action: &str) -> (Option<String>, Option<String>) {
    if let Some(a) = action.strip_prefix("every*") {
        return (Some(a.to_string()), Some(action.to_string()));
    }
    match action
        .split_once('*')
        .map(|(n, a)| (n.trim().parse::<u32>(), a))
    {
        Some((Ok(n), a)) if n > 1 => (None, Some(format!("{}*{a}", n - 1))),
        Some((Ok(_), a)) => (Some(a.to_string()), None),
        _ => (Some(action.to_string()), None),
    }
}

fn fire(name: &str, action: &str) {
    tracing::warn!(fail_point = name, action, "fail point '{name}': {action}");
    match action {
        "kill" => {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status();
            // SIGKILL is delivered asynchronously; never continue past the fail point.
            loop {
                std::thread::park();
            }
        }
        "stop" => {
            // Freezes the whole process, as a long pause or a network partition would,
            // until someone sends SIGCONT; then it goes on from here.
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-STOP", &pid])
                .status();
        }
        "exit" => std::process::exit(86),
        sleep if sleep.starts_with("sleep:") => match sleep["sleep:".len()..].parse::<u64>() {
            Ok(ms) => std::thread::sleep(std::time::Duration::from_millis(ms)),
            Err(_) => tracing::error!(
                fail_point = name,
                action = sleep,
                "fail point '{name}': '{sleep}' is not sleep:MILLISECONDS"
            ),
        },
        "panic" => panic!("fail point '{name}'"),
        other => tracing::error!(
            fail_point = name,
            action = other,
            "unknown fail point action '{other}' (use kill, stop, exit, panic, sleep:MS, or error where the code checks for it)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::step;

    #[test]
    fn a_counted_action_lets_the_hits_before_it_pass() {
        assert_eq!(step("kill"), (Some("kill".into()), None));
        assert_eq!(step("3*kill"), (None, Some("2*kill".into())));
        assert_eq!(step("2*sleep:10"), (None, Some("1*sleep:10".into())));
        assert_eq!(step("1*sleep:10"), (Some("sleep:10".into()), None));
        // Not a count: the whole text is the action (reported as unknown when fired).
        assert_eq!(step("x*kill"), (Some("x*kill".into()), None));
        assert_eq!(
            step("every*sleep:5"),
            (Some("sleep:5".into()), Some("every*sleep:5".into()))
        );
    }
}
