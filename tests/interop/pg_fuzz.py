"""Protocol fuzz test of `cirro serve`: malformed, truncated and random
PostgreSQL messages in every phase (startup, authentication, simple query,
extended query, COPY), from fixed seeds. After each case the server must have
answered with an ErrorResponse, closed the connection, or be waiting for more
bytes; throughout, a separate well-behaved session keeps querying, and at the
end the table holds exactly the rows of the COPYs the server confirmed.

usage: pg_fuzz.py HOST PORT USER PASSWORD SEED CASES_PER_PHASE
Prints "ok <messages sent> <cases>" when every check passed.
"""

import base64
import hashlib
import hmac
import os
import random
import socket
import struct
import sys
import threading
import time

import psycopg

HOST, PORT, USER, PASSWORD = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
SEED, CASES = int(sys.argv[5]), int(sys.argv[6])
DSN = f"host={HOST} port={PORT} user={USER} password={PASSWORD} dbname=cirro sslmode=disable"
sent = 0


def message(kind, payload):
    return kind + struct.pack("!i", len(payload) + 4) + payload


def cstr(text):
    return text.encode() + b"\0"


def startup_packet(user=USER, version=196608):
    body = struct.pack("!i", version) + cstr("user") + cstr(user) + cstr("database") + cstr("cirro") + b"\0"
    return struct.pack("!i", len(body) + 4) + body


class Conn:
    def __init__(self):
        self.sock = socket.create_connection((HOST, PORT), timeout=5)
        self.buffer = b""
        self.errors = 0  # ErrorResponses received over the connection

    def send(self, data):
        global sent
        sent += 1
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def read(self, until=(b"Z",), timeout=2.0):
        """Messages until one of `until`, the server closing, or `timeout`
        (the server waiting for more). Returns (messages, how)."""
        self.sock.settimeout(timeout)
        got = []
        while True:
            while len(self.buffer) >= 5:
                kind = self.buffer[:1]
                (length,) = struct.unpack("!i", self.buffer[1:5])
                if len(self.buffer) < 1 + length:
                    break
                payload = self.buffer[5 : 1 + length]
                self.buffer = self.buffer[1 + length :]
                got.append((kind, payload))
                self.errors += kind == b"E"
                if kind in until:
                    return got, "done"
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return got, "waiting"
            except OSError:
                return got, "closed"
            if not chunk:
                return got, "closed"
            self.buffer += chunk

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def login():
    """A connection past SCRAM-SHA-256 authentication, ready for queries."""
    conn = Conn()
    conn.send(startup_packet())
    got, _ = conn.read(until=(b"R",))
    nonce = base64.b64encode(os.urandom(18)).decode()
    first_bare = f"n=,r={nonce}"
    first = ("n,," + first_bare).encode()
    conn.send(message(b"p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first))
    got, _ = conn.read(until=(b"R", b"E"))
    server_first = got[-1][1][4:].decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", PASSWORD.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored = hashlib.sha256(client_key).digest()
    final_bare = f"c=biws,r={fields['r']}"
    signature = hmac.new(stored, f"{first_bare},{server_first},{final_bare}".encode(), hashlib.sha256).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    conn.send(message(b"p", f"{final_bare},p={proof}".encode()))
    got, how = conn.read()
    assert how == "done" and got[-1][0] == b"Z", f"login failed: {got}"
    return conn


def garbage(rng, most=200):
    return bytes(rng.getrandbits(8) for _ in range(rng.randint(0, most)))


def mutate(rng, data):
    """A valid message broken: truncated, a byte flipped, its length lied
    about, or noise appended."""
    choice = rng.randrange(5)
    if choice == 0 and len(data) > 1:
        return data[: rng.randrange(1, len(data))]
    if choice == 1 and data:
        i = rng.randrange(len(data))
        flipped = data[i] ^ (1 << rng.randrange(8))
        if i == 0 and flipped == ord("X"):
            flipped = data[i]  # not into Terminate, which closes without a word
        return data[:i] + bytes([flipped]) + data[i + 1 :]
    if choice == 2 and len(data) >= 5:
        bogus = rng.choice([0, 1, 3, 0x7FFFFFFF, -1, -0x80000000, rng.randrange(1 << 31)])
        return data[:1] + struct.pack("!i", bogus) + data[5:]
    if choice == 3:
        return data + garbage(rng, 40)
    return garbage(rng)


SQL_WORDS = ["SELECT", "FROM", "fuzz", "WHERE", "(", ")", "'", "1", "$1", ";", "--", "/*", "COPY", "STDIN", "INSERT",
             "VALUES", "BEGIN", "ROLLBACK", "NULL", "::", "a", "count(*)", "\\", "\"", ",", "E'\\x00'", "9e999"]


def random_sql(rng):
    return " ".join(rng.choice(SQL_WORDS) for _ in range(rng.randint(0, 12)))


def startup_case(rng):
    conn = Conn()
    kind = rng.randrange(4)
    if kind == 0:
        conn.send(garbage(rng, 300))
    elif kind == 1:
        conn.send(mutate(rng, startup_packet()))
    elif kind == 2:
        conn.send(startup_packet(version=rng.choice([0, 1, 196607, 196609, 80877103, rng.getrandbits(31)])))
    else:
        conn.send(struct.pack("!ii", 8, 80877103))  # SSLRequest: answered N (no TLS here)
        assert conn.sock.recv(1) == b"N"
        conn.send(rng.choice([garbage(rng), mutate(rng, startup_packet())]))
    return conn


def auth_case(rng):
    conn = Conn()
    conn.send(startup_packet(user=rng.choice([USER, "nobody", "x" * rng.randint(0, 300)])))
    conn.read(until=(b"R", b"E"))
    for _ in range(rng.randint(1, 3)):
        first = b"n,,n=,r=" + garbage(rng, 30)
        valid = message(b"p", cstr(rng.choice(["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS", "MD5", ""])) +
                        struct.pack("!i", len(first)) + first)
        conn.send(rng.choice([mutate(rng, valid), valid, message(b"p", garbage(rng)), garbage(rng)]))
    return conn


def simple_case(rng):
    conn = login()
    for _ in range(rng.randint(1, 6)):
        query = message(b"Q", cstr(random_sql(rng)))
        data = rng.choice([query, mutate(rng, query), message(bytes([rng.choice([b for b in range(256) if b != ord("X")])]), garbage(rng)),
                           message(b"Q", garbage(rng))])
        if not conn.send(data):
            break
        _, how = conn.read(timeout=0.2)
        if how != "done":
            break
    return conn


def extended_case(rng):
    conn = login()
    for _ in range(rng.randint(1, 8)):
        name = rng.choice([b"", b"s1", garbage(rng, 8).replace(b"\0", b"")])
        parse = message(b"P", name + b"\0" + cstr(random_sql(rng)) + struct.pack("!h", 1) + struct.pack("!i", 23))
        bind = message(b"B", b"\0" + name + b"\0" + struct.pack("!hh", 1, rng.choice([0, 1])) +
                       struct.pack("!h", rng.choice([0, 1, 2, -1])) +
                       struct.pack("!i", rng.choice([-1, 0, 4, 0x7FFFFFFF, -5])) + garbage(rng, 8) +
                       struct.pack("!h", 0))
        parts = [parse, bind, message(b"D", b"S" + name + b"\0"), message(b"E", b"\0" + struct.pack("!i", 0)),
                 message(b"C", b"P\0"), message(b"H", b""), message(b"S", b"")]
        data = b"".join(rng.choice([p, mutate(rng, p)]) for p in rng.sample(parts, rng.randint(1, len(parts))))
        if not conn.send(data + message(b"S", b"")):
            break
        _, how = conn.read(timeout=0.2)
        if how != "done":
            break
    return conn


def copy_case(rng, confirmed):
    conn = login()
    conn.send(message(b"Q", cstr("COPY fuzz FROM STDIN")))
    got, _ = conn.read(until=(b"G", b"E", b"Z"), timeout=2)
    for _ in range(rng.randint(0, 6)):
        values = ["a", "b", "\\N"]
        rows = "".join(f"{rng.randint(-5, 5)}\t{rng.choice(values)}\n" for _ in range(rng.randint(0, 5)))
        data = message(b"d", rng.choice([rows.encode(), garbage(rng)]))
        conn.send(rng.choice([data, data, mutate(rng, data), message(b"Q", cstr("SELECT 1")),
                              message(b"P", b"\0SELECT 1\0\0\0")]))
    end = rng.choice([message(b"c", b""), message(b"f", cstr("client gave up")), b"", mutate(rng, message(b"c", b""))])
    conn.send(end)
    got, how = conn.read(timeout=0.5)
    for kind, payload in got:
        if kind == b"C" and payload.startswith(b"COPY "):
            confirmed.append(int(payload[5:-1]))
    return conn


def healthy_session(stop, failures):
    """A normal client querying throughout: it must never fail."""
    try:
        with psycopg.connect(DSN, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("SELECT count(*) FROM fuzz_ref").fetchone()
                time.sleep(0.01)
    except Exception as e:  # noqa: BLE001 — any failure is the finding
        failures.append(repr(e))


def main():
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("CREATE TABLE fuzz (k INT NOT NULL, v VARCHAR)")
        conn.execute("CREATE TABLE fuzz_ref (k INT)")
        conn.execute("INSERT INTO fuzz_ref VALUES (1), (2)")
    stop, failures = threading.Event(), []
    watcher = threading.Thread(target=healthy_session, args=(stop, failures), daemon=True)
    watcher.start()
    confirmed = []
    outcomes = {}
    problems = []

    def copy_phase(r):
        return copy_case(r, confirmed)

    def run_cases(phase, rng, count):
        try:
            for _ in range(count):
                conn = phase(rng)
                got, how = conn.read(timeout=0.1)
                conn.close()
                # A connection the server closed was told why first; except a
                # broken startup packet, which PostgreSQL too answers by
                # closing (it logs it as a COMMERROR and sends nothing).
                if how == "closed" and not conn.errors and phase is not startup_case:
                    problems.append(f"{phase.__name__}: closed without an ErrorResponse")
                key = (phase.__name__, how)
                outcomes[key] = outcomes.get(key, 0) + 1
        except Exception as e:  # noqa: BLE001 — reported below
            problems.append(f"{phase.__name__}: {e!r}")

    phases = [startup_case, auth_case, simple_case, extended_case, copy_phase]
    workers = 8
    for index, phase in enumerate(phases):
        # Several clients at once, each from its own fixed seed.
        threads = [
            threading.Thread(target=run_cases, args=(phase, random.Random(SEED * 1000 + index * 10 + w), CASES // workers))
            for w in range(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not problems, problems[:5]
        # After each phase the server still answers a normal client.
        with psycopg.connect(DSN, autocommit=True) as check:
            assert check.execute("SELECT 1 + 1").fetchone()[0] == 2
    cases = sum(outcomes.values())
    stop.set()
    watcher.join()
    assert not failures, f"the well-behaved session failed: {failures}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        rows = conn.execute("SELECT count(*) FROM fuzz").fetchone()[0]
    assert rows == sum(confirmed), f"fuzz has {rows} rows, confirmed COPYs wrote {sum(confirmed)}"
    summary = ", ".join(f"{name} {how}: {n}" for (name, how), n in sorted(outcomes.items()))
    print(f"ok: {sent} messages in {cases} connections, {len(confirmed)} COPYs confirmed; last reads {summary}")


main()
