//! Reading objects: whole, streamed into a file or through a checksum, or as a reader.

use crate::{Error, Result, Store, runtime, stats};
use bytes::Bytes;
use futures_util::StreamExt;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

impl Store {
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
