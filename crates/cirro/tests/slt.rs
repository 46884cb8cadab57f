//! The sqllogictest suite in `tests/slt/*.slt`, run through every front end:
//!
//! - `in-process`: the engine in this test process (`Engine::execute`);
//! - `postgres`: `cirro serve` over the PostgreSQL protocol (tokio-postgres,
//!   the extended protocol: each statement prepared, then executed);
//! - `flight-sql`: `cirro serve` over Arrow Flight SQL (arrow-flight's client).
//!
//! Each record runs in a session of its own (a new engine session,
//! connection or Flight login), on the file's own data location, so a record
//! sees what earlier records committed and nothing of their sessions (an
//! open transaction ends with its record, uncommitted). A record may hold
//! several statements: they run in order, the first error ends the record,
//! and the last statement's result is checked.
//!
//! Results are compared as the shell prints them with `--format csv --null
//! NULL`: Arrow results through the same CSV writer; PostgreSQL values are
//! decoded by their type into Arrow values first. An empty string is shown
//! as `(empty)`, a line of a multi-line value as a row of its own (EXPLAIN),
//! and physical plans without the names of data files (`file_groups={2 groups}`).
//! Errors read `message (SQLSTATE xxxxx)`.
//!
//! In process, the suite runs again under each speed switch (`SET jit =
//! force`, …), physical plans aside.
//!
//! A record an engine cannot run is marked `skipif <engine>` with a comment
//! saying why; at most 1 % of the records of each engine may be.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::common::server::{PASSWORD, spawn_serve};
use arrow::array::{
    ArrayRef, BinaryArray, BooleanArray, Date32Array, Float32Array, Float64Array, Int16Array,
    Int32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{Field, Schema, SchemaRef};
use async_trait::async_trait;
use cirro_catalog::Catalog;
use cirro_engine::{Engine, EngineConfig, Outcome, split_statements};
use futures::{StreamExt, TryStreamExt};
use sqllogictest::{DBOutput, DefaultColumnType};

#[derive(Debug)]
struct SqlError(String);

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SqlError {}

fn error(message: impl std::fmt::Display) -> SqlError {
    SqlError(message.to_string())
}

/// An engine error as the shell prints it.
fn cirro_error(e: impl Into<cirro_common::CirroError>) -> SqlError {
    let e = e.into();
    error(format!("{} (SQLSTATE {})", e.message, e.state))
}

/// A Flight SQL error: the server's message (which ends in its SQLSTATE).
fn flight_error(e: arrow_flight::error::FlightError) -> SqlError {
    match e {
        arrow_flight::error::FlightError::Tonic(status) => error(status.message()),
        other => error(other),
    }
}

type Output = DBOutput<DefaultColumnType>;

/// Rows as the shell's CSV output shows them (see the module docs).
fn rows_of(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Output, SqlError> {
    let mut csv = Vec::new();
    {
        let mut writer = arrow_csv::WriterBuilder::new()
            .with_header(false)
            .with_null("NULL".to_string())
            .with_date_format("%Y-%m-%d".to_string())
            .with_timestamp_format("%Y-%m-%d %H:%M:%S%.f".to_string())
            .build(&mut csv);
        for batch in batches {
            writer.write(batch).map_err(error)?;
        }
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(csv.as_slice());
    let mut rows: Vec<Vec<String>> = Vec::new();
    for record in reader.records() {
        let record = record.map_err(error)?;
        let cells: Vec<&str> = record.iter().collect();
        let height = cells.iter().map(|c| c.lines().count()).max().unwrap_or(1);
        for line in 0..height.max(1) {
            let row = cells
                .iter()
                .filter_map(|cell| match (line, cell.lines().nth(line)) {
                    (0, _) if cell.is_empty() => Some("(empty)".to_string()),
                    (_, Some(text)) => Some(without_file_names(text.trim_end())),
                    (0, None) => Some(String::new()),
                    _ => None,
                })
                .collect();
            rows.push(row);
        }
    }
    Ok(DBOutput::Rows {
        types: vec![DefaultColumnType::Any; schema.fields().len()],
        rows,
    })
}

/// A physical plan's line without the data files' names, which differ
/// from run to run: `file_groups={2 groups: [[a.parquet], [b.parquet]]}`
/// reads `file_groups={2 groups}`.
fn without_file_names(line: &str) -> String {
    let Some(start) = line.find("file_groups={") else {
        return line.to_string();
    };
    let open = start + "file_groups=".len();
    let mut depth = 0;
    for (i, c) in line[open..].char_indices() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            let inner = &line[open + 1..open + i];
            let count = inner.split(':').next().unwrap_or(inner);
            return format!("{}{{{count}}}{}", &line[..open], &line[open + i + 1..]);
        }
    }
    line.to_string()
}

/// The row count at the end of a command tag (`INSERT 0 5` → 5), else 0.
fn count_of(tag: &str) -> u64 {
    tag.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn statements(sql: &str) -> Vec<String> {
    split_statements(sql)
}

// ------------------------------------------------------------ in-process

struct InProcess {
    catalog: Arc<Catalog>,
    /// Statements each record's session runs first (`SET jit = force`).
    settings: &'static str,
}

#[async_trait]
impl sqllogictest::AsyncDB for InProcess {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<Output, SqlError> {
        let config = EngineConfig {
            target_partitions: Some(2),
            ..EngineConfig::default()
        };
        let engine = Engine::with_catalog(Arc::clone(&self.catalog), config, None);
        for setting in statements(self.settings) {
            engine.execute(&setting).await.map_err(cirro_error)?;
        }
        let mut last = DBOutput::StatementComplete(0);
        for statement in statements(sql) {
            let outcome = engine.execute(&statement).await.map_err(cirro_error)?;
            last = match outcome {
                Outcome::Rows(stream) => {
                    let schema = stream.schema();
                    let batches: Vec<RecordBatch> =
                        stream.try_collect().await.map_err(cirro_error)?;
                    rows_of(&schema, &batches)?
                }
                Outcome::Command { tag, .. } => DBOutput::StatementComplete(count_of(&tag)),
            };
        }
        Ok(last)
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "in-process"
    }
}

// ------------------------------------------------------------ PostgreSQL

/// Servers (`host`, `port`) a record may run on; each record connects to
/// the next one in turn (round-robin over a cluster's nodes).
struct Postgres {
    servers: Vec<(String, u16)>,
    password: String,
    next: usize,
}

impl Postgres {
    fn local(port: u16) -> Self {
        Self {
            servers: vec![("127.0.0.1".to_string(), port)],
            password: PASSWORD.to_string(),
            next: 0,
        }
    }
}

/// A PostgreSQL NUMERIC in its text form (binary: digit groups of base
/// 10,000, a weight and the display scale).
struct Numeric(String);

impl<'a> tokio_postgres::types::FromSql<'a> for Numeric {
    fn from_sql(
        _ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let word = |i: usize| -> Result<i16, Box<dyn std::error::Error + Sync + Send>> {
            let bytes = raw.get(i * 2..i * 2 + 2).ok_or("short NUMERIC")?;
            Ok(i16::from_be_bytes([bytes[0], bytes[1]]))
        };
        let (count, weight, sign, scale) = (word(0)?, word(1)?, word(2)? as u16, word(3)?);
        if sign == 0xC000 {
            return Ok(Numeric("NaN".into()));
        }
        let digits = (0..count as usize)
            .map(|i| word(4 + i))
            .collect::<Result<Vec<_>, _>>()?;
        let group = |g: i32| -> i16 {
            usize::try_from(g)
                .ok()
                .and_then(|g| digits.get(g).copied())
                .unwrap_or(0)
        };
        let mut text = String::new();
        if sign == 0x4000 {
            text.push('-');
        }
        // Integer part: groups 0 ..= weight.
        if weight < 0 {
            text.push('0');
        } else {
            for g in 0..=weight as i32 {
                if g == 0 {
                    text.push_str(&group(g).to_string());
                } else {
                    text.push_str(&format!("{:04}", group(g)));
                }
            }
        }
        if scale > 0 {
            let mut fraction = String::new();
            let mut g = weight as i32 + 1;
            while fraction.len() < scale as usize {
                fraction.push_str(&format!("{:04}", group(g)));
                g += 1;
            }
            fraction.truncate(scale as usize);
            text.push('.');
            text.push_str(&fraction);
        }
        Ok(Numeric(text))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::NUMERIC
    }
}

/// One column of PostgreSQL rows as an Arrow array (by the column's type).
fn pg_column(rows: &[tokio_postgres::Row], i: usize) -> Result<ArrayRef, SqlError> {
    use tokio_postgres::types::Type;
    let ty = rows
        .first()
        .map(|r| r.columns()[i].type_().clone())
        .unwrap_or(Type::TEXT);
    fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        rows: &'a [tokio_postgres::Row],
        i: usize,
    ) -> Result<Vec<Option<T>>, SqlError> {
        rows.iter()
            .map(|r| r.try_get::<_, Option<T>>(i).map_err(error))
            .collect()
    }
    Ok(match ty {
        Type::BOOL => Arc::new(BooleanArray::from(get::<bool>(rows, i)?)),
        Type::INT2 => Arc::new(Int16Array::from(get::<i16>(rows, i)?)),
        Type::INT4 => Arc::new(Int32Array::from(get::<i32>(rows, i)?)),
        Type::INT8 => Arc::new(Int64Array::from(get::<i64>(rows, i)?)),
        Type::FLOAT4 => Arc::new(Float32Array::from(get::<f32>(rows, i)?)),
        Type::FLOAT8 => Arc::new(Float64Array::from(get::<f64>(rows, i)?)),
        Type::NUMERIC => Arc::new(StringArray::from(
            get::<Numeric>(rows, i)?
                .into_iter()
                .map(|n| n.map(|n| n.0))
                .collect::<Vec<_>>(),
        )),
        Type::DATE => {
            let epoch =
                chrono::NaiveDate::from_ymd_opt(1970, 1, 1).ok_or_else(|| error("epoch"))?;
            Arc::new(Date32Array::from(
                get::<chrono::NaiveDate>(rows, i)?
                    .into_iter()
                    .map(|d| d.map(|d| (d - epoch).num_days() as i32))
                    .collect::<Vec<_>>(),
            ))
        }
        Type::TIMESTAMP => Arc::new(TimestampMicrosecondArray::from(
            get::<chrono::NaiveDateTime>(rows, i)?
                .into_iter()
                .map(|t| t.map(|t| t.and_utc().timestamp_micros()))
                .collect::<Vec<_>>(),
        )),
        Type::TIMESTAMPTZ => Arc::new(
            TimestampMicrosecondArray::from(
                get::<chrono::DateTime<chrono::Utc>>(rows, i)?
                    .into_iter()
                    .map(|t| t.map(|t| t.timestamp_micros()))
                    .collect::<Vec<_>>(),
            )
            .with_timezone("UTC"),
        ),
        Type::BYTEA => Arc::new(BinaryArray::from(
            get::<&[u8]>(rows, i)?.into_iter().collect::<Vec<_>>(),
        )),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            Arc::new(StringArray::from(get::<String>(rows, i)?))
        }
        other => return Err(error(format!("the slt runner cannot read type {other}"))),
    })
}

fn pg_error(e: tokio_postgres::Error) -> SqlError {
    match e.as_db_error() {
        Some(db) => error(format!("{} (SQLSTATE {})", db.message(), db.code().code())),
        None => error(e),
    }
}

#[async_trait]
impl sqllogictest::AsyncDB for Postgres {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<Output, SqlError> {
        let (host, port) = &self.servers[self.next % self.servers.len()];
        self.next += 1;
        let config = format!(
            "host={host} port={port} user=cirro password={} dbname=cirro",
            self.password
        );
        let (client, connection) = tokio_postgres::connect(&config, tokio_postgres::NoTls)
            .await
            .map_err(pg_error)?;
        let connection = tokio::spawn(connection);
        let mut last = DBOutput::StatementComplete(0);
        for statement in statements(sql) {
            let prepared = client.prepare(&statement).await.map_err(pg_error)?;
            if prepared.columns().is_empty() {
                let count = client.execute(&prepared, &[]).await.map_err(pg_error)?;
                last = DBOutput::StatementComplete(count);
                continue;
            }
            let rows = client.query(&prepared, &[]).await.map_err(pg_error)?;
            let fields: Vec<Field> = prepared
                .columns()
                .iter()
                .map(|c| Field::new(c.name(), arrow::datatypes::DataType::Utf8, true))
                .collect();
            let columns = (0..fields.len())
                .map(|i| pg_column(&rows, i))
                .collect::<Result<Vec<_>, _>>()?;
            let fields: Vec<Field> = fields
                .iter()
                .zip(&columns)
                .map(|(f, c)| Field::new(f.name(), c.data_type().clone(), true))
                .collect();
            let schema = Arc::new(Schema::new(fields));
            let batch = if rows.is_empty() {
                RecordBatch::new_empty(Arc::clone(&schema))
            } else {
                RecordBatch::try_new(Arc::clone(&schema), columns).map_err(error)?
            };
            last = rows_of(&schema, &[batch])?;
        }
        drop(client);
        let _ = connection.await;
        Ok(last)
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "postgres"
    }
}

// ------------------------------------------------------------ Flight SQL

struct FlightSql {
    port: u16,
}

#[async_trait]
impl sqllogictest::AsyncDB for FlightSql {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<Output, SqlError> {
        use arrow_flight::sql::client::FlightSqlServiceClient;
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.port))
                .map_err(error)?
                .connect()
                .await
                .map_err(error)?;
        let mut client = FlightSqlServiceClient::new(channel);
        client
            .handshake("cirro", PASSWORD)
            .await
            .map_err(flight_error)?;
        let mut last = DBOutput::StatementComplete(0);
        for statement in statements(sql) {
            let info = client
                .execute(statement, None)
                .await
                .map_err(flight_error)?;
            let total = info.total_records;
            let endpoints = info.endpoint.clone();
            let schema = Arc::new(info.try_decode_schema().map_err(error)?);
            let mut batches = Vec::new();
            for endpoint in endpoints {
                let ticket = endpoint.ticket.ok_or_else(|| error("no ticket"))?;
                let stream = client.do_get(ticket).await.map_err(flight_error)?;
                let got: Vec<RecordBatch> = stream.try_collect().await.map_err(flight_error)?;
                batches.extend(got);
            }
            last = if schema.fields().is_empty() {
                DBOutput::StatementComplete(total.max(0) as u64)
            } else {
                rows_of(&schema, &batches)?
            };
        }
        Ok(last)
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "flight-sql"
    }
}

// ------------------------------------------------------------ the suite

/// The suite's files; `CIRRO_SLT=name` (a file stem) runs one file only,
/// for working on it.
fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/slt");
    let only = std::env::var("CIRRO_SLT").ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/slt")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| {
            only.as_deref()
                .is_none_or(|only| p.file_stem().is_some_and(|s| s == only))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    files
}

fn fixtures() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .canonicalize()
        .expect("fixtures")
        .to_string_lossy()
        .into_owned()
}

/// Records of the suite, and those marked `skipif engine`; every mark must
/// follow a comment giving the reason.
fn records_and_skips(engine: &str) -> (usize, usize) {
    let (mut records, mut skips) = (0, 0);
    for file in slt_files() {
        let text = std::fs::read_to_string(&file).expect("read slt");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.starts_with("statement ") || line.starts_with("query ") {
                records += 1;
            }
            if line.trim() == format!("skipif {engine}") {
                skips += 1;
                // The nearest line above that is not a condition.
                let reason = lines[..i]
                    .iter()
                    .rev()
                    .find(|l| !l.starts_with("skipif ") && !l.starts_with("onlyif "))
                    .is_some_and(|l| l.starts_with('#'));
                assert!(
                    reason,
                    "{}:{}: `skipif {engine}` needs a comment saying why",
                    file.display(),
                    i + 1
                );
            }
        }
    }
    (records, skips)
}

/// The suite on `engine`, `at_once` files at a time: each file has its own
/// data location and server, so files of a front end that mostly waits (a
/// server on HDFS or S3, whose every commit is a few round trips) overlap;
/// front ends that compute in this process run one file at a time.
async fn run_suite<D, F, Fut>(engine: &str, at_once: usize, connect: F)
where
    D: sqllogictest::AsyncDB<Error = SqlError, ColumnType = DefaultColumnType> + 'static,
    F: Fn(PathBuf) -> Fut,
    Fut: std::future::Future<Output = (Box<dyn FnOnce() + Send>, D)>,
{
    run_suite_labelled(
        engine,
        None,
        sqllogictest::default_validator,
        at_once,
        connect,
    )
    .await
}

/// [`run_suite`] with one more label (`cluster`: records a cluster cannot
/// run, physical plans of one node, say `skipif cluster`) and a validator
/// of results.
async fn run_suite_labelled<D, F, Fut>(
    engine: &str,
    label: Option<&str>,
    validator: sqllogictest::Validator,
    at_once: usize,
    connect: F,
) where
    D: sqllogictest::AsyncDB<Error = SqlError, ColumnType = DefaultColumnType> + 'static,
    F: Fn(PathBuf) -> Fut,
    Fut: std::future::Future<Output = (Box<dyn FnOnce() + Send>, D)>,
{
    for name in std::iter::once(engine).chain(label) {
        let (records, skips) = records_and_skips(name);
        assert!(
            skips * 100 <= records,
            "{skips} of {records} records are skipped on {name}: over 1 %"
        );
    }
    let connect = &connect;
    let run_file = |file: PathBuf| async move {
        let data = common::DataDir::new();
        let (stop, db) = connect(data.path().to_path_buf()).await;
        let db = Arc::new(tokio::sync::Mutex::new(Some(db)));
        let mut runner = sqllogictest::Runner::new(move || {
            let db = Arc::clone(&db);
            async move {
                db.lock()
                    .await
                    .take()
                    .ok_or_else(|| error("one connection per file"))
            }
        });
        runner.with_validator(validator);
        runner.add_label(engine);
        if let Some(label) = label {
            runner.add_label(label);
        }
        runner.set_var("FIXTURES".to_string(), fixtures());
        let failure = runner
            .run_file_async(&file)
            .await
            .err()
            .map(|e| format!("{}: {e}", file.display()));
        stop();
        failure
    };
    let mut failures: Vec<String> = futures::stream::iter(slt_files())
        .map(run_file)
        .buffer_unordered(at_once.max(1))
        .filter_map(|failure| async move { failure })
        .collect()
        .await;
    failures.sort();
    assert!(
        failures.is_empty(),
        "sqllogictest failures on {engine}:\n{}",
        failures.join("\n\n")
    );
}

/// The engine in this process on `data`, each record's session running
/// `settings` first.
async fn in_process(
    data: PathBuf,
    settings: &'static str,
) -> (Box<dyn FnOnce() + Send>, InProcess) {
    let root =
        cirro_storage::StorageRoot::open(data.to_str().expect("utf8 path")).expect("data location");
    let catalog = Catalog::open(root).await.expect("catalog");
    (
        Box::new(|| {}) as Box<dyn FnOnce() + Send>,
        InProcess { catalog, settings },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_in_process() {
    run_suite("in-process", 1, |data| in_process(data, "")).await;
}

/// Under a speed switch physical plans differ by design (`jit(…)`, radix
/// partitions, `cache=…`): a plan is accepted as long as one came back;
/// every other result must be the default's.
fn plans_aside(
    normalizer: sqllogictest::Normalizer,
    actual: &[Vec<String>],
    expected: &[String],
) -> bool {
    let plan = |line: &str| line.contains("Exec: ") || line.contains("Exec,");
    if expected.iter().any(|l| plan(l)) && actual.iter().flatten().any(|l| plan(l)) {
        return true;
    }
    sqllogictest::default_validator(normalizer, actual, expected)
}

/// The suite again with each of issue 18's speed switches forced on and off
/// (compiled expressions, adaptive aggregation, the hot-data tier): five
/// more in-process runs, about 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_in_process_with_each_speed_switch() {
    for settings in [
        "SET jit = force",
        "SET jit = off",
        "SET adaptive_aggregation = force",
        "SET adaptive_aggregation = off",
        "SET cache = off",
    ] {
        eprintln!("sqllogictest in process with {settings}");
        run_suite_labelled("in-process", None, plans_aside, 1, move |data| {
            in_process(data, settings)
        })
        .await;
    }
}

/// A `cirro serve` on `data`, and what stops it. It starts on a thread of
/// its own (starting blocks until the server listens), so that the records
/// of other files run meanwhile.
async fn serve(data: PathBuf) -> (Box<dyn FnOnce() + Send>, u16, u16) {
    // Small writes through the tables' files; the row store's run is
    // `sqllogictest_over_postgres_wire_with_row_store`.
    serve_with(data, &["--row-store", "off"]).await
}

/// [`serve`] with more flags.
async fn serve_with(
    data: PathBuf,
    args: &'static [&'static str],
) -> (Box<dyn FnOnce() + Send>, u16, u16) {
    let (mut child, pg_port, flight_port, _) =
        tokio::task::spawn_blocking(move || spawn_serve(&data, args, PASSWORD))
            .await
            .expect("start cirro serve");
    let stop = Box::new(move || {
        let _ = child.kill();
        let _ = child.wait();
    });
    (stop, pg_port, flight_port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_over_postgres_wire() {
    run_suite("postgres", 2, |data| async move {
        let (stop, port, _) = serve(data).await;
        (stop, Postgres::local(port))
    })
    .await;
}

/// The suite over the PostgreSQL wire on a server that keeps small writes
/// in row stores (`--row-store on`): every answer must be the same as
/// through the tables' files. Records marked `skipif row-store` say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_over_postgres_wire_with_row_store() {
    run_suite_labelled(
        "postgres",
        Some("row-store"),
        sqllogictest::default_validator,
        2,
        |data| async move {
            let (stop, port, _) = serve_with(data, &["--row-store", "on"]).await;
            (stop, Postgres::local(port))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_over_flight_sql() {
    run_suite("flight-sql", 2, |data| async move {
        let (stop, _, port) = serve(data).await;
        (stop, FlightSql { port })
    })
    .await;
}

/// Files at once on a server whose data location is on HDFS or S3: those
/// runs mostly wait on the storage (a run of one file at a time kept two
/// cores 10–25 % busy).
const REMOTE_FILES_AT_ONCE: usize = 4;

/// The suite over the PostgreSQL wire with the data location in an S3
/// bucket (a local S3 server): every file in its own path of the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_over_postgres_wire_on_s3() {
    let s3 = Arc::new(common::s3::S3Server::start());
    s3.bucket("slt");
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    run_suite("postgres", REMOTE_FILES_AT_ONCE, |_| {
        let s3 = Arc::clone(&s3);
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        async move {
            let url = format!("s3://slt/file{n}");
            // The server starts on a thread of its own (it blocks until the
            // server listens), so that the other files' records go on.
            let (mut child, port) = tokio::task::spawn_blocking(move || {
                let envs = s3.envs();
                let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let (child, port, _, _) = common::server::spawn_serve_with(
                    Path::new(&url),
                    &[],
                    PASSWORD,
                    &envs,
                    std::process::Stdio::null(),
                );
                (child, port)
            })
            .await
            .expect("start cirro serve");
            let stop = Box::new(move || {
                let _ = child.kill();
                let _ = child.wait();
            }) as Box<dyn FnOnce() + Send>;
            (stop, Postgres::local(port))
        }
    })
    .await;
}

/// The suite over the PostgreSQL wire with the data location on HDFS (a
/// MiniDFSCluster): every file in its own directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_over_postgres_wire_on_hdfs() {
    let hdfs = common::hdfs::Hdfs::start(1);
    let base = hdfs.url.clone();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    run_suite("postgres", REMOTE_FILES_AT_ONCE, |_| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let url = format!("{base}/file{n}");
        async move {
            let (stop, port, _) = serve(PathBuf::from(url)).await;
            (stop, Postgres::local(port))
        }
    })
    .await;
    drop(hdfs);
}

/// Clusters the cluster run spreads the files over, one file on each at a
/// time: a file's records mostly wait on HDFS and the network (one cluster
/// alone kept two cores 15–25 % busy).
const CLUSTERS: usize = 3;

/// The suite over the PostgreSQL wire against 3-node clusters on HDFS
/// (`scripts/cluster up --nodes 3 --storage hdfs`), records spread
/// round-robin over a cluster's nodes: each file takes a free cluster and
/// a new data location on it (`scripts/cluster reset`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_over_postgres_wire_on_a_hdfs_cluster() {
    let clusters: Vec<Arc<common::cluster::Cluster>> = std::thread::scope(|scope| {
        let started: Vec<_> = (0..CLUSTERS)
            .map(|_| scope.spawn(|| Arc::new(common::cluster::Cluster::up(3, "hdfs"))))
            .collect();
        started
            .into_iter()
            .map(|s| s.join().expect("a cluster started"))
            .collect()
    });
    let free = Arc::new(std::sync::Mutex::new(clusters));
    run_suite_labelled(
        "postgres",
        Some("cluster"),
        sqllogictest::default_validator,
        CLUSTERS,
        |_| {
            let free = Arc::clone(&free);
            async move {
                let cluster = free
                    .lock()
                    .expect("clusters")
                    .pop()
                    .expect("a free cluster: one file per cluster at a time");
                let resetting = Arc::clone(&cluster);
                tokio::task::spawn_blocking(move || resetting.script(&["reset"]))
                    .await
                    .expect("scripts/cluster reset");
                let servers = cluster
                    .pg
                    .iter()
                    .map(|address| {
                        let (host, port) = address.rsplit_once(':').expect("host:port");
                        (host.to_string(), port.parse().expect("port"))
                    })
                    .collect();
                let db = Postgres {
                    servers,
                    password: cluster.password.clone(),
                    next: 0,
                };
                let back = Box::new(move || free.lock().expect("clusters").push(cluster));
                (back as Box<dyn FnOnce() + Send>, db)
            }
        },
    )
    .await;
}
