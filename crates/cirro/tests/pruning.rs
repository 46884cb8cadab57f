//! Scans skip files and row groups by their min/max statistics, and EXPLAIN
//! ANALYZE says how many were read and pruned. Clustering (`cluster_by`, on
//! write and by OPTIMIZE) is what makes the ranges narrow.

mod common;

use common::DataDir;

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
