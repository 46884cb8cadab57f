//! Data locations on S3 (`--data s3://bucket/path`, against moto's local S3
//! server) and on HDFS (`--data hdfs://host:port/path`, against a
//! MiniDFSCluster): tables, deletion vectors, Delta logs and the catalog
//! there; every write path; separate processes writing one table at once
//! (Delta commits are conditional puts / non-overwriting renames, so none
//! is lost); DROP TABLE and VACUUM remove their objects.

use std::process::{Command, Output, Stdio};

use crate::common::cirro_bin;
use crate::common::hdfs::Hdfs;
use crate::common::s3::S3Server;

/// A remote data location: its URL, the environment that reaches it, and
/// how many objects it holds under a path.
struct Location {
    url: String,
    envs: Vec<(&'static str, String)>,
    count: Box<dyn Fn(&str) -> usize>,
}

fn cirro(at: &Location, sql: &str) -> std::process::Child {
    cirro_on(at, &at.url, sql)
}

fn cirro_on(at: &Location, url: &str, sql: &str) -> std::process::Child {
    Command::new(cirro_bin())
        .args(["--data", url, "sql", "-c", sql])
        .env_remove("CIRRO_DATA")
        .env_remove("COLUMNS")
        .envs(at.envs.iter().map(|(k, v)| (*k, v.as_str())))
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

fn sql(at: &Location, sql: &str) -> String {
    ok(cirro(at, sql).wait_with_output().expect("wait"))
}

/// The single value of a query, read as CSV.
fn scalar(at: &Location, query: &str) -> String {
    let out = Command::new(cirro_bin())
        .args(["--data", &at.url, "sql", "--format", "csv", "-c", query])
        .env_remove("CIRRO_DATA")
        .envs(at.envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run cirro");
    ok(out).lines().nth(1).unwrap_or_default().to_string()
}

#[test]
fn tables_on_s3_take_every_write_path_and_concurrent_writers() {
    let s3 = std::sync::Arc::new(S3Server::start());
    s3.bucket("lake");
    let listing = std::sync::Arc::clone(&s3);
    let at = Location {
        url: "s3://lake/warehouse".into(),
        envs: s3.envs(),
        count: Box::new(move |prefix| listing.count("lake", &format!("warehouse/{prefix}"))),
    };
    every_write_path(&at);
    // A bucket that does not exist is a clear error, not a hang.
    let missing = cirro_on(&at, "s3://no-such-bucket/x", "SELECT 1")
        .wait_with_output()
        .expect("wait");
    assert!(!missing.status.success());
}

#[test]
fn tables_on_hdfs_take_every_write_path_and_concurrent_writers() {
    let hdfs = Hdfs::start(1);
    let url = format!("{}/warehouse", hdfs.url);
    let root = cirro_storage::StorageRoot::open(&url).expect("HDFS location");
    let at = Location {
        url: url.clone(),
        envs: Vec::new(),
        count: Box::new(move |prefix| {
            let runtime = tokio::runtime::Runtime::new().expect("runtime");
            runtime.block_on(async {
                use futures::TryStreamExt;
                let dir = root.path(prefix.rsplit_once('/').map_or("", |(d, _)| d));
                let name = prefix.rsplit('/').next().unwrap_or_default().to_string();
                let all: Vec<_> = root
                    .store()
                    .list(Some(&dir))
                    .try_collect()
                    .await
                    .expect("list");
                all.iter()
                    .filter(|o| o.location.as_ref().contains(&format!("/{name}")))
                    .count()
            })
        }),
    };
    every_write_path(&at);
    drop(hdfs);
}

/// Every write path at `at`, then four processes appending at once.
fn every_write_path(at: &Location) {
    sql(
        at,
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
    assert_eq!(scalar(at, "SELECT count(*) FROM t"), "9001");
    assert_eq!(
        scalar(at, "SELECT count(*) FROM t WHERE v = 'updated'"),
        "10"
    );
    assert_eq!(scalar(at, "SELECT count(*) FROM big"), "1001");
    assert_eq!(scalar(at, "SELECT v FROM t WHERE id = 20000"), "merged");
    // Constraints hold on S3 too.
    let dup = cirro(at, "INSERT INTO t VALUES (1, 'again', 1)")
        .wait_with_output()
        .expect("wait");
    assert!(String::from_utf8_lossy(&dup.stderr).contains("23505"));

    // Four processes append to one table at once: every row lands.
    sql(at, "CREATE TABLE c (id BIGINT, p INT)");
    let writers: Vec<_> = (0..4)
        .map(|p| {
            cirro(
                at,
                &format!("INSERT INTO c SELECT value, {p} FROM generate_series(1, 20000)"),
            )
        })
        .collect();
    for writer in writers {
        ok(writer.wait_with_output().expect("wait"));
    }
    assert_eq!(scalar(at, "SELECT count(*) FROM c"), "80000");
    assert_eq!(scalar(at, "SELECT count(DISTINCT p) FROM c"), "4");

    // Maintenance and time travel; VACUUM and DROP TABLE remove objects.
    sql(at, "OPTIMIZE c");
    assert_eq!(
        scalar(at, "SELECT count(*) FROM c VERSION AS OF 1"),
        "20000"
    );
    let before = (at.count)("data/cirro/public/c-");
    sql(at, "VACUUM c RETAIN 0 HOURS");
    let after = (at.count)("data/cirro/public/c-");
    assert!(after < before, "VACUUM removed nothing: {before} → {after}");
    assert_eq!(scalar(at, "SELECT count(*) FROM c"), "80000");
    sql(at, "DROP TABLE c");
    assert_eq!((at.count)("data/cirro/public/c-"), 0);
}
