"""`cirro bench cluster`: what distribution costs and carries.

tpch     TPC-H (--sf, default 1) on `cirro serve` alone (the baseline) and
         on clusters of 1 node and of 3 nodes started by `scripts/cluster up
         --storage local` on this machine: the same cores either way, so the
         ratios are the price of cutting queries into stages and moving rows
         between processes, not a speed-up. Each node runs --threads threads;
         a setup's processes share 60 % of the machine's memory (at most
         16 GiB) evenly, so each node's hot-data tier is its share of the
         single server's. Every setup is started --starts times afresh; each
         start loads the tables (CREATE TABLE … AS over the suite's Parquet
         files, through node 1) and runs every query cold, then --runs hot
         runs, over --wire (Flight SQL, or pg: the PostgreSQL protocol). A
         query's figure is the median over the starts of each start's median,
         with their range. Every run's result, cold and hot, is compared with
         DuckDB's on the same files. --setups picks what runs.

shuffle  rows moved between nodes by a hash shuffle, the OSU HiBD
         micro-benchmark idea: a join of a(k, v) of N rows with b(k, v) of
         M = N/10 unique keys, both hash-partitioned on k across the nodes,
         with a's keys evenly spread (k = i mod M), random, or skewed (half the
         rows on one key), the join kept partitioned (no broadcast of b, which
         the planner would choose); on 2 and 3 nodes scans are cut into tasks of 1 MB × sf, so
         that both sides are spread and shuffled however well they compress. Throughput = rows (and bytes, 16 per row) of both
         sides over the query's time, on 2 and 3 nodes with their links as they
         are and limited to 10 Gb/s and to 1 Gb/s each way (`scripts/cluster
         rate`: tc's token bucket on every node's veth, rate only), and, for
         scale, the same join on 1 node (nothing crosses a network). The bytes
         EXPLAIN ANALYZE counts between the nodes are reported beside.
         With the same clusters and links: the worker RPC from node 1 to
         each other node's worker (`cirro admin rpc-bench`: the median round
         trip of a message echoed and the throughput of messages sent 4 at a
         time, 1 KB to 16 MB, or --rpc-sizes).

aggregation  grouped aggregations on 3 nodes over g(k10, k10000, k, v) of
         10 M × sf rows (v = i, k10 = i mod 10, k10000 = i mod 10,000, k = i):
         10, 10,000 and 10 M × sf groups, each with `SET aggregation_exchange`
         auto (Cirro's choice), partial (pre-aggregated on every node before
         the shuffle) and rows (rows shuffled to a single-phase aggregation);
         the time (median of --runs hot runs, the three taking turns run by
         run, each answer checked), the
         choice EXPLAIN shows and the bytes EXPLAIN ANALYZE counts between
         the nodes. Scans are cut into tasks of 4 MB × sf so that every node
         reads a share.

cache    the hot-data tier's chunk hit ratio pass by pass over a TPC-H stream
         (the queries in one shuffled order, CACHE_PASSES times, every answer
         checked) on `cirro serve` alone and on 3 nodes, each with its share
         of the memory: cache affinity sends each file range to the same node
         every time, so the cluster's second pass hits as the single server's
         does (`cirro.cache` of every node, hits and misses per pass).

Output: results/cluster-sf<N>/results.json, report.md, cluster.png.
"""

import json
import os
import random
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
from .runner import keep_earlier, machine  # noqa: E402
from .wire import finish_report  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cluster"
SHUFFLE_ROWS = 10_000_000
AGGREGATION_ROWS = 10_000_000
# The aggregation comparison's group keys (their groups: 10, 10⁴ and the rows).
AGGREGATION_KEYS = {"10": "k10", "10^4": "k10000", "rows": "k",
                    # Text keys: no value range estimates their groups, a
                    # sampling run before execution does.
                    "10 (text)": "t10", "10^4 (text)": "t10000", "rows (text)": "t"}
EXCHANGES = ("auto", "partial", "rows")


# The setups of the TPC-H comparison: `cirro serve` alone (the baseline
# that a node of a cluster must match) and clusters of 1 and 3 nodes.
SETUPS = ("alone", "1", "3")
SETUP_NAMES = {"alone": "cirro serve alone", "1": "1 node", "2": "2 nodes", "3": "3 nodes"}


def setup_memory():
    """The memory of all of a setup's Cirro processes together: 60 % of
    this machine's, at most 16 GiB, split evenly between a cluster's nodes
    (each node's hot-data tier, 30 % of its limit, is then that share of the
    single server's)."""
    return min(16 << 30, int(engines.memory_bytes() * 0.6))


def _size(nbytes):
    return f"{nbytes >> 20}MB"


class Alone:
    """`cirro serve` alone on an empty data location of its own (the
    tables are loaded into it as into a cluster's)."""

    def __init__(self, cirro_bin, wire, threads, memory):
        self.dir = tempfile.mkdtemp(prefix="cirro-bench-alone-")
        ctx = engines.Context({}, threads, self.dir, cirro_bin, self.dir, wire)
        ctx.cirro_env = {"CIRRO_MEMORY_LIMIT": _size(memory)}
        try:
            self.server = engines.Cirro(ctx)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        self.pids = [self.server.pid]

    def run(self, sql):
        return self.server.run(sql)

    def timed(self, sql):
        start = time.perf_counter()
        table = self.run(sql)
        return time.perf_counter() - start, table

    def close(self):
        try:
            self.server.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class Cluster(Alone):
    """`scripts/cluster up --nodes N` in a scratch directory (each node
    with `threads` threads and `memory` / N of memory), and a connection to
    node 1 over `wire`."""

    def __init__(self, nodes, cirro_bin, wire="flight", threads=None, memory=None):
        self.dir = tempfile.mkdtemp(prefix=f"cirro-bench-cluster{nodes}-")
        env = {**os.environ, "CIRRO_BIN": cirro_bin}
        if threads:
            env["CIRRO_THREADS"] = str(threads)
        if memory:
            env["CIRRO_MEMORY_LIMIT"] = _size(memory // nodes)
        out = subprocess.run([str(SCRIPT), "up", "--nodes", str(nodes), "--storage", "local", "--dir", self.dir],
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            subprocess.run([str(SCRIPT), "down", "--dir", self.dir], capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise SystemExit(f"cirro bench: scripts/cluster up failed:\n{out.stdout}\n{out.stderr}")
        self.nodes = nodes
        self.cirro_bin = cirro_bin
        first = [line for line in out.stdout.splitlines() if line.startswith("node")][0]
        address = first.split(f"{wire}=")[1].split()[0]
        self.http = first.split("http=")[1].split()[0]
        host, port = address.rsplit(":", 1)
        password = Path(self.dir, "password").read_text().strip()
        self.password = password
        self.pids = [int(Path(self.dir, f"node{i}", "pid").read_text().split()[0]) for i in range(1, nodes + 1)]
        try:
            self.client = engines.Connection(wire, host, int(port), password)
        except BaseException:
            self._down()
            raise

    def run(self, sql):
        return self.client.run(sql)

    def rpc_bench(self, sizes=""):
        """The worker RPC micro-benchmark from node 1 (`cirro admin
        rpc-bench`): per other node {node, worker, sizes: [{bytes,
        round_trip_us, round_trips, messages, mb_per_s}]}."""
        command = [self.cirro_bin, "admin", "--url", f"http://{self.http}", "--json", "rpc-bench"]
        if sizes:
            command += ["--sizes", sizes]
        out = subprocess.run(command, capture_output=True, text=True, timeout=900,
                             env={**os.environ, "CIRRO_PASSWORD": self.password, "CIRRO_USER": "cirro"})
        if out.returncode != 0:
            raise SystemExit(f"cirro bench: cirro admin rpc-bench failed:\n{out.stdout}\n{out.stderr}")
        return json.loads(out.stdout)["to"]

    def _down(self):
        subprocess.run([str(SCRIPT), "down", "--dir", self.dir], capture_output=True)
        # The loaded tables and logs (hundreds of MB at SF 1) go too.
        shutil.rmtree(self.dir, ignore_errors=True)

    def close(self):
        try:
            self.client.close()
        finally:
            self._down()


def start_setup(setup, args):
    """A fresh start of one of SETUPS."""
    if setup == "alone":
        return Alone(args.cirro, args.wire, args.threads, setup_memory())
    return Cluster(int(setup), args.cirro, args.wire, args.threads, setup_memory())


# --bucketed: the hash distribution of the tables (also the scaling run's
# bucketed layout): lineitem and orders by order key, partsupp and part by
# part key, in a multiple of the partitions of 1, 2 and 3 tasks of 2 cores.
BUCKETS = 12
BUCKETED = {"lineitem": "l_orderkey", "orders": "o_orderkey", "partsupp": "ps_partkey", "part": "p_partkey"}


def create_table(name, path, bucketed):
    """The statement that loads table `name` from its Parquet directory,
    hash-distributed by its key of BUCKETED where `bucketed`."""
    key = BUCKETED.get(name) if bucketed else None
    clause = f" DISTRIBUTED BY HASH ({key}) BUCKETS {BUCKETS}" if key else ""
    return f"CREATE TABLE {name}{clause} AS SELECT * FROM read_parquet('{path}/')"


def run_start(target, tables, queries, reference, runs, label, bucketed=False):
    """Load the tables through `target` (CREATE TABLE … AS over the
    Parquet files, hash-distributed where `bucketed`) and run every query
    cold and `runs` times hot, every answer compared with `reference`'s."""
    start = time.perf_counter()
    for name, path in tables.items():
        target.run(create_table(name, path, bucketed))
    load = time.perf_counter() - start
    per_query = {}
    for q in queries:
        times = []
        try:
            for r in range(runs + 1):
                seconds, table = target.timed(q.sql)
                times.append(seconds)
                # every timed answer, cold and hot
                compare.compare(table, reference[q.id], f"{q.id} on {label}, run {r}")
                del table
            per_query[q.id] = {"cold": times[0], "hot": times[1:], "median": statistics.median(times[1:] or times)}
        except compare.Mismatch as e:
            per_query[q.id] = {"error": f"wrong answer: {e}"}
        except Exception as e:  # noqa: BLE001 (recorded, reported)
            per_query[q.id] = {"error": str(e).splitlines()[0][:300]}
        print(f"  {q.id}: {per_query[q.id].get('median', per_query[q.id].get('error'))}",
              file=sys.stderr, flush=True)
    return {"pids": target.pids, "load_seconds": load, "queries": per_query}


def summarize(starts):
    """One setup's figures over its fresh starts: per query the median of
    the starts' medians with their range (an error in any start is the
    query's error); the 22-query total of each start over the queries that
    every start answered, their median and range."""
    ids = list(starts[0]["queries"])
    queries = {}
    for q in ids:
        recs = [s["queries"][q] for s in starts]
        errors = [r["error"] for r in recs if "error" in r]
        if errors:
            queries[q] = {"error": errors[0], "failed_starts": len(errors)}
            continue
        medians = [r["median"] for r in recs]
        queries[q] = {"median": statistics.median(medians), "min": min(medians), "max": max(medians),
                      "starts": medians, "cold": statistics.median(r["cold"] for r in recs)}
    answered = [q for q in ids if "median" in queries[q]]
    totals = [sum(s["queries"][q]["median"] for q in answered) for s in starts]
    return {"queries": queries, "starts": starts, "totals": totals,
            "total": statistics.median(totals) if totals else None,
            "load_seconds": statistics.median(s["load_seconds"] for s in starts)}


def run_tpch(args, tables, queries, reference, setups=SETUPS, make_setup=start_setup):
    results = {}
    for setup in setups:
        starts = []
        for n in range(args.starts):
            print(f"cirro bench cluster: TPC-H SF{args.sf:g}, {SETUP_NAMES[setup]}, start {n + 1}/{args.starts}",
                  file=sys.stderr, flush=True)
            target = make_setup(setup, args)
            try:
                starts.append(run_start(target, tables, queries, reference, args.runs, SETUP_NAMES[setup],
                                        getattr(args, "bucketed", False)))
            finally:
                target.close()
        results[setup] = summarize(starts)
    return results


SHUFFLE_KEYS = {
    "even": "i % {m}",
    "random": "CAST(floor(random() * {m}) AS BIGINT)",
    "skewed": "CASE WHEN random() < 0.5 THEN 0 ELSE CAST(floor(random() * {m}) AS BIGINT) END",
}


# Link speeds of the shuffle setup beyond the links as they are.
LINK_RATES = ("10gbit", "1gbit")


def limit_links(cluster, rate):
    """Every node's link limited to `rate` each way (None: as it is)."""
    for i in range(1, cluster.nodes + 1):
        out = subprocess.run([str(SCRIPT), "rate", str(i), "--rate", rate or "off", "--dir", cluster.dir],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"cirro bench: scripts/cluster rate failed:\n{out.stdout}\n{out.stderr}")


def run_shuffle(args, rpc):
    """The shuffle figures (see the module docs): {nodes: {keys: record}}
    with the links as they are, and under "links" {rate: {nodes: {keys:
    record}}} for the limited ones. The worker RPC's go into `rpc`: {link:
    {nodes: [per other node]}}, link "as is" or a rate."""
    n = int(SHUFFLE_ROWS * args.sf)
    m = max(n // 10, 1)
    results = {"links": {rate: {} for rate in LINK_RATES}}
    for nodes in (1, 2, 3):
        print(f"cirro bench cluster: shuffle on {nodes} node(s)", file=sys.stderr, flush=True)
        cluster = Cluster(nodes, args.cirro, args.wire, args.threads, setup_memory())
        try:
            cluster.run(f"CREATE TABLE b AS SELECT CAST(value AS BIGINT) AS k, CAST(value AS BIGINT) AS v "
                        f"FROM generate_series(0, {m - 1})")
            if nodes > 1:
                # Tasks of 1 MB of Parquet: both sides spread over the nodes
                # however well their keys compress.
                task_bytes = max(4096, int(1_048_576 * args.sf))
                cluster.run(f"SET distributed.file_scan_config_bytes_per_partition = {task_bytes}")
            # Both sides hash-partitioned, however small b is (a broadcast of
            # b is what the planner would choose up to SF 1 and more), on one
            # node too: the same join, with nothing crossing a network.
            cluster.run("SET datafusion.optimizer.hash_join_single_partition_threshold = 0")
            cluster.run("SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0")
            rates = (None,) + (LINK_RATES if nodes > 1 else ())
            for rate in rates if nodes > 1 else ():
                if rate:
                    limit_links(cluster, rate)
                try:
                    peers = cluster.rpc_bench(args.rpc_sizes)
                finally:
                    if rate:
                        limit_links(cluster, None)
                rpc.setdefault(rate or "as is", {})[str(nodes)] = peers
                for peer in peers:
                    small, large = peer["sizes"][0], peer["sizes"][-1]
                    print(f"  RPC to {peer['node']}, link {rate or 'as is'}: {small['bytes']} B round trip "
                          f"{small['round_trip_us']:.0f} µs, {large['bytes']} B at {large['mb_per_s']:.0f} MB/s",
                          file=sys.stderr, flush=True)
            for kind, key in SHUFFLE_KEYS.items():
                cluster.run("DROP TABLE IF EXISTS a")
                cluster.run(f"CREATE TABLE a AS SELECT {key.format(m=m)} AS k, i AS v "
                            f"FROM (SELECT CAST(value AS BIGINT) AS i FROM generate_series(1, {n}))")
                expected = cluster.run("SELECT count(*) FROM a WHERE k >= 0 AND k < %d" % m).column(0)[0].as_py()
                for rate in rates:
                    if rate:
                        limit_links(cluster, rate)
                    try:
                        rec = _shuffle_once(cluster, args, expected, f"{kind} on {nodes} node(s)")
                    finally:
                        if rate:
                            limit_links(cluster, None)
                    rec.update(rows=n + m, bytes=(n + m) * 16, rows_per_s=(n + m) / rec["median"],
                               mb_per_s=(n + m) * 16 / rec["median"] / 1e6)
                    target = results.setdefault(str(nodes), {}) if rate is None \
                        else results["links"][rate].setdefault(str(nodes), {})
                    target[kind] = rec
                    moved = "" if rec["between_bytes"] is None else f", {rec['between_bytes'] / 1e6:.1f} MB between"
                    print(f"  {kind}, link {rate or 'as is'}: {rec['median']:.3f} s, "
                          f"{rec['rows_per_s'] / 1e6:.1f} M rows/s, exchange={rec['exchange']}{moved}",
                          file=sys.stderr, flush=True)
        finally:
            cluster.close()
    return results


def _shuffle_once(cluster, args, expected, what):
    """The shuffle join's hot runs (each answer checked), what crossed
    between the nodes (EXPLAIN, EXPLAIN ANALYZE)."""
    sql = "SELECT count(*), sum(a.v + b.v) FROM a JOIN b ON a.k = b.k"
    runs = []
    for _ in range(args.runs + 1):
        seconds, table = cluster.timed(sql)
        runs.append(seconds)
        got = table.column(0)[0].as_py()
        if got != expected:
            raise SystemExit(f"cirro bench: shuffle {what}: {got} rows joined, expected {expected}")
    plan = str(cluster.run(f"EXPLAIN {sql}").to_pylist())
    # What crossed between nodes: hash shuffles, or (for a small b) a
    # broadcast of it.
    exchange = ("shuffle" if "NetworkShuffleExec" in plan
                else "broadcast" if "NetworkBroadcastExec" in plan else "none")
    analyzed = "\n".join(str(v) for v in cluster.run(f"EXPLAIN ANALYZE {sql}").column(1).to_pylist())
    return {"median": statistics.median(runs[1:]), "hot": runs[1:], "cold": runs[0], "exchange": exchange,
            "between_bytes": _bytes(analyzed)}

# Passes of the cache setup's stream.
CACHE_PASSES = 2


def _tier(target):
    """Chunk hits and misses of every node's hot-data tier so far."""
    row = target.run("SELECT coalesce(sum(hits), 0), coalesce(sum(misses), 0) FROM cirro.cache").to_pylist()[0]
    return tuple(int(v) for v in row.values())


def run_cache(args, tables, queries, reference):
    """The tier's hit ratio per pass of the stream, alone and on 3 nodes
    (see the module docs)."""
    order = list(queries)
    random.Random(42).shuffle(order)
    results = {}
    for setup in ("alone", "3"):
        print(f"cirro bench cluster: cache stream on {SETUP_NAMES[setup]}", file=sys.stderr, flush=True)
        target = start_setup(setup, args)
        try:
            for name, path in tables.items():
                target.run(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{path}/')")
            before = _tier(target)
            passes = []
            for p in range(CACHE_PASSES):
                start = time.perf_counter()
                for q in order:
                    compare.compare(target.run(q.sql), reference[q.id], f"{q.id} on {setup}, pass {p + 1}")
                seconds = time.perf_counter() - start
                after = _tier(target)
                hits, misses = after[0] - before[0], after[1] - before[1]
                before = after
                passes.append({"seconds": seconds, "hits": hits, "misses": misses,
                               "hit_ratio": hits / (hits + misses) if hits + misses else None})
                print(f"  pass {p + 1}: {seconds:.2f} s, {hits} hits, {misses} misses", file=sys.stderr, flush=True)
            results[setup] = passes
        finally:
            target.close()
    return results


def _bytes(text):
    """The bytes that EXPLAIN ANALYZE's network boundaries report as
    transferred (`bytes_transferred=1.5 MB`, 1024-based), summed; None
    when none does."""
    import re
    units = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
    found = re.findall(r"bytes_transferred=([0-9.]+) ?([KMGT]?B)", text)
    return int(sum(float(n) * units[u] for n, u in found)) if found else None


def run_aggregation(args):
    n = int(AGGREGATION_ROWS * args.sf)
    print(f"cirro bench cluster: aggregation on 3 nodes, {n:,} rows", file=sys.stderr, flush=True)
    cluster = Cluster(3, args.cirro, args.wire, args.threads, setup_memory())
    results = {}
    try:
        cluster.run(f"CREATE TABLE g AS SELECT i % 10 AS k10, i % 10000 AS k10000, i AS k, i AS v, "
                    f"CAST(i % 10 AS VARCHAR) AS t10, CAST(i % 10000 AS VARCHAR) AS t10000, "
                    f"CAST(i AS VARCHAR) AS t "
                    f"FROM (SELECT CAST(value AS BIGINT) AS i FROM generate_series(1, {n}))")
        cluster.run(f"SET distributed.file_scan_config_bytes_per_partition = {max(65536, int(4_194_304 * args.sf))}")
        total = n * (n + 1) // 2
        for name, key in AGGREGATION_KEYS.items():
            groups = {"10": min(10, n), "10000": min(10_000, n), "": n}[key.lstrip("kt")]
            sql = f"SELECT count(*), sum(s) FROM (SELECT {key}, sum(v) AS s FROM g GROUP BY {key}) AS t"
            # The exchanges take turns run by run (the first of each run
            # rotating), so that none gains from the others' warming.
            runs = {x: [] for x in EXCHANGES}
            for r in range(args.runs + 1):
                for exchange in EXCHANGES[r % 3:] + EXCHANGES[:r % 3]:
                    cluster.run(f"SET aggregation_exchange = {exchange}")
                    seconds, table = cluster.timed(sql)
                    runs[exchange].append(seconds)
                    got = (table.column(0)[0].as_py(), int(table.column(1)[0].as_py()))
                    if got != (groups, total):
                        raise SystemExit(f"cirro bench: aggregation by {key} ({exchange}): {got}, "
                                         f"expected {(groups, total)}")
            per = {}
            for exchange in EXCHANGES:
                cluster.run(f"SET aggregation_exchange = {exchange}")
                plan = "\n".join(str(v) for v in cluster.run(f"EXPLAIN {sql}").column(1).to_pylist())
                choice = [line.split("aggregation=", 1)[1] for line in plan.splitlines() if "aggregation=" in line]
                analyzed = "\n".join(str(v) for v in cluster.run(f"EXPLAIN ANALYZE {sql}").column(1).to_pylist())
                hot = runs[exchange][1:]
                per[exchange] = {"median": statistics.median(hot), "hot": hot, "cold": runs[exchange][0],
                                 "choice": choice[0] if choice else None, "bytes": _bytes(analyzed)}
                print(f"  {name} groups, {exchange}: {per[exchange]['median']:.3f} s, "
                      f"{per[exchange]['choice']}, {per[exchange]['bytes']} bytes", file=sys.stderr, flush=True)
            results[name] = {"groups": groups, "rows": n, "exchanges": per}
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
    setups = [s for s in args.setups.split(",") if s]
    unknown = set(setups) - set(SETUPS) - {"shuffle", "aggregation", "cache"}
    if unknown:
        sys.exit(f"cirro bench: unknown --setups {', '.join(sorted(unknown))}: "
                 f"of {', '.join(SETUPS)}, shuffle, aggregation, cache")
    queries, tables, facts, reference = tpch_with_answers(args)
    rpc = {}
    doc = {"command": " ".join(args.argv), "machine": machine(), "sf": args.sf, "runs": args.runs,
           "starts": args.starts, "bucketed": args.bucketed, "wire": args.wire, "threads": args.threads, "memory_bytes": setup_memory(),
           "parquet_bytes": facts.get("parquet_bytes"),
           "tpch": run_tpch(args, tables, queries, reference, [s for s in SETUPS if s in setups]),
           "shuffle": run_shuffle(args, rpc) if "shuffle" in setups else {},
           "rpc": rpc,
           "aggregation": run_aggregation(args) if "aggregation" in setups else {},
           "cache": run_cache(args, tables, queries, reference) if "cache" in setups else {}}
    path = out / "results.json"
    if path.exists():
        print(f"cirro bench: the earlier results are kept as {keep_earlier(path).name}", file=sys.stderr)
    path.write_text(json.dumps(doc, indent=1))
    path = report(doc, out)
    print(f"cirro bench: report {path}", file=sys.stderr)
    errors = [f"{SETUP_NAMES[n]} {q}: {r['error']}" for n, res in doc["tpch"].items()
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


def _between(r):
    """The bytes EXPLAIN ANALYZE counted between nodes, where known."""
    moved = r.get("between_bytes")
    return "" if moved is None else f", {moved / 1e6:.1f} MB"


def _geomean(values):
    values = [v for v in values if v > 0]
    return statistics.geometric_mean(values) if values else float("nan")


# The ratios the report shows: a 1-node cluster against `cirro serve`
# alone, 3 nodes against 1.
RATIOS = (("1", "alone"), ("3", "1"))


def _cell(r):
    """A query's figure: the median over the starts, with their range."""
    if "median" not in r:
        return str(r.get("error", "—"))[:80]
    if r.get("starts") and len(r["starts"]) > 1:
        return f"{r['median']:.3f} ({r['min']:.3f}–{r['max']:.3f})"
    return f"{r['median']:.3f}"


def _total(res, both):
    """A setup's total over the queries `both` (median over its starts of
    each start's total, and their range; results of before --starts have
    one)."""
    starts = res.get("starts") or [res]
    totals = [sum(s["queries"][q]["median"] for q in both) for s in starts]
    return statistics.median(totals), min(totals), max(totals)


def rpc_lines(rpc):
    """The report's table of the worker RPC: a row per link speed, cluster
    and node measured, a column per message size (the median round trip and
    the throughput)."""
    sizes = sorted({f["bytes"] for per_nodes in rpc.values() for peers in per_nodes.values()
                    for peer in peers for f in peer["sizes"]})

    def size(b):
        return f"{b >> 20} MB" if b >= 1 << 20 else f"{b >> 10} KB" if b >= 1 << 10 else f"{b} B"

    lines = ["", "## Worker RPC from node 1 (`cirro admin rpc-bench`: median round trip of a message echoed, µs; "
             "throughput of messages sent 4 at a time, MB/s)", "",
             "| link | nodes | to | " + " | ".join(size(b) for b in sizes) + " |",
             "|---|---:|---|" + "---:|" * len(sizes)]
    for link, per_nodes in rpc.items():
        for nodes, peers in per_nodes.items():
            for peer in peers:
                at = {f["bytes"]: f for f in peer["sizes"]}
                cells = [f"{at[b]['round_trip_us']:.0f} µs, {at[b]['mb_per_s']:.0f} MB/s" if b in at else ""
                         for b in sizes]
                lines.append(f"| {link} | {nodes} | {peer['node']} | " + " | ".join(cells) + " |")
    return lines


def report(doc, out):
    setups = [s for s in SETUPS if s in doc["tpch"]]
    ratios = [(a, b) for a, b in RATIOS if a in setups and b in setups]
    per = {s: doc["tpch"][s]["queries"] for s in setups}
    ids = sorted(set().union(*per.values())) if per else []
    # The queries every setup answered: totals compare like with like.
    both = [q for q in ids if all("median" in per[s].get(q, {}) for s in setups)]
    totals = {s: _total(doc["tpch"][s], both) for s in setups}
    wire = {"pg": "the PostgreSQL protocol", "flight": "Flight SQL"}[doc.get("wire", "flight")]
    starts = doc.get("starts", 1)
    lines = [f"# Cluster: TPC-H SF{doc['sf']:g}, {', '.join(SETUP_NAMES[s] for s in setups)}; shuffle throughput",
             "",
             f"`{doc['command']}` — {doc['machine'].get('cpu', '?')}, {doc['machine'].get('cpus')} cores, "
             f"{doc['machine'].get('memory_gib')} GiB; every node on this machine (the same cores: "
             "this measures the cost of distribution, not a speed-up). Each setup started "
             f"{starts} time(s) afresh, tables loaded by CREATE TABLE … AS from the same Parquet files"
             + (f" (lineitem and orders DISTRIBUTED BY HASH on the order key, part and partsupp on the part key, "
                f"BUCKETS {BUCKETS}, in every setup)" if doc.get("bucketed") else "")
             + "; a figure "
             f"is the median over the starts of each start's median of {doc['runs']} hot runs (range in "
             f"parentheses), through {wire} (node 1 of a cluster); every answer, cold and hot, checked against "
             "DuckDB's."
             + (f" The memory of a setup's processes together: {doc['memory_bytes'] >> 20} MB, a cluster's nodes "
                "an equal share each." if doc.get("memory_bytes") else ""), "",
             "## TPC-H", "",
             "| | " + " | ".join(SETUP_NAMES[s] for s in setups) + "".join(f" | {a} / {b}" for a, b in ratios) + " |",
             "|---|" + "---:|" * (len(setups) + len(ratios))]
    lines.append("| total (s), median (range) | "
                 + " | ".join(f"{t[0]:.2f} ({t[1]:.2f}–{t[2]:.2f})" for t in totals.values())
                 + "".join(f" | {totals[a][0] / totals[b][0]:.2f}" for a, b in ratios) + " |")
    lines.append("| geometric mean of per-query ratios | " + " | " * (len(setups) - 1)
                 + "".join(f" | {_geomean([per[a][q]['median'] / per[b][q]['median'] for q in both]):.2f}"
                           for a, b in ratios) + " |")
    lines.append("| load (s), median | "
                 + " | ".join(f"{doc['tpch'][s]['load_seconds']:.1f}" for s in setups) + " |" * len(ratios) + " |")
    lines += ["", "| query | " + " | ".join(f"{SETUP_NAMES[s]} (s)" for s in setups)
              + "".join(f" | {a} / {b}" for a, b in ratios) + " |",
              "|---|" + "---:|" * (len(setups) + len(ratios))]
    for q in ids:
        cells = [_cell(per[s].get(q, {})) for s in setups]
        for a, b in ratios:
            x, y = per[a].get(q, {}), per[b].get(q, {})
            cells.append(f"{x['median'] / y['median']:.2f}" if "median" in x and "median" in y else "")
        lines.append(f"| {q} | " + " | ".join(cells) + " |")
    lines += ["", "## Shuffle (join of a: N rows with b: N/10 unique keys, hash-partitioned on the key)", "",
              "| keys | nodes | link | rows | time (s) | M rows/s | MB/s | between nodes |",
              "|---|---:|---|---:|---:|---:|---:|---|"]
    links = [(None, {k: v for k, v in doc["shuffle"].items() if k != "links"})]
    links += list(doc["shuffle"].get("links", {}).items())
    for rate, per_nodes in links:
        for nodes, kinds in per_nodes.items():
            for kind, r in kinds.items():
                lines.append(f"| {kind} | {nodes} | {rate or 'as is'} | {r['rows']:,} | {r['median']:.3f} | "
                             f"{r['rows_per_s'] / 1e6:.1f} | {r['mb_per_s']:.0f} | {_exchange(r)}{_between(r)} |")
    if doc.get("rpc"):
        lines += rpc_lines(doc["rpc"])
    if doc.get("aggregation"):
        lines += ["", "## Aggregation across 3 nodes (`SET aggregation_exchange`; time in s, bytes between nodes)",
                  "", "| groups | rows | " + " | ".join(EXCHANGES) + " | auto / best forced | auto chose |",
                  "|---|---:|" + "---:|" * len(EXCHANGES) + "---:|---|"]
        for name, r in doc["aggregation"].items():
            ex = r["exchanges"]
            cells = [f"{ex[x]['median']:.3f}" + (f" ({ex[x]['bytes'] / 1e6:.1f} MB)" if ex[x].get("bytes") else "")
                     for x in EXCHANGES]
            best = min(ex["partial"]["median"], ex["rows"]["median"])
            text = " (text)" if "text" in name else ""
            lines.append(f"| {r['groups']:,}{text} | {r['rows']:,} | " + " | ".join(cells)
                         + f" | {ex['auto']['median'] / best:.2f} | {ex['auto'].get('choice') or ''} |")
    if doc.get("cache"):
        lines += ["", f"## The hot-data tier over a TPC-H stream ({len(doc['cache']['alone'])} passes, chunk hits "
                  "of every node's tier)", "", "| setup | pass | time (s) | hits | misses | hit ratio |",
                  "|---|---:|---:|---:|---:|---:|"]
        for setup, passes in doc["cache"].items():
            for p, r in enumerate(passes):
                ratio = "–" if r["hit_ratio"] is None else f"{r['hit_ratio']:.1%}"
                lines.append(f"| {SETUP_NAMES[setup]} | {p + 1} | {r['seconds']:.2f} | {r['hits']} | "
                             f"{r['misses']} | {ratio} |")
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    x = range(len(both))
    width = 0.8 / max(1, len(setups))
    for j, setup in enumerate(setups):
        axes[0].bar([i + (j - (len(setups) - 1) / 2) * width for i in x], [per[setup][q]["median"] for q in both],
                    width, label=SETUP_NAMES[setup])
    axes[0].set_xticks(list(x), both, rotation=90)
    axes[0].set_ylabel("seconds (median)")
    axes[0].set_title(f"TPC-H SF{doc['sf']:g}, same machine")
    axes[0].legend()
    kinds = list(SHUFFLE_KEYS)
    counts = sorted(k for k in doc["shuffle"] if k != "links")
    for j, nodes in enumerate(counts):
        width = 0.8 / max(1, len(counts))
        axes[1].bar([i + (j - (len(counts) - 1) / 2) * width for i in range(len(kinds))],
                    [doc["shuffle"][nodes][k]["rows_per_s"] / 1e6 for k in kinds], width, label=f"{nodes} node(s)")
    axes[1].set_xticks(range(len(kinds)), kinds)
    axes[1].set_ylabel("M rows/s through the join")
    axes[1].set_title("hash shuffle throughput")
    if doc["shuffle"]:
        axes[1].legend()
    return finish_report(fig, axes, lines, out, plot="cluster.png")
