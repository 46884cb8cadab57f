"""The Markdown report and PNG plots of a suite's results.json.

    report.md     machine, versions, totals, per-query medians, where Cirro
                  trails the best peer most, failures, the physical-limit probe
    queries.png   per-query median time per engine (log scale)
    ratio.png     Cirro / best peer per query
    scaling.png   time against size for the suites with scaling curves
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from . import engines as engine_list  # noqa: E402

COLORS = {"cirro": "#d62728", "duckdb": "#1f77b4", "duckdb-db": "#6baed6", "duckdb2": "#17becf",
          "duckdb2-db": "#9edae5", "datafusion": "#2ca02c",
          "polars": "#9467bd", "chdb": "#ff7f0e", "spark": "#8c564b"}


WIRES = {"flight": "Arrow Flight SQL (ADBC)", "pg": "the PostgreSQL protocol (psycopg, binary results)"}


def _engines(state):
    names = state["config"]["engines"]
    return sorted(names, key=lambda n: engine_list.ALL.index(n) if n in engine_list.ALL else 99)


def medians(state):
    """{query: {engine: seconds or None}} of the finished queries, in suite order."""
    order = list(state.get("query_meta", {})) or list(state["queries"])
    out = {}
    for q in order:
        rec = state["queries"].get(q)
        if rec and rec.get("done"):
            out[q] = {n: e.get("median") for n, e in rec["engines"].items()}
    return out


def best_peer(state, q):
    """(engine, seconds) of the fastest peer with a correct answer, or None."""
    rec = state["queries"][q]["engines"]
    peers = [(e["median"], n) for n, e in rec.items()
             if n != "cirro" and e.get("median") is not None and e["status"] == "ok"]
    if not peers:
        return None
    t, n = min(peers)
    return n, t


def ratios(state):
    """{query: (cirro / best peer, best peer)} where both ran."""
    out = {}
    for q, m in medians(state).items():
        best = best_peer(state, q)
        if best and m.get("cirro") and best[1] > 0:
            out[q] = (m["cirro"] / best[1], best[0])
    return out


def totals(state):
    """Per engine: (total over the queries every engine finished, their count),
    and total over its own finished queries with their count."""
    meds = medians(state)
    names = _engines(state)
    common = [q for q, m in meds.items() if all(m.get(n) is not None for n in names)]
    out = {}
    for n in names:
        own = [m[n] for m in meds.values() if m.get(n) is not None]
        out[n] = {"common": sum(meds[q][n] for q in common), "common_count": len(common),
                  "own": sum(own), "own_count": len(own)}
    return out


def start_totals(state):
    """Per engine: the total of each start's medians over the queries every
    engine finished, one total per start (empty where a query lacks starts)."""
    meds = medians(state)
    names = _engines(state)
    common = [q for q, m in meds.items() if all(m.get(n) is not None for n in names)]
    starts = [state["queries"][q].get("starts", []) for q in common]
    count = min((len(s) for s in starts), default=0)
    out = {}
    for n in names:
        totals = []
        for i in range(count):
            per = [s[i]["engines"].get(n, {}).get("median") for s in starts]
            if any(t is None for t in per):
                break
            totals.append(sum(per))
        out[n] = totals
    return out


def _ms(seconds):
    if seconds is None:
        return "—"
    ms = seconds * 1000
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}"


def _cell(rec, spread=False):
    if rec["status"] in ("error", "timeout", "unavailable"):
        return {"error": "error", "timeout": "timeout", "unavailable": "n/a"}[rec["status"]]
    text = _ms(rec.get("median"))
    if spread and rec.get("range"):
        low, high = rec["range"]
        text += f" [{_ms(low)}–{_ms(high)}]"
    return text + " ✗" if rec["status"] == "wrong" else text


def plot_queries(state, path):
    meds = medians(state)
    names = _engines(state)
    queries = list(meds)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(8, len(queries) * 0.6 + 2), 4.8))
    for i, n in enumerate(names):
        xs = [qi + (i - len(names) / 2 + 0.5) * width for qi in range(len(queries))]
        ys = [(meds[q].get(n) or 0) * 1000 for q in queries]
        ax.bar(xs, ys, width, label=n, color=COLORS.get(n))
    ax.set_xticks(range(len(queries)))
    ax.set_xticklabels(queries, rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("median hot run, ms (log)")
    ax.set_title(f"{state['config']['suite']} SF{state['config']['sf']:g}, {state['config']['threads']} threads",
                 pad=24)
    ax.legend(fontsize=8, ncol=len(names), loc="lower center", bbox_to_anchor=(0.5, 1.06), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ratio(state, path):
    r = ratios(state)
    queries = list(r)
    fig, ax = plt.subplots(figsize=(max(8, len(queries) * 0.45 + 2), 4))
    values = [r[q][0] for q in queries]
    ax.bar(range(len(queries)), values, color=["#2ca02c" if v <= 1 else "#d62728" for v in values])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(queries)))
    ax.set_xticklabels(queries, rotation=45, ha="right")
    ax.set_ylabel("Cirro / best peer (lower is better)")
    ax.set_title("Cirro's median time over the fastest peer's, per query")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(state, path):
    meta = state.get("query_meta", {})
    series = {}
    for q, m in medians(state).items():
        s = meta.get(q, {}).get("series")
        if s:
            series.setdefault(s, []).append((meta[q]["x"], m, q))
    if not series:
        return False
    names = _engines(state)
    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 4.2), squeeze=False)
    for ax, (s, points) in zip(axes[0], series.items()):
        xs = [x for x, _, _ in points]
        scale = 1e6 if max(xs) >= 1e6 else 1
        for n in names:
            xy = [(x / scale, m[n]) for x, m, _ in points if m.get(n) is not None]
            if xy:
                ax.plot([p[0] for p in xy], [p[1] for p in xy], marker="o", label=n, color=COLORS.get(n))
        ax.set_xticks([x / scale for x in xs])
        ax.set_title(s)
        label = meta[points[0][2]].get("x_label") or "size"
        ax.set_xlabel(label + (" (millions)" if scale > 1 else ""))
        ax.set_ylabel("median hot run, s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(state, out):
    out = Path(out)
    cfg = state["config"]
    names = _engines(state)
    meds = medians(state)
    r = ratios(state)
    tot = totals(state)
    plot_queries(state, out / "queries.png")
    plot_ratio(state, out / "ratio.png")
    has_scaling = plot_scaling(state, out / "scaling.png")
    mach = state.get("machine", {})
    lines = [f"# `{cfg['suite']}` at SF {cfg['sf']:g}: Cirro beside its peers", ""]
    starts = cfg.get("starts", 1)
    figures = (f"figures are medians of {cfg['runs']} hot runs (the cold first run in the JSON)" if starts == 1 else
               f"a figure is the median over **{starts} starts** (each a fresh process of every engine, Cirro's "
               f"server among them, running every query: the cold run, then {cfg['runs']} hot runs whose median "
               "is the start's figure), with the range of the starts' figures in brackets")
    lines += [f"Machine: {mach.get('cpu', '?')}, {mach.get('cpus')} CPUs, {mach.get('memory_gib')} GiB memory, "
              f"{mach.get('platform')}. Every engine limited to **{cfg['threads']} threads**; {figures}; engines "
              f"alternating query by query; per-query timeout {state.get('timeout_seconds')} s. Run "
              f"{state.get('started')} – {state.get('finished', 'unfinished')}.", ""]
    lines += ["Engines: " + ", ".join(f"{n} {state['versions'].get(n, '?')}" for n in names) + ". "
              f"Cirro is queried through `cirro serve` over {WIRES[cfg.get('wire', 'flight')]}, so its times include a "
              "client round trip; the peers run in-process. DuckDB runs twice per release: `duckdb` on the "
              "Parquet files, `duckdb-db` on its own database file loaded from them; `duckdb`/`duckdb-db` are "
              "the pinned release, `duckdb2`/`duckdb2-db` the newest (2.x). DuckDB's memory limit is "
              f"{engine_list.DUCKDB_MEMORY_SHARE:.0%} of the machine's memory; Cirro's hot-data tier (decoded "
              "column chunks kept between queries) takes its default, 25 %, so the two fit the machine together; "
              "the cold run fills it, the hot runs read from it.", ""]
    if cfg.get("memory_limit"):
        lines += [f"Memory limit: {cfg['memory_limit']} per statement for Cirro (`SET memory_limit`) and DuckDB "
                  "(`memory_limit`) alike; joins and aggregations that do not fit it spill to disk (the other "
                  "peers run without one).", ""]
    data = state.get("data", {})
    if data:
        lines += [f"Data: {len(data.get('tables', []))} tables, {data.get('parquet_bytes', 0) / 1e6:,.0f} MB of "
                  f"Parquet, made by Cirro in {data.get('cirro_load_seconds')} s; every peer reads those files.",
                  ""]
    if cfg.get("settings"):
        lines += ["Cirro's session settings: " + ", ".join(f"`SET {s.replace('=', ' = ', 1)}`"
                                                        for s in cfg["settings"]) + ".", ""]
    lines += [f"Reproduce: `{state.get('command')}`", ""]
    checked = [q for q in meds if (state["queries"][q].get("check") or "").startswith("equal")]
    if state.get("mismatches"):
        lines += ["## ❌ CORRECTNESS FAILURE", ""] + [f"- {m}" for m in state["mismatches"]] + [""]
    else:
        answers = sum(state["queries"][q]["engines"]["cirro"].get("checked", 0) for q in checked)
        every = all("every run" in state["queries"][q]["check"] for q in checked) if checked else False
        lines += [f"Correctness: Cirro's result equals DuckDB's, value by value, on {len(checked)} of "
                  f"{len(meds)} queries" + (f", on every run of each, cold and hot ({answers} answers compared)"
                                            if every else "")
                  + (" (the rest unchecked: see the table)." if len(checked) < len(meds) else "."), ""]
    per_start = start_totals(state)
    lines += ["## Totals", "", "| engine | total s (queries all engines finished) | Cirro / engine | "
              "total s (own finished queries) |" + (" totals of each start (s) |" if starts > 1 else ""),
              "|---|---:|---:|---:|" + ("---:|" if starts > 1 else "")]
    for n in names:
        t = tot[n]
        ratio = tot["cirro"]["common"] / t["common"] if t["common"] else None
        line = (f"| {n} | {t['common']:.2f} ({t['common_count']}) | "
                f"{'—' if ratio is None else f'{ratio:.2f}'} | {t['own']:.2f} ({t['own_count']}) |")
        if starts > 1:
            line += " " + ", ".join(f"{x:.2f}" for x in per_start.get(n, [])) + " |"
        lines.append(line)
    lines.append("")
    worst = sorted(((v[0], q, v[1]) for q, v in r.items() if v[0] > 1), reverse=True)[:5]
    if r:
        lines += ["## Where Cirro trails the best peer most", ""]
        lines += [f"{i + 1}. **{q}**: {ratio:.2f}× {peer}'s time ({_ms(meds[q]['cirro'])} ms vs "
                  f"{_ms(meds[q][peer])} ms)" for i, (ratio, q, peer) in enumerate(worst)]
        if not worst:
            lines.append("Nowhere: Cirro is the fastest engine on every query.")
        wins = sum(1 for v in r.values() if v[0] <= 1)
        gm = geo_mean([v[0] for v in r.values()])
        lines += ["", f"Cirro is the fastest engine on {wins} of {len(r)} queries; geometric mean of "
                      f"Cirro / best peer: {gm:.2f}.", ""]
    lines += [f"## Per query (median ms{' [range over the starts]' if starts > 1 else ''})", ""]
    lines += ["| query | " + " | ".join(names) + " | Cirro / best peer |",
              "|---|" + "---:|" * (len(names) + 1)]
    for q in meds:
        rec = state["queries"][q]["engines"]
        ratio = f"{r[q][0]:.2f} ({r[q][1]})" if q in r else "—"
        lines.append(f"| {q} | " + " | ".join(_cell(rec[n], starts > 1) if n in rec else "—" for n in names)
                     + f" | {ratio} |")
    lines += ["", "✗: the engine's answer differs from DuckDB's (time shown, not counted as best peer)."]
    failures = [(q, n, e) for q in meds for n, e in state["queries"][q]["engines"].items()
                if e["status"] != "ok"]
    if failures:
        lines += ["", "## What a peer could not do", ""]
        lines += [f"- {q} {n}: {e['status']}: {(e.get('error') or '').splitlines()[0][:200] if e.get('error') else ''}"
                  for q, n, e in failures]
    p = state.get("probe")
    if p:
        bw = p["bandwidth_bytes_per_s"]
        lines += ["", "## Physical limit", "",
                  f"Memory read bandwidth measured on this machine: {bw / 1e9:.1f} GB/s with {p['threads']} threads "
                  f"({p['bandwidth_1_thread_bytes_per_s'] / 1e9:.1f} GB/s with one). For scan-bound queries, the "
                  "bytes of the columns they read (in memory, decoded) and the time those bytes take at that "
                  "bandwidth:", "",
                  "| query | MB read | floor ms | Cirro ms | Cirro / floor |", "|---|---:|---:|---:|---:|"]
        for q, f in p["queries"].items():
            c = meds.get(q, {}).get("cirro")
            ratio = f"{c / f['floor_seconds']:.1f}" if c and f["floor_seconds"] else "—"
            lines.append(f"| {q} | {f['bytes'] / 1e6:,.0f} | {f['floor_seconds'] * 1000:.1f} | {_ms(c)} | {ratio} |")
    lines += ["", "## Plots", "", "![per query](queries.png)", "", "![Cirro / best peer](ratio.png)"]
    if has_scaling:
        lines += ["", "![scaling](scaling.png)"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return out / "report.md"


def geo_mean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None
