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
    config = {"suite": args.suite, "sf": args.sf, "threads": args.threads, "runs": args.runs, "engines": names,
              "starts": getattr(args, "starts", 1)}
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
        # Never overwrite a run's results: the earlier one is kept beside.
        kept = path.with_name(f"results-{state.get('started', 'earlier').replace(' ', 'T').replace(':', '')}.json")
        path.replace(kept)
        print(f"cirro bench: {path} holds a run with other settings (kept as {kept.name}); starting over",
              file=sys.stderr)
    elif path.exists():
        kept = keep_earlier(path)
        print(f"cirro bench: --fresh: the earlier results are kept as {kept.name}", file=sys.stderr)
    return {"config": config, "queries": {}, "mismatches": [], "versions": {}, "setup": {}}


def keep_earlier(path):
    """Move an earlier run's results aside (results-<when it was written>-
    replaced.json) so that a new run never overwrites them; the new name."""
    when = time.strftime("%Y-%m-%dT%H%M%S", time.localtime(path.stat().st_mtime))
    kept = path.with_name(f"results-{when}-replaced.json")
    path.replace(kept)
    return kept


def save_state(path, state):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(path)


def run_suite(args, suite, queries, ctx, facts, out, make_worker=Worker):
    names = ["cirro"] + [p for p in args.peers if p != "cirro"]
    if engines.REFERENCE not in names:
        names.append(engines.REFERENCE)  # the correctness guard needs it
    starts = getattr(args, "starts", 1)
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
    try:
        for start in range(starts):
            todo = [q for q in queries if len(state["queries"].get(q.id, {}).get("starts", [])) <= start]
            if not todo:
                continue
            # Every start is a fresh process of every engine (Cirro's server
            # among them): the figures are spread over processes, not one.
            workers, unavailable = _start_workers(names, ctx, spill, state, make_worker)
            save_state(state_path, state)
            bar = tqdm(total=len(todo) * (args.runs + 1) * len(names),
                       desc=f"{args.suite} sf{args.sf:g}" + (f" start {start + 1}/{starts}" if starts > 1 else ""),
                       unit="run", file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 30)
            try:
                for qi, q in enumerate(queries):
                    if q not in todo:
                        continue
                    rec, verdict = run_query(args, q, qi + start, names, workers, unavailable, spill, state, bar,
                                             start)
                    record(state, q.id, rec, verdict, starts)
                    save_state(state_path, state)
            finally:
                bar.close()
                for w in workers.values():
                    w.stop()
    finally:
        for f in spill.glob("*"):
            f.unlink()
        spill.rmdir()
    state["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save_state(state_path, state)
    return state


def _start_workers(names, ctx, spill, state, make_worker):
    workers = {n: make_worker(n, ctx, str(spill)) for n in names}
    unavailable = {}
    for n, w in workers.items():
        try:
            info = w.start()
            state["versions"][n] = info["version"]
            state.setdefault("pids", {}).setdefault(n, []).append(info.get("pid"))
            if info.get("load_seconds") is not None:
                state["setup"][f"{n}_load_seconds"] = round(info["load_seconds"], 2)
        except EngineFailed as e:
            unavailable[n] = str(e)
            print(f"cirro bench: {n} cannot run: {e}", file=sys.stderr)
    return workers, unavailable


def run_query(args, q, rotation, names, workers, unavailable, spill, state, bar, start=0):
    """One query on every engine in one start: the cold run, then the hot
    runs; every run's answer is compared with the reference's cold answer.
    Returns (per-engine record, verdict)."""
    ref = engines.REFERENCE
    rec = {n: {"status": "ok", "cold": None, "hot": [], "rows": None, "checked": 0} for n in names}
    for n, why in unavailable.items():
        rec[n].update(status="unavailable", error=why)
    expected = None  # the reference's cold answer, kept until the last hot run
    verdict = "unchecked"
    for r in range(args.runs + 1):
        shift = (rotation + r) % len(names)
        results = {}
        for n in names[shift:] + names[:shift]:
            bar.update(1)
            if rec[n]["status"] in TERMINAL:
                continue
            bar.set_postfix_str(f"{q.id} {n}")
            if r == 0 and args.drop_caches:
                drop_caches()
            # Cirro's answer always comes back (every timed run is checked);
            # a peer's when small; the reference's cold answer always.
            keep = "all" if n == "cirro" or (n == ref and r == 0) else "small"
            try:
                res = workers[n].run(q.sql, args.timeout, keep=keep, tag=f"{q.id}-{start}-{r}")
            except EngineFailed as e:
                res = ("error", f"restart failed: {e}")
            if res[0] != "ok":
                rec[n].update(status=res[0], error=res[1])
                continue
            _, seconds, rows, table = res
            if r == 0:
                rec[n]["cold"], rec[n]["rows"] = seconds, rows
            else:
                rec[n]["hot"].append(seconds)
            results[n] = table
        if r == 0:
            verdict = check(q, rec, results, state, run="cold run", start=start)
            expected = results.get(ref) if rec[ref]["status"] == "ok" else None
        elif expected is not None:
            hot_ref = results.pop(ref, None)
            if hot_ref is not None:  # the reference's own hot answer, against its cold one
                rec[ref]["checked"] += 1
                try:
                    compare.compare(hot_ref, expected, what=f"{q.id} {ref} hot run {r} vs its cold run")
                except compare.Mismatch as e:
                    rec[ref].update(status="wrong", error=str(e)[:500])
            run_verdict = check(q, rec, {**results, ref: expected}, state, run=f"hot run {r}", start=start,
                                reference_run=False)
            if run_verdict.startswith("MISMATCH") and not verdict.startswith("MISMATCH"):
                verdict = run_verdict
        results.clear()
        for f in spill.glob(f"*-{q.id}-{start}-{r}.arrow"):
            if r > 0 or not f.name.startswith(f"{ref}-"):
                f.unlink()
    del expected
    for f in spill.glob("*"):
        f.unlink()
    for n in names:
        times = rec[n]["hot"] or ([rec[n]["cold"]] if rec[n]["cold"] is not None else [])
        rec[n]["median"] = statistics.median(times) if rec[n]["status"] not in TERMINAL and times else None
    if verdict.startswith("equal"):
        runs = rec["cirro"]["checked"]
        verdict = f"{verdict}, every run ({runs} of {runs})"
    return rec, verdict


def record(state, qid, rec, verdict, starts):
    """Adds one start's record of a query; the query's figures are then the
    median over the starts of each start's median, with their range."""
    entry = state["queries"].setdefault(qid, {"starts": []})
    entry.setdefault("starts", []).append({"engines": rec, "check": verdict})
    done = entry["starts"]
    entry["done"] = len(done) >= starts
    checks = [s["check"] for s in done]
    entry["check"] = next((c for c in checks if c.startswith("MISMATCH")), None) or next(
        (c for c in checks if not c.startswith("equal")), None) or checks[-1]
    entry["engines"] = {}
    for n in rec:
        per = [s["engines"][n] for s in done if n in s["engines"]]
        medians = [p["median"] for p in per if p.get("median") is not None]
        bad = next((p for p in per if p["status"] != "ok"), None)
        combined = {"status": bad["status"] if bad else "ok",
                    "cold": per[0].get("cold"), "colds": [p.get("cold") for p in per],
                    "hot": [t for p in per for t in p.get("hot", [])], "rows": per[0].get("rows"),
                    "checked": sum(p.get("checked", 0) for p in per),
                    "medians": [p.get("median") for p in per],
                    "median": statistics.median(medians) if medians and (not bad or bad["status"] == "wrong")
                    else None}
        if medians:
            combined["range"] = [min(medians), max(medians)]
        if bad and bad.get("error"):
            combined["error"] = bad["error"]
        entry["engines"][n] = combined


def check(q, rec, results, state, run="cold run", start=0, reference_run=True):
    """The correctness guard for one run of a query (see the module's doc):
    each engine's answer against the reference's; returns the verdict.
    Counts the answers compared in each engine's record ("checked")."""
    ref = engines.REFERENCE
    if rec[ref]["status"] != "ok" or results.get(ref) is None:
        return f"unchecked: {ref} {rec[ref]['status']}"
    verdict = f"unchecked: cirro {rec['cirro']['status']}"
    if reference_run:
        rec[ref]["checked"] = rec[ref].get("checked", 0) + 1
    where = "" if run == "cold run" and start == 0 else f" ({run}, start {start + 1})"
    for n, table in results.items():
        if n == ref or table is None:
            continue
        rec[n]["checked"] = rec[n].get("checked", 0) + 1
        try:
            compare.compare(table, results[ref], what=f"{q.id} {n} vs {ref}{where}")
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
