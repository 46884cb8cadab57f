//! Subplans a query computes twice run once: TPC-H Q15's view (its
//! subquery reads a window, `cirro_exec::rules::subquery_windows`), an
//! aggregated CTE joined with itself (`cirro_exec::rules::shared`); the
//! answers stay those of the unshared plan, and volatile subplans are not
//! shared.

use crate::common::compare::{compare, is_ordered};
use crate::common::{DataDir, answer_after as answer, shared_dir};

/// The ids of the SharedExec lines of a plan.
fn shared_ids(plan: &str) -> Vec<String> {
    plan.lines()
        .filter_map(|l| l.split("SharedExec: id=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn tpch_q15_computes_its_view_once() {
    let data = DataDir::new();
    data.load(&["tpch", "--sf", "0.01"]);
    let query = std::fs::read_to_string(shared_dir().join("tpch/queries/q15.sql")).expect("q15");
    // The subquery over the view's maximum reads a window over the view
    // (`subquery_windows`), so the view is planned once and nothing is
    // left to share.
    let plan = data.sql_ok(&format!("EXPLAIN {query}"));
    assert!(plan.contains("WindowAggr"), "{plan}");
    assert!(shared_ids(&plan).is_empty(), "{plan}");
    // Run once: one scan, which counts lineitem's rows once.
    let analyzed = data.sql_ok(&format!("EXPLAIN ANALYZE {query}"));
    let scans: Vec<&str> = analyzed
        .lines()
        .filter(|l| l.contains("DataSourceExec") && l.contains("lineitem"))
        .collect();
    assert_eq!(scans.len(), 1, "{analyzed}");
    assert!(scans[0].contains("output_rows=60.17 K"), "{}", scans[0]);
    let expected =
        std::fs::read_to_string(shared_dir().join("tpch/answers/sf0.01/q15.csv")).expect("answer");
    let file = data.path().join("q15.sql");
    std::fs::write(&file, &query).expect("write");
    let actual = data.run_query_file(&file).expect("q15 runs");
    compare(&actual, &expected, is_ordered(&query)).expect("q15's answer");
}

#[test]
fn an_aggregated_cte_joined_with_itself() {
    let data = DataDir::new();
    data.sql_ok(
        "CREATE TABLE t AS SELECT value % 97 AS k, value AS v FROM generate_series(1, 5000)",
    );
    // Both sides of a hash join (the build side is collected before the
    // probe side is read), on aggregated columns. (The subquery reads fewer
    // columns: another plan.)
    let query = "WITH r AS (SELECT k, count(*) AS c, sum(v) AS s FROM t GROUP BY k) \
                 SELECT count(*), sum(a.s) FROM r a JOIN r b ON a.s = b.s + 0 AND a.c = b.c \
                 WHERE a.s > (SELECT avg(s) FROM r)";
    let plan = data.sql_ok(&format!("EXPLAIN {query}"));
    let ids = shared_ids(&plan);
    assert_eq!(ids.len(), 2, "{plan}");
    assert_eq!(ids[0], ids[1], "{plan}");
    let shared = answer(&data, "SET cache = on", query);
    // The same answer computed three times over: a view of the table whose
    // copies differ in their text.
    let unshared = answer(
        &data,
        "SET cache = on",
        "WITH r AS (SELECT k, count(*) AS c, sum(v) AS s FROM t GROUP BY k), \
         r2 AS (SELECT k, count(v) AS c, sum(v + 0) AS s FROM t GROUP BY k), \
         r3 AS (SELECT k, count(*) + 0 AS c, sum(v) * 1 AS s FROM t GROUP BY k) \
         SELECT count(*), sum(a.s) FROM r a JOIN r2 b ON a.s = b.s + 0 AND a.c = b.c \
         WHERE a.s > (SELECT avg(s) FROM r3)",
    );
    assert_eq!(shared, unshared);
    // Computed by hand: 97 groups of 51 or 52 values, whose sums differ;
    // those above the mean.
    let sums: Vec<i64> = (0..97)
        .map(|k| (1..=5000i64).filter(|v| v % 97 == k).sum())
        .collect();
    let mean = sums.iter().sum::<i64>() as f64 / 97.0;
    let above: Vec<i64> = sums.into_iter().filter(|s| *s as f64 > mean).collect();
    assert_eq!(
        shared[1],
        format!("{}|{}", above.len(), above.iter().sum::<i64>())
    );

    // Joined on the group key: the build side's keys reach the probe side's
    // copy as a dynamic filter; that copy reads the unfiltered one's answer.
    let query = "WITH r AS (SELECT k, count(*) AS c, sum(v) AS s FROM t GROUP BY k) \
                 SELECT count(*), sum(a.s + b.s) FROM r a JOIN r b ON a.k = b.k \
                 WHERE a.c > 51 AND b.c > 0";
    let plan = data.sql_ok(&format!("EXPLAIN {query}"));
    let ids = shared_ids(&plan);
    assert_eq!(ids.len(), 2, "{plan}");
    assert_eq!(ids[0], ids[1], "{plan}");
    // 5,000 = 97 · 51 + 53: keys 1 to 53 have 52 values.
    let sums: i64 = (1..=5000i64).filter(|v| (1..=53).contains(&(v % 97))).sum();
    assert_eq!(
        answer(&data, "SET cache = on", query)[1],
        format!("53|{}", 2 * sums)
    );
}

#[test]
fn volatile_subplans_are_not_shared() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE t AS SELECT value % 7 AS k FROM generate_series(1, 100)");
    let plan = data.sql_ok(
        "EXPLAIN WITH r AS (SELECT k, sum(random()) AS s FROM t GROUP BY k) \
         SELECT * FROM r a JOIN r b ON a.s = b.s",
    );
    assert!(shared_ids(&plan).is_empty(), "{plan}");
    // The same without random(): shared.
    let plan = data.sql_ok(
        "EXPLAIN WITH r AS (SELECT k, sum(k) AS s FROM t GROUP BY k) \
         SELECT * FROM r a JOIN r b ON a.s = b.s",
    );
    assert_eq!(shared_ids(&plan).len(), 2, "{plan}");
}
