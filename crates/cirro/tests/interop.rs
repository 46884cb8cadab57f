//! Tables Cirro writes read back identically with independent Delta readers:
//! DuckDB's delta extension and the `deltalake` package, after DELETE, UPDATE
//! and MERGE wrote deletion vectors (the log is checked for them, so
//! merge-on-read really happened).
//!
//! The readers run in the Python environment `scripts/test.sh` sets up
//! (`tests/interop/requirements.txt`); its interpreter is `CIRRO_TEST_PYTHON`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{DataDir, table_dir};

fn python() -> PathBuf {
    let python = std::env::var_os("CIRRO_TEST_PYTHON")
        .map(PathBuf::from)
        .expect("CIRRO_TEST_PYTHON is not set: run the tests with scripts/test.sh, which sets up the Python readers");
    assert!(python.exists(), "{} does not exist", python.display());
    python
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/read_delta.py")
}

/// CSV lines after the header, sorted.
fn sorted_rows(csv: &str) -> Vec<String> {
    let mut rows: Vec<String> = csv.lines().skip(1).map(str::to_string).collect();
    rows.sort();
    rows
}

fn read_with(reader: &str, table: &Path) -> Vec<String> {
    let out = Command::new(python())
        .arg(script())
        .arg(reader)
        .arg(table)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{reader} could not read {}: {}",
        table.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    sorted_rows(&String::from_utf8_lossy(&out.stdout))
}

fn log_text(table: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(table.join("_delta_log")).expect("log") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "json") {
            text.push_str(&std::fs::read_to_string(path).expect("commit"));
        }
    }
    text
}

fn cirro_rows(data: &DataDir, sql: &str) -> Vec<String> {
    let out = data.sql_output(sql, &["--format", "csv", "--null", "NULL"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sorted_rows(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn duckdb_and_deltalake_read_what_cirro_wrote_including_deletion_vectors() {
    let data = DataDir::new();
    data.sql_ok(
        "CREATE TABLE t (id INT NOT NULL, big BIGINT, name VARCHAR, price DECIMAL(12,2), \
         day DATE, flag BOOLEAN, score DOUBLE)",
    );
    // two inserts: two data files
    for range in ["1, 3000", "3001, 6000"] {
        data.sql_ok(&format!(
            "INSERT INTO t SELECT CAST(value AS INT) AS a, value * 1000 AS b, 'name-' || value AS c, \
             CAST(value AS DECIMAL(12,2)) / 4 AS d, CAST(DATE '2024-01-01' + CAST(value % 365 AS INT) AS DATE) AS e, \
             value % 2 = 0 AS f, CAST(value AS DOUBLE) / 4 AS g FROM generate_series({range}) AS g(value)"
        ));
    }
    let table = table_dir(&data, "t");
    let check = |stage: &str| {
        let expected = cirro_rows(&data, "SELECT * FROM t");
        for reader in ["duckdb", "deltalake"] {
            let got = read_with(reader, &table);
            assert_eq!(
                got.len(),
                expected.len(),
                "{reader} after {stage}: row count"
            );
            assert!(got == expected, "{reader} after {stage}: contents differ");
        }
        expected.len()
    };
    assert_eq!(check("insert"), 6000);

    data.sql_ok("DELETE FROM t WHERE id % 7 = 0");
    data.sql_ok("UPDATE t SET name = NULL, price = price + 1 WHERE id % 11 = 0");
    data.sql_ok(
        "MERGE INTO t USING (SELECT CAST(value AS INT) AS id FROM generate_series(5990, 6010) AS g(value)) s \
         ON t.id = s.id \
         WHEN MATCHED AND t.id % 2 = 0 THEN DELETE \
         WHEN MATCHED THEN UPDATE SET flag = NULL \
         WHEN NOT MATCHED THEN INSERT (id, name) VALUES (s.id, 'merged')",
    );
    let log = log_text(&table);
    assert!(
        log.contains("\"deletionVector\":{"),
        "no deletion vector in the log: DML did not use merge-on-read"
    );
    assert!(log.contains("\"deletionVectors\""), "table feature missing");
    let rows = check("delete, update and merge");
    assert!(rows > 5000 && rows < 6000, "{rows} rows");
}
