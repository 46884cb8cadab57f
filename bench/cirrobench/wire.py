"""The two suites that are not query lists:

dml    the CirroData paper's DML table (bench/dml_bench.py, the DML issue's
       code): insert, update and delete of 1 %, 10 %, 100 % of a table of
       100 M × sf rows, then delete + insert rounds, Cirro beside DuckDB's own
       database file; both engines' row counts and table checksums are
       compared after every step and a difference ends the run.

micro  single-row and 1,000-row-batch INSERT, UPDATE by key and point SELECT
       by key over the PostgreSQL protocol with 1, 4 and 16 concurrent
       clients, as the OSU Kudu micro-benchmarks measure them: latency p50
       and p99 and throughput; and PostgreSQL's own pgbench, its TPC-B-like
       and select-only scripts at --pgbench-scale (default 10). Cirro
       (`cirro serve --row-store on`) beside PostgreSQL (Debian's package, a
       fresh cluster, fsync and synchronous_commit on), beside another Cirro
       binary with --baseline PATH (an older build: before/after in one
       run), and beside itself with the write-ahead log on tmpfs
       (`cirro-wal-tmpfs`, the Kudu study's storage experiment; the writes
       only). Each client has its own connection (autocommit) and runs the
       operation for --duration seconds, parameters bound by server-side
       prepared statements. `point` is `SELECT v FROM pt WHERE k = $1` on a
       200,000-row table filled by INSERT … SELECT from generate_series.
       Every server is started afresh --starts times over the same data;
       figures are medians over the starts with their range. Afterwards
       each table's row count must equal the preloaded rows plus the rows
       the clients were told were inserted, every point SELECT must have
       returned its key's one row, pgbench must report 0 failed
       transactions, and its balance invariant must hold on every engine.
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

OPS = ["insert-1", "insert-1000", "update", "select", "point", "pgbench-tpcb", "pgbench-select"]
POINT_ROWS = 200_000
CLIENTS = [1, 4, 16]
# The Kudu study's storage experiment: the write-ahead log on tmpfs instead
# of the data disk, for the operations that wait for its fsync.
WAL_TMPFS_OPS = {"insert-1", "update", "pgbench-tpcb"}
PGBENCH_INVARIANT = (
    "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(tbalance) FROM pgbench_tellers) "
    "AND (SELECT sum(tbalance) FROM pgbench_tellers) = (SELECT sum(bbalance) FROM pgbench_branches) "
    "AND (SELECT sum(bbalance) FROM pgbench_branches) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)")


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


def parse_pgbench(out):
    """tps, average latency (ms), transactions and failed transactions from
    pgbench's summary (PostgreSQL 15's wording)."""
    def grab(prefix, cast=float):
        for line in out.splitlines():
            if line.startswith(prefix):
                return cast(line[len(prefix):].split()[0])
        return None

    return {"ops_per_s": grab("tps = "), "latency_avg_ms": grab("latency average = "),
            "ops": grab("number of transactions actually processed: ", lambda v: int(v.split("/")[0])),
            "failed": grab("number of failed transactions: ", int)}


def _pgbench_env(server):
    return {**os.environ, "PGPASSWORD": server["password"]}


def _pgbench_args(server):
    return ["-h", "127.0.0.1", "-p", str(server["port"]), "-U", server["user"]]


def _pgbench_load(server, scale):
    subprocess.run(["pgbench", "-q", "-i", "-s", str(scale), *_pgbench_args(server), server["db"]],
                   env=_pgbench_env(server), check=True, capture_output=True, text=True)


def _pgbench(server, op, clients, duration):
    """pgbench's TPC-B-like or select-only script (-n: the history keeps
    every run's rows for the invariant at the end)."""
    cmd = ["pgbench", "-n", "-c", str(clients), "-j", str(clients), "-T", str(max(1, round(duration))),
           "-M", "prepared", "--max-tries", "10", *_pgbench_args(server)]
    if op == "pgbench-select":
        cmd.append("-S")
    proc = subprocess.run([*cmd, server["db"]], env=_pgbench_env(server), capture_output=True, text=True)
    r = parse_pgbench(proc.stdout)
    problem = None
    if proc.returncode != 0 or r["ops_per_s"] is None:
        problem = f"pgbench exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"
    elif r["failed"]:
        problem = f"{r['failed']} failed transactions"
    return {**r, "p50_ms": None, "p99_ms": None, "errors": (r["failed"] or 0) + (1 if problem else 0),
            "first_error": problem, "inserted": 0, "bad_reads": []}


def _engines(args, work):
    """name → how its server is started. Cirro keeps small writes in its row
    store (`--row-store on`); `cirro-wal-tmpfs` is the same binary with its
    write-ahead log on tmpfs (/dev/shm)."""
    engines = {"cirro": {"binary": args.cirro, "data": work / "cirro", "flags": ["--row-store", "on"]}}
    if args.baseline:
        engines["cirro-baseline"] = {"binary": args.baseline, "data": work / "baseline",
                                     "flags": ["--row-store", "on"]}
    if Path("/dev/shm").is_dir() and not args.no_wal_tmpfs:
        wal = Path(tempfile.mkdtemp(prefix="cirro-bench-wal-", dir="/dev/shm"))
        engines["cirro-wal-tmpfs"] = {"binary": args.cirro, "data": work / "cirro-tmpfs", "wal": wal,
                                      "flags": ["--row-store", "on", "--wal-dir", str(wal)],
                                      "ops": WAL_TMPFS_OPS}
    engines["postgresql"] = {}
    return engines


def _start(name, spec, work, threads):
    import pg_wire

    if name == "postgresql":
        handle, dsn = pg_wire.start_postgres(work)
        port = int(dsn.split("port=")[1].split()[0])
        return {"handle": handle, "dsn": dsn, "port": port, "user": "postgres", "db": "postgres",
                "password": pg_wire.PASSWORD}
    proc, dsn = pg_wire.start_cirro(spec["binary"], spec["data"], threads, spec["flags"])
    port = int(dsn.split("port=")[1].split()[0])
    return {"proc": proc, "dsn": dsn, "port": port, "user": "cirro", "db": "cirro", "password": pg_wire.PASSWORD}


def _stop(server):
    import pg_wire

    if "handle" in server:
        pg_wire.stop_postgres(server["handle"])
    else:
        server["proc"].terminate()
        server["proc"].wait(timeout=120)


def _load(name, server, preload, scale):
    import psycopg

    payload = "".join(f"{i}\t{i * 7}\tn{i}\n" for i in range(preload)).encode()
    with psycopg.connect(server["dsn"], autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (id BIGINT NOT NULL, v BIGINT, s VARCHAR)")
        with conn.cursor().copy("COPY kv FROM STDIN") as cp:
            cp.write(payload)
        conn.execute("CREATE TABLE pt (k BIGINT NOT NULL, v VARCHAR)")
        conn.execute(f"INSERT INTO pt SELECT k, 'v' || k FROM generate_series(0, {POINT_ROWS - 1}) AS g(k)")
        conn.execute("ALTER TABLE kv ADD PRIMARY KEY (id)")
        conn.execute("ALTER TABLE pt ADD PRIMARY KEY (k)")
    _pgbench_load(server, scale)


def run_micro(args):
    import psycopg

    _ensure_postgres()
    if not shutil.which("pgbench"):
        sys.exit("cirro bench micro: pgbench (Debian's postgresql-client) is not on PATH")
    preload = max(1000, int(round(100_000 * args.sf)))
    scale = args.pgbench_scale
    ops = [op for op in OPS if not args.ops or op in args.ops.split(",")]
    # under /tmp: PostgreSQL runs as `postgres`, which cannot enter /root
    work = Path(tempfile.mkdtemp(prefix="cirro-bench-micro-"))
    os.chmod(work, 0o755)
    engines = _engines(args, work)
    failures, results, inserted = [], {}, {name: 0 for name in engines}
    servers = {}
    id_base = 10**9
    from tqdm import tqdm

    try:
        for start in range(args.starts):
            # Fresh server processes of every engine for each start; the data stays.
            for name, spec in engines.items():
                servers[name] = _start(name, spec, work, args.threads)
                if start == 0:
                    _load(name, servers[name], preload, scale)
            cells = [(op, c) for op in ops for c in CLIENTS]
            for i, (op, clients) in enumerate(tqdm(cells, desc=f"micro, start {start + 1}/{args.starts}",
                                                  unit="cell", file=sys.stderr)):
                names = [n for n in engines if op in engines[n].get("ops", OPS)]
                for name in (names if (i + start) % 2 == 0 else list(reversed(names))):
                    if op.startswith("pgbench"):
                        r = _pgbench(servers[name], op, clients, args.duration)
                    else:
                        r = _clients(servers[name]["dsn"], op, clients, args.duration, id_base, preload)
                        id_base += 10**8
                    inserted[name] += r["inserted"]
                    results.setdefault(f"{op}/{clients}", {}).setdefault(name, []).append(r)
                    if r["bad_reads"]:
                        failures.append(f"{name} {op} x{clients}: point SELECT returned wrong rows {r['bad_reads']}")
                    if op.startswith("pgbench") and r["first_error"]:
                        failures.append(f"{name} {op} x{clients}, start {start + 1}: {r['first_error']}")
            if start + 1 < args.starts:
                for name in list(servers):
                    _stop(servers.pop(name))
        for name, server in servers.items():
            with psycopg.connect(server["dsn"], autocommit=True) as conn:
                count = conn.execute("SELECT count(*) FROM kv").fetchone()[0]
                holds = conn.execute(PGBENCH_INVARIANT).fetchone()[0]
                history = conn.execute("SELECT count(*) FROM pgbench_history").fetchone()[0]
            if count != preload + inserted[name]:
                failures.append(f"{name}: kv has {count} rows, expected {preload} preloaded + "
                                f"{inserted[name]} inserted")
            if holds is not True:
                failures.append(f"{name}: pgbench's balance invariant does not hold ({history} history rows)")
        with psycopg.connect(servers["postgresql"]["dsn"]) as conn:
            pg_version = conn.execute("SHOW server_version").fetchone()[0]
    finally:
        for server in servers.values():
            try:
                _stop(server)
            except Exception as e:  # noqa: BLE001 - the others still stop
                print(f"cirro bench: stopping a server: {e}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        for spec in engines.values():
            if "wal" in spec:
                shutil.rmtree(spec["wal"], ignore_errors=True)
    return {"suite": "micro", "sf": args.sf, "threads": args.threads, "preload_rows": preload,
            "pgbench_scale": scale, "starts": args.starts,
            "engines": list(engines), "baseline": args.baseline,
            "duration_s": args.duration, "results": results, "failures": failures,
            "versions": {"postgresql": pg_version, "psycopg": psycopg.__version__}}


def summarize(runs, key):
    """The median of `key` over the starts' runs, with its range."""
    values = sorted(r[key] for r in runs if r.get(key) is not None)
    if not values:
        return None, None, None
    return statistics.median(values), values[0], values[-1]


def micro_report(doc, out):
    res = doc["results"]
    starts = doc.get("starts", 1)
    lines = [f"# `micro`: single-row operations and pgbench over the PostgreSQL protocol, Cirro beside "
             f"PostgreSQL {doc['versions']['postgresql']}", "",
             f"Machine: {doc['machine'].get('cpu')}, {doc['machine'].get('cpus')} CPUs (clients, server and "
             f"peer share them); Cirro with {doc['threads']} threads and its row store (`--row-store on`). "
             f"Table `kv(id BIGINT PRIMARY KEY, v BIGINT, s VARCHAR)` preloaded with {doc['preload_rows']:,} "
             f"rows, `pt(k BIGINT PRIMARY KEY, v VARCHAR)` with {POINT_ROWS:,}; pgbench's tables at scale "
             f"{doc.get('pgbench_scale')}. Each cell: every client on its own autocommit connection (psycopg "
             f"{doc['versions']['psycopg']}, prepared statements; pgbench `-M prepared --max-tries 10`) for "
             f"{doc['duration_s']:g} s; engines alternate cell by cell. Every engine's servers are started "
             f"afresh {starts} time(s) (PostgreSQL with fsync and synchronous_commit on); a figure is the "
             "median over the starts, with the range.", "",
             f"Reproduce: `{doc.get('command')}`", ""]
    if doc.get("failures"):
        lines += ["## ❌ FAILURES", ""] + [f"- {f}" for f in doc["failures"]] + [""]
    else:
        lines += ["Checks: every point SELECT returned its key's row; each table's row count equals the "
                  "preload plus every insert the clients were told succeeded; pgbench reported 0 failed "
                  "transactions and afterwards the sums of the accounts', tellers' and branches' balances "
                  "and of the history's deltas were equal on every engine.", ""]
    names = doc.get("engines", ["cirro", "postgresql"])
    if doc.get("baseline"):
        lines += [f"`cirro-baseline` is `{doc['baseline']}`, measured in the same run.", ""]
    if "cirro-wal-tmpfs" in names:
        lines += ["`cirro-wal-tmpfs` is the same binary with `--wal-dir` on tmpfs (/dev/shm), for the "
                  "operations that wait for the log's fsync (the Kudu study's storage experiment); "
                  "`cirro`'s log is in its data directory, on the disk.", ""]
    lines += ["| operation | clients | engine | p50 ms | p99 ms | ops/s: median (min–max) | errors | "
              "throughput / PostgreSQL |", "|---|---:|---|---:|---:|---:|---:|---:|"]

    def f(v, fmt="{:.2f}"):
        return "—" if v is None else fmt.format(v)

    def runs_of(r, name):
        v = r.get(name, [])
        return v if isinstance(v, list) else [v]  # results of one start, before --starts

    for key, r in res.items():
        op, clients = key.split("/")
        peer = summarize(runs_of(r, "postgresql"), "ops_per_s")[0]
        for name in names:
            runs = runs_of(r, name)
            if not runs:
                continue
            mid, lo, hi = summarize(runs, "ops_per_s")
            p50 = summarize(runs, "p50_ms")[0]
            if p50 is None:
                p50 = summarize(runs, "latency_avg_ms")[0]
            ratio = mid / peer if peer and mid else None
            spread = f" ({f(lo, '{:,.0f}')}–{f(hi, '{:,.0f}')})" if len(runs) > 1 else ""
            lines.append(f"| {op} | {clients} | {name} | {f(p50)} | {f(summarize(runs, 'p99_ms')[0])} | "
                         f"{f(mid, '{:,.0f}')}{spread} | {sum(x['errors'] for x in runs)} | "
                         f"{f(ratio, '{:.3f}')} |")
    lines += ["", "pgbench gives no percentiles: its rows show the average latency in the p50 column."]
    errs = [(k, n, x["first_error"]) for k, r in res.items() for n in r for x in runs_of(r, n)
            if x["first_error"]]
    if errs:
        lines += ["", "First error per cell:", ""] + [f"- {k} {n}: {e}" for k, n, e in errs]
    lines += ["", "![throughput](scaling.png)"]
    shown = [op for op in OPS if any(k.startswith(op + "/") for k in res)]
    fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown), 4), squeeze=False)
    axes = list(axes[0])
    for ax, op in zip(axes, shown):
        for name in names:
            xs = [c for c in CLIENTS if f"{op}/{c}" in res and runs_of(res[f"{op}/{c}"], name)]
            ax.plot(xs, [summarize(runs_of(res[f"{op}/{c}"], name), "ops_per_s")[0] for c in xs], marker="o",
                    label=name, color=COLORS.get(name, None))
        ax.set_title(op)
        ax.set_xlabel("clients")
        ax.set_ylabel("operations / s")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    return finish_report(fig, axes, lines, out)
