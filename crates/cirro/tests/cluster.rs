//! Cluster mode (`cirro serve --cluster zk://…`), on clusters started by
//! `scripts/cluster` (ZooKeeper, nodes in network namespaces): the catalog
//! through any node, writes through every node at once, membership through
//! kills, cuts, restarts and SIGTERM, ZooKeeper going away, mixed versions
//! refused, and data locations shared with the single-node Cirro.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::cirro_bin;
use crate::common::cluster::Cluster;

/// Poll `check` every 200 ms until it holds or `limit` passes; the time it
/// took, or a panic naming `what`.
fn within(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{what}: not within {limit:?}");
}

fn node_ids(cluster: &Cluster, through: usize) -> Vec<String> {
    let out = cluster.psql(
        through,
        &["-At", "-c", "SELECT id FROM cirro.nodes ORDER BY id"],
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_table_created_through_one_node_is_seen_by_all_and_writes_through_all_land() {
    let cluster = Cluster::up(3, "local");
    for node in 1..=3 {
        assert_eq!(node_ids(&cluster, node), ids(&["node1", "node2", "node3"]));
    }
    let nodes = cluster.sql(2, "SELECT id, pg_address, state, cores > 0, memory_bytes > 0 FROM cirro.nodes WHERE id = 'node2'");
    assert_eq!(nodes, format!("node2|{}|running|t|t", cluster.pg[1]));

    // Created through node 1, used through the others at once.
    cluster.sql(1, "CREATE TABLE t (node int, i int)");
    assert_eq!(cluster.sql(2, "SELECT count(*) FROM t"), "0");
    cluster.sql(3, "INSERT INTO t VALUES (3, 0)");
    assert_eq!(cluster.sql(1, "SELECT count(*) FROM t"), "1");
    cluster.sql(2, "DROP TABLE t");
    let err = cluster.sql_err(3, "SELECT * FROM t");
    assert!(err.contains("42P01"), "{err}");

    // INSERTs through all three nodes at once: every one lands.
    cluster.sql(1, "CREATE TABLE hits (node int, i int)");
    std::thread::scope(|s| {
        for node in 1..=3 {
            let cluster = &cluster;
            s.spawn(move || {
                for i in 0..8 {
                    cluster.sql(
                        node,
                        &format!(
                            "INSERT INTO hits SELECT {node}, {i} FROM generate_series(1, 100)"
                        ),
                    );
                }
            });
        }
    });
    assert_eq!(
        cluster.sql(
            2,
            "SELECT node, count(*) FROM hits GROUP BY node ORDER BY node"
        ),
        "1|800\n2|800\n3|800"
    );

    // A primary key holds across nodes: its check and commit run under the
    // table's cluster-wide lock, so one of each racing pair wins.
    cluster.sql(1, "CREATE TABLE ids (id int PRIMARY KEY, node int)");
    let refused = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for node in 1..=3 {
            let (cluster, refused) = (&cluster, &refused);
            s.spawn(move || {
                for id in 0..6 {
                    let out = cluster.psql(
                        node,
                        &[
                            "-At",
                            "-c",
                            &format!("INSERT INTO ids VALUES ({id}, {node})"),
                        ],
                    );
                    if !out.status.success() {
                        let err = String::from_utf8_lossy(&out.stderr);
                        assert!(err.contains("23505"), "node{node}: {err}");
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    assert_eq!(
        cluster.sql(3, "SELECT count(*), count(DISTINCT id) FROM ids"),
        "6|6"
    );
    assert_eq!(refused.into_inner(), 12);
}

#[test]
fn membership_follows_kills_cuts_restarts_and_sigterm() {
    let cluster = Cluster::up(3, "local");
    cluster.sql(
        1,
        "CREATE TABLE t AS SELECT * FROM generate_series(1, 10) AS g(x)",
    );

    // A killed node leaves the list within the session timeout (6 s); the
    // others answer meanwhile.
    cluster.script(&["kill", "3"]);
    assert_eq!(cluster.sql(1, "SELECT sum(x) FROM t"), "55");
    let took = within(Duration::from_secs(10), "node3 leaves after kill", || {
        node_ids(&cluster, 1) == ids(&["node1", "node2"])
    });
    eprintln!("killed node left the list after {took:?}");
    cluster.script(&["start", "3"]);
    assert_eq!(node_ids(&cluster, 2), ids(&["node1", "node2", "node3"]));
    assert_eq!(cluster.sql(3, "SELECT sum(x) FROM t"), "55");

    // Cut off: it leaves; healed: it rejoins by itself.
    cluster.script(&["cut", "2"]);
    within(Duration::from_secs(10), "node2 leaves after cut", || {
        node_ids(&cluster, 1) == ids(&["node1", "node3"])
    });
    cluster.script(&["heal", "2"]);
    let took = within(Duration::from_secs(15), "node2 rejoins after heal", || {
        node_ids(&cluster, 1) == ids(&["node1", "node2", "node3"])
    });
    eprintln!("healed node rejoined after {took:?}");
    assert_eq!(cluster.sql(2, "SELECT sum(x) FROM t"), "55");

    // SIGTERM: the node drains and leaves at once (not after a timeout).
    let pid = cluster.pid(3);
    assert_eq!(unsafe_kill(pid, libc::SIGTERM), 0);
    let took = within(Duration::from_secs(5), "node3 leaves on SIGTERM", || {
        node_ids(&cluster, 1) == ids(&["node1", "node2"])
    });
    assert!(took < Duration::from_secs(4), "{took:?}");
    let log = std::fs::read_to_string(cluster.dir.path().join("node3/log")).expect("log");
    within(Duration::from_secs(5), "node3 says it left", || {
        std::fs::read_to_string(cluster.dir.path().join("node3/log"))
            .is_ok_and(|l| l.contains("left the cluster"))
    });
    assert!(log.contains("draining"), "{log}");
}

#[allow(unsafe_code)]
fn unsafe_kill(pid: i32, signal: i32) -> i32 {
    // SAFETY: kill(2) with a pid the test started.
    unsafe { libc::kill(pid, signal) }
}

#[test]
fn without_zookeeper_reads_go_on_and_ddl_is_refused() {
    let cluster = Cluster::up(2, "local");
    cluster.sql(1, "CREATE TABLE t (x int)");
    cluster.sql(1, "INSERT INTO t VALUES (1), (2)");
    cluster.script(&["zk-stop"]);
    std::thread::sleep(Duration::from_millis(500));
    // Node 2 never read t's catalog version before ZooKeeper went: the
    // catalog comes from the storage, and the client is warned.
    let out = cluster.psql(2, &["-At", "-c", "SELECT sum(x) FROM t"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "3");
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(
        warning.contains("WARNING") && warning.contains("ZooKeeper"),
        "{warning}"
    );
    // Plain INSERTs need no lock: they commit to the table's Delta log.
    cluster.sql(2, "INSERT INTO t VALUES (3)");
    assert_eq!(cluster.sql(1, "SELECT sum(x) FROM t"), "6");
    for sql in [
        "CREATE TABLE u (x int)",
        "DROP TABLE t",
        "CREATE USER bob PASSWORD 'pw12345678'",
    ] {
        let err = cluster.sql_err(1, sql);
        assert!(
            err.contains("25006") && err.contains("ZooKeeper"),
            "{sql}: {err}"
        );
    }
    cluster.script(&["zk-start"]);
    within(Duration::from_secs(15), "DDL works again", || {
        cluster
            .psql(2, &["-c", "CREATE TABLE u (x int)"])
            .status
            .success()
    });
    assert_eq!(cluster.sql(1, "SELECT count(*) FROM u"), "0");
    assert_eq!(node_ids(&cluster, 1), ids(&["node1", "node2"]));
}

/// `cirro serve` joining `cluster` from outside its scripts (on this
/// machine's loopback), which must refuse to start; its stderr.
fn refused_join(cluster: &Cluster, data: &str, node_id: &str, envs: &[(&str, &str)]) -> String {
    let out = Command::new(cirro_bin())
        .args([
            "--data",
            data,
            "serve",
            "--pg-port",
            "0",
            "--flight-port",
            "0",
            "--http-port",
            "0",
        ])
        .args(["--cluster", &cluster.zk_url(), "--node-id", node_id])
        .env("CIRRO_PASSWORD", "unused-pw")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run cirro serve");
    assert!(!out.status.success(), "{node_id} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_node_of_another_version_is_refused() {
    let cluster = Cluster::up(1, "local");
    let data = cluster.state()["DATA"].clone();
    let err = refused_join(
        &cluster,
        &data,
        "stranger",
        &[("CIRRO_TEST_CLUSTER_VERSION", "0.0.1")],
    );
    assert!(
        err.contains("node \"node1\"") && err.contains("different versions"),
        "{err}"
    );
    assert_eq!(node_ids(&cluster, 1), ids(&["node1"]));
    // A node serving another data location is refused: the cluster's
    // catalog version belongs to one.
    let other = cluster.dir.path().join("other-data");
    let err = refused_join(&cluster, other.to_str().expect("utf8"), "elsewhere", &[]);
    assert!(err.contains("serves the data location"), "{err}");
    // A second node with a name already taken is refused too.
    let err = refused_join(&cluster, &data, "node1", &[]);
    assert!(err.contains("already in the cluster"), "{err}");
    assert_eq!(node_ids(&cluster, 1), ids(&["node1"]));
}

#[test]
fn a_single_node_data_location_opens_in_a_cluster_and_back() {
    let dir = tempfile::Builder::new()
        .prefix("cirro-cluster-")
        .tempdir()
        .expect("tempdir");
    let data = dir.path().join("data");
    common::sql_ok_at(
        &data,
        "CREATE TABLE before (x int); INSERT INTO before VALUES (1), (2)",
    );
    let cluster = Cluster::up_in(dir, 2, "local");
    assert_eq!(cluster.sql(2, "SELECT sum(x) FROM before"), "3");
    // Another process writes into the running cluster's data location (no
    // member publishes its catalog version): its table is read through
    // every node without DDL there, and so are its rows in an old table.
    common::sql_ok_at(
        &data,
        "CREATE TABLE beside AS SELECT 7 AS z; INSERT INTO before VALUES (4)",
    );
    assert_eq!(cluster.sql(2, "SELECT z FROM beside"), "7");
    assert_eq!(
        cluster.sql(1, "SELECT z + sum(x) FROM beside, before GROUP BY z"),
        "14"
    );
    // With one live node a query runs as on a node alone, and EXPLAIN
    // shows the plan that runs: with the node's own rules (compiled
    // expressions), not DataFusion's plan before them.
    cluster.script(&["kill", "2"]);
    within(Duration::from_secs(10), "node2 leaves after kill", || {
        node_ids(&cluster, 1) == ids(&["node1"])
    });
    let plan = cluster.sql(1, "EXPLAIN SELECT sum(x * 2) FROM before WHERE x > 1");
    assert!(plan.contains("jit("), "{plan}");
    cluster.sql(1, "CREATE TABLE after AS SELECT x * 10 AS y FROM before");
    cluster.script(&["down"]);
    let out = common::sql_ok_at(&data, "SELECT sum(y) FROM after");
    assert!(out.contains("70"), "{out}");
}

/// Workers take tasks only from members: a client without the cluster
/// secret (a stranger on the network) is refused before its request reaches
/// the worker.
#[test]
fn a_stranger_is_refused_by_the_worker_service() {
    use datafusion_distributed::GetWorkerInfoRequest;
    use datafusion_distributed::grpc::create_worker_client;
    let cluster = Cluster::up(2, "local");
    let workers = cluster.sql(1, "SELECT worker_address FROM cirro.nodes ORDER BY id");
    let workers: Vec<&str> = workers.lines().collect();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    for worker in workers {
        let answer = runtime.block_on(async {
            let channel = tonic::transport::Channel::from_shared(format!("http://{worker}"))
                .expect("url")
                .connect()
                .await
                .expect("the worker port answers");
            let mut client = create_worker_client(tower::util::BoxCloneSyncService::new(channel));
            client.get_worker_info(GetWorkerInfoRequest {}).await
        });
        let err = match answer {
            Ok(info) => panic!("a stranger was served: version {}", info.version),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("cluster secret"), "{worker}: {err}");
    }
}

/// Makes every table of a few megabytes run as several tasks (the default,
/// 16 MB per task and core, keeps TPC-H SF0.1 on one node).
const SMALL_TASKS: &str = "SET distributed.file_scan_config_bytes_per_partition = 1000000";

/// Load TPC-H at `sf` through node 1: generated by `cirro load` into a
/// scratch location, copied in with CREATE TABLE … AS over its Parquet files.
fn load_tpch_through_node1(cluster: &Cluster, sf: &str, tables: &[&str]) -> common::DataDir {
    let generated = common::DataDir::new();
    generated.load(&["tpch", "--sf", sf]);
    let public = generated.path().join("data/cirro/public");
    for table in tables {
        let dir = std::fs::read_dir(&public)
            .expect("generated tables")
            .filter_map(|e| e.ok())
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{table}-"))
            })
            .expect("generated table")
            .path();
        cluster.sql(
            1,
            &format!(
                "CREATE TABLE {table} AS SELECT * FROM read_parquet('{}/')",
                dir.display()
            ),
        );
    }
    generated
}

const TPCH_TABLES: [&str; 8] = [
    "region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem",
];

#[test]
fn tpch_runs_across_three_hdfs_nodes_through_each_node() {
    let cluster = Cluster::up(3, "hdfs");
    let _generated = load_tpch_through_node1(&cluster, "0.1", &TPCH_TABLES);
    let shared = common::shared_dir();
    let mut failures = Vec::new();
    for node in 1..=3 {
        for q in 1..=22 {
            let query = shared.join(format!("tpch/queries/q{q:02}.sql"));
            let answer = shared.join(format!("tpch/answers/sf0.1/q{q:02}.csv"));
            let out = Command::new("psql")
                .arg(cluster.conninfo(node))
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-A", "-F", "|"])
                .args(["-P", "footer=off", "-c", SMALL_TASKS, "-f"])
                .arg(&query)
                .env("PGPASSWORD", &cluster.password)
                .output()
                .expect("psql");
            let text = std::fs::read_to_string(&query).expect("query");
            let expected = std::fs::read_to_string(&answer).expect("answer");
            if !out.status.success() {
                failures.push(format!(
                    "node{node} q{q:02}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            } else if let Err(diff) = common::compare::compare(
                &String::from_utf8_lossy(&out.stdout),
                &expected,
                common::compare::is_ordered(&text),
            ) {
                failures.push(format!("node{node} q{q:02}: {diff}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every task ran on its own copy of its plan (see the dynamic filters
    // in cirro-cluster): a copy that could not be made (the HDFS scans'
    // object store missing) left the coordinator's tasks filling the
    // filters sent to the other nodes, and Q10 failed now and then.
    for node in 1..=3 {
        let log = std::fs::read_to_string(cluster.dir.path().join(format!("node{node}/log")))
            .expect("log");
        assert!(
            !log.contains("could not be copied"),
            "node{node}: {}",
            log.lines()
                .find(|l| l.contains("could not be copied"))
                .unwrap_or("")
        );
    }

    // The work is spread: EXPLAIN shows the stages, EXPLAIN ANALYZE the
    // nodes that ran each stage's tasks, all three of them.
    let q1 = std::fs::read_to_string(shared.join("tpch/queries/q01.sql")).expect("q1");
    let explain = cluster.sql(2, &format!("{SMALL_TASKS}; EXPLAIN {q1}"));
    assert!(
        explain.contains("Stage 1") && explain.contains("tasks=3"),
        "{explain}"
    );
    assert!(
        explain.contains("go round node1, node2, node3")
            && explain.contains("runs on node2 (this node)"),
        "{explain}"
    );
    // Q17's aggregation per part reads only the lines of the parts the
    // query asks about (reduce_groups, on by default on a cluster): its
    // input is semi-joined with the filtered part table's keys in the stage
    // that scans lineitem (the answers above are the reference's).
    let q17 = std::fs::read_to_string(shared.join("tpch/queries/q17.sql")).expect("q17");
    let explain = cluster.sql(1, &format!("EXPLAIN {q17}"));
    assert!(explain.contains("__cirro_group_key"), "{explain}");
    // Q18's IN goes below its joins onto orders (push_semi_joins), so
    // lineitem meets only the orders asked about.
    let q18 = std::fs::read_to_string(shared.join("tpch/queries/q18.sql")).expect("q18");
    let explain = cluster.sql(1, &format!("EXPLAIN {q18}"));
    let line = |needle: &str| explain.lines().position(|l| l.contains(needle));
    assert!(
        line("LeftSemi Join: orders.o_orderkey") > line("Inner Join: customer.c_custkey"),
        "{explain}"
    );
    // Q18's IN subquery runs first: the query that runs has no semi join,
    // and its order keys reach lineitem's scan as constants.
    let analyzed = cluster.sql(1, &format!("EXPLAIN ANALYZE {q18}"));
    assert!(!analyzed.contains("Semi"), "{analyzed}");
    assert!(analyzed.contains("l_orderkey@0 IN ("), "{analyzed}");
    // Q9's lines of green parts meet orders shuffled by the key where a
    // copy of them on each of the 3 nodes (a broadcast) would pass the
    // bound on collected rows. (At SF 0.01 they are estimated at about
    // 1.5 K rows: a bound of 2,000 takes one copy, not three; DataFusion's
    // own bound for collecting, 128 K rows, is set down to leave the choice
    // to the rule.)
    let q9 = std::fs::read_to_string(shared.join("tpch/queries/q09.sql")).expect("q09");
    let explain = cluster.sql(
        1,
        &format!(
            "SET datafusion.optimizer.hash_join_single_partition_threshold = 1; \
             SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 1; \
             SET cirro_join_order.collect_rows_max = 2000; EXPLAIN {q9}"
        ),
    );
    let orders_join = explain
        .lines()
        .find(|l| l.contains("HashJoinExec") && l.contains("o_orderkey@"))
        .unwrap_or_default();
    assert!(orders_join.contains("join=shuffle"), "{explain}");
    // Q4's EXISTS emits its build side's rows (the orders), so it cannot
    // broadcast them: its lineitem probe side is first narrowed to their
    // keys, broadcast, and only the lines of those orders are shuffled
    // (prefilter_probes, on by default on a cluster; the answers above are
    // the reference's with it). Off, every line is shuffled to meet them.
    let prefilters = |q: &str, settings: &str| {
        let query =
            std::fs::read_to_string(shared.join(format!("tpch/queries/{q}.sql"))).expect("query");
        let explain = cluster.sql(1, &format!("{SMALL_TASKS}; {settings} EXPLAIN {query}"));
        let count = explain
            .lines()
            .filter(|l| l.contains("join_type=RightSemi") && l.contains("join=broadcast"))
            .count();
        (count, explain)
    };
    let (on, explain) = prefilters("q04", "");
    assert_eq!(on, 1, "{explain}");
    let (off, explain) = prefilters("q04", "SET cirro_join_order.prefilter_probes = off;");
    assert_eq!(off, 0, "{explain}");
    // Q13's customers hold every customer key of its orders: a filter by
    // them would drop nothing, so its outer join is left as it is.
    let q13 = std::fs::read_to_string(shared.join("tpch/queries/q13.sql")).expect("q13");
    let explain = cluster.sql(1, &format!("{SMALL_TASKS}; EXPLAIN {q13}"));
    assert!(!explain.contains("join_type=RightSemi"), "{explain}");
    // Q15's subquery over its view's maximum reads a window over the view
    // (subquery_windows): lineitem is scanned once, not once per copy of
    // the view in stages that share nothing.
    let q15 = std::fs::read_to_string(shared.join("tpch/queries/q15.sql")).expect("q15");
    let explain = cluster.sql(1, &format!("EXPLAIN {q15}"));
    assert!(explain.contains("WindowAggr"), "{explain}");
    assert_eq!(
        explain.matches("TableScan: lineitem").count(),
        1,
        "{explain}"
    );
    let analyzed = cluster.sql(2, &format!("{SMALL_TASKS}; EXPLAIN ANALYZE {q1}"));
    let placement = analyzed
        .lines()
        .skip_while(|l| !l.starts_with("nodes|"))
        .collect::<Vec<_>>()
        .join("\n");
    for node in ["node1", "node2", "node3"] {
        assert!(placement.contains(node), "{node} ran nothing:\n{analyzed}");
    }
    assert!(analyzed.contains("output_rows"), "{analyzed}");
    // The scan stage's tasks read through the hot-data tier of the node
    // that ran them: the tier's metrics come back with the task's.
    assert!(analyzed.contains("cache_misses="), "{analyzed}");

    // Rows a DELETE removed (a deletion vector) stay removed on every node.
    cluster.sql(1, "CREATE TABLE li AS SELECT * FROM lineitem");
    cluster.sql(3, "DELETE FROM li WHERE l_orderkey % 7 = 0");
    let expected = cluster.sql(
        1,
        "SELECT count(*), sum(l_quantity) FROM lineitem WHERE l_orderkey % 7 <> 0",
    );
    for node in 1..=3 {
        let sql = format!("{SMALL_TASKS}; SELECT count(*), sum(l_quantity) FROM li");
        assert_eq!(
            cluster.sql(node, &sql),
            format!("SET\n{expected}"),
            "node{node}"
        );
    }
    let explain = cluster.sql(
        1,
        &format!("{SMALL_TASKS}; EXPLAIN SELECT count(*) FROM li"),
    );
    assert!(explain.contains("DeletionVectorsExec"), "{explain}");
}

/// Every node runs the tasks it gets with Cirro's engine (the local rules):
/// through its own hot-data tier and with expressions compiled by its own
/// JIT, with the settings of the session that sent them. On local storage,
/// where tasks go round the nodes (HDFS places them by their blocks).
#[test]
fn every_node_runs_its_tasks_with_cirros_engine() {
    let cluster = Cluster::up(3, "local");
    // lineitem in six files, so that each of a scan's three tasks (one a
    // node) has rows to read.
    let generated = load_tpch_through_node1(&cluster, "0.1", &["lineitem"]);
    cluster.sql(
        1,
        "CREATE TABLE parts AS SELECT * FROM lineitem WHERE l_orderkey % 6 = 0",
    );
    for part in 1..6 {
        cluster.sql(
            1,
            &format!("INSERT INTO parts SELECT * FROM lineitem WHERE l_orderkey % 6 = {part}"),
        );
    }
    cluster.sql(1, "DROP TABLE lineitem");
    cluster.sql(1, "ALTER TABLE parts RENAME TO lineitem");
    drop(generated);
    let shared = common::shared_dir();
    let q1 = std::fs::read_to_string(shared.join("tpch/queries/q01.sql")).expect("q1");
    let answer = std::fs::read_to_string(shared.join("tpch/answers/sf0.1/q01.csv")).expect("q1");
    for _ in 0..2 {
        let out = cluster.psql(
            1,
            &[
                "-q",
                "-A",
                "-F",
                "|",
                "-P",
                "footer=off",
                "-c",
                SMALL_TASKS,
                "-c",
                &q1,
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        common::compare::compare(&String::from_utf8_lossy(&out.stdout), &answer, true)
            .expect("q1's answer");
    }
    // Through any node, cirro.cache shows every node's tier.
    for node in 1..=3 {
        let nodes = cluster.sql(
            node,
            "SELECT node FROM cirro.cache WHERE entries > 0 GROUP BY node ORDER BY node",
        );
        assert_eq!(nodes, "node1\nnode2\nnode3", "through node{node}");
    }
    for node in 1..=3 {
        // Each file range goes to the same node every time (cache
        // affinity), so the second run hits on every node.
        let tier = cluster.sql(
            1 + node % 3,
            &format!(
                "SELECT sum(entries) > 0, sum(hits) > 0 FROM cirro.cache WHERE node = 'node{node}'"
            ),
        );
        assert_eq!(tier, "t|t", "node{node}'s hot-data tier was not hit");
        let jit = cluster.sql(node, "SELECT compiled > 0 FROM cirro.jit");
        assert_eq!(jit, "t", "node{node} compiled nothing");
    }
    // The session's settings go with its tasks: with `SET jit = off` no
    // node compiles a new expression, with `jit = force` every node that
    // runs one of its tasks does.
    let compiled = |node: usize| -> u64 {
        cluster
            .sql(node, "SELECT compiled FROM cirro.jit")
            .parse()
            .expect("a count")
    };
    let query = "SELECT sum(l_quantity * 3 + l_linenumber * 7) FROM lineitem";
    let before: Vec<u64> = (1..=3).map(compiled).collect();
    let off = cluster.sql(1, &format!("{SMALL_TASKS}; SET jit = off; {query}"));
    let after_off: Vec<u64> = (1..=3).map(compiled).collect();
    assert_eq!(before, after_off, "compiled with jit = off");
    let forced = cluster.sql(1, &format!("{SMALL_TASKS}; SET jit = force; {query}"));
    assert_eq!(forced, off, "the same answer compiled and interpreted");
    let after_force: Vec<u64> = (1..=3).map(compiled).collect();
    for node in 1..=3 {
        assert!(
            after_force[node - 1] > after_off[node - 1],
            "node{node} did not compile: {after_off:?} -> {after_force:?}"
        );
    }
    aggregations_choose_what_crosses_the_network(&cluster);
    a_copy_keeps_the_order_of_the_files_it_reads(&cluster);
    a_querys_memory_limit_holds_on_every_node(&cluster);
}

/// A table copied through a cluster (CREATE TABLE … AS, INSERT … SELECT)
/// from files written in key order keeps that order, as on a node alone:
/// its row groups hold disjoint ranges of the key. Its rows are read on the
/// node that writes them, not cut into tasks on every node and merged as
/// they came back.
fn a_copy_keeps_the_order_of_the_files_it_reads(cluster: &Cluster) {
    cluster.sql(
        1,
        &format!(
            "{SMALL_TASKS}; CREATE TABLE copied WITH (row_group_rows = 5000) AS \
             SELECT * FROM ordered"
        ),
    );
    cluster.sql(
        2,
        "CREATE TABLE inserted WITH (row_group_rows = 5000) AS SELECT * FROM ordered WHERE false",
    );
    cluster.sql(
        2,
        &format!("{SMALL_TASKS}; INSERT INTO inserted SELECT * FROM ordered"),
    );
    let location = cluster.dir.path().join("data");
    for table in ["copied", "inserted"] {
        let ranges = row_group_ranges(&common::table_dir_in(&location, table), "l_orderkey");
        assert!(ranges.len() >= 20, "{table}: {} row groups", ranges.len());
        let mut sorted = ranges.clone();
        sorted.sort();
        let overlapping = sorted.windows(2).filter(|w| w[0].1 > w[1].0).count();
        assert_eq!(overlapping, 0, "{table}'s row groups overlap: {ranges:?}");
    }
    let count = "SELECT count(*), sum(l_orderkey) FROM";
    let source = cluster.sql(3, &format!("{count} ordered"));
    assert_eq!(cluster.sql(3, &format!("{count} copied")), source);
    assert_eq!(cluster.sql(3, &format!("{count} inserted")), source);
}

/// The (min, max) of integer column `column` in each row group of the
/// Parquet files in `dir`.
fn row_group_ranges(dir: &std::path::Path, column: &str) -> Vec<(i64, i64)> {
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    use datafusion::parquet::file::statistics::Statistics;
    let mut ranges = Vec::new();
    for entry in std::fs::read_dir(dir).expect("table directory") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "parquet") {
            continue;
        }
        let file = std::fs::File::open(&path).expect("data file");
        let reader = SerializedFileReader::new(file).expect("a Parquet file");
        for group in reader.metadata().row_groups() {
            let chunk = group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == column)
                .expect("the column");
            let range = match chunk.statistics() {
                Some(Statistics::Int64(s)) => (*s.min_opt().unwrap(), *s.max_opt().unwrap()),
                Some(Statistics::Int32(s)) => (
                    i64::from(*s.min_opt().unwrap()),
                    i64::from(*s.max_opt().unwrap()),
                ),
                other => panic!("no integer statistics for {column}: {other:?}"),
            };
            ranges.push(range);
        }
    }
    ranges
}

/// Node `node`'s counters in `cirro.memory`: requests refused to operators
/// that can spill, and to the others.
fn refusals(cluster: &Cluster, node: usize) -> (u64, u64) {
    let row = cluster.sql(
        node,
        "SELECT refused_spilling, refused_other FROM cirro.memory",
    );
    let (spilled, failed) = row.split_once('|').expect("two counters");
    (
        spilled.parse().expect("a count"),
        failed.parse().expect("a count"),
    )
}

/// Node `node`'s process: its resident memory's high-water mark (VmHWM)
/// in bytes, reset to what it holds now with `reset`.
fn node_peak_rss(cluster: &Cluster, node: usize, reset: bool) -> u64 {
    let pid = cluster.pid(node);
    if reset {
        // 5: reset the peak resident set size (proc(5), clear_refs).
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("clear_refs");
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert!(
        status.starts_with("Name:\tcirro\n"),
        "node{node}'s pid is not cirro's"
    );
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix(" kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// A query's memory limit holds on every node its tasks run on: each node
/// counts the tasks of other nodes' queries in a pool of the query's limit
/// (`cirro.memory`). Joins, aggregations, sorts (the GPU sort on lavapipe too),
/// windows and shared subplans under a tight
/// `memory_limit` give the answer they give without it or fail with 53200
/// naming the node and the operator (the spilling join must finish); each
/// node's resident memory stays within the limit, its hot-data tier and
/// 300 MB; and the queries that finished had requests refused on every node (a refused operator that
/// does not fail its query spills: the spilling join's in-memory part
/// hands its rows to the part that spills, the others spill themselves).
fn a_querys_memory_limit_holds_on_every_node(cluster: &Cluster) {
    const SLACK: u64 = 300 << 20;
    let families = [
        (
            "join",
            8,
            "SELECT count(*), sum(a.l_quantity * b.l_discount) FROM lineitem a \
             JOIN lineitem b ON a.l_orderkey = b.l_orderkey",
        ),
        (
            "aggregation",
            24,
            "SELECT count(*), sum(s), max(c) FROM (SELECT l_orderkey, l_linenumber, \
             sum(l_quantity) AS s, max(l_comment) AS c FROM lineitem \
             GROUP BY l_orderkey, l_linenumber) AS g",
        ),
        // DataFusion's sorts fail at these limits on one node too (their
        // merge cannot spill): they must fail cleanly.
        (
            "sort",
            16,
            "SELECT count(*), max(l_comment) FROM (SELECT l_comment FROM lineitem \
             ORDER BY l_comment, l_orderkey OFFSET 10) AS s",
        ),
        (
            "window",
            16,
            "SELECT max(r), sum(r) FROM (SELECT row_number() OVER (PARTITION BY l_suppkey \
             ORDER BY l_comment, l_orderkey, l_linenumber) AS r FROM lineitem) AS w",
        ),
        // The GPU sort (on lavapipe) on every node.
        (
            "GPU sort",
            16,
            "SET gpu = force; SELECT count(*), max(l_extendedprice) FROM (SELECT l_extendedprice \
             FROM lineitem ORDER BY l_extendedprice, l_orderkey, l_linenumber OFFSET 10) AS s",
        ),
        // A subplan read twice (shared where both reads run in one place).
        (
            "shared subplan",
            16,
            "WITH s AS (SELECT l_orderkey, sum(l_extendedprice) AS r FROM lineitem \
             GROUP BY l_orderkey) SELECT count(*), max(r) FROM s WHERE r > (SELECT avg(r) FROM s)",
        ),
    ];
    let total = |(a, b): (u64, u64)| a + b;
    let mut refused_in_finished = [0u64; 3];
    let mut finished = Vec::new();
    for (family, limit_mb, query) in families {
        let limit = format!("{limit_mb}MB");
        let free = cluster.sql(1, &format!("{SMALL_TASKS}; {query}"));
        let free = free.lines().last().unwrap_or_default();
        let before: Vec<u64> = (1..=3).map(|n| total(refusals(cluster, n))).collect();
        for node in 1..=3 {
            node_peak_rss(cluster, node, true);
        }
        let out = cluster.psql(
            1,
            &[
                "-At",
                "-c",
                SMALL_TASKS,
                "-c",
                &format!("SET memory_limit = '{limit}'"),
                "-c",
                query,
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.success() {
            let answer = stdout.lines().last().unwrap_or_default();
            assert_eq!(answer, free, "the {family} under {limit}");
            finished.push(family);
            for node in 1..=3 {
                refused_in_finished[node - 1] += total(refusals(cluster, node)) - before[node - 1];
            }
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("53200") && err.contains(" is reached on node"),
                "the {family} under {limit}: {err}"
            );
        }
        let limit_bytes = limit_mb << 20;
        for node in 1..=3 {
            let peak = node_peak_rss(cluster, node, false);
            let tier: u64 = cluster
                .sql(
                    node,
                    &format!(
                        "SELECT coalesce(sum(bytes), 0) FROM cirro.cache WHERE node = 'node{node}'"
                    ),
                )
                .parse()
                .expect("bytes");
            assert!(
                peak <= limit_bytes + tier + SLACK,
                "the {family}: node{node}'s peak resident memory {peak} B past \
                 {limit} + its tier's {tier} B + 300 MB"
            );
        }
    }
    // The spilling join finishes under any limit; the others may 53200.
    assert!(finished.contains(&"join"), "{finished:?}");
    for node in 1..=3 {
        assert!(
            refused_in_finished[node - 1] > 0,
            "node{node} never held a finished query to its limit: {refused_in_finished:?}"
        );
    }
    // Too little for a join that cannot spill.
    let err = cluster.sql_err(
        1,
        &format!(
            "{SMALL_TASKS}; SET memory_limit = '1MB'; SET spill_join = off; {}",
            families[0].2
        ),
    );
    assert!(err.contains("53200"), "{err}");
    assert!(
        err.contains(" is reached on node"),
        "the node is named: {err}"
    );
}

/// A grouped aggregation across nodes pre-aggregates before the shuffle
/// when its groups are few (l_linenumber: 7) and shuffles the rows when
/// they are about as many as the rows (l_orderkey, l_linenumber), and over
/// runs of equal keys where the files hold disjoint ranges of the key;
/// EXPLAIN says which and why, `SET aggregation_exchange` forces either,
/// and every way gives the same answer; text keys are estimated by
/// sampling.
fn aggregations_choose_what_crosses_the_network(cluster: &Cluster) {
    let few = "SELECT l_linenumber, count(*), sum(l_quantity) FROM lineitem \
               GROUP BY l_linenumber ORDER BY 1";
    let many = "SELECT count(*), sum(s), max(s) FROM (SELECT l_orderkey, l_linenumber, \
                sum(l_quantity) AS s FROM lineitem GROUP BY l_orderkey, l_linenumber) AS g";
    let explain = |set: &str, query: &str| -> String {
        cluster.sql(
            1,
            &format!("{SMALL_TASKS}; SET aggregation_exchange = {set}; EXPLAIN {query}"),
        )
    };
    let auto_few = explain("auto", few);
    assert!(
        auto_few.contains("aggregation=pre-aggregated (≈7 groups of "),
        "{auto_few}"
    );
    let auto_many = explain("auto", many);
    assert!(
        auto_many.contains("aggregation=rows shuffled (≈"),
        "{auto_many}"
    );
    assert!(auto_many.contains("mode=SinglePartitioned"), "{auto_many}");
    let forced_rows = explain("rows", few);
    assert!(
        forced_rows.contains("aggregation=rows shuffled"),
        "{forced_rows}"
    );
    let forced_partial = explain("partial", many);
    assert!(
        forced_partial.contains("aggregation=pre-aggregated"),
        "{forced_partial}"
    );
    for query in [few, many] {
        let answers: Vec<String> = ["auto", "partial", "rows"]
            .iter()
            .map(|set| {
                cluster.sql(
                    2,
                    &format!("{SMALL_TASKS}; SET aggregation_exchange = {set}; {query}"),
                )
            })
            .collect();
        assert!(!answers[0].is_empty());
        assert_eq!(answers[0], answers[1], "{query}");
        assert_eq!(answers[0], answers[2], "{query}");
    }
    let err = cluster.sql_err(1, "SET aggregation_exchange = sometimes");
    assert!(err.contains("22023"), "{err}");
    // Files of disjoint ranges of the key, each written in key order: the
    // first phase aggregates runs of equal keys on every node whatever the
    // estimate (the value range of l_orderkey counts as many groups as
    // rows), the coordinator's choice sent to the nodes as it is.
    cluster.sql(
        1,
        "CREATE TABLE ordered AS SELECT * FROM lineitem WHERE l_orderkey < 200000 \
         ORDER BY l_orderkey",
    );
    for (low, high) in [(200000, 400000), (400000, i64::MAX)] {
        cluster.sql(
            1,
            &format!(
                "INSERT INTO ordered SELECT * FROM lineitem WHERE l_orderkey >= {low} \
                 AND l_orderkey < {high} ORDER BY l_orderkey"
            ),
        );
    }
    let by_order = "SELECT count(*), sum(s), max(s) FROM (SELECT l_orderkey, \
                    sum(l_quantity) AS s FROM ordered GROUP BY l_orderkey) AS g";
    let runs = explain("auto", by_order);
    assert!(
        runs.contains("aggregation=pre-aggregated over runs of equal keys (≈"),
        "{runs}"
    );
    let analyzed = cluster.sql(
        1,
        &format!("{SMALL_TASKS}; SET aggregation_exchange = auto; EXPLAIN ANALYZE {by_order}"),
    );
    assert!(analyzed.contains("RunAggregateExec"), "{analyzed}");
    let answers: Vec<String> = ["auto", "partial", "rows"]
        .iter()
        .map(|set| {
            cluster.sql(
                2,
                &format!("{SMALL_TASKS}; SET aggregation_exchange = {set}; {by_order}"),
            )
        })
        .collect();
    // The groups' count and total, computed without grouping.
    let direct = cluster.sql(
        2,
        "SELECT count(DISTINCT l_orderkey), sum(l_quantity) FROM ordered",
    );
    let (count_sum, _max) = answers[0]
        .lines()
        .last()
        .and_then(|l| l.rsplit_once('|'))
        .expect("an answer");
    assert_eq!(count_sum, direct, "{answers:?}");
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], answers[2]);
    // Text keys: no statistics estimate their groups; a sampling run
    // before execution does, and EXPLAIN ANALYZE shows what it read.
    let few_text = "SELECT l_shipmode, count(*) FROM lineitem GROUP BY l_shipmode ORDER BY 1";
    let many_text = "SELECT count(*), max(n) FROM (SELECT l_comment, count(*) AS n \
                     FROM lineitem GROUP BY l_comment) AS g";
    let explained = explain("auto", few_text);
    assert!(
        explained.contains("aggregation=pre-aggregated (≈"),
        "{explained}"
    );
    let explained = explain("auto", many_text);
    assert!(
        explained.contains("aggregation=rows shuffled (≈"),
        "{explained}"
    );
    let analyzed = cluster.sql(
        1,
        &format!("{SMALL_TASKS}; SET aggregation_exchange = auto; EXPLAIN ANALYZE {many_text}"),
    );
    assert!(
        analyzed.contains("group key l_comment sampled: ") && analyzed.contains(" ms)"),
        "{analyzed}"
    );
    for query in [few_text, many_text] {
        let answers: Vec<String> = ["auto", "partial"]
            .iter()
            .map(|set| {
                cluster.sql(
                    3,
                    &format!("{SMALL_TASKS}; SET aggregation_exchange = {set}; {query}"),
                )
            })
            .collect();
        assert_eq!(answers[0], answers[1], "{query}");
    }
}

/// Rounds of killing a worker during a query (see
/// `a_query_outlives_a_node_killed_or_cut_during_it`).
const KILL_ROUNDS: usize = 5;

/// A query long enough (~3 s on this machine) to be running when a node fails.
const LONG_QUERY: &str = "SELECT count(*), sum(a.l_quantity * b.l_discount) \
     FROM lineitem a JOIN lineitem b ON a.l_suppkey = b.l_suppkey";

/// Run LONG_QUERY through node 1 while `fault` hits, `after` into it; the
/// query's output (or error) and how long it took after the fault.
fn long_query_with_fault(
    cluster: &Cluster,
    after: Duration,
    fault: impl FnOnce(),
) -> (std::process::Output, Duration) {
    let child = Command::new("psql")
        .arg(cluster.conninfo(1))
        .args([
            "-X",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
        ])
        .args(["-c", SMALL_TASKS, "-c", LONG_QUERY])
        .env("PGPASSWORD", &cluster.password)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    std::thread::sleep(after);
    fault();
    let hit = Instant::now();
    let out = child.wait_with_output().expect("psql");
    (out, hit.elapsed())
}

/// The query either gives the whole answer or fails with a node failure
/// (08006); never a wrong count.
fn whole_or_failed(out: &std::process::Output, expected: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        assert_eq!(stdout.trim(), format!("SET\n{expected}"));
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("08006") || err.contains("57P"), "{err}");
    }
}

#[test]
fn a_query_outlives_a_node_killed_or_cut_during_it() {
    let cluster = Cluster::up(3, "local");
    let _generated = load_tpch_through_node1(&cluster, "0.1", &["lineitem"]);
    let started = Instant::now();
    let expected = cluster.sql(1, &format!("{SMALL_TASKS}; {LONG_QUERY}"));
    let alone = started.elapsed();
    let expected = expected.trim_start_matches("SET\n").to_string();

    // Killed 1.5 s into the query, five times: each time the query is run
    // again on the others and gives the whole answer, the retry counted in
    // cirro.queries; restarted, the node is a member again and takes tasks.
    for round in 1..=KILL_ROUNDS {
        let retried = || -> u64 {
            cluster
                .sql(
                    1,
                    &format!(
                        "SELECT coalesce(sum(retries), 0) FROM cirro.queries \
                         WHERE query = '{LONG_QUERY}' AND state = 'finished'"
                    ),
                )
                .parse()
                .expect("a count")
        };
        let before = retried();
        let (out, took) = long_query_with_fault(&cluster, Duration::from_millis(1500), || {
            cluster.script(&["kill", "3"]);
        });
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        whole_or_failed(&out, &expected);
        let bound = Duration::from_secs(10) + 2 * alone;
        assert!(took < bound, "round {round}: {took:?} (bound {bound:?})");
        assert_eq!(retried(), before + 1, "round {round}: no retry counted");
        cluster.script(&["start", "3"]);
        members_become(&cluster, &["node1", "node2", "node3"], "node3 back");
    }

    // Cut off: the same, bounded by the connections' keep-alives.
    survives(&cluster, (&expected, alone), "cut", 3, || {
        cluster.script(&["cut", "2"]);
    });
    cluster.script(&["heal", "2"]);
    members_become(&cluster, &["node1", "node2", "node3"], "node2 back");

    // SIGTERM: the node finishes the tasks it runs for node 1's query
    // before it leaves, so the query needs no second run.
    let retries = || {
        let log = std::fs::read_to_string(cluster.dir.path().join("node1/log")).expect("log");
        log.matches("running it again").count()
    };
    let before = retries();
    let pid = cluster.pid(3);
    let (out, _) = long_query_with_fault(&cluster, Duration::from_millis(1500), || {
        assert_eq!(unsafe_kill(pid, libc::SIGTERM), 0);
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    whole_or_failed(&out, &expected);
    assert_eq!(retries(), before, "the query was run again");
    members_become(&cluster, &["node1", "node2"], "node3 gone after SIGTERM");

    // The client's own node killed: nothing runs the query again; the
    // client loses its connection (a connection failure, 08006, as drivers
    // report it), not a wrong or partial answer.
    let (out, _) = long_query_with_fault(&cluster, Duration::from_millis(1500), || {
        cluster.script(&["kill", "1"]);
    });
    assert!(!out.status.success(), "an answer from a killed node");
    assert!(out.stdout.is_empty() || String::from_utf8_lossy(&out.stdout).trim() == "SET");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("server closed the connection unexpectedly")
            || err.contains("connection to server was lost"),
        "{err}"
    );
}

/// LONG_QUERY through node 1 while `fault` hits 1.5 s into it: the whole
/// answer or a node failure, soon after the fault; then the query succeeds
/// through node `then`. Soon: 20 s (the failure is seen within the
/// keep-alive's 12 s) plus twice the query's undisturbed time `alone` (the
/// second run on the other nodes, which the tests running beside this one
/// on the same cores can slow: a fixed 10 s failed once at 12 s). A hang
/// (no keep-alive: TCP's retransmission timeout, minutes) stays far above.
fn survives(
    cluster: &Cluster,
    (expected, alone): (&str, Duration),
    what: &str,
    then: usize,
    fault: impl FnOnce(),
) {
    let (out, took) = long_query_with_fault(cluster, Duration::from_millis(1500), fault);
    whole_or_failed(&out, expected);
    let bound = Duration::from_secs(20) + 2 * alone;
    assert!(took < bound, "{took:?} after the {what} (bound {bound:?})");
    assert_eq!(
        cluster.sql(then, &format!("{SMALL_TASKS}; {LONG_QUERY}")),
        format!("SET\n{expected}")
    );
}

/// Wait (15 s at most) until node 1 lists exactly `names` in cirro.nodes.
fn members_become(cluster: &Cluster, names: &[&str], what: &str) {
    within(Duration::from_secs(15), what, || {
        node_ids(cluster, 1) == ids(names)
    });
}

#[test]
fn a_cancelled_distributed_query_stops_on_every_node() {
    let cluster = Cluster::up(3, "local");
    let _generated = load_tpch_through_node1(&cluster, "0.1", &["lineitem"]);
    // Hours of work, cut short by its timeout.
    let endless = "SELECT count(*), sum(a.l_quantity * b.l_discount * c.l_tax) \
         FROM lineitem a JOIN lineitem b ON a.l_suppkey = b.l_suppkey \
         JOIN lineitem c ON c.l_suppkey = a.l_suppkey";
    let pids: Vec<i32> = (1..=3).map(|i| cluster.pid(i)).collect();
    let before: Vec<u64> = pids.iter().map(|p| common::cpu_ticks(*p as u32)).collect();
    let started = Instant::now();
    let child = Command::new("psql")
        .arg(cluster.conninfo(1))
        .args([
            "-X",
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            "VERBOSITY=verbose",
        ])
        .args([
            "-c",
            SMALL_TASKS,
            "-c",
            "SET statement_timeout = '10s'",
            "-c",
            endless,
        ])
        .env("PGPASSWORD", &cluster.password)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql");
    // While it runs, node1 counts it (checked each second), and the other
    // nodes see the count change at once (a watch on the registrations).
    let running = "SELECT queries >= 1 FROM cirro.nodes WHERE id = 'node1'";
    within(Duration::from_secs(3), "node1 running a query", || {
        cluster.sql(1, running) == "t"
    });
    within(
        Duration::from_secs(7),
        "node3 seeing node1 run a query",
        || cluster.sql(3, running) == "t",
    );
    // The workers report their tasks and the memory they hold (placement
    // weighs both).
    let working = "SELECT tasks >= 1 AND memory_used > 0 FROM cirro.nodes WHERE id = 'node2'";
    within(Duration::from_secs(5), "node2 reporting its load", || {
        cluster.sql(3, working) == "t"
    });
    let out = child.wait_with_output().expect("psql");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("57014"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(14),
        "{:?}",
        started.elapsed()
    );
    let during: Vec<u64> = pids.iter().map(|p| common::cpu_ticks(*p as u32)).collect();
    // Every node worked on it ...
    for (i, (b, d)) in before.iter().zip(&during).enumerate() {
        assert!(d - b >= 10, "node{} did no work: {b} -> {d} ticks", i + 1);
    }
    // ... and none goes on after the cancel (a little slack for the
    // membership refresh and the last batches).
    std::thread::sleep(Duration::from_millis(500));
    let settled: Vec<u64> = pids.iter().map(|p| common::cpu_ticks(*p as u32)).collect();
    std::thread::sleep(Duration::from_secs(2));
    let after: Vec<u64> = pids.iter().map(|p| common::cpu_ticks(*p as u32)).collect();
    for (i, (s, a)) in settled.iter().zip(&after).enumerate() {
        assert!(
            a - s < 20,
            "node{} still busy after the cancel: {s} -> {a} ticks",
            i + 1
        );
    }
}

/// A psql on node `node` running `sql` in the background.
fn psql_bg(cluster: &Cluster, node: usize, sql: &str) -> std::process::Child {
    Command::new("psql")
        .arg(cluster.conninfo(node))
        .args(["-X", "-At", "-v", "VERBOSITY=verbose", "-c", sql])
        .env("PGPASSWORD", &cluster.password)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql")
}

#[test]
fn statements_of_every_node_are_listed_and_cancelled_from_any_node() {
    let cluster = Cluster::up(2, "local");
    cluster.sql(
        1,
        "CREATE TABLE t AS SELECT value AS v FROM generate_series(1, 1000) AS g(value)",
    );
    // Each node has its own number: pids and query ids carry it.
    let numbers = cluster.sql(1, "SELECT id, number FROM cirro.nodes ORDER BY id");
    let numbers: Vec<i64> = numbers
        .lines()
        .map(|l| l.rsplit('|').next().expect("number").parse().expect("int"))
        .collect();
    assert_eq!(numbers.len(), 2);
    assert!(
        numbers[0] >= 1 && numbers[1] >= 1 && numbers[0] != numbers[1],
        "{numbers:?}"
    );
    let node2 = numbers[1];
    let pid2: i64 = cluster
        .sql(2, "SELECT pg_backend_pid()")
        .parse()
        .expect("pid");
    assert_eq!(pid2 >> 22, node2);

    // A long statement on node2, seen and cancelled through node1.
    let long = |marker: &str| {
        format!("SELECT /* {marker} */ count(*) FROM t, generate_series(1, 5000000000)")
    };
    let find = |marker: &str, column: &str| {
        cluster.sql(
            1,
            &format!(
                "SELECT {column} FROM cirro.queries WHERE state = 'running' \
                 AND query LIKE '%{marker}%' AND query NOT LIKE '%cirro.queries%'"
            ),
        )
    };
    let client = psql_bg(&cluster, 2, &long("cw-one"));
    within(
        Duration::from_secs(20),
        "node1 listing node2's statement",
        || !find("cw-one", "query_id").is_empty(),
    );
    let id: i64 = find("cw-one", "query_id").parse().expect("id");
    assert_eq!(id >> 40, node2);
    assert_eq!(find("cw-one", "node").parse::<i64>().expect("node"), node2);
    assert_eq!(
        cluster.sql(1, &format!("CANCEL QUERY {id}")),
        "CANCEL QUERY"
    );
    let out = client.wait_with_output().expect("psql");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("57014"), "{err}");
    // Ended, on node2, and listed as such through node1.
    within(Duration::from_secs(10), "the cancel listed", || {
        cluster.sql(
            1,
            &format!("SELECT state FROM cirro.queries WHERE query_id = {id}"),
        ) == "cancelled"
    });
    assert!(
        cluster
            .sql_err(1, &format!("CANCEL QUERY {id}"))
            .contains("42704")
    );

    // pg_cancel_backend of node2's backend, through node1.
    let client = psql_bg(&cluster, 2, &long("cw-two"));
    within(
        Duration::from_secs(20),
        "node1 listing the second statement",
        || !find("cw-two", "pid").is_empty(),
    );
    let pid = find("cw-two", "pid");
    assert_eq!(
        cluster.sql(1, &format!("SELECT pg_cancel_backend({pid})")),
        "t"
    );
    let out = client.wait_with_output().expect("psql");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("57014"), "{err}");

    let api = |path: &str| -> serde_json::Value {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "20", "-u"])
            .arg(format!("cirro:{}", cluster.password))
            .arg(format!("http://{}{path}", cluster.http[0]))
            .output()
            .expect("curl");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    };
    // Node1's console lists node2's ended statement without its plan (the
    // list asks the other nodes for none), and shows the plan on request.
    let listed = api("/api/queries");
    let one = listed
        .as_array()
        .expect("list")
        .iter()
        .find(|q| q["id"].as_i64() == Some(id))
        .unwrap_or_else(|| panic!("{id} not in {listed}"));
    assert_eq!(
        (one["state"].as_str(), one["node"].as_i64()),
        (Some("cancelled"), Some(node2))
    );
    assert!(one.get("plan").is_none(), "{one}");
    let detail = api(&format!("/api/queries/{id}"));
    assert!(
        detail["plan"].as_str().is_some_and(|p| p.contains("Exec")),
        "{detail}"
    );

    // The console of node1 maps both nodes, with their consoles.
    let nodes = api("/api/nodes");
    let https: Vec<&str> = nodes
        .as_array()
        .expect("list")
        .iter()
        .map(|n| n["http"].as_str().expect("http"))
        .collect();
    assert_eq!(https.len(), 2, "{nodes}");
    for http in &cluster.http {
        assert!(https.contains(&http.as_str()), "{http} not in {nodes}");
    }
}

#[test]
fn an_unreachable_hdfs_fails_reads_cleanly_and_loses_nothing() {
    let cluster = Cluster::up_with_env(2, "hdfs", &[("CIRRO_STORAGE_READ_TIMEOUT", "3")]);
    cluster.sql(
        1,
        "CREATE TABLE t AS SELECT CAST(value AS BIGINT) AS i FROM generate_series(1, 1000)",
    );
    assert_eq!(
        cluster.sql(2, "SELECT count(*), sum(i) FROM t"),
        "1000|500500"
    );

    // Frozen (SIGSTOP): reads give up after the read timeout, with an error
    // that says why; the nodes stay up and answer what needs no storage.
    cluster.script(&["hdfs-pause"]);
    let started = Instant::now();
    // (bounded here too: a hang must fail the test, not hold it)
    let out = Command::new("timeout")
        .args(["60", "psql"])
        .arg(cluster.conninfo(2))
        .args(["-X", "-At", "-v", "VERBOSITY=verbose", "-c"])
        .arg("SELECT count(*), sum(i) FROM t WHERE i > 10")
        .env("PGPASSWORD", &cluster.password)
        .output()
        .expect("psql");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let took = started.elapsed();
    cluster.script(&["hdfs-resume"]);
    assert!(err.contains("did not answer"), "{err}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert_eq!(cluster.sql(1, "SELECT 1"), "1");

    // Back: nothing was lost, and writes work again.
    within(Duration::from_secs(20), "reads after HDFS is back", || {
        let out = cluster.psql(2, &["-At", "-c", "SELECT count(*), sum(i) FROM t"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1000|500500"
    });
    cluster.sql(1, "INSERT INTO t VALUES (1001)");
    assert_eq!(
        cluster.sql(2, "SELECT count(*), max(i) FROM t"),
        "1001|1001"
    );
}

/// Tasks over a few hundred kilobytes each, and no broadcast: the small
/// tables of the bucketing test then join partition by partition on three
/// nodes.
const TINY_TASKS_NO_BROADCAST: &str = "SET distributed.file_scan_config_bytes_per_partition = 100000; \
     SET datafusion.optimizer.hash_join_single_partition_threshold = 0; \
     SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0";

#[test]
fn bucketed_tables_join_bucket_by_bucket_across_nodes() {
    let cluster = Cluster::up(3, "local");
    cluster.sql(1, "CREATE TABLE o (k BIGINT, c INT)");
    cluster.sql(1, "CREATE TABLE l (k BIGINT, q INT)");
    // 12 buckets: 3 tasks of 2 partitions take whole buckets; 8: they
    // cannot (6 does not divide 8), each task filters its rows by hash.
    cluster.sql(
        2,
        "CREATE TABLE ob (k BIGINT, c INT) DISTRIBUTED BY HASH (k) BUCKETS 12",
    );
    cluster.sql(
        3,
        "CREATE TABLE lb (k BIGINT, q INT) DISTRIBUTED BY HASH (k) BUCKETS 12",
    );
    cluster.sql(
        1,
        "CREATE TABLE l8 (k BIGINT, q INT) DISTRIBUTED BY HASH (k) BUCKETS 8",
    );
    // Every node writes a third of the rows of every table.
    for node in 1..=3 {
        let range = format!(
            "generate_series({}, {})",
            (node - 1) * 40000,
            node * 40000 - 1
        );
        for table in ["o", "ob"] {
            cluster.sql(
                node,
                &format!("INSERT INTO {table} SELECT value, CAST(value % 101 AS INT) FROM {range} AS g(value)"),
            );
        }
        for table in ["l", "lb", "l8"] {
            cluster.sql(
                node,
                &format!(
                    "INSERT INTO {table} SELECT value % 150000, CAST(value % 7 AS INT) FROM {range} AS g(value) \
                     UNION ALL SELECT value * 3 % 150000, 1 FROM {range} AS g(value)"
                ),
            );
        }
    }
    let join = |left: &str, right: &str| {
        format!(
            "SELECT count(*), sum(q), sum(c), count(DISTINCT {left}.k) FROM {left} JOIN {right} ON {left}.k = {right}.k"
        )
    };
    let expected = cluster.sql(1, &join("o", "l"));
    let groups = "SELECT k, count(*) AS n, sum(q) AS s FROM";
    for node in 1..=3 {
        for (left, right) in [("ob", "lb"), ("ob", "l8"), ("o", "lb"), ("ob", "l")] {
            let got = cluster.sql(
                node,
                &format!("{TINY_TASKS_NO_BROADCAST}; {}", join(left, right)),
            );
            assert_eq!(
                got.lines().last(),
                Some(expected.as_str()),
                "node{node}: {left} ⋈ {right}"
            );
        }
        // Without the key among the columns read: any split is right.
        let sums = "SELECT count(*), sum(q) FROM";
        let plain = cluster.sql(node, &format!("{sums} l"));
        for table in ["lb", "l8"] {
            let got = cluster.sql(node, &format!("{TINY_TASKS_NO_BROADCAST}; {sums} {table}"));
            assert_eq!(
                got.lines().last(),
                Some(plain.as_str()),
                "node{node}: {table} summed"
            );
        }
        // Grouped by the key: bucket by bucket, the same groups.
        for table in ["lb", "l8"] {
            let diff = cluster.sql(
                node,
                &format!(
                    "{TINY_TASKS_NO_BROADCAST}; SELECT count(*) FROM (({groups} {table} GROUP BY k) \
                     EXCEPT ALL ({groups} l GROUP BY k)) AS d"
                ),
            );
            assert_eq!(
                diff.lines().last(),
                Some("0"),
                "node{node}: {table} grouped"
            );
        }
    }
    // The co-located join runs in one stage of three tasks, with no shuffle;
    // against an unbucketed table only that table is shuffled.
    let explain = |sql: &str| cluster.sql(2, &format!("{TINY_TASKS_NO_BROADCAST}; EXPLAIN {sql}"));
    let co_located = explain("SELECT count(*) FROM ob JOIN lb ON ob.k = lb.k");
    assert!(co_located.contains("join=co-located"), "{co_located}");
    assert!(co_located.contains("tasks=3"), "{co_located}");
    assert!(!co_located.contains("NetworkShuffleExec"), "{co_located}");
    // 12 buckets split whole; 8 cannot be, so the tasks filter by hash slot.
    assert!(!co_located.contains("cirro_hash_slot"), "{co_located}");
    let filtered = explain("SELECT count(*) FROM ob JOIN l8 ON ob.k = l8.k");
    assert!(filtered.contains("join=co-located"), "{filtered}");
    assert!(filtered.contains("cirro_hash_slot(6, k@0)"), "{filtered}");
    let mixed = explain("SELECT count(*) FROM o JOIN lb ON o.k = lb.k");
    assert!(mixed.contains("join=shuffle"), "{mixed}");
    assert_eq!(mixed.matches("NetworkShuffleExec").count(), 1, "{mixed}");
    // EXPLAIN ANALYZE where part of the plan need not run (an empty build
    // side) answers: the wait for the tasks' metrics is bounded (a task that
    // never runs sends none; datafusion-distributed#739, seen hanging the
    // scaling benchmark's EXPLAIN ANALYZE of Q17 once, not reproduced here
    // at will).
    let started = Instant::now();
    let analyzed = cluster.sql(
        2,
        &format!(
            "{TINY_TASKS_NO_BROADCAST}; SET statement_timeout = '60s'; \
             EXPLAIN ANALYZE SELECT count(*) FROM o JOIN l ON o.k = l.k WHERE o.c < 0"
        ),
    );
    assert!(analyzed.contains("Plan with Metrics"), "{analyzed}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

/// The share of HDFS bytes scanned on the node holding them, from the last
/// line of `EXPLAIN ANALYZE`'s placement ("… (97.1 % local)").
fn percent_local(analyzed: &str) -> f64 {
    let line = analyzed
        .lines()
        .rfind(|l| l.starts_with("HDFS bytes scanned:"))
        .unwrap_or_else(|| panic!("no HDFS bytes line:\n{analyzed}"));
    line.rsplit_once('(')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no share in {line:?}"))
}

/// HDFS scans run where the blocks are: each node has a data node beside it
/// (replication 1, so a node's writes are stored on its own disk); a table
/// written through all three nodes is scanned with ≥ 90 % of its bytes read
/// on the node holding them, whichever node coordinates; with a node's
/// server killed (its data node stays), its files' tasks move to the others,
/// which read those blocks remotely, and the answer stays right.
#[test]
fn hdfs_scans_read_their_blocks_where_they_are_and_move_off_a_dead_node() {
    let cluster = Cluster::up(3, "hdfs");
    cluster.sql(1, "CREATE TABLE t (a BIGINT, b TEXT)");
    for node in 1..=3 {
        for part in 0..2 {
            let first = (node * 2 + part) * 100_000;
            cluster.sql(
                node,
                &format!(
                    "INSERT INTO t SELECT value, repeat(CAST(value % 7 AS TEXT), 20) \
                     FROM generate_series({first}, {}) AS g(value)",
                    first + 99_999
                ),
            );
        }
    }
    let tasks = "SET distributed.file_scan_config_bytes_per_partition = 10000";
    let query = "SELECT count(*), sum(a), count(DISTINCT b) FROM t";
    let expected = cluster.sql(1, query);
    let sum: i64 = (200_000..800_000).sum();
    assert_eq!(expected, format!("600000|{sum}|7"));
    for node in 1..=3 {
        let analyzed = cluster.sql(node, &format!("{tasks}; EXPLAIN ANALYZE {query}"));
        let local = percent_local(&analyzed);
        assert!(local >= 90.0, "node{node}: {local} % local:\n{analyzed}");
        let placement: String = analyzed
            .lines()
            .skip_while(|l| !l.starts_with("nodes|"))
            .collect();
        for name in ["node1", "node2", "node3"] {
            assert!(placement.contains(name), "{name} ran nothing:\n{placement}");
        }
        assert_eq!(
            cluster.sql(node, &format!("{tasks}; {query}")),
            format!("SET\n{expected}")
        );
    }
    cluster.script(&["kill", "3"]);
    members_become(&cluster, &["node1", "node2"], "node3 killed");
    for node in 1..=2 {
        let analyzed = cluster.sql(node, &format!("{tasks}; EXPLAIN ANALYZE {query}"));
        let placement: String = analyzed
            .lines()
            .skip_while(|l| !l.starts_with("nodes|"))
            .collect();
        assert!(!placement.contains("node3"), "{placement}");
        let local = percent_local(&analyzed);
        // node3's third of the bytes is read from its data node, remotely.
        assert!(
            (50.0..90.0).contains(&local),
            "{local} % local:\n{analyzed}"
        );
        assert_eq!(
            cluster.sql(node, &format!("{tasks}; {query}")),
            format!("SET\n{expected}")
        );
    }
}

/// A join of two 20 M-row tables on 3 nodes under a 100 MB limit gives
/// what it gives without one, and every node spilled its part.
#[test]
#[ignore = "slow tier: two 20 M-row tables on 3 nodes"]
fn a_join_of_two_20m_row_tables_on_three_nodes_under_100mb_spills_on_each() {
    let _heavy = common::heavy();
    let cluster = Cluster::up(3, "local");
    cluster.sql(
        1,
        "CREATE TABLE a AS SELECT value AS k, value % 1000 AS v \
         FROM generate_series(1, 20000000) AS g(value)",
    );
    cluster.sql(
        1,
        "CREATE TABLE b AS SELECT (value * 7919) % 20000000 AS k, value AS w \
         FROM generate_series(0, 19999999) AS g(value)",
    );
    // Partitioned on both sides across the nodes (a broadcast of 20 M rows
    // would be one node's build side).
    let query = "SET distributed.broadcast_joins = false; \
                 SELECT count(*), sum(a.v), sum(b.w), min(b.k), max(a.k) \
                 FROM a JOIN b ON a.k = b.k";
    let unlimited = cluster.sql(1, query);
    let total = |node: usize| {
        let (spilling, other) = refusals(&cluster, node);
        spilling + other
    };
    let before: Vec<u64> = (1..=3).map(total).collect();
    let limited = cluster.sql(1, &format!("SET memory_limit = '100MB'; {query}"));
    let answer = |out: &str| out.lines().last().unwrap_or_default().to_string();
    assert_eq!(answer(&limited), answer(&unlimited));
    // Refused and finished: the join's part on the node spilled.
    for node in 1..=3 {
        assert!(
            total(node) > before[node - 1],
            "node{node}'s part of the join was never refused memory"
        );
    }
    eprintln!("{unlimited}");
}

/// 16 clients, spread over 3 nodes of 2 GB each, run TPC-H SF1 queries at
/// once: every answer is the reference answer and no node's resident
/// memory passes its 2 GB + 300 MB (tasks of the other nodes' queries
/// count in each node's budget).
#[test]
#[ignore = "slow tier: 16 clients x 6 TPC-H SF1 queries on 3 nodes"]
fn sixteen_clients_on_three_2gb_nodes_all_finish_within_each_budget() {
    const CLIENTS: usize = 16;
    const QUERIES: [u32; 6] = [1, 3, 9, 13, 18, 21];
    const BUDGET: u64 = 2 << 30;
    let _heavy = common::heavy();
    let cluster = Cluster::up_with_env(3, "local", &[("CIRRO_MEMORY_LIMIT", "2GB")]);
    let generated = load_tpch_through_node1(&cluster, "1", &TPCH_TABLES);
    drop(generated);
    for node in 1..=3 {
        node_peak_rss(&cluster, node, true);
    }
    let failures = common::compare::tpch_sf1_clients(CLIENTS, &QUERIES, |c, query| {
        cluster.psql(
            1 + c % 3,
            &["-A", "-F", "|", "-P", "footer=off", "-c", query],
        )
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for node in 1..=3 {
        let peak = node_peak_rss(&cluster, node, false);
        eprintln!("node{node}: peak resident memory {} MB", peak >> 20);
        assert!(
            peak < BUDGET + (300 << 20),
            "node{node}'s peak resident memory, {} MB, passed its 2 GB + 300 MB",
            peak >> 20
        );
    }
}
