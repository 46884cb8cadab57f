//! Data locations on S3 (`--data s3://bucket/path`), against a local S3
//! server (moto's): tables, deletion vectors, Delta logs and the catalog in
//! the bucket; every write path; separate processes writing one table at
//! once (Delta commits are conditional puts, so none is lost); DROP TABLE
//! and VACUUM remove their objects.

mod common;

use std::process::{Command, Output, Stdio};

use common::cirro_bin;
use common::s3::S3Server;

fn cirro(s3: &S3Server, url: &str, sql: &str) -> std::process::Child {
    Command::new(cirro_bin())
        .args(["--data", url, "sql", "-c", sql])
        .env_remove("CIRRO_DATA")
        .env_remove("COLUMNS")
        .envs(s3.envs())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cirro")
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sql(s3: &S3Server, url: &str, sql: &str) -> String {
    ok(cirro(s3, url, sql).wait_with_output().expect("wait"))
}

/// The single value of a query, read as CSV.
fn scalar(s3: &S3Server, url: &str, query: &str) -> String {
    let out = Command::new(cirro_bin())
        .args(["--data", url, "sql", "--format", "csv", "-c", query])
        .env_remove("CIRRO_DATA")
        .envs(s3.envs())
        .output()
        .expect("run cirro");
    ok(out).lines().nth(1).unwrap_or_default().to_string()
}

#[test]
fn tables_on_s3_take_every_write_path_and_concurrent_writers() {
    let s3 = S3Server::start();
    s3.bucket("lake");
    let url = "s3://lake/warehouse";
    sql(
        &s3,
        url,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR, n INT CHECK (n >= 0)); \
         INSERT INTO t SELECT value, 'v' || value, CAST(value % 7 AS INT) FROM generate_series(1, 10000); \
         UPDATE t SET v = 'updated' WHERE id <= 10; \
         DELETE FROM t WHERE id > 9000; \
         MERGE INTO t USING (SELECT 20000 AS id) s ON t.id = s.id \
           WHEN NOT MATCHED THEN INSERT VALUES (s.id, 'merged', 1); \
         CREATE INDEX t_v ON t (v); \
         CREATE VIEW big AS SELECT id FROM t WHERE id > 8000",
    );
    // Another process reads what the first wrote: catalog and tables live in the bucket.
    assert_eq!(scalar(&s3, url, "SELECT count(*) FROM t"), "9001");
    assert_eq!(
        scalar(&s3, url, "SELECT count(*) FROM t WHERE v = 'updated'"),
        "10"
    );
    assert_eq!(scalar(&s3, url, "SELECT count(*) FROM big"), "1001");
    assert_eq!(
        scalar(&s3, url, "SELECT v FROM t WHERE id = 20000"),
        "merged"
    );
    // Constraints hold on S3 too.
    let dup = cirro(&s3, url, "INSERT INTO t VALUES (1, 'again', 1)")
        .wait_with_output()
        .expect("wait");
    assert!(String::from_utf8_lossy(&dup.stderr).contains("23505"));

    // Four processes append to one table at once: every row lands.
    sql(&s3, url, "CREATE TABLE c (id BIGINT, p INT)");
    let writers: Vec<_> = (0..4)
        .map(|p| {
            cirro(
                &s3,
                url,
                &format!("INSERT INTO c SELECT value, {p} FROM generate_series(1, 20000)"),
            )
        })
        .collect();
    for writer in writers {
        ok(writer.wait_with_output().expect("wait"));
    }
    assert_eq!(scalar(&s3, url, "SELECT count(*) FROM c"), "80000");
    assert_eq!(scalar(&s3, url, "SELECT count(DISTINCT p) FROM c"), "4");

    // Maintenance and time travel; VACUUM and DROP TABLE remove objects.
    sql(&s3, url, "OPTIMIZE c");
    assert_eq!(
        scalar(&s3, url, "SELECT count(*) FROM c VERSION AS OF 1"),
        "20000"
    );
    let before = s3.count("lake", "warehouse/data/cirro/public/c-");
    sql(&s3, url, "VACUUM c RETAIN 0 HOURS");
    let after = s3.count("lake", "warehouse/data/cirro/public/c-");
    assert!(after < before, "VACUUM removed nothing: {before} → {after}");
    assert_eq!(scalar(&s3, url, "SELECT count(*) FROM c"), "80000");
    sql(&s3, url, "DROP TABLE c");
    assert_eq!(s3.count("lake", "warehouse/data/cirro/public/c-"), 0);

    // A bucket that does not exist is a clear error, not a hang.
    let missing = cirro(&s3, "s3://no-such-bucket/x", "SELECT 1")
        .wait_with_output()
        .expect("wait");
    assert!(!missing.status.success());
}
