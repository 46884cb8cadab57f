//! Printing results: aligned tables, CSV (RFC 4180) and JSON lines.

use std::io::Write;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cirro_common::{CirroError, Result, SqlState};

use crate::Format;

pub fn print_error(error: &CirroError) {
    eprintln!("ERROR: {} (SQLSTATE {})", error.message, error.state);
}

fn io_error(e: impl std::fmt::Display) -> CirroError {
    CirroError::io(format!("cannot write output: {e}"))
}

/// One display formatter per column of `batch`.
fn formatters<'a>(
    batch: &'a RecordBatch,
    options: &'a arrow::util::display::FormatOptions<'a>,
) -> Result<Vec<arrow::util::display::ArrayFormatter<'a>>> {
    batch
        .columns()
        .iter()
        .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(CirroError::from)
}

/// Narrowest width tables are wrapped to.
const SCREEN_WIDTH_MIN: usize = 20;

/// The width tables are wrapped to: `COLUMNS` if set (as psql reads it),
/// else the terminal's when standard output is one; None (no wrapping) when
/// the output is a pipe or file.
pub fn screen_width() -> Option<usize> {
    let columns = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok());
    columns
        .or_else(terminal_width)
        .map(|w| w.max(SCREEN_WIDTH_MIN))
}

#[allow(unsafe_code)] // one ioctl, see SAFETY below
fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which
    // points to a live, properly aligned `winsize` for the whole call.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (rc == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// `text` with each line's leading spaces made no-break spaces: wrapping
/// splits lines at spaces and drops them, which would flatten the
/// indentation of an EXPLAIN plan.
fn keep_indents(text: &str) -> String {
    text.split('\n')
        .map(|line| {
            let trimmed = line.trim_start_matches(' ');
            let indent = line.len() - trimmed.len();
            format!("{}{trimmed}", "\u{a0}".repeat(indent))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes one result set in the chosen format.
pub struct ResultWriter {
    format: Format,
    delimiter: u8,
    null: String,
    /// Tables one column per line, record by record (the shell's `\x`).
    expanded: bool,
    /// Width tables are wrapped to (None: not wrapped), see [`screen_width`].
    width: Option<usize>,
}

impl ResultWriter {
    pub fn new(format: Format, delimiter: &str, null: &str) -> Result<Self> {
        let delimiter = match delimiter.as_bytes() {
            [b] if b.is_ascii() => *b,
            b"\\t" => b'\t',
            _ => {
                return Err(CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!("--delimiter must be one ASCII character, got '{delimiter}'"),
                ));
            }
        };
        Ok(Self {
            format,
            delimiter,
            null: null.to_string(),
            expanded: false,
            width: screen_width(),
        })
    }

    /// Wrap tables to `width` columns (None: never wrap, as for `\o FILE`).
    pub fn set_width(&mut self, width: Option<usize>) {
        self.width = width;
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn set_format(&mut self, format: Format) {
        self.format = format;
    }

    pub fn expanded(&self) -> bool {
        self.expanded
    }

    pub fn set_expanded(&mut self, expanded: bool) {
        self.expanded = expanded;
    }

    /// Write a result stream to `out`, returning the number of rows. CSV and
    /// JSON are written batch by batch; a table is aligned, so it is collected.
    pub async fn write_stream(
        &self,
        out: &mut dyn Write,
        mut stream: datafusion::execution::SendableRecordBatchStream,
    ) -> Result<usize> {
        use futures::StreamExt;
        let schema = stream.schema();
        let mut rows = 0;
        match self.format {
            Format::Table => {
                let mut batches = Vec::new();
                while let Some(batch) = stream.next().await {
                    let batch = batch?;
                    rows += batch.num_rows();
                    batches.push(batch);
                }
                self.write(out, &schema, &batches)?;
            }
            Format::Csv | Format::Json => {
                let mut first = true;
                while let Some(batch) = stream.next().await {
                    let batch = batch?;
                    rows += batch.num_rows();
                    self.write_part(out, &schema, &batch, first)?;
                    first = false;
                }
                if first {
                    self.write(out, &schema, &[])?;
                }
            }
        }
        out.flush().map_err(io_error)?;
        Ok(rows)
    }

    /// RFC 4180 CSV: quotes only where needed, dates as YYYY-MM-DD, NULL as `--null`.
    fn csv_writer<'a>(
        &self,
        out: &'a mut dyn Write,
        header: bool,
    ) -> arrow_csv::Writer<&'a mut dyn Write> {
        arrow_csv::WriterBuilder::new()
            .with_header(header)
            .with_delimiter(self.delimiter)
            .with_null(self.null.clone())
            .with_date_format("%Y-%m-%d".to_string())
            .with_timestamp_format("%Y-%m-%d %H:%M:%S%.f".to_string())
            .build(out)
    }

    /// Write one batch of a CSV/JSON result; the CSV header goes with the first.
    fn write_part(
        &self,
        out: &mut dyn Write,
        schema: &SchemaRef,
        batch: &RecordBatch,
        first: bool,
    ) -> Result<()> {
        match self.format {
            Format::Csv => {
                let mut writer = self.csv_writer(out, first);
                if first {
                    writer
                        .write(&RecordBatch::new_empty(Arc::clone(schema)))
                        .map_err(CirroError::from)?;
                }
                writer.write(batch).map_err(CirroError::from)
            }
            _ => self.write(out, schema, std::slice::from_ref(batch)),
        }
    }

    /// Write `batches` (all of one result) to `out`.
    pub fn write(
        &self,
        out: &mut dyn Write,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<()> {
        match self.format {
            Format::Table if self.expanded => self.write_expanded(out, schema, batches),
            Format::Table => {
                let text = self.aligned(schema, batches)?;
                writeln!(out, "{text}").map_err(io_error)
            }
            Format::Csv => {
                let mut writer = self.csv_writer(out, true);
                let empty = RecordBatch::new_empty(Arc::clone(schema));
                writer.write(&empty).map_err(CirroError::from)?;
                for batch in batches {
                    writer.write(batch).map_err(CirroError::from)?;
                }
                Ok(())
            }
            Format::Json => {
                let mut writer = arrow_json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, arrow_json::writer::LineDelimited>(out);
                for batch in batches {
                    writer
                        .write(&decimals_as_strings(batch)?)
                        .map_err(CirroError::from)?;
                }
                writer.finish().map_err(CirroError::from)
            }
        }
    }
}

impl ResultWriter {
    /// The aligned table of `batches` (arrow's pretty layout), its cells
    /// wrapped at word boundaries so that no line is wider than the screen
    /// when there is a width: EXPLAIN plans and DESCRIBE HISTORY stay
    /// readable instead of one cell thousands of characters wide.
    fn aligned(&self, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<String> {
        use comfy_table::{Cell, ContentArrangement, Table};
        let options = arrow::util::display::FormatOptions::default().with_null(&self.null);
        let mut table = Table::new();
        table.load_preset("||--+-++|    ++++++");
        table.set_header(schema.fields().iter().map(|f| Cell::new(f.name())));
        for batch in batches {
            let formatters = formatters(batch, &options)?;
            for row in 0..batch.num_rows() {
                let cells = formatters
                    .iter()
                    .map(|f| {
                        let text = f.value(row).try_to_string()?;
                        Ok(Cell::new(match self.width {
                            Some(_) => keep_indents(&text),
                            None => text,
                        }))
                    })
                    .collect::<std::result::Result<Vec<_>, arrow::error::ArrowError>>()?;
                table.add_row(cells);
            }
        }
        if let Some(width) = self.width {
            table.set_content_arrangement(ContentArrangement::Dynamic);
            table.set_width(u16::try_from(width).unwrap_or(u16::MAX));
        }
        Ok(table.to_string())
    }

    /// psql's expanded display: each record as `name | value` lines.
    fn write_expanded(
        &self,
        out: &mut dyn Write,
        schema: &SchemaRef,
        batches: &[RecordBatch],
    ) -> Result<()> {
        let options = arrow::util::display::FormatOptions::default().with_null(&self.null);
        let width = schema
            .fields()
            .iter()
            .map(|f| f.name().chars().count())
            .max()
            .unwrap_or(0);
        let mut record = 0;
        for batch in batches {
            let formatters = formatters(batch, &options)?;
            for row in 0..batch.num_rows() {
                record += 1;
                writeln!(out, "-[ RECORD {record} ]{}", "-".repeat(width.max(4)))
                    .map_err(io_error)?;
                for (field, formatter) in schema.fields().iter().zip(&formatters) {
                    writeln!(out, "{:<width$} | {}", field.name(), formatter.value(row))
                        .map_err(io_error)?;
                }
            }
        }
        Ok(())
    }
}

/// JSON has no exact decimal numbers: decimals go out as strings at full scale.
fn decimals_as_strings(batch: &RecordBatch) -> Result<RecordBatch> {
    let schema = batch.schema();
    if !schema.fields().iter().any(|f| is_decimal(f.data_type())) {
        return Ok(batch.clone());
    }
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if is_decimal(field.data_type()) {
            fields.push(Field::new(
                field.name(),
                DataType::Utf8,
                field.is_nullable(),
            ));
            columns.push(arrow::compute::cast(column, &DataType::Utf8).map_err(CirroError::from)?);
        } else {
            fields.push(field.as_ref().clone());
            columns.push(Arc::clone(column));
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(CirroError::from)
}

fn is_decimal(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Decimal32(..)
            | DataType::Decimal64(..)
            | DataType::Decimal128(..)
            | DataType::Decimal256(..)
    )
}
