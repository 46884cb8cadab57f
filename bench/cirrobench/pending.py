"""`pending`: TPC-H with small writes waiting in Cirro's row store (issue 59).

The TPC-H data set at --sf (`cirro load tpch`), copied once into a location
whose `orders` and `lineitem` have primary keys (o_orderkey; l_orderkey,
l_linenumber). For each of --starts, two fresh server processes
(`cirro serve --row-store on`, their background flush held back for the
run), each on its own fresh copy of that location:

  1. --changes small writes by key from 4 clients to the second server: a
     third inserts (new orders, each with three line items, values copied
     from existing ones), a third updates (l_quantity, l_extendedprice;
     o_totalprice), a third deletes, of lineitem and orders; the writes
     commute, so the order the clients' statements land in does not change
     the result;
  2. checks that they wait in the row stores (neither table's Delta log
     has a new commit);
  3. the 22 queries, each with a warm-up on both servers and then --runs
     hot runs alternating between the server with empty row stores and the
     one with the writes pending, so that a slow spell of the machine
     falls on both sides (run one after the other, the two sides differed
     by up to 1.4x on a query from one run of the bench to the next).

Every timed run's answer (hot runs included) is compared with DuckDB's on
the same data with the same changes (its own tables, loaded from the same
Parquet files; the changes applied one by one). Reported: per query the
median over the starts of each start's median, empty against pending, and
the totals (issue 59: total ≤ 1.1×, no query over 1.25×).
"""

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import compare, data, engines, suites
from .runner import machine

CLIENTS = 4
LINES_PER_ORDER = 3
ORDER_COLUMNS = ["o_orderkey", "o_custkey", "o_orderstatus", "o_totalprice", "o_orderdate",
                 "o_orderpriority", "o_clerk", "o_shippriority", "o_comment"]
LINE_COLUMNS = ["l_orderkey", "l_partkey", "l_suppkey", "l_linenumber", "l_quantity", "l_extendedprice",
                "l_discount", "l_tax", "l_returnflag", "l_linestatus", "l_shipdate", "l_commitdate",
                "l_receiptdate", "l_shipinstruct", "l_shipmode", "l_comment"]


def _placeholders(n):
    return ", ".join(["%s"] * n)


def _sample(duck, table, columns, rows, seed):
    """`rows` rows of `columns` of `table`, drawn by DuckDB's reservoir
    sample with `seed` (the same rows every run)."""
    return duck.execute(f"SELECT {', '.join(columns)} FROM {table} USING SAMPLE reservoir({rows} ROWS) "
                        f"REPEATABLE ({seed})").fetchall()


def make_changes(duck, count, seed=59):
    """The small writes, as (sql with %s placeholders, parameters), drawn
    from DuckDB's copy of the data: inserts of new orders (keys above every
    existing one) with their line items, updates and deletes of existing
    keys. Every update adds a constant, so updates and deletes of one key
    commute; inserted keys are new and distinct."""
    rng = random.Random(seed)
    inserts = count // 3
    updates = count // 3
    deletes = count - inserts - updates
    orders_new = max(1, -(-inserts // (1 + LINES_PER_ORDER)))
    top = duck.execute("SELECT max(o_orderkey) FROM orders").fetchone()[0]
    templates = _sample(duck, "orders", ORDER_COLUMNS, orders_new, seed)
    lines = _sample(duck, "lineitem", LINE_COLUMNS, LINES_PER_ORDER * orders_new, seed)
    changes = []
    for i, order in enumerate(templates):
        key = top + 1 + i
        changes.append((f"INSERT INTO orders VALUES ({_placeholders(len(ORDER_COLUMNS))})",
                        (key, *order[1:])))
        for n in range(LINES_PER_ORDER):
            line = lines[(i * LINES_PER_ORDER + n) % len(lines)]
            changes.append((f"INSERT INTO lineitem VALUES ({_placeholders(len(LINE_COLUMNS))})",
                            (key, line[1], line[2], n + 1, *line[4:])))
    keys = _sample(duck, "lineitem", ["l_orderkey", "l_linenumber"], updates + deletes, seed + 1)
    order_keys = _sample(duck, "orders", ["o_orderkey"], updates + deletes, seed + 2)
    for i in range(updates):
        if i % 4 == 3:
            changes.append(("UPDATE orders SET o_totalprice = o_totalprice + 1 WHERE o_orderkey = %s",
                            (order_keys[i][0],)))
        else:
            k, n = keys[i]
            changes.append(("UPDATE lineitem SET l_quantity = l_quantity + 1, "
                            "l_extendedprice = l_extendedprice + 10 WHERE l_orderkey = %s AND l_linenumber = %s",
                            (k, n)))
    for i in range(updates, updates + deletes):
        if i % 4 == 3:
            changes.append(("DELETE FROM orders WHERE o_orderkey = %s", (order_keys[i][0],)))
        else:
            k, n = keys[i]
            changes.append(("DELETE FROM lineitem WHERE l_orderkey = %s AND l_linenumber = %s", (k, n)))
    rng.shuffle(changes)
    return changes[:count]


def apply_one_by_one(duck, changes):
    """The changes as Cirro's clients send them, statement by statement."""
    for sql, params in changes:
        duck.execute(sql.replace("%s", "?"), params)


def apply_duckdb(duck, changes):
    """The changes in bulk (DuckDB has no index that makes 100,000 UPDATEs
    by key fast): since they commute, their sum — each key's updates
    counted, then the deletes, then the inserts — leaves what
    `apply_one_by_one` leaves (the harness's tests check it)."""
    import pyarrow as pa

    inserts = {"orders": [], "lineitem": []}
    updates = {"orders": {}, "lineitem": {}}
    deletes = {"orders": [], "lineitem": []}
    for sql, params in changes:
        words = sql.split()
        if words[0] == "INSERT":
            inserts[words[2]].append(params)
        elif words[0] == "UPDATE":
            updates[words[1]][params] = updates[words[1]].get(params, 0) + 1
        else:
            deletes[words[2]].append(params)
    keys = {"orders": ["o_orderkey"], "lineitem": ["l_orderkey", "l_linenumber"]}
    for table, counted in updates.items():
        if not counted:
            continue
        names = keys[table]
        cols = {n: [k[i] for k in counted] for i, n in enumerate(names)}
        duck.register("cirro_bench_updates", pa.table({**cols, "times": list(counted.values())}))
        sets = ("o_totalprice = o_totalprice + u.times" if table == "orders" else
                "l_quantity = l_quantity + u.times, l_extendedprice = l_extendedprice + 10 * u.times")
        on = " AND ".join(f"{table}.{n} = u.{n}" for n in names)
        duck.execute(f"UPDATE {table} SET {sets} FROM cirro_bench_updates u WHERE {on}")
        duck.unregister("cirro_bench_updates")
    for table, gone in deletes.items():
        if not gone:
            continue
        names = keys[table]
        duck.register("cirro_bench_deletes", pa.table({n: [k[i] for k in gone] for i, n in enumerate(names)}))
        on = " AND ".join(f"{table}.{n} = d.{n}" for n in names)
        duck.execute(f"DELETE FROM {table} USING cirro_bench_deletes d WHERE {on}")
        duck.unregister("cirro_bench_deletes")
    for table, rows in inserts.items():
        if not rows:
            continue
        names = ORDER_COLUMNS if table == "orders" else LINE_COLUMNS
        duck.register("cirro_bench_inserts", pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}))
        duck.execute(f"INSERT INTO {table} SELECT * FROM cirro_bench_inserts")
        duck.unregister("cirro_bench_inserts")


def apply_cirro(dsn, changes):
    """The changes from CLIENTS autocommit connections (prepared
    statements); returns (seconds, errors)."""
    import psycopg

    errors = []
    parts = [changes[i::CLIENTS] for i in range(CLIENTS)]

    def client(part):
        with psycopg.connect(dsn, autocommit=True) as conn:
            for sql, params in part:
                try:
                    conn.execute(sql, params, prepare=True)
                except psycopg.Error as e:
                    errors.append(f"{sql[:60]} {params[:2]}: {str(e).splitlines()[0][:200]}")

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, errors


def keyed_location(args, root):
    """The TPC-H location with primary keys on orders and lineitem, made
    once beside the data set."""
    suite, make_tables, _ = suites.get("tpch")
    source, tables, _ = data.prepare(suite, make_tables, args.sf, root, args.cirro, args.threads)
    keyed = root / "cirro-keyed"
    if (keyed / "READY").exists():
        return keyed, tables
    shutil.rmtree(keyed, ignore_errors=True)
    shutil.copytree(source, keyed)
    for sql in ("ALTER TABLE orders ADD PRIMARY KEY (o_orderkey)",
                "ALTER TABLE lineitem ADD PRIMARY KEY (l_orderkey, l_linenumber)"):
        print(f"cirro bench pending: {sql}", file=sys.stderr, flush=True)
        subprocess.run([args.cirro, "--data", str(keyed), "--threads", str(args.threads), "sql", "-c", sql],
                       check=True)
    (keyed / "READY").write_text("keys added\n")
    return keyed, tables


def _commits(location, table):
    dirs = [d for d in (location / "data").rglob("_delta_log") if d.parent.name.startswith(f"{table}-")]
    return sum(len(list(d.glob("*.json"))) for d in dirs)


def _run_checked(server, query, reference, failures, label):
    """`query`'s seconds on `server`, its answer compared with `reference`
    after the timer stopped (None: it failed, which is reported)."""
    start = time.perf_counter()
    try:
        got = server.run(query.sql)
    except Exception as e:  # noqa: BLE001 - a failed query is reported, the run goes on
        failures.append(f"{label} {query.id}: {str(e).splitlines()[0][:200]}")
        return None
    took = time.perf_counter() - start
    try:
        compare.compare(got, reference, f"{label} {query.id}")
    except compare.Mismatch as e:
        failures.append(str(e)[:300])
    return took


def _timed_pair(sides, query, runs, failures, label):
    """A warm-up of `query` on each of `sides` (name → (server, reference
    answer)), then `runs` hot runs taking turns; every answer compared.
    The hot runs' seconds, by side."""
    times = {name: [] for name in sides}
    for i in range(runs + 1):
        for name, (server, reference) in sides.items():
            took = _run_checked(server, query, reference, failures, f"{label}, {name}")
            if took is None:
                return times
            if i > 0:
                times[name].append(took)
    return times


def run(args, out):
    root = args.data_dir / f"tpch-sf{args.sf:g}"
    keyed, tables = keyed_location(args, root)
    queries = suites.tpch_queries(args.sf)
    if args.queries:
        queries = [q for q in queries if q.id in args.queries.split(",")]
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    ctx = engines.Context(tables, args.threads, work)
    duck = engines.DuckDBNative(ctx)
    print("cirro bench pending: the reference answers (DuckDB)", file=sys.stderr, flush=True)
    before = {q.id: duck.run(q.sql) for q in queries}
    changes = make_changes(duck.con, args.changes)
    apply_duckdb(duck.con, changes)
    after = {q.id: duck.run(q.sql) for q in queries}
    duck_version = duck.version
    duck.close()
    kinds = {}
    for sql, _ in changes:
        kind = f"{sql.split()[0].lower()} {sql.split()[2] if sql.startswith(('INSERT', 'DELETE')) else sql.split()[1]}"
        kinds[kind] = kinds.get(kind, 0) + 1
    failures, starts = [], []
    for s in range(args.starts):
        servers, locations = {}, {}
        try:
            for side in ("empty", "pending"):
                location = work / f"start-{s}-{side}"
                shutil.rmtree(location, ignore_errors=True)
                shutil.copytree(keyed, location)
                locations[side] = location
                ctx = engines.Context(tables, args.threads, work, args.cirro, location, "pg")
                ctx.cirro_env = {"CIRRO_ROW_STORE": "on", "CIRRO_ROW_STORE_FLUSH": "86400"}
                ctx.cirro_settings = [("statement_timeout", f"{int(args.timeout * 1000)}")]
                servers[side] = engines.Cirro(ctx)
            server = servers["pending"]
            commits = {t: _commits(locations["pending"], t) for t in ("orders", "lineitem")}
            dsn = (f"host=127.0.0.1 port={server.ports['pg']} user=cirro dbname=cirro "
                   f"password={server.PASSWORD} sslmode=disable")
            seconds, errors = apply_cirro(dsn, changes)
            failures += [f"start {s + 1}: {e}" for e in errors[:5]]
            now = {t: _commits(locations["pending"], t) for t in ("orders", "lineitem")}
            if now != commits:
                failures.append(f"start {s + 1}: the changes did not wait in the row stores "
                                f"(Delta commits {commits} → {now})")
            empty, pending = {}, {}
            for q in queries:
                sides = {"empty": (servers["empty"], before[q.id]), "pending": (server, after[q.id])}
                times = _timed_pair(sides, q, args.runs, failures, f"start {s + 1}")
                empty[q.id], pending[q.id] = times["empty"], times["pending"]
        finally:
            for server in servers.values():
                server.proc.kill()  # a clean stop would flush the stores first; the copy is thrown away
                server.proc.wait()
            for location in locations.values():
                shutil.rmtree(location, ignore_errors=True)
        starts.append({"empty": empty, "pending": pending, "apply_seconds": seconds,
                       "writes_per_second": len(changes) / seconds if seconds else None})
        print(f"cirro bench pending: start {s + 1}: {len(changes):,} writes in {seconds:.1f} s", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    doc = {"suite": "pending", "sf": args.sf, "threads": args.threads, "changes": len(changes), "kinds": kinds,
           "runs": args.runs, "starts": starts, "failures": failures, "queries": [q.id for q in queries],
           "versions": {"duckdb": duck_version}, "command": " ".join(args.argv), "machine": machine()}
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    path = report(doc, out)
    print(f"cirro bench: report {path}", file=sys.stderr)
    if failures:
        print("cirro bench: FAILED:\n  " + "\n  ".join(failures[:20]), file=sys.stderr)
        return 1
    return 0


def _median_over_starts(doc, side, qid):
    per_start = [statistics.median(s[side][qid]) for s in doc["starts"] if s[side].get(qid)]
    if not per_start:
        return None, None, None
    return statistics.median(per_start), min(per_start), max(per_start)


def report(doc, out):
    lines = [f"# `pending`: TPC-H SF {doc['sf']:g} with {doc['changes']:,} small writes waiting in the row store",
             "", f"Machine: {doc['machine'].get('cpu')}, {doc['machine'].get('cpus')} CPUs; Cirro with "
             f"{doc['threads']} threads, `cirro serve --row-store on` (background flush held back), over the "
             f"PostgreSQL protocol. Writes: {', '.join(f'{v:,} {k}' for k, v in sorted(doc['kinds'].items()))}, "
             f"by key from {CLIENTS} clients. Each query: a warm-up on each side, then {doc['runs']} hot runs "
             f"alternating between a server with empty row stores and one with the writes pending, in each of "
             f"{len(doc['starts'])} starts of two fresh server processes; a time is the median over the starts "
             f"of each start's median (range over the starts). Every run's answer was compared with DuckDB "
             f"{doc['versions']['duckdb']}'s on the same data with the same changes.", "",
             f"Reproduce: `{doc['command']}`", ""]
    if doc["failures"]:
        lines += ["## ❌ FAILURES", ""] + [f"- {f}" for f in doc["failures"][:50]] + [""]
    lines += ["| query | empty row store s | with the writes pending s | ratio |", "|---|---:|---:|---:|"]
    total_empty = total_pending = 0.0
    worst = (0, None)
    for qid in doc["queries"]:
        e, elo, ehi = _median_over_starts(doc, "empty", qid)
        p, plo, phi = _median_over_starts(doc, "pending", qid)
        if e is None or p is None:
            lines.append(f"| {qid} | — | — | — |")
            continue
        total_empty += e
        total_pending += p
        ratio = p / e
        worst = max(worst, (ratio, qid))
        lines.append(f"| {qid} | {e:.3f} ({elo:.3f}–{ehi:.3f}) | {p:.3f} ({plo:.3f}–{phi:.3f}) | {ratio:.2f} |")
    if total_empty:
        lines.append(f"| **total** | **{total_empty:.2f}** | **{total_pending:.2f}** | "
                     f"**{total_pending / total_empty:.2f}** |")
        lines += ["", f"Slowest against its empty-store time: {worst[1]} at {worst[0]:.2f}×. Writes: "
                  + ", ".join(f"{s['writes_per_second']:,.0f}/s" for s in doc["starts"]) + " (per start)."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
