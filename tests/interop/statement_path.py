"""The statement path over every front end of `cirro serve`: each statement is
parsed once (the session's `cirro.parses` counter) over the simple protocol
(libpq's PQexec), the extended protocol (psycopg, server-side prepared) and
Flight SQL (ADBC); a prepared point query is planned once for 1,000
executions and planned again after DROP + CREATE of its table (`cirro.plans`);
parameters go into the plan, never into SQL text (an injection attempt is
stored verbatim); bad parameters get clear errors and leave the session
working; with the row store, reads and writes of one row by key are computed
without the planner (`cirro.by_key`). Run by crates/cirro/tests/server.rs; prints "ok" when every check
passed, raises otherwise.

    statement_path.py parse_once DSN FLIGHT_URI PASSWORD CSV_FILE
    statement_path.py prepared DSN
    statement_path.py injection DSN
    statement_path.py bad_parameters DSN
    statement_path.py by_key DSN    (a server with --row-store on)
    statement_path.py flight_prepared FLIGHT_URI PASSWORD
"""

import sys
import time
from decimal import Decimal

import psycopg
from psycopg import errors


def check(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def counter(conn, name):
    # prepare=False: psycopg would prepare a query it sees often, and then
    # the SHOW would not be parsed each time.
    return int(conn.execute(f"SHOW cirro.{name}", prepare=False).fetchone()[0])


# Each statement once; the table `pc` and the file exist. The time-travel
# SELECT reads version 1 (the table's first INSERT).
STATEMENTS = [
    "SELECT count(*) FROM pc WHERE k > 1",
    "INSERT INTO pc VALUES (100, 'x')",
    "UPDATE pc SET v = 'y' WHERE k = 100",
    "MERGE INTO pc USING (SELECT 100 AS k) s ON pc.k = s.k WHEN MATCHED THEN DELETE",
    "COPY pc FROM '{csv}' (FORMAT csv)",
    "SET application_name = 'parse-once'",
    "SELECT count(*) FROM pc VERSION AS OF 1",
]


def simple_parses(conn, sql):
    """Parser runs for `sql` over the simple protocol (libpq's PQexec)."""
    before = counter(conn, "parses")
    result = conn.pgconn.exec_(sql.encode())
    if result.status not in (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK):
        raise AssertionError(f"{sql}: {result.error_message.decode()}")
    # Both SHOWs are parsed too: one each.
    return counter(conn, "parses") - before - 1


def extended_parses(conn, sql):
    before = counter(conn, "parses")
    conn.execute(sql, prepare=True)
    return counter(conn, "parses") - before - 1


def flight_parses(conn, sql):
    def count():
        with conn.cursor() as cur:
            cur.execute("SHOW cirro.parses")
            return int(cur.fetchone()[0])

    before = count()
    with conn.cursor() as cur:
        cur.execute(sql)
    return count() - before - 1


def parse_once(dsn, flight_uri, password, csv):
    import adbc_driver_flightsql.dbapi as flight_sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pc (k BIGINT NOT NULL, v VARCHAR)")
        conn.execute("INSERT INTO pc VALUES (1, 'a'), (2, 'b')")
        for sql in STATEMENTS:
            sql = sql.format(csv=csv)
            check(simple_parses(conn, sql), 1, f"parses over the simple protocol of {sql}")
            check(extended_parses(conn, sql), 1, f"parses over the extended protocol of {sql}")
    with flight_sql.connect(
        flight_uri, db_kwargs={"username": "cirro", "password": password}, autocommit=True
    ) as conn:
        for sql in STATEMENTS:
            sql = sql.format(csv=csv)
            check(flight_parses(conn, sql), 1, f"parses over Flight SQL of {sql}")
    print("ok")


def prepared(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE pt (k BIGINT NOT NULL, v VARCHAR)")
        conn.execute("INSERT INTO pt SELECT value, 'v' || value FROM generate_series(1, 2000)")
        query = "SELECT v FROM pt WHERE k = %s"
        conn.execute(query, (1,), prepare=True)  # prepared (planned) here
        plans = counter(conn, "plans")
        for i in range(1000):
            key = (i * 7919) % 2000 + 1
            rows = conn.execute(query, (key,), prepare=True).fetchall()
            check(rows, [(f"v{key}",)], f"key {key}")
        # A new row is seen by the same plan: scans read the current snapshot.
        conn.execute("INSERT INTO pt VALUES (5000, 'new')")
        check(conn.execute(query, (5000,), prepare=True).fetchall(), [("new",)], "a row inserted since")
        # SHOW and INSERT are statements of their own: 1,000 + 1 executions
        # of the prepared query planned nothing.
        planned = counter(conn, "plans") - plans
        check(planned, 1, "plannings for 1,001 executions (the INSERT's only)")
        conn.execute("DROP TABLE pt")
        conn.execute("CREATE TABLE pt (k BIGINT NOT NULL, v VARCHAR)")
        conn.execute("INSERT INTO pt VALUES (1, 'recreated')")
        plans = counter(conn, "plans")
        check(conn.execute(query, (1,), prepare=True).fetchall(), [("recreated",)], "after DROP + CREATE")
        check(counter(conn, "plans") - plans, 1, "planned again after DROP + CREATE")
        # A client may send a smaller integer or text for a BIGINT parameter.
        cur = conn.cursor()
        cur.execute("SELECT v FROM pt WHERE k = %s::int2", (1,), prepare=True)
        check(cur.fetchall(), [("recreated",)], "an int2 parameter for a BIGINT column")
        cur.execute("SELECT v FROM pt WHERE k = %t", ("1",), prepare=True)
        check(cur.fetchall(), [("recreated",)], "a text parameter for a BIGINT column")
    print("ok")


def by_key(dsn):
    """A server with --row-store on: prepared reads and writes of one row by
    its primary key are computed without the planner (SHOW cirro.by_key
    counts them), with the answers the planner gives."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bk (k INT PRIMARY KEY, v VARCHAR, n BIGINT)")
        conn.execute("INSERT INTO bk SELECT value, 'v' || value, value FROM generate_series(1, 3000)")
        read = "SELECT v, n FROM bk WHERE k = %s"
        update = "UPDATE bk SET n = n + %s WHERE k = %s"
        insert = "INSERT INTO bk VALUES (%s, %s, %s)"
        conn.execute(read, (1,), prepare=True)
        conn.execute(update, (0, 1), prepare=True)
        conn.execute(insert, (10000, "x", 0), prepare=True)
        plans, counted = counter(conn, "plans"), counter(conn, "by_key")
        compiled = counter(conn, "compiled")
        for i in range(200):
            key = (i * 7919) % 3000 + 1
            conn.execute(update, (5, key), prepare=True)
            check(conn.execute(read, (key,), prepare=True).fetchall(), [(f"v{key}", key + 5)], f"key {key}")
            conn.execute(insert, (20000 + i, f"i{i}", i), prepare=True)
            check(conn.execute(read, (20000 + i,), prepare=True).fetchall(), [(f"i{i}", i)], f"inserted {i}")
        check(counter(conn, "plans") - plans, 0, "plannings of 800 executions")
        check(counter(conn, "by_key") - counted, 800, "statements computed by key")
        check(counter(conn, "compiled") - compiled, 800, "executions without a plan")
        # A DELETE by key, and an INSERT whose now() is each statement's.
        delete = "DELETE FROM bk WHERE k = %s"
        conn.execute("CREATE TABLE bt (k INT PRIMARY KEY, t TIMESTAMP, d BIGINT)")
        stamp = "INSERT INTO bt (k, t, d) VALUES (%s, CURRENT_TIMESTAMP, %s * 2)"
        conn.execute(delete, (2999,), prepare=True)
        conn.execute(stamp, (0, 0), prepare=True)
        # Planned again after the CREATE TABLE, then compiled.
        conn.execute(read, (1,), prepare=True)
        compiled = counter(conn, "compiled")
        for i in range(1, 4):
            conn.execute(delete, (i,), prepare=True)
            check(conn.execute(read, (i,), prepare=True).fetchall(), [], f"deleted {i}")
            time.sleep(0.01)
            conn.execute(stamp, (i, i), prepare=True)
        check(counter(conn, "compiled") - compiled, 9, "DELETEs and INSERTs without a plan")
        stamped = conn.execute("SELECT k, t, d FROM bt ORDER BY k").fetchall()
        check([(k, d) for k, _, d in stamped], [(i, 2 * i) for i in range(4)], "inserted with now()")
        times = [t for _, t, _ in stamped]
        check(times == sorted(times) and len(set(times)) == 4, True, f"now() of each statement: {times}")
        check(conn.execute("SELECT count(*) FROM bk WHERE k <= 3 OR k = 2999").fetchone()[0], 0, "deleted rows")
        # Not by key: a condition on another column, a key no integer equals.
        counted = counter(conn, "by_key")
        check(conn.execute("SELECT k FROM bk WHERE v = %s", ("v7",), prepare=True).fetchall(), [(7,)], "by value")
        check(conn.execute("SELECT v FROM bk WHERE k = %s", (Decimal("7.5"),), prepare=True).fetchall(), [], "k = 7.5")
        check(counter(conn, "by_key") - counted, 0, "statements by key among those that are not")
    print("ok")


INJECTION = "'); DROP TABLE t; --"


def injection(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INT NOT NULL, s VARCHAR)")
        conn.execute("INSERT INTO t VALUES (%s, %s)", (1, INJECTION), prepare=True)
        conn.execute("INSERT INTO t VALUES (%s, %s)", (2, INJECTION + "$1 /*"), prepare=True)
        rows = conn.execute("SELECT id, s FROM t WHERE s LIKE %s ORDER BY id", ("%DROP%",), prepare=True).fetchall()
        check(rows, [(1, INJECTION), (2, INJECTION + "$1 /*")], "injection text stored verbatim")
        check(conn.execute("SELECT count(*) FROM t").fetchone()[0], 2, "t survives")
    print("ok")


def bad_parameters(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE bp (k BIGINT NOT NULL, d DATE)")
        cur = conn.cursor()

        def refused(sql, params, error, what):
            try:
                cur.execute(sql, params, prepare=True)
            except error:
                pass
            else:
                raise AssertionError(f"{what}: no {error.__name__}")
            check(conn.execute("SELECT 1").fetchone()[0], 1, f"session works after {what}")

        refused("SELECT * FROM bp WHERE k = %t", ("seven",), errors.InvalidTextRepresentation, "text that is no number")
        refused("SELECT * FROM bp WHERE d = %t", ("not a date",), (errors.InvalidTextRepresentation, errors.InvalidDatetimeFormat), "text that is no date")
        refused("SELECT * FROM bp WHERE k = %s::int8", (2**70,), (errors.NumericValueOutOfRange, errors.InvalidTextRepresentation, errors.DataError), "a number too large")
        refused("SET application_name = %s", ("x",), (errors.SyntaxError, errors.UndefinedParameter), "a parameter where none may stand")
        # Too few and too many values, straight on the wire (psycopg checks
        # its own side).
        pg = conn.pgconn
        pg.prepare(b"two", b"SELECT $1::int8 + $2::int8")
        for values in ([b"1"], [b"1", b"2", b"3"]):
            result = pg.exec_prepared(b"two", values)
            check(result.error_field(psycopg.pq.DiagnosticField.SQLSTATE), b"08P01", f"{len(values)} values for 2 parameters")
        check(pg.exec_prepared(b"two", [b"1", b"2"]).get_value(0, 0), b"3", "the right number of values")
    print("ok")


def flight_prepared(flight_uri, password):
    import adbc_driver_flightsql.dbapi as flight_sql

    with flight_sql.connect(
        flight_uri, db_kwargs={"username": "cirro", "password": password}, autocommit=True
    ) as conn:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE fp (k BIGINT NOT NULL, v VARCHAR)")
            cur.executemany("INSERT INTO fp VALUES ($1, $2)", [(i, f"v{i}") for i in range(50)])
            cur.execute("INSERT INTO fp VALUES ($1, $2)", (99, INJECTION))
            cur.execute("SHOW cirro.plans")
            plans = int(cur.fetchone()[0])
            for key in (3, 17, 42):
                cur.execute("SELECT v FROM fp WHERE k = $1", (key,))
                check(cur.fetchall(), [(f"v{key}",)], f"Flight SQL prepared query, key {key}")
            cur.execute("SELECT v FROM fp WHERE k = $1", (99,))
            check(cur.fetchall(), [(INJECTION,)], "Flight SQL parameter stored verbatim")
            cur.execute("SELECT count(*) FROM fp")
            check(cur.fetchone()[0], 51, "rows inserted with parameters")
            cur.execute("SHOW cirro.plans")
            # ADBC prepares each execute: 4 prepared queries, 1 count(*), 1 SHOW.
            check(int(cur.fetchone()[0]) - plans <= 6, True, "Flight SQL plannings")
    print("ok")


if __name__ == "__main__":
    name, *args = sys.argv[1:]
    globals()[name](*args)
