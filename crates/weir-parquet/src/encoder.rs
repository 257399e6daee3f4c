//! Rows of a serde type into one complete Parquet file.

use crate::ParquetOptions;
use arrow_schema::{DataType, FieldRef, Schema, SchemaRef};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::file::properties::WriterProperties;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_arrow::schema::{SchemaLike, TracingOptions};
use std::io::Write;
use std::marker::PhantomData;
use std::sync::Arc;
use weir_core::ops::object_sink::ObjectEncoder;
use weir_core::{Error, Result};

/// The Parquet schema of the rows of type `T`, derived once from `T`'s serde
/// implementation (see the [crate docs](crate#schema) for the mapping).
///
/// ```
/// use weir_parquet::RowSchema;
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Bid { auction: u64, bidder: String, price: Option<f64> }
///
/// let schema = RowSchema::<Bid>::derive().unwrap();
/// let arrow = schema.arrow_schema();
/// let names: Vec<&str> = arrow.fields().iter().map(|f| f.name().as_str()).collect();
/// assert_eq!(names, ["auction", "bidder", "price"]);
/// assert!(arrow.field_with_name("price").unwrap().is_nullable());
/// assert!(!arrow.field_with_name("bidder").unwrap().is_nullable());
/// ```
pub struct RowSchema<T> {
    fields: Arc<[FieldRef]>,
    schema: SchemaRef,
    _t: PhantomData<fn(&T)>,
}

impl<T> Clone for RowSchema<T> {
    fn clone(&self) -> Self {
        RowSchema {
            fields: self.fields.clone(),
            schema: self.schema.clone(),
            _t: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for RowSchema<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowSchema")
            .field("type", &std::any::type_name::<T>())
            .field("schema", &self.schema)
            .finish()
    }
}

impl<T: Serialize + DeserializeOwned> RowSchema<T> {
    /// Derives the schema from `T`'s serde implementation, or fails with an
    /// [`Error::Config`] naming `T` and the field that has no Parquet mapping.
    pub fn derive() -> Result<Self> {
        let ty = std::any::type_name::<T>();
        let options = TracingOptions::default()
            // C-like enums become strings (dictionary-encoded) rather than unions, which
            // Parquet has no type for.
            .enums_without_data_as_strings(true)
            // Maps stay maps: a struct needs its keys known from the type.
            .map_as_struct(false);
        let fields = Vec::<FieldRef>::from_type::<T>(options).map_err(|e| {
            Error::Config(format!(
                "cannot derive a Parquet schema from {ty}: {e}; the rows of a Parquet sink \
                 must be a struct (or a tuple) whose fields are numbers, booleans, strings, \
                 bytes, options, sequences, maps or structs of these, and enums without data"
            ))
        })?;
        if fields.is_empty() {
            return Err(Error::Config(format!(
                "cannot derive a Parquet schema from {ty}: it has no fields"
            )));
        }
        // The serde mapping may produce Arrow types Parquet cannot store (an enum with data
        // becomes a union, which the parquet crate's converter does not even report as an
        // error): check each field, so the error names the one at fault.
        for f in &fields {
            if let Some(path) = union_path(f.name(), f.data_type()) {
                return Err(Error::Config(format!(
                    "cannot write {ty} as Parquet: field `{path}` is an enum with data, which \
                     maps to an Arrow union and has no Parquet type; use an enum without data, \
                     or a struct of options with one field per variant"
                )));
            }
        }
        let converter = ArrowSchemaConverter::new();
        for f in &fields {
            converter
                .convert(&Schema::new(vec![f.clone()]))
                .map_err(|e| {
                    Error::Config(format!(
                        "cannot write {ty} as Parquet: field `{}` of Arrow type {} has no \
                         Parquet type ({e})",
                        f.name(),
                        f.data_type()
                    ))
                })?;
        }
        let schema = Arc::new(Schema::new(fields.clone()));
        Ok(RowSchema {
            fields: fields.into(),
            schema,
            _t: PhantomData,
        })
    }
}

/// The path of the first union inside a field of type `dt` named `path`, if any.
fn union_path(path: &str, dt: &DataType) -> Option<String> {
    match dt {
        DataType::Union(..) => Some(path.to_string()),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _) => union_path(&format!("{path}[]"), f.data_type()),
        DataType::Map(f, _) => union_path(&format!("{path}{{}}"), f.data_type()),
        DataType::Struct(fields) => fields
            .iter()
            .find_map(|f| union_path(&format!("{path}.{}", f.name()), f.data_type())),
        DataType::Dictionary(_, v) => union_path(path, v),
        _ => None,
    }
}

impl<T> RowSchema<T> {
    /// The schema as Arrow sees it (the Parquet file stores it too).
    pub fn arrow_schema(&self) -> &SchemaRef {
        &self.schema
    }
}

/// Buffers rows of type `T` and writes them as one complete Parquet file: nothing a reader
/// can open exists before [`finish`](Self::finish), which writes the footer.
///
/// Rows go into Arrow column builders; every
/// [`ParquetOptions::batch_rows`] rows they are handed to the Parquet writer, which keeps
/// a row group in memory until it holds [`ParquetOptions::row_group_rows`] rows and then
/// writes it to `W`.
///
/// ```
/// use weir_parquet::{ParquetEncoder, ParquetOptions};
/// use parquet::file::reader::{FileReader, SerializedFileReader};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Reading { sensor: String, value: f64 }
///
/// let mut enc = ParquetEncoder::<Reading>::new(&ParquetOptions::default()).unwrap();
/// enc.push(&Reading { sensor: "a".into(), value: 1.5 }).unwrap();
/// enc.push(&Reading { sensor: "b".into(), value: -2.0 }).unwrap();
/// assert_eq!(enc.rows(), 2);
/// let bytes: Vec<u8> = enc.finish().unwrap();
///
/// let file = SerializedFileReader::new(bytes::Bytes::from(bytes)).unwrap();
/// assert_eq!(file.metadata().file_metadata().num_rows(), 2);
/// ```
pub struct ParquetEncoder<T, W: Write + Send = Vec<u8>> {
    builder: serde_arrow::ArrayBuilder,
    /// Rows in `builder`, not yet handed to `writer`.
    buffered: usize,
    batch_rows: usize,
    writer: ArrowWriter<W>,
    rows: u64,
    row_group_bytes: Option<u64>,
    /// Row groups closed and handed over to `W` in full.
    groups: usize,
    _t: PhantomData<fn(&T)>,
}

impl<T: Serialize + DeserializeOwned> ParquetEncoder<T, Vec<u8>> {
    /// An encoder writing into memory, with the schema derived from `T`.
    pub fn new(options: &ParquetOptions) -> Result<Self> {
        Self::with_writer(&RowSchema::derive()?, Vec::new(), options)
    }
}

impl<T: Serialize, W: Write + Send> ParquetEncoder<T, W> {
    /// An encoder writing into `writer`, with a schema derived before.
    pub fn with_writer(schema: &RowSchema<T>, writer: W, options: &ParquetOptions) -> Result<Self> {
        let ty = std::any::type_name::<T>();
        let props = WriterProperties::builder()
            .set_compression(options.compression.parquet())
            .set_max_row_group_row_count(Some(options.row_group_rows.max(1)))
            .set_created_by(format!("weir {}", env!("CARGO_PKG_VERSION")))
            .build();
        let writer = ArrowWriter::try_new(writer, schema.schema.clone(), Some(props))
            .map_err(|e| Error::Config(format!("cannot write {ty} as Parquet: {e}")))?;
        let builder = serde_arrow::ArrayBuilder::from_arrow(&schema.fields)
            .map_err(|e| Error::Config(format!("cannot write {ty} as Parquet: {e}")))?;
        Ok(ParquetEncoder {
            builder,
            buffered: 0,
            batch_rows: options.batch_rows.max(1),
            writer,
            rows: 0,
            row_group_bytes: options.row_group_bytes,
            groups: 0,
            _t: PhantomData,
        })
    }

    /// Adds one row. Fails (and the encoder should be dropped) when the value does not
    /// fit the schema, e.g. a map with keys other than strings.
    pub fn push(&mut self, row: &T) -> Result<()> {
        self.builder.push(row).map_err(|e| {
            Error::Codec(format!(
                "cannot encode a row of {} as Parquet: {e}",
                std::any::type_name::<T>()
            ))
        })?;
        self.buffered += 1;
        self.rows += 1;
        if self.buffered >= self.batch_rows {
            self.write_batch()?;
        }
        Ok(())
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// About how many bytes the file holds so far: what was written to `W`, plus the
    /// encoded size of the row group in memory. Rows of the batch not yet handed to the
    /// writer (fewer than [`ParquetOptions::batch_rows`]) are not counted.
    pub fn estimated_bytes(&self) -> u64 {
        (self.writer.bytes_written() + self.writer.in_progress_size()) as u64
    }

    fn write_batch(&mut self) -> Result<()> {
        if self.buffered == 0 {
            return Ok(());
        }
        let ty = std::any::type_name::<T>();
        let batch = self
            .builder
            .to_record_batch()
            .map_err(|e| Error::Codec(format!("cannot encode rows of {ty} as Parquet: {e}")))?;
        self.buffered = 0;
        let fail = |e| Error::Codec(format!("cannot write rows of {ty} as Parquet: {e}"));
        self.writer.write(&batch).map_err(fail)?;
        if self
            .row_group_bytes
            .is_some_and(|m| self.writer.in_progress_size() as u64 >= m)
        {
            // Close the row group: its encoded bytes go to `W`, and memory is freed.
            self.writer.flush().map_err(fail)?;
        }
        let groups = self.writer.flushed_row_groups().len();
        if groups != self.groups {
            // A row group closed: hand all of it to `W` (the parquet writer buffers a few
            // KiB), so what `W` holds is every closed row group, ready to be uploaded.
            self.groups = groups;
            self.writer
                .sync()
                .map_err(|e| Error::Codec(format!("cannot write rows of {ty} as Parquet: {e}")))?;
        }
        Ok(())
    }

    /// Writes the buffered rows and the footer, and returns the writer, which then holds
    /// a complete Parquet file (not flushed to disk: sync a file yourself).
    pub fn finish(mut self) -> Result<W> {
        self.write_batch()?;
        self.writer.into_inner().map_err(|e| {
            Error::Codec(format!(
                "cannot finish the Parquet file of {}: {e}",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// An object of weir's exactly-once object sink: the bytes final so far are the row groups
/// the writer closed (and the header), which never change; the row group in progress and
/// the footer follow. So an object streams out part by part, and memory holds only the row
/// group being encoded and the closed bytes not yet uploaded.
impl<T: Serialize> ObjectEncoder<T> for ParquetEncoder<T, Vec<u8>> {
    fn push(&mut self, record: &T) -> Result<()> {
        ParquetEncoder::push(self, record)
    }
    fn rows(&self) -> u64 {
        self.rows
    }
    fn bytes(&self) -> u64 {
        self.estimated_bytes()
    }
    fn ready(&self) -> usize {
        self.writer.inner().len()
    }
    fn take(&mut self) -> Vec<u8> {
        // The writer counts the bytes it wrote itself (offsets in the footer stay right);
        // taking them out of the vector only moves them.
        std::mem::take(self.writer.inner_mut())
    }
    fn finish(self) -> Result<Vec<u8>> {
        ParquetEncoder::finish(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    /// Reads a Parquet file back into rows of `T`, through the parquet crate's reader.
    fn read_back<T: DeserializeOwned>(bytes: Vec<u8>) -> Vec<T> {
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
            .unwrap()
            .build()
            .unwrap();
        let mut rows = Vec::new();
        for batch in reader {
            let batch = batch.unwrap();
            rows.extend(serde_arrow::from_record_batch::<Vec<T>>(&batch).unwrap());
        }
        rows
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    enum Side {
        Buy,
        Sell,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Venue {
        name: String,
        fee: Option<f32>,
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Order {
        id: u64,
        delta: i32,
        small: i8,
        ok: bool,
        symbol: String,
        note: Option<String>,
        side: Side,
        fills: Vec<u32>,
        venue: Venue,
        backup: Option<Venue>,
        tags: BTreeMap<String, i64>,
        raw: Vec<u8>,
        pair: (u16, f64),
    }

    fn order(i: u64) -> Order {
        Order {
            id: i,
            delta: -(i as i32) * 3,
            small: (i % 100) as i8 - 50,
            ok: i.is_multiple_of(3),
            symbol: format!("S{i}"),
            note: i.is_multiple_of(2).then(|| format!("note {i} ✓")),
            side: if i.is_multiple_of(2) {
                Side::Buy
            } else {
                Side::Sell
            },
            fills: (0..(i % 4) as u32).collect(),
            venue: Venue {
                name: format!("v{}", i % 5),
                fee: (!i.is_multiple_of(3)).then_some(i as f32 / 8.0),
            },
            backup: (i % 4 == 1).then(|| Venue {
                name: "b".into(),
                fee: None,
            }),
            tags: (0..i % 3)
                .map(|k| (format!("k{k}"), k as i64 - 1))
                .collect(),
            raw: vec![i as u8; (i % 3) as usize],
            pair: (i as u16, i as f64 * 0.25),
        }
    }

    /// Every row comes back exactly, across several batches and row groups, with nested,
    /// optional, list, map and enum fields.
    #[test]
    fn round_trip_keeps_every_row() {
        let options = ParquetOptions::default().batch_rows(7).row_group_rows(50);
        let rows: Vec<Order> = (0..333).map(order).collect();
        let mut enc = ParquetEncoder::<Order>::new(&options).unwrap();
        for r in &rows {
            enc.push(r).unwrap();
        }
        assert_eq!(enc.rows(), 333);
        let bytes = enc.finish().unwrap();

        let meta = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes.clone()))
            .unwrap()
            .metadata()
            .clone();
        assert_eq!(meta.file_metadata().num_rows(), 333);
        assert_eq!(meta.num_row_groups(), 7, "row groups of 50 rows");
        assert_eq!(read_back::<Order>(bytes), rows);
    }

    /// The Parquet schema says which columns are optional, and keeps the nesting.
    #[test]
    fn the_parquet_schema_follows_the_type() {
        let mut enc = ParquetEncoder::<Order>::new(&ParquetOptions::default()).unwrap();
        enc.push(&order(1)).unwrap();
        let bytes = enc.finish().unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
        let schema = builder.parquet_schema();
        let column = |path: &str| {
            (0..schema.num_columns())
                .map(|i| schema.column(i))
                .find(|c| c.path().string() == path)
                .unwrap_or_else(|| panic!("no column {path}"))
        };
        use parquet::basic::Type as Physical;
        assert_eq!(column("id").physical_type(), Physical::INT64);
        assert_eq!(column("delta").physical_type(), Physical::INT32);
        assert_eq!(column("symbol").physical_type(), Physical::BYTE_ARRAY);
        assert_eq!(column("venue.fee").physical_type(), Physical::FLOAT);
        assert_eq!(column("id").max_def_level(), 0, "required");
        assert_eq!(column("note").max_def_level(), 1, "optional");
        assert_eq!(column("backup.name").max_def_level(), 1, "inside an option");
        let arrow = builder.schema();
        assert!(!arrow.field_with_name("symbol").unwrap().is_nullable());
        assert!(arrow.field_with_name("backup").unwrap().is_nullable());
    }

    /// A tuple is a row too: its columns are named by position.
    #[test]
    fn a_tuple_row_has_positional_columns() {
        let mut enc = ParquetEncoder::<(u64, String)>::new(&ParquetOptions::default()).unwrap();
        enc.push(&(7, "seven".into())).unwrap();
        enc.push(&(8, "eight".into())).unwrap();
        let bytes = enc.finish().unwrap();
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes.clone())).unwrap();
        let names: Vec<String> = builder
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["0", "1"]);
        assert_eq!(
            read_back::<(u64, String)>(bytes),
            vec![(7, "seven".to_string()), (8, "eight".to_string())]
        );
    }

    /// An uncompressed file of the same rows reads back the same and is larger.
    #[test]
    fn compression_is_chosen_by_the_options() {
        let rows: Vec<Order> = (0..500).map(order).collect();
        let encode = |c: crate::Compression| {
            let mut enc =
                ParquetEncoder::<Order>::new(&ParquetOptions::default().compression(c)).unwrap();
            rows.iter().for_each(|r| enc.push(r).unwrap());
            enc.finish().unwrap()
        };
        let snappy = encode(crate::Compression::Snappy);
        let plain = encode(crate::Compression::Uncompressed);
        let codec = |b: &[u8]| {
            ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(b.to_vec()))
                .unwrap()
                .metadata()
                .row_group(0)
                .column(0)
                .compression()
        };
        assert_eq!(codec(&snappy), parquet::basic::Compression::SNAPPY);
        assert_eq!(codec(&plain), parquet::basic::Compression::UNCOMPRESSED);
        assert_eq!(read_back::<Order>(snappy), rows);
        assert_eq!(read_back::<Order>(plain), rows);
    }

    /// An encoder that got no row still writes a valid, empty file.
    #[test]
    fn an_empty_file_is_valid() {
        let enc = ParquetEncoder::<Venue>::new(&ParquetOptions::default()).unwrap();
        let bytes = enc.finish().unwrap();
        assert!(read_back::<Venue>(bytes).is_empty());
    }

    fn derive_error<T: Serialize + DeserializeOwned>() -> String {
        match RowSchema::<T>::derive() {
            Ok(s) => panic!("derived {s:?}"),
            Err(e @ Error::Config(_)) => e.to_string(),
            Err(e) => panic!("not a configuration error: {e}"),
        }
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[allow(dead_code)]
    enum Event {
        Click { x: i32 },
        Key(char),
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[allow(dead_code)]
    struct WithUnion {
        id: u64,
        event: Event,
    }

    /// An enum with data becomes an Arrow union, which Parquet cannot store: the error names
    /// the type and the field.
    #[test]
    fn an_enum_with_data_is_refused_naming_the_field() {
        let e = derive_error::<WithUnion>();
        assert!(e.contains("WithUnion") && e.contains("`event`"), "{e}");
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[allow(dead_code)]
    struct WithJson {
        id: u64,
        payload: serde_json::Value,
    }

    /// A type serde describes only from a value cannot give a schema.
    #[test]
    fn a_self_describing_field_is_refused_naming_the_type_and_field() {
        let e = derive_error::<WithJson>();
        assert!(e.contains("WithJson") && e.contains("payload"), "{e}");
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[allow(dead_code)]
    struct WithUnit {
        id: u64,
        nothing: (),
    }

    #[test]
    fn a_unit_field_is_refused_naming_the_field() {
        let e = derive_error::<WithUnit>();
        assert!(e.contains("WithUnit") && e.contains("nothing"), "{e}");
    }

    /// A row must have columns: a bare number is not a table.
    #[test]
    fn a_row_that_is_not_a_struct_is_refused() {
        let e = derive_error::<u64>();
        assert!(e.contains("u64"), "{e}");
    }
}
