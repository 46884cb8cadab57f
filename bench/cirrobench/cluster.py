"""`cirro bench cluster`: what distribution costs and carries.

tpch     TPC-H (--sf, default 1) on a cluster of 1 node and of 3 nodes
         started by `scripts/cluster up --storage local` on this machine: the
         same cores either way, so the ratio is the price of cutting queries
         into stages and moving rows between processes, not a speed-up.
         Loaded through node 1 (CREATE TABLE … AS over the suite's Parquet
         files), queried through node 1 over Arrow Flight SQL (ADBC), the
         default task sizes; cold run, then --runs hot runs, median. Every
         run's result, cold and hot, is compared with DuckDB's on the same
         files.

shuffle  rows moved between two nodes by a hash shuffle, the OSU HiBD
         micro-benchmark idea: a join of a(k, v) of N rows with b(k, v) of
         M = N/10 unique keys, both hash-partitioned on k across the two nodes,
         with a's keys evenly spread (k = i mod M), random, or skewed (half the
         rows on one key); on 2 nodes scans are cut into tasks of 1 MB × sf, so
         that both sides are spread and shuffled however well they compress. Throughput = rows (and bytes, 16 per row) of both
         sides over the query's time, on 2 nodes and, for scale, the same join
         on 1 node (nothing crosses a network).

Output: results/cluster-sf<N>/results.json, report.md, cluster.png.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import compare, data, engines, suites  # noqa: E402
from .runner import machine  # noqa: E402
from .wire import finish_report  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster"
SHUFFLE_ROWS = 10_000_000


class Cluster:
    """`scripts/cluster up --nodes N` in a scratch directory, and a Flight SQL
    connection to node 1."""

    def __init__(self, nodes, cirro_bin):
        self.dir = tempfile.mkdtemp(prefix=f"cirro-bench-cluster{nodes}-")
        env = {**os.environ, "CIRRO_BIN": cirro_bin}
        out = subprocess.run([str(SCRIPT), "up", "--nodes", str(nodes), "--storage", "local", "--dir", self.dir],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            subprocess.run([str(SCRIPT), "down", "--dir", self.dir], capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise SystemExit(f"cirro bench: scripts/cluster up failed:\n{out.stdout}\n{out.stderr}")
        self.nodes = nodes
        flight = [line.split("flight=")[1].split()[0] for line in out.stdout.splitlines()
                  if line.startswith("node")]
        password = Path(self.dir, "password").read_text().strip()
        import adbc_driver_flightsql.dbapi as flightsql

        self.conn = flightsql.connect(f"grpc://{flight[0]}", db_kwargs={"username": "cirro", "password": password},
                                      autocommit=True)

    def run(self, sql):
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetch_arrow_table()

    def timed(self, sql):
        start = time.perf_counter()
        table = self.run(sql)
        return time.perf_counter() - start, table

    def close(self):
        try:
            self.conn.close()
        finally:
            subprocess.run([str(SCRIPT), "down", "--dir", self.dir], capture_output=True)
            # The loaded tables and logs (hundreds of MB at SF 1) go too.
            shutil.rmtree(self.dir, ignore_errors=True)


def run_tpch(args, tables, queries, reference):
    results = {}
    for nodes in (1, 3):
        print(f"cirro bench cluster: TPC-H SF{args.sf:g} on {nodes} node(s)", file=sys.stderr, flush=True)
        cluster = Cluster(nodes, args.cirro)
        try:
            start = time.perf_counter()
            for name, path in tables.items():
                cluster.run(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{path}/')")
            load = time.perf_counter() - start
            per_query = {}
            for q in queries:
                runs = []
                try:
                    for r in range(args.runs + 1):
                        seconds, table = cluster.timed(q.sql)
                        runs.append(seconds)
                        # every timed answer, cold and hot
                        compare.compare(table, reference[q.id], f"{q.id} on {nodes} node(s), run {r}")
                        del table
                    per_query[q.id] = {"cold": runs[0], "hot": runs[1:], "median": statistics.median(runs[1:])}
                except compare.Mismatch as e:
                    per_query[q.id] = {"error": f"wrong answer: {e}"}
                except Exception as e:  # noqa: BLE001 (recorded, reported)
                    per_query[q.id] = {"error": str(e).splitlines()[0][:300]}
                print(f"  {q.id}: {per_query[q.id].get('median', per_query[q.id].get('error'))}",
                      file=sys.stderr, flush=True)
            results[str(nodes)] = {"load_seconds": load, "queries": per_query}
        finally:
            cluster.close()
    return results


SHUFFLE_KEYS = {
    "even": "i % {m}",
    "random": "CAST(floor(random() * {m}) AS BIGINT)",
    "skewed": "CASE WHEN random() < 0.5 THEN 0 ELSE CAST(floor(random() * {m}) AS BIGINT) END",
}


def run_shuffle(args):
    n = int(SHUFFLE_ROWS * args.sf)
    m = max(n // 10, 1)
    results = {}
    for nodes in (1, 2):
        print(f"cirro bench cluster: shuffle on {nodes} node(s)", file=sys.stderr, flush=True)
        cluster = Cluster(nodes, args.cirro)
        try:
            cluster.run(f"CREATE TABLE b AS SELECT CAST(value AS BIGINT) AS k, CAST(value AS BIGINT) AS v "
                        f"FROM generate_series(0, {m - 1})")
            if nodes > 1:
                # Tasks of 1 MB of Parquet: both sides spread over the nodes
                # however well their keys compress.
                task_bytes = max(4096, int(1_048_576 * args.sf))
                cluster.run(f"SET distributed.file_scan_config_bytes_per_partition = {task_bytes}")
            per_kind = {}
            for kind, key in SHUFFLE_KEYS.items():
                cluster.run("DROP TABLE IF EXISTS a")
                cluster.run(f"CREATE TABLE a AS SELECT {key.format(m=m)} AS k, i AS v "
                            f"FROM (SELECT CAST(value AS BIGINT) AS i FROM generate_series(1, {n}))")
                sql = "SELECT count(*), sum(a.v + b.v) FROM a JOIN b ON a.k = b.k"
                expected = cluster.run("SELECT count(*) FROM a WHERE k >= 0 AND k < %d" % m).column(0)[0].as_py()
                runs = []
                for _ in range(args.runs + 1):
                    seconds, table = cluster.timed(sql)
                    runs.append(seconds)
                    got = table.column(0)[0].as_py()
                    if got != expected:
                        raise SystemExit(f"cirro bench: shuffle {kind} on {nodes} node(s): {got} rows joined, "
                                         f"expected {expected}")
                plan = str(cluster.run(f"EXPLAIN {sql}").to_pylist())
                # What crossed between nodes: hash shuffles, or (for a small
                # b) a broadcast of it.
                exchange = ("shuffle" if "NetworkShuffleExec" in plan
                            else "broadcast" if "NetworkBroadcastExec" in plan else "none")
                median = statistics.median(runs[1:])
                rows = n + m
                per_kind[kind] = {"rows": rows, "bytes": rows * 16, "median": median, "hot": runs[1:],
                                  "cold": runs[0], "rows_per_s": rows / median, "mb_per_s": rows * 16 / median / 1e6,
                                  "exchange": exchange}
                print(f"  {kind}: {median:.3f} s, {rows / median / 1e6:.1f} M rows/s, exchange={exchange}",
                      file=sys.stderr, flush=True)
            results[str(nodes)] = per_kind
        finally:
            cluster.close()
    return results


def tpch_with_answers(args):
    """TPC-H at --sf (--queries of it), generated or reused: the queries, the
    tables' Parquet directories, the data's facts and DuckDB's answers."""
    if not args.cirro or not Path(args.cirro).exists():
        sys.exit("cirro bench: the cirro binary is unknown: run through `cirro bench` or pass --cirro")
    suite, make_tables, make_queries = suites.get("tpch")
    queries = make_queries(args.sf)
    if args.queries:
        queries = [q for q in queries if q.id in args.queries.split(",")]
    root = args.data_dir / f"tpch-sf{args.sf:g}"
    _, tables, facts = data.prepare(suite, make_tables, args.sf, root, args.cirro, args.threads)
    duck = engines.DuckDB(engines.Context(tables, args.threads, root))
    reference = {q.id: duck.run(q.sql) for q in queries}
    duck.close()
    return queries, tables, facts, reference


def main(args, out):
    if args.report_only:
        doc = json.loads((out / "results.json").read_text())
        print(report(doc, out))
        return 0
    queries, tables, facts, reference = tpch_with_answers(args)
    doc = {"command": " ".join(args.argv), "machine": machine(), "sf": args.sf, "runs": args.runs,
           "parquet_bytes": facts.get("parquet_bytes"),
           "tpch": run_tpch(args, tables, queries, reference), "shuffle": run_shuffle(args)}
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    path = report(doc, out)
    print(f"cirro bench: report {path}", file=sys.stderr)
    errors = [f"{n} node(s) {q}: {r['error']}" for n, res in doc["tpch"].items()
              for q, r in res["queries"].items() if "error" in r]
    if errors:
        print("cirro bench: FAILED:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    return 0


def _exchange(r):
    """What crossed between nodes (results of before "exchange" say
    network_shuffle)."""
    if "exchange" in r:
        return r["exchange"]
    return "shuffle" if r.get("network_shuffle") else "none"


def _geomean(values):
    values = [v for v in values if v > 0]
    return statistics.geometric_mean(values) if values else float("nan")


def report(doc, out):
    one, three = doc["tpch"]["1"]["queries"], doc["tpch"]["3"]["queries"]
    ids = sorted(one)
    both = [q for q in ids if "median" in one[q] and "median" in three.get(q, {})]
    total1 = sum(one[q]["median"] for q in both)
    total3 = sum(three[q]["median"] for q in both)
    ratios = [three[q]["median"] / one[q]["median"] for q in both]
    lines = [f"# Cluster: TPC-H SF{doc['sf']:g} on 1 and 3 nodes, shuffle throughput", "",
             f"`{doc['command']}` — {doc['machine'].get('cpu', '?')}, {doc['machine'].get('cpus')} cores, "
             f"{doc['machine'].get('memory_gib')} GiB; every node on this machine (the same cores: "
             "this measures the cost of distribution, not a speed-up). Medians of "
             f"{doc['runs']} hot runs through node 1 over Flight SQL; answers checked against DuckDB.", "",
             "## TPC-H", "",
             f"| | 1 node | 3 nodes | 3 / 1 |", "|---|---:|---:|---:|",
             f"| total of medians (s) | {total1:.2f} | {total3:.2f} | {total3 / total1:.2f} |",
             f"| geometric mean of per-query ratios | | | {_geomean(ratios):.2f} |",
             f"| load through node 1 (s) | {doc['tpch']['1']['load_seconds']:.1f} | "
             f"{doc['tpch']['3']['load_seconds']:.1f} | |", "",
             "| query | 1 node (s) | 3 nodes (s) | 3 / 1 |", "|---|---:|---:|---:|"]
    for q in ids:
        a, b = one[q], three.get(q, {})
        if "median" in a and "median" in b:
            lines.append(f"| {q} | {a['median']:.3f} | {b['median']:.3f} | {b['median'] / a['median']:.2f} |")
        else:
            lines.append(f"| {q} | {a.get('median', a.get('error'))} | {b.get('median', b.get('error'))} | |")
    lines += ["", "## Shuffle (join of a: N rows with b: N/10 unique keys, hash-partitioned on the key)", "",
              "| keys | nodes | rows | time (s) | M rows/s | MB/s | between nodes |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for nodes, kinds in doc["shuffle"].items():
        for kind, r in kinds.items():
            lines.append(f"| {kind} | {nodes} | {r['rows']:,} | {r['median']:.3f} | {r['rows_per_s'] / 1e6:.1f} | "
                         f"{r['mb_per_s']:.0f} | {_exchange(r)} |")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    x = range(len(both))
    axes[0].bar([i - 0.2 for i in x], [one[q]["median"] for q in both], 0.4, label="1 node", color="#1f77b4")
    axes[0].bar([i + 0.2 for i in x], [three[q]["median"] for q in both], 0.4, label="3 nodes", color="#d62728")
    axes[0].set_xticks(list(x), both, rotation=90)
    axes[0].set_ylabel("seconds (median)")
    axes[0].set_title(f"TPC-H SF{doc['sf']:g}, same machine")
    kinds = list(SHUFFLE_KEYS)
    for j, nodes in enumerate(sorted(doc["shuffle"])):
        axes[1].bar([i + (j - 0.5) * 0.4 for i in range(len(kinds))],
                    [doc["shuffle"][nodes][k]["rows_per_s"] / 1e6 for k in kinds], 0.4, label=f"{nodes} node(s)")
    axes[1].set_xticks(range(len(kinds)), kinds)
    axes[1].set_ylabel("M rows/s through the join")
    axes[1].set_title("hash shuffle throughput")
    axes[1].legend()
    return finish_report(fig, axes, lines, out, plot="cluster.png")
