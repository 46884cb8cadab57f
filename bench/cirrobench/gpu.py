"""`cirro bench gpu`: Cirro's GPU operators (`SET gpu`) on the SSB queries,
on whatever Vulkan device the machine has (lavapipe, Mesa's software
device, where there is no GPU: then the figures are a correctness and
overhead measure, not a speed claim).

1. **GPU against CPU.** Per SSB query, on one server: the median of
   `--runs` hot runs with `SET gpu = off` and with `SET gpu = force` (every
   operator with a GPU twin on the device), every timed answer compared value
   by value with the first `gpu = off` answer; then one EXPLAIN ANALYZE under `force` gives the time the GPU
   operators spent uploading blocks and in kernels (with the copies back),
   their kernel dispatches, and the blocks they ran on the device and on
   the CPU.
2. **Co-runs with device memory oversubscribed.** The server gets
   `--gpu-memory` (default 32MB) of device memory, less than two queries'
   blocks together: pairs of SSB queries (each query with the next one in a
   fixed shuffled order) run at once on two connections under `force`, the
   scheduler making one wait while the other holds the memory. Reported:
   each pair's wall time against the two run one after the other, the
   pairs' throughput, and how many queries the scheduler made wait
   (`cirro.queries.gpu`, sampled). Repeated with each replacement policy
   (`--gpu-policy` cdr, lru, mru, lfu, random) on a fresh server, with
   `cirro.gpu`'s device-memory counters (evictions, bytes written back and
   loaded).
"""

import json
import random
import re
import statistics
import sys
import threading
import time

from . import compare, data, engines, runner, suites

POLICIES = ["cdr", "lru", "mru", "lfu", "random"]


def _server(args, root, cirro_data, tables, env):
    ctx = engines.Context(tables, args.threads, root, args.cirro, cirro_data, args.wire)
    ctx.cirro_env = env
    return engines.Cirro(ctx)


def _timed(engine, sql):
    start = time.perf_counter()
    table = engine.run(sql)
    return time.perf_counter() - start, table


def _metric_sums(plan):
    """Sums of the GPU operators' metrics in an EXPLAIN ANALYZE's text."""
    sums = {"gpu_upload_ms": 0.0, "gpu_kernel_ms": 0.0, "gpu_dispatches": 0, "gpu_blocks": 0, "cpu_blocks": 0,
            "gpu_overlapped_blocks": 0}
    units = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0}
    for line in plan.splitlines():
        if "Gpu" not in line:
            continue
        for name, key in (("gpu_upload_time", "gpu_upload_ms"), ("gpu_kernel_time", "gpu_kernel_ms")):
            m = re.search(name + r"=([0-9.]+)(ns|µs|us|ms|s)\b", line)
            if m:
                sums[key] += float(m.group(1)) * units[m.group(2)]
        for key in ("gpu_dispatches", "gpu_blocks", "cpu_blocks", "gpu_overlapped_blocks"):
            m = re.search(key + r"=([0-9]+)", line)
            if m:
                sums[key] += int(m.group(1))
    return sums


def _explain(engine, sql):
    table = engine.run("EXPLAIN ANALYZE " + sql)
    return "\n".join(str(v) for col in table.columns for v in col.to_pylist())


def _gpu_counters(engine):
    row = engine.run("SELECT * FROM cirro.gpu").to_pylist()
    return row[0] if row else {}


def gpu_vs_cpu(args, queries, root, cirro_data, tables, results):
    engine = _server(args, root, cirro_data, tables, {})
    try:
        results["device"] = _gpu_counters(engine)
        if not results["device"].get("device"):
            print("cirro bench gpu: no Vulkan device: every operator stays on the CPU "
                  "(install mesa-vulkan-drivers for lavapipe, or the GPU's Vulkan driver)", file=sys.stderr)
        for q in queries:
            rec = {"same_answer": True}
            expected = None  # the CPU operators' first answer: every timed run is compared with it
            for mode in ("off", "force"):
                engine.run(f"SET gpu = {mode}")
                _, warm = _timed(engine, q.sql)  # warm: caches, kernels compiled
                expected = warm if expected is None else expected
                times = []
                for r in range(args.runs):
                    seconds, table = _timed(engine, q.sql)
                    times.append(seconds)
                    try:
                        compare.compare(table, expected, f"{q.id} gpu={mode} run {r + 1} vs gpu=off")
                    except compare.Mismatch as e:
                        rec["same_answer"] = False
                        results["mismatches"].append(str(e))
                        print(f"cirro bench gpu: MISMATCH {e}", file=sys.stderr)
                rec[mode] = {"median_s": round(statistics.median(times), 4), "runs": [round(t, 4) for t in times]}
            del expected
            engine.run("SET gpu = force")
            rec["force_metrics"] = _metric_sums(_explain(engine, q.sql))
            rec["ratio_gpu_over_cpu"] = round(rec["force"]["median_s"] / rec["off"]["median_s"], 3)
            results["queries"][q.id] = rec
            print(f"cirro bench gpu: {q.id} cpu {rec['off']['median_s']:.3f} s, gpu {rec['force']['median_s']:.3f} s, "
                  f"upload {rec['force_metrics']['gpu_upload_ms']:.1f} ms, kernels {rec['force_metrics']['gpu_kernel_ms']:.1f} ms",
                  file=sys.stderr, flush=True)
        results["device_after"] = _gpu_counters(engine)
    finally:
        engine.close()


def _pair(engines_, sqls, timeout):
    """Both statements at once, one per connection: the wall time."""
    errors = []

    def one(engine, sql):
        try:
            engine.run(sql)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e))

    threads = [threading.Thread(target=one, args=(e, s)) for e, s in zip(engines_, sqls)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    wall = time.perf_counter() - start
    if any(t.is_alive() for t in threads) or errors:
        raise RuntimeError(f"co-run failed: {errors or 'timeout'}")
    return wall


def _watch(engine, stop, seen):
    """Samples `cirro.queries.gpu` until `stop`: the most statements seen
    waiting for the device at once."""
    while not stop.is_set():
        try:
            rows = engine.run("SELECT gpu FROM cirro.queries WHERE gpu = 'waiting'").num_rows
            seen["waiting_max"] = max(seen["waiting_max"], rows)
        except Exception:  # noqa: BLE001 - the watcher must not end the run
            pass
        stop.wait(0.05)


def co_runs(args, queries, root, cirro_data, tables, results):
    rng = random.Random(7)
    order = list(queries)
    rng.shuffle(order)
    pairs = [(order[i], order[(i + 1) % len(order)]) for i in range(len(order))] if len(order) > 1 else []
    memory = args.gpu_memory or "32MB"
    results["co_runs"] = {"gpu_memory": memory, "pairs": [f"{a.id}+{b.id}" for a, b in pairs], "policies": {}}
    for policy in POLICIES:
        env = {"CIRRO_GPU_MEMORY": memory, "CIRRO_GPU_POLICY": policy}
        first = _server(args, root, cirro_data, tables, env)
        clients = []
        try:
            # A second connection to the same server, and one that watches.
            second = first.connect_again()
            watcher = first.connect_again()
            clients = [second, watcher]
            for e in (first, second):
                e.run("SET gpu = force")
            solo = {}
            for q in order:
                _timed(first, q.sql)
                solo[q.id] = statistics.median(_timed(first, q.sql)[0] for _ in range(max(1, args.runs)))
            stop = threading.Event()
            seen = {"waiting_max": 0}
            watch = threading.Thread(target=_watch, args=(watcher, stop, seen))
            watch.start()
            walls = []
            try:
                for a, b in pairs:
                    walls.append(_pair([first, second], [a.sql, b.sql], args.timeout))
            finally:
                stop.set()
                watch.join()
            alone = [solo[a.id] + solo[b.id] for a, b in pairs]
            rec = {
                "pair_wall_s": [round(w, 4) for w in walls],
                "pair_alone_s": [round(s, 4) for s in alone],
                "total_wall_s": round(sum(walls), 3),
                "total_alone_s": round(sum(alone), 3),
                "throughput_vs_alone": round(sum(alone) / sum(walls), 3) if walls else None,
                "waiting_max": seen["waiting_max"],
                "device": _gpu_counters(first),
            }
            results["co_runs"]["policies"][policy] = rec
            print(f"cirro bench gpu: co-runs {policy}: {rec['total_wall_s']:.2f} s together, "
                  f"{rec['total_alone_s']:.2f} s one at a time, waiting at most {rec['waiting_max']}",
                  file=sys.stderr, flush=True)
        finally:
            for client in clients:
                client.close()
            first.close()


def main(args, out):
    if args.report_only:
        results = json.loads((out / "results.json").read_text())
        (out / "report.md").write_text(report(results))
        print(f"cirro bench: report {out / 'report.md'}", file=sys.stderr)
        return 1 if results.get("mismatches") else 0
    suite, make_tables, make_queries = suites.get("ssb")
    queries = make_queries(args.sf)
    if args.queries:
        wanted = set(args.queries.split(","))
        queries = [q for q in queries if q.id in wanted]
    sf_label = f"{args.sf:g}"
    root = args.data_dir / f"ssb-sf{sf_label}"
    cirro_data, tables, facts = data.prepare(suite, make_tables, args.sf, root, args.cirro, args.threads)
    results = {"config": {"suite": "gpu", "sf": args.sf, "threads": args.threads, "runs": args.runs,
                          "wire": args.wire},
               "machine": runner.machine(), "queries": {}, "mismatches": []}
    gpu_vs_cpu(args, queries, root, cirro_data, tables, results)
    co_runs(args, queries, root, cirro_data, tables, results)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    path = out / "report.md"
    path.write_text(report(results))
    print(f"cirro bench: report {path}", file=sys.stderr)
    if results["mismatches"]:
        print(f"cirro bench gpu: FAILED: {len(results['mismatches'])} answers differ between gpu=force and off",
              file=sys.stderr)
        return 1
    return 0


def report(results):
    c = results["config"]
    d = results.get("device") or {}
    name = d.get("device") or "no Vulkan device (everything on the CPU)"
    soft = " — a software device on the CPU's cores: a correctness and overhead figure, not a speed claim" \
        if d.get("software") else ""
    lines = [
        f"# GPU operators: SSB SF{c['sf']:g}, `SET gpu = force` against `off`",
        "",
        f"Device: {name}{soft}. {c['threads']} threads, medians of {c['runs']} hot runs, "
        f"Cirro over the {'PostgreSQL' if c['wire'] == 'pg' else 'Flight SQL'} wire.",
        "",
        "| query | CPU s | GPU s | GPU/CPU | upload ms | kernels ms | dispatches | device blocks | overlapped | CPU blocks | same answer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for qid, r in results["queries"].items():
        m = r["force_metrics"]
        lines.append(f"| {qid} | {r['off']['median_s']:.3f} | {r['force']['median_s']:.3f} | "
                     f"{r['ratio_gpu_over_cpu']:.2f} | {m['gpu_upload_ms']:.1f} | {m['gpu_kernel_ms']:.1f} | "
                     f"{m['gpu_dispatches']} | {m['gpu_blocks']} | {m.get('gpu_overlapped_blocks', 0)} | "
                     f"{m['cpu_blocks']} | "
                     f"{'yes' if r['same_answer'] else 'NO'} |")
    after = results.get("device_after") or {}
    lookups = (after.get("cache_hits") or 0) + (after.get("cache_misses") or 0)
    if lookups:
        budget = (after.get("memory_budget") or 0) / 2**20
        lines += ["", f"Column cache on this server ({budget:.0f} MiB of device memory, every run above): "
                      f"{after['cache_hits']} hits in {lookups} lookups "
                      f"({100 * after['cache_hits'] / lookups:.0f} %, one per input batch and column), "
                      f"{after.get('evictions', 0)} evictions."]
    co = results.get("co_runs")
    if co:
        lines += [
            "",
            f"## Co-runs, device memory oversubscribed ({co['gpu_memory']})",
            "",
            f"{len(co['pairs'])} pairs ({', '.join(co['pairs'])}), both under `force`, at once on two "
            "connections, against the two one after the other (their hot medians).",
            "",
            "| policy | together s | one at a time s | throughput × | most waiting | evictions | written back MiB | loaded MiB | column cache hits | misses |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for policy, r in co["policies"].items():
            dev = r["device"]
            lines.append(f"| {policy} | {r['total_wall_s']:.2f} | {r['total_alone_s']:.2f} | "
                         f"{r['throughput_vs_alone']:.2f} | {r['waiting_max']} | {dev.get('evictions', 0)} | "
                         f"{(dev.get('written_back') or 0) / 2**20:.1f} | {(dev.get('loaded') or 0) / 2**20:.1f} | "
                         f"{dev.get('cache_hits', 0)} | {dev.get('cache_misses', 0)} |")
        lines += ["", "The counters cover the whole server run (the warm and timed solo runs, then the pairs). "
                      "The filters' input columns stay on the device between queries (the column cache) "
                      "until a policy evicts them; loaded MiB is what was uploaded."]
        if all(not r["device"].get("evictions") for r in co["policies"].values()):
            lines += ["", "No policy evicted anything: everything the queries kept fitted the budget, so "
                          "the policies' rows differ by noise only."]
    m = results["machine"]
    lines += ["", f"Machine: {m.get('cpu', '?')}, {m.get('cpus')} cores, {m.get('memory_gib')} GiB.", ""]
    return "\n".join(lines)
