#!/usr/bin/env python3
"""The CirroData paper's DML table, scaled to one machine: Cirro beside DuckDB.

A table of --rows rows (id BIGINT, 4 numeric and 2 text columns) is loaded into
each engine (Cirro: its Delta table under --data; DuckDB: its own database
file). Then, on both, in the same run, step by step (the engine that goes first
alternates):

  insert 1 %, 10 %, 100 % of --rows new rows
  update 1 %, 10 %, 100 % of --rows rows   (contiguous id ranges)
  delete 1 %, 10 %, 100 % of --rows rows
  10 rounds: delete 1 % then insert the same 1 % again

With --rows 100000000 these are the paper's 1 M / 10 M / 100 M. Cirro runs
VACUUM RETAIN 0 HOURS after each step (untimed) to keep disk use bounded, and
the script refuses to start without enough free disk. Every statement is
checked: the affected-row counts of the two engines must agree, and the table
contents (count, sum of ids, sum of n1) must agree after every step.

Usage:
    ~/.cache/cirro/bench-venv/bin/python bench/dml_bench.py --rows 100000000 --threads 2 \
        --cirro ~/.cache/cirro/target/ci/cirro --work /tmp/dml-bench \
        --out bench/results/dml-100m.json
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COLUMNS = "id BIGINT NOT NULL, n1 BIGINT, n2 INTEGER, n3 DOUBLE, n4 DECIMAL(12,2), s1 VARCHAR, s2 VARCHAR"
# Bytes per row on disk, generously (Cirro zstd Parquet plus DuckDB), for the
# free-space check.
BYTES_PER_ROW_ESTIMATE = 60


def cirro_rows(lo, hi):
    """SELECT producing rows with ids lo..hi-1 (Cirro / DataFusion SQL)."""
    return (
        f"SELECT value AS id, value * 7 AS n1, CAST(value % 1000 AS INT) AS n2, "
        f"CAST(value AS DOUBLE) / 3 AS n3, CAST(value % 100000 AS DECIMAL(12,2)) / 100 AS n4, "
        f"'name-' || CAST(value % 100000 AS VARCHAR) AS s1, 'city-' || CAST(value % 977 AS VARCHAR) AS s2 "
        f"FROM generate_series({lo}, {hi - 1}) AS g(value)"
    )


def duck_rows(lo, hi):
    return (
        f"SELECT range AS id, range * 7 AS n1, CAST(range % 1000 AS INT) AS n2, "
        f"CAST(range AS DOUBLE) / 3 AS n3, CAST(range % 100000 AS DECIMAL(12,2)) / 100 AS n4, "
        f"'name-' || CAST(range % 100000 AS VARCHAR) AS s1, 'city-' || CAST(range % 977 AS VARCHAR) AS s2 "
        f"FROM range({lo}, {hi})"
    )


class Cirro:
    name = "cirro"

    def __init__(self, binary, data, threads):
        self.cmd = [binary, "--data", str(data), "--threads", str(threads)]

    def run(self, sql):
        t0 = time.perf_counter()
        out = subprocess.run(self.cmd + ["sql", "--format", "csv", "-c", sql], capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if out.returncode != 0:
            sys.exit(f"cirro failed on {sql[:200]}: {out.stderr}")
        tag = [l for l in out.stderr.splitlines() if l and not l.startswith("Time:")][-1]
        return elapsed, tag, out.stdout

    def count(self, sql):
        return int(self.run(sql)[1].split()[-1])

    def checksum(self):
        _, _, out = self.run("SELECT count(*), coalesce(sum(id), 0), coalesce(sum(n1), 0) FROM dml")
        return out.splitlines()[1]

    def vacuum(self):
        self.run("VACUUM dml RETAIN 0 HOURS")

    def size(self, data):
        return sum(f.stat().st_size for f in Path(data).rglob("*") if f.is_file())


class Duck:
    name = "duckdb"

    def __init__(self, path, threads):
        import duckdb

        self.con = duckdb.connect(str(path))
        self.con.execute(f"SET threads = {threads}")
        self.con.execute("SET preserve_insertion_order = false")
        self.path = path

    def run(self, sql):
        t0 = time.perf_counter()
        rows = self.con.execute(sql).fetchall()
        return time.perf_counter() - t0, rows

    def count(self, sql):
        _, rows = self.run(sql)
        return int(rows[0][0]) if rows else 0

    def checksum(self):
        _, rows = self.run("SELECT count(*), coalesce(sum(id), 0), coalesce(sum(n1), 0) FROM dml")
        return ",".join(str(v) for v in rows[0])

    def size(self):
        self.con.execute("CHECKPOINT")
        return os.path.getsize(self.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cirro", required=True)
    ap.add_argument("--work", default="/tmp/dml-bench")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()
    doc = run(args.rows, args.threads, args.cirro, Path(args.work), args.rounds)
    print(json.dumps(doc["summary"], indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


def run(n, threads, cirro_bin, work, rounds_wanted=10, progress=print):
    """The whole DML table on both engines; returns the steps and a summary.
    Exits (loudly) if the engines' counts or contents ever differ."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    need = n * 3 * BYTES_PER_ROW_ESTIMATE
    free = shutil.disk_usage(work).free
    if free < need:
        sys.exit(f"not enough free disk under {work}: {free / 1e9:.1f} GB free, about {need / 1e9:.1f} GB needed")

    pct = {"1%": n // 100, "10%": n // 10, "100%": n}
    cirro = Cirro(cirro_bin, work / "cirro", threads)
    duck = Duck(work / "dml.duckdb", threads)
    results = []

    def step(label, cirro_sql, duck_sql, vacuum=True):
        order = [("cirro", cirro_sql), ("duckdb", duck_sql)]
        if len(results) % 2:
            order.reverse()
        figures = {"step": label}
        counts = {}
        for engine, sql in order:
            if engine == "cirro":
                elapsed, tag, _ = cirro.run(sql)
                counts["cirro"] = int(tag.split()[-1])
            else:
                elapsed, rows = duck.run(sql)
                counts["duckdb"] = int(rows[0][0]) if rows else 0
            figures[f"{engine}_s"] = round(elapsed, 3)
        if counts["cirro"] != counts["duckdb"]:
            sys.exit(f"{label}: cirro changed {counts['cirro']} rows, duckdb {counts['duckdb']}")
        figures["rows"] = counts["cirro"]
        a, b = cirro.checksum(), duck.checksum()
        if a != b:
            sys.exit(f"{label}: contents differ: cirro {a}, duckdb {b}")
        if vacuum:
            cirro.vacuum()
        figures["ratio"] = round(figures["cirro_s"] / figures["duckdb_s"], 3)
        results.append(figures)
        progress(f"{label:<28} rows {figures['rows']:>11}  cirro {figures['cirro_s']:>8.2f} s  "
              f"duckdb {figures['duckdb_s']:>8.2f} s  ratio {figures['ratio']:.2f}", flush=True)

    cirro.run(f"CREATE TABLE dml ({COLUMNS})")
    duck.run(f"CREATE TABLE dml ({COLUMNS})")
    step(f"load {n}", f"INSERT INTO dml {cirro_rows(0, n)}", f"INSERT INTO dml {duck_rows(0, n)}")

    next_id = n
    for label, k in pct.items():
        step(f"insert {label} ({k})", f"INSERT INTO dml {cirro_rows(next_id, next_id + k)}",
             f"INSERT INTO dml {duck_rows(next_id, next_id + k)}")
        next_id += k
    # updates and deletes work on the base rows: contiguous id ranges
    for label, k in pct.items():
        where = f"id >= 0 AND id < {k}"
        step(f"update {label} ({k})", f"UPDATE dml SET n1 = n1 + 1, s1 = s1 || 'u' WHERE {where}",
             f"UPDATE dml SET n1 = n1 + 1, s1 = s1 || 'u' WHERE {where}")
    lo = 0
    for label, k in pct.items():
        where = f"id >= {n + lo} AND id < {n + lo + k}"
        step(f"delete {label} ({k})", f"DELETE FROM dml WHERE {where}", f"DELETE FROM dml WHERE {where}")
        lo += k
    one = pct["1%"]
    rounds = []
    for r in range(rounds_wanted):
        lo = r * one
        where = f"id >= {lo} AND id < {lo + one}"
        step(f"round {r + 1}: delete 1%", f"DELETE FROM dml WHERE {where}", f"DELETE FROM dml WHERE {where}",
             vacuum=False)
        step(f"round {r + 1}: insert 1%", f"INSERT INTO dml {cirro_rows(lo, lo + one)}",
             f"INSERT INTO dml {duck_rows(lo, lo + one)}")
        rounds.append(results[-2:])

    summary = {
        "round_delete_median": {
            e: statistics.median(r[0][f"{e}_s"] for r in rounds) for e in ("cirro", "duckdb")
        },
        "round_insert_median": {
            e: statistics.median(r[1][f"{e}_s"] for r in rounds) for e in ("cirro", "duckdb")
        },
        "cirro_bytes": cirro.size(work / "cirro"),
        "duckdb_bytes": duck.size(),
    }
    return {
        "benchmark": "CirroData DML table (scaled)",
        "rows": n,
        "threads": threads,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "steps": results,
        "summary": summary,
    }


if __name__ == "__main__":
    main()
