"""Running a query suite on Cirro and its peers.

Per query, the engines alternate (the order rotates by query and by run, so
drift of the machine affects all alike). Run 0 is the cold run (the first
time that engine sees the query; with --drop-caches the page cache is emptied
before it), then `runs` hot runs whose median is the figure. A query past
`timeout` seconds is ended (its engine's process killed and restarted) and
recorded as a timeout; a query an engine cannot run is recorded with its
error. Nothing is skipped silently.

Correctness guard: the cold-run result of Cirro is compared value by value
with DuckDB's (on the same Parquet files); a mismatch is recorded, printed,
and fails the run (exit status 1) once the report is written. Peers' results
are checked against DuckDB's too (if small enough to ship back) and a wrong
answer is recorded as such.

State is saved after every query in `<out>/results.json`; a later run with
the same settings resumes after the last finished query.
"""

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from . import compare, engines, probe
from .worker import EngineFailed, Worker

TERMINAL = ("error", "timeout", "unavailable")


def machine():
    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def drop_caches():
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _config(args, names):
    config = {"suite": args.suite, "sf": args.sf, "threads": args.threads, "runs": args.runs, "engines": names}
    if args.wire != "flight":
        config["wire"] = args.wire  # (absent for Flight: earlier results resume)
    if getattr(args, "settings", None):
        config["settings"] = [f"{n}={v}" for n, v in args.settings]
    if getattr(args, "memory_limit", None):
        config["memory_limit"] = args.memory_limit
    return config


def load_state(path, config, fresh):
    if path.exists() and not fresh:
        state = json.loads(path.read_text())
        if state.get("config") == config:
            done = sum(1 for q in state["queries"].values() if q.get("done"))
            print(f"cirro bench: resuming {path} ({done} queries done; --fresh starts over)", file=sys.stderr)
            return state
        print(f"cirro bench: {path} holds a run with other settings; starting over", file=sys.stderr)
    return {"config": config, "queries": {}, "mismatches": [], "versions": {}, "setup": {}}


def save_state(path, state):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(path)


def run_suite(args, suite, queries, ctx, facts, out):
    names = ["cirro"] + [p for p in args.peers if p != "cirro"]
    if engines.REFERENCE not in names:
        names.append(engines.REFERENCE)  # the correctness guard needs it
    state_path = out / "results.json"
    state = load_state(state_path, _config(args, names), args.fresh)
    state.update({"command": " ".join(args.argv), "machine": machine(), "data": facts,
                  "timeout_seconds": args.timeout})
    state["query_meta"] = {q.id: {"series": q.series, "x": q.x, "x_label": q.x_label, "sql": q.sql}
                          for q in queries}
    state.setdefault("started", time.strftime("%Y-%m-%d %H:%M:%S"))

    if suite.scan_bound and "probe" not in state and not args.no_probe:
        print("cirro bench: measuring memory bandwidth", file=sys.stderr, flush=True)
        state["probe"] = probe.run(ctx.tables, suite.scan_bound, args.threads)
        save_state(state_path, state)

    spill = Path(tempfile.mkdtemp(prefix="cirro-bench-"))
    workers = {n: Worker(n, ctx, str(spill)) for n in names}
    unavailable = {}
    for n, w in workers.items():
        try:
            info = w.start()
            state["versions"][n] = info["version"]
            if info.get("load_seconds") is not None:
                state["setup"][f"{n}_load_seconds"] = round(info["load_seconds"], 2)
        except EngineFailed as e:
            unavailable[n] = str(e)
            print(f"cirro bench: {n} cannot run: {e}", file=sys.stderr)
    save_state(state_path, state)

    todo = [q for q in queries if not state["queries"].get(q.id, {}).get("done")]
    bar = tqdm(total=len(todo) * (args.runs + 1) * len(names), desc=f"{args.suite} sf{args.sf:g}", unit="run",
               file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30)
    try:
        for qi, q in enumerate(queries):
            if q not in todo:
                continue
            rec = {n: {"status": "ok", "cold": None, "hot": [], "rows": None} for n in names}
            for n, why in unavailable.items():
                rec[n].update(status="unavailable", error=why)
            results = {}
            for r in range(args.runs + 1):
                shift = (qi + r) % len(names)
                for n in names[shift:] + names[:shift]:
                    bar.update(1)
                    if rec[n]["status"] in TERMINAL:
                        continue
                    bar.set_postfix_str(f"{q.id} {n}")
                    if r == 0 and args.drop_caches:
                        drop_caches()
                    keep = "all" if n in ("cirro", engines.REFERENCE) else "small"
                    try:
                        res = workers[n].run(q.sql, args.timeout, keep=keep if r == 0 else None, tag=q.id)
                    except EngineFailed as e:
                        res = ("error", f"restart failed: {e}")
                    if res[0] != "ok":
                        rec[n].update(status=res[0], error=res[1])
                        continue
                    _, seconds, rows, table = res
                    if r == 0:
                        rec[n]["cold"], rec[n]["rows"] = seconds, rows
                        results[n] = table
                    else:
                        rec[n]["hot"].append(seconds)
                if r == 0:
                    # check the cold results now, then let them go before the hot runs
                    verdict = check(q, rec, results, state)
                    results.clear()
                    for f in spill.glob("*"):
                        f.unlink()
            for n in names:
                times = rec[n]["hot"] or ([rec[n]["cold"]] if rec[n]["cold"] is not None else [])
                rec[n]["median"] = statistics.median(times) if rec[n]["status"] not in TERMINAL and times else None
            state["queries"][q.id] = {"done": True, "engines": rec, "check": verdict}
            save_state(state_path, state)
    finally:
        bar.close()
        for w in workers.values():
            w.stop()
        for f in spill.glob("*"):
            f.unlink()
        spill.rmdir()
    state["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save_state(state_path, state)
    return state


def check(q, rec, results, state):
    """The correctness guard for one query (see the module's doc); returns the verdict."""
    ref = engines.REFERENCE
    if rec[ref]["status"] != "ok" or results.get(ref) is None:
        return f"unchecked: {ref} {rec[ref]['status']}"
    verdict = f"unchecked: cirro {rec['cirro']['status']}"
    for n, table in results.items():
        if n == ref or table is None:
            continue
        try:
            compare.compare(table, results[ref], what=f"{q.id} {n} vs {ref}")
        except compare.Mismatch as e:
            if n == "cirro":
                state["mismatches"].append(str(e))
                print(f"\n*** CORRECTNESS FAILURE: {e}\n", file=sys.stderr, flush=True)
                verdict = f"MISMATCH: {e}"
            else:
                rec[n].update(status="wrong", error=str(e)[:500])
            continue
        if n == "cirro":
            verdict = f"equal to {ref} ({table.num_rows} rows)"
    return verdict
