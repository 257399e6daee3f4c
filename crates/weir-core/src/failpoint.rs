//! Named fail points for fault-injection tests.
//!
//! Set `WEIR_FAILPOINTS=name=action[,name=action...]`; actions: `kill` (the process
//! sends itself SIGKILL, exactly as `kill -9` from outside would), `exit` (exit status 86
//! at once, without flushing or cleanup) and `panic`. A fail point fires the first time
//! it is hit. Names used by weir: `checkpoint.before_metadata`,
//! `checkpoint.after_metadata` (job coordinator), `sink.after_precommit`,
//! `sink.before_commit`, `sink.after_commit` (exactly-once sinks).

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

/// Fires the fail point `name` if `WEIR_FAILPOINTS` turns it on.
///
/// ```
/// weir_core::failpoint::hit("not.configured"); // no-op unless WEIR_FAILPOINTS names it
/// ```
pub fn hit(name: &str) {
    let action = table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(name);
    let Some(action) = action else { return };
    eprintln!("[weir] fail point '{name}': {action}");
    match action.as_str() {
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
        "exit" => std::process::exit(86),
        "panic" => panic!("fail point '{name}'"),
        other => eprintln!("[weir] unknown fail point action '{other}' (use kill, exit or panic)"),
    }
}
