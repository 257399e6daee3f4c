//! Errors of the core vocabulary and of the operators built on it.
//!
//! Owns [`Error`] and [`Result`]. Every failure a job can report is one of these variants;
//! runtime failures carry the operator and subtask so a user knows where to look.

use std::fmt;

/// The result type used throughout weir.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where in a running job something happened: the operator's name and the subtask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The operator's display name (`.name(..)` or the DSL default such as `map`).
    pub operator: String,
    /// The subtask index within the operator's parallelism.
    pub subtask: usize,
    /// The operator's parallelism.
    pub parallelism: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "operator '{}' (subtask {}/{})",
            self.operator,
            self.subtask + 1,
            self.parallelism
        )
    }
}

/// Everything that can go wrong in weir.
///
/// `Debug` prints the same message as `Display`, so `main` returning [`Result`] shows a
/// user the actionable message rather than the variant's structure:
///
/// ```
/// use weir_core::error::{Error, Location};
/// let e = Error::Config("unknown topic 'payments'".into()).at(|| Location {
///     operator: "kafka-source".into(),
///     subtask: 0,
///     parallelism: 2,
/// });
/// let shown = "operator 'kafka-source' (subtask 1/2) failed: invalid configuration: unknown topic 'payments'";
/// assert_eq!(e.to_string(), shown);
/// assert_eq!(format!("{e:?}"), shown); // what `fn main() -> weir::Result<()>` prints after "Error: "
/// ```
#[derive(thiserror::Error)]
pub enum Error {
    /// A user function returned an error or panicked inside an operator.
    #[error("{location} failed: {cause}")]
    Operator {
        /// Where it happened.
        location: Location,
        /// The underlying error.
        #[source]
        cause: Box<Error>,
    },
    /// A user function panicked; the message is the panic payload.
    #[error("panicked: {0}")]
    Panic(String),
    /// A user function reported an error.
    #[error("{0}")]
    User(String),
    /// The pipeline or its configuration is invalid; the message says what to change.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A record could not be parsed; the message names the input and the record.
    #[error("malformed record: {0}")]
    Malformed(String),
    /// Encoding or decoding state or records failed.
    #[error("codec error: {0}")]
    Codec(String),
    /// A channel to another subtask closed unexpectedly (that subtask ended or failed).
    #[error("channel closed: {0}")]
    ChannelClosed(String),
    /// The job was cancelled before it finished.
    #[error("job cancelled")]
    Cancelled,
    /// The state in the checkpoint being restored cannot be restored from files fetched
    /// from checkpoint storage, though they verified: RocksDB does not open them, or a file
    /// the state needs is not among them. Restoring the same checkpoint again would fail
    /// the same way; the job falls back to an older checkpoint (docs/checkpoints.md,
    /// section 4). The message says what failed.
    #[error("{0}")]
    Unrestorable(String),
    /// A failure reported by another process of a cluster (a worker's task, or the loss
    /// of a worker), with its message and classification kept.
    #[error("{message}")]
    Remote {
        /// What happened, as the other process reported it.
        message: String,
        /// A restart would fail the same way.
        deterministic: bool,
        /// A consequence of another failure or of cancellation.
        secondary: bool,
    },
}

impl fmt::Debug for Error {
    /// The same message as `Display`: `fn main() -> weir::Result<()>` prints an error with
    /// `Debug`, and a user needs the message, not the enum's structure. Match on the
    /// variants to inspect an error in code.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Error {
    /// Builds a [`Error::User`] from anything printable; handy inside user functions.
    ///
    /// ```
    /// let e = weir_core::Error::user("amount must be positive");
    /// assert_eq!(e.to_string(), "amount must be positive");
    /// ```
    pub fn user(msg: impl fmt::Display) -> Self {
        Error::User(msg.to_string())
    }

    /// Builds an [`Error::Io`] for `path`.
    pub fn io(path: impl fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            source,
        }
    }

    /// Wraps the error with the operator location unless it already has one.
    pub fn at(self, location: impl FnOnce() -> Location) -> Self {
        match self {
            e @ (Error::Operator { .. } | Error::Cancelled | Error::ChannelClosed(_)) => e,
            e => Error::Operator {
                location: location(),
                cause: Box::new(e),
            },
        }
    }

    /// True for errors that end the job for good: restarting from a checkpoint would
    /// run into them again (an invalid configuration, a malformed record).
    ///
    /// ```
    /// use weir_core::Error;
    /// assert!(Error::Config("no such topic".into()).is_deterministic());
    /// assert!(!Error::User("broker timed out".into()).is_deterministic());
    /// ```
    pub fn is_deterministic(&self) -> bool {
        match self {
            Error::Operator { cause, .. } => cause.is_deterministic(),
            Error::Config(_) | Error::Malformed(_) => true,
            Error::Remote { deterministic, .. } => *deterministic,
            _ => false,
        }
    }

    /// True when the state of the checkpoint being restored cannot be restored
    /// ([`Error::Unrestorable`]), also when a task of another process of a cluster reported
    /// it, or an operator reported it with its location.
    ///
    /// ```
    /// use weir_core::error::{Error, Location};
    /// let e = Error::Unrestorable("RocksDB open: Corruption: bad table magic number".into());
    /// let at = e.at(|| Location { operator: "sum".into(), subtask: 0, parallelism: 1 });
    /// assert!(at.is_unrestorable());
    /// assert!(!at.is_deterministic());
    /// assert!(!Error::User("disk full".into()).is_unrestorable());
    /// ```
    pub fn is_unrestorable(&self) -> bool {
        match self {
            Error::Operator { cause, .. } => cause.is_unrestorable(),
            Error::Unrestorable(_) => true,
            _ => false,
        }
    }

    /// True when the error is a consequence of another failure or of cancellation,
    /// not a root cause.
    pub fn is_secondary(&self) -> bool {
        matches!(
            self,
            Error::Cancelled
                | Error::ChannelClosed(_)
                | Error::Remote {
                    secondary: true,
                    ..
                }
        )
    }

    /// Turns a panic payload into an error.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        let msg = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "non-string panic payload".to_string()
        };
        Error::Panic(msg)
    }
}
