"""psycopg 3 against `cirro serve`: parameters of every supported type,
server-side prepared statements, executemany, transactions, cancel and
statement_timeout. Run by crates/cirro/tests/server.rs; prints "ok" when every
check passed, raises otherwise."""

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
    elif what == "tpch":
        tpch(dsn, sys.argv[3], sys.argv[4])
    else:
        raise SystemExit(f"unknown check {what}")
