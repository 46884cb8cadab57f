"""TPC-B-like transactions at several clients until the server goes away.

usage: tpcb_crash.py DSN CLIENTS SECONDS OUT_DIR ROUND

Each client runs pgbench's TPC-B transaction (update an account, read it,
update a teller and the branch, insert a history row) with a unique id in
the history row, retrying serialization failures and deadlocks, and appends
each id to OUT_DIR/acked-<ROUND>-<client> once COMMIT returned. The id of a
transaction whose COMMIT was sent but not answered goes to
OUT_DIR/inflight-<ROUND>-<client>. A client stops when the server stops
answering (it was killed) or after SECONDS. Prints "ok <acked>".
"""

import os
import random
import sys
import threading
import time

import psycopg

ACCOUNTS, TELLERS, BRANCHES = 1000, 10, 1


def client(dsn, number, deadline, out_dir, round_, totals):
    rng = random.Random(number * 7919 + round_)
    acked = open(os.path.join(out_dir, f"acked-{round_}-{number}"), "a")
    inflight_path = os.path.join(out_dir, f"inflight-{round_}-{number}")
    seq = 0
    try:
        conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error:
        return
    with conn:
        while time.monotonic() < deadline:
            seq += 1
            txn_id = round_ * 10**9 + number * 10**7 + seq
            aid = rng.randint(1, ACCOUNTS)
            tid = rng.randint(1, TELLERS)
            bid = rng.randint(1, BRANCHES)
            delta = rng.randint(-5000, 5000)
            for _attempt in range(50):
                committing = False
                try:
                    cur = conn.cursor()
                    cur.execute("BEGIN")
                    cur.execute(
                        "UPDATE accounts SET abalance = abalance + %s WHERE aid = %s",
                        (delta, aid),
                    )
                    cur.execute("SELECT abalance FROM accounts WHERE aid = %s", (aid,))
                    cur.fetchall()
                    cur.execute(
                        "UPDATE tellers SET tbalance = tbalance + %s WHERE tid = %s",
                        (delta, tid),
                    )
                    cur.execute(
                        "UPDATE branches SET bbalance = bbalance + %s WHERE bid = %s",
                        (delta, bid),
                    )
                    cur.execute(
                        "INSERT INTO history (id, tid, bid, aid, delta) VALUES (%s, %s, %s, %s, %s)",
                        (txn_id, tid, bid, aid, delta),
                    )
                    with open(inflight_path, "w") as f:
                        f.write(f"{txn_id}\n")
                    committing = True
                    cur.execute("COMMIT")
                    acked.write(f"{txn_id}\n")
                    acked.flush()
                    totals[number] += 1
                    break
                except psycopg.errors.SerializationFailure:
                    conn.execute("ROLLBACK")
                except psycopg.errors.DeadlockDetected:
                    conn.execute("ROLLBACK")
                except psycopg.OperationalError:
                    # The server is gone; a COMMIT sent may or may not have landed.
                    if not committing:
                        try:
                            os.remove(inflight_path)
                        except FileNotFoundError:
                            pass
                    return
                except psycopg.Error:
                    if committing:
                        return
                    raise
            else:
                raise RuntimeError("a transaction failed 50 times")


def main():
    dsn, clients, seconds, out_dir, round_ = sys.argv[1:6]
    clients, seconds, round_ = int(clients), float(seconds), int(round_)
    deadline = time.monotonic() + seconds
    totals = [0] * clients
    threads = [
        threading.Thread(target=client, args=(dsn, n, deadline, out_dir, round_, totals))
        for n in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"ok {sum(totals)}")


if __name__ == "__main__":
    main()
