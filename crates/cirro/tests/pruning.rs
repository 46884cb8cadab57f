//! Scans skip files and row groups by their min/max statistics, and EXPLAIN
//! ANALYZE says how many were read and pruned. Clustering (`cluster_by`, on
//! write and by OPTIMIZE) is what makes the ranges narrow.

use crate::common;

use crate::common::DataDir;

/// `(total, matched)` of the metric `name` in an EXPLAIN ANALYZE output, e.g.
/// `row_groups_pruned_statistics=10 total → 1 matched`.
fn metric(plan: &str, name: &str) -> (u64, u64) {
    let start = plan
        .find(&format!("{name}="))
        .unwrap_or_else(|| panic!("no {name} in:\n{plan}"))
        + name.len()
        + 1;
    let text = &plan[start..];
    let numbers: Vec<u64> = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(2)
        .map(|n| n.parse().expect("number"))
        .collect();
    (numbers[0], numbers[1])
}

#[test]
fn clustered_table_prunes_row_groups_and_files() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE p (id BIGINT, k INT, pad VARCHAR) WITH (cluster_by = 'k', row_group_rows = 5000)");
    // several inserts: several files whose k ranges overlap until OPTIMIZE
    for start in [0, 25_000, 50_000, 75_000] {
        data.sql_ok(&format!(
            "INSERT INTO p SELECT value AS a, CAST((value * 7919) % 1000 AS INT) AS b, 'x' || value AS c \
             FROM generate_series({}, {}) AS g(value)",
            start + 1,
            start + 25_000
        ));
    }
    let explain = |sql: &str| data.sql_ok(&format!("EXPLAIN ANALYZE {sql}"));
    let query = "SELECT count(*) FROM p WHERE k = 7";
    assert_eq!(common::scalar(&data, query), "100");

    // each file is sorted by k: one row group per file matches
    let before = explain(query);
    let (groups, matched) = metric(&before, "row_groups_pruned_statistics");
    assert_eq!(groups, 20, "{before}");
    assert_eq!(matched, 4, "{before}");

    // OPTIMIZE clusters the whole table: one file, one matching row group
    data.sql_ok("OPTIMIZE p");
    let after = explain(query);
    let (groups, matched) = metric(&after, "row_groups_pruned_statistics");
    assert_eq!((groups, matched), (20, 1), "{after}");
    assert_eq!(common::scalar(&data, query), "100");
}

#[test]
fn files_outside_the_range_are_not_read() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE f (id BIGINT)");
    for start in [0, 1000, 2000, 3000] {
        data.sql_ok(&format!(
            "INSERT INTO f SELECT value FROM generate_series({}, {}) AS g(value)",
            start + 1,
            start + 1000
        ));
    }
    let plan = data.sql_ok("EXPLAIN ANALYZE SELECT count(*) FROM f WHERE id BETWEEN 1500 AND 1600");
    let (files, matched) = metric(&plan, "files_ranges_pruned_statistics");
    assert!(files >= 4 && matched == 1, "{plan}");
    assert_eq!(
        common::scalar(
            &data,
            "SELECT count(*) FROM f WHERE id BETWEEN 1500 AND 1600"
        ),
        "101"
    );
}

#[test]
fn an_index_skips_row_groups_by_its_sort_order_and_bloom_filters() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE ix (id BIGINT, k INT, pad VARCHAR) WITH (row_group_rows = 5000)");
    // k is a permutation of id: no order of id narrows it
    for start in [0, 50_000] {
        data.sql_ok(&format!(
            "INSERT INTO ix SELECT value, CAST((value * 7919) % 100000 AS INT), 'x' || value \
             FROM generate_series({}, {}) AS g(value)",
            start + 1,
            start + 50_000
        ));
    }
    let lookup = "SELECT count(*) FROM ix WHERE k IN (7919, 7920)";
    let explain = |sql: &str| data.sql_ok(&format!("EXPLAIN ANALYZE {sql}"));
    let before = explain(lookup);
    let (groups, matched) = metric(&before, "row_groups_pruned_statistics");
    assert!(groups == 20 && matched >= 10, "{before}");

    // the index sorts the table by k: the min/max ranges find the values
    data.sql_ok("CREATE INDEX ix_k ON ix (k)");
    let sorted = explain(lookup);
    let (groups, matched) = metric(&sorted, "row_groups_pruned_statistics");
    assert_eq!((groups, matched), (20, 1), "{sorted}");
    assert_eq!(common::scalar(&data, lookup), "2");

    // a second index (on pad, not the sort key): its bloom filters skip the
    // row groups whose min/max ranges cannot
    data.sql_ok("CREATE INDEX ix_pad ON ix (pad)");
    let by_pad = explain("SELECT id FROM ix WHERE pad = 'x77777'");
    let (groups, matched) = metric(&by_pad, "row_groups_pruned_bloom_filter");
    assert!(groups >= 10 && matched == 1, "{by_pad}");
    // a value no row has: every row group is skipped
    let absent = explain("SELECT id FROM ix WHERE pad IN ('x0', 'y5')");
    let (_, matched) = metric(&absent, "row_groups_pruned_bloom_filter");
    assert_eq!(matched, 0, "{absent}");

    // rows written later are sorted and filtered too
    data.sql_ok("INSERT INTO ix SELECT value, CAST(value AS INT), 'n' || value FROM generate_series(200001, 210000) AS g(value)");
    let later = explain("SELECT id FROM ix WHERE pad = 'n205000'");
    let (_, matched) = metric(&later, "row_groups_pruned_bloom_filter");
    assert_eq!(matched, 1, "{later}");
    assert_eq!(
        common::scalar(&data, "SELECT id FROM ix WHERE pad = 'n205000'"),
        "205000"
    );

    // without the index, nothing is filtered by bloom filters any more
    data.sql_ok("DROP INDEX ix_pad");
    data.sql_ok("INSERT INTO ix VALUES (300000, 1, 'z1')");
    assert_eq!(
        common::scalar(&data, "SELECT count(*) FROM ix WHERE pad = 'z1'"),
        "1"
    );
}

/// `CREATE TABLE … AS` writes the rows in the order of the partitions it
/// reads, not as their batches come: a table copied from one written in
/// key order keeps row groups of disjoint key ranges, so that a point
/// query reads one of them (merged as they came, 5 of 20).
#[test]
fn a_table_created_from_ordered_files_keeps_their_order() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE src (id BIGINT, pad VARCHAR) WITH (cluster_by = 'id')");
    for start in [0, 25_000, 50_000, 75_000] {
        data.sql_ok(&format!(
            "INSERT INTO src SELECT value, 'x' || value FROM generate_series({}, {}) AS g(value)",
            start + 1,
            start + 25_000
        ));
    }
    data.sql_ok("CREATE TABLE dst WITH (row_group_rows = 5000) AS SELECT * FROM src");
    data.sql_ok("CREATE TABLE ins (id BIGINT, pad VARCHAR) WITH (row_group_rows = 5000)");
    data.sql_ok("INSERT INTO ins SELECT * FROM src");
    for table in ["dst", "ins"] {
        for id in [12_345, 30_000, 62_500, 99_999] {
            let query = format!("SELECT count(*) FROM {table} WHERE id = {id}");
            assert_eq!(common::scalar(&data, &query), "1");
            let plan = data.sql_ok(&format!("EXPLAIN ANALYZE {query}"));
            let (groups, matched) = metric(&plan, "row_groups_pruned_statistics");
            assert_eq!((groups, matched), (20, 1), "{table} {id}: {plan}");
        }
    }
}
