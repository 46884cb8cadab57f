#!/usr/bin/env python3
"""Compression ratio per codec on TPC-H lineitem.

Copies lineitem of a loaded TPC-H data location into one table per codec
(`CREATE TABLE … WITH (compression = …) AS SELECT * FROM lineitem`) and
reports the bytes of each table's data files, the ratio against the same rows
as CSV text (`COPY … TO`, what dbgen writes) and against uncompressed Parquet
('none': encodings only), and how long a full scan takes.

Usage (after `cirro --data DIR load tpch --sf 1`):
    ~/.cache/cirro/bench-venv/bin/python bench/compression.py --data DIR \
        --cirro ~/.cache/cirro/target/ci/cirro --out bench/results/compression-sf1.json
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CODECS = ["none", "snappy", "lz4", "zstd"]


def run(cirro, data, sql):
    t0 = time.perf_counter()
    out = subprocess.run([cirro, "--data", data, "sql", "--format", "csv", "-c", sql], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"cirro failed on {sql}: {out.stderr}")
    return time.perf_counter() - t0, out.stdout


def table_bytes(data, name):
    dirs = list((Path(data) / "data" / "cirro" / "public").glob(f"{name}-*"))
    if len(dirs) != 1:
        sys.exit(f"cannot find the directory of {name}")
    return sum(f.stat().st_size for f in dirs[0].glob("*.parquet"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--cirro", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "lineitem.csv"
        run(args.cirro, args.data, f"COPY lineitem TO '{csv_path}' STORED AS CSV")
        csv_bytes = csv_path.stat().st_size
    rows = int(run(args.cirro, args.data, "SELECT count(*) FROM lineitem")[1].splitlines()[1])

    results = []
    for codec in CODECS:
        name = f"lineitem_{codec}"
        run(args.cirro, args.data, f"DROP TABLE IF EXISTS {name}")
        write_s, _ = run(args.cirro, args.data,
                         f"CREATE TABLE {name} WITH (compression = '{codec}') AS SELECT * FROM lineitem")
        size = table_bytes(args.data, name)
        scans = [run(args.cirro, args.data,
                     f"SELECT sum(l_extendedprice), count(DISTINCT l_comment) FROM {name}")[0]
                 for _ in range(args.runs)]
        results.append({"codec": codec, "bytes": size, "write_s": round(write_s, 2),
                        "scan_s_median": round(statistics.median(scans), 3)})
        run(args.cirro, args.data, f"DROP TABLE {name}")
    none = next(r["bytes"] for r in results if r["codec"] == "none")
    print(f"lineitem: {rows} rows, CSV {csv_bytes / 1e6:.1f} MB")
    print(f"{'codec':<8}{'MB':>10}{'vs CSV':>10}{'vs none':>10}{'write s':>10}{'scan s':>10}")
    for r in results:
        r["ratio_vs_csv"] = round(csv_bytes / r["bytes"], 2)
        r["ratio_vs_uncompressed_parquet"] = round(none / r["bytes"], 2)
        print(f"{r['codec']:<8}{r['bytes'] / 1e6:>10.1f}{r['ratio_vs_csv']:>10.2f}"
              f"{r['ratio_vs_uncompressed_parquet']:>10.2f}{r['write_s']:>10.2f}{r['scan_s_median']:>10.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"table": "lineitem", "rows": rows, "csv_bytes": csv_bytes, "codecs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
