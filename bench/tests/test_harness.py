"""Tests of the benchmark harness itself, on tiny data: the result comparison
(including wrong results that must be caught), the correctness guard, the
timeout of a worker, the report and its plots.

Run by crates/cirro/tests/bench.rs inside the benchmark environment:
    PYTHONPATH=bench ~/.cache/cirro/bench-venv/bin/python -m unittest discover -s bench/tests
"""

import decimal
import os
import time
import json
import tempfile
import unittest
from pathlib import Path

import pyarrow as pa

from cirrobench import __main__ as cli
from cirrobench import compare, engines, report, runner, suites
from cirrobench.worker import Worker


def table(**cols):
    return pa.table(cols)


class CompareTest(unittest.TestCase):
    def test_equal_across_types_order_and_padding(self):
        got = pa.table({
            "name": pa.array(["b  ", "a", None], pa.string()),
            "n": pa.array([2, 1, 3], pa.int32()),
            "total": pa.array([decimal.Decimal("2.50"), decimal.Decimal("1.25"), None], pa.decimal128(12, 2)),
            "day": pa.array([19000, 18999, 19001], pa.date32()),
        })
        expected = pa.table({
            "x": pa.array(["a", "b", None], pa.large_string()),
            "y": pa.array([1, 2, 3], pa.int64()),
            "z": pa.array([1.25 * (1 + 1e-8), 2.5, None], pa.float64()),
            "w": pa.array([18999 * 86400 * 10**6, 19000 * 86400 * 10**6, 19001 * 86400 * 10**6],
                          pa.timestamp("us")),
        })
        self.assertEqual(compare.compare(got, expected), 3)

    def test_a_column_of_nulls_of_unknown_type_equals_only_nulls(self):
        nulls = table(a=pa.array([None], type=pa.null()))
        self.assertEqual(compare.compare(nulls, table(a=pa.array([None], type=pa.float64()))), 1)
        with self.assertRaises(compare.Mismatch):
            compare.compare(nulls, table(a=[1.5]))
        with self.assertRaises(compare.Mismatch):
            compare.compare(table(a=[1.5]), nulls)

    def test_wrong_value_is_caught(self):
        good = table(g=pa.array([1, 2, 3]), s=pa.array([10.0, 20.0, 30.0]))
        bad = table(g=pa.array([1, 2, 3]), s=pa.array([10.0, 20.0, 30.01]))
        with self.assertRaisesRegex(compare.Mismatch, "column 2 .* row 3"):
            compare.compare(bad, good)

    def test_null_is_not_zero_and_text_is_exact(self):
        with self.assertRaises(compare.Mismatch):
            compare.compare(table(a=pa.array([0.0])), table(a=pa.array([None], pa.float64())))
        with self.assertRaises(compare.Mismatch):
            compare.compare(table(a=pa.array(["ab"])), table(a=pa.array(["aB"])))

    def test_shape_differences_are_caught(self):
        one = table(a=pa.array([1, 2]))
        with self.assertRaisesRegex(compare.Mismatch, "rows"):
            compare.compare(table(a=pa.array([1])), one)
        with self.assertRaisesRegex(compare.Mismatch, "columns"):
            compare.compare(table(a=pa.array([1, 2]), b=pa.array([1, 2])), one)
        with self.assertRaisesRegex(compare.Mismatch, "column 1"):
            compare.compare(table(a=pa.array(["1", "2"])), one)

    def test_tolerance(self):
        base = table(v=pa.array([1e9, 0.0]))
        compare.compare(table(v=pa.array([1e9 * (1 + 5e-7), 5e-6])), base)
        with self.assertRaises(compare.Mismatch):
            compare.compare(table(v=pa.array([1e9 * (1 + 5e-6), 0.0])), base)


def _rec(names):
    return {n: {"status": "ok", "cold": 0.1, "hot": [0.1], "rows": 1} for n in names}


class SuitesTest(unittest.TestCase):
    def test_q11_fraction_is_scaled_above_sf1(self):
        def fraction(sf):
            line = next(l for l in suites.tpch_queries(sf)[10].sql.splitlines() if "ps_availqty) *" in l)
            return float(line.rsplit("*", 1)[1])

        self.assertEqual(fraction(0.1), 0.0001)
        self.assertEqual(fraction(1), 0.0001)
        self.assertAlmostEqual(fraction(10), 0.00001)
        self.assertAlmostEqual(fraction(30), 0.0001 / 30, places=10)


class GuardTest(unittest.TestCase):
    def test_cirro_mismatch_fails_and_wrong_peer_is_marked(self):
        q = type("Q", (), {"id": "q01"})()
        state = {"mismatches": []}
        rec = _rec(["cirro", "duckdb", "polars"])
        right = table(a=pa.array([1.0, 2.0]))
        verdict = runner.check(q, rec, {"cirro": right, "duckdb": right, "polars": right}, state)
        self.assertTrue(verdict.startswith("equal"), verdict)
        self.assertEqual(state["mismatches"], [])
        wrong = table(a=pa.array([1.0, 2.5]))
        verdict = runner.check(q, rec, {"cirro": wrong, "duckdb": right, "polars": wrong}, state)
        self.assertTrue(verdict.startswith("MISMATCH"), verdict)
        self.assertEqual(len(state["mismatches"]), 1)
        self.assertEqual(rec["polars"]["status"], "wrong")

    def test_unchecked_when_the_reference_failed(self):
        q = type("Q", (), {"id": "q02"})()
        rec = _rec(["cirro", "duckdb"])
        rec["duckdb"]["status"] = "error"
        state = {"mismatches": []}
        self.assertTrue(runner.check(q, rec, {"cirro": table(a=[1])}, state).startswith("unchecked"))


class FakeWorker:
    """An engine that answers `SELECT 1` with 1.0 and takes 0.1 s × its start
    (1, 2, 3, …); `wrong` names (engine, start, run) answers that are 1.5."""

    wrong = set()
    instances = {}

    def __init__(self, name, ctx, spill_dir):
        self.name = name
        FakeWorker.instances[name] = FakeWorker.instances.get(name, 0) + 1
        self.start_no = FakeWorker.instances[name]
        self.run_no = 0

    def start(self):
        return {"version": "test", "pid": None}

    def run(self, sql, timeout, keep=False, tag="result"):
        value = 1.5 if (self.name, self.start_no, self.run_no) in FakeWorker.wrong else 1.0
        self.run_no += 1
        answer = table(a=pa.array([value])) if keep else None
        return ("ok", 0.1 * self.start_no, 1, answer)

    def stop(self):
        pass


def fake_suite(tmp, wrong=(), starts=3, runs=2):
    FakeWorker.wrong, FakeWorker.instances = set(wrong), {}
    args = cli.parse(["tpch", "--peers", "polars", "--runs", str(runs), "--starts", str(starts),
                      "--out", tmp, "--no-probe"])
    suite = type("S", (), {"scan_bound": None})()
    q = type("Q", (), {"id": "q01", "sql": "SELECT 1", "series": None, "x": None, "x_label": None})()
    return runner.run_suite(args, suite, [q], None, {}, Path(tmp), make_worker=FakeWorker)


class EveryRunCheckedTest(unittest.TestCase):
    def test_every_start_is_fresh_and_figures_are_medians_over_starts(self):
        with tempfile.TemporaryDirectory() as tmp:
            state = fake_suite(tmp)
            self.assertEqual(FakeWorker.instances, {"cirro": 3, "polars": 3, "duckdb": 3})
            rec = state["queries"]["q01"]
            self.assertEqual(state["mismatches"], [])
            self.assertIn("every run (3 of 3)", rec["check"])
            cirro = rec["engines"]["cirro"]
            self.assertEqual(cirro["checked"], 9)  # 3 starts × (cold + 2 hot)
            self.assertAlmostEqual(cirro["median"], 0.2)
            self.assertEqual([round(x, 3) for x in cirro["range"]], [0.1, 0.3])
            text = report.write(state, tmp).read_text()
            self.assertIn("| q01 | 200 [100–300] |", text)
            self.assertIn("totals of each start (s) |", text)
            self.assertIn("on every run of each, cold and hot (9 answers compared)", text)

    def test_a_wrong_hot_answer_is_caught(self):
        with tempfile.TemporaryDirectory() as tmp:
            # Cirro right on its cold run and wrong on the second hot run of
            # the second start; polars wrong on a hot run only.
            state = fake_suite(tmp, wrong={("cirro", 2, 2), ("polars", 1, 1)})
            self.assertEqual(len(state["mismatches"]), 1, state["mismatches"])
            self.assertIn("q01 cirro vs duckdb (hot run 2, start 2)", state["mismatches"][0])
            rec = state["queries"]["q01"]
            self.assertTrue(rec["check"].startswith("MISMATCH"), rec["check"])
            self.assertEqual(rec["engines"]["polars"]["status"], "wrong")
            self.assertIn("CORRECTNESS FAILURE", report.write(state, tmp).read_text())

    def test_a_rerun_with_other_settings_keeps_the_earlier_results(self):
        with tempfile.TemporaryDirectory() as tmp:
            fake_suite(tmp, starts=1)
            fake_suite(tmp, starts=2)
            kept = sorted(p.name for p in Path(tmp).glob("results-*.json"))
            self.assertEqual(len(kept), 1, kept)
            earlier = json.loads((Path(tmp) / kept[0]).read_text())
            self.assertEqual(earlier["config"]["starts"], 1)


class FakeSetup:
    """A start of a `cirro bench cluster` setup: answers 1.0 (1.5 on the
    (setup, start, run) in `wrong`), taking 0.1 s × its start × (2 on three
    nodes)."""

    wrong = set()
    started = []
    statements = []

    def __init__(self, setup, args):
        FakeSetup.started.append(setup)
        self.setup, self.start_no, self.run_no = setup, FakeSetup.started.count(setup), 0
        self.pids = [len(FakeSetup.started)]
        self.loaded = []

    def run(self, sql):
        self.loaded.append(sql)
        FakeSetup.statements.append(sql)
        return table()

    def timed(self, sql):
        value = 1.5 if (self.setup, self.start_no, self.run_no) in FakeSetup.wrong else 1.0
        self.run_no += 1
        return 0.1 * self.start_no * (2 if self.setup == "3" else 1), table(a=pa.array([value]))

    def close(self):
        pass


class ClusterBenchTest(unittest.TestCase):
    def run_fake(self, tmp, wrong=(), extra=(), tables=None):
        from cirrobench import cluster

        FakeSetup.wrong, FakeSetup.started, FakeSetup.statements = set(wrong), [], []
        args = cli.parse(["cluster", "--runs", "2", "--starts", "3", "--out", tmp, *extra])
        queries = [type("Q", (), {"id": i, "sql": "SELECT 1"})() for i in ("q01", "q02")]
        reference = {"q01": table(a=[1.0]), "q02": table(a=[1.0])}
        return cluster.run_tpch(args, tables or {"t": "/nowhere"}, queries, reference, make_setup=FakeSetup)

    def test_bucketed_loads_every_setup_hash_distributed(self):
        tables = {"lineitem": "/p/lineitem", "nation": "/p/nation"}
        with tempfile.TemporaryDirectory() as tmp:
            self.run_fake(tmp, extra=["--bucketed"], tables=tables)
            self.assertEqual(FakeSetup.statements.count(
                "CREATE TABLE lineitem DISTRIBUTED BY HASH (l_orderkey) BUCKETS 12 AS "
                "SELECT * FROM read_parquet('/p/lineitem/')"), 9)
            self.assertEqual(FakeSetup.statements.count(
                "CREATE TABLE nation AS SELECT * FROM read_parquet('/p/nation/')"), 9)
            self.run_fake(tmp, tables=tables)
            self.assertFalse([s for s in FakeSetup.statements if "DISTRIBUTED" in s])

    def test_every_setup_started_afresh_and_figures_over_starts(self):
        from cirrobench import cluster

        with tempfile.TemporaryDirectory() as tmp:
            results = self.run_fake(tmp)
            self.assertEqual(FakeSetup.started, ["alone"] * 3 + ["1"] * 3 + ["3"] * 3)
            q = results["1"]["queries"]["q01"]
            self.assertAlmostEqual(q["median"], 0.2)
            self.assertEqual([round(x, 3) for x in (q["min"], q["max"])], [0.1, 0.3])
            self.assertEqual([round(t, 3) for t in results["3"]["totals"]], [0.4, 0.8, 1.2])
            self.assertEqual(len({tuple(s["pids"]) for s in results["alone"]["starts"]}), 3)
            doc = {"command": "cirro bench cluster", "machine": {}, "sf": 1, "runs": 2, "starts": 3,
                   "wire": "pg", "tpch": results, "shuffle": {}}
            text = cluster.report(doc, Path(tmp)).read_text()
            self.assertIn("| 1 / alone | 3 / 1 |", text)
            self.assertIn("| total (s), median (range) | 0.40 (0.20–0.60) | 0.40 (0.20–0.60) | "
                          "0.80 (0.40–1.20) | 1.00 | 2.00 |", text)
            self.assertIn("| q01 | 0.200 (0.100–0.300) |", text)

    def test_aggregation_exchanges_are_reported_against_the_best_forced(self):
        from cirrobench import cluster

        self.assertEqual(cluster._bytes("NetworkShuffleExec, metrics=[bytes_transferred=1.5 MB]\n"
                                        "NetworkShuffleExec, metrics=[bytes_transferred=512.0 B]"),
                         int(1.5 * (1 << 20)) + 512)
        self.assertIsNone(cluster._bytes("AggregateExec: mode=Final"))
        with tempfile.TemporaryDirectory() as tmp:
            ex = {"auto": {"median": 1.1, "choice": "rows shuffled (≈10 groups of 10 rows)", "bytes": 2_000_000},
                  "partial": {"median": 2.0, "bytes": None},
                  "rows": {"median": 1.0, "bytes": 2_000_000}}
            doc = {"command": "cirro bench cluster", "machine": {}, "sf": 1, "runs": 2, "starts": 1,
                   "wire": "pg", "tpch": {}, "shuffle": {},
                   "aggregation": {"rows": {"groups": 10, "rows": 10, "exchanges": ex}}}
            text = cluster.report(doc, Path(tmp)).read_text()
            self.assertIn("| 10 | 10 | 1.100 (2.0 MB) | 2.000 | 1.000 (2.0 MB) | 1.10 | "
                          "rows shuffled (≈10 groups of 10 rows) |", text)

    def test_worker_rpc_is_reported_per_link_and_size(self):
        from cirrobench import cluster

        def peer(node, mb_per_s):
            return {"node": node, "worker": "x:1", "sizes": [
                {"bytes": 1024, "round_trip_us": 180.4, "round_trips": 50, "messages": 4096, "mb_per_s": 9.5},
                {"bytes": 16 << 20, "round_trip_us": 90000.0, "round_trips": 12, "messages": 16,
                 "mb_per_s": mb_per_s}]}

        rpc = {"as is": {"2": [peer("node2", 1500.0)], "3": [peer("node2", 1400.0), peer("node3", 1300.0)]},
               "1gbit": {"2": [peer("node2", 118.0)]}}
        with tempfile.TemporaryDirectory() as tmp:
            doc = {"command": "cirro bench cluster", "machine": {}, "sf": 1, "runs": 2, "starts": 1,
                   "wire": "pg", "tpch": {}, "shuffle": {}, "rpc": rpc}
            text = cluster.report(doc, Path(tmp)).read_text()
        self.assertIn("| link | nodes | to | 1 KB | 16 MB |", text)
        self.assertIn("| as is | 3 | node3 | 180 µs, 10 MB/s | 90000 µs, 1300 MB/s |", text)
        self.assertIn("| 1gbit | 2 | node2 | 180 µs, 10 MB/s | 90000 µs, 118 MB/s |", text)

    def test_a_wrong_hot_answer_in_one_start_fails_the_query(self):
        with tempfile.TemporaryDirectory() as tmp:
            # The 1-node cluster's second start, its fifth run: q02's first
            # hot run (runs 0-2 are q01's, cold and hot).
            results = self.run_fake(tmp, wrong={("1", 2, 4)})
            self.assertIn("wrong answer", results["1"]["queries"]["q02"]["error"])
            self.assertIn("median", results["1"]["queries"]["q01"])
            self.assertIn("median", results["3"]["queries"]["q02"])


class RunDirTest(unittest.TestCase):
    def test_each_run_has_its_folder_and_an_unfinished_one_resumes(self):
        from cirrobench.__main__ import run_dir

        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp) / "tpch-sf1"
            first = run_dir(base, day="2026-12-03", commit="abc123")
            self.assertEqual(first.name, "2026-12-03-abc123")
            # Stopped half-way: the next run continues it.
            (first / "results.json").write_text(json.dumps({"config": {}, "queries": {}}))
            self.assertEqual(run_dir(base, day="2026-12-03", commit="abc123"), first)
            # Unless --fresh: a new folder beside, the earlier one kept.
            second = run_dir(base, fresh=True, day="2026-12-03", commit="abc123")
            self.assertEqual(second.name, "2026-12-03-abc123-2")
            self.assertTrue((first / "results.json").exists())
            # Finished: the next run starts a folder of its own.
            (second / "results.json").write_text(json.dumps({"config": {}, "finished": "now"}))
            os.utime(second, (time.time() + 5, time.time() + 5))
            third = run_dir(base, day="2026-12-04", commit="def456")
            self.assertEqual(third.name, "2026-12-04-def456")
            self.assertEqual(len(list(base.iterdir())), 3)
            # --report-only reads the latest run.
            os.utime(third, (time.time() + 10, time.time() + 10))
            self.assertEqual(run_dir(base, latest=True), third)


class WorkerTest(unittest.TestCase):
    def test_timeout_kills_and_the_engine_comes_back(self):
        with tempfile.TemporaryDirectory() as tmp:
            ctx = engines.Context({}, 1, tmp)
            w = Worker("duckdb", ctx, tmp)
            w.start()
            try:
                status = w.run("SELECT count(*) FROM range(100000000000) a", timeout=1)
                self.assertEqual(status[0], "timeout")
                status = w.run("SELECT 41 + 1 AS answer", timeout=60, keep="all")
                self.assertEqual(status[0], "ok")
                self.assertEqual(status[3].column(0).to_pylist(), [42])
                status = w.run("SELECT * FROM no_such_table", timeout=60)
                self.assertEqual(status[0], "error")
                self.assertIn("no_such_table", status[1])
            finally:
                w.stop()


def synthetic_state():
    meta = {}
    queries = {}
    times = {"q1": (0.30, 0.10, 0.20), "q2": (0.10, 0.20, 0.40), "q3": (0.50, 0.05, None),
             "q4": (0.20, 0.25, 0.30)}
    for i, (q, (c, d, p)) in enumerate(times.items()):
        meta[q] = {"series": "2-table join", "x": 1000 * (i + 1), "sql": "SELECT 1"}
        eng = {"cirro": {"status": "ok", "median": c, "cold": c, "hot": [c]},
               "duckdb": {"status": "ok", "median": d, "cold": d, "hot": [d]},
               "polars": {"status": "ok", "median": p, "cold": p, "hot": [p]}}
        if p is None:
            eng["polars"] = {"status": "timeout", "median": None, "error": "no answer within 5 s"}
        queries[q] = {"done": True, "engines": eng, "check": "equal to duckdb (1 rows)"}
    queries["q4"]["engines"]["duckdb"]["status"] = "wrong"
    queries["q4"]["engines"]["duckdb"]["error"] = "differs"
    return {"config": {"suite": "joins", "sf": 1.0, "threads": 2, "runs": 1,
                       "engines": ["cirro", "duckdb", "polars"]},
            "queries": queries, "query_meta": meta, "mismatches": [], "versions": {"cirro": "0.1.0"},
            "machine": {"cpu": "test", "cpus": 2}, "command": "cirro bench joins", "timeout_seconds": 5}


class ReportTest(unittest.TestCase):
    def test_report_totals_worst_queries_failures_and_plots(self):
        state = synthetic_state()
        with tempfile.TemporaryDirectory() as tmp:
            path = report.write(state, tmp)
            text = path.read_text()
            # totals over the queries every engine finished (q1, q2, q4)
            self.assertIn("| cirro | 0.60 (3) | 1.00 | 1.10 (4) |", text)
            # q3: 0.50 / 0.05 = 10x duckdb; q4: duckdb was wrong, so polars (0.30) is the best peer
            worst = text.split("## Where Cirro trails the best peer most")[1].split("##")[0]
            self.assertLess(worst.index("**q3**: 10.00×"), worst.index("**q1**: 3.00×"))
            self.assertNotIn("**q4**", worst)  # Cirro leads there (0.67× polars, duckdb was wrong)
            self.assertIn("| q4 | 200 | 250 ✗ | 300 | 0.67 (polars) |", text)
            self.assertIn("q3 polars: timeout", text)
            for png in ("queries.png", "ratio.png", "scaling.png"):
                data = (Path(tmp) / png).read_bytes()
                self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n", png)
                self.assertGreater(len(data), 5000, png)
            state["mismatches"] = ["q1 cirro vs duckdb: column 1 differs"]
            self.assertIn("CORRECTNESS FAILURE", report.write(state, tmp).read_text())

    def test_report_reads_back_its_json(self):
        state = synthetic_state()
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "results.json").write_text(json.dumps(state))
            again = json.loads((Path(tmp) / "results.json").read_text())
            self.assertEqual(report.totals(again), report.totals(state))


if __name__ == "__main__":
    unittest.main()


class CacheStreamReportTest(unittest.TestCase):
    def test_report_lists_every_setting_with_its_hit_ratio(self):
        from cirrobench import cache

        def setting(hits, misses, seconds):
            times = [{"pass": p, "query": q, "seconds": seconds} for p in range(2) for q in ("q01", "q06")]
            return {"times": times, "total_seconds": 4 * seconds, "pass_seconds": [2 * seconds] * 2,
                    "hits": hits, "misses": misses,
                    "hit_ratio": hits / (hits + misses) if hits + misses else None, "cached_bytes": 2 ** 20}

        results = {"config": {"sf": 1, "threads": 2, "passes": 2, "cache_bytes": 2 ** 30, "wire": "pg",
                              "stream": ["q01", "q06"] * 2},
                   "machine": {"cpus": 2}, "parquet_bytes": 2 ** 30,
                   "settings": {"no cache": setting(0, 0, 1.0), "lru": setting(1, 3, 0.9),
                                "plan": setting(3, 1, 0.5)}}
        text = cache.report(results)
        self.assertIn("| no cache | 4.00 |", text)
        self.assertIn("| lru | 3.60 | 1.80 | 1.80 | 1 | 3 | 25.0% |", text)
        self.assertIn("| plan | 2.00 | 1.00 | 1.00 | 3 | 1 | 75.0% |", text)
        self.assertIn("| q06 | 2.000 | 1.800 | 1.000 |", text)

    def test_every_answer_of_the_stream_is_compared_with_the_no_cache_one(self):
        from cirrobench import cache

        class Engine:
            def __init__(self, wrong_at=None):
                self.calls, self.wrong_at = 0, wrong_at

            def run(self, sql):
                self.calls += 1
                return table(a=pa.array([2.0 if self.calls == self.wrong_at else 1.0]))

        q1 = type("Q", (), {"id": "q01", "sql": "SELECT 1"})()
        q6 = type("Q", (), {"id": "q06", "sql": "SELECT 1"})()
        stream = [(0, q1), (0, q6), (1, q6), (1, q1)]
        expected, mismatches = {}, []
        times = cache.run_stream(Engine(), "no cache", stream, expected, mismatches)
        self.assertEqual((len(times), sorted(expected), mismatches), (4, ["q01", "q06"], []))
        # the plan policy's fourth answer (q01 in pass 2) is wrong
        cache.run_stream(Engine(wrong_at=4), "plan", stream, expected, mismatches)
        self.assertEqual(len(mismatches), 1, mismatches)
        self.assertIn("q01 plan pass 2 vs no cache", mismatches[0])


class GpuReportTest(unittest.TestCase):
    def test_metrics_are_summed_over_the_gpu_operators_only(self):
        from cirrobench import gpu

        plan = "\n".join([
            "GpuFilterExec: lo_discount@1 >= 1, metrics=[output_rows=10, gpu_dispatches=3, gpu_blocks=1, "
            "cpu_blocks=0, gpu_upload_time=1.5ms, gpu_kernel_time=250µs, gpu_overlapped_blocks=4]",
            "GpuAggregateExec: mode=Partial, metrics=[gpu_dispatches=2, gpu_blocks=2, cpu_blocks=1, "
            "gpu_upload_time=2s, gpu_kernel_time=3.25ms]",
            "FilterExec: a > 1, metrics=[gpu_dispatches=100, elapsed_compute=9s]",
        ])
        sums = gpu._metric_sums(plan)
        self.assertEqual((sums["gpu_dispatches"], sums["gpu_blocks"], sums["cpu_blocks"]), (5, 3, 1))
        self.assertEqual(sums["gpu_overlapped_blocks"], 4)
        self.assertAlmostEqual(sums["gpu_upload_ms"], 2001.5)
        self.assertAlmostEqual(sums["gpu_kernel_ms"], 3.5)

    def test_report_shows_each_query_and_each_policy(self):
        from cirrobench import gpu

        metrics = {"gpu_upload_ms": 12.0, "gpu_kernel_ms": 30.0, "gpu_dispatches": 6, "gpu_blocks": 2,
                   "cpu_blocks": 0, "gpu_overlapped_blocks": 1}
        results = {
            "config": {"sf": 0.1, "threads": 2, "runs": 3, "wire": "flight"},
            "device": {"device": "llvmpipe (LLVM 19, 256 bits)", "software": True},
            "queries": {"q1.1": {"off": {"median_s": 0.1}, "force": {"median_s": 0.3},
                                 "ratio_gpu_over_cpu": 3.0, "force_metrics": metrics, "same_answer": True}},
            "co_runs": {"gpu_memory": "32MB", "pairs": ["q1.1+q2.1"], "policies": {
                "cdr": {"total_wall_s": 1.0, "total_alone_s": 1.5, "throughput_vs_alone": 1.5,
                        "waiting_max": 1, "device": {"evictions": 4, "written_back": 0, "loaded": 2 ** 21,
                                   "cache_hits": 9, "cache_misses": 3}}}},
            "machine": {"cpus": 2},
        }
        text = gpu.report(results)
        self.assertIn("not a speed claim", text)
        self.assertIn("| q1.1 | 0.100 | 0.300 | 3.00 | 12.0 | 30.0 | 6 | 2 | 1 | 0 | yes |", text)
        self.assertIn("| cdr | 1.00 | 1.50 | 1.50 | 1 | 4 | 0.0 | 2.0 | 9 | 3 |", text)


class SettingsTest(unittest.TestCase):
    def test_set_takes_plain_words_only(self):
        args = cli.parse(["tpch", "--set", "jit=off", "--set", "Adaptive_Aggregation = force"])
        self.assertEqual(args.settings, [("jit", "off"), ("adaptive_aggregation", "force")])
        self.assertEqual(runner._config(args, ["cirro"])["settings"],
                         ["jit=off", "adaptive_aggregation=force"])
        for bad in ["jit", "jit=off; DROP TABLE t", "=off", "jit='off'"]:
            with self.assertRaises(SystemExit, msg=bad):
                cli.parse(["tpch", "--set", bad])
        self.assertNotIn("settings", runner._config(cli.parse(["tpch"]), ["cirro"]))



PGBENCH_OUT = """pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: <builtin: TPC-B (sort of)>
scaling factor: 10
query mode: prepared
number of clients: 4
number of threads: 4
maximum number of tries: 10
duration: 10 s
number of transactions actually processed: 10820
number of failed transactions: 3 (0.028%)
number of transactions retried: 41 (0.379%)
total number of retries: 44
latency average = 3.312 ms
initial connection time = 9.410 ms
tps = 1207.706756 (without initial connection time)
"""


class MicroTest(unittest.TestCase):
    def test_pgbench_summary_is_read(self):
        from cirrobench import wire

        r = wire.parse_pgbench(PGBENCH_OUT)
        self.assertEqual(r, {"ops_per_s": 1207.706756, "latency_avg_ms": 3.312, "ops": 10820, "failed": 3})
        self.assertIsNone(wire.parse_pgbench("connection refused\n")["ops_per_s"])

    def test_report_gives_the_median_over_starts_with_its_range(self):
        from cirrobench import wire

        def run(ops, p50=None, avg=None, errors=0):
            return {"ops_per_s": ops, "p50_ms": p50, "p99_ms": None, "latency_avg_ms": avg, "errors": errors,
                    "first_error": "1 failed transactions" if errors else None}

        doc = {"results": {
            "insert-1/1": {"cirro": [run(900, 1.1), run(1000, 1.0), run(5000, 0.2)],
                           "postgresql": [run(2000, 0.5), run(2000, 0.5), run(2000, 0.5)]},
            "pgbench-tpcb/4": {"cirro": [run(600, avg=6.0, errors=1), run(700, avg=5.0)],
                               "postgresql": [run(1400, avg=3.0), run(1400, avg=3.0)]}},
            "versions": {"postgresql": "15", "psycopg": "3"}, "machine": {"cpu": "x", "cpus": 2},
            "threads": 2, "preload_rows": 10, "pgbench_scale": 1, "duration_s": 1, "starts": 3,
            "engines": ["cirro", "postgresql"], "failures": ["cirro pgbench-tpcb x4, start 1: 1 failed"]}
        with tempfile.TemporaryDirectory() as d:
            text = Path(wire.micro_report(doc, Path(d))).read_text()
        self.assertIn("| insert-1 | 1 | cirro | 1.00 | — | 1,000 (900–5,000) | 0 | 0.500 |", text)
        self.assertIn("| pgbench-tpcb | 4 | cirro | 5.50 | — | 650 (600–700) | 1 | 0.464 |", text)
        self.assertIn("FAILURES", text)


class PendingTest(unittest.TestCase):
    def test_changes_commute_and_insert_new_keys(self):
        from cirrobench import engines, pending

        duckdb = engines.import_duckdb(False)
        con = duckdb.connect()
        con.execute("CREATE TABLE orders AS SELECT i AS o_orderkey, i % 7 AS o_custkey, 'O' AS o_orderstatus, "
                    "CAST(i * 1.5 AS DECIMAL(15,2)) AS o_totalprice, DATE '2026-01-01' AS o_orderdate, "
                    "'1-URGENT' AS o_orderpriority, 'c' AS o_clerk, 0 AS o_shippriority, 'x' AS o_comment "
                    "FROM range(1, 201) t(i)")
        con.execute("CREATE TABLE lineitem AS SELECT o_orderkey AS l_orderkey, 1 AS l_partkey, 2 AS l_suppkey, "
                    "n AS l_linenumber, CAST(n AS DECIMAL(15,2)) AS l_quantity, "
                    "CAST(10 * n AS DECIMAL(15,2)) AS l_extendedprice, CAST(0.05 AS DECIMAL(15,2)) AS l_discount, "
                    "CAST(0.01 AS DECIMAL(15,2)) AS l_tax, 'N' AS l_returnflag, 'O' AS l_linestatus, "
                    "DATE '2026-01-02' AS l_shipdate, DATE '2026-01-03' AS l_commitdate, "
                    "DATE '2026-01-04' AS l_receiptdate, 'NONE' AS l_shipinstruct, 'AIR' AS l_shipmode, "
                    "'y' AS l_comment FROM orders, range(1, 4) t(n)")
        changes = pending.make_changes(con, 120)
        self.assertEqual(len(changes), 120)
        kinds = {sql.split()[0] for sql, _ in changes}
        self.assertEqual(kinds, {"INSERT", "UPDATE", "DELETE"})
        new_orders = [p[0] for sql, p in changes if sql.startswith("INSERT INTO orders")]
        self.assertTrue(new_orders and min(new_orders) > 200 and len(set(new_orders)) == len(new_orders))

        def state(order, apply=pending.apply_one_by_one):
            c = duckdb.connect()
            for t in ("orders", "lineitem"):
                c.register(f"src_{t}", con.sql(f"SELECT * FROM {t}").to_arrow_table())
                c.execute(f"CREATE TABLE {t} AS SELECT * FROM src_{t}")
            apply(c, order)
            return [c.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in ("orders", "lineitem")]

        forward = state(changes)
        self.assertNotEqual(forward, state([]))
        # As the clients' statements interleave: each client's in order.
        interleaved = [c for i in range(pending.CLIENTS) for c in changes[i::pending.CLIENTS]]
        self.assertEqual(forward, state(list(reversed(interleaved))))
        # The reference answers' bulk application leaves the same.
        self.assertEqual(forward, state(changes, pending.apply_duckdb))
