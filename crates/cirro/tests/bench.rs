//! `cirro bench`, the benchmark harness, on tiny data: its own unit tests
//! (result comparison, the correctness guard, timeouts, report and plots, in
//! `bench/tests`), then the real command end to end on TPC-H SF 0.01 with
//! DuckDB, DataFusion and Polars, and a deliberately wrong Cirro result that
//! the run must catch and fail on. The first run creates the harness's
//! Python environment (~/.cache/cirro/bench-venv, pinned peers).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::common::{DataDir, cirro_bin, sql_ok_at};

fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench")
}

/// The harness's Python, made once for all tests here.
fn bench_python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .arg(bench_dir().join("bootstrap.py"))
            .arg("--setup-only")
            .output()
            .expect("run bench/bootstrap.py");
        assert!(
            out.status.success(),
            "bootstrap failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    })
}

fn cirro_bench(args: &[&str]) -> Output {
    bench_python(); // the environment exists before the command runs
    Command::new(cirro_bin())
        .arg("bench")
        .args(args)
        .env_remove("CIRRO_DATA")
        .output()
        .expect("run cirro bench")
}

#[test]
fn harness_unit_tests() {
    let out = Command::new(bench_python())
        .args(["-m", "unittest", "discover", "-s"])
        .arg(bench_dir().join("tests"))
        .env("PYTHONPATH", bench_dir())
        .output()
        .expect("run the harness tests");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("OK"), "{stderr}");
}

#[test]
fn tpch_end_to_end_with_peers_and_a_wrong_result_caught() {
    let work = DataDir::new();
    let out_dir = work.path().join("results");
    let data_dir = work.path().join("data");
    let (out_s, data_s) = (out_dir.to_str().unwrap(), data_dir.to_str().unwrap());
    let common = [
        "--sf",
        "0.01",
        "--threads",
        "2",
        "--runs",
        "1",
        "--starts",
        "1",
        "--out",
        out_s,
        "--data-dir",
        data_s,
    ];
    let mut args = vec!["tpch"];
    args.extend(common);
    // Over the PostgreSQL protocol here (the wrong-result run below uses
    // Flight SQL), beside both DuckDB releases.
    args.extend([
        "--peers",
        "duckdb,duckdb2-db,datafusion,polars",
        "--queries",
        "q01,q06,q13,q14",
        "--wire",
        "pg",
    ]);
    let out = cirro_bench(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");

    let report = std::fs::read_to_string(out_dir.join("report.md")).expect("report.md");
    assert!(
        report.contains(
            "Cirro's result equals DuckDB's, value by value, on 4 of 4 queries, on every run of \
             each, cold and hot (8 answers compared)"
        ),
        "{report}"
    );
    for needle in [
        "## Totals",
        "| q01 |",
        "| q14 |",
        "polars",
        "datafusion",
        "## Physical limit",
        "duckdb2-db 2.",
        "over the PostgreSQL protocol",
    ] {
        assert!(report.contains(needle), "{needle} missing: {report}");
    }
    for png in ["queries.png", "ratio.png"] {
        let bytes = std::fs::read(out_dir.join(png)).expect(png);
        assert!(bytes.starts_with(b"\x89PNG"), "{png} is not a PNG");
    }
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    for engine in ["cirro", "duckdb", "duckdb2-db", "datafusion", "polars"] {
        let median = &results["queries"]["q06"]["engines"][engine]["median"];
        assert!(
            median.as_f64().is_some_and(|m| m > 0.0),
            "{engine}: {median}"
        );
    }
    assert!(
        results["probe"]["bandwidth_bytes_per_s"]
            .as_f64()
            .is_some_and(|b| b > 1e8),
        "{}",
        results["probe"]
    );

    // Cirro now reads other data than the peers: its lineitem changes (new
    // files; the Parquet files the peers read stay as they were).
    let cirro_data = data_dir.join("tpch-sf0.01/cirro");
    sql_ok_at(
        &cirro_data,
        "UPDATE lineitem SET l_quantity = l_quantity + 1 WHERE l_orderkey < 1000",
    );
    // Two starts (the last --starts counts): two server processes, each
    // running both queries.
    let mut args = vec!["tpch"];
    args.extend(common);
    args.extend(["--peers", "duckdb", "--queries", "q01,q13", "--no-probe"]);
    args.extend(["--starts", "2"]);
    let out = cirro_bench(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    let pids = results["pids"]["cirro"].as_array().expect("pids");
    assert!(
        pids.len() == 2 && pids[0] != pids[1] && pids[0].as_u64().is_some(),
        "{pids:?}"
    );
    let q13 = &results["queries"]["q13"];
    assert_eq!(q13["starts"].as_array().map(Vec::len), Some(2), "{q13}");
    assert!(
        q13["check"]
            .as_str()
            .is_some_and(|c| c.contains("every run (2 of 2)")),
        "{q13}"
    );
    assert!(
        stderr.contains("CORRECTNESS FAILURE: q01 cirro vs duckdb"),
        "{stderr}"
    );
    assert!(!stderr.contains("q13 cirro vs duckdb"), "{stderr}");
    let report = std::fs::read_to_string(out_dir.join("report.md")).expect("report.md");
    assert!(report.contains("CORRECTNESS FAILURE"), "{report}");
}

/// Issue 59's TPC-H with small writes waiting in the row store, at SF
/// 0.01: 3,000 inserts, updates and deletes by key of lineitem and orders
/// from 4 clients stay in the row stores (the harness fails the run if
/// either table's Delta log gets a commit), and every answer of the 22
/// queries, before the writes and after, equals DuckDB's on the same
/// changes (the harness fails the run on any difference).
#[test]
fn tpch_answers_with_small_writes_pending_equal_duckdb() {
    let work = DataDir::new();
    let out_dir = work.path().join("results");
    let data_dir = work.path().join("data");
    let out = cirro_bench(&[
        "pending",
        "--sf",
        "0.01",
        "--changes",
        "3000",
        "--starts",
        "1",
        "--runs",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("results.json")).expect("results.json"),
    )
    .expect("json");
    assert_eq!(doc["changes"], 3000);
    assert_eq!(doc["failures"].as_array().map(Vec::len), Some(0), "{doc}");
    let pending = &doc["starts"][0]["pending"];
    for q in 1..=22 {
        let times = pending[format!("q{q:02}")].as_array().map(Vec::len);
        assert_eq!(times, Some(1), "q{q:02} was not timed (and checked): {doc}");
    }
    let report = std::fs::read_to_string(out_dir.join("report.md")).expect("report.md");
    assert!(report.contains("| **total** |"), "{report}");
}

#[test]
fn unknown_suite_and_peer_are_refused() {
    let out = cirro_bench(&["nosuch"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown suite"));
    let out = cirro_bench(&["tpch", "--peers", "oracle"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown peer 'oracle'"));
}

/// `cirro bench cluster ARGS --sf 0.01 --runs 1`, which must succeed, into a
/// scratch directory (results in `results/`): the directory and the
/// results.
fn cluster_bench_at_sf_001(args: &[&str]) -> (DataDir, serde_json::Value) {
    let work = DataDir::new();
    let out_dir = work.path().join("results");
    let data_dir = work.path().join("data");
    let mut all = vec!["cluster"];
    all.extend_from_slice(args);
    all.extend([
        "--sf",
        "0.01",
        "--runs",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    let out = cirro_bench(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("results.json")).expect("results.json"),
    )
    .expect("json");
    (work, results)
}

/// `cirro bench cluster` end to end on TPC-H SF 0.01 over the PostgreSQL
/// protocol: `cirro serve` alone, a 1-node and a 3-node cluster by
/// `scripts/cluster`, every answer checked against DuckDB's (a wrong one
/// fails the run), and rows crossing between the nodes in the shuffle
/// benchmark on two and three nodes, with the links as they are and
/// limited, with the worker RPC measured over the same links. (The figures
/// over several starts are the harness tests'.)
#[test]
fn cluster_suite_end_to_end() {
    let (work, results) = cluster_bench_at_sf_001(&[
        "--wire",
        "pg",
        "--starts",
        "1",
        "--rpc-sizes",
        "1024,1048576",
    ]);
    let out_dir = work.path().join("results");
    for setup in ["alone", "1", "3"] {
        let queries = results["tpch"][setup]["queries"]
            .as_object()
            .expect("queries");
        assert_eq!(queries.len(), 22, "{setup}");
        for (id, r) in queries {
            assert!(r["median"].as_f64().is_some(), "{setup} {id}: {r}");
        }
        let pids = results["tpch"][setup]["starts"][0]["pids"]
            .as_array()
            .expect("pids");
        let want = if setup == "3" { 3 } else { 1 };
        assert_eq!(pids.len(), want, "{setup}: {pids:?}");
    }
    // On two nodes rows cross between them, both sides shuffled; on one,
    // nothing does.
    for kind in ["even", "random", "skewed"] {
        let two = &results["shuffle"]["2"][kind];
        assert_eq!(two["exchange"], "shuffle", "{kind}: {two}");
        assert!(
            two["between_bytes"].as_u64().unwrap_or(0) > 0,
            "{kind}: {two}"
        );
        assert_eq!(results["shuffle"]["1"][kind]["exchange"], "none");
        // On 3 nodes too, and with the links limited (scripts/cluster rate).
        assert!(results["shuffle"]["3"][kind]["median"].as_f64().is_some());
        for rate in ["10gbit", "1gbit"] {
            for nodes in ["2", "3"] {
                let limited = &results["shuffle"]["links"][rate][nodes][kind];
                assert!(
                    limited["median"].as_f64().is_some(),
                    "{rate} {nodes} {kind}: {limited}"
                );
            }
        }
    }
    // The worker RPC from node 1 to each other node, at each link speed:
    // both sizes echoed and sunk; a 1 MB round trip is slower than a 1 KB
    // one, and under 1 Gb/s (125 MB/s) 1 MB messages cannot go faster.
    for link in ["as is", "10gbit", "1gbit"] {
        for (nodes, peers) in [("2", vec!["node2"]), ("3", vec!["node2", "node3"])] {
            let measured = results["rpc"][link][nodes].as_array().expect("rpc");
            let names: Vec<_> = measured.iter().map(|p| p["node"].as_str()).collect();
            assert_eq!(names, peers.iter().map(|p| Some(*p)).collect::<Vec<_>>());
            for peer in measured {
                let sizes = peer["sizes"].as_array().expect("sizes");
                let at = |i: usize, key: &str| sizes[i][key].as_f64().unwrap_or(0.0);
                assert_eq!(sizes.len(), 2, "{link} {nodes}: {peer}");
                assert!(at(0, "round_trip_us") > 0.0, "{link} {nodes}: {peer}");
                assert!(
                    at(1, "round_trip_us") > at(0, "round_trip_us"),
                    "{link} {nodes}: {peer}"
                );
                assert!(at(1, "mb_per_s") > 0.0, "{link} {nodes}: {peer}");
                if link == "1gbit" {
                    assert!(at(1, "mb_per_s") < 140.0, "{link} {nodes}: {peer}");
                }
            }
        }
    }
    let report = std::fs::read_to_string(out_dir.join("report.md")).expect("report");
    assert!(report.contains("| total (s), median (range) |"), "{report}");
    assert!(report.contains("| 1 / alone | 3 / 1 |"), "{report}");
    assert!(
        report.contains("| link | nodes | to | 1 KB | 1 MB |"),
        "{report}"
    );
    assert!(out_dir.join("cluster.png").exists());
}

/// `cirro bench cluster --scaling` end to end on TPC-H SF 0.01: 1, 2 and 3
/// nodes, unbucketed and bucketed, every answer checked against DuckDB's;
/// the bytes exchanged are recorded (on one node nothing is exchanged), the
/// model is fitted and the report and plot written.
#[test]
fn cluster_scaling_end_to_end() {
    let (work, doc) = cluster_bench_at_sf_001(&["--scaling"]);
    let out_dir = work.path().join("results");
    let mut exchanged_on_three = 0;
    for nodes in ["1", "2", "3"] {
        for variant in ["unbucketed", "bucketed"] {
            let queries = doc["results"][nodes][variant].as_object().expect("queries");
            assert_eq!(queries.len(), 22, "{nodes} node(s), {variant}");
            for (id, r) in queries {
                assert!(
                    r["median"].as_f64().is_some(),
                    "{nodes} {variant} {id}: {r}"
                );
                let moved = r["exchanged_bytes"].as_u64().expect("exchanged bytes");
                if nodes == "1" {
                    assert_eq!(moved, 0, "{variant} {id}: exchanged on one node");
                } else if nodes == "3" {
                    exchanged_on_three += moved;
                }
            }
        }
    }
    assert!(exchanged_on_three > 0, "nothing crossed between 3 nodes");
    assert!(
        doc["model"]["points"].as_u64().unwrap_or(0) > 0,
        "{}",
        doc["model"]
    );
    let report = std::fs::read_to_string(out_dir.join("report.md")).expect("report");
    assert!(report.contains("## The model"), "{report}");
    assert!(out_dir.join("scaling.png").exists());
}
