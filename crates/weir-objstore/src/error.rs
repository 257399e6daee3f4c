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
    #[error("cannot {op} {url}: {source}{}", hint(source))]
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
    /// True when a request failed in a way that may pass on a later try: the server could
    /// not be reached or kept failing, not a missing object, bucket or credentials.
    ///
    /// ```
    /// let e = weir_objstore::Error::Config { url: "s3:/x".into(), message: "bad".into() };
    /// assert!(!e.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        let Error::Store { source, .. } = self else {
            return false;
        };
        if matches!(
            **source,
            object_store::Error::NotFound { .. }
                | object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotSupported { .. }
                | object_store::Error::NotImplemented
                | object_store::Error::InvalidPath { .. }
                | object_store::Error::UnknownConfigurationKey { .. }
        ) {
            return false;
        }
        // What the hint names as the user's to fix is not transient either.
        hint(source).is_empty() || hint(source).contains("cannot be reached")
    }

    /// True when the object (or upload) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Store { source, .. } if matches!(**source, object_store::Error::NotFound { .. }))
    }
}

/// What a user can do about a failed request, from what the store answered.
fn hint(source: &object_store::Error) -> String {
    let text = source.to_string();
    let has = |s: &str| text.contains(s);
    let hint = if has("NoSuchBucket") {
        "the bucket does not exist: create it, or fix the URL"
    } else if has("SignatureDoesNotMatch") || has("InvalidAccessKeyId") || has("403 Forbidden") {
        "the server refused the credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
         (or the options given to weir_objstore::set_options)"
    } else if has("instance metadata") || has("credential") || has("Credentials") {
        "no credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the \
         store's own variables)"
    } else if has("error sending request") || has("Connection refused") || has("dns error") {
        "the endpoint cannot be reached: is the server running, and are AWS_ENDPOINT_URL \
         (and AWS_ALLOW_HTTP=true for a plain-HTTP endpoint) right?"
    } else if has("builder error") || has("BadScheme") || has("URL scheme is not allowed") {
        "the endpoint uses plain HTTP: set AWS_ALLOW_HTTP=true for a test server"
    } else {
        return String::new();
    };
    format!(" ({hint})")
}

/// A result of this crate.
pub type Result<T> = std::result::Result<T, Error>;
