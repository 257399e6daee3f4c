//! Object storage for weir: a blocking handle ([`Store`]) on a URL prefix such as
//! `s3://bucket/checkpoints`, built on the `object_store` crate.
//!
//! weir's checkpoint storage and its exactly-once file sink are synchronous code on task
//! threads; this crate runs `object_store`'s futures on one small tokio runtime of its own and
//! waits for them, so callers need no runtime (and may call from inside another one).
//!
//! # URLs and credentials
//!
//! | URL | store | configured from |
//! |---|---|---|
//! | `s3://bucket/prefix` (`s3a://`) | S3 and S3-compatible servers | `AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint, and the other `AWS_*` variables `object_store` reads |
//! | `gs://bucket/prefix` | Google Cloud Storage | `GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_APPLICATION_CREDENTIALS`, … |
//! | `az://container/prefix` (`azure://`) | Azure Blob Storage | `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`, … |
//! | `memory://name/prefix` | an in-process store (tests and examples) | nothing: stores of one name are shared within a process |
//!
//! Credentials are never logged: errors and log lines carry the URL and the operation only.
//!
//! Every request is retried with exponential backoff on 5xx answers, timeouts and refused
//! connections, for at most [`RETRY_TIMEOUT`] (override with `WEIR_OBJECT_STORE_RETRY_SECS`);
//! then the operation fails and the caller decides (a checkpoint fails, a later one is
//! tried).
//!
//! ```
//! let store = weir_objstore::Store::open("memory://doc/prefix")?;
//! store.put("a/one", b"hello".to_vec())?;
//! assert_eq!(store.get("a/one")?.as_deref(), Some(&b"hello"[..]));
//! assert_eq!(store.list("a/")?.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["a/one"]);
//! store.delete("a/one")?;
//! assert_eq!(store.get("a/one")?, None);
//! # Ok::<(), weir_objstore::Error>(())
//! ```

mod config;
mod error;
mod read;
mod runtime;
mod stats;
mod upload;

pub use config::set_options;
use config::{CONNECT_TIMEOUT, configured, memory_store, retry_config, roots};
pub use error::{Error, Result};
pub use read::ObjectReader;
pub use stats::{Stats, stats};

use futures_util::StreamExt;
use object_store::multipart::MultipartStore;
use object_store::path::Path as Key;
use object_store::{ObjectStore, PutPayload};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a request is retried (with backoff) before the operation fails, unless
/// `WEIR_OBJECT_STORE_RETRY_SECS` says otherwise.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// Files up to this size are uploaded with one PUT; larger ones by multipart upload in parts
/// of this size, several in flight at once.
pub const PART_SIZE: usize = 8 << 20;

/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;

/// URL schemes served by object storage (anything else is a local path).
const SCHEMES: [&str; 6] = ["s3", "s3a", "gs", "az", "azure", "memory"];

/// True when `location` is an object-storage URL (`s3://…`, `gs://…`, `az://…`,
/// `memory://…`) rather than a local path. `file://` URLs are local paths.
///
/// ```
/// assert!(weir_objstore::is_url("s3://bucket/ck"));
/// assert!(!weir_objstore::is_url("/var/lib/weir/ck"));
/// assert!(!weir_objstore::is_url("file:///var/lib/weir/ck"));
/// ```
pub fn is_url(location: &str) -> bool {
    location
        .split_once("://")
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()))
}

/// The local path of a `file://` URL, or `location` itself when it is no URL.
///
/// ```
/// assert_eq!(weir_objstore::local_path("file:///tmp/ck"), Some(std::path::PathBuf::from("/tmp/ck")));
/// assert_eq!(weir_objstore::local_path("ck"), Some(std::path::PathBuf::from("ck")));
/// assert_eq!(weir_objstore::local_path("s3://b/ck"), None);
/// ```
pub fn local_path(location: &str) -> Option<std::path::PathBuf> {
    if let Some(rest) = location.strip_prefix("file://") {
        return Some(std::path::PathBuf::from(rest));
    }
    (!is_url(location)).then(|| std::path::PathBuf::from(location))
}

/// An object found by [`Store::list`] or [`Store::head`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Its name relative to the store's prefix (`chk-00000000000000000001/_metadata`).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was last written, in Unix milliseconds by the server's clock.
    pub modified_ms: i64,
}

/// A blocking handle on a prefix of an object store: names passed to its methods are
/// relative to the prefix and use `/` between levels.
///
/// Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    store: Arc<dyn ObjectStore>,
    multipart: Arc<dyn MultipartStore>,
    prefix: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("url", &self.inner.url)
            .finish()
    }
}

impl Store {
    /// Opens `url` (see the crate documentation for schemes and credentials). Nothing is
    /// requested from the server yet; a wrong endpoint or credentials show on first use.
    pub fn open(url: &str) -> Result<Store> {
        // One client (and connection pool) per bucket: open the bucket once, then take the
        // prefix below it.
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if scheme.is_empty()
            || bucket.is_empty()
            || prefix.split('/').any(|p| p == "." || p == "..")
        {
            return Store::open_uncached(url);
        }
        let root_url = format!("{}://{bucket}", scheme.to_ascii_lowercase());
        let root = {
            let cache = roots();
            let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
            match cache.get(&root_url) {
                Some(r) => r.clone(),
                None => {
                    let r = Store::open_uncached(&root_url)?;
                    cache.insert(root_url, r.clone());
                    r
                }
            }
        };
        Ok(root.child(prefix))
    }

    fn open_uncached(url: &str) -> Result<Store> {
        let bad = |message: String| Error::Config {
            url: url.to_string(),
            message,
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("not a URL (expected s3://bucket/prefix)".into()))?;
        let scheme = scheme.to_ascii_lowercase();
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad(format!(
                "no bucket (expected {scheme}://bucket/prefix)"
            )));
        }
        use object_store::ClientConfigKey::ConnectTimeout;
        let prefix = prefix.trim_matches('/').to_string();
        if prefix.split('/').any(|p| p == "." || p == "..") {
            return Err(bad(
                "'.' and '..' are not allowed in an object prefix".into()
            ));
        }
        let (store, multipart): (Arc<dyn ObjectStore>, Arc<dyn MultipartStore>) = match scheme
            .as_str()
        {
            "s3" | "s3a" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env();
                for (k, v) in configured::<object_store::aws::AmazonS3ConfigKey>(&["aws_"], url)? {
                    b = b.with_config(k, v);
                }
                let s = b
                    .with_bucket_name(bucket)
                    .with_retry(retry_config())
                    .with_config(
                        object_store::aws::AmazonS3ConfigKey::Client(ConnectTimeout),
                        CONNECT_TIMEOUT,
                    )
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                let s = Arc::new(s);
                (s.clone(), s)
            }
            "gs" => {
                let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env();
                for (k, v) in configured::<object_store::gcp::GoogleConfigKey>(&["google_"], url)? {
                    b = b.with_config(k, v);
                }
                let s = b
                    .with_bucket_name(bucket)
                    .with_retry(retry_config())
                    .with_config(
                        object_store::gcp::GoogleConfigKey::Client(ConnectTimeout),
                        CONNECT_TIMEOUT,
                    )
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                let s = Arc::new(s);
                (s.clone(), s)
            }
            "az" | "azure" => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env();
                for (k, v) in configured::<object_store::azure::AzureConfigKey>(&["azure_"], url)? {
                    b = b.with_config(k, v);
                }
                let s = b
                    .with_container_name(bucket)
                    .with_retry(retry_config())
                    .with_config(
                        object_store::azure::AzureConfigKey::Client(ConnectTimeout),
                        CONNECT_TIMEOUT,
                    )
                    .build()
                    .map_err(|e| bad(e.to_string()))?;
                let s = Arc::new(s);
                (s.clone(), s)
            }
            "memory" => {
                let s = memory_store(bucket);
                (s.clone(), s)
            }
            other => {
                return Err(bad(format!(
                    "unknown scheme '{other}' (weir reads s3://, gs://, az:// and memory://; \
                         a local directory is a plain path or file://)"
                )));
            }
        };
        Ok(Store {
            inner: Arc::new(Inner {
                url: format!(
                    "{scheme}://{bucket}{}{prefix}",
                    if prefix.is_empty() { "" } else { "/" }
                ),
                store,
                multipart,
                prefix,
            }),
        })
    }

    /// The store's URL, normalised (no trailing `/`).
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The URL of `name` in this store.
    pub fn url_of(&self, name: &str) -> String {
        if name.is_empty() {
            self.inner.url.clone()
        } else {
            format!("{}/{}", self.inner.url, name.trim_start_matches('/'))
        }
    }

    /// A handle on the prefix `name` below this one (`store.child("chk-1")`).
    pub fn child(&self, name: &str) -> Store {
        let name = name.trim_matches('/');
        let prefix = match (self.inner.prefix.is_empty(), name.is_empty()) {
            (_, true) => self.inner.prefix.clone(),
            (true, false) => name.to_string(),
            (false, false) => format!("{}/{name}", self.inner.prefix),
        };
        Store {
            inner: Arc::new(Inner {
                url: self.url_of(name),
                store: self.inner.store.clone(),
                multipart: self.inner.multipart.clone(),
                prefix,
            }),
        }
    }

    fn key(&self, name: &str) -> Key {
        let name = name.trim_matches('/');
        match (self.inner.prefix.is_empty(), name.is_empty()) {
            (true, _) => Key::from(name),
            (false, true) => Key::from(self.inner.prefix.as_str()),
            (false, false) => Key::from(format!("{}/{name}", self.inner.prefix)),
        }
    }

    /// `key` relative to this store's prefix.
    fn relative(&self, key: &Key) -> String {
        let full = key.as_ref();
        if self.inner.prefix.is_empty() {
            return full.to_string();
        }
        full.strip_prefix(self.inner.prefix.as_str())
            .map(|r| r.trim_start_matches('/'))
            .unwrap_or(full)
            .to_string()
    }

    fn failed(&self, op: &'static str, name: &str, source: object_store::Error) -> Error {
        Error::Store {
            op,
            url: self.url_of(name),
            source: Box::new(source),
        }
    }

    /// Writes `bytes` as object `name` with one PUT: readers see all of it or none of it.
    pub fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let store = self.inner.store.clone();
        let key = self.key(name);
        let n = bytes.len() as u64;
        let started = Instant::now();
        runtime::block_on(async move { store.put(&key, PutPayload::from(bytes)).await })
            .map_err(|e| self.failed("write", name, e))?;
        stats::wrote(n, started.elapsed());
        Ok(())
    }

    /// Reads object `name` whole; `None` when it does not exist.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let store = self.inner.store.clone();
        let key = self.key(name);
        let started = Instant::now();
        let got = runtime::block_on(async move {
            match store.get(&key).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| self.failed("read", name, e))?;
        if let Some(b) = &got {
            stats::read(b.len() as u64, started.elapsed());
        }
        Ok(got.map(|b| b.to_vec()))
    }

    /// Size and time of object `name`; `None` when it does not exist.
    pub fn head(&self, name: &str) -> Result<Option<Object>> {
        let store = self.inner.store.clone();
        let key = self.key(name);
        let meta = runtime::block_on(async move {
            match store.head(&key).await {
                Ok(m) => Ok(Some(m)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| self.failed("look up", name, e))?;
        Ok(meta.map(|m| self.object(&m)))
    }

    fn object(&self, m: &object_store::ObjectMeta) -> Object {
        Object {
            name: self.relative(&m.location),
            size: m.size,
            modified_ms: m.last_modified.timestamp_millis(),
        }
    }

    /// Every object whose name starts with `prefix` (`""` for all; `"chk-1/"` for one
    /// level and all below it), sorted by name.
    pub fn list(&self, prefix: &str) -> Result<Vec<Object>> {
        let store = self.inner.store.clone();
        // List from the deepest "directory" of `prefix`, then filter by the rest of it.
        let (dir, _) = prefix.rsplit_once('/').unwrap_or(("", prefix));
        let key = self.key(dir);
        let root = (!self.inner.prefix.is_empty() || !dir.is_empty()).then_some(key);
        let metas = runtime::block_on(async move {
            let mut out = Vec::new();
            let mut listing = store.list(root.as_ref());
            while let Some(m) = listing.next().await {
                out.push(m?);
            }
            Ok::<_, object_store::Error>(out)
        })
        .map_err(|e| self.failed("list", prefix, e))?;
        let mut out: Vec<Object> = metas
            .iter()
            .map(|m| self.object(m))
            .filter(|o| o.name.starts_with(prefix))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        // Some servers on a file system (S3Proxy's filesystem provider) also list each
        // directory as an object: drop a name that other names continue with `/`.
        let dirs: std::collections::HashSet<String> = out
            .iter()
            .filter_map(|o| o.name.rsplit_once('/').map(|(d, _)| d.to_string()))
            .flat_map(|d| {
                let parts: Vec<&str> = d.split('/').collect();
                (1..=parts.len())
                    .map(move |i| parts[..i].join("/"))
                    .collect::<Vec<_>>()
            })
            .collect();
        out.retain(|o| !dirs.contains(&o.name));
        Ok(out)
    }

    /// The names of the "directories" directly below `dir` (`""` for the top), without the
    /// trailing `/`, sorted: the common prefixes of a delimited listing.
    pub fn list_dirs(&self, dir: &str) -> Result<Vec<String>> {
        let store = self.inner.store.clone();
        let key = self.key(dir);
        let root =
            (!self.inner.prefix.is_empty() || !dir.trim_matches('/').is_empty()).then_some(key);
        let result =
            runtime::block_on(async move { store.list_with_delimiter(root.as_ref()).await })
                .map_err(|e| self.failed("list", dir, e))?;
        let mut out: Vec<String> = result
            .common_prefixes
            .iter()
            .map(|p| {
                let rel = self.relative(p);
                rel.rsplit('/').next().unwrap_or(&rel).to_string()
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Copies object `from` to `to` on the server (S3 `CopyObject`): the bytes do not pass
    /// through this process, and readers see the whole copy or none of it.
    pub fn copy(&self, from: &str, to: &str) -> Result<()> {
        let store = self.inner.store.clone();
        let (src, dst) = (self.key(from), self.key(to));
        runtime::block_on(async move { store.copy(&src, &dst).await })
            .map_err(|e| self.failed("copy", from, e))
    }

    /// Deletes object `name`; deleting one that does not exist is no error.
    pub fn delete(&self, name: &str) -> Result<()> {
        let store = self.inner.store.clone();
        let key = self.key(name);
        runtime::block_on(async move {
            match store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| self.failed("delete", name, e))
    }
}

#[cfg(test)]
mod tests;
