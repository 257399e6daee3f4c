//! # weir-parquet
//!
//! Parquet output for weir: [`ParquetEncoder`] turns rows of a serde type into one complete
//! Parquet file, [`ParquetFileSink`] writes a stream into a directory of Parquet files
//! with exactly-once semantics, through the same two-phase commit as weir's exactly-once
//! text file sink, and [`ParquetObjects`] writes Parquet objects to object storage
//! (`s3://…`) through weir's exactly-once object sink. [`ParquetSinkExt`] adds both to the
//! DSL:
//!
//! ```
//! use weir::prelude::*;
//! use weir_parquet::{ParquetOptions, ParquetSinkExt};
//!
//! #[derive(Clone, serde::Serialize, serde::Deserialize)]
//! struct Trade { symbol: String, price: f64, qty: u32 }
//!
//! let dir = tempfile::tempdir().unwrap();
//! let env = Env::new().parallelism(1);
//! env.from_collection(vec![
//!     Trade { symbol: "A".into(), price: 1.5, qty: 10 },
//!     Trade { symbol: "B".into(), price: 2.5, qty: 20 },
//! ])
//! .write_parquet_exactly_once(dir.path(), ParquetOptions::default().max_rows(1));
//! env.execute("trades").unwrap();
//!
//! // Without checkpoints, the files are committed at end of input; one row per file here.
//! // Readers skip names starting with a dot (uncommitted files, the job's lease).
//! let mut names: Vec<String> = std::fs::read_dir(dir.path()).unwrap()
//!     .map(|e| e.unwrap().file_name().into_string().unwrap())
//!     .filter(|n| !n.starts_with('.'))
//!     .collect();
//! names.sort();
//! assert_eq!(names, [
//!     "part-0-00000000000000000000-000000.parquet",
//!     "part-0-00000000000000000000-000001.parquet",
//! ]);
//! ```
//!
//! ## Schema
//!
//! The schema is derived once from the row type's serde implementation (by `serde_arrow`,
//! tracing the type's `Deserialize`), so the type needs both `Serialize` and
//! `Deserialize`, as every weir record does. The row type must be a struct (or a tuple,
//! whose columns are named `0`, `1`, ...); its fields map as follows:
//!
//! | Rust | Parquet |
//! | --- | --- |
//! | `bool` | `BOOLEAN` |
//! | `i8` … `i64`, `u8` … `u64` | `INT32`/`INT64` with the integer's width and sign |
//! | `f32`, `f64` | `FLOAT`, `DOUBLE` |
//! | `String`, `char` | `BYTE_ARRAY` (UTF-8 string) |
//! | `Option<T>` | the column of `T`, optional; every other column is required |
//! | `Vec<T>`, arrays | a list of `T` |
//! | a struct | a group of its fields |
//! | `HashMap<String, T>`, `BTreeMap<String, T>` | a map |
//! | an enum without data (`enum Side { Buy, Sell }`) | a dictionary-encoded string of the variant name |
//!
//! A type with no such mapping fails with [`weir_core::Error::Config`] naming the type and the
//! field when the sink (or the encoder) is created, before any row is written: an enum with
//! data (a union, which Parquet cannot store), a field of unit type, or a type that serde
//! can only describe from a value (such as a dynamically typed JSON value).
//!
//! ## Files
//!
//! Each part file holds rows of one sink subtask. It is written as
//! `.part-<subtask>-<token>-<seq>.parquet.inprogress`; at a checkpoint barrier it is
//! finished (footer written, fsynced) and renamed to a pending name; when the checkpoint
//! completes it is renamed to
//! `part-<subtask>-<checkpoint as 20 digits>-<n as 6 digits>.parquet`, where `n` counts the
//! files of that subtask and checkpoint from 0. Names starting with a dot are uncommitted:
//! readers must skip them, and a reader never sees a committed name on an incomplete file.
//! Without checkpoints the files are committed at end of input, as checkpoint 0.
//!
//! Besides each checkpoint, a part closes when it reaches [`ParquetOptions::max_rows`],
//! [`ParquetOptions::max_bytes`] or [`ParquetOptions::max_age`]; it is then finished at
//! once and committed with the next checkpoint. See [`ParquetFileSink`] for restore.
//!
//! ## Object storage
//!
//! Given a URL (`s3://bucket/prefix`, `gs://…`, `az://…`, `memory://…`),
//! [`write_parquet_exactly_once`](ParquetSinkExt::write_parquet_exactly_once) writes each
//! part as an object `part-<subtask>-<counter as 20 digits>.parquet` by multipart upload,
//! completed when the checkpoint covering it completes (the upload is in the checkpoint),
//! with the restore rules of `weir_core::ops::object_sink`. Parts roll by the same limits.
//!
//! Memory stays bounded whatever the object's size: a Parquet file's footer comes last,
//! but the row groups before it never change once closed, so they are uploaded as the
//! object's parts as soon as [`ParquetOptions::part_size`] bytes of them wait (8 MiB), and
//! only the footer waits for the object to close. A subtask holds the row group being
//! encoded (closed at [`ParquetOptions::row_group_rows`] rows or about
//! [`ParquetOptions::row_group_bytes`], default 128 MiB), one batch of rows, and less than
//! a part (or one just-closed row group) not yet uploaded.

mod encoder;
mod objects;
mod sink;

pub use encoder::{ParquetEncoder, RowSchema};
pub use objects::ParquetObjects;
pub use sink::{ParquetFileSink, committed_name};

use std::path::PathBuf;
use std::time::Duration;
use weir_core::data::Data;
use weir_core::dsl::{SinkHandle, Stream};

/// How Parquet column chunks are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// Snappy (fast, moderate ratio): the default.
    #[default]
    Snappy,
    /// No compression.
    Uncompressed,
}

impl Compression {
    fn parquet(self) -> parquet::basic::Compression {
        match self {
            Compression::Snappy => parquet::basic::Compression::SNAPPY,
            Compression::Uncompressed => parquet::basic::Compression::UNCOMPRESSED,
        }
    }
}

/// How Parquet files are written and when a part file rolls over.
///
/// By default a part closes only at checkpoints (or at end of input without them); each
/// `max_*` limit closes it earlier, whichever comes first. The limits are checked when a row
/// arrives: the row that reaches one is the last of its file.
///
/// ```
/// use std::time::Duration;
/// use weir_parquet::{Compression, ParquetOptions};
/// let options = ParquetOptions::default()
///     .max_rows(1_000_000)
///     .max_bytes(128 << 20)
///     .max_age(Duration::from_secs(300))
///     .compression(Compression::Snappy);
/// assert_eq!(options.max_rows, Some(1_000_000));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ParquetOptions {
    /// Close a part once it holds this many rows.
    pub max_rows: Option<u64>,
    /// Close a part once it holds about this many bytes (encoded and compressed; rows of the
    /// batch not yet encoded, at most [`batch_rows`](Self::batch_rows), are not counted).
    pub max_bytes: Option<u64>,
    /// Close a part once a row arrives this long after the part's first row.
    pub max_age: Option<Duration>,
    /// Column compression.
    pub compression: Compression,
    /// Rows per Parquet row group (a file's unit of reading); the row group being written is
    /// kept in memory. Default 1,048,576 (the parquet crate's default).
    pub row_group_rows: usize,
    /// Rows buffered in Arrow builders before they are encoded into the row group; also how
    /// often [`max_bytes`](Self::max_bytes) sees the size grow. Default 1,024.
    pub batch_rows: usize,
    /// Close a row group once its encoded size in memory reaches about this many bytes
    /// (checked after each batch), whatever its rows: bounds the memory a row group takes.
    /// Default 128 MiB; `None` closes row groups by [`row_group_rows`](Self::row_group_rows)
    /// only.
    pub row_group_bytes: Option<u64>,
    /// On object storage: upload a part of the object whenever this many bytes of closed
    /// row groups are waiting (S3 needs at least 5 MiB for every part but the last). Default
    /// 8 MiB. Unused for local directories.
    pub part_size: usize,
}

impl Default for ParquetOptions {
    fn default() -> Self {
        ParquetOptions {
            max_rows: None,
            max_bytes: None,
            max_age: None,
            compression: Compression::Snappy,
            row_group_rows: 1024 * 1024,
            batch_rows: 1024,
            row_group_bytes: Some(128 << 20),
            part_size: weir_core::ops::object_sink::DEFAULT_PART_SIZE,
        }
    }
}

impl ParquetOptions {
    /// Closes a part once it holds `rows` rows.
    ///
    /// # Panics
    /// When `rows` is 0.
    pub fn max_rows(mut self, rows: u64) -> Self {
        assert!(rows > 0, "max_rows must be at least 1");
        self.max_rows = Some(rows);
        self
    }
    /// Closes a part once it holds about `bytes` bytes.
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }
    /// Closes a part once a row arrives `age` after its first row.
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }
    /// Sets the column compression.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }
    /// Sets the rows per row group.
    ///
    /// # Panics
    /// When `rows` is 0.
    pub fn row_group_rows(mut self, rows: usize) -> Self {
        assert!(rows > 0, "row_group_rows must be at least 1");
        self.row_group_rows = rows;
        self
    }
    /// Closes a row group once it takes about `bytes` bytes in memory (`None`: by rows
    /// only).
    pub fn row_group_bytes(mut self, bytes: Option<u64>) -> Self {
        self.row_group_bytes = bytes;
        self
    }
    /// Sets the part size of uploads to object storage (at least 1 byte; on S3 at least
    /// 5 MiB).
    pub fn part_size(mut self, bytes: usize) -> Self {
        self.part_size = bytes.max(1);
        self
    }
    /// Sets the rows buffered before encoding.
    ///
    /// # Panics
    /// When `rows` is 0.
    pub fn batch_rows(mut self, rows: usize) -> Self {
        assert!(rows > 0, "batch_rows must be at least 1");
        self.batch_rows = rows;
        self
    }
}

/// Adds [`write_parquet_exactly_once`](ParquetSinkExt::write_parquet_exactly_once) to
/// [`Stream`].
pub trait ParquetSinkExt<T> {
    /// Writes the stream into `dir` as Parquet files with exactly-once semantics: files are
    /// committed when the checkpoint covering them completes (or at end of input without
    /// checkpoints); uncommitted files start with a dot. The schema is derived from `T`
    /// (see the [crate docs](crate#schema)); a type without a Parquet mapping fails the
    /// job when it starts, naming the field. The directory is owned by one job run at a
    /// time, like the exactly-once text sink's.
    ///
    /// `dir` may be an object-storage URL instead: the parts are then objects
    /// `part-<subtask>-<counter>.parquet` that appear whole when their checkpoint completes
    /// (see [object storage](crate#object-storage)); the prefix is leased like a directory.
    ///
    /// ```
    /// use weir::prelude::*;
    /// use weir_parquet::{ParquetOptions, ParquetSinkExt};
    ///
    /// let env = Env::new().parallelism(1);
    /// env.from_collection((0..5u64).map(|i| (i, i * i)).collect::<Vec<_>>())
    ///     .write_parquet_exactly_once("memory://doc-parquet-dsl/out", ParquetOptions::default().max_rows(2));
    /// env.execute("squares").unwrap();
    ///
    /// // Without checkpoints, the objects are completed at end of input.
    /// let out = weir_objstore::Store::open("memory://doc-parquet-dsl/out").unwrap();
    /// let names: Vec<String> = out.list("part-").unwrap().into_iter().map(|o| o.name).collect();
    /// assert_eq!(names, [
    ///     "part-0-00000000000000000000.parquet",
    ///     "part-0-00000000000000000001.parquet",
    ///     "part-0-00000000000000000002.parquet",
    /// ]);
    /// ```
    fn write_parquet_exactly_once(
        &self,
        dir: impl Into<PathBuf>,
        options: ParquetOptions,
    ) -> SinkHandle;
}

impl<T: Data> ParquetSinkExt<T> for Stream<T> {
    fn write_parquet_exactly_once(
        &self,
        dir: impl Into<PathBuf>,
        options: ParquetOptions,
    ) -> SinkHandle {
        let dir = dir.into();
        // Derived once for every subtask; an error fails each subtask's open.
        let schema = RowSchema::<T>::derive().map_err(|e| match e {
            weir_core::Error::Config(m) => m,
            other => other.to_string(),
        });
        if let Some(url) = dir.to_str().filter(|d| weir_objstore::is_url(d)) {
            let url = url.to_string();
            let format = ParquetObjects::with_schema(schema, options);
            return self
                .sink("exactly-once-parquet-object", move || {
                    format.clone().into_sink(url.clone())
                })
                // One job run at a time writes below the prefix, as for a directory (leases
                // work on object storage too).
                .exclusive_dir(dir);
        }
        let owned = dir.clone();
        self.sink("exactly-once-parquet", move || {
            ParquetFileSink::with_schema(dir.clone(), schema.clone(), options.clone())
        })
        // Its restore deletes uncommitted files and commits pending ones.
        .exclusive_dir(owned)
    }
}
