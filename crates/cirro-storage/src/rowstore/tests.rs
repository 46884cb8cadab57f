use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringViewArray};
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};

use super::flush::{MERGE_FANIN, files_to_merge};
use super::*;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8View, true),
    ]))
}

fn rows(pairs: &[(i64, Option<&str>)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(pairs.iter().map(|p| p.0))),
            Arc::new(StringViewArray::from_iter(pairs.iter().map(|p| p.1))),
        ],
    )
    .unwrap()
}

fn keys(ks: &[i64]) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(ks.to_vec()))]).unwrap()
}

fn upsert(pairs: &[(i64, Option<&str>)]) -> TableChange {
    TableChange {
        upserts: Some(rows(pairs)),
        deletes: None,
    }
}

fn delete(ks: &[i64]) -> TableChange {
    TableChange {
        upserts: None,
        deletes: Some(keys(ks)),
    }
}

/// The (k, v) pairs of a view's rows, sorted by k.
fn pairs(view: &StoreView) -> Vec<(i64, Option<String>)> {
    let Some(batch) = &view.rows else {
        return Vec::new();
    };
    let k = batch.column(0).as_primitive::<Int64Type>();
    let v = batch.column(1).as_string_view();
    let mut out: Vec<_> = (0..batch.num_rows())
        .map(|i| (k.value(i), (!v.is_null(i)).then(|| v.value(i).to_string())))
        .collect();
    out.sort();
    out
}

fn key(store: &RowStore, k: i64) -> Key {
    store
        .encode_keys(&[Arc::new(Int64Array::from(vec![k]))])
        .unwrap()
        .remove(0)
}

/// A keyed store: the newest version at or below a snapshot wins, a delete
/// hides the key's file rows without a row, and a reader of files that hold
/// everything up to a flushed LSN merges only what came after.
#[test]
fn versions_by_snapshot_and_flush() {
    let store = RowStore::new(schema(), Some(vec![0])).unwrap();
    store
        .apply(1, &upsert(&[(1, Some("a")), (2, Some("b"))]), 0)
        .unwrap();
    store.apply(2, &upsert(&[(1, Some("a2"))]), 0).unwrap();
    store.apply(3, &delete(&[2]), 0).unwrap();
    store.apply(4, &upsert(&[(3, None)]), 0).unwrap();

    let at = |s, after| store.view(s, after).unwrap();
    assert_eq!(pairs(&at(0, 0)), vec![]);
    assert!(at(0, 0).is_empty());
    assert_eq!(
        pairs(&at(1, 0)),
        vec![(1, Some("a".into())), (2, Some("b".into()))]
    );
    assert_eq!(
        pairs(&at(2, 0)),
        vec![(1, Some("a2".into())), (2, Some("b".into()))]
    );
    let v3 = at(3, 0);
    assert_eq!(pairs(&v3), vec![(1, Some("a2".into()))]);
    // Key 2 is deleted: hidden, with no row.
    assert_eq!(v3.hidden.len(), 2);
    assert!(v3.hidden.contains(&key(&store, 2)));
    assert_eq!(pairs(&at(4, 0)), vec![(1, Some("a2".into())), (3, None)]);
    // Files that hold everything up to 2: only the delete of 2 and the
    // insert of 3 remain to merge.
    let after2 = at(4, 2);
    assert_eq!(pairs(&after2), vec![(3, None)]);
    assert_eq!(after2.hidden.len(), 2);
    assert!(!after2.hidden.contains(&key(&store, 1)));

    // Point reads see the same.
    assert!(store.lookup(&key(&store, 1), 1, 0).unwrap().is_some());
    assert!(store.lookup(&key(&store, 2), 4, 0).unwrap().is_none());
    assert!(store.lookup(&key(&store, 1), 4, 2).is_none());
    assert!(store.lookup(&key(&store, 9), 4, 0).is_none());
    let (lsn, row) = store.latest(&key(&store, 1)).unwrap();
    assert_eq!(lsn, 2);
    assert_eq!(row.unwrap().num_rows(), 1);
    assert_eq!(store.latest(&key(&store, 2)).unwrap(), (3, None));

    // A flush that wrote everything up to 3 into table version 7.
    store.record_flush(7, 3);
    assert_eq!(store.flushed_at(6), 0);
    assert_eq!(store.flushed_at(7), 3);
    assert_eq!(store.flushed_at(9), 3);
    let before = store.bytes();
    store.forget_flushed();
    assert!(store.bytes() < before);
    assert_eq!(store.len(), 1);
    assert_eq!(pairs(&at(4, 3)), vec![(3, None)]);
}

/// Versions that no snapshot can see any more are dropped as new ones come.
#[test]
fn old_versions_are_pruned() {
    let store = RowStore::new(schema(), Some(vec![0])).unwrap();
    for lsn in 1..=100 {
        // A reader holds snapshot 10 throughout.
        store
            .apply(lsn, &upsert(&[(1, Some(&"x".repeat(lsn as usize)))]), 10)
            .unwrap();
    }
    // Snapshot 10 still reads its version; the ones before it are gone.
    let view = store.view(10, 0).unwrap();
    assert_eq!(pairs(&view), vec![(1, Some("x".repeat(10)))]);
    assert!(store.view(9, 0).unwrap().is_empty());
    let held = store.bytes();
    // With no reader left behind, only the newest stays.
    store.apply(101, &upsert(&[(1, Some("y"))]), 101).unwrap();
    assert!(store.bytes() < held / 10, "{} vs {held}", store.bytes());
    assert_eq!(
        pairs(&store.view(101, 0).unwrap()),
        vec![(1, Some("y".into()))]
    );
}

/// A table without a key takes appends: every row is its own entry, and
/// nothing of the files is hidden.
#[test]
fn appends_without_a_key() {
    let store = RowStore::new(schema(), None).unwrap();
    store
        .apply(1, &upsert(&[(1, Some("a")), (1, Some("a"))]), 0)
        .unwrap();
    store.apply(2, &upsert(&[(1, Some("b"))]), 0).unwrap();
    let view = store.view(2, 0).unwrap();
    assert!(view.hidden.is_empty());
    assert_eq!(pairs(&view).len(), 3);
    assert_eq!(pairs(&store.view(2, 1).unwrap()).len(), 1);
    assert!(store.keys_of_rows(&rows(&[(1, None)])).is_err());
}

/// A change made of one-row slices of a statement's batch (as a
/// transaction's pending rows are) is logged with its own strings only, not
/// every slice's whole buffer: an INSERT of 1,000 rows of VALUES logged 7 MB.
#[test]
fn a_record_of_slices_holds_each_string_once() {
    let text: Vec<String> = (0..1000)
        .map(|i| format!("the value of row number {i}"))
        .collect();
    let pairs: Vec<(i64, Option<&str>)> = (0..1000)
        .map(|i| (i as i64, Some(text[i].as_str())))
        .collect();
    let batch = rows(&pairs);
    let slices: Vec<RecordBatch> = (0..1000).map(|i| batch.slice(i, 1)).collect();
    let joined = arrow::compute::concat_batches(&schema(), &slices).unwrap();
    let record = |upserts: RecordBatch| {
        encode(&[(
            "t".to_string(),
            TableChange {
                upserts: Some(upserts),
                deletes: None,
            },
        )])
        .unwrap()
    };
    let whole = record(batch.clone()).len();
    let payload = record(joined);
    assert!(
        payload.len() < 2 * whole,
        "{} bytes against {whole}",
        payload.len()
    );
    assert_eq!(
        decode(&payload).unwrap()[0].1.upserts.as_ref().unwrap(),
        &batch
    );
}

/// A record's payload decodes to what was encoded; a damaged one is XX001.
#[test]
fn records_round_trip() {
    let changes = vec![
        ("t1".to_string(), upsert(&[(1, Some("a")), (2, None)])),
        ("db/t2".to_string(), delete(&[5, 6])),
        ("t3".to_string(), TableChange::default()),
    ];
    let payload = encode(&changes).unwrap();
    let back = decode(&payload).unwrap();
    assert_eq!(back.len(), 3);
    assert_eq!(back[0].0, "t1");
    assert_eq!(
        back[0].1.upserts.as_ref().unwrap(),
        &rows(&[(1, Some("a")), (2, None)])
    );
    assert!(back[0].1.deletes.is_none());
    assert_eq!(back[1].0, "db/t2");
    assert_eq!(back[1].1.deletes.as_ref().unwrap(), &keys(&[5, 6]));
    assert!(back[2].1.is_empty());
    for cut in [1, 5, payload.len() / 2, payload.len() - 1] {
        let err = decode(&payload[..cut]).unwrap_err();
        assert_eq!(err.state, SqlState::DATA_CORRUPTED, "cut at {cut}");
    }
}

/// The visible position advances only over records applied without a gap,
/// and a committer waits for it; snapshots hold the oldest position.
#[tokio::test]
async fn visible_position_has_no_gaps() {
    let snapshots = Snapshots::new(0);
    // Record 2 applied before 1: not visible, and its committer waits.
    let waiting = {
        let s = Arc::clone(&snapshots);
        tokio::spawn(async move { s.applied(2).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert_eq!(snapshots.visible(), 0);
    assert!(!waiting.is_finished());
    let old = snapshots.take();
    assert_eq!(old.lsn(), 0);
    snapshots.applied(1).await;
    waiting.await.unwrap();
    assert_eq!(snapshots.visible(), 2);
    assert_eq!(snapshots.oldest(), 0);
    assert!(snapshots.held_below(1));
    let new = snapshots.take();
    assert_eq!(new.lsn(), 2);
    drop(old);
    assert_eq!(snapshots.oldest(), 2);
    assert!(!snapshots.held_below(2));
    drop(new);
    // A log position given again after a failed write moves nothing.
    snapshots.applied(2).await;
    assert_eq!(snapshots.visible(), 2);
}

/// The (k, v) rows of `table`, by k.
async fn table_pairs(table: crate::table::CirroTable) -> Vec<(i64, Option<String>)> {
    let ctx = datafusion::prelude::SessionContext::new();
    ctx.register_table("t", Arc::new(table)).unwrap();
    let batches = ctx
        .sql("SELECT k, v FROM t ORDER BY k")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut got = Vec::new();
    for b in &batches {
        let k = b.column(0).as_primitive::<Int64Type>();
        let v = arrow::compute::cast(b.column(1), &DataType::Utf8).unwrap();
        let v = v.as_string::<i32>();
        for i in 0..b.num_rows() {
            got.push((k.value(i), (!v.is_null(i)).then(|| v.value(i).to_string())));
        }
    }
    got
}

/// An empty Delta table of (k BIGINT NOT NULL, v TEXT) in a new directory
/// (kept while the returned guard lives), its URL and schema.
async fn kv_table() -> (tempfile::TempDir, url::Url, SchemaRef) {
    let dir = tempfile::tempdir().unwrap();
    let url = url::Url::from_directory_path(dir.path()).unwrap();
    let stored = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Utf8, true),
    ]));
    crate::table::create_delta_table(&url, &stored, &Default::default())
        .await
        .unwrap();
    (dir, url, stored)
}

/// A flush deletes the file rows of the keys it writes, adds the store's
/// rows, and records its log position in the table's log.
#[tokio::test]
async fn flush_writes_rows_and_position() {
    use crate::table::CirroTable;
    use datafusion::prelude::SessionContext;

    let (_dir, url, stored) = kv_table().await;
    let first = RecordBatch::try_new(
        Arc::clone(&stored),
        vec![
            Arc::new(Int64Array::from_iter_values(1..=10)),
            Arc::new(arrow::array::StringArray::from_iter_values(
                (1..=10).map(|i| format!("old{i}")),
            )),
        ],
    )
    .unwrap();
    let table = CirroTable::open(&url).await.unwrap();
    crate::write::write_stream(
        table.delta(),
        Arc::clone(&stored),
        futures::stream::iter(vec![Ok(first)]),
        deltalake::protocol::SaveMode::Append,
    )
    .await
    .unwrap();
    let table = CirroTable::open(&url).await.unwrap();
    assert_eq!(flushed_position(&table).await.unwrap(), 0);

    let store = RowStore::new(Arc::clone(table.table_schema()), Some(vec![0])).unwrap();
    store.apply(1, &upsert(&[(2, Some("new2"))]), 0).unwrap();
    store.apply(2, &delete(&[3]), 0).unwrap();
    store.apply(3, &upsert(&[(11, None)]), 0).unwrap();
    // Written after the flush's position: stays in the store.
    store.apply(4, &upsert(&[(4, Some("later"))]), 0).unwrap();

    let ctx = SessionContext::new();
    let state = ctx.state();
    let view = store.view(3, 0).unwrap();
    let committed = flush_view(&table, &state, &store, &view, 3)
        .await
        .unwrap()
        .unwrap();
    store.record_flush(committed.version, 3);
    store.forget_flushed();
    assert_eq!(store.len(), 1);

    let table = CirroTable::open(&url).await.unwrap();
    assert_eq!(table.version(), committed.version);
    assert_eq!(flushed_position(&table).await.unwrap(), 3);
    let got = table_pairs(table).await;
    let mut want: Vec<(i64, Option<String>)> = (1..=10)
        .filter(|&i| i != 3)
        .map(|i| {
            (
                i,
                Some(if i == 2 {
                    "new2".into()
                } else {
                    format!("old{i}")
                }),
            )
        })
        .collect();
    want.push((11, None));
    assert_eq!(got, want);
    // Nothing to write: no commit.
    let empty = store.view(3, 3).unwrap();
    assert!(
        flush_view(
            &CirroTable::open(&url).await.unwrap(),
            &state,
            &store,
            &empty,
            3
        )
        .await
        .unwrap()
        .is_none()
    );
}

/// A second writer of a key waits for the first to release it; writers of
/// different keys do not wait; a wait that closes a cycle is 40P01.
#[tokio::test]
async fn row_locks_wait_and_detect_deadlocks() {
    let locks = Arc::new(RowLocks::default());
    let a = locks.lock("t", b"1", 1).await.unwrap().unwrap();
    // The holder again: nothing more to take.
    assert!(locks.lock("t", b"1", 1).await.unwrap().is_none());
    // Another key, another table: at once.
    let b = locks.lock("t", b"2", 2).await.unwrap().unwrap();
    let other_table = locks.lock("u", b"1", 2).await.unwrap().unwrap();
    assert_eq!(locks.held(), 3);
    // Owner 2 waits for key 1 (held by owner 1).
    let waiter = {
        let locks = Arc::clone(&locks);
        tokio::spawn(async move { locks.lock("t", b"1", 2).await.map(|l| l.is_some()) })
    };
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    assert!(!waiter.is_finished());
    // Owner 1 now wants key 2, held by owner 2, who waits for owner 1.
    let err = locks.lock("t", b"2", 1).await.unwrap_err();
    assert_eq!(err.state, SqlState::DEADLOCK_DETECTED);
    drop(a);
    assert!(waiter.await.unwrap().unwrap());
    drop(b);
    drop(other_table);
    // The waiter's lock was dropped with its task's result.
    assert_eq!(locks.held(), 0);
    // A cancelled wait leaves no edge behind: owner 3 waits, is dropped,
    // and owner 4 can then take the key after its holder ends.
    let held = locks.lock("t", b"9", 5).await.unwrap().unwrap();
    let cancelled = tokio::time::timeout(
        std::time::Duration::from_millis(20),
        locks.lock("t", b"9", 3),
    )
    .await;
    assert!(cancelled.is_err());
    drop(held);
    assert!(locks.lock("t", b"9", 4).await.unwrap().is_some());
}

/// Successive flushes merge the table's small files into their own once a
/// tier is full: the file count stays bounded, and every flush keeps the
/// rows right (updated keys once, deleted keys gone, merged files' live
/// rows kept).
#[tokio::test]
async fn flushes_merge_small_files() {
    use crate::table::CirroTable;
    use datafusion::prelude::SessionContext;
    use std::collections::BTreeMap;

    let (_dir, url, _) = kv_table().await;
    let table = CirroTable::open(&url).await.unwrap();
    let store = RowStore::new(Arc::clone(table.table_schema()), Some(vec![0])).unwrap();
    let ctx = SessionContext::new();
    let state = ctx.state();
    let mut model: BTreeMap<i64, Option<String>> = BTreeMap::new();
    let mut lsn = 0;
    let mut most_files = 0;
    let mut merged = false;
    for round in 0..12i64 {
        // Each round: two new keys, an update of an older key, and a
        // delete of another (from round 2 on).
        let new_value = format!("r{round}");
        let mut pairs_of_round = vec![
            (100 + 2 * round, Some(new_value.as_str())),
            (101 + 2 * round, None),
        ];
        if round >= 1 {
            pairs_of_round.push((100 + round - 1, Some("updated")));
        }
        lsn += 1;
        store.apply(lsn, &upsert(&pairs_of_round), 0).unwrap();
        for (k, v) in &pairs_of_round {
            model.insert(*k, v.map(str::to_string));
        }
        if round >= 2 {
            lsn += 1;
            store
                .apply(lsn, &delete(&[100 + 2 * (round - 2) + 1]), 0)
                .unwrap();
            model.remove(&(100 + 2 * (round - 2) + 1));
        }
        let table = CirroTable::open(&url).await.unwrap();
        let before = table.files().len();
        let view = store.view(lsn, store.flushed_at(table.version())).unwrap();
        let committed = flush_view(&table, &state, &store, &view, lsn)
            .await
            .unwrap()
            .unwrap();
        store.record_flush(committed.version, lsn);
        store.forget_flushed();
        let table = CirroTable::open(&url).await.unwrap();
        assert_eq!(flushed_position(&table).await.unwrap(), lsn);
        let files = table.files().len();
        merged |= files <= before;
        most_files = most_files.max(files);
        assert!(
            files < MERGE_FANIN,
            "round {round}: {files} files after the flush"
        );
        let want: Vec<(i64, Option<String>)> = model.clone().into_iter().collect();
        assert_eq!(table_pairs(table).await, want, "round {round}");
    }
    assert!(merged, "no flush merged files");
    assert_eq!(most_files, MERGE_FANIN - 1);
}

/// Files are merged by tiers of size: the lowest full tier, the flush's
/// new file counted in tier 0; large files never.
#[test]
fn merge_picks_the_lowest_full_tier() {
    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    let large = 64 * M;
    // Three small files and the flush's own: tier 0 is full.
    assert_eq!(
        files_to_merge(&[10 * K, 2 * M, 20 * K, 30 * K], large),
        vec![0, 2, 3]
    );
    // Two small files: not yet.
    assert!(files_to_merge(&[10 * K, 2 * M, 20 * K], large).is_empty());
    // Four files of 1-4 MiB are a full tier 1; tier 0 has room.
    assert_eq!(
        files_to_merge(&[M, 2 * M, 10 * K, 3 * M, 3 * M + 1], large),
        vec![0, 1, 3, 4]
    );
    // Files of half the target size or more stay.
    assert!(files_to_merge(&[large, large, large, large, 10 * K], large).is_empty());
}

/// A view for a snapshot that sees every version is made once and given
/// again (its positions with it) until a write or a flush's clean-up
/// changes the store; an older snapshot gets its own.
#[test]
fn a_view_of_everything_is_kept_until_the_store_changes() {
    let store = RowStore::new(schema(), Some(vec![0])).unwrap();
    store
        .apply(1, &upsert(&[(1, Some("a")), (2, Some("b"))]), 0)
        .unwrap();
    store.apply(2, &delete(&[2]), 0).unwrap();
    let first = store.view(5, 0).unwrap();
    let again = store.view(7, 0).unwrap();
    assert!(Arc::ptr_eq(&first.hidden, &again.hidden));
    let positions = Arc::new(Hidden::from([(
        Arc::<str>::from("file:///t/a.parquet"),
        roaring::RoaringTreemap::from_iter([3u64]),
    )]));
    first.keep_positions(9, Arc::clone(&positions));
    assert!(Arc::ptr_eq(&again.positions(9).unwrap(), &positions));
    assert!(again.positions(8).is_none());
    // Another flushed position, or a snapshot that misses a version: made
    // again.
    assert!(!Arc::ptr_eq(
        &store.view(7, 1).unwrap().hidden,
        &first.hidden
    ));
    let older = store.view(1, 0).unwrap();
    assert!(!Arc::ptr_eq(&older.hidden, &first.hidden));
    assert_eq!(
        pairs(&older),
        vec![(1, Some("a".into())), (2, Some("b".into()))]
    );
    // A write makes a new one, which sees it.
    store.apply(3, &upsert(&[(3, Some("c"))]), 0).unwrap();
    let after = store.view(7, 0).unwrap();
    assert!(!Arc::ptr_eq(&after.hidden, &first.hidden));
    assert!(after.positions(9).is_none());
    assert_eq!(
        pairs(&after),
        vec![(1, Some("a".into())), (3, Some("c".into()))]
    );
    // So does a flush's clean-up.
    store.record_flush(4, 3);
    store.forget_flushed();
    assert!(store.view(7, 3).unwrap().is_empty());
}

/// Positions are noted per table version: a version's notes answer only
/// for it, keys nobody noted are missing, and the oldest of more than two
/// versions is forgotten.
#[test]
fn positions_are_noted_per_table_version() {
    let store = RowStore::new(schema(), Some(vec![0])).unwrap();
    let at = |file: &str, row| RowAt {
        file: Arc::from(file),
        row,
    };
    store.note(5, key(&store, 1), Some(at("f1", 10)));
    store.note(5, key(&store, 2), None);
    store.note(5, key(&store, 3), Some(at("f1", 12)));
    store.note(6, key(&store, 1), Some(at("f2", 0)));
    let wanted = [
        key(&store, 1),
        key(&store, 2),
        key(&store, 3),
        key(&store, 4),
    ];
    let (hidden, missing) = store.noted(5, wanted.iter());
    assert_eq!(hidden.len(), 1);
    assert_eq!(
        hidden[&Arc::<str>::from("f1")].iter().collect::<Vec<_>>(),
        vec![10, 12]
    );
    assert_eq!(missing, vec![key(&store, 4)]);
    let (hidden, missing) = store.noted(6, wanted.iter());
    assert_eq!(
        hidden[&Arc::<str>::from("f2")].iter().collect::<Vec<_>>(),
        vec![0]
    );
    assert_eq!(missing.len(), 3);
    // A third version: version 5's notes go.
    store.note(7, key(&store, 1), None);
    let (hidden, missing) = store.noted(5, wanted.iter());
    assert!(hidden.is_empty());
    assert_eq!(missing.len(), 4);
    assert_eq!(store.noted(6, wanted.iter()).1.len(), 3);
}
