"""psycopg 3 against `cirro serve`: parameters of every supported type,
server-side prepared statements, executemany, transactions, cancel and
statement_timeout (`basics`); COPY, pandas and Arrow round trips (`copy`);
SQLAlchemy reflection, queries and pandas through it (`sqlalchemy`); the
TPC-H queries (`tpch`). Run by crates/cirro/tests/server.rs; prints "ok" when
every check passed, raises otherwise."""

import datetime
import decimal
import sys
import threading
import time

import psycopg
from psycopg import errors


def check(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def basics(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute(
            "CREATE TABLE typed (i INT, b BIGINT, f DOUBLE, s VARCHAR, ok BOOLEAN,"
            " d DATE, ts TIMESTAMP, n DECIMAL(10, 2))"
        )
        row = (
            7,
            2**40,
            2.5,
            "it's \"quoted\" $1 -- not a comment",
            True,
            datetime.date(2024, 2, 29),
            datetime.datetime(2024, 2, 29, 12, 30, 45),
            decimal.Decimal("12.34"),
        )
        cur.execute("INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", row)
        check(cur.rowcount, 1, "INSERT rowcount")
        cur.execute("INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", (None,) * 8)
        cur.execute("SELECT i, b, f, s, ok, d, ts, n FROM typed WHERE i = %s", (7,))
        check(cur.fetchone(), row, "round trip of every type")
        cur.execute("SELECT count(*) FROM typed WHERE i IS NULL AND s IS NULL")
        check(cur.fetchone()[0], 1, "NULL parameters")
        # Binary parameters and results.
        with conn.cursor(binary=True) as bcur:
            bcur.execute("SELECT i, b, f, s, ok, d, n FROM typed WHERE b = %s AND s = %s", (2**40, row[3]))
            check(bcur.fetchone(), (7, 2**40, 2.5, row[3], True, datetime.date(2024, 2, 29), decimal.Decimal("12.34")), "binary")

        # Server-side prepared statements, executed many times.
        for k in range(5):
            cur.execute("INSERT INTO typed (i, s) VALUES (%s, %s)", (100 + k, f"p{k}"), prepare=True)
        cur.execute("SELECT count(*) FROM typed WHERE i >= %s", (100,), prepare=True)
        check(cur.fetchone()[0], 5, "prepared inserts")
        cur.executemany("INSERT INTO typed (i, s) VALUES (%s, %s)", [(200 + k, "m") for k in range(20)])
        cur.execute("SELECT count(*) FROM typed WHERE s = 'm'")
        check(cur.fetchone()[0], 20, "executemany")

        # Command tags of DML.
        cur.execute("UPDATE typed SET s = 'u' WHERE i >= %s AND i < %s", (200, 210))
        check(cur.rowcount, 10, "UPDATE rowcount")
        cur.execute("DELETE FROM typed WHERE s = %s", ("u",))
        check(cur.rowcount, 10, "DELETE rowcount")

        # Errors carry SQLSTATE; the connection stays usable.
        try:
            cur.execute("SELECT * FROM no_such_table")
            raise AssertionError("no error")
        except errors.UndefinedTable:
            pass
        cur.execute("SELECT 1")
        check(cur.fetchone()[0], 1, "after an error")

        # Settings.
        cur.execute("SET application_name = 'cirro-test'")
        cur.execute("SHOW application_name")
        check(cur.fetchone()[0], "cirro-test", "SET/SHOW")

    # Transactions as psycopg drives them (autocommit off: BEGIN … COMMIT).
    with psycopg.connect(dsn) as conn:
        cur = conn.cursor()
        cur.execute("INSERT INTO typed (i, s) VALUES (%s, %s)", (900, "txn"))
        conn.rollback()
        cur.execute("SELECT count(*) FROM typed WHERE i = 900")
        check(cur.fetchone()[0], 0, "rolled back")
        conn.rollback()
        cur.execute("INSERT INTO typed (i, s) VALUES (%s, %s)", (901, "txn"))
        conn.commit()
        try:
            cur.execute("SELECT 1/0")
            raise AssertionError("no error")
        except errors.DivisionByZero:
            pass
        try:
            cur.execute("SELECT 1")
            raise AssertionError("no error in an aborted transaction")
        except errors.InFailedSqlTransaction:
            pass
        conn.rollback()
    with psycopg.connect(dsn, autocommit=True) as conn:
        check(conn.execute("SELECT count(*) FROM typed WHERE i = 901").fetchone()[0], 1, "committed")

    # Cancel and statement_timeout stop a long query; the session carries on.
    slow = "SELECT count(*) FROM generate_series(1, 20000000000)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        timer = threading.Timer(0.5, conn.cancel)
        timer.start()
        started = time.monotonic()
        try:
            conn.execute(slow)
            raise AssertionError("the query was not cancelled")
        except errors.QueryCanceled:
            pass
        check(time.monotonic() - started < 30, True, "cancel took effect")
        conn.execute("SET statement_timeout = 300")
        try:
            conn.execute(slow)
            raise AssertionError("the query did not time out")
        except errors.QueryCanceled as e:
            check("timeout" in str(e), True, "timeout message")
        conn.execute("SET statement_timeout = 0")
        check(conn.execute("SELECT 2").fetchone()[0], 2, "after cancel")
    print("ok")


def copy(dsn):
    import io
    import os
    import socket

    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pacsv
    day = datetime.date(2024, 1, 1)
    rows = [
        (
            i,
            None if i % 7 == 0 else f"name {i}\twith tab, comma and \\ backslash",
            i * 0.5,
            day + datetime.timedelta(days=i % 365),
            i % 2 == 0,
            decimal.Decimal(f"{i}.25"),
        )
        for i in range(1, 5001)
    ]
    rows.append((0, "", None, None, None, None))
    rows.sort()
    types = ["int8", "text", "float8", "date", "bool", "numeric"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute(
            "CREATE TABLE c (id BIGINT NOT NULL, name VARCHAR, score DOUBLE,"
            " day DATE, flag BOOLEAN, amount DECIMAL(12, 2))"
        )
        # COPY FROM STDIN row by row (psycopg's text format), and back out.
        with cur.copy("COPY c FROM STDIN") as cp:
            for row in rows:
                cp.write_row(row)
        check(cur.rowcount, len(rows), "COPY rowcount")
        with cur.copy("COPY (SELECT * FROM c ORDER BY id) TO STDOUT") as cp:
            cp.set_types(types)
            check(list(cp.rows()), rows, "COPY out (text)")
        # The same through CSV with a header.
        with cur.copy("COPY (SELECT * FROM c ORDER BY id) TO STDOUT (FORMAT csv, HEADER)") as cp:
            csv_bytes = b"".join(bytes(block) for block in cp)
        cur.execute("CREATE TABLE c2 (id BIGINT NOT NULL, name VARCHAR, score DOUBLE,"
                    " day DATE, flag BOOLEAN, amount DECIMAL(12, 2))")
        with cur.copy("COPY c2 FROM STDIN (FORMAT csv, HEADER)") as cp:
            cp.write(csv_bytes)
        cur.execute("SELECT * FROM c2 ORDER BY id")
        check(cur.fetchall(), rows, "CSV out and in")

        # A COPY with bad data changes nothing.
        try:
            with cur.copy("COPY c2 FROM STDIN") as cp:
                cp.write_row((1, "fine", 1.0, day, True, decimal.Decimal("1")))
                cp.write(b"x\ty\t1\t2024-01-01\tt\t1\n")
            raise AssertionError("bad COPY data accepted")
        except errors.InvalidTextRepresentation:
            pass
        check(conn.execute("SELECT count(*) FROM c2").fetchone()[0], len(rows), "after bad COPY")

        # Arrow: a table written as CSV, copied in, copied out and read back.
        arrow = pa.table(
            {
                "k": pa.array(range(1000), pa.int64()),
                "x": pa.array([i / 8 for i in range(1000)], pa.float64()),
                "s": pa.array([None if i % 5 == 0 else f"s{i}" for i in range(1000)], pa.string()),
                "ts": pa.array(
                    [datetime.datetime(2024, 3, 1, 12) + datetime.timedelta(minutes=i) for i in range(1000)],
                    pa.timestamp("us"),
                ),
            }
        )
        cur.execute("CREATE TABLE arrow_rt (k BIGINT, x DOUBLE, s VARCHAR, ts TIMESTAMP)")
        sink = io.BytesIO()
        pacsv.write_csv(arrow, sink, pacsv.WriteOptions(quoting_style="none"))
        with cur.copy("COPY arrow_rt FROM STDIN (FORMAT csv, HEADER)") as cp:
            cp.write(sink.getvalue())
        with cur.copy("COPY (SELECT * FROM arrow_rt ORDER BY k) TO STDOUT (FORMAT csv, HEADER)") as cp:
            back = b"".join(bytes(block) for block in cp)
        read = pacsv.read_csv(
            io.BytesIO(back),
            convert_options=pacsv.ConvertOptions(column_types=arrow.schema, strings_can_be_null=True),
        )
        check(read.equals(arrow), True, "Arrow round trip")

        # pandas: a DataFrame copied in row by row, read back into a DataFrame.
        frame = pd.DataFrame(
            {
                "k": range(300),
                "v": [k * 1.5 for k in range(300)],
                "label": [None if k % 3 == 0 else f"l{k}" for k in range(300)],
                "at": pd.date_range("2024-01-01", periods=300, freq="h"),
            }
        )
        cur.execute("CREATE TABLE from_pandas (k BIGINT, v DOUBLE, label VARCHAR, at TIMESTAMP)")
        with cur.copy("COPY from_pandas FROM STDIN") as cp:
            for row in frame.itertuples(index=False):
                cp.write_row([None if pd.isna(v) else v for v in row])
        cur.execute("SELECT * FROM from_pandas ORDER BY k")
        back = pd.DataFrame(cur.fetchall(), columns=[d.name for d in cur.description])
        back["at"] = pd.to_datetime(back["at"])
        pd.testing.assert_frame_equal(back, frame, check_dtype=False)

    # A transaction's COPY goes with ROLLBACK.
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy("COPY c FROM STDIN") as cp:
            cp.write_row((99999, "rolled back", None, None, None, None))
        check(conn.execute("SELECT count(*) FROM c").fetchone()[0], len(rows) + 1, "COPY in txn")
        conn.rollback()
        check(conn.execute("SELECT count(*) FROM c").fetchone()[0], len(rows), "COPY rolled back")
        conn.rollback()

    # A client that goes away in the middle of COPY FROM STDIN leaves nothing.
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        with conn.cursor().copy("COPY c FROM STDIN") as cp:
            for i in range(20000):
                cp.write_row((100000 + i, "partial", None, None, None, None))
            with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
    except psycopg.Error:
        pass
    conn.close()
    time.sleep(1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        check(conn.execute("SELECT count(*) FROM c WHERE name = 'partial'").fetchone()[0], 0, "no partial COPY")
        check(conn.execute("SELECT count(*) FROM c").fetchone()[0], len(rows), "rows after disconnect")

    print("ok")


def sqlalchemy(dsn):
    """SQLAlchemy 2 (psycopg dialect): reflection, a query, pandas both ways."""
    import pandas as pd
    import sqlalchemy as sa

    day = datetime.date(2024, 1, 1)
    rows = [
        (i, None if i % 7 == 0 else f"n{i}", i * 0.5, day + datetime.timedelta(days=i), i % 2 == 0, decimal.Decimal(i))
        for i in range(0, 200)
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE c (id BIGINT NOT NULL, name VARCHAR, score DOUBLE,"
            " day DATE, flag BOOLEAN, amount DECIMAL(12, 2))"
        )
        with conn.cursor().copy("COPY c FROM STDIN") as cp:
            for row in rows:
                cp.write_row(row)
    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    inspector = sa.inspect(engine)
    check("c" in inspector.get_table_names(), True, "get_table_names")
    columns = {c["name"]: c for c in inspector.get_columns("c")}
    check(list(columns), ["id", "name", "score", "day", "flag", "amount"], "reflected columns")
    check(isinstance(columns["id"]["type"], sa.BigInteger), True, "BIGINT reflected")
    check(columns["id"]["nullable"], False, "NOT NULL reflected")
    check(isinstance(columns["day"]["type"], sa.Date), True, "DATE reflected")
    check(inspector.get_pk_constraint("c")["constrained_columns"], [], "no primary key")
    check(inspector.get_indexes("c"), [], "no indexes")
    check(inspector.get_foreign_keys("c"), [], "no foreign keys")
    table = sa.Table("c", sa.MetaData(), autoload_with=engine)
    check([c.name for c in table.columns], list(columns), "Table reflection")
    check(isinstance(table.c.amount.type, sa.Numeric), True, "DECIMAL reflected")
    with engine.connect() as sconn:
        query = (
            sa.select(table.c.flag, sa.func.count().label("n"), sa.func.sum(table.c.score).label("total"))
            .where(table.c.id.between(1, 100))
            .group_by(table.c.flag)
            .order_by(table.c.flag)
        )
        got = [tuple(r) for r in sconn.execute(query)]
        want = [
            (flag, sum(1 for r in rows if 1 <= r[0] <= 100 and r[4] == flag),
             sum(r[2] for r in rows if 1 <= r[0] <= 100 and r[4] == flag))
            for flag in (False, True)
        ]
        check(got, want, "SQLAlchemy query")
        frame = pd.read_sql(sa.select(table).where(table.c.id < 50).order_by(table.c.id), sconn)
        check(list(frame["id"]), list(range(0, 50)), "pandas read_sql")
        check(frame["name"].isna().sum(), sum(1 for r in rows if r[0] < 50 and r[1] is None), "pandas NULLs")
    frame = pd.DataFrame(
        {
            "k": range(300),
            "v": [k * 1.5 for k in range(300)],
            "label": [None if k % 3 == 0 else f"l{k}" for k in range(300)],
        }
    )
    # CREATE TABLE cannot run inside a transaction in Cirro; to_sql runs in
    # one unless the connection autocommits.
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    frame.to_sql("from_pandas", autocommit, index=False, method="multi", chunksize=100)
    with engine.connect() as sconn:
        back = pd.read_sql("SELECT * FROM from_pandas ORDER BY k", sconn)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)
    engine.dispose()
    print("ok")


def tpch(dsn, queries, out):
    """Run the 22 TPC-H queries as given; write each result as `|`-separated
    text with a header, the format of the reference answers."""
    import csv
    import os

    with psycopg.connect(dsn, autocommit=True) as conn:
        for q in range(1, 23):
            name = f"q{q:02}"
            with open(os.path.join(queries, f"{name}.sql")) as f:
                sql = f.read()
            cur = conn.execute(sql)
            with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
                writer = csv.writer(f, delimiter="|", lineterminator="\n")
                writer.writerow([c.name for c in cur.description])
                for row in cur.fetchall():
                    writer.writerow(["" if v is None else str(v) for v in row])
    print("ok")


if __name__ == "__main__":
    dsn, what = sys.argv[1], sys.argv[2]
    if what == "basics":
        basics(dsn)
    elif what == "copy":
        copy(dsn)
    elif what == "sqlalchemy":
        sqlalchemy(dsn)
    elif what == "tpch":
        tpch(dsn, sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(f"unknown check {what}")
