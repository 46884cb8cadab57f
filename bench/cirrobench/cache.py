"""`cirro bench cache`: a TPC-H query stream through Cirro's hot-data tier,
with the cache smaller than the data, under three settings measured in the
same run: no cache (`--cache-memory 0`), LRU (`--cache-policy lru`) and the
plan-driven policy (`--cache-policy plan`, the default).

The stream is the suite's queries in a fixed shuffled order, repeated
`--passes` times (default 3), each setting on a freshly started server (an
empty cache). Reported per setting: the stream's total time, each pass's
time, the chunk hit ratio (`cirro.cache`: column chunks found / looked up)
and the bytes cached at the end. Every answer is compared value by value
with the no-cache server's first answer to that query (the tpch suite checks
those against DuckDB's); a difference is reported and fails the run (exit
status 1), and every query must succeed.
"""

import json
import random
import sys
import time

from . import compare, data, engines, runner, suites

SETTINGS = [("no cache", "plan", False), ("lru", "lru", True), ("plan", "plan", True)]


def main(args, out):
    suite, make_tables, make_queries = suites.get("tpch")
    queries = make_queries(args.sf)
    if args.queries:
        wanted = set(args.queries.split(","))
        queries = [q for q in queries if q.id in wanted]
    sf_label = f"{args.sf:g}"
    root = args.data_dir / f"tpch-sf{sf_label}"
    cirro_data, tables, facts = data.prepare(suite, make_tables, args.sf, root, args.cirro, args.threads)
    # Decoded columns take about three times their Parquet bytes: a cache of
    # the Parquet size holds about a third of what the stream reads.
    cache_bytes = args.cache_memory or facts["parquet_bytes"]
    stream = []
    rng = random.Random(42)
    for p in range(args.passes):
        order = list(queries)
        rng.shuffle(order)
        stream += [(p, q) for q in order]
    results = {"config": {"suite": "tpch", "sf": args.sf, "threads": args.threads, "passes": args.passes,
                          "cache_bytes": cache_bytes, "wire": args.wire,
                          "stream": [q.id for _, q in stream]},
               "machine": runner.machine(), "parquet_bytes": facts["parquet_bytes"], "settings": {},
               "mismatches": []}
    expected = {}  # query id → the no-cache server's first answer
    for name, policy, cached in SETTINGS:
        ctx = engines.Context(tables, args.threads, root, args.cirro, cirro_data, args.wire)
        ctx.cirro_env = {"CIRRO_CACHE_MEMORY": str(cache_bytes if cached else 0), "CIRRO_CACHE_POLICY": policy}
        engine = engines.Cirro(ctx)
        try:
            times = run_stream(engine, name, stream, expected, results["mismatches"])
            totals = engine.run("SELECT coalesce(sum(hits), 0), coalesce(sum(misses), 0), "
                                "coalesce(sum(bytes), 0) FROM cirro.cache").to_pylist()[0]
        finally:
            engine.close()
        hits, misses, cached_bytes = (int(v) for v in totals.values())
        results["settings"][name] = {
            "times": times,
            "total_seconds": round(sum(t["seconds"] for t in times), 3),
            "pass_seconds": [round(sum(t["seconds"] for t in times if t["pass"] == p), 3)
                             for p in range(args.passes)],
            "hits": hits, "misses": misses,
            "hit_ratio": round(hits / (hits + misses), 4) if hits + misses else None,
            "cached_bytes": cached_bytes,
        }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    path = out / "report.md"
    path.write_text(report(results))
    print(f"cirro bench: report {path}", file=sys.stderr)
    for m in results["mismatches"]:
        print(f"cirro bench cache: CORRECTNESS FAILURE: {m}", file=sys.stderr)
    return 1 if results["mismatches"] else 0


def run_stream(engine, name, stream, expected, mismatches):
    """Runs the stream on `engine`, timing each query; each answer is
    compared with `expected[query id]` (the first answer seen is kept
    there). Differences go to `mismatches`. Returns the times."""
    times = []
    for p, q in stream:
        start = time.perf_counter()
        answer = engine.run(q.sql)
        times.append({"pass": p, "query": q.id, "seconds": round(time.perf_counter() - start, 4)})
        print(f"cirro bench cache: {name} pass {p + 1} {q.id} {times[-1]['seconds']:.3f} s",
              file=sys.stderr, flush=True)
        if q.id not in expected:
            expected[q.id] = answer
            continue
        try:
            compare.compare(answer, expected[q.id], what=f"{q.id} {name} pass {p + 1} vs no cache")
        except compare.Mismatch as e:
            mismatches.append(str(e))
    return times


def report(results):
    c = results["config"]
    mib = 2 ** 20
    lines = [
        f"# Hot-data tier: TPC-H SF{c['sf']:g} query stream, cache smaller than the data",
        "",
        f"{len(c['stream'])} queries ({c['passes']} passes of the suite in a fixed shuffled order), "
        f"{c['threads']} threads, Cirro over the {'PostgreSQL' if c['wire'] == 'pg' else 'Flight SQL'} wire, "
        f"a fresh server per setting. Cache {c['cache_bytes'] / mib:.0f} MiB; the tables' Parquet files "
        f"{results['parquet_bytes'] / mib:.0f} MiB (decoded about three times that).",
        "",
        "| setting | stream s | " + " | ".join(f"pass {p + 1} s" for p in range(c["passes"]))
        + " | chunk hits | misses | hit ratio | cached MiB |",
        "|---|---:|" + "---:|" * c["passes"] + "---:|---:|---:|---:|",
    ]
    if "mismatches" in results:  # (older results did not compare answers)
        wrong = results["mismatches"]
        lines[2:2] = (["## ❌ CORRECTNESS FAILURE", ""] + [f"- {m}" for m in wrong] + [""] if wrong else
                      ["Every answer equals the no-cache server's first answer to its query, value by value.",
                       ""])
    for name, s in results["settings"].items():
        ratio = "–" if s["hit_ratio"] is None else f"{s['hit_ratio']:.1%}"
        lines.append(f"| {name} | {s['total_seconds']:.2f} | "
                     + " | ".join(f"{t:.2f}" for t in s["pass_seconds"])
                     + f" | {s['hits']} | {s['misses']} | {ratio} | {s['cached_bytes'] / mib:.0f} |")
    lines += ["", "Per query (seconds, summed over the passes):", "",
              "| query | " + " | ".join(results["settings"]) + " |",
              "|---|" + "---:|" * len(results["settings"])]
    ids = sorted({t["query"] for s in results["settings"].values() for t in s["times"]})
    for q in ids:
        cells = [sum(t["seconds"] for t in s["times"] if t["query"] == q) for s in results["settings"].values()]
        lines.append(f"| {q} | " + " | ".join(f"{v:.3f}" for v in cells) + " |")
    m = results["machine"]
    lines += ["", f"Machine: {m.get('cpu', '?')}, {m.get('cpus')} cores, {m.get('memory_gib')} GiB.", ""]
    return "\n".join(lines)
