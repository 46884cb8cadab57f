//! Statement texts are private, as in PostgreSQL's `pg_stat_activity`: a
//! user sees the texts of its own sessions' statements only, a superuser
//! sees all, a `pg_read_all_stats` member sees all with literals as `$n`
//! where it may not read the tables; and no password appears in any text
//! or log. Checked through every place a text shows: `cirro.queries` and
//! `pg_stat_activity` over psql, the console's `/api/queries` (curl) and
//! Flight SQL (ADBC).

use crate::common;

use std::process::{Child, Command, Stdio};

use crate::common::server::{PASSWORD, Server, interop_dir, python, stderr};
use crate::common::{DataDir, eventually};

const BOB_PASSWORD: &str = "bobpw-never-shown";
const SECRET: &str = "the-secret-value";
const ALICE_LITERAL: &str = "alice-literal-4711";

fn psql_as(server: &Server, user: &str, password: &str, sql: &str) -> String {
    let out = server.psql(user, password, &["-At", "-c", sql]);
    assert!(out.status.success(), "{user}: {sql}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn console_queries(server: &Server, user: &str, password: &str) -> String {
    let out = Command::new("curl")
        .args(["-s", "--fail", "--max-time", "30", "-u"])
        .arg(format!("{user}:{password}"))
        .arg(format!("http://127.0.0.1:{}/api/queries", server.http_port))
        .output()
        .expect("curl");
    assert!(out.status.success(), "curl as {user}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn flight_query(server: &Server, user: &str, password: &str, sql: &str) -> String {
    let out = Command::new(python())
        .arg(interop_dir().join("flight_client.py"))
        .args(["query", &format!("grpc://127.0.0.1:{}", server.flight_port)])
        .args([user, password, sql])
        .output()
        .expect("python");
    assert!(out.status.success(), "flight as {user}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A statement of alice's that runs until it is killed, naming her table
/// and a literal.
fn alice_long(server: &Server) -> Child {
    Command::new("psql")
        .arg(server.conninfo("alice"))
        .args(["-X", "-At", "-c"])
        .arg(format!(
            "SELECT count(*) FROM alice_t, generate_series(1, 5000000000) \
             WHERE alice_t.note <> '{ALICE_LITERAL}'"
        ))
        .env("PGPASSWORD", "alice-pw")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("psql")
}

#[test]
fn statement_texts_are_their_owners_and_passwords_are_never_kept() {
    let logs = tempfile::tempdir().expect("tempdir");
    let slow_log = logs.path().join("slow.jsonl");
    let server_log = logs.path().join("server.log");
    let data = DataDir::new();
    let log = std::fs::File::create(&server_log).expect("log file");
    // Every statement goes to the slow-query log; the server logs at its
    // most talkative.
    let (child, port, flight_port, _, http_port) = common::server::spawn_serve_console(
        data.path(),
        &[
            "--slow-query-ms",
            "0",
            "--slow-query-log",
            slow_log.to_str().expect("utf8"),
        ],
        PASSWORD,
        &[("RUST_LOG", "debug")],
        Stdio::from(log),
    );
    let server = Server {
        child,
        port,
        flight_port,
        http_port,
        data,
    };

    server.sql(&format!("CREATE USER bob PASSWORD '{BOB_PASSWORD}'"));
    server.sql("ALTER USER bob WITH PASSWORD 'bobpw-never-shown'");
    server.sql("CREATE USER alice PASSWORD 'alice-pw'");
    server.sql("CREATE USER carol PASSWORD 'carol-pw'");
    server.sql("CREATE TABLE secret (v TEXT)");
    server.sql(&format!("INSERT INTO secret VALUES ('{SECRET}')"));
    server.sql("CREATE TABLE alice_t (note TEXT)");
    server.sql("INSERT INTO alice_t VALUES ('x')");
    server.sql("GRANT SELECT ON alice_t TO alice");
    server.sql("CREATE TABLE open_t (k INT)");
    server.sql("GRANT SELECT ON open_t TO carol, alice");
    // Only a superuser grants the role.
    let out = server.psql(
        "bob",
        BOB_PASSWORD,
        &[
            "-v",
            "VERBOSITY=verbose",
            "-c",
            "GRANT pg_read_all_stats TO bob",
        ],
    );
    assert!(stderr(&out).contains("42501"), "{}", stderr(&out));
    assert!(server.sql_err("GRANT pg_nonsense TO bob").contains("42704"));
    server.sql("GRANT pg_read_all_stats TO carol");
    psql_as(&server, "bob", BOB_PASSWORD, "SELECT 'bob-own-statement'");
    psql_as(
        &server,
        "alice",
        "alice-pw",
        "SELECT count(*) FROM open_t WHERE k = 99",
    );

    let mut long = alice_long(&server);
    let alice_running = || {
        server.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = 'alice' AND state = 'active'",
        ) == "1\n"
    };
    assert!(
        eventually(150, alice_running),
        "alice's statement never ran"
    );

    // bob: his own text, nobody else's, in each place a text shows.
    let bob_sql = "SELECT usename, query FROM cirro.queries ORDER BY query_id";
    let bob_activity = "SELECT usename, query FROM pg_stat_activity";
    for (place, seen) in [
        (
            "cirro.queries",
            psql_as(&server, "bob", BOB_PASSWORD, bob_sql),
        ),
        (
            "pg_stat_activity",
            psql_as(&server, "bob", BOB_PASSWORD, bob_activity),
        ),
        (
            "/api/queries",
            console_queries(&server, "bob", BOB_PASSWORD),
        ),
        (
            "Flight SQL",
            flight_query(&server, "bob", BOB_PASSWORD, bob_sql),
        ),
    ] {
        for hidden in [
            SECRET,
            ALICE_LITERAL,
            "alice_t",
            "CREATE USER",
            BOB_PASSWORD,
        ] {
            assert!(
                !seen.contains(hidden),
                "bob sees {hidden:?} in {place}:\n{seen}"
            );
        }
        assert!(
            seen.contains("<insufficient privilege>"),
            "{place} lists others' statements:\n{seen}"
        );
    }
    assert!(
        psql_as(&server, "bob", BOB_PASSWORD, bob_sql).contains("bob-own-statement"),
        "bob sees his own statement"
    );
    // alice sees her own, not bob's.
    let alice_seen = psql_as(&server, "alice", "alice-pw", bob_sql);
    assert!(alice_seen.contains("k = 99"), "{alice_seen}");
    assert!(!alice_seen.contains("bob-own-statement"), "{alice_seen}");
    assert!(!alice_seen.contains(SECRET), "{alice_seen}");

    // The superuser sees both, passwords redacted.
    for (place, seen) in [
        ("cirro.queries", server.sql(bob_sql)),
        ("pg_stat_activity", server.sql(bob_activity)),
        ("/api/queries", console_queries(&server, "cirro", PASSWORD)),
        (
            "Flight SQL",
            flight_query(&server, "cirro", PASSWORD, bob_sql),
        ),
    ] {
        assert!(seen.contains(ALICE_LITERAL), "{place}:\n{seen}");
        assert!(
            !seen.contains(BOB_PASSWORD),
            "a password in {place}:\n{seen}"
        );
    }
    let all = server.sql(bob_sql);
    for shown in [
        SECRET,
        "bob-own-statement",
        "CREATE USER bob PASSWORD '********'",
    ] {
        assert!(all.contains(shown), "the superuser sees {shown:?}:\n{all}");
    }

    // carol (pg_read_all_stats): every text; literals as $n where a table
    // is not hers to read.
    let carol_seen = psql_as(&server, "carol", "carol-pw", bob_sql);
    assert!(!carol_seen.contains(ALICE_LITERAL), "{carol_seen}");
    assert!(!carol_seen.contains(SECRET), "{carol_seen}");
    assert!(
        carol_seen.contains("INSERT INTO secret VALUES ($1)"),
        "{carol_seen}"
    );
    assert!(carol_seen.contains("alice_t.note <> $"), "{carol_seen}");
    assert!(carol_seen.contains("WHERE k = 99"), "{carol_seen}");
    let carol_activity = psql_as(&server, "carol", "carol-pw", bob_activity);
    assert!(
        carol_activity.contains("alice_t.note <> $"),
        "{carol_activity}"
    );

    let _ = long.kill();
    let _ = long.wait();
    // Nothing kept anywhere names the password: the slow-query log and
    // the server's log included.
    server.sql("SELECT 1");
    for path in [&slow_log, &server_log] {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            !text.is_empty() || path == &server_log,
            "{} is empty",
            path.display()
        );
        assert!(
            !text.contains(BOB_PASSWORD),
            "{} names the password",
            path.display()
        );
    }
    let slow = std::fs::read_to_string(&slow_log).expect("slow log");
    assert!(slow.contains("PASSWORD '********'"), "{slow}");
}
