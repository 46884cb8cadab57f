#!/usr/bin/env python3
"""The PostgreSQL wire protocol, Cirro beside PostgreSQL on the same machine.

Starts `cirro serve` on a fresh data location and a fresh PostgreSQL cluster
(Debian's `postgresql` package, run as the `postgres` user, SCRAM passwords
as Cirro uses), then, engine after engine, alternating which goes first:

  latency   one connection runs `SELECT 1` --queries times (psycopg's default
            extended protocol); p50 and p99 of the round trip
  copy-in   `COPY t FROM STDIN` of --rows rows (BIGINT, INT, DOUBLE, TEXT) in
            text format from a payload built in memory beforehand, so the
            client's formatting is not timed; rows per second, committed

Each measure is repeated --runs times; the report gives medians.

Usage:
    python3 bench/bootstrap.py --setup-only   # the pinned environment of cirro bench
    ~/.cache/cirro/bench-venv/bin/python bench/pg_wire.py --cirro ~/.cache/cirro/target/ci/cirro \\
        --threads 2 --out bench/results/pg-wire.json
"""

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

PASSWORD = "bench-pw"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cirro(binary, work, threads, flags=()):
    """`cirro serve` on `work`/cirro (made if new; an existing location is
    served again), with `flags` after `serve`."""
    port = free_port()
    env = dict(os.environ, CIRRO_PASSWORD=PASSWORD)
    env.pop("CIRRO_USER", None)
    proc = subprocess.Popen(
        [binary, "--data", str(work / "cirro"), "--threads", str(threads), "serve", "--pg-port", str(port),
         "--flight-port", "0", "--http-port", "0", *flags],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    proc.stdout.readline()  # "cirro: PostgreSQL protocol on …"
    dsn = f"host=127.0.0.1 port={port} user=cirro password={PASSWORD} dbname=cirro sslmode=disable"
    return proc, dsn


def pg_bin():
    versions = sorted(Path("/usr/lib/postgresql").iterdir(), key=lambda p: int(p.name))
    if not versions:
        raise SystemExit("PostgreSQL is not installed: apt-get install postgresql")
    return versions[-1] / "bin"


def as_postgres(args, **kw):
    return subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, **kw)


def start_postgres(work):
    """A PostgreSQL cluster in `work`/pg (made by initdb if new; an existing
    one is started again)."""
    port = free_port()
    data = work / "pg"
    binary = pg_bin()
    if not data.exists():
        data.mkdir()
        shutil.chown(data, "postgres", "postgres")
        pwfile = work / "pg-password"
        pwfile.write_text(PASSWORD)
        shutil.chown(pwfile, "postgres", "postgres")
        as_postgres([str(binary / "initdb"), "-D", str(data), "-A", "scram-sha-256", "-U", "postgres",
                     f"--pwfile={pwfile}"], stdout=subprocess.DEVNULL)
    as_postgres([str(binary / "pg_ctl"), "-D", str(data), "-w", "-l", str(data / "log"),
                 "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start"], stdout=subprocess.DEVNULL)
    dsn = f"host=127.0.0.1 port={port} user=postgres password={PASSWORD} dbname=postgres sslmode=disable"
    return (binary, data), dsn


def stop_postgres(handle):
    binary, data = handle
    as_postgres([str(binary / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"], stdout=subprocess.DEVNULL)


def latency(dsn, queries):
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(200):  # warm-up
            conn.execute("SELECT 1").fetchone()
        times = []
        for _ in range(queries):
            started = time.perf_counter_ns()
            conn.execute("SELECT 1").fetchone()
            times.append((time.perf_counter_ns() - started) / 1000)
    times.sort()
    return {"p50_us": times[len(times) // 2], "p99_us": times[int(len(times) * 0.99)]}


def copy_payload(rows):
    lines = [f"{i}\t{i % 1000}\t{i * 0.25}\tname {i % 5000}\n" for i in range(rows)]
    text = "".join(lines).encode()
    chunk = 1 << 20
    return [text[i : i + chunk] for i in range(0, len(text), chunk)]


def copy_in(dsn, payload, rows, run):
    table = f"copy_bench_{run}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id BIGINT, g INT, v DOUBLE PRECISION, s TEXT)")
        started = time.perf_counter()
        with conn.cursor().copy(f"COPY {table} FROM STDIN") as cp:
            for block in payload:
                cp.write(block)
        seconds = time.perf_counter() - started
        count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert count == rows, (count, rows)
        conn.execute(f"DROP TABLE {table}")
    return rows / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cirro", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="pg-wire-bench-"))
    os.chmod(work, 0o755)
    cirro, cirro_dsn = start_cirro(args.cirro, work, args.threads)
    postgres, pg_dsn = start_postgres(work)
    engines = {"cirro": cirro_dsn, "postgresql": pg_dsn}
    payload = copy_payload(args.rows)
    raw = {name: {"latency": [], "copy_rows_per_s": []} for name in engines}
    try:
        for run in range(args.runs):
            order = list(engines) if run % 2 == 0 else list(reversed(engines))
            for name in order:
                raw[name]["latency"].append(latency(engines[name], args.queries))
                raw[name]["copy_rows_per_s"].append(copy_in(engines[name], payload, args.rows, run))
    finally:
        cirro.kill()
        stop_postgres(postgres)
        shutil.rmtree(work, ignore_errors=True)

    summary = {}
    for name, figures in raw.items():
        summary[name] = {
            "select1_p50_us": statistics.median(r["p50_us"] for r in figures["latency"]),
            "select1_p99_us": statistics.median(r["p99_us"] for r in figures["latency"]),
            "copy_in_rows_per_s": statistics.median(figures["copy_rows_per_s"]),
        }
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "threads": args.threads,
        "queries": args.queries,
        "copy_rows": args.rows,
        "runs": args.runs,
        "postgresql": str(pg_bin().parent.name),
        "summary": summary,
        "raw": raw,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    c, p = summary["cirro"], summary["postgresql"]
    print("| measure | Cirro | PostgreSQL | Cirro / PostgreSQL |")
    print("|---|---:|---:|---:|")
    for key, label in [("select1_p50_us", "SELECT 1 p50 (µs)"), ("select1_p99_us", "SELECT 1 p99 (µs)"),
                       ("copy_in_rows_per_s", "COPY in (rows/s)")]:
        print(f"| {label} | {c[key]:,.0f} | {p[key]:,.0f} | {c[key] / p[key]:.2f} |")


if __name__ == "__main__":
    main()
