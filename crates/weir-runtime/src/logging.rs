//! The default log subscriber: where weir's `tracing` events and spans go when the program
//! installed no subscriber of its own.
//!
//! Owns the two output formats (a human line, or one JSON object per line), the filter
//! (`RUST_LOG`, default [`DEFAULT_FILTER`]) and the once-per-process installation. It must not
//! decide what is logged (each module emits its own events) and never replaces a subscriber
//! the program installed. See docs/operations.md ("Logs") and decision 0028.

mod human;

use std::io::Write;
use std::str::FromStr;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use weir_core::{Error, Result};

/// The environment variable that chooses the log format: `human` (the default) or `json`.
pub const FORMAT_ENV: &str = "WEIR_LOG_FORMAT";

/// The filter used when `RUST_LOG` is unset or empty: `info` and up, from weir and from the
/// program itself, but only `warn` and up from the dependencies that log through `tracing`
/// (the HTTP stack, the object-storage client, whose retries weir reports itself when they
/// run out, and the tokio runtime). Other dependencies log through the `log` crate,
/// which the default subscriber does not collect.
pub const DEFAULT_FILTER: &str = "info,axum=warn,h2=warn,hyper=warn,hyper_util=warn,mio=warn,object_store=warn,reqwest=warn,tokio=warn,tower=warn";

/// How the default subscriber writes events to standard error.
///
/// ```
/// use weir_runtime::logging::LogFormat;
/// assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
/// assert_eq!(" Human ".parse::<LogFormat>().unwrap(), LogFormat::Human);
/// let err = "xml".parse::<LogFormat>().unwrap_err();
/// assert!(err.to_string().contains("use 'human' (the default) or 'json'"), "{err}");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// One line per event: time, level, `[weir]` (or the dependency's target) and the
    /// message, followed by the event's fields that the message does not already show.
    #[default]
    Human,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (with `message`),
    /// `span` (the innermost span's name and fields) and `spans` (all of them, outermost
    /// first), for log collectors.
    Json,
}

impl FromStr for LogFormat {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "human" | "text" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            _ => Err(Error::Config(format!(
                "log format '{s}' is not known: use 'human' (the default) or 'json'"
            ))),
        }
    }
}

impl std::fmt::Display for LogFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LogFormat::Human => "human",
            LogFormat::Json => "json",
        })
    }
}

/// Installs weir's default subscriber unless the program already installed one (then it
/// does nothing and returns `Ok(false)`). The format comes from `WEIR_LOG_FORMAT`, the
/// filter from `RUST_LOG` ([`DEFAULT_FILTER`] when unset).
///
/// Jobs call it when they start, and `weir_runtime::join` when a worker joins a cluster:
/// a program only calls it itself to see log lines before its first job starts. Events go
/// to standard error; inside `cargo test` they go to the test's captured output.
///
/// ```
/// // A program that wants weir's log lines from its first line on:
/// weir_runtime::logging::init()?;
/// tracing::info!(job = "example", "job 'example': starting");
/// // A second call, or one after the program installed its own subscriber, does nothing.
/// assert!(!weir_runtime::logging::init()?);
/// # Ok::<(), weir_core::Error>(())
/// ```
///
/// # Errors
/// [`Error::Config`] when `WEIR_LOG_FORMAT` or `RUST_LOG` cannot be understood; the
/// message names the variable and what it accepts.
pub fn init() -> Result<bool> {
    init_with(None)
}

/// Like [`init`], with the format chosen by the program (`None`: from `WEIR_LOG_FORMAT`).
///
/// ```
/// use weir_runtime::logging::{LogFormat, init_with};
/// init_with(Some(LogFormat::Json))?;
/// # Ok::<(), weir_core::Error>(())
/// ```
///
/// # Errors
/// As [`init`].
pub fn init_with(format: Option<LogFormat>) -> Result<bool> {
    if tracing::dispatcher::has_been_set() {
        return Ok(false);
    }
    let format = match format {
        Some(f) => f,
        None => format_from(std::env::var(FORMAT_ENV).ok().as_deref())?,
    };
    let filter = filter_from(std::env::var("RUST_LOG").ok().as_deref())?;
    let installed = match format {
        LogFormat::Human => tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .event_format(human::Human)
                .with_writer(Stderr)
                .with_env_filter(filter)
                .finish(),
        ),
        LogFormat::Json => tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .with_writer(Stderr)
                .with_env_filter(filter)
                .finish(),
        ),
    };
    // Another thread installed one in between: theirs stays.
    Ok(installed.is_ok())
}

/// The format `WEIR_LOG_FORMAT` asks for (unset or empty: human).
fn format_from(value: Option<&str>) -> Result<LogFormat> {
    match value {
        None => Ok(LogFormat::Human),
        Some(v) if v.trim().is_empty() => Ok(LogFormat::Human),
        Some(v) => v.parse().map_err(|_| {
            Error::Config(format!(
                "{FORMAT_ENV}='{v}' is not a log format: use 'human' (the default) or 'json'"
            ))
        }),
    }
}

/// The filter `RUST_LOG` asks for (unset or empty: [`DEFAULT_FILTER`]).
fn filter_from(value: Option<&str>) -> Result<EnvFilter> {
    let directives = match value {
        Some(v) if !v.trim().is_empty() => v,
        _ => DEFAULT_FILTER,
    };
    EnvFilter::builder().parse(directives).map_err(|e| {
        Error::Config(format!(
            "RUST_LOG='{directives}' is not a log filter ({e}): use a level such as 'info', or \
             comma-separated target=level directives such as 'warn,weir=info,weir_kafka=debug'"
        ))
    })
}

/// Writes each formatted event to standard error in one piece, through `eprint!` so that
/// `cargo test` captures the lines of jobs run inside a test, as it captures `eprintln!`.
struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        eprint!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Stderr;

    fn make_writer(&'a self) -> Self::Writer {
        Stderr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_from_the_environment() {
        assert_eq!(format_from(None).unwrap(), LogFormat::Human);
        assert_eq!(format_from(Some("")).unwrap(), LogFormat::Human);
        assert_eq!(format_from(Some("JSON")).unwrap(), LogFormat::Json);
        assert_eq!(format_from(Some("human")).unwrap(), LogFormat::Human);
        let err = format_from(Some("jsn")).unwrap_err().to_string();
        assert_eq!(
            err,
            "invalid configuration: WEIR_LOG_FORMAT='jsn' is not a log format: use 'human' (the default) or 'json'"
        );
    }

    #[test]
    fn filters_from_the_environment() {
        let directives = |f: EnvFilter| {
            let mut d: Vec<String> = f.to_string().split(',').map(String::from).collect();
            d.sort();
            d.join(",")
        };
        let default = "axum=warn,h2=warn,hyper=warn,hyper_util=warn,info,mio=warn,object_store=warn,reqwest=warn,tokio=warn,tower=warn";
        assert_eq!(directives(filter_from(None).unwrap()), default);
        assert_eq!(directives(filter_from(Some(" ")).unwrap()), default);
        assert_eq!(
            filter_from(Some("weir_kafka=debug")).unwrap().to_string(),
            "weir_kafka=debug"
        );
        let err = filter_from(Some("weir=loud")).unwrap_err().to_string();
        assert!(
            err.contains("RUST_LOG='weir=loud' is not a log filter")
                && err.contains("'warn,weir=info,weir_kafka=debug'"),
            "{err}"
        );
    }
}
