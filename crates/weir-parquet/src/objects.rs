//! Parquet objects on object storage: the format of weir's exactly-once object sink.

use crate::{ParquetEncoder, ParquetOptions, RowSchema};
use serde::Serialize;
use serde::de::DeserializeOwned;
use weir_core::error::{Error, Result};
use weir_core::ops::object_sink::{ExactlyOnceObjectSink, ObjectFormat, Rolling};

/// Parquet as a format of weir's exactly-once object sink
/// ([`ExactlyOnceObjectSink`]): every object is one complete Parquet file, named
/// `part-<writer>-<counter as 20 digits>.parquet`.
///
/// ```
/// use weir_core::ids::CheckpointId;
/// use weir_core::ops::sink::{SinkContext, SinkFunction};
/// use weir_parquet::{ParquetObjects, ParquetOptions};
/// use parquet::file::reader::{FileReader, SerializedFileReader};
///
/// let mut sink = ParquetObjects::<(u64, String)>::sink(
///     "memory://doc-parquet-objects/out",
///     ParquetOptions::default().max_rows(2),
/// ).unwrap();
/// let ctx = SinkContext { subtask: 0, parallelism: 1, checkpointing: true, checkpoint_timing: None,
///     name: "parquet".into(), operator_id: "sink".into() };
/// sink.open(&ctx).unwrap();
/// for i in 0..3 {
///     sink.invoke((i, format!("row {i}")), 0).unwrap();
/// }
/// sink.snapshot(CheckpointId(1)).unwrap(); // pre-commit: two objects uploaded, invisible
/// let out = weir_objstore::Store::open("memory://doc-parquet-objects/out").unwrap();
/// assert!(out.list("part-").unwrap().is_empty());
/// sink.notify_complete(CheckpointId(1)).unwrap(); // commit: both appear whole
/// let names: Vec<String> = out.list("part-").unwrap().into_iter().map(|o| o.name).collect();
/// assert_eq!(names, ["part-0-00000000000000000000.parquet", "part-0-00000000000000000001.parquet"]);
/// let file = SerializedFileReader::new(bytes::Bytes::from(out.get(&names[0]).unwrap().unwrap())).unwrap();
/// assert_eq!(file.metadata().file_metadata().num_rows(), 2);
/// ```
pub struct ParquetObjects<T> {
    schema: std::result::Result<RowSchema<T>, String>,
    options: ParquetOptions,
}

impl<T> Clone for ParquetObjects<T> {
    fn clone(&self) -> Self {
        ParquetObjects {
            schema: self.schema.clone(),
            options: self.options.clone(),
        }
    }
}

impl<T: Serialize + DeserializeOwned> ParquetObjects<T> {
    /// The format, with the schema derived from `T` (fails naming the field when `T` has no
    /// Parquet mapping).
    pub fn new(options: ParquetOptions) -> Result<Self> {
        Ok(Self::with_schema(Ok(RowSchema::derive()?), options))
    }

    /// The exactly-once sink writing Parquet objects below `url`, rolling and uploading as
    /// `options` say ([`ParquetOptions::max_rows`], [`ParquetOptions::max_bytes`],
    /// [`ParquetOptions::max_age`], [`ParquetOptions::part_size`]).
    pub fn sink(url: &str, options: ParquetOptions) -> Result<ExactlyOnceObjectSink<T, Self>> {
        Ok(Self::new(options)?.into_sink(url.to_string()))
    }
}

impl<T> ParquetObjects<T> {
    /// The format with a schema derived before, or the message of why it could not be
    /// (each object then fails to start).
    pub(crate) fn with_schema(
        schema: std::result::Result<RowSchema<T>, String>,
        options: ParquetOptions,
    ) -> Self {
        ParquetObjects { schema, options }
    }

    /// The sink writing this format below `url`.
    pub(crate) fn into_sink(self, url: String) -> ExactlyOnceObjectSink<T, Self>
    where
        T: Serialize,
    {
        let o = &self.options;
        let mut rolling = Rolling::default();
        if let Some(rows) = o.max_rows {
            rolling = rolling.max_rows(rows);
        }
        if let Some(bytes) = o.max_bytes {
            rolling = rolling.max_bytes(bytes);
        }
        if let Some(age) = o.max_age {
            rolling = rolling.max_age(age);
        }
        let part_size = o.part_size;
        ExactlyOnceObjectSink::with_format(url, self)
            .with_part_size(part_size)
            .with_rolling(rolling)
    }
}

impl<T: Serialize> ObjectFormat<T> for ParquetObjects<T> {
    type Encoder = ParquetEncoder<T, Vec<u8>>;

    fn start(&self) -> Result<Self::Encoder> {
        let schema = self.schema.as_ref().map_err(|m| Error::Config(m.clone()))?;
        ParquetEncoder::with_writer(schema, Vec::new(), &self.options)
    }

    fn check(&self) -> Result<()> {
        self.schema
            .as_ref()
            .map(|_| ())
            .map_err(|m| Error::Config(m.clone()))
    }

    fn suffix(&self) -> &str {
        ".parquet"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use weir_core::ids::CheckpointId;
    use weir_core::ops::sink::{SinkContext, SinkFunction};
    use weir_objstore::Store;

    type Row = (u64, String);
    type Sink = ExactlyOnceObjectSink<Row, ParquetObjects<Row>>;

    fn row(i: u64) -> Row {
        (i, format!("r{i}"))
    }

    fn ctx() -> SinkContext {
        SinkContext {
            subtask: 0,
            parallelism: 1,
            checkpointing: true,
            checkpoint_timing: None,
            name: "parquet".into(),
            operator_id: "sink".into(),
        }
    }

    fn url(test: &str) -> String {
        format!("memory://parquet-objects-tests/{test}")
    }

    fn sink(url: &str, options: ParquetOptions, restore: Option<(u64, &[Vec<u8>])>) -> Sink {
        let mut s = ParquetObjects::sink(url, options).unwrap();
        if let Some((c, states)) = restore {
            s.restore(CheckpointId(c), states, &ctx()).unwrap();
        }
        s.open(&ctx()).unwrap();
        s
    }

    /// Committed objects with their rows, read with the parquet crate's reader (which fails
    /// on an incomplete file), and the names of everything else below the prefix.
    fn listing(url: &str) -> (Vec<(String, Vec<Row>)>, Vec<String>) {
        let store = Store::open(url).unwrap();
        let mut committed = Vec::new();
        let mut other = Vec::new();
        for o in store.list("").unwrap() {
            if o.name.starts_with("part-") {
                let bytes = bytes::Bytes::from(store.get(&o.name).unwrap().unwrap());
                let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .unwrap()
                    .build()
                    .unwrap();
                let rows = reader
                    .flat_map(|b| serde_arrow::from_record_batch::<Vec<Row>>(&b.unwrap()).unwrap())
                    .collect();
                committed.push((o.name, rows));
            } else {
                other.push(o.name);
            }
        }
        (committed, other)
    }

    fn name(counter: u64) -> String {
        format!("part-0-{counter:020}.parquet")
    }

    /// Rolling after 3 rows: one checkpoint covers four complete Parquet objects, invisible
    /// until it completes.
    #[test]
    fn rolling_commits_several_parquet_objects_per_checkpoint() {
        let url = url("rolling");
        let mut s = sink(&url, ParquetOptions::default().max_rows(3), None);
        for i in 0..10 {
            s.invoke(row(i), 0).unwrap();
        }
        s.snapshot(CheckpointId(1)).unwrap();
        let (committed, other) = listing(&url);
        assert!(committed.is_empty());
        assert_eq!(other.len(), 4, "four uploads in progress: {other:?}");
        s.notify_complete(CheckpointId(1)).unwrap();
        let expected: Vec<(String, Vec<Row>)> = (0..4u64)
            .map(|n| (name(n), (n * 3..(n * 3 + 3).min(10)).map(row).collect()))
            .collect();
        assert_eq!(listing(&url), (expected, vec![]));
    }

    /// An object larger than a part streams out before it closes: with row groups of 2 rows
    /// and parts of 1 byte, its upload starts (its marker appears) while it is open, and the
    /// object assembled from several parts is a complete Parquet file of every row.
    #[test]
    fn an_object_streams_out_in_parts_before_it_closes() {
        let url = url("parts");
        let options = ParquetOptions::default()
            .row_group_rows(2)
            .batch_rows(1)
            .part_size(1);
        let mut s = sink(&url, options, None);
        for i in 0..7 {
            s.invoke(row(i), 0).unwrap();
        }
        assert_eq!(
            listing(&url).1.len(),
            1,
            "the upload started with the first row group"
        );
        s.snapshot(CheckpointId(1)).unwrap();
        s.notify_complete(CheckpointId(1)).unwrap();
        assert_eq!(
            listing(&url),
            (vec![(name(0), (0..7).map(row).collect())], vec![])
        );
    }

    /// A crash after checkpoint 1 (two objects recorded, not completed), with checkpoint 2
    /// pre-committed and never completed and a further object in progress: the restore from
    /// 1 completes exactly the recorded objects and aborts the rest; the replay writes the
    /// later rows again, so every row is committed exactly once.
    #[test]
    fn rows_are_committed_exactly_once_across_a_restore() {
        let url = url("restore");
        let options = ParquetOptions::default()
            .max_rows(2)
            .row_group_rows(1)
            .batch_rows(1)
            .part_size(1);
        let mut s = sink(&url, options.clone(), None);
        for i in 0..4 {
            s.invoke(row(i), 0).unwrap();
        }
        let (state, _) = s.snapshot(CheckpointId(1)).unwrap().unwrap();
        for i in 4..7 {
            s.invoke(row(i), 0).unwrap();
        }
        s.snapshot(CheckpointId(2)).unwrap();
        s.invoke(row(7), 0).unwrap(); // in progress, one part uploaded
        drop(s);
        let (committed, other) = listing(&url);
        assert!(committed.is_empty());
        assert_eq!(other.len(), 5, "{other:?}");

        let mut s = sink(&url, options, Some((1, &[state])));
        let (committed, other) = listing(&url);
        assert_eq!(
            committed,
            vec![
                (name(0), vec![row(0), row(1)]),
                (name(1), vec![row(2), row(3)])
            ]
        );
        assert!(other.is_empty(), "the leftovers were aborted: {other:?}");
        for i in 4..9 {
            s.invoke(row(i), 0).unwrap();
        }
        s.snapshot(CheckpointId(2)).unwrap();
        s.notify_complete(CheckpointId(2)).unwrap();
        let (committed, other) = listing(&url);
        assert!(other.is_empty());
        let names: Vec<&str> = committed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [name(0), name(1), name(2), name(3), name(4)]);
        let rows: Vec<Row> = committed.into_iter().flat_map(|(_, r)| r).collect();
        assert_eq!(rows, (0..9).map(row).collect::<Vec<_>>());
    }

    /// A type without a Parquet mapping fails when the sink opens, before any row.
    #[test]
    fn a_type_without_a_mapping_fails_at_open() {
        #[derive(serde::Serialize, serde::Deserialize)]
        enum Shape {
            Circle(f64),
        }
        let format = ParquetObjects::<Shape>::with_schema(
            Err("cannot write Shape as Parquet".into()),
            ParquetOptions::default(),
        );
        let mut s = format.into_sink(url("bad-type"));
        let e = s.open(&ctx()).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let _ = Shape::Circle(1.0);
    }
}
