"""ADBC's Flight SQL driver (and pyarrow's Flight client) against
`cirro serve`: logins with the right and wrong passwords, DDL and DML, a
query returning Arrow data, privileges, errors with their SQLSTATE (`basics`);
Flight SQL over TLS (`tls`). Run by crates/cirro/tests/server.rs; prints "ok"
when every check passed, raises otherwise.

    flight_client.py basics URI PASSWORD
    flight_client.py tls URI PASSWORD CERT_PEM
    flight_client.py activity URI USER PASSWORD
    flight_client.py query URI USER PASSWORD SQL

`query` prints each row of SQL's result on a line, its values joined by |.

`activity` runs a long query twice: the test cancels the first with
pg_cancel_backend and terminates the session during the second with
pg_terminate_backend, from a PostgreSQL connection.
"""

import sys

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as flight


def check(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def connect(uri, user, password, **options):
    return flight_sql.connect(
        uri, db_kwargs={"username": user, "password": password, **options}, autocommit=True
    )


def refused(action, *codes):
    """Run `action`; it must fail with a message naming one of `codes`."""
    try:
        action()
    except Exception as e:  # ADBC raises DB-API errors, pyarrow Flight errors
        message = str(e)
        if not any(code in message for code in codes):
            raise AssertionError(f"expected SQLSTATE {codes}, got: {message}") from e
        return message
    raise AssertionError(f"expected SQLSTATE {codes}, but it succeeded")


def scalar(conn, sql):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def protobuf_field(number, data):
    """A length-delimited protobuf field."""
    size, length = bytearray(), len(data)
    while True:
        byte, length = length & 0x7F, length >> 7
        size.append(byte | (0x80 if length else 0))
        if not length:
            break
    return bytes([number << 3 | 2]) + bytes(size) + data


def statement_query(sql):
    """A Flight SQL CommandStatementQuery packed in an Any, as a descriptor."""
    query = protobuf_field(1, sql.encode())
    url = b"type.googleapis.com/arrow.flight.protocol.sql.CommandStatementQuery"
    return flight.FlightDescriptor.for_command(protobuf_field(1, url) + protobuf_field(2, query))


def basics(uri, password):
    # Logins: a wrong password and an unknown user are refused.
    refused(lambda: connect(uri, "cirro", "wrong").close(), "28P01")
    refused(lambda: connect(uri, "nobody", password).close(), "28000")

    with connect(uri, "cirro", password) as conn:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE f (id BIGINT NOT NULL, name VARCHAR, score DOUBLE, day DATE)")
            cur.execute(
                "INSERT INTO f SELECT value, CASE WHEN value % 10 = 0 THEN NULL ELSE 'n' || value END,"
                " value * 0.5, CAST('2024-01-01' AS DATE) FROM generate_series(1, 1000)"
            )
            cur.execute("SELECT id, name, score, day FROM f WHERE id <= 500 ORDER BY id")
            table = cur.fetch_arrow_table()
        check(table.num_rows, 500, "rows")
        types = {f.name: f.type for f in table.schema}
        check((types["id"], types["score"], types["day"]), (pa.int64(), pa.float64(), pa.date32()), "types")
        check(types["name"] in (pa.string(), pa.large_string(), pa.string_view()), True, "VARCHAR is a string")
        check(table.column("id").to_pylist(), list(range(1, 501)), "ids")
        check(table.column("name").null_count, 50, "NULLs")
        check(table.column("score").to_pylist()[:3], [0.5, 1.0, 1.5], "scores")
        check(scalar(conn, "SELECT count(*) FROM f"), 1000, "count")

        # Errors carry their SQLSTATE, and the session carries on.
        refused(lambda: scalar(conn, "SELECT * FROM no_such_table"), "42P01")
        refused(lambda: scalar(conn, "SELEC 1"), "42601")
        check(scalar(conn, "SELECT 41 + 1"), 42, "after errors")

        # Privileges: a user with SELECT only.
        with conn.cursor() as cur:
            cur.execute("CREATE USER reader PASSWORD 'reader-pw'")
            cur.execute("GRANT SELECT ON f TO reader")

    with connect(uri, "reader", "reader-pw") as reader:
        check(scalar(reader, "SELECT sum(id) FROM f"), 500500, "granted SELECT")
        refused(lambda: scalar(reader, "DELETE FROM f WHERE id < 100"), "42501")
        refused(lambda: scalar(reader, "INSERT INTO f VALUES (0, 'x', 0, NULL)"), "42501")
        check(scalar(reader, "SELECT count(*) FROM f"), 1000, "refused statements changed nothing")

    # Calls without a valid session token are refused.
    client = flight.FlightClient(uri)
    descriptor = statement_query("SELECT 1")
    bogus = flight.FlightCallOptions(headers=[(b"authorization", b"Bearer not-a-token")])
    refused(lambda: client.get_flight_info(descriptor, bogus), "28000")
    refused(lambda: client.get_flight_info(descriptor), "28000")
    client.close()
    print("ok")


LONG_QUERY = "SELECT count(*) FROM generate_series(1, 5000000000)"


def activity(uri, user, password):
    conn = connect(uri, user, password)
    message = refused(lambda: scalar(conn, LONG_QUERY), "57014")
    check("canceling statement" in message, True, "the cancel's message")
    check(scalar(conn, "SELECT 6 * 7"), 42, "the session goes on after a cancel")
    print("cancelled", flush=True)
    refused(lambda: scalar(conn, LONG_QUERY), "57014", "57P01")
    # the terminated session is gone: its token no longer works
    refused(lambda: scalar(conn, "SELECT 1"), "57P01", "28000")
    try:
        conn.close()
    except Exception:
        pass
    print("ok")


def tls(uri, password, cert):
    with open(cert, "rb") as f:
        root = f.read()
    options = {
        "adbc.flight.sql.client_option.tls_root_certs": root.decode(),
        "adbc.flight.sql.client_option.tls_override_hostname": "localhost",
    }
    with connect(uri, "cirro", password, **options) as conn:
        check(scalar(conn, "SELECT 7 * 6"), 42, "query over TLS")
    plain = uri.replace("grpc+tls://", "grpc://")
    try:
        connect(plain, "cirro", password).close()
    except Exception:
        pass
    else:
        raise AssertionError("a plain Flight SQL connection to a TLS server worked")
    print("ok")


def query(uri, user, password, sql):
    conn = connect(uri, user, password)
    with conn.cursor() as cur:
        cur.execute(sql)
        for row in cur.fetchall():
            print("|".join("" if v is None else str(v) for v in row))
    conn.close()


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "basics":
        basics(sys.argv[2], sys.argv[3])
    elif what == "tls":
        tls(sys.argv[2], sys.argv[3], sys.argv[4])
    elif what == "activity":
        activity(sys.argv[2], sys.argv[3], sys.argv[4])
    elif what == "query":
        query(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        raise SystemExit(f"unknown check {what}")
