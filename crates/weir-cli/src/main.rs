//! `weir`: the command-line tool for the checkpoints and savepoints of weir jobs.
//!
//! - `weir checkpoints list DIR` — every checkpoint and savepoint in a checkpoint directory.
//! - `weir checkpoints inspect PATH` — verify one checkpoint and show its manifest.
//! - `weir savepoint trigger|stop DIR` — ask the job checkpointing into `DIR` for a savepoint
//!   (and to stop), and wait until it is written.
//! - `weir job status|savepoint|cancel --web HOST:PORT` — a running job's state and figures,
//!   a savepoint (and stop), or cancel, through its REST API (a job or a cluster's
//!   coordinator started with `--web`).
//! - `weir cluster status|cancel|savepoint --web HOST:PORT` — the same through a cluster
//!   coordinator's REST API, with a status that lists its workers and slots.
//!
//! Actions on a job that has a secret need it: `--secret-file PATH` (or the environment
//! variable `WEIR_SECRET_FILE`).
//!
//! This file owns the command line (clap) and error reporting; each command lives in its own
//! module and writes its output to a `Write` it is given. The tool only reads checkpoints
//! (through `weir-checkpoint`) and drops request files for the runtime; it never writes or
//! deletes checkpoint data.

mod cluster;
mod inspect;
mod job;
mod list;
mod savepoint;
mod storage;
mod time;

use clap::{Args, Parser, Subcommand};
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "weir",
    version,
    about = "Operate weir jobs: list and inspect checkpoints, take savepoints, talk to a cluster",
    long_about = "Operate weir jobs: list and inspect checkpoints and savepoints, and ask a \
                  running job for a savepoint.\n\nA checkpoint directory is the directory a job \
                  checkpoints into: it holds chk-<id> directories (checkpoints), sp-<id>-<name> \
                  directories (savepoints) and shared/ (files shared by incremental checkpoints)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The top-level commands.
#[derive(Debug, Subcommand)]
enum Command {
    /// List and inspect checkpoints and savepoints
    #[command(subcommand)]
    Checkpoints(CheckpointsCommand),
    /// Take a savepoint of a running job (optionally stopping it)
    #[command(subcommand)]
    Savepoint(SavepointCommand),
    /// Ask a cluster's coordinator for its status, to cancel the job, or for a savepoint
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Through a running job's REST API: its status, a savepoint (and stop), or cancel
    #[command(subcommand)]
    Job(JobCommand),
}

/// `weir job …`
#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Show the job's state, attempt, uptime, last checkpoint, workers (in a cluster) and
    /// per operator the records, rates, busy and backpressured ratios
    Status {
        #[command(flatten)]
        target: Web,
        /// Print /v1/job, /v1/operators and /v1/checkpoints as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Take a savepoint and wait for it; prints its path
    Savepoint {
        #[command(flatten)]
        target: Web,
        /// Stop the job once the savepoint is written and its sinks committed
        #[arg(long)]
        stop: bool,
    },
    /// Cancel the job: its tasks stop without a savepoint
    Cancel {
        #[command(flatten)]
        target: Web,
    },
}

/// Which job's REST API to ask.
#[derive(Debug, Args)]
struct Web {
    /// The job's REST API address (its --web HOST:PORT)
    #[arg(long, value_name = "HOST:PORT")]
    web: String,
    /// A file holding the job's secret, sent with actions (savepoint, stop, cancel) to a
    /// job started with one
    #[arg(long, value_name = "PATH", env = "WEIR_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// Talk https to the API, trusting the CA certificate(s) in this PEM file (the job's
    /// ca.crt when it runs with --tls-dir)
    #[arg(long, value_name = "PATH", env = "WEIR_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// How long to wait for an answer (for a savepoint: for the savepoint), in seconds
    #[arg(
        long = "timeout-s",
        value_name = "SECONDS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    timeout_s: u64,
}

/// `weir cluster …`: through the coordinator's REST API (`--web`).
#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Show the job's state, its attempt, the workers with their slots and tasks, and the
    /// last complete checkpoint
    Status {
        #[command(flatten)]
        target: Web,
        /// Print /v1/job and /v1/checkpoints as one JSON object
        #[arg(long)]
        json: bool,
    },
    /// Cancel the job: every worker stops its tasks and the coordinator exits non-zero
    Cancel {
        #[command(flatten)]
        target: Web,
    },
    /// Have the coordinator take a savepoint and wait for it; prints its path
    Savepoint {
        #[command(flatten)]
        target: Web,
        /// Stop the job once the savepoint is written and committed
        #[arg(long)]
        stop: bool,
    },
}

/// `weir checkpoints …`
#[derive(Debug, Subcommand)]
enum CheckpointsCommand {
    /// List the checkpoints and savepoints in a checkpoint directory, sorted by id
    #[command(
        long_about = "List the checkpoints and savepoints in a checkpoint directory, sorted by \
                      id.\n\nOne line per chk-/sp- directory: id, kind (checkpoint, final or \
                      savepoint), status, size in bytes (the sum of the files its manifest \
                      references), creation time (UTC) and path.\n\nStatus is 'complete' when \
                      the directory has its _metadata manifest, 'incomplete' when it has none \
                      (an aborted attempt, a crash while writing it, or one being written right \
                      now), and 'unreadable' when the manifest cannot be parsed. Files are not \
                      verified here; `weir checkpoints inspect PATH` verifies them."
    )]
    List {
        /// The checkpoint directory (the one the job checkpoints into)
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Verify a checkpoint or savepoint and show its manifest
    #[command(
        long_about = "Verify a checkpoint or savepoint and show its manifest: job, id, kind, \
                      creation time, max parallelism, statistics, and for each operator its \
                      subtasks' files (size and CRC-32) and inline operator state (e.g. source \
                      positions, a sink's pending files).\n\nEvery file the manifest references \
                      is checked for its recorded size and checksum first; if one fails, the \
                      command exits non-zero naming the file."
    )]
    Inspect {
        /// A chk-… or sp-… directory, or its _metadata file
        #[arg(value_name = "PATH")]
        path: PathBuf,
        /// Print the verified manifest as JSON (the _metadata format) instead of text
        #[arg(long)]
        json: bool,
    },
}

/// `weir savepoint …`
#[derive(Debug, Subcommand)]
enum SavepointCommand {
    /// Ask the running job to take a savepoint and wait for it; prints its path
    #[command(
        long_about = "Ask the job that checkpoints into DIR to take a savepoint, and wait until \
                      it is written. Prints the savepoint's directory on stdout.\n\nThe request \
                      is a file named _savepoint_request that the job polls for; it works only \
                      while the job runs with checkpointing into DIR. If no new savepoint \
                      appears before the timeout, the request is withdrawn and the command \
                      fails."
    )]
    Trigger(WaitArgs),
    /// Ask the running job to take a savepoint and stop; prints the savepoint's path
    #[command(
        long_about = "Ask the job that checkpoints into DIR to take a savepoint, commit its \
                      sinks up to it, and stop. Waits until the savepoint is written and prints \
                      its directory on stdout; restart the job from that savepoint later.\n\nThe \
                      request is a file named _savepoint_request that the job polls for; it \
                      works only while the job runs with checkpointing into DIR. If no new \
                      savepoint appears before the timeout, the request is withdrawn and the \
                      command fails."
    )]
    Stop(WaitArgs),
}

/// Arguments of `weir savepoint trigger|stop`.
#[derive(Debug, Args)]
struct WaitArgs {
    /// The job's checkpoint directory
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// How long to wait for the savepoint, in seconds
    #[arg(
        long = "timeout-s",
        value_name = "SECONDS",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    timeout_s: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The library calls' own messages (and a job's, for `weir job`) are log lines; the
    // command's answers and its `error:`/`warning:` lines stay plain output.
    if let Err(e) = weir_runtime::logging::init() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let result = run(cli, &mut out).and_then(|()| out.flush().map_err(Into::into));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // `weir checkpoints list DIR | head`: the reader went away; nothing to report.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", message(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by ": ", skipping a cause whose text the message already
/// contains (weir-checkpoint's errors include their I/O error in their own text).
fn message(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let cause = cause.to_string();
        if text.is_empty() {
            text = cause;
        } else if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

/// Runs one command, writing its output to `out`.
fn run(cli: Cli, out: &mut dyn Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Checkpoints(CheckpointsCommand::List { dir }) => list::run(&dir, out),
        Command::Checkpoints(CheckpointsCommand::Inspect { path, json }) => {
            inspect::run(&path, json, out)
        }
        Command::Savepoint(SavepointCommand::Trigger(args)) => savepoint::run(
            &args.dir,
            savepoint::Request::Savepoint,
            Duration::from_secs(args.timeout_s),
            out,
        ),
        Command::Savepoint(SavepointCommand::Stop(args)) => savepoint::run(
            &args.dir,
            savepoint::Request::Stop,
            Duration::from_secs(args.timeout_s),
            out,
        ),
        Command::Job(c) => {
            let (target, request) = match c {
                JobCommand::Status { target, json } => (target, job::Request::Status { json }),
                JobCommand::Savepoint { target, stop } => {
                    (target, job::Request::Savepoint { stop })
                }
                JobCommand::Cancel { target } => (target, job::Request::Cancel),
            };
            job::run(&target.api()?, request, out)
        }
        Command::Cluster(c) => {
            let (target, request) = match c {
                ClusterCommand::Status { target, json } => {
                    (target, cluster::Request::Status { json })
                }
                ClusterCommand::Cancel { target } => (target, cluster::Request::Cancel),
                ClusterCommand::Savepoint { target, stop } => {
                    (target, cluster::Request::Savepoint { stop })
                }
            };
            cluster::run(&target.api()?, request, out)
        }
    }
}

impl Web {
    /// The client for this API, with the secret read from its file.
    fn api(self) -> anyhow::Result<job::Api> {
        let secret = match &self.secret_file {
            Some(path) => Some(weir_runtime::Secret::from_file(path)?),
            None => None,
        };
        let tls = match &self.ca_file {
            Some(path) => Some(job::tls_trusting(path)?),
            None => None,
        };
        Ok(job::Api {
            web: self.web,
            timeout: Duration::from_secs(self.timeout_s),
            secret,
            tls,
        })
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<io::Error>())
        .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn error_messages_do_not_repeat_causes() {
        let io = std::io::Error::from(io::ErrorKind::NotFound);
        let e = anyhow::Error::new(io)
            .context(format!(
                "could not open x: {}",
                std::io::Error::from(io::ErrorKind::NotFound)
            ))
            .context("cannot inspect x");
        assert_eq!(
            message(&e),
            "cannot inspect x: could not open x: entity not found"
        );
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(message(&e), "outer: inner");
    }

    #[test]
    fn timeout_defaults_to_a_minute_and_rejects_zero() {
        let cli = Cli::try_parse_from(["weir", "savepoint", "stop", "/cp"]).unwrap();
        let Command::Savepoint(SavepointCommand::Stop(args)) = cli.command else {
            panic!("{cli:?}");
        };
        assert_eq!(args.timeout_s, 60);
        assert!(
            Cli::try_parse_from(["weir", "savepoint", "trigger", "/cp", "--timeout-s", "0"])
                .is_err()
        );
    }
}
