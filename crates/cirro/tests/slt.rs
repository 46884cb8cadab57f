//! The sqllogictest suite in `tests/slt/*.slt`, run against the real `cirro`
//! binary. Every statement runs in a new `cirro sql` process on the file's own
//! data location, so every line after the first also checks that what came
//! before it was persisted and is read back after a restart.
//!
//! Results are read as CSV with NULL printed as `NULL`; an empty string is
//! shown as `(empty)`. Errors are matched against `ERROR: … (SQLSTATE xxxxx)`.
//! Files may use `$__TEST_DIR__` (a scratch directory) and `$FIXTURES`
//! (`tests/fixtures`).

mod common;

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use sqllogictest::{DBOutput, DefaultColumnType};

#[derive(Debug)]
struct SqlError(String);

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SqlError {}

struct CirroProcess {
    data: PathBuf,
}

fn is_row_count(line: &str) -> bool {
    line.starts_with('(') && (line.ends_with(" rows)") || line.ends_with(" row)"))
}

#[async_trait]
impl sqllogictest::AsyncDB for CirroProcess {
    type Error = SqlError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<Self::ColumnType>, Self::Error> {
        let out = tokio::process::Command::new(common::cirro_bin())
            .arg("--data")
            .arg(&self.data)
            .args(["sql", "--format", "csv", "--null", "NULL", "-c", sql])
            .env_remove("CIRRO_DATA")
            .output()
            .await
            .map_err(|e| SqlError(format!("cannot run cirro: {e}")))?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            return Err(SqlError(stderr.trim().to_string()));
        }
        // The last statement's summary line decides: a row count for a query,
        // a tag for a command.
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.starts_with("NOTICE:") && !l.starts_with("Time:") && !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        if !is_row_count(last) {
            let count = last
                .rsplit(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            return Ok(DBOutput::StatementComplete(count));
        }
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .from_reader(out.stdout.as_slice());
        let width = reader.headers().map(|h| h.len()).unwrap_or(0);
        let mut rows = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| SqlError(format!("bad CSV from cirro: {e}")))?;
            rows.push(
                record
                    .iter()
                    .map(|c| {
                        if c.is_empty() {
                            "(empty)".to_string()
                        } else {
                            c.to_string()
                        }
                    })
                    .collect(),
            );
        }
        Ok(DBOutput::Rows {
            types: vec![DefaultColumnType::Any; width],
            rows,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "cirro"
    }
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/slt");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/slt")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqllogictest_suite() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .canonicalize()
        .expect("fixtures");
    let mut failures = Vec::new();
    for file in slt_files() {
        let data = common::DataDir::new();
        let path = data.path().to_path_buf();
        let mut runner = sqllogictest::Runner::new(move || {
            let path = path.clone();
            async move { Ok(CirroProcess { data: path }) }
        });
        runner.set_var(
            "FIXTURES".to_string(),
            fixtures.to_string_lossy().into_owned(),
        );
        if let Err(e) = runner.run_file_async(&file).await {
            failures.push(format!("{}: {e}", file.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "sqllogictest failures:\n{}",
        failures.join("\n\n")
    );
}
