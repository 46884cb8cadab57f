//! COPY run by the engine: `COPY table FROM 'path'` (a file on the server),
//! the INSERT behind `COPY … FROM STDIN`, the query behind `COPY … TO
//! STDOUT`, and `COPY … TO 'path'`. The statements are parsed by `cirro-sql`
//! (`parsers/copy.rs`).
//!
//! Every way in is one INSERT path: text and CSV data, from a client or a
//! file, go through one parser (`copy_text.rs`: NULL and the empty string
//! told apart) and are cast to the table's types as INSERT casts (decimals
//! rounded half away from zero, or 22003); Parquet columns are cast the same
//! way. All rows or none. CSV files whose lines end in the delimiter (dbgen's
//! `.tbl` files: `a|b|c|`) are recognised by their first line and read as
//! such. Files written by `COPY … TO` read back as they were: NULL unquoted,
//! text always quoted in CSV.

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::{CopyFrom, CopyIn, CopyOutSource, CopyTo, FileFormat as Format, TextFormat};
use datafusion::catalog::TableProvider;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::TableReference;
use datafusion::common::{Column, DataFusionError, ScalarValue};
use datafusion::dataframe::{DataFrame, DataFrameWriteOptions};
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::datasource::provider_as_source;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions::encoding::expr_fn::decode;
use datafusion::functions::string::expr_fn::starts_with;
use datafusion::functions::unicode::expr_fn::substr;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, cast, lit, when};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions};
use futures::{StreamExt, stream};
use object_store::ObjectStoreExt;

use crate::session::txn::aborted;
use crate::statement::copy_text::CopyParser;
use crate::{Engine, Outcome};

const TRAILING_COLUMN: &str = "__cirro_trailing_delimiter";

/// Whether the first line of a local file ends in the delimiter with one field
/// more than the table has (dbgen's `a|b|c|`).
fn has_trailing_delimiter(path: &str, delimiter: u8, columns: usize) -> bool {
    use std::io::BufRead;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let mut line = Vec::new();
    if std::io::BufReader::new(file)
        .read_until(b'\n', &mut line)
        .is_err()
    {
        return false;
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    line.last() == Some(&delimiter) && line.iter().filter(|b| **b == delimiter).count() == columns
}

fn extension_of(path: &str) -> String {
    let p = std::path::Path::new(path);
    if p.is_dir() {
        return String::new();
    }
    p.extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default()
}

fn check_exists(path: &str) -> Result<()> {
    if path.contains("://") {
        return Ok(());
    }
    if std::path::Path::new(path).exists() {
        Ok(())
    } else {
        Err(CirroError::new(
            SqlState::UNDEFINED_FILE,
            format!("could not open file \"{path}\" for reading: No such file or directory"),
        ))
    }
}

/// `COPY`: a file on the server (superusers only), or the rows to the
/// client (`TO STDOUT`); `FROM STDIN` needs the client's connection, which
/// the server's front end holds.
pub(crate) async fn run_copy(engine: &Engine, copy: cirro_sql::CopyStatement) -> Result<Outcome> {
    use cirro_sql::CopyStatement;
    match copy {
        CopyStatement::FromFile(copy) => {
            engine.require_superuser("COPY … FROM a file on the server")?;
            copy_from(engine, copy).await
        }
        CopyStatement::ToFile(copy) => {
            engine.require_superuser("COPY … TO a file on the server")?;
            copy_to(engine, copy).await
        }
        CopyStatement::FromStdin(_) => Err(CirroError::unsupported(
            "COPY FROM STDIN needs a client connection (cirro serve, psql's \\copy)",
        )),
        CopyStatement::ToStdout { source, .. } => copy_out(engine, source).await,
    }
}

/// `COPY table FROM 'path'`: the file's rows inserted as by `COPY … FROM
/// STDIN` (text and CSV: the same parser, NULL and empty string told apart,
/// values converted as INSERT converts them), or, for Parquet, its columns
/// matched by name (else by position) and cast as INSERT casts. All rows or
/// none, inside the open transaction if there is one.
pub(crate) async fn copy_from(engine: &Engine, copy: CopyFrom) -> Result<Outcome> {
    check_exists(&copy.path)?;
    let plan = match copy.format {
        Format::Text(format) => {
            let into = CopyIn {
                table: copy.table.clone(),
                columns: copy.columns.clone(),
                format,
            };
            let data = file_chunks(engine, &copy.path).await?;
            return engine.copy_rows(&into, data, Some(&copy.path)).await;
        }
        Format::Parquet => {
            let (provider, columns) = engine.copy_target(&copy.table, &copy.columns).await?;
            let frame = read_parquet(engine, &copy.path, &columns).await?;
            let source = LogicalPlanBuilder::from(frame.logical_plan().clone());
            engine.copy_insert_plan(&copy.table, provider, &columns, source, |column, to| {
                Ok(cast(column, to.clone()))
            })?
        }
    };
    copy_tag(engine.execute_plan(plan).await?)
}

/// `INSERT 0 n` as `COPY n`.
fn copy_tag(outcome: Outcome) -> Result<Outcome> {
    match outcome {
        Outcome::Command { tag, notice, .. } => Ok(Outcome::Command {
            tag: format!("COPY {}", tag.rsplit(' ').next().unwrap_or("0")),
            notice,
            reports: vec![],
        }),
        Outcome::Rows(_) => Err(CirroError::internal("COPY planned as a query")),
    }
}

/// The bytes of a file, in chunks, through the object store of its URL.
async fn file_chunks(
    engine: &Engine,
    path: &str,
) -> Result<futures::stream::BoxStream<'static, Result<bytes::Bytes>>> {
    if std::path::Path::new(path).is_dir() {
        return Err(CirroError::new(
            SqlState::WRONG_OBJECT_TYPE,
            format!("\"{path}\" is a directory"),
        ));
    }
    let url = ListingTableUrl::parse(path)?;
    let store = engine
        .context()
        .runtime_env()
        .object_store(url.object_store())?;
    let file = store.get(url.prefix()).await?;
    Ok(file
        .into_stream()
        .map(|chunk| chunk.map_err(CirroError::from))
        .boxed())
}

/// `COPY source TO 'path'`: the rows written as text, CSV or Parquet. Returns
/// `COPY n`.
pub(crate) async fn copy_to(engine: &Engine, copy: CopyTo) -> Result<Outcome> {
    let Outcome::Rows(stream) = copy_out(engine, copy.source).await? else {
        return Err(CirroError::internal("COPY TO ran a command"));
    };
    let rows = match copy.format {
        Format::Text(format) => write_text_file(stream, &copy.path, &format).await?,
        Format::Parquet => {
            let schema = stream.schema();
            let table = StreamingTable::try_new(
                Arc::clone(&schema),
                vec![Arc::new(CopyStream {
                    schema,
                    stream: Mutex::new(Some(stream)),
                }) as Arc<dyn PartitionStream>],
            )?;
            let written = engine
                .context()
                .read_table(Arc::new(table))?
                .write_parquet(
                    &copy.path,
                    DataFrameWriteOptions::new().with_single_file_output(true),
                    None,
                )
                .await?;
            written
                .iter()
                .filter_map(|b| {
                    b.column(0)
                        .as_any()
                        .downcast_ref::<arrow::array::UInt64Array>()
                })
                .map(|counts| counts.iter().flatten().sum::<u64>())
                .sum()
        }
    };
    Ok(Outcome::command(format!("COPY {rows}")))
}

/// Write `stream` to a new local file in PostgreSQL's text or CSV format:
/// NULL as `format.null` unquoted, text in CSV always quoted (so an empty
/// string, `""`, reads back as itself).
async fn write_text_file(
    mut stream: SendableRecordBatchStream,
    path: &str,
    format: &TextFormat,
) -> Result<u64> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(|e| {
        CirroError::new(
            SqlState::IO_ERROR,
            format!("could not open file \"{path}\" for writing: {e}"),
        )
    })?;
    let mut out = std::io::BufWriter::new(file);
    let schema = stream.schema();
    if format.header {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let mut line = Vec::new();
        crate::statement::copy_text::encode_row(
            &mut line,
            format,
            names.iter().map(|n| Some(*n)),
            |_| false,
        );
        out.write_all(&line)?;
    }
    let options = arrow::util::display::FormatOptions::new()
        .with_null("")
        .with_date_format(Some("%Y-%m-%d"))
        .with_datetime_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_timestamp_format(Some("%Y-%m-%d %H:%M:%S%.f"))
        .with_timestamp_tz_format(Some("%Y-%m-%d %H:%M:%S%.f%:z"));
    let text_columns: Vec<bool> = schema
        .fields()
        .iter()
        .map(|f| f.data_type().is_string())
        .collect();
    let mut rows = 0u64;
    let mut line = Vec::new();
    let mut values: Vec<Option<String>> = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let formatters = batch
            .columns()
            .iter()
            .map(|c| arrow::util::display::ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            values.clear();
            for (column, formatter) in formatters.iter().enumerate() {
                let array = batch.column(column);
                values.push(if array.is_null(row) {
                    None
                } else if let Some(bytes) = binary_value(array, row) {
                    Some(format!("\\x{}", hex(bytes)))
                } else {
                    Some(formatter.value(row).to_string())
                });
            }
            line.clear();
            crate::statement::copy_text::encode_row(
                &mut line,
                format,
                values.iter().map(|v| v.as_deref()),
                |i| text_columns[i],
            );
            out.write_all(&line)?;
            rows += 1;
        }
    }
    out.flush()?;
    Ok(rows)
}

fn binary_value(array: &arrow::array::ArrayRef, row: usize) -> Option<&[u8]> {
    use arrow::array::AsArray;
    match array.data_type() {
        DataType::Binary => Some(array.as_binary::<i32>().value(row)),
        DataType::LargeBinary => Some(array.as_binary::<i64>().value(row)),
        DataType::BinaryView => Some(array.as_binary_view().value(row)),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The rows `COPY … TO STDOUT` sends: a table's (some of its columns) or a
/// query's, privileges checked as for a SELECT.
pub(crate) async fn copy_out(engine: &Engine, source: CopyOutSource) -> Result<Outcome> {
    match source {
        CopyOutSource::Query(query) => {
            engine
                .run_planned(&cirro_sql::Statement::Query(query))
                .await
        }
        CopyOutSource::Table { table, columns } => {
            let frame = engine.context().table(table).await?;
            let frame = if columns.is_empty() {
                frame
            } else {
                let names: Vec<&str> = columns.iter().map(String::as_str).collect();
                frame.select_columns(&names)?
            };
            let plan = frame.logical_plan().clone();
            engine.check_plan(&plan)?;
            engine.execute_plan(plan).await
        }
    }
}

/// A plain delimited file (dbgen's `.tbl`), read by DataFusion's parallel
/// CSV reader for the bulk loader: its files have no quoting, no NULLs and
/// no more decimal digits than their columns.
pub(crate) async fn read_delimited(
    engine: &Engine,
    path: &str,
    schema: &Schema,
    delimiter: u8,
    header: bool,
) -> Result<DataFrame> {
    check_exists(path)?;
    read_csv(engine, path, schema, delimiter, header).await
}

async fn read_csv(
    engine: &Engine,
    path: &str,
    stored: &Schema,
    delimiter: u8,
    header: bool,
) -> Result<DataFrame> {
    // Read every column as nullable: NOT NULL is checked (with its own SQLSTATE)
    // when the rows are written.
    let mut fields: Vec<Field> = stored
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), f.data_type().clone(), true))
        .collect();
    let trailing = has_trailing_delimiter(path, delimiter, fields.len());
    if trailing {
        fields.push(Field::new(TRAILING_COLUMN, DataType::Utf8, true));
    }
    let read_schema = Schema::new(fields);
    let extension = extension_of(path);
    let options = CsvReadOptions::new()
        .has_header(header)
        .delimiter(delimiter)
        .schema(&read_schema)
        .file_extension(&extension);
    let frame = engine.context().read_csv(path, options).await?;
    if trailing {
        let names: Vec<&str> = stored.fields().iter().map(|f| f.name().as_str()).collect();
        return Ok(frame.select_columns(&names)?);
    }
    Ok(frame)
}

/// A Parquet file's columns for `columns` of a table: matched by name where
/// the file has them all, else by position; named as the table's.
async fn read_parquet(engine: &Engine, path: &str, columns: &[String]) -> Result<DataFrame> {
    let extension = extension_of(path);
    let options = ParquetReadOptions::default().file_extension(&extension);
    let frame = engine.context().read_parquet(path, options).await?;
    let file_fields: Vec<String> = frame
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let by_name: Option<Vec<String>> = columns
        .iter()
        .map(|c| {
            file_fields
                .iter()
                .find(|n| n.eq_ignore_ascii_case(c))
                .cloned()
        })
        .collect();
    let chosen = match by_name {
        Some(names) => names,
        None if file_fields.len() == columns.len() => file_fields,
        None => {
            return Err(CirroError::new(
                SqlState::DATATYPE_MISMATCH,
                format!(
                    "the Parquet file has columns ({}) that do not match the table's ({})",
                    file_fields.join(", "),
                    columns.join(", ")
                ),
            ));
        }
    };
    let renamed = chosen
        .iter()
        .zip(columns)
        .map(|(from, to)| Expr::Column(Column::from_name(from)).alias(to))
        .collect::<Vec<_>>();
    Ok(frame.select(renamed)?)
}

/// The rows a client sends, as the one partition of the scan an INSERT reads.
struct CopyStream {
    schema: SchemaRef,
    stream: Mutex<Option<SendableRecordBatchStream>>,
}

impl std::fmt::Debug for CopyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyStream").finish_non_exhaustive()
    }
}

impl PartitionStream for CopyStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let taken = self.stream.lock().ok().and_then(|mut s| s.take());
        taken.unwrap_or_else(|| {
            let error = DataFusionError::External(Box::new(CirroError::internal(
                "COPY FROM STDIN data can be read once",
            )));
            Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                stream::once(async move { Err(error) }),
            ))
        })
    }
}

/// How a text column becomes a column of type `to`: a cast, except for
/// bytea, whose text form is `\x` and hex digits.
fn from_text(column: Expr, to: &DataType) -> Result<Expr> {
    if matches!(
        to,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
    ) {
        let hex = starts_with(column.clone(), lit("\\x"));
        let decoded = decode(substr(column.clone(), lit(3i64)), lit("hex"));
        let bytes = when(hex, decoded).otherwise(cast(column, DataType::Binary))?;
        return Ok(cast(bytes, to.clone()));
    }
    Ok(cast(column, to.clone()))
}

impl Engine {
    /// The table a COPY writes (refreshed catalog) and the columns its data
    /// holds, checked: the table exists and is not a view, the columns exist
    /// once each.
    async fn copy_target(
        &self,
        table: &TableReference,
        given: &[String],
    ) -> Result<(Arc<dyn TableProvider>, Vec<String>)> {
        if self.transaction_aborted() {
            return Err(aborted());
        }
        self.catalog().refresh().await?;
        self.session.start_statement(self.catalog());
        let (db, schema, name) = self.resolve(table);
        let snapshot = self.snapshot();
        if snapshot.table(&db, &schema, &name).is_none() {
            return Err(if snapshot.view(&db, &schema, &name).is_some() {
                CirroError::new(
                    SqlState::WRONG_OBJECT_TYPE,
                    format!("cannot copy to view \"{name}\""),
                )
            } else {
                CirroError::new(
                    SqlState::UNDEFINED_TABLE,
                    format!("relation \"{name}\" does not exist"),
                )
            });
        }
        let provider = self.context().table_provider(table.clone()).await?;
        let target = provider.schema();
        if given.is_empty() {
            let all = target.fields().iter().map(|f| f.name().clone()).collect();
            return Ok((provider, all));
        }
        for (i, column) in given.iter().enumerate() {
            if target.field_with_name(column).is_err() {
                return Err(CirroError::new(
                    SqlState::UNDEFINED_COLUMN,
                    format!("column \"{column}\" of relation \"{name}\" does not exist"),
                ));
            }
            if given[..i].contains(column) {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_COLUMN,
                    format!("column \"{column}\" specified more than once"),
                ));
            }
        }
        Ok((provider, given.to_vec()))
    }

    /// The INSERT behind a COPY: `source`'s columns (named `columns`)
    /// converted by `convert` to the table's types, NULL for the columns it
    /// lacks; privileges checked.
    fn copy_insert_plan(
        &self,
        table: &TableReference,
        provider: Arc<dyn TableProvider>,
        columns: &[String],
        source: LogicalPlanBuilder,
        convert: impl Fn(Expr, &DataType) -> Result<Expr>,
    ) -> Result<LogicalPlan> {
        let projection = provider
            .schema()
            .fields()
            .iter()
            .map(|field| {
                let value = if columns.contains(field.name()) {
                    convert(
                        Expr::Column(Column::from_name(field.name())),
                        field.data_type(),
                    )?
                } else {
                    Expr::Literal(ScalarValue::try_from(field.data_type())?, None)
                };
                Ok(value.alias(field.name()))
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = LogicalPlanBuilder::insert_into(
            source.project(projection)?.build()?,
            table.clone(),
            provider_as_source(provider),
            InsertOp::Append,
        )?
        .build()?;
        self.check_plan(&plan)?;
        Ok(plan)
    }

    /// The INSERT a `COPY … FROM STDIN` runs. Returns the plan, the columns
    /// the data holds, and the partition its rows are read from (filled by
    /// the caller before running).
    async fn copy_in_plan(
        &self,
        copy: &CopyIn,
    ) -> Result<(LogicalPlan, Vec<String>, Arc<CopyStream>)> {
        let (provider, columns) = self.copy_target(&copy.table, &copy.columns).await?;
        let text = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Field::new(c, DataType::Utf8, true))
                .collect::<Vec<_>>(),
        ));
        let rows = Arc::new(CopyStream {
            schema: Arc::clone(&text),
            stream: Mutex::new(None),
        });
        let source = StreamingTable::try_new(
            Arc::clone(&text),
            vec![Arc::clone(&rows) as Arc<dyn PartitionStream>],
        )?;
        let source = LogicalPlanBuilder::scan(
            TableReference::bare("copy from stdin"),
            provider_as_source(Arc::new(source)),
            None,
        )?;
        let plan = self.copy_insert_plan(&copy.table, provider, &columns, source, from_text)?;
        Ok((plan, columns, rows))
    }

    /// Check a `COPY … FROM STDIN` before the client sends its data: the
    /// table and columns exist and this user may insert into it. Returns the
    /// columns the data holds.
    pub async fn copy_in_columns(&self, copy: &CopyIn) -> Result<Vec<String>> {
        Ok(self.copy_in_plan(copy).await?.1)
    }

    /// Run a `COPY … FROM STDIN` over `data`, the bytes the client sends in
    /// chunks cut anywhere. It is an INSERT: all rows or none (an error in
    /// `data`, such as the client going away, leaves the table as it was),
    /// taken into the open transaction if there is one. Returns `COPY n`.
    pub async fn copy_in<S, B>(&self, copy: &CopyIn, data: S) -> Result<Outcome>
    where
        S: futures::Stream<Item = Result<B>> + Send + 'static,
        B: AsRef<[u8]> + Send,
    {
        self.copy_rows(copy, data, None).await
    }

    /// `copy_in` of data read from the server file `path`, if any (a CSV file
    /// whose lines end in the delimiter, dbgen's `a|b|c|`, is read as such).
    async fn copy_rows<S, B>(&self, copy: &CopyIn, data: S, path: Option<&str>) -> Result<Outcome>
    where
        S: futures::Stream<Item = Result<B>> + Send + 'static,
        B: AsRef<[u8]> + Send,
    {
        let (plan, columns, slot) = self.copy_in_plan(copy).await?;
        let mut parser = CopyParser::new(copy.format.clone(), &columns, copy.table.table());
        if let Some(path) = path
            && copy.format.csv
            && has_trailing_delimiter(path, copy.format.delimiter, columns.len())
        {
            parser.allow_trailing_delimiter();
        }
        let text = parser.schema();
        let batches = stream::unfold(
            (Box::pin(data), parser, false),
            |(mut data, mut parser, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let step = match data.next().await {
                        Some(Ok(chunk)) => match parser.push(chunk.as_ref()) {
                            Ok(batches) if batches.is_empty() => continue,
                            other => other,
                        },
                        Some(Err(e)) => Err(e),
                        None => {
                            let last = parser.finish().map(|b| b.into_iter().collect());
                            return Some((last, (data, parser, true)));
                        }
                    };
                    let failed = step.is_err();
                    return Some((step, (data, parser, failed)));
                }
            },
        )
        .flat_map(|step| {
            let items: Vec<std::result::Result<RecordBatch, DataFusionError>> = match step {
                Ok(batches) => batches.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(DataFusionError::External(Box::new(e)))],
            };
            stream::iter(items)
        });
        if let Ok(mut stream) = slot.stream.lock() {
            *stream = Some(Box::pin(RecordBatchStreamAdapter::new(text, batches)));
        }
        copy_tag(self.execute_plan(plan).await?)
    }
}
