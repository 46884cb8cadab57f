//! COPY run by the engine: `COPY table FROM 'path' (FORMAT csv|parquet, …)`
//! (a file on the server), the INSERT behind `COPY … FROM STDIN`, and the
//! query behind `COPY … TO STDOUT`. The statements are parsed by `cirro-sql`
//! (`parsers/copy.rs`).
//!
//! A file is read by DataFusion's CSV or Parquet reader (parallel, streaming)
//! with the table's column types, and written with the same path as INSERT: all
//! rows or none. CSV files whose lines end in the delimiter (dbgen's `.tbl`
//! files: `a|b|c|`) are recognised by their first line and read as such.

use std::sync::{Arc, Mutex};

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::{CopyFrom, CopyIn, CopyOutSource, FileFormat as Format};
use cirro_storage::write::write_stream;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::TableReference;
use datafusion::common::{Column, DataFusionError, ScalarValue};
use datafusion::dataframe::DataFrame;
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
use deltalake::protocol::SaveMode;
use futures::{StreamExt, stream};

use crate::copy_text::CopyParser;
use crate::txn::aborted;
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

pub(crate) async fn copy_from(engine: &Engine, copy: CopyFrom) -> Result<Outcome> {
    let (db, schema, name) = engine.resolve(&copy.table);
    let snapshot = engine.catalog().snapshot();
    let entry = match snapshot.table(&db, &schema, &name) {
        Some(entry) => entry.clone(),
        None if snapshot.view(&db, &schema, &name).is_some() => {
            return Err(CirroError::new(
                SqlState::WRONG_OBJECT_TYPE,
                format!("cannot copy to view \"{name}\""),
            ));
        }
        None => {
            return Err(CirroError::new(
                SqlState::UNDEFINED_TABLE,
                format!("relation \"{name}\" does not exist"),
            ));
        }
    };
    check_exists(&copy.path)?;
    let table = engine.catalog().open_table(&entry.location).await?;
    let stored = Arc::clone(table.stored_schema());
    let frame = match copy.format {
        Format::Csv => read_csv(engine, &copy, &stored).await?,
        Format::Parquet => read_parquet(engine, &copy, &stored).await?,
    };
    let stream = frame
        .execute_stream()
        .await?
        .map(|b| b.map_err(CirroError::from));
    let rows = write_stream(table.delta(), stored, stream, SaveMode::Append).await?;
    Ok(Outcome::command(format!("COPY {rows}")))
}

/// The rows `COPY … TO STDOUT` sends: a table's (some of its columns) or a
/// query's, privileges checked as for a SELECT.
pub(crate) async fn copy_out(engine: &Engine, source: CopyOutSource) -> Result<Outcome> {
    match source {
        CopyOutSource::Query(query) => {
            engine
                .run_sql(datafusion::sql::parser::Statement::Statement(Box::new(
                    datafusion::sql::sqlparser::ast::Statement::Query(query),
                )))
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

/// A plain delimited file, as COPY reads it.
pub(crate) async fn read_delimited(
    engine: &Engine,
    path: &str,
    schema: &Schema,
    delimiter: u8,
    header: bool,
) -> Result<DataFrame> {
    check_exists(path)?;
    let copy = CopyFrom {
        table: TableReference::bare("_"),
        path: path.to_string(),
        format: Format::Csv,
        delimiter,
        header,
        null: None,
        quote: None,
        escape: None,
    };
    read_csv(engine, &copy, schema).await
}

async fn read_csv(engine: &Engine, copy: &CopyFrom, stored: &Schema) -> Result<DataFrame> {
    // Read every column as nullable: NOT NULL is checked (with its own SQLSTATE)
    // when the rows are written.
    let mut fields: Vec<Field> = stored
        .fields()
        .iter()
        .map(|f| Field::new(f.name(), f.data_type().clone(), true))
        .collect();
    let trailing = has_trailing_delimiter(&copy.path, copy.delimiter, fields.len());
    if trailing {
        fields.push(Field::new(TRAILING_COLUMN, DataType::Utf8, true));
    }
    let read_schema = Schema::new(fields);
    let extension = extension_of(&copy.path);
    let mut options = CsvReadOptions::new()
        .has_header(copy.header)
        .delimiter(copy.delimiter)
        .schema(&read_schema)
        .file_extension(&extension)
        .null_regex(copy.null.as_ref().map(|n| format!("^{}$", regex_escape(n))));
    if let Some(quote) = copy.quote {
        options = options.quote(quote);
    }
    if let Some(escape) = copy.escape {
        options = options.escape(escape);
    }
    let frame = engine
        .context()
        .read_csv(copy.path.as_str(), options)
        .await?;
    if trailing {
        let names: Vec<&str> = stored.fields().iter().map(|f| f.name().as_str()).collect();
        return Ok(frame.select_columns(&names)?);
    }
    Ok(frame)
}

fn regex_escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

async fn read_parquet(engine: &Engine, copy: &CopyFrom, stored: &Schema) -> Result<DataFrame> {
    let extension = extension_of(&copy.path);
    let options = ParquetReadOptions::default().file_extension(&extension);
    let frame = engine
        .context()
        .read_parquet(copy.path.as_str(), options)
        .await?;
    let file_fields: Vec<String> = frame
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    // Match columns by name where the file has them all, else by position.
    let by_name: Option<Vec<String>> = stored
        .fields()
        .iter()
        .map(|f| {
            file_fields
                .iter()
                .find(|n| n.eq_ignore_ascii_case(f.name()))
                .cloned()
        })
        .collect();
    match by_name {
        Some(names) => {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            Ok(frame.select_columns(&refs)?)
        }
        None if file_fields.len() == stored.fields().len() => Ok(frame),
        None => Err(CirroError::new(
            SqlState::DATATYPE_MISMATCH,
            format!(
                "the Parquet file has columns ({}) that do not match the table's ({})",
                file_fields.join(", "),
                stored
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
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
    /// The INSERT a `COPY … FROM STDIN` runs (refreshed catalog, privileges
    /// checked). Returns the plan, the columns the data holds, and the
    /// partition its rows are read from (filled by the caller before running).
    async fn copy_in_plan(
        &self,
        copy: &CopyIn,
    ) -> Result<(LogicalPlan, Vec<String>, Arc<CopyStream>)> {
        if self.transaction_aborted() {
            return Err(aborted());
        }
        self.catalog().refresh().await?;
        let (db, schema, name) = self.resolve(&copy.table);
        let snapshot = self.catalog().snapshot();
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
        let provider = self.context().table_provider(copy.table.clone()).await?;
        let target = provider.schema();
        let columns: Vec<String> = if copy.columns.is_empty() {
            target.fields().iter().map(|f| f.name().clone()).collect()
        } else {
            for (i, column) in copy.columns.iter().enumerate() {
                if target.field_with_name(column).is_err() {
                    return Err(CirroError::new(
                        SqlState::UNDEFINED_COLUMN,
                        format!("column \"{column}\" of relation \"{name}\" does not exist"),
                    ));
                }
                if copy.columns[..i].contains(column) {
                    return Err(CirroError::new(
                        SqlState::DUPLICATE_COLUMN,
                        format!("column \"{column}\" specified more than once"),
                    ));
                }
            }
            copy.columns.clone()
        };
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
        let projection = target
            .fields()
            .iter()
            .map(|field| {
                let value = if columns.contains(field.name()) {
                    from_text(
                        Expr::Column(Column::from_name(field.name())),
                        field.data_type(),
                    )?
                } else {
                    Expr::Literal(ScalarValue::try_from(field.data_type())?, None)
                };
                Ok(value.alias(field.name()))
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = LogicalPlanBuilder::scan(
            TableReference::bare("copy from stdin"),
            provider_as_source(Arc::new(source)),
            None,
        )?
        .project(projection)?;
        let plan = LogicalPlanBuilder::insert_into(
            plan.build()?,
            copy.table.clone(),
            provider_as_source(provider),
            InsertOp::Append,
        )?
        .build()?;
        self.check_plan(&plan)?;
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
        let (plan, columns, slot) = self.copy_in_plan(copy).await?;
        let parser = CopyParser::new(copy.format.clone(), &columns, copy.table.table());
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
        match self.execute_plan(plan).await? {
            Outcome::Command { tag, notice, .. } => Ok(Outcome::Command {
                tag: format!("COPY {}", tag.rsplit(' ').next().unwrap_or("0")),
                notice,
                reports: vec![],
            }),
            Outcome::Rows(_) => Err(CirroError::internal("COPY planned as a query")),
        }
    }
}
