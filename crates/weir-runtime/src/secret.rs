//! The job's shared secret: what a client must present to act on a running job through
//! its REST API (take a savepoint, stop, cancel). The read-only views stay open.
//!
//! A secret is read from a file (a mounted Kubernetes secret, say) or given as text. It is
//! compared in constant time and never printed: its `Debug` shows only its length.

use std::path::Path;
use weir_core::{Error, Result};

/// The shortest secret weir accepts: a guessable secret protects nothing.
pub const MIN_SECRET_LEN: usize = 16;

/// The environment variable naming the secret's file.
pub const SECRET_FILE_VAR: &str = "WEIR_SECRET_FILE";

/// A shared secret.
///
/// ```
/// use weir_runtime::Secret;
/// let s = Secret::new("correct horse battery staple")?;
/// assert!(s.matches("correct horse battery staple"));
/// assert!(!s.matches("correct horse battery stapler"));
/// assert_eq!(format!("{s:?}"), "Secret(28 bytes)");
/// assert!(Secret::new("short").is_err());
/// # Ok::<(), weir_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// A secret of at least [`MIN_SECRET_LEN`] bytes, without leading or trailing
    /// whitespace (a file's final newline is not part of the secret).
    pub fn new(secret: impl Into<String>) -> Result<Self> {
        let secret = secret.into();
        let trimmed = secret.trim();
        if trimmed.len() < MIN_SECRET_LEN {
            return Err(Error::Config(format!(
                "the secret is {} bytes long; use at least {MIN_SECRET_LEN} (for example the \
                 output of `openssl rand -hex 32`)",
                trimmed.len()
            )));
        }
        Ok(Secret(trimmed.to_string()))
    }

    /// Reads the secret from `path`: the whole file, without surrounding whitespace.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("secret");
    /// std::fs::write(&path, "0123456789abcdef0123456789abcdef\n")?;
    /// let s = weir_runtime::Secret::from_file(&path)?;
    /// assert!(s.matches("0123456789abcdef0123456789abcdef"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!(
                "cannot read the secret file {}: {e}; give a readable file that holds the secret",
                path.display()
            ))
        })?;
        Secret::new(text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))
    }

    /// The secret in the file the environment variable [`SECRET_FILE_VAR`]
    /// (`WEIR_SECRET_FILE`) names, `None` when it is not set: how the examples and
    /// `weir job|cluster` find the secret when no `--secret-file` is given.
    ///
    /// ```
    /// // Not set here: no secret.
    /// assert!(weir_runtime::Secret::from_env()?.is_none());
    /// # Ok::<(), weir_core::Error>(())
    /// ```
    pub fn from_env() -> Result<Option<Self>> {
        match std::env::var_os(SECRET_FILE_VAR) {
            None => Ok(None),
            Some(path) if path.is_empty() => Ok(None),
            Some(path) => Secret::from_file(&path)
                .map(Some)
                .map_err(|e| Error::Config(format!("{SECRET_FILE_VAR}: {e}"))),
        }
    }

    /// The secret in `file` when one is given (a `--secret-file` flag), else the one
    /// [`Secret::from_env`] finds.
    pub fn from_file_or_env(file: Option<&Path>) -> Result<Option<Self>> {
        match file {
            Some(path) => Secret::from_file(path).map(Some),
            None => Secret::from_env(),
        }
    }

    /// Whether `candidate` is the secret, compared in time that does not depend on where
    /// they differ.
    pub fn matches(&self, candidate: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), candidate.as_bytes());
        let mut diff = a.len() ^ b.len();
        for (i, x) in a.iter().enumerate() {
            diff |= usize::from(x ^ b.get(i).copied().unwrap_or(!x));
        }
        diff == 0
    }

    /// The secret itself, for a client to send.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surrounding_whitespace_is_not_part_of_the_secret() {
        let s = Secret::new("  abcdefghijklmnopq\n").unwrap();
        assert!(s.matches("abcdefghijklmnopq"));
        assert!(!s.matches("  abcdefghijklmnopq\n"));
        assert!(!s.matches(""));
        assert!(!s.matches("abcdefghijklmnop"));
    }

    #[test]
    fn a_missing_or_short_file_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Secret::from_file(dir.path().join("nope")).unwrap_err();
        assert!(
            missing.to_string().contains("cannot read the secret file"),
            "{missing}"
        );
        std::fs::write(dir.path().join("s"), "abc\n").unwrap();
        let short = Secret::from_file(dir.path().join("s")).unwrap_err();
        assert!(short.to_string().contains("3 bytes long"), "{short}");
    }
}
