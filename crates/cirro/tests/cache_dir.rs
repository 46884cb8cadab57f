//! The local-disk tier (`--cache-dir`) over HDFS (a MiniDFSCluster): blocks
//! of the data files read from HDFS are kept on a local disk and read back
//! by a later process; answers stay those of uncached runs through UPDATE,
//! DELETE, OPTIMIZE and VACUUM; damaged (corrupt, truncated) blocks are
//! detected by their checksums and read again from HDFS; a full cache disk
//! (a small tmpfs) gives uncached reads and a warning, never a failed query.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::hdfs::Hdfs;

const QUERY: &str = "SELECT k, count(*), sum(id), min(s), max(s) FROM t GROUP BY k ORDER BY k";

/// The disk tier's totals in `cirro.cache` (one row).
const DISK: &str = "SELECT coalesce(sum(CASE WHEN entries > 0 THEN 1 ELSE 0 END), 0), \
     coalesce(sum(entries), 0), coalesce(sum(hits), 0), coalesce(sum(misses), 0), \
     coalesce(sum(repairs), 0), \
     coalesce(sum(CASE WHEN hits + misses > 0 THEN 1 ELSE 0 END), 0) \
     FROM cirro.cache WHERE tier = 'disk'";

#[derive(Debug)]
struct Disk {
    /// Files with blocks on the disk.
    files: u64,
    blocks: u64,
    hits: u64,
    misses: u64,
    repairs: u64,
    /// Files this process read through the tier.
    read: u64,
}

struct Run {
    /// The output of every statement but the last (the `DISK` query).
    answer: String,
    disk: Disk,
    stderr: String,
}

/// `cirro sql` on `url` with the statements given, which must succeed.
fn cirro(url: &str, args: &[&str], statements: &[&str]) -> (String, String) {
    let mut command = Command::new(common::cirro_bin());
    command
        .args(["--data", url])
        .args(args)
        .args(["sql", "--format", "csv"])
        .env_remove("CIRRO_DATA")
        .env_remove("CIRRO_CACHE_DIR")
        .env_remove("RUST_LOG");
    for statement in statements {
        command.args(["-c", statement]);
    }
    let out = command.output().expect("run cirro");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{statements:?} {args:?}: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// `statements` with the disk tier in `dir`, then the tier's totals.
fn cached(url: &str, dir: &Path, extra: &[&str], statements: &[&str]) -> Run {
    let dir = dir.to_str().expect("utf-8 path");
    let mut args = vec!["--cache-dir", dir];
    args.extend_from_slice(extra);
    let mut all = statements.to_vec();
    all.push(DISK);
    let (stdout, stderr) = cirro(url, &args, &all);
    let lines: Vec<&str> = stdout.lines().collect();
    let (answer, totals) = lines.split_at(lines.len() - 2);
    let n: Vec<u64> = totals[1]
        .split(',')
        .map(|v| v.parse().expect("a count"))
        .collect();
    Run {
        answer: answer.join("\n"),
        disk: Disk {
            files: n[0],
            blocks: n[1],
            hits: n[2],
            misses: n[3],
            repairs: n[4],
            read: n[5],
        },
        stderr,
    }
}

fn uncached(url: &str, statement: &str) -> String {
    cirro(url, &[], &[statement]).0.trim_end().to_string()
}

/// The block files under the tier's folder, and the folders (one per data file).
fn block_files(dir: &Path) -> (Vec<PathBuf>, usize) {
    let folders: Vec<PathBuf> = std::fs::read_dir(dir.join("blocks"))
        .expect("blocks folder")
        .map(|e| e.expect("entry").path())
        .collect();
    let mut files: Vec<PathBuf> = folders
        .iter()
        .flat_map(|f| std::fs::read_dir(f).expect("folder"))
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    (files, folders.len())
}

#[test]
fn the_disk_tier_keeps_hdfs_blocks_through_changes_damage_and_a_full_disk() {
    let hdfs = Hdfs::start(1);
    let url = format!("{}/warehouse", hdfs.url);
    let cache = tempfile::tempdir().expect("dir");
    let dir = cache.path().join("tier");

    // Three data files of about 2.5 MB (three blocks each).
    cirro(
        &url,
        &[],
        &["CREATE TABLE t (id BIGINT, k INT, s VARCHAR) WITH (compression = 'none')"],
    );
    for start in [0, 100_000, 200_000] {
        cirro(
            &url,
            &[],
            &[&format!(
                "INSERT INTO t SELECT value, CAST(value % 13 AS INT), 'value-' || value \
                 FROM generate_series({}, {}) AS g(value)",
                start + 1,
                start + 100_000
            )],
        );
    }
    let reference = uncached(&url, QUERY);
    assert!(reference.lines().count() == 14, "{reference}");

    // A first run reads HDFS and keeps the blocks; a second process reads
    // them all from the disk.
    let first = cached(&url, &dir, &[], &[QUERY]);
    assert_eq!(first.answer, reference);
    assert!(
        first.disk.files == 3 && first.disk.misses > 0,
        "{:?}",
        first.disk
    );
    let (files, folders) = block_files(&dir);
    assert_eq!(files.len() as u64, first.disk.blocks);
    assert!(files.len() >= 6, "{files:?}");
    assert_eq!(folders, 3);
    let second = cached(&url, &dir, &[], &[QUERY]);
    assert_eq!(second.answer, reference);
    assert_eq!(second.disk.misses, 0, "{:?}", second.disk);
    assert!(second.disk.hits >= files.len() as u64, "{:?}", second.disk);

    // Damage every block: a flipped byte or a cut. Each is caught by its
    // header's checks, read again from HDFS and written again.
    for (i, file) in files.iter().enumerate() {
        let mut bytes = std::fs::read(file).expect("read");
        if i % 2 == 0 {
            let last = bytes.len() - 1;
            bytes[last] ^= 0x01;
        } else {
            bytes.truncate(bytes.len() / 2);
        }
        std::fs::write(file, bytes).expect("write");
    }
    let repaired = cached(&url, &dir, &[], &[QUERY]);
    assert_eq!(repaired.answer, reference);
    assert_eq!(
        repaired.disk.repairs,
        files.len() as u64,
        "{:?}",
        repaired.disk
    );
    assert!(
        repaired.stderr.contains("is damaged"),
        "{}",
        repaired.stderr
    );
    let after = cached(&url, &dir, &[], &[QUERY]);
    assert_eq!(after.answer, reference);
    assert_eq!(
        (after.disk.repairs, after.disk.misses),
        (0, 0),
        "{:?}",
        after.disk
    );

    // Changes made by a process with the tier, each checked against an
    // uncached read; VACUUM drops the blocks of the files it deletes.
    for change in [
        "UPDATE t SET k = k + 100, s = s || '-u' WHERE id % 3 = 0",
        "DELETE FROM t WHERE id % 5 = 0",
        "INSERT INTO t VALUES (1000001, 7, 'late')",
        "OPTIMIZE t",
        "VACUUM t RETAIN 0 HOURS",
    ] {
        let run = cached(&url, &dir, &[], &[change, QUERY]);
        let fresh = uncached(&url, QUERY);
        let answer: Vec<&str> = run.answer.lines().collect();
        let fresh: Vec<&str> = fresh.lines().collect();
        assert!(
            answer.ends_with(&fresh),
            "{change}: cached\n{}\nuncached\n{}",
            run.answer,
            fresh.join("\n")
        );
        let again = cached(&url, &dir, &[], &[QUERY]);
        assert_eq!(again.answer, fresh.join("\n"), "{change}, read again");
        assert_eq!(again.disk.misses, 0, "{change}: {:?}", again.disk);
        if change.starts_with("VACUUM") {
            let (_, folders) = block_files(&dir);
            assert_eq!(
                folders as u64, again.disk.read,
                "only the live files keep blocks: {:?}",
                again.disk
            );
            assert_eq!(again.disk.files, again.disk.read, "{:?}", again.disk);
        }
    }
    let reference = uncached(&url, QUERY);

    // A cache disk too small for the blocks: the writes fail, a warning
    // says so, and the query reads HDFS and answers.
    let tmpfs = common::Tmpfs::mount(1536 * 1024);
    let small = tmpfs.path().join("tier");
    for _ in 0..2 {
        let run = cached(&url, &small, &["--cache-dir-size", "1GB"], &[QUERY]);
        assert_eq!(run.answer, reference);
        assert!(run.stderr.contains("cannot write"), "{}", run.stderr);
        assert!(run.disk.blocks <= 1, "{:?}", run.disk);
    }
    drop(hdfs);
}
