//! Tables Cirro writes read back identically with independent Delta readers:
//! DuckDB's delta extension and the `deltalake` package, after DELETE, UPDATE
//! and MERGE wrote deletion vectors (the log is checked for them, so
//! merge-on-read really happened).
//!
//! The readers run in the Python environment `scripts/test.sh` sets up
//! (`tests/interop/requirements.txt`); its interpreter is `CIRRO_TEST_PYTHON`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{DataDir, table_dir};

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

/// The header line and the sorted rows of a CSV output.
fn header_and_rows(csv: &str) -> (String, Vec<String>) {
    let header = csv.lines().next().unwrap_or_default().to_string();
    (header, sorted_rows(csv))
}

#[test]
fn duckdb_and_deltalake_read_tables_after_alter_table() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE t (id INT NOT NULL, name VARCHAR, price DECIMAL(8,2), qty SMALLINT)");
    data.sql_ok(
        "INSERT INTO t SELECT CAST(value AS INT) AS id, 'n' || value AS name, \
         CAST(value AS DECIMAL(8,2)) / 4 AS price, CAST(value % 100 AS SMALLINT) AS qty \
         FROM generate_series(1, 2000) AS g(value)",
    );
    data.sql_ok("DELETE FROM t WHERE id % 5 = 0");
    let table = table_dir(&data, "t");
    let check = |stage: &str, columns: &str| {
        let out = data.sql_output("SELECT * FROM t", &["--format", "csv", "--null", "NULL"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (header, expected) = header_and_rows(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(header, columns, "Cirro's columns after {stage}");
        for reader in ["duckdb", "deltalake"] {
            let out = Command::new(python())
                .arg(script())
                .arg(reader)
                .arg(&table)
                .output()
                .expect("run python");
            assert!(
                out.status.success(),
                "{reader} could not read the table after {stage}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let (got_header, got) = header_and_rows(&String::from_utf8_lossy(&out.stdout));
            assert_eq!(got_header, columns, "{reader}'s columns after {stage}");
            assert_eq!(
                got.len(),
                expected.len(),
                "{reader} after {stage}: row count"
            );
            assert!(got == expected, "{reader} after {stage}: contents differ");
        }
    };
    check("delete", "id,name,price,qty");

    // Metadata only: the old files lack the column, every reader fills NULL.
    data.sql_ok("ALTER TABLE t ADD COLUMN note VARCHAR");
    data.sql_ok("INSERT INTO t VALUES (5000, 'new', 1.25, 7, 'added later')");
    check("add column", "id,name,price,qty,note");
    assert_eq!(
        data.query_csv("SELECT count(*) AS n, count(note) AS notes FROM t"),
        "n|notes\n1601|1\n",
        "the 1,600 old rows read NULL in the new column"
    );

    // Rewrites in one commit each.
    data.sql_ok(
        "ALTER TABLE t ALTER COLUMN qty TYPE BIGINT, ALTER COLUMN price TYPE DECIMAL(12,3)",
    );
    data.sql_ok("ALTER TABLE t RENAME COLUMN name TO label");
    data.sql_ok("ALTER TABLE t DROP COLUMN note");
    check("type change, rename and drop", "id,label,price,qty");
    data.sql_ok("ALTER TABLE t ALTER COLUMN label SET NOT NULL");
    data.sql_ok("ALTER TABLE t ALTER COLUMN id DROP NOT NULL");
    check("not null changes", "id,label,price,qty");
}
