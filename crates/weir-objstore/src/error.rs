//! Errors of object storage: what was done, to which URL, and why.

/// An error of [`Store`](crate::Store).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL or the environment's settings for it cannot make a store.
    #[error("object storage {url}: {message}")]
    Config {
        /// The URL as given.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// A request failed after its retries.
    #[error("cannot {op} {url}: {source}")]
    Store {
        /// What was being done ("write", "read", "list", …).
        op: &'static str,
        /// The object's URL.
        url: String,
        /// The store's error.
        #[source]
        source: Box<object_store::Error>,
    },
    /// A local file could not be read or written.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The local file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True when the object (or upload) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Store { source, .. } if matches!(**source, object_store::Error::NotFound { .. }))
    }
}

/// A result of this crate.
pub type Result<T> = std::result::Result<T, Error>;
