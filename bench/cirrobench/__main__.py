"""`cirro bench <suite> [--sf N] [--threads T] [--peers a,b,…]`.

Run through `cirro bench` (which makes the Python environment and passes
--cirro); `python -m cirrobench` in that environment works as well.
"""

import argparse
import os
import re
import sys
from pathlib import Path

from . import engines, suites

BENCH = Path(__file__).resolve().parents[1]
# A run's folder under results/<suite>-sf<N>/: the day and the commit.
RUN_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[0-9a-z]+(-dirty)?(-\d+)?$")


def _commit():
    """The checkout's commit (short), `-dirty` with changes; `unknown`
    outside a git checkout."""
    import subprocess

    repo = BENCH.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _unfinished(run):
    """Whether `run` holds a suite run that stopped before its end (the
    runner's state without `finished`)."""
    import json

    path = run / "results.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return "config" in state and not state.get("finished")


def run_dir(base, fresh=False, latest=False, day=None, commit=None):
    """The folder of this run under `base` (results/<suite>-sf<N>): the
    latest run's when it is unfinished (it resumes; not with `fresh`) or
    when `latest` (--report-only), else a new `<day>-<commit>` folder
    (`-2`, `-3`, … when that name is taken). Earlier runs are never
    touched."""
    import time

    base.mkdir(parents=True, exist_ok=True)
    runs = sorted((p for p in base.iterdir() if p.is_dir() and RUN_NAME.match(p.name)),
                  key=lambda p: (p.stat().st_mtime, p.name))
    if runs and (latest or (not fresh and _unfinished(runs[-1]))):
        return runs[-1]
    name = f"{day or time.strftime('%Y-%m-%d')}-{commit or _commit()}"
    run, k = base / name, 1
    while run.exists():
        k += 1
        run = base / f"{name}-{k}"
    run.mkdir()
    return run


def parse(argv):
    ap = argparse.ArgumentParser(prog="cirro bench", description="Benchmark Cirro beside its peers.")
    ap.add_argument("suite", help="tpch, ssb, joins, aggregation, dml, micro, pending, cluster, cache or gpu")
    ap.add_argument("--sf", type=float, default=1.0,
                    help="scale factor (tpch, ssb); joins and aggregation: a multiplier of the paper's sizes")
    ap.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
    ap.add_argument("--peers", default=",".join(engines.DEFAULT_PEERS),
                    help=f"comma-separated, of {', '.join(engines.ALL[1:])} (default: all but spark)")
    ap.add_argument("--wire", choices=["flight", "pg"], default="flight",
                    help="how the harness queries Cirro: Arrow Flight SQL (default) or the PostgreSQL protocol")
    ap.add_argument("--runs", type=int, default=3, help="hot runs per query and engine (default 3)")
    ap.add_argument("--starts", type=int, default=3,
                    help="tpch, ssb, joins, aggregation, cluster, micro: fresh processes of every engine (Cirro's server among "
                         "them), each running every query; a figure is the median over the starts of each "
                         "start's median, shown with their range (default 3)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per query run (default 300)")
    ap.add_argument("--duration", type=float, default=5, help="micro: seconds per operation and client count")
    ap.add_argument("--baseline", help="micro: another cirro binary (an older build) measured in the same run")
    ap.add_argument("--ops", help="micro: comma-separated subset of operations (insert-1, insert-1000, update, "
                                  "select, point, pgbench-tpcb, pgbench-select)")
    ap.add_argument("--changes", type=int, default=100_000,
                    help="pending: small writes left waiting in the row stores of lineitem and orders (default 100000)")
    ap.add_argument("--pgbench-scale", type=int, default=10,
                    help="micro: pgbench's scale (-s) for its TPC-B-like and select-only scripts (default 10)")
    ap.add_argument("--no-wal-tmpfs", action="store_true",
                    help="micro: leave out cirro-wal-tmpfs (the write-ahead log on tmpfs, beside the disk)")
    ap.add_argument("--queries", help="comma-separated subset of query ids (e.g. q01,q06)")
    ap.add_argument("--out", type=Path,
                    help="results directory (default bench/results/<suite>-sf<N>/<date>-<commit>/: a folder per "
                         "run; an unfinished latest run is resumed)")
    ap.add_argument("--data-dir", type=Path,
                    default=Path(os.environ.get("HOME", "/root")) / ".cache/cirro/bench-data",
                    help="where generated data is kept (default ~/.cache/cirro/bench-data; reused by later runs)")
    ap.add_argument("--fresh", action="store_true", help="ignore earlier results in --out instead of resuming")
    ap.add_argument("--drop-caches", action="store_true", help="empty the page cache before each cold run (root)")
    ap.add_argument("--no-probe", action="store_true", help="skip the memory-bandwidth probe")
    ap.add_argument("--setups", default="alone,1,3,shuffle",
                    help="cluster: what to run, of alone (cirro serve alone, the baseline), 1 and 3 (TPC-H on a "
                         "cluster of that many nodes), shuffle and aggregation (grouped aggregations on 3 nodes, "
                         "each exchange; default: all but aggregation)")
    ap.add_argument("--rpc-sizes", default="",
                    help="cluster, shuffle: the message sizes in bytes of the worker RPC micro-benchmark, "
                         "comma-separated (default: 1 KB to 16 MB by factors of 4)")
    ap.add_argument("--bucketed", action="store_true",
                    help="cluster: load TPC-H hash-distributed in every setup (lineitem and orders by order key, "
                         "part and partsupp by part key, 12 buckets; results in cluster-bucketed-sf<N>)")
    ap.add_argument("--scaling", action="store_true",
                    help="cluster: TPC-H on 1, 2, 3 nodes, bucketed and not, bytes exchanged, a model of larger "
                         "clusters (results in cluster-scaling-sf<N>)")
    ap.add_argument("--passes", type=int, default=3, help="cache: passes of the query stream (default 3)")
    ap.add_argument("--cache-memory", type=int,
                    help="cache: the hot-data tier's bytes (default: the tables' Parquet size)")
    ap.add_argument("--gpu-memory", metavar="SIZE",
                    help="gpu: the device memory of the co-runs' server (default 32MB: less than two queries' "
                         "blocks together)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="settings",
                    help="a session setting Cirro's connection sets first (e.g. jit=off, "
                         "adaptive_aggregation=force, cache=off); may be repeated")
    ap.add_argument("--memory-limit", metavar="SIZE",
                    help="one statement's memory for Cirro (SET memory_limit) and DuckDB (its memory_limit) "
                         "alike, e.g. 100MB: joins and aggregations beyond it spill (default: each engine's own)")
    ap.add_argument("--report-only", action="store_true", help="rewrite report and plots from results.json")
    ap.add_argument("--cirro", default=os.environ.get("CIRRO_BIN"), help="the cirro binary (set by cirro bench)")
    args = ap.parse_args(argv)
    try:
        args.settings = [engines.parse_setting(s) for s in args.settings]
    except ValueError as e:
        ap.error(str(e))
    if args.starts < 1 or args.runs < 0:
        ap.error("--starts must be at least 1 and --runs at least 0")
    args.argv = ["cirro", "bench"] + argv
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in args.peers:
        if p not in engines.ALL:
            ap.error(f"unknown peer {p!r}: choose from {', '.join(engines.ALL[1:])}")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    sf_label = f"{args.sf:g}"
    if args.suite not in ("dml", "micro", "pending", "cluster", "cache", "gpu"):
        suites.get(args.suite)  # refuses an unknown suite before anything is written
    name = args.suite
    if args.suite == "cluster" and args.scaling:
        name = "cluster-scaling"
    elif args.suite == "cluster" and args.bucketed:
        name = "cluster-bucketed"
    if args.out:
        out = args.out
        out.mkdir(parents=True, exist_ok=True)
    else:
        out = run_dir(BENCH / "results" / f"{name}-sf{sf_label}", args.fresh, args.report_only)
    print(f"cirro bench: results in {out}", file=sys.stderr)
    if args.suite == "cluster" and args.scaling:
        from . import scaling

        return scaling.main(args, out)
    if args.suite == "cluster":
        from . import cluster

        return cluster.main(args, out)
    if args.suite == "cache":
        from . import cache

        return cache.main(args, out)
    if args.suite == "gpu":
        from . import gpu

        return gpu.main(args, out)
    if args.suite == "pending":
        from . import pending

        if not args.cirro or not Path(args.cirro).exists():
            sys.exit("cirro bench: the cirro binary is unknown: run through `cirro bench` or pass --cirro")
        return pending.run(args, out)
    if args.suite in ("dml", "micro"):
        from . import wire

        return wire.main(args, out)
    from . import data, report, runner

    if args.report_only:
        import json

        state = json.loads((out / "results.json").read_text())
        print(report.write(state, out))
        return 1 if state.get("mismatches") else 0
    if not args.cirro or not Path(args.cirro).exists():
        sys.exit("cirro bench: the cirro binary is unknown: run through `cirro bench` or pass --cirro")
    suite, make_tables, make_queries = suites.get(args.suite)
    queries = make_queries(args.sf)
    if args.queries:
        wanted = args.queries.split(",")
        unknown = set(wanted) - {q.id for q in queries}
        if unknown:
            sys.exit(f"cirro bench: no such queries in {args.suite}: {', '.join(sorted(unknown))}")
        queries = [q for q in queries if q.id in wanted]
    root = args.data_dir / f"{args.suite}-sf{sf_label}"
    cirro_data, tables, facts = data.prepare(suite, make_tables, args.sf, root, args.cirro, args.threads)
    ctx = engines.Context(tables, args.threads, root, args.cirro, cirro_data, args.wire)
    ctx.cirro_settings = args.settings
    if args.memory_limit:
        if not re.match(r"^[0-9]+(kB|MB|GB)$", args.memory_limit):
            sys.exit("cirro bench: --memory-limit takes a size such as 100MB (kB, MB or GB)")
        ctx.memory_limit = args.memory_limit
        ctx.cirro_settings = [("memory_limit", args.memory_limit)] + ctx.cirro_settings
    state = runner.run_suite(args, suite, queries, ctx, facts, out)
    path = report.write(state, out)
    print(f"cirro bench: report {path}", file=sys.stderr)
    if state["mismatches"]:
        print(f"cirro bench: FAILED: {len(state['mismatches'])} Cirro result(s) differ from DuckDB's:",
              file=sys.stderr)
        for m in state["mismatches"]:
            print(f"  {m}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
