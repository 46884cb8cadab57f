"""The query suites: what data each needs and the queries it times.

A suite gives `tables(sf)`: how Cirro makes each table (a `cirro load`
data set, or SQL run by Cirro), and `queries(sf)`: a list of Query. Queries
that belong on a scaling curve carry `series` (the curve's name) and `x`
(its abscissa) so that reports can draw them.
"""

from dataclasses import dataclass
from pathlib import Path

SHARED = Path(__file__).resolve().parents[3] / "shared"


@dataclass
class Query:
    id: str
    sql: str
    series: str = None
    x: float = None
    x_label: str = None


@dataclass
class Suite:
    name: str
    # "tpch" / "ssb": made by `cirro load <name> --sf`; None: by `ctas` below
    load: str = None
    # scan-bound queries for the physical-limit probe: {query id: {table: [columns]}}
    scan_bound: dict = None


def _label(n):
    for unit, size in (("m", 1_000_000), ("k", 1_000)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _rows(base, sf):
    return max(1000, int(round(base * sf)))


def shared_dir():
    import os

    return Path(os.environ.get("CIRRO_SHARED", SHARED))


def tpch_queries(sf):
    qdir = shared_dir() / "tpch/queries"
    queries = [Query(f"q{i:02d}", (qdir / f"q{i:02d}.sql").read_text()) for i in range(1, 23)]
    # Q11's FRACTION is 0.0001 / SF (TPC-H 2.4.11.3): at SF 10 the SF 1
    # fraction keeps no group, and every engine's empty answer checks
    # nothing. Below SF 1 the SF 1 fraction stays (a larger one keeps none).
    if sf > 1:
        q11 = queries[10]
        fraction = f"{0.0001 / sf:.10f}"
        assert "0.0001000000" in q11.sql, "Q11's fraction is not where it was"
        queries[10] = Query(q11.id, q11.sql.replace("0.0001000000", fraction))
    return queries


def ssb_queries(sf):
    qdir = shared_dir() / "ssb/queries"
    ids = ["1.1", "1.2", "1.3", "2.1", "2.2", "2.3", "3.1", "3.2", "3.3", "3.4", "4.1", "4.2", "4.3"]
    return [Query(f"q{i}", (qdir / f"q{i}.sql").read_text()) for i in ids]


# CirroData's join workload, scaled down: j1..j4 of N rows each.
JOIN_SIZES = [1_000_000, 5_000_000, 10_000_000, 20_000_000]
CHAIN_SIZE = 5_000_000


def _join_table_sql(name, n):
    return (f"CREATE TABLE {name} AS SELECT CAST(floor(random() * {n}) AS BIGINT) + 1 AS k, "
            f"CAST(floor(random() * 100) AS INT) AS g, random() * 1000 AS v, "
            f"CAST('s' || CAST(CAST(floor(random() * 1000000000) AS BIGINT) AS VARCHAR) AS VARCHAR(20)) AS s "
            f"FROM generate_series(1, {n}) AS t(i)")


def joins_tables(sf):
    tables = {}
    for n in JOIN_SIZES:
        n = _rows(n, sf)
        count = 4 if n == _rows(CHAIN_SIZE, sf) else 2
        for t in range(1, count + 1):
            name = f"j{t}_{_label(n)}"
            tables[name] = _join_table_sql(name, n)
    return tables


def joins_queries(sf):
    out = []
    for n in JOIN_SIZES:
        n = _rows(n, sf)
        s = _label(n)
        out.append(Query(f"join2-{s}", f"SELECT a.g, count(*), sum(a.v + b.v) FROM j1_{s} a JOIN j2_{s} b "
                                       f"ON a.k = b.k GROUP BY a.g", series="2-table join", x=n,
                         x_label="rows per table"))
    n = _rows(CHAIN_SIZE, sf)
    s = _label(n)
    for tables in (2, 3, 4):
        aliases = "abcd"[:tables]
        joins = " ".join(f"JOIN j{i + 1}_{s} {aliases[i]} ON {aliases[i - 1]}.k = {aliases[i]}.k"
                         for i in range(1, tables))
        total = " + ".join(f"{a}.v" for a in aliases)
        out.append(Query(f"chain{tables}-{s}", f"SELECT a.g, count(*), sum({total}) FROM j1_{s} a {joins} "
                                               f"GROUP BY a.g", series=f"chain at {s} rows", x=tables,
                         x_label="tables joined"))
    return out


# CirroData's aggregation workload: 230 groups over growing tables; drill-down
# over 1..5 dimensions at 40 M rows.
AGG_SIZES = [10_000_000, 20_000_000, 40_000_000, 80_000_000]
DRILL_SIZE = 40_000_000
DIMENSIONS = [("d1", 230), ("d2", 12), ("d3", 31), ("d4", 7), ("d5", 1000)]


def _agg_table_sql(name, n):
    dims = ", ".join(f"CAST(floor(random() * {card}) AS INT) AS {d}" for d, card in DIMENSIONS)
    return (f"CREATE TABLE {name} AS SELECT {dims}, CAST(floor(random() * 1000) AS BIGINT) AS m1, "
            f"random() * 100 AS m2 FROM generate_series(1, {n}) AS t(i)")


def aggregation_tables(sf):
    return {f"agg_{_label(_rows(n, sf))}": _agg_table_sql(f"agg_{_label(_rows(n, sf))}", _rows(n, sf))
            for n in AGG_SIZES}


def aggregation_queries(sf):
    out = []
    for n in AGG_SIZES:
        n = _rows(n, sf)
        out.append(Query(f"agg-{_label(n)}", f"SELECT d1, count(*), sum(m1), avg(m2) FROM agg_{_label(n)} "
                                             f"GROUP BY d1", series="230 groups", x=n,
                         x_label="rows"))
    n = _rows(DRILL_SIZE, sf)
    for k in range(1, len(DIMENSIONS) + 1):
        dims = ", ".join(d for d, _ in DIMENSIONS[:k])
        out.append(Query(f"drill{k}-{_label(n)}", f"SELECT {dims}, count(*), sum(m1), avg(m2) FROM agg_{_label(n)} "
                                                  f"GROUP BY {dims}", series=f"drill-down at {_label(n)} rows", x=k,
                         x_label="dimensions grouped"))
    return out


SUITES = {
    "tpch": (Suite("tpch", load="tpch", scan_bound={
        "q01": {"lineitem": ["l_returnflag", "l_linestatus", "l_quantity", "l_extendedprice", "l_discount",
                             "l_tax", "l_shipdate"]},
        "q06": {"lineitem": ["l_extendedprice", "l_discount", "l_quantity", "l_shipdate"]},
    }), None, tpch_queries),
    "ssb": (Suite("ssb", load="ssb", scan_bound={
        q: {"lineorder": ["lo_orderdate", "lo_discount", "lo_quantity", "lo_extendedprice"],
            "dwdate": ["d_datekey", "d_year", "d_yearmonthnum", "d_weeknuminyear"]}
        for q in ("q1.1", "q1.2", "q1.3")
    }), None, ssb_queries),
    "joins": (Suite("joins"), joins_tables, joins_queries),
    "aggregation": (Suite("aggregation"), aggregation_tables, aggregation_queries),
}


def get(name):
    if name not in SUITES:
        raise SystemExit(f"unknown suite {name!r}: choose from {', '.join(SUITES)} (and dml, micro)")
    return SUITES[name]
