//! PostgreSQL's COPY text and CSV formats, read incrementally: the bytes a
//! client sends with `COPY … FROM STDIN` become batches of text columns,
//! which the INSERT path then casts to the table's types.
//!
//! Our own parser rather than arrow-csv's: PostgreSQL's formats tell NULL
//! from the empty string (text: `\N`; CSV: an unquoted empty field is NULL, a
//! quoted one `""` is the empty string), text format has backslash escapes,
//! and both end at a `\.` line. arrow-csv knows none of these.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cirro_common::{CirroError, Result, SqlState};

pub use cirro_sql::TextFormat;

/// Turns COPY data, in chunks cut anywhere, into batches of text columns.
pub(crate) struct CopyParser {
    format: TextFormat,
    schema: SchemaRef,
    builders: Vec<StringBuilder>,
    rows: usize,
    batch_rows: usize,
    /// Bytes of a record not yet complete.
    pending: Vec<u8>,
    /// Lines read so far (for error messages).
    line: u64,
    header_left: bool,
    /// A `\.` line was read: what follows is ignored.
    ended: bool,
    table: String,
    /// Records may end in one more, empty field (dbgen's `a|b|c|`).
    trailing_delimiter: bool,
    field: Vec<u8>,
    fields: Vec<(usize, usize, bool)>,
}

/// One record found at the start of a buffer.
enum Record {
    /// A record (fields in `CopyParser::fields` over `CopyParser::field`)
    /// that took this many bytes, line end included.
    Row(usize),
    /// The end-of-data marker `\.`.
    End,
    /// No complete record yet.
    Incomplete,
}

impl CopyParser {
    /// A parser for rows of `columns` (named for the batches' schema) of
    /// table `table` (named in errors).
    pub(crate) fn new(format: TextFormat, columns: &[String], table: &str) -> Self {
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Field::new(c, DataType::Utf8, true))
                .collect::<Vec<_>>(),
        ));
        let batch_rows = cirro_common::limits::LOAD_BATCH_ROWS;
        Self {
            header_left: format.header,
            format,
            builders: (0..columns.len()).map(|_| StringBuilder::new()).collect(),
            schema,
            rows: 0,
            batch_rows,
            pending: Vec::new(),
            line: 0,
            ended: false,
            table: table.to_string(),
            trailing_delimiter: false,
            field: Vec::new(),
            fields: Vec::new(),
        }
    }

    /// Accept (and drop) an empty field after the last column.
    pub(crate) fn allow_trailing_delimiter(&mut self) {
        self.trailing_delimiter = true;
    }

    pub(crate) fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Take the next chunk; returns the batches it completed.
    pub(crate) fn push(&mut self, data: &[u8]) -> Result<Vec<RecordBatch>> {
        if self.ended {
            return Ok(Vec::new());
        }
        let mut buffer = std::mem::take(&mut self.pending);
        buffer.extend_from_slice(data);
        let mut at = 0;
        let mut batches = Vec::new();
        while at < buffer.len() && !self.ended {
            match self.record(&buffer[at..], false)? {
                Record::Row(used) => {
                    at += used;
                    self.take_row()?;
                    if self.rows >= self.batch_rows {
                        batches.push(self.flush()?);
                    }
                }
                Record::End => self.ended = true,
                Record::Incomplete => break,
            }
        }
        if !self.ended {
            buffer.drain(..at);
            self.pending = buffer;
        }
        Ok(batches)
    }

    /// The data ended: the last record (which may lack its line end) and the
    /// rows not yet returned.
    pub(crate) fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if !self.ended && !self.pending.is_empty() {
            let buffer = std::mem::take(&mut self.pending);
            match self.record(&buffer, true)? {
                Record::Row(_) => self.take_row()?,
                Record::End => self.ended = true,
                Record::Incomplete => {
                    return Err(self.error("unterminated CSV quoted field".to_string()));
                }
            }
        }
        if self.rows == 0 {
            return Ok(None);
        }
        self.flush().map(Some)
    }

    fn error(&self, message: String) -> CirroError {
        CirroError::new(
            SqlState::BAD_COPY_FILE_FORMAT,
            format!("{message} (COPY {}, line {})", self.table, self.line),
        )
    }

    fn flush(&mut self) -> Result<RecordBatch> {
        let columns: Vec<ArrayRef> = self
            .builders
            .iter_mut()
            .map(|b| Arc::new(b.finish()) as ArrayRef)
            .collect();
        self.rows = 0;
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// Append the fields of the record just found (in `self.fields`) to the
    /// builders, unless it is the header.
    fn take_row(&mut self) -> Result<()> {
        if self.header_left {
            self.header_left = false;
            return Ok(());
        }
        let wanted = self.builders.len();
        if self.trailing_delimiter
            && self.fields.len() == wanted + 1
            && self
                .fields
                .last()
                .is_some_and(|&(start, end, _)| start == end)
        {
            self.fields.pop();
        }
        if self.fields.len() > wanted {
            return Err(self.error("extra data after last expected column".to_string()));
        }
        if self.fields.len() < wanted {
            let missing = self.schema.field(self.fields.len()).name().clone();
            return Err(self.error(format!("missing data for column \"{missing}\"")));
        }
        for (index, &(start, end, null)) in self.fields.iter().enumerate() {
            if null {
                self.builders[index].append_null();
                continue;
            }
            let text = std::str::from_utf8(&self.field[start..end]).map_err(|_| {
                CirroError::new(
                    SqlState::CHARACTER_NOT_IN_REPERTOIRE,
                    format!(
                        "invalid byte sequence for encoding \"UTF8\" (COPY {}, line {})",
                        self.table, self.line
                    ),
                )
            })?;
            self.builders[index].append_value(text);
        }
        self.rows += 1;
        Ok(())
    }

    /// Find the record at the start of `data`, decoding its fields into
    /// `self.field` / `self.fields`. `last`: no more data follows.
    fn record(&mut self, data: &[u8], last: bool) -> Result<Record> {
        self.field.clear();
        self.fields.clear();
        let found = if self.format.csv {
            self.csv_record(data, last)?
        } else {
            self.text_record(data, last)?
        };
        if let Record::Row(_) = found {
            self.line += 1;
        }
        Ok(found)
    }

    /// Text format: fields split by the delimiter, backslash escapes, `\N`
    /// for NULL, one record per line.
    fn text_record(&mut self, data: &[u8], last: bool) -> Result<Record> {
        let Some(length) = text_line_length(data).or(last.then_some(data.len())) else {
            return Ok(Record::Incomplete);
        };
        let used = (length + 1).min(data.len());
        let mut line = &data[..length];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if line == b"\\." {
            return Ok(Record::End);
        }
        let delimiter = self.format.delimiter;
        let mut at = 0;
        loop {
            let start = at;
            let mut end = start;
            while end < line.len() && line[end] != delimiter {
                end += if line[end] == b'\\' { 2 } else { 1 };
            }
            let end = end.min(line.len());
            let raw = &line[start..end];
            let begin = self.field.len();
            let is_null = raw == self.format.null.as_bytes();
            if !is_null {
                unescape(&mut self.field, raw);
            }
            self.fields.push((begin, self.field.len(), is_null));
            if end >= line.len() {
                break;
            }
            at = end + 1;
        }
        Ok(Record::Row(used))
    }

    /// CSV: quoted fields may hold delimiters, quotes (escaped) and line
    /// ends; an unquoted field equal to the NULL text is NULL.
    fn csv_record(&mut self, data: &[u8], last: bool) -> Result<Record> {
        let TextFormat {
            delimiter,
            quote,
            escape,
            ..
        } = self.format;
        // The end marker: `\.` alone on a line.
        if data.starts_with(b"\\.") {
            let rest = &data[2..];
            let alone = rest.is_empty() || rest == b"\r";
            if rest.starts_with(b"\n") || rest.starts_with(b"\r\n") || alone && last {
                return Ok(Record::End);
            }
            if alone {
                return Ok(Record::Incomplete);
            }
        }
        let mut i = 0;
        let mut begin = self.field.len();
        let mut quoted = false;
        let mut raw_start = 0;
        let mut in_quotes = false;
        loop {
            if i >= data.len() {
                if in_quotes || !last {
                    return Ok(Record::Incomplete);
                }
                self.end_csv_field(begin, quoted, &data[raw_start..i]);
                return Ok(Record::Row(i));
            }
            let b = data[i];
            if in_quotes {
                if b == escape && escape != quote && data.get(i + 1) == Some(&quote) {
                    self.field.push(quote);
                    i += 2;
                } else if b == quote {
                    if escape == quote {
                        match data.get(i + 1) {
                            Some(&next) if next == quote => {
                                self.field.push(quote);
                                i += 2;
                                continue;
                            }
                            None if !last => return Ok(Record::Incomplete),
                            _ => {}
                        }
                    }
                    in_quotes = false;
                    i += 1;
                } else {
                    self.field.push(b);
                    i += 1;
                }
                continue;
            }
            if b == quote {
                in_quotes = true;
                quoted = true;
                i += 1;
            } else if b == delimiter {
                self.end_csv_field(begin, quoted, &data[raw_start..i]);
                i += 1;
                begin = self.field.len();
                quoted = false;
                raw_start = i;
            } else if b == b'\n' || b == b'\r' && data.get(i + 1) == Some(&b'\n') {
                self.end_csv_field(begin, quoted, &data[raw_start..i]);
                return Ok(Record::Row(i + if b == b'\n' { 1 } else { 2 }));
            } else if b == b'\r' && i + 1 >= data.len() && !last {
                return Ok(Record::Incomplete);
            } else {
                self.field.push(b);
                i += 1;
            }
        }
    }

    fn end_csv_field(&mut self, begin: usize, quoted: bool, raw: &[u8]) {
        let is_null = !quoted && raw == self.format.null.as_bytes();
        if is_null {
            self.field.truncate(begin);
        }
        self.fields.push((begin, self.field.len(), is_null));
    }
}

/// Decode text format's backslash escapes.
fn unescape(field: &mut Vec<u8>, raw: &[u8]) {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'\\' || i + 1 >= raw.len() {
            field.push(b);
            i += 1;
            continue;
        }
        let next = raw[i + 1];
        i += 2;
        match next {
            b'b' => field.push(0x08),
            b'f' => field.push(0x0c),
            b'n' => field.push(b'\n'),
            b'r' => field.push(b'\r'),
            b't' => field.push(b'\t'),
            b'v' => field.push(0x0b),
            b'0'..=b'7' => {
                let mut value = u32::from(next - b'0');
                for _ in 0..2 {
                    match raw.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                field.push((value & 0xff) as u8);
            }
            b'x' if raw.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut value = 0u32;
                for _ in 0..2 {
                    match raw.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            value = value * 16 + d;
                            i += 1;
                        }
                        None => break,
                    }
                }
                field.push(value as u8);
            }
            other => field.push(other),
        }
    }
}

/// One row in PostgreSQL's text or CSV format, line end included, onto
/// `out`: `None` is NULL (`format.null`, never quoted); in CSV a value is
/// quoted where it must be, and always where `always_quote(column)` (text
/// columns: so that an empty string is `""`, not NULL).
pub fn encode_row<'a>(
    out: &mut Vec<u8>,
    format: &TextFormat,
    values: impl Iterator<Item = Option<&'a str>>,
    always_quote: impl Fn(usize) -> bool,
) {
    for (column, value) in values.enumerate() {
        if column > 0 {
            out.push(format.delimiter);
        }
        let Some(value) = value else {
            out.extend_from_slice(format.null.as_bytes());
            continue;
        };
        let bytes = value.as_bytes();
        if format.csv {
            let special =
                |b: &u8| [format.delimiter, format.quote, format.escape, b'\n', b'\r'].contains(b);
            if always_quote(column)
                || bytes.is_empty()
                || value == format.null
                || bytes.iter().any(special)
            {
                out.push(format.quote);
                for b in bytes {
                    if *b == format.quote || *b == format.escape {
                        out.push(format.escape);
                    }
                    out.push(*b);
                }
                out.push(format.quote);
            } else {
                out.extend_from_slice(bytes);
            }
            continue;
        }
        for b in bytes {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                b if *b == format.delimiter => {
                    out.push(b'\\');
                    out.push(*b);
                }
                b => out.push(*b),
            }
        }
    }
    out.push(b'\n');
}

/// The length of the first text-format line (to its unescaped `\n`).
fn text_line_length(data: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < data.len() {
        match data[i] {
            b'\n' => return Some(i),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, StringArray};

    fn parse(
        format: TextFormat,
        columns: usize,
        chunks: &[&[u8]],
    ) -> Result<Vec<Vec<Option<String>>>> {
        let names: Vec<String> = (0..columns).map(|i| format!("c{i}")).collect();
        let mut parser = CopyParser::new(format, &names, "t");
        let mut batches = Vec::new();
        for chunk in chunks {
            batches.extend(parser.push(chunk)?);
        }
        batches.extend(parser.finish()?);
        let mut rows = Vec::new();
        for batch in batches {
            for row in 0..batch.num_rows() {
                rows.push(
                    (0..columns)
                        .map(|c| {
                            let array = batch
                                .column(c)
                                .as_any()
                                .downcast_ref::<StringArray>()
                                .expect("text");
                            (!array.is_null(row)).then(|| array.value(row).to_string())
                        })
                        .collect(),
                );
            }
        }
        Ok(rows)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn text_format_escapes_nulls_and_end_marker() {
        let data = b"1\ta\\tb\\\\c\t\\N\n2\t\\x41\\101\\n\t\r\n\\.\nignored\tx\ty\n";
        let rows = parse(TextFormat::text(), 3, &[data]).expect("parses");
        assert_eq!(
            rows,
            vec![
                vec![s("1"), s("a\tb\\c"), None],
                vec![s("2"), s("AA\n"), s("")],
            ]
        );
    }

    #[test]
    fn records_split_anywhere_across_chunks() {
        let data: &[u8] = b"1,\"x,\"\"y\"\"\nz\",\n2,\"\",plain\n3,,\"\"\"\"";
        let whole = parse(TextFormat::csv(), 3, &[data]).expect("parses");
        assert_eq!(
            whole,
            vec![
                vec![s("1"), s("x,\"y\"\nz"), None],
                vec![s("2"), s(""), s("plain")],
                vec![s("3"), None, s("\"")],
            ]
        );
        for cut in 0..data.len() {
            let split = parse(TextFormat::csv(), 3, &[&data[..cut], &data[cut..]])
                .expect("parses when split");
            assert_eq!(split, whole, "cut at {cut}");
        }
        let text: &[u8] = b"a\\\tb\tc\\\\\n\\N\t\\n\n";
        let whole = parse(TextFormat::text(), 2, &[text]).expect("parses");
        for cut in 0..text.len() {
            let split = parse(TextFormat::text(), 2, &[&text[..cut], &text[cut..]])
                .expect("parses when split");
            assert_eq!(split, whole, "cut at {cut}");
        }
    }

    #[test]
    fn header_is_skipped_and_bad_rows_refused() {
        let mut format = TextFormat::csv();
        format.header = true;
        let rows = parse(format, 2, &[b"a,b\n1,2\n"]).expect("parses");
        assert_eq!(rows, vec![vec![s("1"), s("2")]]);
        let err = parse(TextFormat::csv(), 2, &[b"1,2\n3\n"]).expect_err("short row");
        assert_eq!(err.state, SqlState::BAD_COPY_FILE_FORMAT);
        assert!(err.message.contains("line 2"), "{}", err.message);
        let err = parse(TextFormat::text(), 1, &[b"1\t2\n"]).expect_err("long row");
        assert!(err.message.contains("extra data"), "{}", err.message);
        let err = parse(TextFormat::csv(), 1, &[b"\"open\n"]).expect_err("unterminated");
        assert_eq!(err.state, SqlState::BAD_COPY_FILE_FORMAT);
        let err = parse(TextFormat::text(), 1, &[b"\xff\n"]).expect_err("not UTF-8");
        assert_eq!(err.state, SqlState::CHARACTER_NOT_IN_REPERTOIRE);
    }
}
