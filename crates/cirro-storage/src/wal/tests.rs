use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::*;

fn open(dir: &Path, from: Lsn) -> Result<Opened> {
    Wal::open(dir, from, WalOptions::default())
}

fn small_segments(dir: &Path, from: Lsn) -> Opened {
    // Each record of a few bytes fills a segment.
    let options = WalOptions {
        segment_bytes: 40,
        ..WalOptions::default()
    };
    Wal::open(dir, from, options).expect("open")
}

fn payloads(records: &[Record]) -> Vec<(Lsn, String)> {
    records
        .iter()
        .map(|r| (r.lsn, String::from_utf8(r.payload.clone()).expect("utf-8")))
        .collect()
}

fn append_all(wal: &Wal, texts: &[&str]) -> Vec<Lsn> {
    texts
        .iter()
        .map(|t| {
            wal.append_blocking(t.as_bytes().to_vec(), true)
                .expect("append")
        })
        .collect()
}

/// The one segment file of `dir`.
fn only_segment(dir: &Path) -> PathBuf {
    let segments = list_segments(dir).expect("list");
    assert_eq!(segments.len(), 1, "one segment");
    segments[0].path.clone()
}

#[test]
fn records_come_back_after_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    assert!(opened.records.is_empty());
    let lsns = append_all(&opened.wal, &["one", "two", "three"]);
    assert_eq!(lsns, vec![1, 2, 3]);
    let stats = opened.wal.stats();
    assert_eq!((stats.records, stats.next_lsn, stats.synced_lsn), (3, 4, 3));
    drop(opened);

    let again = open(dir.path(), 2).expect("reopen");
    assert_eq!(
        payloads(&again.records),
        vec![(2, "two".into()), (3, "three".into())]
    );
    assert_eq!(append_all(&again.wal, &["four"]), vec![4]);
}

#[test]
fn a_torn_tail_is_cut_off_and_new_records_follow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    append_all(&opened.wal, &["one", "two"]);
    drop(opened);
    // A crash in the middle of writing a third record: its header says 100
    // bytes, 5 made it.
    let path = only_segment(dir.path());
    let end = std::fs::metadata(&path).expect("stat").len();
    let mut torn = Vec::new();
    encode(&mut torn, 3, &[7u8; 100]);
    torn.truncate(RECORD_HEADER_BYTES + 5);
    let file = OpenOptions::new().write(true).open(&path).expect("open");
    file.write_all_at(&torn, end).expect("write");

    let again = open(dir.path(), 1).expect("reopen");
    assert_eq!(
        payloads(&again.records),
        vec![(1, "one".into()), (2, "two".into())]
    );
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), end);
    assert_eq!(append_all(&again.wal, &["three"]), vec![3]);
    drop(again);
    let third = open(dir.path(), 3).expect("reopen");
    assert_eq!(payloads(&third.records), vec![(3, "three".into())]);
}

#[test]
fn a_damaged_record_ends_the_log_there() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    append_all(&opened.wal, &["one", "two", "three"]);
    drop(opened);
    // One bit of the second record's payload flipped.
    let path = only_segment(dir.path());
    let second = HEADER_BYTES + (RECORD_HEADER_BYTES + 3) as u64 + RECORD_HEADER_BYTES as u64;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, second).expect("read");
    assert_eq!(byte[0], b't', "the offset is the second payload's");
    file.write_all_at(&[byte[0] ^ 1], second).expect("write");

    let again = open(dir.path(), 1).expect("reopen");
    assert_eq!(payloads(&again.records), vec![(1, "one".into())]);
    assert_eq!(append_all(&again.wal, &["two again"]), vec![2]);
}

#[test]
fn damage_before_the_last_segment_is_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = small_segments(dir.path(), 1);
    append_all(&opened.wal, &["one", "two", "three"]);
    drop(opened);
    let segments = list_segments(dir.path()).expect("list");
    assert_eq!(segments.len(), 3, "a segment per record");
    let file = OpenOptions::new()
        .write(true)
        .open(&segments[0].path)
        .expect("open");
    file.write_all_at(b"X", HEADER_BYTES + RECORD_HEADER_BYTES as u64)
        .expect("write");

    let error = open(dir.path(), 1).expect_err("damaged");
    assert_eq!(error.code(), "XX001", "{error}");
}

#[test]
fn segments_before_a_flushed_lsn_are_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = small_segments(dir.path(), 1);
    append_all(&opened.wal, &["one", "two", "three", "four", "five"]);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    // Records 1 to 3 are in the tables: their segments go, the fourth's stays.
    let removed = runtime
        .block_on(opened.wal.remove_before(4))
        .expect("remove");
    assert_eq!(removed, 3);
    drop(opened);
    let again = small_segments(dir.path(), 1);
    assert_eq!(
        payloads(&again.records),
        vec![(4, "four".into()), (5, "five".into())]
    );
    assert_eq!(append_all(&again.wal, &["six"]), vec![6]);
}

#[test]
fn group_commit_syncs_once_for_many_waiting_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    let wal = &opened.wal;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let count = 800u64;
    let lsns = runtime.block_on(async {
        let appends = (0..count).map(|i| wal.append(i.to_string().into_bytes(), true));
        futures::future::join_all(appends).await
    });
    let mut lsns: Vec<Lsn> = lsns.into_iter().map(|l| l.expect("append")).collect();
    lsns.sort();
    assert_eq!(lsns, (1..=count).collect::<Vec<_>>());
    let stats = wal.stats();
    assert_eq!(stats.records, count);
    assert_eq!(stats.synced_lsn, count);
    assert!(
        stats.syncs < count / 4 && stats.writes < count / 4,
        "records waiting together share writes and syncs: {stats:?}"
    );
    drop(opened);
    let again = open(dir.path(), 1).expect("reopen");
    assert_eq!(again.records.len(), count as usize);
}

#[test]
fn records_appended_without_sync_are_synced_within_the_delay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    let lsn = opened
        .wal
        .append_blocking(b"later".to_vec(), false)
        .expect("append");
    let deadline = std::time::Instant::now() + SYNC_DELAY * 10;
    while opened.wal.stats().synced_lsn < lsn && std::time::Instant::now() < deadline {
        std::thread::sleep(SYNC_DELAY / 4);
    }
    let stats = opened.wal.stats();
    assert_eq!(stats.synced_lsn, lsn, "{stats:?}");
    assert_eq!(stats.syncs, 1);
}

#[test]
fn a_log_is_open_in_one_place_at_a_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    let error = open(dir.path(), 1).expect_err("taken");
    assert_eq!(error.code(), "55P03", "{error}");
    drop(opened);
    open(dir.path(), 1).expect("free again");
}

#[test]
fn a_record_too_large_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    let error = opened
        .wal
        .append_blocking(vec![0; MAX_RECORD_BYTES + 1], true)
        .expect_err("too large");
    assert_eq!(error.code(), "54000", "{error}");
    assert_eq!(append_all(&opened.wal, &["small"]), vec![1]);
}

/// A real full disk: a tmpfs of 256 kB mounted for the test (the tests run
/// as root).
#[test]
fn a_full_disk_fails_the_write_and_keeps_the_log_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(dir.path())
        .status()
        .expect("mount");
    assert!(mounted.success(), "mounting a tmpfs needs root");
    let result = std::panic::catch_unwind(|| {
        let opened = open(dir.path(), 1).expect("open");
        let mut acknowledged = 0u64;
        let mut error = None;
        for _ in 0..100 {
            match opened.wal.append_blocking(vec![b'x'; 20_000], true) {
                Ok(lsn) => acknowledged = lsn,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        let error = error.expect("256 kB fill up");
        assert_eq!(error.code(), "53100", "{error}");
        assert!(acknowledged >= 5, "{acknowledged} records fit");
        drop(opened);
        let again = open(dir.path(), 1).expect("reopen");
        assert_eq!(again.records.len() as u64, acknowledged);
        assert!(again.records.iter().all(|r| r.payload.len() == 20_000));
    });
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(dir.path())
        .status();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A log made in an empty directory starts at `start` (past the positions
/// the row stores' flushes recorded); one that has segments goes on from
/// its own last record whatever `start` says.
#[test]
fn a_new_log_starts_at_the_given_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = WalOptions {
        start: 42,
        ..WalOptions::default()
    };
    let opened = Wal::open(dir.path(), 1, options).expect("open");
    assert_eq!(append_all(&opened.wal, &["a", "b"]), vec![42, 43]);
    drop(opened);
    let options = WalOptions {
        start: 7,
        ..WalOptions::default()
    };
    let again = Wal::open(dir.path(), 1, options).expect("reopen");
    assert_eq!(
        payloads(&again.records),
        vec![(42, "a".into()), (43, "b".into())]
    );
    assert_eq!(append_all(&again.wal, &["c"]), vec![44]);
}

/// A log whose directory is deleted while it is open refuses the next
/// synced append (and every later one) rather than acknowledging records
/// that only an unnamed file holds.
#[test]
fn a_log_whose_directory_was_deleted_refuses_appends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = open(dir.path(), 1).expect("open");
    append_all(&opened.wal, &["kept"]);
    std::fs::remove_dir_all(dir.path()).expect("remove the log's directory");
    let error = opened
        .wal
        .append_blocking(b"lost".to_vec(), true)
        .expect_err("an append after the directory went");
    assert!(error.to_string().contains("deleted"), "{error}");
    assert!(opened.wal.append_blocking(b"later".to_vec(), true).is_err());
}
