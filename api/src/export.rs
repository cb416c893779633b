//! Bulk export encoders: rows of typed cells into CSV or Parquet bytes,
//! handed out in pieces as they fill, so an export of any length is
//! streamed in constant memory (`routes::export` reads the store in chunks
//! and sends each piece as it is ready).
//!
//! Both formats carry the same columns in the same order. CSV follows
//! RFC 4180 (a header row, `\r\n`, fields quoted only when they must be);
//! times are ISO 8601 UTC as in `/v1` pages, numbers the shortest text that
//! reads back as the same `f64`, counts as decimal integers, and an absent
//! value (a nullable column's) as an empty field. Parquet types times as
//! `TIMESTAMP(MILLIS, UTC)`, numbers as `DOUBLE`, counts as `INT64`, text
//! as UTF-8 `STRING`, absent values as nulls of nullable columns,
//! snappy-compressed, one row group per [`ROW_GROUP_ROWS`] rows or
//! [`ROW_GROUP_BYTES`] of buffered data, whichever comes first: the row
//! group is the unit Parquet must hold in memory before writing it.

use arrow_array::builder::{
    Float64Builder, Int64Builder, StringBuilder, TimestampMillisecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use hindsight_schemas::Timestamp;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::fmt::Write as _;
use std::sync::Arc;

/// CSV bytes gathered before a piece is handed out.
pub const CSV_PIECE_BYTES: usize = 256 * 1024;
/// Most rows of one Parquet row group.
pub const ROW_GROUP_ROWS: usize = 128 * 1024;
/// Most bytes of cell data buffered for one Parquet row group (books carry
/// their levels as text, so a row count alone would not bound memory).
pub const ROW_GROUP_BYTES: usize = 16 * 1024 * 1024;

/// The file format of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Parquet,
}

impl Format {
    pub const ALL: [Format; 2] = [Format::Csv, Format::Parquet];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Parquet => "parquet",
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv => "text/csv; charset=utf-8",
            Format::Parquet => "application/vnd.apache.parquet",
        }
    }
}

/// What a column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Text,
    Time,
    Number,
    /// A count: `INT64` in Parquet.
    Integer,
}

/// One column of an export: its name (the CSV header, the Parquet field),
/// its type, and whether a row may lack its value ([`Cell::Null`]).
#[derive(Debug, Clone, Copy)]
pub struct Column {
    pub name: &'static str,
    pub ty: ColumnType,
    pub nullable: bool,
}

pub const fn text(name: &'static str) -> Column {
    Column {
        name,
        ty: ColumnType::Text,
        nullable: false,
    }
}
pub const fn time(name: &'static str) -> Column {
    Column {
        name,
        ty: ColumnType::Time,
        nullable: false,
    }
}
pub const fn number(name: &'static str) -> Column {
    Column {
        name,
        ty: ColumnType::Number,
        nullable: false,
    }
}
pub const fn integer(name: &'static str) -> Column {
    Column {
        name,
        ty: ColumnType::Integer,
        nullable: false,
    }
}
/// `column`, which rows may leave empty.
pub const fn optional(column: Column) -> Column {
    Column {
        nullable: true,
        ..column
    }
}

/// One cell of a row, in column order.
#[derive(Debug, Clone, Copy)]
pub enum Cell<'a> {
    Text(&'a str),
    Time(Timestamp),
    Number(f64),
    Integer(u64),
    /// No value, in a nullable column.
    Null,
}

/// Why an encoder failed: only Parquet's writer can (it checks what it is
/// given against the schema), and then the export is cut short.
#[derive(Debug)]
pub struct EncodeError(pub String);

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "export encoding failed: {}", self.0)
    }
}

/// Rows in, file bytes out in pieces.
pub enum Encoder {
    Csv(Csv),
    Parquet(Box<Parquet>),
}

impl Encoder {
    pub fn new(format: Format, columns: &'static [Column]) -> Result<Self, EncodeError> {
        Ok(match format {
            Format::Csv => Encoder::Csv(Csv::new(columns)),
            Format::Parquet => Encoder::Parquet(Box::new(Parquet::new(columns)?)),
        })
    }

    /// Adds one row; `cells` are in column order and of the column's type.
    pub fn row(&mut self, cells: &[Cell<'_>]) -> Result<(), EncodeError> {
        match self {
            Encoder::Csv(csv) => {
                csv.row(cells);
                Ok(())
            }
            Encoder::Parquet(parquet) => parquet.row(cells),
        }
    }

    /// The bytes ready to send, once enough have gathered.
    pub fn ready(&mut self) -> Result<Option<Vec<u8>>, EncodeError> {
        match self {
            Encoder::Csv(csv) => Ok(csv.ready()),
            Encoder::Parquet(parquet) => parquet.ready(),
        }
    }

    /// The rest of the file (for Parquet, the last row group and footer).
    pub fn finish(self) -> Result<Vec<u8>, EncodeError> {
        match self {
            Encoder::Csv(csv) => Ok(csv.buf),
            Encoder::Parquet(parquet) => parquet.finish(),
        }
    }
}

pub struct Csv {
    buf: Vec<u8>,
}

impl Csv {
    fn new(columns: &[Column]) -> Self {
        let mut csv = Csv {
            buf: Vec::with_capacity(CSV_PIECE_BYTES + 4096),
        };
        let header: Vec<Cell<'_>> = columns.iter().map(|c| Cell::Text(c.name)).collect();
        csv.row(&header);
        csv
    }

    fn row(&mut self, cells: &[Cell<'_>]) {
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            match *cell {
                Cell::Text(s) => self.field(s),
                Cell::Time(t) => self.buf.extend_from_slice(t.to_rfc3339().as_bytes()),
                Cell::Number(x) => {
                    let mut s = String::new();
                    // Display is the shortest text that parses back to `x`.
                    let _ = write!(s, "{x}");
                    self.buf.extend_from_slice(s.as_bytes());
                }
                Cell::Integer(n) => self.buf.extend_from_slice(n.to_string().as_bytes()),
                Cell::Null => {}
            }
        }
        self.buf.extend_from_slice(b"\r\n");
    }

    /// RFC 4180: a field holding a comma, quote or line break is quoted,
    /// its quotes doubled.
    fn field(&mut self, s: &str) {
        if s.bytes().any(|b| matches!(b, b',' | b'"' | b'\r' | b'\n')) {
            self.buf.push(b'"');
            for b in s.bytes() {
                if b == b'"' {
                    self.buf.push(b'"');
                }
                self.buf.push(b);
            }
            self.buf.push(b'"');
        } else {
            self.buf.extend_from_slice(s.as_bytes());
        }
    }

    fn ready(&mut self) -> Option<Vec<u8>> {
        (self.buf.len() >= CSV_PIECE_BYTES)
            .then(|| std::mem::replace(&mut self.buf, Vec::with_capacity(CSV_PIECE_BYTES + 4096)))
    }
}

enum Builder {
    Text(StringBuilder),
    Time(TimestampMillisecondBuilder),
    Number(Float64Builder),
    Integer(Int64Builder),
}

impl Builder {
    fn append_null(&mut self) {
        match self {
            Builder::Text(b) => b.append_null(),
            Builder::Time(b) => b.append_null(),
            Builder::Number(b) => b.append_null(),
            Builder::Integer(b) => b.append_null(),
        }
    }
}

pub struct Parquet {
    schema: Arc<Schema>,
    builders: Vec<Builder>,
    rows: usize,
    bytes: usize,
    writer: ArrowWriter<Vec<u8>>,
}

impl Parquet {
    fn new(columns: &[Column]) -> Result<Self, EncodeError> {
        let utc: Arc<str> = Arc::from("UTC");
        let fields: Vec<Field> = columns
            .iter()
            .map(|c| {
                let ty = match c.ty {
                    ColumnType::Text => DataType::Utf8,
                    ColumnType::Time => {
                        DataType::Timestamp(TimeUnit::Millisecond, Some(utc.clone()))
                    }
                    ColumnType::Number => DataType::Float64,
                    ColumnType::Integer => DataType::Int64,
                };
                Field::new(c.name, ty, c.nullable)
            })
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            // Row groups are cut here, by rows and bytes together.
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .build();
        let writer = ArrowWriter::try_new(Vec::new(), schema.clone(), Some(props))
            .map_err(|e| EncodeError(e.to_string()))?;
        let mut parquet = Parquet {
            schema,
            builders: Vec::new(),
            rows: 0,
            bytes: 0,
            writer,
        };
        parquet.builders = parquet.fresh_builders();
        Ok(parquet)
    }

    fn fresh_builders(&self) -> Vec<Builder> {
        self.schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Utf8 => Builder::Text(StringBuilder::new()),
                DataType::Timestamp(_, tz) => {
                    Builder::Time(TimestampMillisecondBuilder::new().with_timezone_opt(tz.clone()))
                }
                DataType::Int64 => Builder::Integer(Int64Builder::new()),
                _ => Builder::Number(Float64Builder::new()),
            })
            .collect()
    }

    fn row(&mut self, cells: &[Cell<'_>]) -> Result<(), EncodeError> {
        if cells.len() != self.builders.len() {
            return Err(EncodeError(format!(
                "a row of {} cells for {} columns",
                cells.len(),
                self.builders.len()
            )));
        }
        for ((builder, cell), field) in self
            .builders
            .iter_mut()
            .zip(cells)
            .zip(self.schema.fields().iter())
        {
            match (builder, *cell) {
                (b, Cell::Null) if field.is_nullable() => {
                    self.bytes += 1;
                    b.append_null();
                }
                (Builder::Integer(b), Cell::Integer(n)) => {
                    self.bytes += 8;
                    let n = i64::try_from(n)
                        .map_err(|_| EncodeError(format!("{n} does not fit an INT64 column")))?;
                    b.append_value(n);
                }
                (Builder::Text(b), Cell::Text(s)) => {
                    self.bytes += s.len();
                    b.append_value(s);
                }
                (Builder::Time(b), Cell::Time(t)) => {
                    self.bytes += 8;
                    b.append_value(t.millis());
                }
                (Builder::Number(b), Cell::Number(x)) => {
                    self.bytes += 8;
                    b.append_value(x);
                }
                (_, cell) => {
                    return Err(EncodeError(format!("{cell:?} in a column of another type")))
                }
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// Writes the buffered rows as one row group.
    fn flush_group(&mut self) -> Result<(), EncodeError> {
        if self.rows == 0 {
            return Ok(());
        }
        let fresh = self.fresh_builders();
        let builders = std::mem::replace(&mut self.builders, fresh);
        let arrays: Vec<ArrayRef> = builders
            .into_iter()
            .map(|b| -> ArrayRef {
                match b {
                    Builder::Text(mut b) => Arc::new(b.finish()),
                    Builder::Time(mut b) => Arc::new(b.finish()),
                    Builder::Number(mut b) => Arc::new(b.finish()),
                    Builder::Integer(mut b) => Arc::new(b.finish()),
                }
            })
            .collect();
        let batch = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| EncodeError(e.to_string()))?;
        self.writer
            .write(&batch)
            .and_then(|()| self.writer.flush())
            .map_err(|e| EncodeError(e.to_string()))?;
        self.rows = 0;
        self.bytes = 0;
        Ok(())
    }

    fn ready(&mut self) -> Result<Option<Vec<u8>>, EncodeError> {
        if self.rows < ROW_GROUP_ROWS && self.bytes < ROW_GROUP_BYTES {
            return Ok(None);
        }
        self.flush_group()?;
        // The writer counts what it wrote itself; the sink is only where
        // the bytes wait to be sent, so emptying it moves no offset.
        Ok(Some(std::mem::take(self.writer.inner_mut())))
    }

    fn finish(mut self) -> Result<Vec<u8>, EncodeError> {
        self.flush_group()?;
        self.writer
            .into_inner()
            .map_err(|e| EncodeError(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    const COLUMNS: &[Column] = &[text("id"), time("t"), number("p")];

    fn rows(n: usize) -> Vec<(String, Timestamp, f64)> {
        (0..n)
            .map(|i| {
                let id = match i % 3 {
                    0 => "plain".to_string(),
                    1 => "with,comma \"quoted\"".to_string(),
                    _ => format!("line\nbreak {i}"),
                };
                (
                    id,
                    Timestamp(1_754_006_400_000 + i as i64 * 60_000),
                    i as f64 / 7.0,
                )
            })
            .collect()
    }

    fn encode(format: Format, input: &[(String, Timestamp, f64)]) -> (Vec<u8>, usize) {
        let mut enc = Encoder::new(format, COLUMNS).unwrap();
        let mut out = Vec::new();
        let mut pieces = 0;
        for (id, t, p) in input {
            enc.row(&[Cell::Text(id), Cell::Time(*t), Cell::Number(*p)])
                .unwrap();
            if let Some(piece) = enc.ready().unwrap() {
                pieces += 1;
                out.extend(piece);
            }
        }
        out.extend(enc.finish().unwrap());
        (out, pieces)
    }

    #[test]
    fn csv_quotes_only_what_must_be_and_reads_back_exactly() {
        let input = rows(30_000);
        let (bytes, pieces) = encode(Format::Csv, &input);
        assert!(pieces >= 2, "a 30 000-row file comes out in pieces");
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("id,t,p\r\nplain,2025-08-01T00:00:00Z,0\r\n"));
        assert!(text.contains("\"with,comma \"\"quoted\"\"\""));
        // A minimal RFC 4180 reader, to read every row back.
        let mut fields = Vec::new();
        let mut field = String::new();
        let mut quoted = false;
        let mut chars = text.chars().peekable();
        let mut records: Vec<Vec<String>> = Vec::new();
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '"') if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                (true, '"') => quoted = false,
                (true, c) => field.push(c),
                (false, '"') => quoted = true,
                (false, ',') => fields.push(std::mem::take(&mut field)),
                (false, '\r') => {}
                (false, '\n') => {
                    fields.push(std::mem::take(&mut field));
                    records.push(std::mem::take(&mut fields));
                }
                (false, c) => field.push(c),
            }
        }
        assert_eq!(records.len(), input.len() + 1);
        for (record, (id, t, p)) in records[1..].iter().zip(&input) {
            assert_eq!(record[0], *id);
            assert_eq!(Timestamp::parse(&record[1]).unwrap(), *t);
            assert_eq!(record[2].parse::<f64>().unwrap().to_bits(), p.to_bits());
        }
    }

    #[test]
    fn parquet_comes_out_in_row_groups_and_reads_back_exactly() {
        let input = rows(ROW_GROUP_ROWS * 2 + 17);
        let (bytes, pieces) = encode(Format::Parquet, &input);
        assert_eq!(pieces, 2, "one piece per full row group");
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
        assert_eq!(reader.metadata().num_row_groups(), 3);
        let mut n = 0;
        for batch in reader.build().unwrap() {
            let batch = batch.unwrap();
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<arrow_array::StringArray>()
                .unwrap();
            let ts = batch
                .column(1)
                .as_any()
                .downcast_ref::<arrow_array::TimestampMillisecondArray>()
                .unwrap();
            let ps = batch
                .column(2)
                .as_any()
                .downcast_ref::<arrow_array::Float64Array>()
                .unwrap();
            for i in 0..batch.num_rows() {
                let (id, t, p) = &input[n];
                assert_eq!(ids.value(i), id);
                assert_eq!(ts.value(i), t.millis());
                assert_eq!(ps.value(i).to_bits(), p.to_bits());
                n += 1;
            }
        }
        assert_eq!(n, input.len());
    }

    #[test]
    fn parquet_cuts_a_row_group_by_bytes_before_rows() {
        let wide = "x".repeat(ROW_GROUP_BYTES / 100);
        let mut enc = Encoder::new(Format::Parquet, COLUMNS).unwrap();
        let mut first_piece_at = None;
        for i in 0..200 {
            enc.row(&[
                Cell::Text(&wide),
                Cell::Time(Timestamp(i)),
                Cell::Number(0.5),
            ])
            .unwrap();
            if enc.ready().unwrap().is_some() && first_piece_at.is_none() {
                first_piece_at = Some(i + 1);
            }
        }
        assert_eq!(first_piece_at, Some(100));
    }
}
