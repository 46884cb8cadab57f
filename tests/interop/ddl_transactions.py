"""DDL inside transactions, as PostgreSQL's clients use it: psycopg with its
default (non-autocommit) connection and SQLAlchemy's `create_all` create,
fill and drop tables in transactions, rolled back and committed; what a
transaction creates is invisible to other sessions until COMMIT; two
transactions creating one name: the second COMMIT gets 42P07; a
transaction with DDL may not write a table that existed before it (0A000);
ALTER TABLE of an existing table takes effect at COMMIT.
With `row-store` (a server that keeps small writes in row stores): an
ALTER TABLE in a transaction holds off other sessions' writes to its table
until the transaction ends, as PostgreSQL's lock does, and a write that
waited is planned again over the new columns; a second transaction's bulk
UPDATE of the same rows waits and re-applies under READ COMMITTED, and
gets 40001 at COMMIT under REPEATABLE READ.
Run by crates/cirro/tests/ddl_transactions.rs; prints "ok" when every check
passed, raises otherwise.

    ddl_transactions.py DSN            (a server with --row-store off)
    ddl_transactions.py DSN row-store  (one with its row stores)
"""

import sys
import threading

import psycopg


def check(got, want, what):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def sqlstate_of(action):
    try:
        action()
    except psycopg.Error as e:
        return e.sqlstate
    return None


def waits_for(holder, session, statement, what):
    """Run `statement` on `session` in a thread: it waits while `holder`'s
    transaction is open (checked for a second), and goes on once `holder`
    commits. Its SQLSTATE (None: it succeeded)."""
    outcome = {}
    writer = threading.Thread(
        target=lambda: outcome.update(state=sqlstate_of(lambda: session.execute(statement)))
    )
    writer.start()
    writer.join(1.0)
    check(writer.is_alive(), True, f"{what} waits")
    holder.commit()
    writer.join(30.0)
    check(writer.is_alive(), False, f"{what} went on after the COMMIT")
    return outcome.get("state")


def relations(conn, like):
    with conn.cursor() as cur:
        cur.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name LIKE %s ORDER BY 1",
            (like,),
        )
        return [r[0] for r in cur.fetchall()]


def psycopg_default_connection(dsn):
    watcher = psycopg.connect(dsn, autocommit=True)
    conn = psycopg.connect(dsn)  # not autocommit: every statement in a transaction
    # Created, filled, rolled back: gone.
    conn.execute("CREATE TABLE tx_a (id INT NOT NULL, name VARCHAR(10))")
    conn.execute("INSERT INTO tx_a VALUES (1, 'one'), (2, 'two')")
    check(conn.execute("SELECT count(*) FROM tx_a").fetchone()[0], 2, "own rows in the transaction")
    check(relations(watcher, "tx_%"), [], "uncommitted table invisible to others")
    check(
        sqlstate_of(lambda: watcher.execute("SELECT * FROM tx_a")),
        "42P01",
        "another session cannot read an uncommitted table",
    )
    conn.rollback()
    check(relations(conn, "tx_%"), [], "rolled back table is gone")
    # Created, filled (two tables, a view), committed: all there.
    conn.execute("CREATE TABLE tx_a (id INT NOT NULL, name VARCHAR(10))")
    conn.execute("INSERT INTO tx_a VALUES (1, 'one'), (2, 'two')")
    conn.execute("CREATE TABLE tx_b AS SELECT id * 10 AS k FROM tx_a")
    conn.execute("INSERT INTO tx_b VALUES (30)")
    conn.execute("CREATE VIEW tx_v AS SELECT sum(k) AS total FROM tx_b")
    check(conn.execute("SELECT total FROM tx_v").fetchone()[0], 60, "view over the new tables")
    conn.commit()
    check(relations(watcher, "tx_%"), ["tx_a", "tx_b", "tx_v"], "committed objects seen by others")
    check(watcher.execute("SELECT count(*) FROM tx_a").fetchone()[0], 2, "committed rows")
    check(watcher.execute("SELECT total FROM tx_v").fetchone()[0], 60, "committed view")
    # A failed statement aborts the transaction; its DDL goes with it.
    conn.execute("CREATE TABLE tx_c (x INT)")
    check(sqlstate_of(lambda: conn.execute("SELECT * FROM missing_table")), "42P01", "error in txn")
    conn.rollback()
    check(relations(watcher, "tx_c"), [], "aborted transaction's table")
    # DROP in a transaction keeps the table until COMMIT; ROLLBACK keeps it.
    conn.execute("DROP VIEW tx_v")
    conn.execute("DROP TABLE tx_b")
    check(relations(conn, "tx_%"), ["tx_a"], "dropped in the transaction")
    check(relations(watcher, "tx_%"), ["tx_a", "tx_b", "tx_v"], "others still see them")
    conn.rollback()
    check(watcher.execute("SELECT count(*) FROM tx_b").fetchone()[0], 3, "rows after a rolled back DROP")
    conn.execute("DROP TABLE tx_b CASCADE")
    conn.commit()
    check(relations(watcher, "tx_%"), ["tx_a"], "DROP committed")
    # DDL and writes of an existing table do not share a transaction.
    conn.execute("CREATE TABLE tx_d (x INT)")
    check(
        sqlstate_of(lambda: conn.execute("INSERT INTO tx_a VALUES (3, 'three')")),
        "0A000",
        "DDL, then a write of an existing table",
    )
    conn.rollback()
    conn.execute("INSERT INTO tx_a VALUES (3, 'three')")
    check(sqlstate_of(lambda: conn.execute("CREATE TABLE tx_e (x INT)")), "0A000", "a write, then DDL")
    conn.rollback()
    check(watcher.execute("SELECT count(*) FROM tx_a").fetchone()[0], 2, "nothing of those committed")
    # ALTER TABLE of an existing table (as in an Alembic migration): staged
    # until COMMIT, read and written under its new columns meanwhile.
    def columns(c):
        return [r[0] for r in c.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'tx_a' "
            "ORDER BY ordinal_position"
        ).fetchall()]

    conn.execute("ALTER TABLE tx_a ADD COLUMN note TEXT")
    conn.execute("UPDATE tx_a SET note = name || '!'")
    check(
        conn.execute("SELECT note FROM tx_a ORDER BY id").fetchall(),
        [("one!",), ("two!",)],
        "the transaction's altered table",
    )
    check(columns(watcher), ["id", "name"], "others see the table as it was")
    check(watcher.execute("SELECT count(*) FROM tx_a").fetchone()[0], 2, "and its rows")
    conn.rollback()
    check(columns(conn), ["id", "name"], "rolled back ALTER")
    conn.execute("ALTER TABLE tx_a ADD COLUMN note TEXT")
    conn.execute("UPDATE tx_a SET note = name || '!'")
    conn.commit()
    check(columns(watcher), ["id", "name", "note"], "committed ALTER")
    check(
        watcher.execute("SELECT note FROM tx_a ORDER BY id").fetchall(),
        [("one!",), ("two!",)],
        "committed rows under the new column",
    )
    # Another session writes the table before the ALTER commits: 40001, and
    # neither the ALTER nor any row is lost.
    conn.execute("ALTER TABLE tx_a DROP COLUMN note")
    watcher.execute("INSERT INTO tx_a VALUES (3, 'three', 'third')")
    check(sqlstate_of(conn.commit), "40001", "ALTER after another session's write")
    check(columns(watcher), ["id", "name", "note"], "the failed ALTER changed nothing")
    check(watcher.execute("SELECT count(*) FROM tx_a").fetchone()[0], 3, "the other session's row")
    watcher.execute("DELETE FROM tx_a WHERE id = 3")
    # Two transactions create one name: the second COMMIT fails with 42P07.
    other = psycopg.connect(dsn)
    conn.execute("CREATE TABLE tx_same (x INT)")
    other.execute("CREATE TABLE tx_same (y TEXT)")
    conn.execute("INSERT INTO tx_same VALUES (1)")
    conn.commit()
    check(sqlstate_of(other.commit), "42P07", "the second COMMIT of one name")
    check(
        [c[0] for c in watcher.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'tx_same'"
        ).fetchall()],
        ["x"],
        "the first transaction's table stayed",
    )
    check(watcher.execute("SELECT count(*) FROM tx_same").fetchone()[0], 1, "its rows")
    for c in (conn, other, watcher):
        c.close()


def sqlalchemy_create_all(dsn):
    import sqlalchemy as sa

    engine = sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    metadata = sa.MetaData()
    items = sa.Table(
        "sa_items",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(20), nullable=False),
        sa.Column("price", sa.Numeric(10, 2)),
    )
    sa.Table("sa_tags", metadata, sa.Column("tag", sa.String(10)))
    def tables():
        return sorted(t for t in sa.inspect(engine).get_table_names() if t.startswith("sa_"))

    # create_all in a transaction that rolls back leaves nothing.
    with engine.connect() as conn:
        with conn.begin() as txn:
            metadata.create_all(conn)
            conn.execute(items.insert(), [{"id": 1, "name": "a", "price": 1.5}])
            txn.rollback()
    check(tables(), [], "rolled back create_all")
    # engine.begin(): create_all, fill, commit.
    with engine.begin() as conn:
        metadata.create_all(conn)
        conn.execute(items.insert(), [{"id": i, "name": f"n{i}", "price": i * 0.25} for i in range(1, 6)])
    with engine.connect() as conn:
        check(conn.execute(sa.select(sa.func.count()).select_from(items)).scalar(), 5, "rows committed")
    check(tables(), ["sa_items", "sa_tags"], "created tables")
    with engine.begin() as conn:
        metadata.drop_all(conn)
    check(tables(), [], "drop_all")
    engine.dispose()


def alter_beside_small_writes(dsn):
    """A rewriting ALTER in a transaction sees every small write made before
    it; another session's write waits for the transaction, then is planned
    again over the new columns and seen at once (before, a small write made
    during the transaction was missed until the next flush)."""
    watcher = psycopg.connect(dsn, autocommit=True)
    conn = psycopg.connect(dsn)
    watcher.execute("CREATE TABLE rs_a (id INT PRIMARY KEY, name TEXT, n INT)")
    watcher.execute("INSERT INTO rs_a VALUES (1, 'one', 1), (2, 'two', 2)")
    watcher.execute("UPDATE rs_a SET n = 20 WHERE id = 2")
    conn.execute("ALTER TABLE rs_a ALTER COLUMN n TYPE TEXT")
    state = waits_for(
        conn, watcher, "INSERT INTO rs_a VALUES (3, 'three', 3)", "the small write"
    )
    check(state, None, "the small write that waited")
    # Planned again over the new columns, and seen at once (before, it was
    # missed until the next flush), by a scan and by a read by key.
    check(
        watcher.execute("SELECT id, n FROM rs_a ORDER BY id").fetchall(),
        [(1, "1"), (2, "20"), (3, "3")],
        "the small writes before and after the ALTER, under the new type",
    )
    check(
        watcher.execute("SELECT name, n FROM rs_a WHERE id = 3").fetchall(),
        [("three", "3")],
        "the waited write read by its key",
    )
    # The same through a write that takes the path through the files (an
    # UPDATE without the key), waiting for another ALTER's transaction.
    conn.execute("ALTER TABLE rs_a ALTER COLUMN id TYPE BIGINT")
    state = waits_for(
        conn,
        watcher,
        "UPDATE rs_a SET name = upper(name) WHERE n >= '2'",
        "the write through the files",
    )
    check(state, None, "the write through the files that waited")
    check(
        watcher.execute("SELECT id, name FROM rs_a ORDER BY id").fetchall(),
        [(1, "one"), (2, "TWO"), (3, "THREE")],
        "the waited UPDATE over the new columns",
    )
    # A REPEATABLE READ transaction keeps its snapshot, which lacks the new
    # columns: its write that waited gets 40001 and writes nothing.
    repeatable = psycopg.connect(dsn)
    repeatable.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    repeatable.execute("SELECT count(*) FROM rs_a")
    conn.execute("ALTER TABLE rs_a ALTER COLUMN n TYPE VARCHAR(10)")
    conn.execute("ALTER TABLE rs_a ALTER COLUMN id TYPE INT")
    state = waits_for(
        conn,
        repeatable,
        "INSERT INTO rs_a VALUES (4, 'four', '4')",
        "the REPEATABLE READ write",
    )
    check(state, "40001", "the REPEATABLE READ write that waited")
    repeatable.rollback()
    check(watcher.execute("SELECT count(*) FROM rs_a").fetchone()[0], 3, "nothing written")
    repeatable.close()
    # A write through the files into a table without a key holds no other
    # writer off: a small write goes on while that transaction is open.
    watcher.execute("CREATE TABLE rs_log (id INT, note TEXT)")
    conn.execute("INSERT INTO rs_log SELECT id, name FROM rs_a WHERE id <= 2")
    done = threading.Event()
    appender = threading.Thread(
        target=lambda: (watcher.execute("INSERT INTO rs_log VALUES (9, 'small')"), done.set()),
        daemon=True,
    )
    appender.start()
    appender.join(10.0)
    check(done.is_set(), True, "a small append beside an open bulk append")
    conn.commit()
    check(
        watcher.execute("SELECT count(*) FROM rs_log").fetchone()[0],
        3,
        "both appends",
    )
    for c in (conn, watcher):
        c.close()


def bulk_updates_in_transactions(dsn):
    """Two transactions' UPDATEs through the files of the same rows: under
    READ COMMITTED the second waits for the first's COMMIT and re-applies
    to what it committed (before, it failed at COMMIT: 23505 on a table
    with a key, 40001 without); under REPEATABLE READ the second's COMMIT
    gets 40001 (before: 23505 with a key) and changes nothing."""
    watcher = psycopg.connect(dsn, autocommit=True)
    cases = [
        (name, key, level)
        for level in ("READ COMMITTED", "REPEATABLE READ")
        for name, key in (("key", " PRIMARY KEY"), ("nokey", ""))
    ]
    for i, (name, key, level) in enumerate(cases):
        table = f"bulk_{name}_{i}"
        watcher.execute(f"CREATE TABLE {table} (id INT{key}, v INT)")
        watcher.execute(f"INSERT INTO {table} SELECT value, 0 FROM generate_series(1, 100) AS g(value)")
        first, second = psycopg.connect(dsn), psycopg.connect(dsn)
        second.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
        second.execute(f"SELECT count(*) FROM {table}")
        first.execute(f"UPDATE {table} SET v = v + 1 WHERE id <= 50")
        state = waits_for(
            first,
            second,
            f"UPDATE {table} SET v = v + 10 WHERE id <= 50",
            f"{table}: the second UPDATE",
        )
        check(state, None, f"{table}: the second UPDATE")
        committed = sqlstate_of(second.commit)
        rows = watcher.execute(f"SELECT v, count(*) FROM {table} GROUP BY v ORDER BY v").fetchall()
        if level == "READ COMMITTED":
            check(committed, None, f"{table}: the second COMMIT")
            check(rows, [(0, 50), (11, 50)], f"{table}: both changes")
        else:
            check(committed, "40001", f"{table}: the second COMMIT")
            check(rows, [(0, 50), (1, 50)], f"{table}: the first change only")
        for c in (first, second):
            c.close()
    watcher.close()


if __name__ == "__main__":
    if sys.argv[2:] == ["row-store"]:
        alter_beside_small_writes(sys.argv[1])
        bulk_updates_in_transactions(sys.argv[1])
    else:
        psycopg_default_connection(sys.argv[1])
        sqlalchemy_create_all(sys.argv[1])
    print("ok")
