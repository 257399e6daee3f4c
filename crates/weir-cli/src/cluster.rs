//! `weir cluster status|cancel|savepoint`: requests to a cluster's coordinator over its
//! RPC port (the coordinator's `--listen` address).

use std::io::Write;
use std::time::Duration;

/// What to ask.
pub enum Request {
    Status { json: bool },
    Cancel,
    Savepoint { stop: bool },
}

/// Sends the request and prints the answer.
pub fn run(
    coordinator: &str,
    request: Request,
    timeout: Duration,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let body = match &request {
        Request::Status { .. } => serde_json::json!({"request": "status"}),
        Request::Cancel => serde_json::json!({"request": "cancel"}),
        Request::Savepoint { stop } => serde_json::json!({"request": "savepoint", "stop": stop}),
    };
    let reply = weir_runtime::cluster::admin(coordinator, &body, timeout)?;
    match request {
        Request::Status { json: true } => {
            writeln!(out, "{}", serde_json::to_string_pretty(&reply)?)?;
        }
        Request::Status { json: false } => write_status(&reply, out)?,
        Request::Cancel | Request::Savepoint { .. } => {
            let message = reply["message"].as_str().unwrap_or_default();
            if reply["ok"] != serde_json::Value::Bool(true) {
                anyhow::bail!("the coordinator at {coordinator} refused: {message}");
            }
            writeln!(out, "{message}")?;
        }
    }
    Ok(())
}

fn write_status(s: &serde_json::Value, out: &mut dyn Write) -> anyhow::Result<()> {
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    };
    writeln!(out, "job:             {}", text(&s["job"]))?;
    writeln!(out, "state:           {}", text(&s["state"]))?;
    writeln!(out, "attempt:         {}", text(&s["attempt"]))?;
    let workers = s["workers"].as_array().cloned().unwrap_or_default();
    writeln!(
        out,
        "workers:         {} ({} slots)",
        workers.len(),
        text(&s["slots"])
    )?;
    for w in &workers {
        writeln!(
            out,
            "  worker {:<4} {:<22} slots {:<3} tasks {}",
            text(&w["id"]),
            text(&w["address"]),
            text(&w["slots"]),
            text(&w["tasks"])
        )?;
    }
    match s["last_checkpoint"].as_object() {
        Some(c) => writeln!(
            out,
            "last checkpoint: {} {} ({})",
            text(&c["kind"]),
            text(&c["id"]),
            text(&c["path"])
        )?,
        None => writeln!(out, "last checkpoint: none")?,
    }
    Ok(())
}
