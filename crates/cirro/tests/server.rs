//! `cirro serve` with real PostgreSQL clients: psql (Debian's
//! postgresql-client), psycopg 3 (from the Python environment
//! `scripts/test.sh` sets up) and the PostgreSQL JDBC driver (the jar
//! `scripts/test.sh` fetches from Maven Central). Each test starts its own server on a free port.

use crate::common;

use std::process::{Command, Stdio};

use crate::common::compare::{compare, is_ordered};
use crate::common::server::{PASSWORD, Server, interop_dir, python_ok, spawn_serve, stderr};
use crate::common::{DataDir, eventually, shared_dir};

#[test]
fn psql_queries_describe_and_errors() {
    let server = Server::start();
    server.sql("CREATE TABLE items (id BIGINT NOT NULL, name VARCHAR, price DOUBLE)");
    let tag = server.psql_ok(&[
        "-c",
        "INSERT INTO items VALUES (1, 'apple', 1.5), (2, 'pear', 2.25), (3, NULL, NULL)",
    ]);
    assert_eq!(tag.trim(), "INSERT 0 3");

    assert_eq!(
        server.sql("SELECT id, name, price FROM items ORDER BY id"),
        "1|apple|1.5\n2|pear|2.25\n3||\n"
    );
    // Several statements in one simple query, with the right tags.
    let out = server.psql_ok(&[
        "-c",
        "UPDATE items SET price = 3 WHERE id = 2; DELETE FROM items WHERE id = 3",
    ]);
    // psql 15 prints the tag of every statement of the query.
    assert_eq!(out.trim(), "UPDATE 1\nDELETE 1");
    assert_eq!(server.sql("SELECT sum(price) FROM items"), "4.5\n");

    // psql's catalog commands.
    let tables = server.sql("\\dt");
    assert!(tables.contains("items"), "\\dt: {tables}");
    let described = server.sql("\\d items");
    for column in ["id", "name", "price"] {
        assert!(described.contains(column), "\\d items: {described}");
    }
    let all = server.sql("\\d");
    assert!(all.contains("items"), "\\d: {all}");

    // Errors carry SQLSTATE and leave the server up.
    let err = server.sql_err("SELECT * FROM missing_table");
    assert!(err.contains("42P01"), "{err}");
    let err = server.sql_err("INSERT INTO items VALUES (NULL, 'x', 1)");
    assert!(err.contains("23502"), "{err}");
    assert_eq!(server.sql("SELECT count(*) FROM items"), "2\n");

    // current_setting reads the session's settings.
    assert_eq!(
        server.sql("SET TimeZone = 'Europe/Paris'; SELECT current_setting('timezone'), current_setting('nope', true) IS NULL"),
        "SET\nEurope/Paris|t\n"
    );
    let err = server.sql_err("SELECT current_setting('nope')");
    assert!(err.contains("42704"), "{err}");

    // A transaction through psql: the failed statement aborts it.
    let out = server.psql(
        "cirro",
        PASSWORD,
        &[
            "-v",
            "ON_ERROR_STOP=0",
            "-c",
            "BEGIN",
            "-c",
            "INSERT INTO items VALUES (10, 'ten', 10)",
            "-c",
            "SELECT 1/0",
            "-c",
            "SELECT 1",
            "-c",
            "COMMIT",
        ],
    );
    let err = stderr(&out);
    assert!(err.contains("current transaction is aborted"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ROLLBACK"));
    assert_eq!(
        server.sql("SELECT count(*) FROM items WHERE id = 10"),
        "0\n"
    );

    // The data is the same that the shell sees.
    let shell = server.data.query_csv("SELECT id FROM items ORDER BY id");
    assert!(shell.contains('1') && shell.contains('2'), "{shell}");
}

/// PostgreSQL's own benchmark client (pgbench, Debian's postgresql-15) runs
/// against Cirro unmodified: `pgbench -i` (its four tables created, then
/// truncated and loaded in one transaction, vacuumed, given primary keys),
/// its start-up catalog query (the scale from pgbench_branches; the schema
/// and the partitions of pgbench_accounts, a LATERAL subquery among it), the
/// select-only script simple and prepared, and the TPC-B script, after which
/// its balance invariant holds.
#[test]
fn pgbench_initializes_and_runs_its_scripts() {
    let server = Server::start();
    let port = server.port.to_string();
    let pgbench = |args: &[&str]| {
        let out = Command::new("pgbench")
            .args(args)
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "cirro", "cirro"])
            .env("PGPASSWORD", PASSWORD)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("run pgbench (apt-get install postgresql-15)");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {text}");
        text
    };
    let init = pgbench(&["-i", "-s", "1"]);
    assert!(init.contains("done in"), "{init}");
    assert_eq!(
        server.sql(
            "SELECT (SELECT count(*) FROM pgbench_accounts), (SELECT count(*) FROM pgbench_branches), \
             (SELECT count(*) FROM pgbench_tellers), (SELECT count(*) FROM pgbench_history)"
        ),
        "100000|1|10|0\n"
    );
    for mode in ["simple", "prepared"] {
        let text = pgbench(&["-n", "-S", "-t", "20", "-M", mode]);
        assert!(
            text.contains("scaling factor: 1")
                && text.contains("number of transactions actually processed: 20/20")
                && text.contains("number of failed transactions: 0"),
            "{mode}: {text}"
        );
    }
    // TPC-B: an account, a teller and a branch updated and a history row
    // written per transaction; afterwards every sum of balances is the sum
    // of the history's deltas.
    let text = pgbench(&["-t", "15"]);
    assert!(
        text.contains("number of transactions actually processed: 15/15")
            && text.contains("number of failed transactions: 0")
            && !text.contains("error"),
        "{text}"
    );
    let sums = server.sql(
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(bbalance) FROM pgbench_branches), \
         (SELECT sum(tbalance) FROM pgbench_tellers), (SELECT sum(delta) FROM pgbench_history), \
         (SELECT count(*) FROM pgbench_history)",
    );
    let sums: Vec<&str> = sums.trim().split('|').collect();
    assert_eq!(sums[4], "15", "{sums:?}");
    assert!(sums[..4].iter().all(|s| *s == sums[3]), "{sums:?}");
    // pgbench goes on when its start-up catalog query fails (as against
    // an old server), so that it ran is checked here: every statement
    // finished, that query among them (once per run).
    assert_eq!(
        server
            .sql("SELECT count(*) FROM cirro.queries WHERE state = 'failed'")
            .trim(),
        "0",
        "{}",
        server.sql("SELECT query, error FROM cirro.queries WHERE state = 'failed'")
    );
    assert_eq!(
        server
            .sql(
                "SELECT count(*) FROM cirro.queries WHERE state = 'finished' \
                 AND query LIKE '%pg_partitioned_table%'"
            )
            .trim(),
        "3"
    );
}

#[test]
fn psql_copy_in_and_out() {
    let server = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    server.sql("CREATE TABLE t (a INT NOT NULL, b VARCHAR, c DOUBLE, d DATE, e BOOLEAN, f BYTEA)");
    // Text format: escapes, NULLs (\N), bytea's hex form.
    std::fs::write(
        file("in.txt"),
        "1\thello\t1.5\t2024-01-02\tt\t\\\\x0102\n\
         2\t\\N\t\\N\t\\N\t\\N\t\\N\n\
         3\ttab\\there \\\\ back\t-2\t2020-02-29\tf\t\\\\x\n",
    )
    .expect("write");
    let copied = server.psql_ok(&["-c", &format!("\\copy t from '{}'", file("in.txt"))]);
    assert_eq!(copied.trim(), "COPY 3");
    assert_eq!(
        server.sql("SELECT a, b, c, d, e, encode(f, 'hex') FROM t ORDER BY a"),
        "1|hello|1.5|2024-01-02|t|0102\n2|||||\n3|tab\there \\ back|-2.0|2020-02-29|f|\n"
    );
    // Out and back in, text and CSV: the same rows (NULL and '' kept apart).
    server.sql("INSERT INTO t VALUES (4, '', NULL, NULL, NULL, NULL)");
    let before = server.sql("SELECT * FROM t ORDER BY a");
    for (name, options) in [("out.txt", ""), ("out.csv", " with (format csv, header)")] {
        let out = server.psql_ok(&[
            "-c",
            &format!(
                "\\copy (SELECT * FROM t ORDER BY a) to '{}'{options}",
                file(name)
            ),
        ]);
        assert_eq!(out.trim(), "COPY 4");
        server.sql("TRUNCATE t");
        let back = server.psql_ok(&["-c", &format!("\\copy t from '{}'{options}", file(name))]);
        assert_eq!(back.trim(), "COPY 4");
        assert_eq!(server.sql("SELECT * FROM t ORDER BY a"), before, "{name}");
    }
    let csv = std::fs::read_to_string(file("out.csv")).expect("read");
    assert!(csv.starts_with("a,b,c,d,e,f\n1,\"hello\",1.5,"), "{csv}");
    // A column list; COPY TO STDOUT of a table with options.
    server.psql_ok(&[
        "-c",
        &format!("\\copy t (b, a) from '{}' with (format csv)", {
            std::fs::write(file("two.csv"), "\"x,y\",10\n,11\n").expect("write");
            file("two.csv")
        }),
    ]);
    assert_eq!(
        server.sql("COPY (SELECT a, b FROM t WHERE a >= 10 ORDER BY a) TO STDOUT WITH (FORMAT csv, DELIMITER ';')"),
        "10;\"x,y\"\n11;\n"
    );
    // Bad data: refused with its SQLSTATE, and nothing of it is kept.
    let count = || server.sql("SELECT count(*) FROM t");
    let rows = count();
    for (data, state) in [
        (
            "5\tok\t1\t2024-01-01\tt\t\\\\x00\nnotanint\tx\t1\t2024-01-01\tt\t\\\\x00\n",
            "22P02",
        ),
        ("5\tshort\n", "22P04"),
        ("\\N\tnull key\t1\t2024-01-01\tt\t\\\\x00\n", "23502"),
    ] {
        std::fs::write(file("bad.txt"), data).expect("write");
        let err = server.sql_err(&format!("\\copy t from '{}'", file("bad.txt")));
        assert!(err.contains(state), "{data:?}: {err}");
        assert_eq!(count(), rows);
    }
    assert!(
        server
            .sql_err("\\copy nosuch from '/dev/null'")
            .contains("42P01")
    );
    assert!(
        server
            .sql_err("COPY t FROM STDIN (FORMAT binary)")
            .contains("0A000")
    );
    // In a transaction: the copied rows go with ROLLBACK; after a failed
    // COPY the transaction is aborted.
    let out = server.psql_ok(&[
        "-At",
        "-c",
        "BEGIN",
        "-c",
        &format!("\\copy t from '{}'", file("in.txt")),
        "-c",
        "SELECT count(*) FROM t",
        "-c",
        "ROLLBACK",
    ]);
    assert_eq!(
        out.lines().nth(2),
        Some(
            (rows.trim().parse::<u64>().expect("count") + 3)
                .to_string()
                .as_str()
        )
    );
    assert_eq!(count(), rows);
    // A client killed in the middle of COPY FROM STDIN leaves no rows.
    let mut psql = Command::new("psql")
        .arg(server.conninfo("cirro"))
        .args(["-X", "-c", "COPY t FROM STDIN"])
        .env("PGPASSWORD", PASSWORD)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("psql");
    {
        use std::io::Write;
        let stdin = psql.stdin.as_mut().expect("stdin");
        for i in 0..20_000 {
            writeln!(stdin, "{}\tpartial\t1\t2024-01-01\tt\t\\\\x00", 100 + i).expect("write");
        }
        stdin.flush().expect("flush");
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    psql.kill().expect("kill psql");
    let _ = psql.wait();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(count(), rows);
    assert_eq!(
        server.sql("SELECT count(*) FROM t WHERE b = 'partial'"),
        "0\n"
    );
}

#[test]
fn authentication_and_privileges() {
    let server = Server::start();
    server.sql("CREATE TABLE secrets (k INT, v VARCHAR)");
    server.sql("INSERT INTO secrets VALUES (1, 'a')");
    server.sql("CREATE USER alice WITH PASSWORD 'alice-pw'");

    // The verifier is stored, the password is not.
    let catalog_dir = server.data.path().join("_catalog");
    let mut text = String::new();
    for entry in std::fs::read_dir(&catalog_dir).expect("catalog dir") {
        text.push_str(&std::fs::read_to_string(entry.expect("entry").path()).unwrap_or_default());
    }
    assert!(text.contains("SCRAM-SHA-256$4096:"), "no verifier stored");
    assert!(
        !text.contains("alice-pw") && !text.contains(PASSWORD),
        "a password is stored in clear"
    );

    // Wrong password, unknown user: refused with PostgreSQL's codes.
    let out = server.psql("cirro", "wrong", &["-c", "SELECT 1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("password authentication failed"),
        "{}",
        stderr(&out)
    );
    let out = server.psql("mallory", "x", &["-c", "SELECT 1"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("role \"mallory\" does not exist"),
        "{}",
        stderr(&out)
    );

    // Right password, no privilege: 42501 and nothing changes.
    let as_alice = |sql: &str| {
        server.psql(
            "alice",
            "alice-pw",
            &["-v", "VERBOSITY=verbose", "-At", "-c", sql],
        )
    };
    let out = as_alice("SELECT 1");
    assert!(out.status.success(), "{}", stderr(&out));

    // Identity: who and where the session is; only real databases, and
    // catalog views of the current database alone.
    let out = as_alice("SELECT current_user, session_user, current_database(), current_role");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "alice|alice|cirro|alice\n"
    );
    server.sql("CREATE DATABASE other");
    let in_other = |sql: &str| {
        let out = Command::new("psql")
            .arg(
                server
                    .conninfo("cirro")
                    .replace("dbname=cirro", "dbname=other"),
            )
            .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .expect("psql");
        assert!(out.status.success(), "{sql}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    in_other("CREATE TABLE only_here (x INT)");
    assert_eq!(in_other("SELECT current_database()"), "other\n");
    let tables = "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n \
                  ON c.relnamespace = n.oid WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY 1";
    assert_eq!(in_other(tables), "only_here\n");
    assert_eq!(server.sql(tables), "secrets\n");
    assert_eq!(
        server.sql("SELECT datname FROM pg_catalog.pg_database ORDER BY 1"),
        "cirro\nother\n"
    );
    let listed = server.psql_ok(&["-l", "-A", "-t"]);
    assert!(
        listed.starts_with("cirro|cirro|") && listed.contains("\nother|cirro|"),
        "{listed}"
    );
    assert!(!listed.contains("postgres"), "{listed}");

    for sql in [
        "SELECT * FROM secrets",
        "INSERT INTO secrets VALUES (2, 'b')",
        "UPDATE secrets SET v = 'z'",
        "DELETE FROM secrets",
        "DROP TABLE secrets",
        "CREATE USER eve PASSWORD 'x'",
        "SELECT * FROM read_csv('/etc/hostname')",
    ] {
        let out = as_alice(sql);
        assert!(!out.status.success(), "{sql} was allowed");
        assert!(stderr(&out).contains("42501"), "{sql}: {}", stderr(&out));
    }
    assert_eq!(server.sql("SELECT k, v FROM secrets"), "1|a\n");

    // Files on the server: the privilege is checked before anything is
    // opened, so the error is the same whether the file exists or not.
    let existing = server.data.path().join("exists.csv");
    std::fs::write(&existing, "a,b\n1,2\n").expect("write");
    let existing = existing.display().to_string();
    let missing = server
        .data
        .path()
        .join("missing/none.csv")
        .display()
        .to_string();
    for form in [
        "SELECT * FROM read_csv('{}')",
        "SELECT * FROM read_parquet('{}')",
        "SELECT * FROM '{}'",
        "COPY secrets FROM '{}'",
        "COPY secrets TO '{}'",
        "COPY (SELECT 1) TO '{}' (FORMAT parquet)",
    ] {
        let errors: Vec<String> = [&existing, &missing]
            .iter()
            .map(|path| {
                let out = as_alice(&form.replace("{}", path));
                assert!(!out.status.success(), "{form} was allowed");
                let err = stderr(&out);
                assert!(err.contains("42501"), "{form}: {err}");
                err.replace(path.as_str(), "PATH")
            })
            .collect();
        assert_eq!(errors[0], errors[1], "{form}");
    }
    assert!(!std::path::Path::new(&missing).exists());

    // Granted privileges work; revoked ones stop working.
    server.sql("GRANT SELECT, INSERT ON secrets TO alice");
    assert_eq!(
        String::from_utf8_lossy(&as_alice("SELECT v FROM secrets").stdout),
        "a\n"
    );
    let out = as_alice("INSERT INTO secrets VALUES (2, 'b')");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_alice("DELETE FROM secrets");
    assert!(stderr(&out).contains("42501"), "{}", stderr(&out));
    server.sql("REVOKE INSERT ON secrets FROM alice");
    let out = as_alice("INSERT INTO secrets VALUES (3, 'c')");
    assert!(stderr(&out).contains("42501"), "{}", stderr(&out));
    assert_eq!(server.sql("SELECT count(*) FROM secrets"), "2\n");

    // A user owns what they create; a user may change their own password.
    let out = as_alice("CREATE TABLE mine AS SELECT 1 AS x");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = as_alice("ALTER USER alice PASSWORD 'new-pw'");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = server.psql("alice", "new-pw", &["-At", "-c", "SELECT x FROM mine"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1\n",
        "{}",
        stderr(&out)
    );
    let out = server.psql("alice", "alice-pw", &["-c", "SELECT 1"]);
    assert!(stderr(&out).contains("password authentication failed"));

    // DROP USER: the user can no longer log in.
    server.sql("DROP USER alice");
    let out = server.psql("alice", "new-pw", &["-c", "SELECT 1"]);
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
}

#[test]
fn pg_stat_activity_cancel_and_terminate_backends() {
    let server = Server::start();
    server.sql("CREATE USER alice WITH PASSWORD 'alice-pw'");
    server.sql("CREATE USER bob WITH PASSWORD 'bob-pw'");
    let long = "SELECT count(*) FROM generate_series(1, 5000000000)";
    let start_long = || {
        Command::new("psql")
            .arg(server.conninfo("alice"))
            .args(["-X", "-v", "VERBOSITY=verbose", "-c", long])
            .env("PGPASSWORD", "alice-pw")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("psql")
    };
    let alice_pid = || {
        server
            .sql("SELECT pid FROM pg_stat_activity WHERE usename = 'alice' AND state = 'active'")
            .trim()
            .parse::<i64>()
            .ok()
    };
    let finished = |child: &mut std::process::Child| {
        eventually(100, || child.try_wait().expect("wait").is_some())
    };

    let mut child = start_long();
    assert!(
        eventually(100, || alice_pid().is_some()),
        "alice's query never showed"
    );
    let pid = alice_pid().expect("pid");
    // PostgreSQL's columns; this session sees itself active, with its own pid.
    let rows = server.sql(
        "SELECT usename, datname, state, query, backend_start <= query_start, \
         pid = pg_backend_pid() FROM pg_stat_activity ORDER BY usename",
    );
    let expected = format!(
        "alice|cirro|active|{long}|t|f\ncirro|cirro|active|SELECT usename, datname, state, query, \
         backend_start <= query_start, pid = pg_backend_pid() FROM pg_stat_activity ORDER BY usename|t|t\n"
    );
    assert_eq!(rows, expected);
    // Another ordinary user may not signal alice's backend.
    let out = server.psql(
        "bob",
        "bob-pw",
        &[
            "-v",
            "VERBOSITY=verbose",
            "-c",
            &format!("SELECT pg_cancel_backend({pid})"),
        ],
    );
    assert!(stderr(&out).contains("42501"), "{}", stderr(&out));
    assert_eq!(
        server.sql(&format!("SELECT pg_cancel_backend({pid})")),
        "t\n"
    );
    assert!(finished(&mut child), "the cancelled query kept running");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read");
    assert!(err.contains("57014"), "{err}");
    assert_eq!(server.sql("SELECT pg_cancel_backend(123456789)"), "f\n");

    // pg_terminate_backend closes the connection; the backend leaves the list.
    let mut child = start_long();
    assert!(eventually(100, || alice_pid().is_some()));
    let pid = alice_pid().expect("pid");
    assert_eq!(
        server.sql(&format!("SELECT pg_terminate_backend({pid})")),
        "t\n"
    );
    assert!(finished(&mut child), "the terminated session stayed");
    assert!(!child.wait().expect("wait").success());
    assert!(eventually(50, || server.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'alice'"
    ) == "0\n"));
}

#[test]
fn flight_sql_sessions_are_backends_that_can_be_cancelled_and_terminated() {
    // A Flight SQL session is in the same registry as PostgreSQL ones: it
    // shows in pg_stat_activity while its query runs (as the DoGet streams
    // it), and pg_cancel_backend / pg_terminate_backend stop it.
    let server = Server::start();
    server.sql("CREATE USER flyer WITH PASSWORD 'flyer-pw'");
    let uri = format!("grpc://127.0.0.1:{}", server.flight_port);
    let child = Command::new(common::server::python())
        .arg(common::server::interop_dir().join("flight_client.py"))
        .args(["activity", &uri, "flyer", "flyer-pw"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    // (pid, query_start) of flyer's running long query
    let active = || {
        let row = server.sql(
            "SELECT pid, query_start FROM pg_stat_activity WHERE usename = 'flyer' \
             AND state = 'active' AND application_name = 'Flight SQL' \
             AND query LIKE '%generate_series%'",
        );
        let (pid, start) = row.trim().split_once('|')?;
        Some((pid.parse::<i64>().ok()?, start.to_string()))
    };
    assert!(
        eventually(100, || active().is_some()),
        "the Flight SQL query never showed"
    );
    let (pid, first_start) = active().expect("pid");
    assert_eq!(
        server.sql(&format!("SELECT pg_cancel_backend({pid})")),
        "t\n"
    );
    // the client sees 57014, then runs a second long query in the same session
    assert!(
        eventually(100, || active()
            .is_some_and(|(p, s)| p == pid && s != first_start)),
        "the session's second query never showed"
    );
    assert_eq!(
        server.sql(&format!("SELECT pg_terminate_backend({pid})")),
        "t\n"
    );
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("cancelled") && stdout.contains("ok"),
        "flight_client.py activity: {stdout}\n{}",
        stderr(&out)
    );
    assert!(eventually(50, || server.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'flyer'"
    ) == "0\n"));
}

#[test]
fn restart_keeps_users_and_ignores_the_environment() {
    let server = Server::start();
    server.sql("CREATE TABLE t AS SELECT 1 AS x");
    let data = server.data.path().to_path_buf();
    // A second server on the same data with another CIRRO_PASSWORD: the
    // existing superuser keeps its password.
    let (mut child, port, _, _) = spawn_serve(&data, &[], "other-password");
    let run = |password: &str| {
        Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={port} user=cirro dbname=cirro sslmode=disable"
            ))
            .args(["-X", "-At", "-c", "SELECT x FROM t"])
            .env("PGPASSWORD", password)
            .output()
            .expect("psql")
    };
    assert_eq!(String::from_utf8_lossy(&run(PASSWORD).stdout), "1\n");
    assert!(!run("other-password").status.success());
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn psycopg_parameters_prepared_statements_and_transactions() {
    Server::start().python_check("basics");
}

#[test]
fn psycopg_copy_with_pandas_and_arrow_round_trips() {
    Server::start().python_check("copy");
}

#[test]
fn jdbc_metadata_prepared_statements_batches_and_types() {
    let server = Server::start();
    let jar = std::env::var_os("CIRRO_TEST_JDBC_JAR")
        .expect("CIRRO_TEST_JDBC_JAR is not set: run the tests with scripts/test.sh");
    let url = format!(
        "jdbc:postgresql://127.0.0.1:{}/cirro?sslmode=disable&prepareThreshold=1",
        server.port
    );
    let out = Command::new("java")
        .arg("-cp")
        .arg(jar)
        .arg(interop_dir().join("JdbcCheck.java"))
        .args([url.as_str(), "cirro", PASSWORD])
        .output()
        .expect("run java (apt-get install default-jdk-headless)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "ok"),
        "JdbcCheck failed:\n{stdout}\n{}",
        stderr(&out)
    );
    // What the check left behind, seen by another client.
    assert_eq!(
        server.sql("SELECT count(*), sum(qty), min(day) FROM jdbc_items"),
        "50|2575|2024-01-02\n"
    );
}

#[test]
fn sqlalchemy_reflection_queries_and_pandas() {
    Server::start().python_check("sqlalchemy");
}

#[test]
fn adbc_flight_sql_queries_logins_and_privileges() {
    let server = Server::start();
    let uri = format!("grpc://127.0.0.1:{}", server.flight_port);
    python_ok("flight_client.py", &["basics", &uri, PASSWORD]);
    // What the Flight SQL session did is what a PostgreSQL client sees.
    assert_eq!(
        server.sql("SELECT count(*), sum(id) FROM f"),
        "1000|500500\n"
    );
}

#[test]
fn protocol_fuzz_leaves_the_server_answering() {
    let server = Server::start();
    // Fixed seed; 400 connections per phase (startup, authentication,
    // simple query, extended query, COPY), several messages each.
    let port = server.port.to_string();
    let stdout = python_ok(
        "pg_fuzz.py",
        &["127.0.0.1", &port, "cirro", PASSWORD, "1", "400"],
    );
    let sent: u64 = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("message count");
    assert!(sent >= 5000, "only {sent} messages sent: {stdout}");
    // And psql still works.
    assert_eq!(server.sql("SELECT count(*) FROM fuzz_ref"), "2\n");
}

/// `pg_soak.py`: 32 clients for `seconds` against a new server.
fn soak(seconds: u32) {
    let server = Server::start();
    let pid = server.child.id().to_string();
    let dsn = format!("{} password={PASSWORD}", server.conninfo("cirro"));
    let stdout = python_ok("pg_soak.py", &[&dsn, &pid, "32", &seconds.to_string()]);
    eprintln!("soak: statements, baseline/peak/after MiB: {stdout}");
}

/// The soak in the fast tier: 20 seconds (with its warm-up and settling,
/// about 40 s).
#[test]
fn thirty_two_clients_without_errors_or_memory_growth() {
    soak(20);
}

#[test]
#[ignore = "slow tier: one minute"]
fn thirty_two_clients_for_a_minute_without_errors_or_memory_growth() {
    soak(60);
}

#[test]
fn tpch_sf0_01_over_psycopg_matches_reference_answers() {
    let data = DataDir::new();
    data.load(&["tpch", "--sf", "0.01"]);
    let server = Server::start_on(data);
    let queries = shared_dir().join("tpch/queries");
    let results = tempfile::tempdir().expect("tempdir");
    let dsn = format!("{} password={PASSWORD}", server.conninfo("cirro"));
    python_ok(
        "pg_client.py",
        &[
            &dsn,
            "tpch",
            queries.to_str().expect("utf8"),
            results.path().to_str().expect("utf8"),
        ],
    );
    let mut failures = Vec::new();
    for q in 1..=22 {
        let name = format!("q{q:02}");
        let query = std::fs::read_to_string(queries.join(format!("{name}.sql"))).expect("query");
        let expected =
            std::fs::read_to_string(shared_dir().join(format!("tpch/answers/sf0.01/{name}.csv")))
                .expect("answer");
        let actual = std::fs::read_to_string(results.path().join(format!("{name}.csv")))
            .unwrap_or_else(|e| format!("missing result: {e}"));
        if let Err(diff) = compare(&actual, &expected, is_ordered(&query)) {
            failures.push(format!("{name}: {diff}"));
        }
    }
    assert!(
        failures.is_empty(),
        "TPC-H over psycopg:\n{}",
        failures.join("\n")
    );
}

#[test]
fn tls_connections_and_require_tls() {
    let data = DataDir::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("run openssl");
    assert!(made.status.success(), "openssl: {}", stderr(&made));
    let (cert, key) = (
        cert.to_str().expect("utf8").to_string(),
        key.to_str().expect("utf8").to_string(),
    );
    let (mut child, port, flight_port, line) = spawn_serve(
        data.path(),
        &["--tls-cert", &cert, "--tls-key", &key, "--require-tls"],
        PASSWORD,
    );
    assert!(line.contains("(TLS)"), "{line}");
    let psql = |sslmode: &str| {
        Command::new("psql")
            .arg(format!(
                "host=127.0.0.1 port={port} user=cirro dbname=cirro sslmode={sslmode}"
            ))
            .args(["-X", "-At", "-c", "SELECT ssl FROM (VALUES (1)) AS t(ssl)"])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .expect("psql")
    };
    let secure = psql("require");
    assert!(
        secure.status.success(),
        "TLS connection failed: {}",
        stderr(&secure)
    );
    assert_eq!(String::from_utf8_lossy(&secure.stdout), "1\n");
    let plain = psql("disable");
    assert!(!plain.status.success(), "a plain connection was accepted");
    assert!(stderr(&plain).contains("TLS"), "{}", stderr(&plain));
    // Flight SQL is served over TLS with the same certificate, and only so.
    python_ok(
        "flight_client.py",
        &[
            "tls",
            &format!("grpc+tls://127.0.0.1:{flight_port}"),
            PASSWORD,
            &cert,
        ],
    );
    let _ = child.kill();
    let _ = child.wait();
}
