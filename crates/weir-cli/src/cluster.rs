//! `weir cluster status|cancel|savepoint --web HOST:PORT`: requests to a cluster's
//! coordinator through its REST API (the coordinator's `--web` address), as `weir job`
//! sends them, with a status that shows the workers and slots.

use crate::job::{Api, text, write_last_checkpoint};
use std::io::Write;

/// What to ask.
pub enum Request {
    Status { json: bool },
    Cancel,
    Savepoint { stop: bool },
}

/// Sends the request and prints the answer.
pub fn run(api: &Api, request: Request, out: &mut dyn Write) -> anyhow::Result<()> {
    match request {
        Request::Status { json } => {
            let job = api.get("/v1/job")?;
            if job["cluster"].is_null() {
                anyhow::bail!(
                    "the job at {} runs alone, not as a cluster's coordinator: ask it with \
                     `weir job status --web {}`",
                    api.web,
                    api.web
                );
            }
            let checkpoints = api.get("/v1/checkpoints")?;
            if json {
                let all = serde_json::json!({ "job": job, "checkpoints": checkpoints });
                writeln!(out, "{}", serde_json::to_string_pretty(&all)?)?;
            } else {
                write_status(&job, &checkpoints, out)?;
            }
            Ok(())
        }
        Request::Cancel => api.cancel(out),
        Request::Savepoint { stop } => api.savepoint(stop, out),
    }
}

fn write_status(
    job: &serde_json::Value,
    checkpoints: &serde_json::Value,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let cluster = &job["cluster"];
    writeln!(out, "job:             {}", text(&job["name"]))?;
    writeln!(out, "state:           {}", text(&job["state"]))?;
    writeln!(out, "phase:           {}", text(&cluster["phase"]))?;
    writeln!(out, "attempt:         {}", text(&job["attempt"]))?;
    let workers = cluster["workers"].as_array().cloned().unwrap_or_default();
    writeln!(
        out,
        "workers:         {} ({} slots)",
        workers.len(),
        text(&cluster["slots"])
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
    write_last_checkpoint(checkpoints, out)?;
    Ok(())
}
