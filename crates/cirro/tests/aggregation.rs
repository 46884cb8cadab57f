//! Adaptive aggregation (`cirro_exec::rules::AdaptiveAggregation`): grouped
//! aggregations expected to hold many groups skip the partial phase and
//! aggregate in more hash partitions than threads; the answers are the same
//! with the rule off, on and forced, wherever the aggregation sits in a plan.

use crate::common::{DataDir, answer_after as answer};

/// `EXPLAIN sql` after the settings `sets`, in one process.
fn explained(data: &DataDir, sets: &str, sql: &str) -> String {
    data.sql_ok(&format!("{sets}; EXPLAIN {sql}"))
}

/// The radix partition counts of the plan: `Hash([…], N)` with N above the
/// two threads of the test.
fn radix_partitions(plan: &str) -> Vec<usize> {
    plan.match_indices("], ")
        .filter_map(|(at, _)| {
            plan[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse::<usize>()
                .ok()
        })
        .filter(|n| *n > 2)
        .collect()
}

const QUERIES: &[&str] = &[
    "SELECT a, b, count(*), sum(v), avg(v), min(v), max(v) FROM r GROUP BY a, b",
    "SELECT n, count(*), sum(v) FROM r GROUP BY n",
    "SELECT a, count(*) FROM r GROUP BY a HAVING count(*) >= 40 ORDER BY count(*) DESC, a LIMIT 5",
    "SELECT a, count(DISTINCT b), sum(v) FILTER (WHERE b = 1) FROM r GROUP BY a",
    "SELECT a, b, count(*) FROM r GROUP BY ROLLUP (a, b)",
    // both inputs of a partitioned join are aggregations on the join key
    "SELECT count(*), sum(x.c * y.c) FROM (SELECT a, count(*) AS c FROM r GROUP BY a) x \
     JOIN (SELECT a, sum(v) AS c FROM r WHERE b < 4 GROUP BY a) y ON x.a = y.a",
    "SELECT k, count(*), sum(x) FROM c GROUP BY k",
    "SELECT k, x, count(*), avg(x), min(x) FILTER (WHERE x > 3) FROM c WHERE k % 3 <> 0 GROUP BY k, x",
    // few groups over a filter that keeps most rows (fused with it), and
    // one that keeps few
    "SELECT b, count(*), sum(v), avg(v), max(a), min(n) FROM r WHERE n IS NULL OR n > 100 GROUP BY b",
    "SELECT b, count(*), sum(v) FROM r WHERE a < 300 GROUP BY b",
];

#[test]
fn many_groups_take_radix_partitions_with_the_same_answers() {
    let data = DataDir::new();
    // a: 5,003 values in no order, b: 7, n: a with NULLs; about 35,000
    // groups of (a, b) over 200,000 rows.
    data.sql_ok(
        "CREATE TABLE r AS SELECT CAST(value * 7919 % 5003 AS INT) AS a, \
         CAST(value % 7 AS INT) AS b, \
         CASE WHEN value % 11 = 0 THEN NULL ELSE CAST(value * 31 % 4001 AS INT) END AS n, \
         value AS v FROM generate_series(1, 200000) AS g(value)",
    );
    // c: written in key order by two INSERTs (two files whose ranges meet
    // at 100,000, a key in both, as when a sorted write is split by size).
    data.sql_ok("CREATE TABLE c (k BIGINT, x BIGINT)");
    data.sql_ok(
        "INSERT INTO c SELECT value, value % 10 FROM generate_series(1, 100000) AS g(value)",
    );
    data.sql_ok(
        "INSERT INTO c SELECT value, value % 10 FROM generate_series(100000, 200000) AS g(value)",
    );
    // The thresholds lowered so that these tables count as many groups,
    // and joins of aggregations partitioned.
    let sets = "SET cirro_aggregation.min_groups = 1000; \
                SET cirro_aggregation.partition_groups = 1000; \
                SET datafusion.optimizer.hash_join_single_partition_threshold = 0; \
                SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0";
    for query in QUERIES {
        let reference = answer(
            &data,
            &format!("{sets}; SET adaptive_aggregation = off"),
            query,
        );
        assert!(reference.len() > 1, "{query}: no rows");
        for mode in ["on", "force"] {
            let rows = answer(
                &data,
                &format!("{sets}; SET adaptive_aggregation = {mode}"),
                query,
            );
            assert!(rows == reference, "{query}: {mode} ≠ off");
        }
    }

    // (a, b): about 35,000 groups (5,003 × 7 from the min/max of the
    // footers) → 64 partitions (a power of two) of at most 1,000 groups,
    // no partial phase.
    let q = "SELECT a, b, count(*) FROM r GROUP BY a, b";
    let on = explained(&data, sets, q);
    assert!(on.contains("mode=SinglePartitioned"), "{on}");
    assert!(!on.contains("mode=Partial"), "{on}");
    assert_eq!(radix_partitions(&on), vec![64], "{on}");
    let off = explained(&data, &format!("{sets}; SET adaptive_aggregation = off"), q);
    assert!(off.contains("mode=Partial"), "{off}");
    assert!(radix_partitions(&off).is_empty(), "{off}");

    // Few groups: DataFusion's two phases stay.
    let few = explained(&data, sets, "SELECT b, count(*) FROM r GROUP BY b");
    assert!(few.contains("mode=Partial"), "{few}");
    assert!(radix_partitions(&few).is_empty(), "{few}");

    // Under a partitioned join each aggregation (5,003 groups: 8 radix
    // partitions) is hashed back to the join's two partitions.
    let join = explained(&data, sets, QUERIES[5]);
    assert!(join.contains("mode=Partitioned"), "{join}");
    assert_eq!(join.matches("mode=SinglePartitioned").count(), 2, "{join}");
    assert_eq!(join.matches("Hash([a@0], 2)").count(), 2, "{join}");
    assert_eq!(radix_partitions(&join), vec![8, 8], "{join}");

    // Data written in key order: the partial phase aggregates runs of equal
    // keys, its rows shuffled into radix partitions (200,000 groups of the
    // footers' range: 256) for the final phase.
    let q = "SELECT k, count(*), sum(x) FROM c GROUP BY k";
    let runs = explained(&data, sets, q);
    assert!(runs.contains("RunAggregateExec: mode=Partial"), "{runs}");
    assert!(runs.contains("mode=FinalPartitioned"), "{runs}");
    // (the run aggregation's own line is the only partial one)
    assert_eq!(
        runs.matches("AggregateExec: mode=Partial").count(),
        1,
        "{runs}"
    );
    assert_eq!(radix_partitions(&runs), vec![256], "{runs}");
    // A partial phase whose final phase is not above it in the plan (here
    // beyond a merge of the threads' outputs; on a cluster beyond the
    // network, in another stage) aggregates the runs too.
    let lone_sets = format!("{sets}; SET datafusion.optimizer.repartition_aggregations = false");
    let lone = explained(&data, &lone_sets, q);
    assert!(lone.contains("RunAggregateExec: mode=Partial"), "{lone}");
    assert!(lone.contains("AggregateExec: mode=Final,"), "{lone}");
    assert_eq!(
        answer(&data, &lone_sets, q),
        answer(&data, &format!("{sets}; SET adaptive_aggregation = off"), q)
    );
    // Without runs: DataFusion's partial phase stays unless forced, or
    // unless each thread's share of the groups (200,000 over the threads)
    // outgrows `clustered_groups_max`.
    let sets = &format!("{sets}; SET cirro_aggregation.runs = false");
    let clustered = explained(&data, sets, q);
    assert!(
        clustered.contains("AggregateExec: mode=Partial"),
        "{clustered}"
    );
    assert!(!clustered.contains("RunAggregateExec"), "{clustered}");
    let large = explained(
        &data,
        &format!("{sets}; SET cirro_aggregation.clustered_groups_max = 1000"),
        q,
    );
    assert!(large.contains("mode=SinglePartitioned"), "{large}");
    assert!(!large.contains("mode=Partial"), "{large}");
    let forced = explained(
        &data,
        &format!("{sets}; SET adaptive_aggregation = force"),
        q,
    );
    assert!(forced.contains("mode=SinglePartitioned"), "{forced}");

    // Few groups over a filter: the partial phase fused with the filter
    // (and the projection between), unless switched off.
    let q = "SELECT b, count(*), sum(v * 2) FROM r WHERE n IS NULL OR n > 100 GROUP BY b";
    let fused = explained(&data, sets, q);
    assert!(
        fused.contains("FilteredAggregateExec: mode=Partial"),
        "{fused}"
    );
    assert!(!fused.contains("FilterExec"), "{fused}");
    // (the fused operator's own line is the only partial one)
    assert_eq!(
        fused.matches("AggregateExec: mode=Partial").count(),
        1,
        "{fused}"
    );
    for off in [
        "SET cirro_aggregation.fused_filter = false",
        "SET adaptive_aggregation = off",
    ] {
        let plain = explained(&data, &format!("{sets}; {off}"), q);
        assert!(plain.contains("FilterExec"), "{plain}");
        assert!(!plain.contains("FilteredAggregateExec"), "{plain}");
    }
    let fused = answer(&data, sets, q);
    let plain = answer(
        &data,
        &format!("{sets}; SET cirro_aggregation.fused_filter = false"),
        q,
    );
    assert_eq!(fused.len(), 8, "{fused:?}");
    assert_eq!(fused, plain);

    // The setting: its values, its default, a bad value.
    let show = "SHOW adaptive_aggregation";
    assert_eq!(
        answer(&data, "SET adaptive_aggregation = FORCE", show)[1],
        "force"
    );
    assert_eq!(
        answer(
            &data,
            "SET adaptive_aggregation = off; RESET adaptive_aggregation",
            show
        )[1],
        "on"
    );
    let err = data.sql_err("SET adaptive_aggregation = sometimes");
    assert!(err.contains("22023"), "{err}");
}

/// The value of `column` in the row of `cirro.statistics`' CSV whose first
/// field is `name` (the header names the columns).
fn stat(csv: &[String], name: &str, column: &str) -> String {
    let header: Vec<&str> = csv[0].split('|').collect();
    let at = header.iter().position(|h| *h == column).expect("column");
    let row = csv
        .iter()
        .find(|l| l.split('|').next() == Some(name))
        .unwrap_or_else(|| panic!("no statistics of {name}: {csv:?}"));
    row.split('|').nth(at).unwrap_or_default().to_string()
}

#[test]
fn analyze_keeps_distinct_counts_that_plans_use() {
    let data = DataDir::new();
    data.sql_ok(
        "CREATE TABLE t AS SELECT 'k' || CAST(value % 5000 AS VARCHAR) AS s, \
         CASE WHEN value % 4 = 0 THEN NULL ELSE value % 7 END AS b, \
         CAST(value * 0.5 AS DOUBLE PRECISION) AS f, value * 0.5 AS n \
         FROM generate_series(1, 100000) AS g(value)",
    );
    let sets = "SET cirro_aggregation.min_groups = 1000; \
                SET cirro_aggregation.partition_groups = 1000";
    let q = "SELECT s, count(*), sum(f) FROM t GROUP BY s";
    // A text key has no value range: without statistics the plan stays
    // DataFusion's.
    let before = explained(&data, sets, q);
    assert!(before.contains("mode=Partial"), "{before}");
    let reference = answer(&data, "SET adaptive_aggregation = off", q);

    data.sql_ok("ANALYZE t");
    let csv = answer(
        &data,
        "SET adaptive_aggregation = on",
        "SELECT \"column\", \"rows\", \"nulls\", \"distinct\", \"version\" FROM cirro.statistics \
         WHERE \"table\" = 't'",
    );
    assert_eq!(csv.len(), 5, "{csv:?}");
    assert_eq!(stat(&csv, "b", "rows"), "100000");
    assert_eq!(stat(&csv, "b", "nulls"), "25000");
    let b: u64 = stat(&csv, "b", "distinct").parse().expect("a count");
    assert!((6..=8).contains(&b), "estimate {b} of 7");
    assert_eq!(stat(&csv, "f", "nulls"), "0");
    assert_eq!(stat(&csv, "f", "distinct"), "", "floats are not estimated");
    // `value * 0.5` is NUMERIC, as in PostgreSQL: exact values are counted.
    let n: f64 = stat(&csv, "n", "distinct").parse().expect("a count");
    assert!((n - 100000.0).abs() < 5000.0, "estimate {n} of 100,000");
    let distinct: f64 = stat(&csv, "s", "distinct").parse().expect("a count");
    assert!(
        (distinct - 5000.0).abs() < 250.0,
        "estimate {distinct} of 5,000"
    );

    // The estimate reaches the plan: about 5,000 groups → 8 radix partitions.
    let after = explained(&data, sets, q);
    assert!(after.contains("mode=SinglePartitioned"), "{after}");
    assert_eq!(radix_partitions(&after), vec![8], "{after}");
    assert_eq!(answer(&data, sets, q), reference);

    // Bad input.
    let err = data.sql_err("ANALYZE missing");
    assert!(err.contains("42P01"), "{err}");
    let err = data.sql_err("ANALYZE t (s)");
    assert!(err.contains("0A000"), "{err}");
    let err = data.sql_err("BEGIN; ANALYZE t");
    assert!(err.contains("0A000"), "{err}");

    // ANALYZE alone: every table of the database.
    data.sql_ok("CREATE TABLE u AS SELECT 1 AS x");
    data.sql_ok("ANALYZE");
    let csv = answer(
        &data,
        "SET adaptive_aggregation = on",
        "SELECT \"table\", \"rows\" FROM cirro.statistics WHERE \"column\" = 'x'",
    );
    assert_eq!(csv[1..], ["u|1".to_string()], "{csv:?}");
}
