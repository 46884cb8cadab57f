#!/usr/bin/env python3
"""Print the Markdown summary table of the `cirro bench` reports under
bench/results/ (for bench/results/README.md): per suite, each engine's total
over the queries every engine finished, and Cirro / best peer.

    ~/.cache/cirro/bench-venv/bin/python bench/summary.py
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cirrobench import engines, report  # noqa: E402

ORDER = ["tpch-sf1", "tpch-sf10", "ssb-sf1", "ssb-sf10", "joins-sf1", "aggregation-sf1"]


def main():
    results = Path(__file__).resolve().parent / "results"
    names = [n for n in engines.ALL]
    print("| report | " + " | ".join(names) + " | Cirro / best peer (geometric mean) | Cirro fastest on |")
    print("|---|" + "---:|" * (len(names) + 2))
    for d in ORDER:
        path = results / d / "results.json"
        if not path.exists():
            continue
        state = json.loads(path.read_text())
        done = len(report.medians(state))
        if not done:
            continue
        unfinished = "" if done == len(state.get("query_meta", {})) else f", unfinished: {done} done"
        tot = report.totals(state)
        r = report.ratios(state)
        cells = []
        for n in names:
            t = tot.get(n)
            cells.append("—" if t is None else f"{t['common']:.2f} s")
        gm = report.geo_mean([v[0] for v in r.values()])
        wins = sum(1 for v in r.values() if v[0] <= 1)
        count = next(iter(tot.values()))["common_count"]
        print(f"| [{d}]({d}/report.md) ({count} queries{unfinished}) | " + " | ".join(cells) +
              f" | {gm or 0:.2f} | {wins} of {len(r)} |")


if __name__ == "__main__":
    main()
