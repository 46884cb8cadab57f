//! A DuckDB session in a child process (`tests/interop/duckdb_session.py`),
//! the peer of the differential tests.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub struct DuckDb {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl DuckDb {
    pub fn start() -> Self {
        let python = std::env::var_os("CIRRO_TEST_PYTHON")
            .map(PathBuf::from)
            .expect("CIRRO_TEST_PYTHON is not set: run the tests with scripts/test.sh");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/duckdb_session.py");
        let mut child = Command::new(python)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start duckdb session");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            stdin,
            stdout,
        }
    }

    /// Run one statement; its rows, each value as `show` in
    /// `duckdb_session.py` writes it (NULL as `None`), or DuckDB's error.
    pub fn try_rows(&mut self, sql: &str) -> Result<Vec<Vec<Option<String>>>, String> {
        writeln!(self.stdin, "{}", sql.replace('\n', " ")).expect("write to duckdb");
        self.stdin.flush().expect("flush");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("duckdb reply");
        let reply: serde_json::Value = serde_json::from_str(&line).expect("json reply");
        if !reply["ok"].as_bool().unwrap_or(false) {
            return Err(reply["error"].as_str().unwrap_or_default().to_string());
        }
        Ok(reply["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|row| {
                row.as_array()
                    .expect("row")
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .collect())
    }

    /// Run one statement that must succeed; its rows as comma-joined text
    /// (NULL as `NULL`).
    pub fn run(&mut self, sql: &str) -> Vec<String> {
        self.try_rows(sql)
            .unwrap_or_else(|e| panic!("DuckDB failed on {sql}: {e}"))
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|v| v.unwrap_or_else(|| "NULL".into()))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect()
    }
}

impl Drop for DuckDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
