"""The engines a benchmark measures. Each runs inside its own worker process
(`worker.py`), so that a thread count set through the environment applies, a
query past its timeout can be killed, and a crashing peer is recorded rather
than ending the run.

Every engine reads the same Parquet files (`tables`: name -> directory of the
files), except Cirro, which reads its own tables (the files were hard-linked
from them), and `duckdb-db`, DuckDB's own database file loaded from them.
`duckdb2` and `duckdb2-db` are the same with DuckDB's newest release (2.x),
installed beside the pinned one (which the Delta reader of the interop tests
and the reference answers use) in a directory of its own, imported only in
its workers.
`run(sql)` returns a pyarrow Table; the time measured around it includes
planning, execution and materialising the whole result.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

# DuckDB's memory limit in every run: a share of this machine's memory, so
# that DuckDB and the Cirro server (its own caches included) fit it together.
DUCKDB_MEMORY_SHARE = 0.4
# Where bootstrap.py installs DuckDB's newest release, inside the benchmark
# environment (requirements-duckdb2.txt).
DUCKDB2_DIR = "duckdb2"


def memory_bytes():
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def import_duckdb(newest):
    """The pinned DuckDB, or (newest) the 2.x release from its own
    directory. A worker process imports one or the other, never both."""
    if newest:
        sys.path.insert(0, str(Path(sys.prefix) / DUCKDB2_DIR))
    import duckdb

    want = "2." if newest else "1."
    if not duckdb.__version__.startswith(want):
        raise RuntimeError(f"expected DuckDB {want}x, imported {duckdb.__version__} from {duckdb.__file__}")
    return duckdb

# Engine names as `--peers` takes them, in the order reports show them.
ALL = ["cirro", "duckdb", "duckdb-db", "duckdb2", "duckdb2-db", "datafusion", "polars", "chdb", "spark"]
DEFAULT_PEERS = ["duckdb", "duckdb-db", "duckdb2", "duckdb2-db", "datafusion", "polars", "chdb"]
# The engine whose results every Cirro result is checked against.
REFERENCE = "duckdb"


class Context:
    """What an engine is given: the data set and the run's settings."""

    def __init__(self, tables, threads, work, cirro_bin=None, cirro_data=None, wire="flight"):
        self.tables = {k: str(v) for k, v in tables.items()}
        self.wire = wire
        self.threads = threads
        self.work = str(work)
        self.cirro_bin = cirro_bin
        self.cirro_data = str(cirro_data) if cirro_data else None
        # Extra environment of `cirro serve` (e.g. CIRRO_CACHE_MEMORY).
        self.cirro_env = {}
        # Session settings Cirro's connection sets first: [(name, value)].
        self.cirro_settings = []
        # One statement's memory for every engine that takes one (`--memory-limit`).
        self.memory_limit = None


SETTING_NAME = re.compile(r"^[a-z_][a-z0-9_.]*$")
SETTING_VALUE = re.compile(r"^[A-Za-z0-9_.%-]+$")


def parse_setting(text):
    """`name=value` of `--set` as (name, value); a name or value that is
    not a plain word is refused (it goes into a SET statement)."""
    name, sep, value = text.partition("=")
    name, value = name.strip().lower(), value.strip()
    if not sep or not SETTING_NAME.match(name) or not SETTING_VALUE.match(value):
        raise ValueError(f"--set takes NAME=VALUE of plain words, not {text!r}")
    return name, value


def thread_env(threads):
    """Environment variables that bound the threads of the peers that read
    them at import (Polars, Arrow's and numpy's pools)."""
    return {
        "POLARS_MAX_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
    }


class Connection:
    """A client connection to a Cirro server, as a client program would
    make it: over Arrow Flight SQL (ADBC), or (`wire="pg"`) over the
    PostgreSQL protocol (psycopg, binary results, turned into an Arrow table
    column by column). `run(sql)` returns a pyarrow Table."""

    def __init__(self, wire, host, port, password, user="cirro"):
        self.wire = wire
        if wire == "pg":
            import psycopg

            self.conn = psycopg.connect(host=host, port=port, user=user, dbname="cirro", password=password,
                                        autocommit=True)
        else:
            import adbc_driver_flightsql.dbapi as flightsql

            self.conn = flightsql.connect(f"grpc://{host}:{port}",
                                          db_kwargs={"username": user, "password": password}, autocommit=True)

    def run(self, sql):
        if self.wire == "pg":
            return self._run_pg(sql)
        with self.conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetch_arrow_table()

    def _run_pg(self, sql):
        import pyarrow as pa

        with self.conn.cursor(binary=True) as cur:
            cur.execute(sql)
            if cur.description is None:
                return pa.table({})
            rows = cur.fetchall()
            names = [f"c{i}" for i in range(len(cur.description))]
            return pa.table({n: pa.array([r[i] for r in rows]) for i, n in enumerate(names)})

    def close(self):
        self.conn.close()


class Cirro:
    """`cirro serve` on the data location, queried through a `Connection`
    (`ctx.wire`), so the time includes the round trip."""

    name = "cirro"
    PASSWORD = "cirro-bench"

    def __init__(self, ctx):
        self.proc = subprocess.Popen(
            [ctx.cirro_bin, "--data", ctx.cirro_data, "--threads", str(ctx.threads),
             "serve", "--pg-port", "0", "--flight-port", "0", "--http-port", "0"],
            env={**os.environ, "CIRRO_PASSWORD": self.PASSWORD, "CIRRO_USER": "cirro", **ctx.cirro_env},
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
        )
        ports = {}
        for _ in range(2):
            line = self.proc.stdout.readline()
            for wire, banner in (("flight", "Flight SQL"), ("pg", "PostgreSQL protocol")):
                if banner in line:
                    ports[wire] = int(line.split(" (")[0].strip().rsplit(":", 1)[1])
        self.wire = ctx.wire
        if self.wire not in ports:
            raise RuntimeError(f"cirro serve did not start (exit {self.proc.poll()})")
        self.ports = ports
        self.client = self.connect_again()
        for name, value in ctx.cirro_settings:
            self.run(f"SET {name} = {value}")
        self.pid = self.proc.pid
        out = subprocess.run([ctx.cirro_bin, "--version"], capture_output=True, text=True)
        self.version = out.stdout.strip().split()[-1] if out.returncode == 0 else "?"

    def connect_again(self):
        """A new client connection to this server."""
        return Connection(self.wire, "127.0.0.1", self.ports[self.wire], self.PASSWORD)

    def run(self, sql):
        return self.client.run(sql)

    def close(self):
        try:
            self.client.close()
        finally:
            self.proc.terminate()
            self.proc.wait(timeout=30)


class DuckDB:
    """DuckDB over the Parquet files (views on read_parquet)."""

    name = "duckdb"
    newest = False

    def __init__(self, ctx, path=":memory:"):
        duckdb = import_duckdb(self.newest)
        self.version = duckdb.__version__
        self.con = duckdb.connect(path)
        self.con.execute(f"SET threads = {ctx.threads}")
        limit = ctx.memory_limit or f"{int(memory_bytes() * DUCKDB_MEMORY_SHARE) >> 20}MB"
        self.con.execute(f"SET memory_limit = '{limit}'")
        # Where DuckDB spills beyond it (its default is beside its database file).
        self.con.execute(f"SET temp_directory = '{Path(ctx.work) / 'duckdb-spill'}'")
        self.con.execute("SET enable_progress_bar = false")  # it would draw on the harness's output
        self.attach(ctx)

    def attach(self, ctx):
        for name, path in ctx.tables.items():
            self.con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet('{path}/*.parquet')")

    def run(self, sql):
        # A relation's Arrow table: no extra copy of the rows (2.x warns
        # that a DB-API result's makes one); None for a statement.
        relation = self.con.sql(sql)
        if relation is None:
            import pyarrow as pa

            return pa.table({})
        return relation.to_arrow_table()

    def close(self):
        self.con.close()


class DuckDBNative(DuckDB):
    """DuckDB on its own database file, loaded from the Parquet files once
    (the load is timed and kept in `load_seconds`)."""

    name = "duckdb-db"
    file = "duckdb.db"

    def __init__(self, ctx):
        path = Path(ctx.work) / self.file
        self.load_seconds = None
        super().__init__(ctx, str(path))

    def attach(self, ctx):
        have = {r[0] for r in self.con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        start = time.perf_counter()
        for name, path in ctx.tables.items():
            if name not in have:
                self.con.execute(f"CREATE TABLE {name} AS SELECT * FROM read_parquet('{path}/*.parquet')")
        if len(have) < len(ctx.tables):
            self.con.execute("CHECKPOINT")
            self.load_seconds = time.perf_counter() - start


class DataFusion:
    """The `datafusion` Python package: the engine Cirro builds on."""

    name = "datafusion"

    def __init__(self, ctx):
        import datafusion

        self.version = datafusion.__version__
        config = datafusion.SessionConfig().with_target_partitions(ctx.threads)
        self.ctx = datafusion.SessionContext(config)
        for name, path in ctx.tables.items():
            self.ctx.register_parquet(name, path)

    def run(self, sql):
        import pyarrow as pa

        df = self.ctx.sql(sql)
        batches = df.collect()
        return pa.Table.from_batches(batches, schema=None if batches else df.schema())

    def close(self):
        pass


class Polars:
    """Polars' SQL interface over lazy Parquet scans (threads: POLARS_MAX_THREADS)."""

    name = "polars"

    def __init__(self, ctx):
        import polars as pl

        self.version = pl.__version__
        self.sql = pl.SQLContext({name: pl.scan_parquet(f"{path}/*.parquet") for name, path in ctx.tables.items()})

    def run(self, sql):
        return self.sql.execute(sql, eager=False).collect().to_arrow()

    def close(self):
        pass


class Chdb:
    """chDB: ClickHouse in-process, views over its file() table function."""

    name = "chdb"
    # SQL-standard semantics where ClickHouse's defaults differ: NULLs from
    # outer joins, NULL (not 0) for aggregates over no rows, correlated subqueries.
    SETTINGS = ["join_use_nulls = 1", "aggregate_functions_null_for_empty = 1",
                "allow_experimental_correlated_subqueries = 1", "union_default_mode = 'DISTINCT'"]

    def __init__(self, ctx):
        import chdb
        from chdb import session

        self.version = chdb.__version__
        self.session = session.Session()
        settings = [f"max_threads = {ctx.threads}"] + self.SETTINGS
        for s in settings:
            try:
                self.session.query(f"SET {s}")
            except Exception:  # a setting this ClickHouse does not know: go on without it
                pass
        for name, path in ctx.tables.items():
            self.session.query(f"CREATE VIEW IF NOT EXISTS {name} AS SELECT * FROM file('{path}/*.parquet', Parquet)")

    def run(self, sql):
        return self.session.query(sql.strip().rstrip(";"), "ArrowTable")

    def close(self):
        self.session.close()


class Spark:
    """PySpark in local mode with T cores and T shuffle partitions."""

    name = "spark"

    def __init__(self, ctx):
        from pyspark.sql import SparkSession

        self.spark = (
            SparkSession.builder.master(f"local[{ctx.threads}]")
            .config("spark.sql.shuffle.partitions", str(ctx.threads))
            .config("spark.driver.memory", "8g")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        self.version = self.spark.version
        for name, path in ctx.tables.items():
            self.spark.read.parquet(path).createOrReplaceTempView(name)

    def run(self, sql):
        return self.spark.sql(re.sub(r";\s*$", "", sql.strip())).toArrow()

    def close(self):
        self.spark.stop()


class DuckDB2(DuckDB):
    """DuckDB's newest release (2.x) over the Parquet files."""

    name = "duckdb2"
    newest = True


class DuckDB2Native(DuckDBNative):
    """DuckDB's newest release on its own database file (2.x writes a
    format 1.5 cannot read: a file of its own)."""

    name = "duckdb2-db"
    newest = True
    file = "duckdb2.db"


CLASSES = {c.name: c for c in [Cirro, DuckDB, DuckDBNative, DuckDB2, DuckDB2Native, DataFusion, Polars, Chdb, Spark]}


def make(name, ctx):
    if name not in CLASSES:
        raise ValueError(f"unknown engine {name!r}: choose from {', '.join(ALL)}")
    return CLASSES[name](ctx)
