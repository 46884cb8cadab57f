//! The hot-data tier (`cirro_storage::cache`): scans read decoded column
//! chunks from memory once a query has read them, give the same answers as
//! uncached scans through every kind of change to the table, take their
//! priority from the plan, and show what they did (EXPLAIN ANALYZE's
//! `cache_hits`, `cirro.cache`).

use crate::common::{DataDir, Session};

/// The value of counter `name` summed over an EXPLAIN ANALYZE's scans.
fn counter(plan: &str, name: &str) -> u64 {
    plan.match_indices(&format!("{name}="))
        .map(|(at, _)| {
            plan[at + name.len() + 1..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse::<u64>()
                .unwrap_or(0)
        })
        .sum()
}

/// The output of `cirro sql -c SQL` with extra flags `args`, which must succeed.
fn output_ok(data: &DataDir, sql: &str, args: &[&str]) -> String {
    let out = data.sql_output(sql, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `query`, then EXPLAIN ANALYZE of it, in one new process (extra flags
/// `args`): the second run's plan with its counters.
fn analyzed_after_one_run(data: &DataDir, query: &str, args: &[&str]) -> String {
    output_ok(data, &format!("{query}; EXPLAIN ANALYZE {query}"), args)
}

fn explained(data: &DataDir, query: &str, args: &[&str]) -> String {
    output_ok(data, &format!("EXPLAIN {query}"), args)
}

const QUERIES: &[&str] = &[
    "SELECT count(*), sum(id), sum(d), min(s), max(s) FROM t",
    "SELECT k, count(*), sum(d) FROM t WHERE id % 3 = 1 GROUP BY k ORDER BY k",
    "SELECT id, s, d FROM t WHERE s LIKE 'v1%' AND k BETWEEN 5 AND 9 ORDER BY id LIMIT 50",
    "SELECT count(*) FROM t WHERE id BETWEEN 4000 AND 4100",
    "SELECT * FROM t ORDER BY id DESC LIMIT 7",
];

/// Every query's rows with the cache cold, hot and off must agree.
fn same_answers(session: &mut Session, step: &str) {
    for query in QUERIES {
        session.ok("SET cache = on");
        let first = session.rows(query);
        let second = session.rows(query);
        session.ok("SET cache = off");
        let uncached = session.rows(query);
        session.ok("SET cache = on");
        assert_eq!(first, uncached, "{step}: {query}: cached (cold) ≠ uncached");
        assert_eq!(second, uncached, "{step}: {query}: cached (hot) ≠ uncached");
    }
}

#[test]
fn cached_scans_answer_as_uncached_ones_through_changes() {
    let data = DataDir::new();
    let mut s = Session::open(&data);
    s.ok("CREATE TABLE t (id BIGINT, k INT, s VARCHAR, d DOUBLE) WITH (row_group_rows = 2000)");
    for start in [0, 5000, 10000] {
        s.ok(&format!(
            "INSERT INTO t SELECT value, CAST(value % 20 AS INT), 'v' || value, value * 0.5 \
             FROM generate_series({}, {}) AS g(value)",
            start + 1,
            start + 5000
        ));
    }
    same_answers(&mut s, "fresh");

    // A hot scan reads every chunk from memory; the cache shows them.
    let query = "SELECT sum(d), max(s) FROM t WHERE k = 3";
    let plan = analyzed_after_one_run(&data, query, &[]);
    assert!(counter(&plan, "cache_hits") > 0, "{plan}");
    assert_eq!(counter(&plan, "cache_misses"), 0, "{plan}");
    let plan = analyzed_after_one_run(&data, query, &["--cache-memory", "0"]);
    assert_eq!(counter(&plan, "cache_hits"), 0, "{plan}");
    assert!(
        !plan.contains("cache="),
        "a zero budget turns the tier off:\n{plan}"
    );
    let cached =
        s.rows("SELECT count(*), min(hits), min(priority) FROM cirro.cache WHERE entries > 0");
    let fields: Vec<&str> = cached[0].split(',').collect();
    assert_eq!(fields[0], "3", "three data files cached: {cached:?}");
    assert!(fields[1].parse::<u64>().expect("hits") > 0, "{cached:?}");
    assert_eq!(fields[2], "normal", "{cached:?}");

    // UPDATE and DELETE mark rows in deletion vectors (the data files stay
    // and so do their chunks) and write new files.
    s.ok("UPDATE t SET d = d + 1000, s = s || 'u' WHERE k IN (1, 2)");
    same_answers(&mut s, "after UPDATE");
    s.ok("DELETE FROM t WHERE id % 7 = 0");
    same_answers(&mut s, "after DELETE");
    let plan = analyzed_after_one_run(&data, query, &[]);
    assert!(counter(&plan, "cache_hits") > 0, "{plan}");

    // A new column: older files read it as NULL, from the cache too.
    s.ok("ALTER TABLE t ADD COLUMN extra INT");
    s.ok("INSERT INTO t VALUES (20001, 1, 'new', 1.5, 42)");
    same_answers(&mut s, "after ADD COLUMN");
    assert_eq!(
        s.rows("SELECT count(*), count(extra), sum(extra) FROM t"),
        s.rows("SELECT count(*), 1, 42 FROM t")
    );

    // OPTIMIZE replaces every file: their chunks leave at the commit.
    s.ok("OPTIMIZE t");
    assert_eq!(
        s.rows("SELECT coalesce(sum(entries), 0) FROM cirro.cache"),
        vec!["0"],
        "chunks of replaced files stay cached"
    );
    same_answers(&mut s, "after OPTIMIZE");
    s.ok("VACUUM t RETAIN 0 HOURS");
    same_answers(&mut s, "after VACUUM");
    s.ok("TRUNCATE t");
    same_answers(&mut s, "after TRUNCATE");
    assert_eq!(s.rows("SELECT count(*) FROM t"), vec!["0"]);
}

#[test]
fn the_plan_sets_priorities_and_a_large_scan_keeps_hot_data() {
    let data = DataDir::new();
    // 1 MB of cache: the fact table's decoded columns do not fit.
    let mut s = Session::open_with(&data, &["--cache-memory", "1MB"]);
    s.ok("CREATE TABLE dim (k INT, name VARCHAR)");
    s.ok("INSERT INTO dim SELECT CAST(value AS INT), 'name' || value FROM generate_series(0, 99) AS g(value)");
    s.ok("CREATE TABLE fact (id BIGINT, k INT, amount DOUBLE, note VARCHAR) WITH (row_group_rows = 20000)");
    s.ok("INSERT INTO fact SELECT value, CAST(value % 100 AS INT), value * 1.5, 'note number ' || value FROM generate_series(1, 200000) AS g(value)");

    let join = "SELECT d.name, sum(f.amount) FROM fact f JOIN dim d ON f.k = d.k WHERE d.k < 3 GROUP BY d.name ORDER BY 1";
    let plan = explained(&data, join, &["--cache-memory", "1MB"]);
    assert!(plan.contains("cache=hot"), "the build side is hot:\n{plan}");
    assert!(
        plan.contains("cache=scan"),
        "the large fact scan is a scan:\n{plan}"
    );
    // A large scan stays a scan on a build side: hot data that large
    // would freeze the cache (nothing else may evict it).
    let self_join = "SELECT count(*) FROM fact a JOIN fact b ON a.id = b.id";
    let plan = explained(&data, self_join, &["--cache-memory", "1MB"]);
    assert!(
        !plan.contains("cache=hot") && plan.matches("cache=scan").count() == 2,
        "both sides of the self-join are scans:\n{plan}"
    );
    let answer = s.rows(join);
    // The dimension table is cached (hot) by the join.
    let dim_entries = "SELECT coalesce(sum(entries), 0) FROM cirro.cache WHERE priority = 'hot'";
    let before: u64 = s.rows(dim_entries)[0].parse().expect("a number");
    assert!(before > 0);
    // Scans of the fact table's every column, larger than the cache, do not evict it.
    for _ in 0..2 {
        s.rows("SELECT count(DISTINCT note), sum(amount), max(id) FROM fact");
    }
    assert_eq!(
        s.rows(dim_entries)[0].parse::<u64>().expect("a number"),
        before
    );
    let bytes: u64 = s.rows("SELECT sum(bytes) FROM cirro.cache")[0]
        .parse()
        .expect("bytes");
    assert!(
        bytes <= 1 << 20,
        "the cache holds {bytes} bytes, over its 1 MB"
    );
    assert_eq!(s.rows(join), answer);

    // SET cache: on/off only; off leaves the scans as DataFusion's.
    s.ok("SET cache = off");
    assert_eq!(s.rows("SHOW cache"), vec!["off"]);
    s.ok("RESET cache");
    assert_eq!(s.rows("SHOW cache"), vec!["on"]);
    assert!(data.sql_err("SET cache = maybe").contains("22023"));
    let plan = output_ok(&data, &format!("SET cache = off; EXPLAIN {join}"), &[]);
    assert!(!plan.contains("cache="), "{plan}");
}

/// A cached scan drops the rows a join's dynamic filter (the build side's
/// keys) or a TopK's bound rules out, before they reach an aggregation
/// under the join or the TopK; answers equal DataFusion's reader's (cache off),
/// also where the filter must not apply (the preserved side of an outer
/// join) and after the table changes.
#[test]
fn cached_scans_drop_rows_by_dynamic_filters() {
    let data = DataDir::new();
    let mut s = Session::open(&data);
    s.ok("CREATE TABLE item (k INT, kind VARCHAR)");
    s.ok("INSERT INTO item SELECT CAST(value AS INT), CASE WHEN value % 97 = 0 THEN 'rare' ELSE 'common' END FROM generate_series(0, 1999) AS g(value)");
    s.ok(
        "CREATE TABLE sale (id BIGINT, k INT, qty INT, price DOUBLE) WITH (row_group_rows = 10000)",
    );
    s.ok("INSERT INTO sale SELECT value, CAST(value * 7 % 2000 AS INT), CAST(value % 50 AS INT), value * 0.25 FROM generate_series(1, 150000) AS g(value)");

    // Q17's shape: an aggregation over the fact table under a semi join
    // with a selective build side.
    let correlated = "SELECT sum(s.price) FROM sale s JOIN item i ON s.k = i.k \
        WHERE i.kind = 'rare' AND s.qty < (SELECT 0.5 * avg(qty) FROM sale WHERE k = i.k)";
    let join = "SELECT i.k, count(*), sum(s.qty) FROM sale s JOIN item i ON s.k = i.k \
        WHERE i.kind = 'rare' GROUP BY i.k ORDER BY i.k";
    let outer = "SELECT count(*), count(i.k), sum(s.qty) FROM sale s LEFT JOIN item i \
        ON s.k = i.k AND i.kind = 'rare'";
    let top = "SELECT id, price FROM sale ORDER BY price DESC, id LIMIT 5";
    let bottom = "SELECT id, price FROM sale ORDER BY price, id LIMIT 5";
    let semi = "SELECT count(*) FROM sale WHERE k IN (SELECT k FROM item WHERE kind = 'rare')";
    // Q7's shape: wide rows (two decimals) through a filter, then a join.
    s.ok(
        "CREATE TABLE line (k INT, qty INT, price DECIMAL(15, 2), discount DECIMAL(15, 2)) \
          WITH (row_group_rows = 10000)",
    );
    s.ok(
        "INSERT INTO line SELECT k, qty, CAST(price AS DECIMAL(15, 2)), \
          CAST(qty / 100.0 AS DECIMAL(15, 2)) FROM sale",
    );
    let screened = "SELECT i.k, count(*), sum(l.price * (1 - l.discount)) FROM line l JOIN item i \
        ON l.k = i.k WHERE i.kind = 'rare' AND l.qty < 40 GROUP BY i.k ORDER BY i.k";
    let check = |s: &mut Session, step: &str| {
        for query in [correlated, join, outer, top, bottom, semi, screened] {
            s.ok("SET cache = off");
            let uncached = s.rows(query);
            s.ok("SET cache = on");
            assert_eq!(s.rows(query), uncached, "{step}: {query}: cold");
            assert_eq!(s.rows(query), uncached, "{step}: {query}: hot");
        }
    };
    check(&mut s, "loaded");
    // 21 rare keys of 2000: nearly every sale row is dropped in the scan
    // under the aggregation; after the first batch, every row is above the
    // TopK's bound (prices grow with ids).
    for query in [correlated, bottom] {
        let plan = analyzed_after_one_run(&data, query, &[]);
        let dropped = counter(&plan, "dynamic_filter_rows_dropped");
        assert!(
            dropped > 0,
            "{query}: no rows dropped by the dynamic filter:\n{plan}"
        );
    }
    // A filter of the join right above the scan alone is left to that join.
    let plan = analyzed_after_one_run(&data, join, &[]);
    assert!(plan.contains("DynamicFilter ["), "{plan}");
    assert_eq!(counter(&plan, "dynamic_filter_rows_dropped"), 0, "{plan}");
    // With a filter between that copies the rows it keeps, the join's
    // filter (21 keys: it drops 99 % of the rows, cheaply) saves that copy.
    let plan = analyzed_after_one_run(&data, screened, &[]);
    assert!(plan.contains("FilterExec: qty@"), "{plan}");
    assert!(
        counter(&plan, "dynamic_filter_rows_dropped") > 0,
        "a join's filter below a FilterExec dropped nothing:\n{plan}"
    );
    // The same join partitioned: a hash repartition of every scanned row
    // lies between, which the scan saves by evaluating the join's filter
    // (over at least the rows it measures the filter on).
    let partitioned = format!(
        "SET datafusion.optimizer.hash_join_single_partition_threshold = 0; \
         SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0; \
         {join}; EXPLAIN ANALYZE {join}"
    );
    let plan = output_ok(&data, &partitioned, &["--threads", "2"]);
    assert!(plan.contains("mode=Partitioned"), "{plan}");
    assert!(plan.contains("partitioning=Hash([k@"), "{plan}");
    assert!(
        counter(&plan, "dynamic_filter_rows_dropped") > 0,
        "a partitioned join's filter across the repartition dropped nothing:\n{plan}"
    );
    let plan = analyzed_after_one_run(&data, outer, &[]);
    assert_eq!(
        counter(&plan, "dynamic_filter_rows_dropped"),
        0,
        "the preserved side of an outer join keeps its rows:\n{plan}"
    );

    s.ok("DELETE FROM sale WHERE id % 3 = 0");
    s.ok("UPDATE item SET kind = 'rare' WHERE k % 101 = 0");
    check(&mut s, "after DELETE and UPDATE");
}
