"""Making a suite's data once: Cirro generates and loads the tables, then the
data files of each table's current snapshot are hard-linked into
`parquet/<table>/`, so every peer reads the very bytes Cirro reads.

Layout of a data directory (`~/.cache/cirro/bench-data/<suite>-sf<N>`):
    cirro/       Cirro's data location (catalog and Delta tables)
    parquet/     one directory of Parquet files per table
    duckdb.db    DuckDB's own database (made by the duckdb-db peer on first use)
    duckdb2.db   the same for DuckDB 2.x (duckdb2-db)
    READY        written last: the data set is complete
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm


def snapshot_files(table_dir):
    """The data files of a Delta table's latest snapshot (adds minus removes)."""
    files = {}
    log = table_dir / "_delta_log"
    checkpoints = sorted(log.glob("*.checkpoint.parquet"))
    if checkpoints:
        raise RuntimeError(f"{table_dir}: tables with checkpoints are not supported by the benchmark linker")
    for commit in sorted(log.glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                files[action["add"]["path"]] = action["add"].get("deletionVector")
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
    if any(files.values()):
        raise RuntimeError(f"{table_dir}: has deletion vectors; peers would read deleted rows")
    return [table_dir / p for p in files]


def catalog_tables(cirro_data):
    catalog = sorted((cirro_data / "_catalog").glob("v*.json"), key=lambda p: int(p.stem[1:]))[-1]
    state = json.loads(catalog.read_text())
    tables = state["databases"]["cirro"]["schemas"]["public"]["tables"]
    return {name: cirro_data / t["location"] for name, t in tables.items()}


def link_parquet(cirro_data, out):
    dirs = {}
    for name, location in sorted(catalog_tables(cirro_data).items()):
        dst = out / name
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        for f in snapshot_files(location):
            os.link(f, dst / f.name)
        dirs[name] = dst
    return dirs


def _cirro(cirro_bin, cirro_data, threads, *args):
    cmd = [cirro_bin, "--data", str(cirro_data), "--threads", str(threads), *args]
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"cirro bench: {' '.join(cmd[:8])} … failed:\n{proc.stderr.strip()}")


def prepare(suite, make_tables, sf, root, cirro_bin, threads):
    """Make (or find) the data set; returns (cirro data location, {table: parquet dir}, facts)."""
    root = Path(root)
    ready = root / "READY"
    if ready.exists():
        facts = json.loads(ready.read_text())
        return root / "cirro", {t: root / "parquet" / t for t in facts["tables"]}, facts
    if root.exists():
        shutil.rmtree(root)  # a half-made data set from an interrupted run
    cirro_data = root / "cirro"
    root.mkdir(parents=True)
    start = time.perf_counter()
    if suite.load:
        print(f"cirro bench: generating {suite.load} SF{sf:g} with cirro load", file=sys.stderr, flush=True)
        # `cirro load` draws its own progress bars on stderr
        cmd = [cirro_bin, "--data", str(cirro_data), "--threads", str(threads), "load", suite.load, "--sf", f"{sf:g}"]
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(f"cirro bench: {' '.join(cmd)} failed")
    else:
        statements = make_tables(sf)
        for name, sql in tqdm(statements.items(), desc=f"generating {suite.name} tables", unit="table",
                              file=sys.stderr):
            _cirro(cirro_bin, cirro_data, threads, "sql", "-c", sql)
    load_seconds = time.perf_counter() - start
    dirs = link_parquet(cirro_data, root / "parquet")
    size = sum(f.stat().st_size for d in dirs.values() for f in d.iterdir())
    facts = {"suite": suite.name, "sf": sf, "tables": sorted(dirs), "cirro_load_seconds": round(load_seconds, 2),
             "parquet_bytes": size}
    ready.write_text(json.dumps(facts, indent=2))
    return cirro_data, dirs, facts
