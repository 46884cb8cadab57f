//! A full disk in the middle of INSERT, UPDATE, MERGE and OPTIMIZE: the
//! statement fails with 53100, the table keeps its previous contents, the
//! files the statement had written are removed, and once space is freed the
//! same statement succeeds. The data location is a small tmpfs mounted by the
//! test (it needs root, as the project's machines and CI run).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TMPFS_BYTES: u64 = 12 * 1024 * 1024;

fn sql(data: &Path, statement: &str) -> Output {
    Command::new(common::cirro_bin())
        .arg("--data")
        .arg(data)
        .args(["sql", "--format", "csv", "-c", statement])
        .env_remove("CIRRO_DATA")
        .output()
        .expect("run cirro")
}

fn ok(data: &Path, statement: &str) -> String {
    let out = sql(data, statement);
    assert!(
        out.status.success(),
        "{statement}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The data and deletion-vector files of the one table in `data`.
fn table_files(data: &Path) -> Vec<String> {
    let schema = data.join("data/cirro/public");
    let table: PathBuf = std::fs::read_dir(&schema)
        .expect("schema dir")
        .map(|e| e.expect("entry").path())
        .next()
        .expect("table dir");
    let mut files: Vec<String> = std::fs::read_dir(table)
        .expect("table dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".parquet") || n.ends_with(".bin"))
        .collect();
    files.sort();
    files
}

fn free_bytes(path: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .expect("df output")
}

const CHECKSUM: &str = "SELECT count(*), sum(id), sum(length(v)) FROM t";

#[test]
fn full_disk_fails_statements_cleanly_and_loses_nothing() {
    let mount = common::Tmpfs::mount(TMPFS_BYTES);
    let data = mount.path().join("data");
    ok(
        &data,
        "CREATE TABLE t (id BIGINT NOT NULL, v VARCHAR) WITH (compression = 'none')",
    );
    ok(
        &data,
        "INSERT INTO t SELECT value, 'row-' || value FROM generate_series(1, 100000) AS g(value)",
    );
    let before = ok(&data, CHECKSUM);
    let files_before = table_files(&data);

    // Fill the disk up to a few hundred KB.
    let filler = mount.path().join("filler");
    let keep = 300 * 1024;
    let fill = free_bytes(mount.path()).saturating_sub(keep);
    std::fs::write(&filler, vec![0u8; fill as usize]).expect("filler");

    for statement in [
        "INSERT INTO t SELECT value, repeat('x', 40) FROM generate_series(200001, 400000) AS g(value)",
        "UPDATE t SET v = v || repeat('u', 30)",
        "MERGE INTO t USING (SELECT value AS id FROM generate_series(1, 100000) AS g(value)) s ON t.id = s.id \
         WHEN MATCHED THEN UPDATE SET v = repeat('m', 40)",
    ] {
        let out = sql(&data, statement);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{statement} succeeded on a full disk"
        );
        assert!(stderr.contains("SQLSTATE 53100"), "{statement}: {stderr}");
        assert_eq!(ok(&data, CHECKSUM), before, "{statement} changed the table");
        assert_eq!(
            table_files(&data),
            files_before,
            "{statement} left files behind"
        );
    }

    // With space again, the same statement works.
    std::fs::remove_file(&filler).expect("remove filler");
    ok(&data, "UPDATE t SET v = v || repeat('u', 30)");
    let after = ok(&data, "SELECT count(*), min(length(v)) FROM t");
    assert_eq!(after, "count,min\n100000,35\n");
}
