#!/usr/bin/env python3
"""TPC-H speed floor: Cirro on its own tables vs DataFusion (the `datafusion`
Python package, the engine Cirro builds on) reading the very same Parquet files
as a plain directory, with DuckDB on the same files alongside.

Every engine runs with the same thread count (DataFusion target_partitions,
Cirro --threads, DuckDB threads). Each query runs `--runs` times; within a run
the engines alternate query by query, so drift affects all alike. All runs are
hot (a warm-up run per engine first, not counted). Figures are medians.

Usage (after `cirro load tpch --sf 1 --data DIR`):
    ~/.cache/cirro/bench-venv/bin/python bench/tpch_floor.py --data DIR --sf 1 --threads 2 --runs 5 \
        --cirro ~/.cache/cirro/target/ci/cirro --out bench/results/tpch-floor-sf1.json
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cirrobench.data import link_parquet  # bench/ is this script's directory


class Cirro:
    """One long-lived `cirro sql` process fed statements on stdin."""

    def __init__(self, binary, data, threads):
        self.proc = subprocess.Popen(
            [binary, "--data", str(data), "--threads", str(threads), "sql", "--format", "csv"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1,
        )

    def run(self, sql):
        self.proc.stdin.write(sql.strip().rstrip(";") + ";\n")
        self.proc.stdin.flush()
        rows = None
        while True:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("cirro exited")
            if line.startswith("ERROR"):
                raise RuntimeError(line.strip())
            if line.startswith("(") and "row" in line:
                rows = int(line[1:].split()[0])
            if line.startswith("Time: "):
                return float(line.split()[1]) / 1000.0, rows

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class DataFusion:
    def __init__(self, dirs, threads):
        import datafusion
        self.version = datafusion.__version__
        config = datafusion.SessionConfig().with_target_partitions(threads)
        self.ctx = datafusion.SessionContext(config)
        for name, path in dirs.items():
            self.ctx.register_parquet(name, str(path))

    def run(self, sql):
        start = time.perf_counter()
        batches = self.ctx.sql(sql).collect()
        elapsed = time.perf_counter() - start
        return elapsed, sum(b.num_rows for b in batches)


class DuckDB:
    def __init__(self, dirs, threads):
        import duckdb
        self.version = duckdb.__version__
        self.con = duckdb.connect()
        self.con.execute(f"SET threads = {threads}")
        for name, path in dirs.items():
            self.con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{path}/*.parquet')")

    def run(self, sql):
        start = time.perf_counter()
        rows = self.con.execute(sql).fetch_arrow_table().num_rows
        return time.perf_counter() - start, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path, help="Cirro data location holding TPC-H")
    parser.add_argument("--sf", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cirro", required=True)
    parser.add_argument("--queries", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared/tpch/queries")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-duckdb", action="store_true")
    args = parser.parse_args()

    data = args.data.resolve()
    dirs = link_parquet(data, data.parent / f"{data.name}-parquet")
    queries = {f"q{i:02d}": (args.queries / f"q{i:02d}.sql").read_text() for i in range(1, 23)}
    engines = {"cirro": Cirro(args.cirro, data, args.threads), "datafusion": DataFusion(dirs, args.threads)}
    if not args.no_duckdb:
        engines["duckdb"] = DuckDB(dirs, args.threads)

    rows = {}
    for name, engine in engines.items():  # warm-up, not counted
        for q, sql in queries.items():
            _, n = engine.run(sql)
            rows.setdefault(q, {})[name] = n
    mismatched = {q: r for q, r in rows.items() if len(set(r.values())) != 1}
    if mismatched:
        print(f"row counts differ between engines: {mismatched}", file=sys.stderr)

    times = {name: {q: [] for q in queries} for name in engines}
    for run in range(args.runs):
        for q, sql in queries.items():
            order = list(engines) if (run + int(q[1:])) % 2 == 0 else list(reversed(list(engines)))
            for name in order:
                elapsed, _ = engines[name].run(sql)
                times[name][q].append(elapsed)
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    engines["cirro"].close()

    medians = {name: {q: statistics.median(v) for q, v in per.items()} for name, per in times.items()}
    totals = {name: sum(m.values()) for name, m in medians.items()}
    result = {
        "suite": "tpch", "sf": args.sf, "threads": args.threads, "runs": args.runs,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": {k: getattr(v, "version", None) for k, v in engines.items()},
        "command": " ".join(sys.argv),
        "median_seconds": medians, "total_seconds": totals,
        "ratio_cirro_over_datafusion": totals["cirro"] / totals["datafusion"],
        "row_count_mismatches": mismatched, "all_seconds": times,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{'query':6} " + " ".join(f"{n:>11}" for n in engines))
    for q in queries:
        print(f"{q:6} " + " ".join(f"{medians[n][q]:11.3f}" for n in engines))
    print(f"{'total':6} " + " ".join(f"{totals[n]:11.3f}" for n in engines))
    print(f"cirro / datafusion = {result['ratio_cirro_over_datafusion']:.3f}")


if __name__ == "__main__":
    main()
