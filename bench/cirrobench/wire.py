"""The two suites that are not query lists:

dml    the CirroData paper's DML table (bench/dml_bench.py, the DML issue's
       code): insert, update and delete of 1 %, 10 %, 100 % of a table of
       100 M × sf rows, then delete + insert rounds, Cirro beside DuckDB's own
       database file; both engines' row counts and table checksums are
       compared after every step and a difference ends the run.

micro  single-row and 1,000-row-batch INSERT, UPDATE by key and point SELECT
       by key over the PostgreSQL protocol with 1, 4 and 16 concurrent
       clients, as the OSU Kudu micro-benchmarks measure them: latency p50
       and p99 and throughput, Cirro (`cirro serve`) beside PostgreSQL
       (Debian's package, a fresh cluster), and beside another Cirro binary
       with --baseline PATH (an older build: before/after in one run). Each
       client has its own connection (autocommit) and runs the operation for
       --duration seconds, parameters bound by server-side prepared
       statements. `point` is `SELECT v FROM pt WHERE k = $1` on a
       200,000-row table filled by INSERT … SELECT from generate_series.
       Afterwards each table's row count must equal the preloaded rows plus
       the rows the clients were told were inserted, and every point SELECT
       must have returned its key's one row.
"""

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .report import COLORS  # noqa: E402
from .runner import machine  # noqa: E402


def main(args, out):
    if not args.cirro or not Path(args.cirro).exists():
        sys.exit("cirro bench: the cirro binary is unknown: run through `cirro bench` or pass --cirro")
    if args.report_only:
        doc = json.loads((out / "results.json").read_text())
    elif args.suite == "dml":
        doc = run_dml(args)
    else:
        doc = run_micro(args)
    doc.update(command=" ".join(args.argv), machine=machine())
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    path = (dml_report if args.suite == "dml" else micro_report)(doc, out)
    print(f"cirro bench: report {path}", file=sys.stderr)
    if doc.get("failures"):
        print("cirro bench: FAILED:\n  " + "\n  ".join(doc["failures"]), file=sys.stderr)
        return 1
    return 0


def finish_report(fig, axes, lines, out, plot="scaling.png"):
    """Save the plot (`scaling.png`) and the report; returns the report's path."""
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / plot, dpi=110)
    plt.close(fig)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return out / "report.md"


# ---------------------------------------------------------------- dml


def run_dml(args):
    import dml_bench  # bench/dml_bench.py, on PYTHONPATH

    rows = int(round(100_000_000 * args.sf))
    work = args.data_dir / f"dml-sf{args.sf:g}"
    doc = dml_bench.run(rows, args.threads, args.cirro, work, rounds_wanted=10)
    shutil.rmtree(work, ignore_errors=True)
    doc.update(suite="dml", sf=args.sf)
    return doc


def dml_report(doc, out):
    steps = doc["steps"]
    lines = [f"# `dml` at SF {doc['sf']:g}: the CirroData DML table, {doc['rows']:,} rows, Cirro beside DuckDB", "",
             f"Machine: {doc['machine'].get('cpu')}, {doc['machine'].get('cpus')} CPUs; {doc['threads']} threads "
             "each. Cirro: its Delta table (each statement a `cirro sql` process, ~0.05 s of start-up included); "
             "DuckDB: its own database file, in-process. Row counts and table checksums were equal after every "
             "step.", "", f"Reproduce: `{doc.get('command')}`", "",
             "| step | rows | Cirro s | DuckDB s | Cirro / DuckDB |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {s['step']} | {s['rows']:,} | {s['cirro_s']:.2f} | {s['duckdb_s']:.2f} | {s['ratio']:.2f} |"
              for s in steps if not s["step"].startswith("round")]
    summ = doc["summary"]
    lines += ["", f"Rounds (delete 1 % then insert it again, 10 times), medians: delete Cirro "
              f"{summ['round_delete_median']['cirro']:.2f} s vs DuckDB {summ['round_delete_median']['duckdb']:.2f} s; "
              f"insert Cirro {summ['round_insert_median']['cirro']:.2f} s vs DuckDB "
              f"{summ['round_insert_median']['duckdb']:.2f} s. On disk at the end: Cirro "
              f"{summ['cirro_bytes'] / 1e9:.2f} GB, DuckDB {summ['duckdb_bytes'] / 1e9:.2f} GB.", "",
              "![scaling](scaling.png)"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, op in zip(axes, ("insert", "update", "delete")):
        pts = [s for s in steps if s["step"].startswith(op + " ")]
        for engine in ("cirro", "duckdb"):
            ax.plot([s["rows"] for s in pts], [s[f"{engine}_s"] for s in pts], marker="o", label=engine,
                    color=COLORS[engine])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{op} (1 %, 10 %, 100 % of the table)")
        ax.set_xlabel("rows affected")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3)
    return finish_report(fig, axes, lines, out)


# ---------------------------------------------------------------- micro

OPS = ["insert-1", "insert-1000", "update", "select", "point"]
POINT_ROWS = 200_000
CLIENTS = [1, 4, 16]


def _ensure_postgres():
    if Path("/usr/lib/postgresql").is_dir() and any(Path("/usr/lib/postgresql").iterdir()):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        sys.exit("cirro bench micro: PostgreSQL is the peer: install it (apt-get install postgresql)")
    print("cirro bench: installing PostgreSQL (the micro suite's peer)", file=sys.stderr)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "postgresql"], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def _statement(op, rng, next_id, preload):
    if op == "insert-1":
        i = next_id(1)
        return "INSERT INTO kv VALUES (%s, %s, %s)", (i, i * 7, f"n{i}"), 1
    if op == "insert-1000":
        first = next_id(1000)
        values = ", ".join(f"({i}, {i * 7}, 'n{i}')" for i in range(first, first + 1000))
        return f"INSERT INTO kv VALUES {values}", None, 1000
    if op == "point":
        key = rng.randrange(POINT_ROWS)
        return "SELECT v FROM pt WHERE k = %s", (key,), key
    key = rng.randrange(preload)
    if op == "update":
        return "UPDATE kv SET v = v + 1 WHERE id = %s", (key,), 1
    return "SELECT id, v, s FROM kv WHERE id = %s", (key,), key


def _clients(dsn, op, clients, duration, id_base, preload):
    """Run `op` from `clients` connections for `duration` seconds."""
    import psycopg

    lock = threading.Lock()
    counter = [id_base]

    def next_id(n):
        with lock:
            first = counter[0]
            counter[0] += n
            return first

    latencies, errors, inserted, bad_reads = [], [], [0], []
    barrier = threading.Barrier(clients + 1)

    def client(seed):
        rng = random.Random(seed)
        mine = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait()
            deadline = time.perf_counter() + duration
            while time.perf_counter() < deadline:
                sql, params, meta = _statement(op, rng, next_id, preload)
                start = time.perf_counter()
                try:
                    cur = conn.execute(sql, params, prepare=params is not None)
                    rows = cur.fetchall() if op in ("select", "point") else None
                except psycopg.Error as e:
                    with lock:
                        errors.append(f"{getattr(e, 'sqlstate', None)}: {str(e).splitlines()[0][:150]}")
                    continue
                mine.append(time.perf_counter() - start)
                if op.startswith("insert"):
                    with lock:
                        inserted[0] += meta
                elif op == "select" and (len(rows) != 1 or rows[0][0] != meta):
                    bad_reads.append(f"key {meta}: {rows[:2]}")
                elif op == "point" and rows != [(f"v{meta}",)]:
                    bad_reads.append(f"key {meta}: {rows[:2]}")
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(s,)) for s in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    wall = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    latencies.sort()
    n = len(latencies)
    return {"ops": n, "errors": len(errors), "first_error": errors[0] if errors else None,
            "p50_ms": latencies[n // 2] * 1000 if n else None,
            "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000 if n else None,
            "ops_per_s": n / wall, "rows_per_s": (n * (1000 if op == "insert-1000" else 1)) / wall,
            "inserted": inserted[0], "bad_reads": bad_reads[:5]}


def run_micro(args):
    import pg_wire  # bench/pg_wire.py: starting both servers
    import psycopg

    _ensure_postgres()
    preload = max(1000, int(round(100_000 * args.sf)))
    # under /tmp: PostgreSQL runs as `postgres`, which cannot enter /root
    work = Path(tempfile.mkdtemp(prefix="cirro-bench-micro-"))
    os.chmod(work, 0o755)
    cirro_proc, cirro_dsn = pg_wire.start_cirro(args.cirro, work / "new", args.threads)
    procs = [cirro_proc]
    dsns = {"cirro": cirro_dsn}
    if args.baseline:
        base_proc, dsns["cirro-baseline"] = pg_wire.start_cirro(args.baseline, work / "baseline", args.threads)
        procs.append(base_proc)
    pg_handle, pg_dsn = pg_wire.start_postgres(work)
    dsns["postgresql"] = pg_dsn
    failures, results = [], {}
    try:
        payload = "".join(f"{i}\t{i * 7}\tn{i}\n" for i in range(preload)).encode()
        for name, dsn in dsns.items():
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE kv (id BIGINT NOT NULL, v BIGINT, s VARCHAR)")
                with conn.cursor().copy("COPY kv FROM STDIN") as cp:
                    cp.write(payload)
                conn.execute("CREATE TABLE pt (k BIGINT NOT NULL, v VARCHAR)")
                conn.execute(f"INSERT INTO pt SELECT k, 'v' || k FROM generate_series(0, {POINT_ROWS - 1}) AS g(k)")
                if name == "postgresql":
                    conn.execute("ALTER TABLE kv ADD PRIMARY KEY (id)")
                    conn.execute("ALTER TABLE pt ADD PRIMARY KEY (k)")
        cells = [(op, c) for op in OPS for c in CLIENTS]
        id_base = 10**9
        from tqdm import tqdm

        for i, (op, clients) in enumerate(tqdm(cells, desc="micro", unit="cell", file=sys.stderr)):
            order = list(dsns) if i % 2 == 0 else list(reversed(list(dsns)))
            if args.ops and op not in args.ops.split(","):
                continue
            for name in order:
                r = _clients(dsns[name], op, clients, args.duration, id_base, preload)
                id_base += 10**8
                results.setdefault(f"{op}/{clients}", {})[name] = r
                if r["bad_reads"]:
                    failures.append(f"{name} {op} x{clients}: point SELECT returned wrong rows {r['bad_reads']}")
        for name, dsn in dsns.items():
            with psycopg.connect(dsn, autocommit=True) as conn:
                count = conn.execute("SELECT count(*) FROM kv").fetchone()[0]
            inserted = sum(r[name]["inserted"] for r in results.values())
            if count != preload + inserted:
                failures.append(f"{name}: kv has {count} rows, expected {preload} preloaded + {inserted} inserted")
        with psycopg.connect(pg_dsn) as conn:
            pg_version = conn.execute("SHOW server_version").fetchone()[0]
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
        pg_wire.stop_postgres(pg_handle)
        shutil.rmtree(work, ignore_errors=True)
    return {"suite": "micro", "sf": args.sf, "threads": args.threads, "preload_rows": preload,
            "engines": list(dsns), "baseline": args.baseline,
            "duration_s": args.duration, "results": results, "failures": failures,
            "versions": {"postgresql": pg_version, "psycopg": psycopg.__version__}}


def micro_report(doc, out):
    res = doc["results"]
    lines = [f"# `micro`: single-row operations over the PostgreSQL protocol, Cirro beside PostgreSQL "
             f"{doc['versions']['postgresql']}", "",
             f"Machine: {doc['machine'].get('cpu')}, {doc['machine'].get('cpus')} CPUs (clients, server and "
             f"peer share them); Cirro with {doc['threads']} threads. Table `kv(id BIGINT, v BIGINT, s VARCHAR)` "
             f"preloaded with {doc['preload_rows']:,} rows (PostgreSQL with a primary key on id; Cirro has no "
             f"indexes). Each cell: every client on its own autocommit connection (psycopg "
             f"{doc['versions']['psycopg']}, prepared statements) for {doc['duration_s']:g} s; engines "
             "alternate cell by cell.", "", f"Reproduce: `{doc.get('command')}`", ""]
    if doc.get("failures"):
        lines += ["## ❌ FAILURES", ""] + [f"- {f}" for f in doc["failures"]] + [""]
    else:
        lines += ["Checks: every point SELECT returned its key's row; each table's row count equals the "
                  "preload plus every insert the clients were told succeeded.", ""]
    names = doc.get("engines", ["cirro", "postgresql"])
    if doc.get("baseline"):
        lines += [f"`cirro-baseline` is `{doc['baseline']}`, measured in the same run.", ""]
    lines += ["| operation | clients | engine | p50 ms | p99 ms | ops/s | errors | throughput / PostgreSQL |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]

    def f(v, fmt="{:.2f}"):
        return "—" if v is None else fmt.format(v)

    for key, r in res.items():
        op, clients = key.split("/")
        peer = r.get("postgresql", {}).get("ops_per_s")
        for name in names:
            if name not in r:
                continue
            c = r[name]
            ratio = c["ops_per_s"] / peer if peer else None
            lines.append(f"| {op} | {clients} | {name} | {f(c['p50_ms'])} | {f(c['p99_ms'])} | "
                         f"{f(c['ops_per_s'], '{:,.0f}')} | {c['errors']} | {f(ratio, '{:.3f}')} |")
    errs = [(k, n, r[n]["first_error"]) for k, r in res.items() for n in r if r[n]["first_error"]]
    if errs:
        lines += ["", "First error per cell:", ""] + [f"- {k} {n}: {e}" for k, n, e in errs]
    lines += ["", "![throughput](scaling.png)"]
    fig, axes = plt.subplots(1, len(OPS), figsize=(4.5 * len(OPS), 4))
    for ax, op in zip(axes, OPS):
        for name in names:
            xs = [c for c in CLIENTS if f"{op}/{c}" in res and name in res[f"{op}/{c}"]]
            ax.plot(xs, [res[f"{op}/{c}"][name]["ops_per_s"] for c in xs], marker="o", label=name,
                    color=COLORS.get(name, "#1f77b4"))
        ax.set_title(op)
        ax.set_xlabel("clients")
        ax.set_ylabel("operations / s")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    return finish_report(fig, axes, lines, out)
