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

mod error;
mod runtime;
mod stats;

pub use error::{Error, Result};
pub use stats::{Stats, stats};

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use object_store::{ObjectStore, PutPayload, WriteMultipart};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
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

fn retry_config() -> object_store::RetryConfig {
    let configured = options()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(k, _)| k == "weir_object_store_retry_secs")
        .map(|(_, v)| v.clone());
    let timeout = configured
        .or_else(|| std::env::var("WEIR_OBJECT_STORE_RETRY_SECS").ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(RETRY_TIMEOUT);
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 20,
        retry_timeout: timeout,
    }
}

/// A connection that is not up within this long counts as failed (and is retried), so a
/// stopped server is noticed quickly.
const CONNECT_TIMEOUT: &str = "5s";

/// Settings given in code ([`set_options`]), applied over the environment's.
fn options() -> &'static Mutex<Vec<(String, String)>> {
    static OPTIONS: OnceLock<Mutex<Vec<(String, String)>>> = OnceLock::new();
    OPTIONS.get_or_init(Default::default)
}

/// Sets options for every store opened afterwards in this process, over what the environment
/// says: keys as `object_store` names them, the same as the environment variables in lower
/// case (`aws_endpoint_url`, `aws_access_key_id`, `aws_secret_access_key`, `aws_region`,
/// `aws_allow_http`, `google_service_account`, `azure_storage_account_name`, …), and
/// `weir_object_store_retry_secs` for how long requests are retried. A key that
/// does not belong to a store's kind is ignored by it; an unknown key fails
/// [`Store::open`].
///
/// For programs that take credentials from their own configuration rather than the
/// environment; a later call replaces the options of an earlier one.
///
/// ```
/// weir_objstore::set_options([("aws_region", "eu-west-1")]);
/// assert!(weir_objstore::Store::open("s3://bucket/prefix").is_ok());
/// weir_objstore::set_options([("aws_no_such_key", "x")]);
/// let e = weir_objstore::Store::open("s3://bucket/prefix").unwrap_err();
/// assert!(e.to_string().contains("aws_no_such_key"), "{e}");
/// weir_objstore::set_options(Vec::<(String, String)>::new());
/// ```
pub fn set_options<K: Into<String>, V: Into<String>>(options: impl IntoIterator<Item = (K, V)>) {
    let new: Vec<(String, String)> = options
        .into_iter()
        .map(|(k, v)| (k.into().to_ascii_lowercase(), v.into()))
        .collect();
    *self::options().lock().unwrap_or_else(|p| p.into_inner()) = new;
    roots().lock().unwrap_or_else(|p| p.into_inner()).clear();
}

/// The options of [`set_options`] whose keys start with one of `prefixes`, parsed as `C`.
fn configured<C: std::str::FromStr>(prefixes: &[&str], url: &str) -> Result<Vec<(C, String)>>
where
    C::Err: std::fmt::Display,
{
    let all = options().lock().unwrap_or_else(|p| p.into_inner()).clone();
    all.into_iter()
        .filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| {
            k.parse::<C>().map(|c| (c, v)).map_err(|e| Error::Config {
                url: url.to_string(),
                message: format!("option '{k}': {e}"),
            })
        })
        .collect()
}

/// Opened buckets, by `scheme://bucket` (emptied by [`set_options`]).
fn roots() -> &'static Mutex<HashMap<String, Store>> {
    static ROOTS: OnceLock<Mutex<HashMap<String, Store>>> = OnceLock::new();
    ROOTS.get_or_init(Default::default)
}

/// The in-process stores of `memory://` URLs, by name.
fn memory_store(name: &str) -> Arc<object_store::memory::InMemory> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<object_store::memory::InMemory>>>> =
        OnceLock::new();
    let mut all = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    all.entry(name.to_string())
        .or_insert_with(|| Arc::new(object_store::memory::InMemory::new()))
        .clone()
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

    /// Uploads the local file `path` as object `name`, reading it once, streamed: one PUT up to
    /// [`PART_SIZE`], a multipart upload with parts in parallel beyond. Returns its size and
    /// CRC-32 as read. Readers see the whole object or none of it.
    pub fn put_file(&self, name: &str, path: &Path) -> Result<(u64, u32)> {
        let io = |e: std::io::Error| Error::Io {
            op: "read",
            path: path.display().to_string(),
            source: e,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let started = Instant::now();
        if len <= PART_SIZE as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).map_err(io)?;
            let crc = crc32fast::hash(&bytes);
            let n = bytes.len() as u64;
            self.put(name, bytes)?;
            return Ok((n, crc));
        }
        let store = self.inner.store.clone();
        let key = self.key(name);
        let (chunks_tx, mut chunks_rx) = tokio::sync::mpsc::channel::<Bytes>(PARTS_IN_FLIGHT);
        // The upload runs on the runtime; this thread reads the file and hands it over in
        // parts, so at most a few parts are in memory at once.
        let upload = runtime::spawn(async move {
            let upload = store.put_multipart(&key).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
            while let Some(chunk) = chunks_rx.recv().await {
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.put(chunk);
            }
            writer.finish().await.map(|_| ())
        });
        let mut crc = crc32fast::Hasher::new();
        let mut size = 0u64;
        let mut read_error = None;
        loop {
            let mut buf = vec![0u8; PART_SIZE];
            let n = match read_full(&mut file, &mut buf) {
                Ok(n) => n,
                Err(e) => {
                    read_error = Some(e);
                    break;
                }
            };
            if n == 0 {
                break;
            }
            buf.truncate(n);
            crc.update(&buf);
            size += n as u64;
            if chunks_tx.blocking_send(Bytes::from(buf)).is_err() {
                break; // the upload failed: its error is reported below
            }
        }
        if let Some(e) = read_error {
            // Dropping the upload future aborts the multipart upload.
            upload.abort();
            return Err(io(e));
        }
        drop(chunks_tx);
        upload.wait().map_err(|e| self.failed("upload", name, e))?;
        stats::wrote(size, started.elapsed());
        Ok((size, crc.finalize()))
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

    /// Streams object `name` into the local file `target` (created or truncated); returns
    /// its size and CRC-32, or `None` when the object does not exist.
    pub fn download(&self, name: &str, target: &Path) -> Result<Option<(u64, u32)>> {
        self.stream(name, Some(target))
    }

    /// Streams object `name` through a CRC-32 without keeping it: its size and CRC-32, or
    /// `None` when it does not exist.
    pub fn checksum(&self, name: &str) -> Result<Option<(u64, u32)>> {
        self.stream(name, None)
    }

    fn stream(&self, name: &str, target: Option<&Path>) -> Result<Option<(u64, u32)>> {
        use std::io::Write;
        let io = |path: &Path, e: std::io::Error| Error::Io {
            op: "write",
            path: path.display().to_string(),
            source: e,
        };
        let mut out = match target {
            Some(p) => Some(std::fs::File::create(p).map_err(|e| io(p, e))?),
            None => None,
        };
        let store = self.inner.store.clone();
        let key = self.key(name);
        let (tx, rx) = std::sync::mpsc::sync_channel::<object_store::Result<Bytes>>(4);
        let started = Instant::now();
        let reading = runtime::spawn(async move {
            let got = match store.get(&key).await {
                Ok(r) => r,
                Err(object_store::Error::NotFound { .. }) => return Ok(false),
                Err(e) => return Err(e),
            };
            let mut body = got.into_stream();
            while let Some(chunk) = body.next().await {
                let failed = chunk.is_err();
                // A blocking send on the runtime is fine here: the receiver is a thread
                // that only waits for these chunks, and the channel is short.
                if tx.send(chunk).is_err() || failed {
                    break;
                }
            }
            Ok(true)
        });
        let mut crc = crc32fast::Hasher::new();
        let mut size = 0u64;
        for chunk in rx {
            let chunk = chunk.map_err(|e| self.failed("read", name, e))?;
            crc.update(&chunk);
            size += chunk.len() as u64;
            if let (Some(f), Some(p)) = (out.as_mut(), target) {
                f.write_all(&chunk).map_err(|e| io(p, e))?;
            }
        }
        if !reading.wait().map_err(|e| self.failed("read", name, e))? {
            if let Some(p) = target {
                let _ = std::fs::remove_file(p);
            }
            return Ok(None);
        }
        if let (Some(f), Some(p)) = (out, target) {
            f.sync_all().map_err(|e| io(p, e))?;
        }
        stats::read(size, started.elapsed());
        Ok(Some((size, crc.finalize())))
    }

    /// A reader of object `name`, streamed (a few chunks in memory at a time); `None` when
    /// the object does not exist. For input read once from start to end, such as a text
    /// file source.
    ///
    /// ```
    /// use std::io::BufRead;
    /// let store = weir_objstore::Store::open("memory://reader-doc/in")?;
    /// store.put("lines.txt", b"a,1\nb,2\n".to_vec())?;
    /// let reader = std::io::BufReader::new(store.reader("lines.txt")?.expect("it exists"));
    /// let lines: Vec<String> = reader.lines().collect::<Result<_, _>>().unwrap();
    /// assert_eq!(lines, ["a,1", "b,2"]);
    /// assert!(store.reader("missing")?.is_none());
    /// # Ok::<(), weir_objstore::Error>(())
    /// ```
    pub fn reader(&self, name: &str) -> Result<Option<ObjectReader>> {
        let store = self.inner.store.clone();
        let key = self.key(name);
        let got = runtime::block_on(async move {
            match store.get(&key).await {
                Ok(r) => Ok(Some(r)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| self.failed("read", name, e))?;
        let Some(got) = got else { return Ok(None) };
        let (tx, rx) = tokio::sync::mpsc::channel::<object_store::Result<Bytes>>(4);
        // Ends when the body ends, fails, or the reader is dropped (the send fails).
        drop(runtime::spawn(async move {
            let mut body = got.into_stream();
            while let Some(chunk) = body.next().await {
                let failed = chunk.is_err();
                if tx.send(chunk).await.is_err() || failed {
                    break;
                }
            }
        }));
        Ok(Some(ObjectReader {
            chunks: rx,
            current: Bytes::new(),
            url: self.url_of(name),
        }))
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

    /// Starts a multipart upload of object `name`; returns its upload id, which
    /// [`put_part`](Self::put_part), [`complete_upload`](Self::complete_upload) and
    /// [`abort_upload`](Self::abort_upload) take, also from another process. Nothing is
    /// visible under `name` until the upload is completed.
    pub fn create_upload(&self, name: &str) -> Result<String> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        runtime::block_on(async move { mp.create_multipart(&key).await })
            .map_err(|e| self.failed("start an upload of", name, e))
    }

    /// Uploads part `index` (from 0; every part but the last at least 5 MiB on S3) of upload
    /// `upload` of object `name`; returns the part's id for
    /// [`complete_upload`](Self::complete_upload).
    pub fn put_part(
        &self,
        name: &str,
        upload: &str,
        index: usize,
        bytes: Vec<u8>,
    ) -> Result<String> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        let id = upload.to_string();
        let n = bytes.len() as u64;
        let started = Instant::now();
        let part = runtime::block_on(async move {
            mp.put_part(&key, &id, index, PutPayload::from(bytes)).await
        })
        .map_err(|e| self.failed("upload a part of", name, e))?;
        stats::wrote(n, started.elapsed());
        Ok(part.content_id)
    }

    /// Completes upload `upload` of object `name` from its parts' ids, in order: the object
    /// appears whole.
    pub fn complete_upload(&self, name: &str, upload: &str, parts: Vec<String>) -> Result<()> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        let id = upload.to_string();
        let parts = parts
            .into_iter()
            .map(|content_id| PartId { content_id })
            .collect();
        runtime::block_on(async move { mp.complete_multipart(&key, &id, parts).await.map(|_| ()) })
            .map_err(|e| self.failed("complete the upload of", name, e))
    }

    /// Aborts upload `upload` of object `name`, deleting its parts; an upload the server no
    /// longer knows is no error.
    pub fn abort_upload(&self, name: &str, upload: &str) -> Result<()> {
        let mp = self.inner.multipart.clone();
        let key = self.key(name);
        let id = upload.to_string();
        runtime::block_on(async move {
            match mp.abort_multipart(&key, &id).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) if unknown_upload(&e) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .map_err(|e| self.failed("abort the upload of", name, e))
    }
}

/// True when `e` says the upload is unknown in a store that does not report it as
/// `NotFound` (the in-memory store), so that aborting a finished upload is no error there
/// either, as on S3.
fn unknown_upload(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { store: "InMemory", source }
        if source.to_string().starts_with("MultipartUpload not found"))
}

/// A blocking reader of one object ([`Store::reader`]).
pub struct ObjectReader {
    chunks: tokio::sync::mpsc::Receiver<object_store::Result<Bytes>>,
    current: Bytes,
    url: String,
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader")
            .field("url", &self.url)
            .finish()
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.chunks.blocking_recv() {
                Some(Ok(chunk)) => {
                    stats::read(chunk.len() as u64, Duration::ZERO);
                    self.current = chunk;
                }
                Some(Err(e)) => {
                    return Err(std::io::Error::other(format!(
                        "cannot read {}: {e}",
                        self.url
                    )));
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Reads until `buf` is full or the file ends; returns how much was read.
fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests;
