//! The web console and HTTP API (`--http-port`): a real headless Chromium
//! logs in, sees the node, watches a long statement a psql client runs,
//! cancels it from the page (the client gets 57014); curl checks the
//! refusals and privileges; `cirro admin` lists and cancels statements;
//! TLS with the server's certificate.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

use crate::common::server::{PASSWORD, Server, python_ok, stderr};
use crate::common::{DataDir, cirro_bin, eventually};

/// Where the console's screenshots go: `$CIRRO_TEST_ARTIFACTS/console`, or
/// `test-artifacts/console` beside the test binaries.
fn artifacts() -> PathBuf {
    let base = std::env::var_os("CIRRO_TEST_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(cirro_bin())
                .parent()
                .expect("target dir")
                .join("test-artifacts")
        });
    base.join("console")
}

/// A statement that runs until cancelled (minutes at least), marked with
/// `marker` in a comment.
fn long_statement(marker: &str) -> String {
    format!("SELECT /* {marker} */ count(*) FROM t, generate_series(1, 5000000000)")
}

fn psql_bg(server: &Server, user: &str, password: &str, sql: &str) -> Child {
    Command::new("psql")
        .arg(server.conninfo(user))
        .args(["-X", "-At", "-v", "VERBOSITY=verbose", "-c", sql])
        .env("PGPASSWORD", password)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql")
}

/// curl `args` against the console; (HTTP status, body).
fn curl(server: &Server, path: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "--max-time", "30"])
        .args(args)
        .arg(format!("http://127.0.0.1:{}{path}", server.http_port))
        .output()
        .expect("run curl (apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').expect("status line");
    (status.trim().parse().expect("status"), body.to_string())
}

fn admin(server: &Server, user: &str, password: &str, args: &[&str]) -> Output {
    Command::new(cirro_bin())
        .args([
            "admin",
            "--url",
            &format!("http://127.0.0.1:{}", server.http_port),
        ])
        .args(["--user", user])
        .args(args)
        .env("CIRRO_PASSWORD", password)
        .output()
        .expect("run cirro admin")
}

/// The id of the running statement whose text holds `marker`.
fn running_id(server: &Server, marker: &str) -> Option<String> {
    let id = server.sql(&format!(
        "SELECT query_id FROM cirro.queries WHERE state = 'running' \
         AND query LIKE '%{marker}%' AND query NOT LIKE '%cirro.queries%'"
    ));
    Some(id.trim().to_string()).filter(|id| !id.is_empty())
}

fn setup() -> Server {
    let server = Server::start_on(DataDir::new());
    server.sql("CREATE TABLE t AS SELECT value AS v FROM generate_series(1, 1000) AS g(value)");
    server.sql("CREATE TABLE secret AS SELECT 1 AS x");
    server.sql("DELETE FROM t WHERE v <= 10");
    for user in ["alice", "bob"] {
        server.sql(&format!("CREATE USER {user} WITH PASSWORD '{user}-pw'"));
        server.sql(&format!("GRANT SELECT ON t TO {user}"));
    }
    server
}

#[test]
fn a_browser_logs_in_watches_a_long_statement_and_cancels_it() {
    let server = setup();
    let marker = "console-browser-long";
    let long = psql_bg(&server, "alice", "alice-pw", &long_statement(marker));
    assert!(
        eventually(100, || running_id(&server, marker).is_some()),
        "the long statement never ran"
    );
    let shots = artifacts();
    let _ = std::fs::remove_dir_all(&shots);
    let base = format!("http://127.0.0.1:{}", server.http_port);
    let out = python_ok(
        "console_browser.py",
        &[
            &base,
            "cirro",
            PASSWORD,
            marker,
            shots.to_str().expect("utf8"),
        ],
    );
    println!("{out}");
    let page_id = out
        .lines()
        .find_map(|l| l.strip_prefix("ok "))
        .expect("the page's statement id")
        .trim()
        .to_string();
    // The client saw its statement cancelled.
    let out = long.wait_with_output().expect("alice's psql");
    assert!(stderr(&out).contains("57014"), "{}", stderr(&out));
    for name in ["1-login-refused", "2-running", "3-cancelled"] {
        let shot = shots.join(format!("{name}.png"));
        let bytes = std::fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "{} is no PNG",
            shot.display()
        );
    }
    // The statement the page cancelled is the long one, and it ended so.
    assert_eq!(
        server.sql(&format!(
            "SELECT query_id, state FROM cirro.queries WHERE query LIKE '%{marker}%' \
             AND query NOT LIKE '%cirro.queries%'"
        )),
        format!("{page_id}|cancelled\n")
    );
}

#[test]
fn the_api_refuses_strangers_and_checks_privileges_as_sql_does() {
    let server = setup();
    // Without a login: the page redirects, the API refuses with 28000.
    let (status, _) = curl(&server, "/", &[]);
    assert_eq!(status, 303);
    let (status, body) = curl(&server, "/api/queries", &[]);
    assert_eq!((status, body.contains("28000")), (401, true), "{body}");
    let (status, body) = curl(&server, "/api/queries", &["-u", "cirro:wrong"]);
    assert_eq!((status, body.contains("28P01")), (401, true), "{body}");
    let (status, body) = curl(&server, "/api/queries", &["-u", "nobody:x"]);
    assert_eq!((status, body.contains("28P01")), (401, true), "{body}");
    // A wrong password at the login form: the login page again, no cookie.
    let out = Command::new("curl")
        .args(["-s", "-i", "--data", "user=cirro&password=nope"])
        .arg(format!("http://127.0.0.1:{}/login", server.http_port))
        .output()
        .expect("curl");
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.starts_with("HTTP/1.1 401"), "{page}");
    assert!(!page.to_lowercase().contains("set-cookie"), "{page}");
    // The right one: a session cookie that opens the console.
    let jar = tempfile::NamedTempFile::new().expect("cookie jar");
    let jar = jar.path().to_str().expect("utf8");
    let (status, _) = curl(
        &server,
        "/login",
        &[
            "-c",
            jar,
            "--data",
            &format!("user=cirro&password={PASSWORD}"),
        ],
    );
    assert_eq!(status, 303);
    let (status, page) = curl(&server, "/", &["-b", jar]);
    assert_eq!(status, 200);
    assert!(page.contains("Live statements"), "{page}");

    // alice's long statement; bob may see it (not its text, as in
    // PostgreSQL's pg_stat_activity) but not cancel it.
    let marker = "console-api-long";
    let long = psql_bg(&server, "alice", "alice-pw", &long_statement(marker));
    assert!(eventually(100, || running_id(&server, marker).is_some()));
    let id = running_id(&server, marker).expect("id");
    let (status, body) = curl(&server, "/api/queries", &["-u", "bob:bob-pw"]);
    assert_eq!(status, 200);
    assert!(!body.contains(marker), "{body}");
    assert!(
        body.contains(&format!("\"id\":{id},")) && body.contains("<insufficient privilege>"),
        "{body}"
    );
    let cancel = format!("/api/queries/{id}/cancel");
    let (status, body) = curl(
        &server,
        &cancel,
        &["-u", "bob:bob-pw", "-X", "POST", "-H", "x-cirro-console: 1"],
    );
    assert_eq!((status, body.contains("42501")), (403, true), "{body}");
    // An action without the console's header is refused (another site's
    // page could send the cookie, not the header).
    let (status, body) = curl(&server, &cancel, &["-b", jar, "-X", "POST"]);
    assert_eq!(status, 403, "{body}");
    assert!(
        running_id(&server, marker).is_some(),
        "refused cancels stopped it"
    );
    // The statement's own user may cancel it.
    let (status, body) = curl(
        &server,
        &cancel,
        &[
            "-u",
            "alice:alice-pw",
            "-X",
            "POST",
            "-H",
            "x-cirro-console: 1",
        ],
    );
    assert_eq!(status, 200, "{body}");
    let out = long.wait_with_output().expect("alice's psql");
    assert!(stderr(&out).contains("57014"), "{}", stderr(&out));
    let (status, body) = curl(
        &server,
        &cancel,
        &[
            "-u",
            "alice:alice-pw",
            "-X",
            "POST",
            "-H",
            "x-cirro-console: 1",
        ],
    );
    assert_eq!((status, body.contains("42704")), (404, true), "{body}");

    // Table storage: bob sees the tables he may SELECT from, with figures.
    let (status, body) = curl(&server, "/api/tables", &["-u", "bob:bob-pw"]);
    assert_eq!(status, 200, "{body}");
    let tables: serde_json::Value = serde_json::from_str(&body).expect("json");
    let names: Vec<&str> = tables
        .as_array()
        .expect("list")
        .iter()
        .map(|t| t["table"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["t"], "{body}");
    let t = &tables[0];
    assert_eq!(t["rows"], 990, "{body}");
    assert_eq!(t["deleted_rows"], 10, "{body}");
    assert!(t["files"].as_u64() >= Some(1), "{body}");
    assert!(
        t["files_with_deletion_vectors"].as_u64() >= Some(1),
        "{body}"
    );
    assert!(t["compression_ratio"].as_f64() > Some(0.0), "{body}");
    let (_, body) = curl(
        &server,
        "/api/tables",
        &["-u", &format!("cirro:{PASSWORD}")],
    );
    assert!(body.contains("\"secret\""), "{body}");

    // Metrics and history for a logged-in user.
    let (status, body) = curl(&server, "/metrics", &["-u", "bob:bob-pw"]);
    assert_eq!(status, 200);
    assert!(
        body.contains("# TYPE cirro_queries_running gauge"),
        "{body}"
    );
    assert!(
        body.contains("cirro_queries_ended_total{node=\"local\",state=\"cancelled\"}"),
        "{body}"
    );
    let (status, body) = curl(&server, "/metrics", &[]);
    assert_eq!(status, 401, "{body}");
    let (status, body) = curl(&server, "/api/history", &["-b", jar]);
    assert_eq!(status, 200);
    let history: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert!(
        !history["samples"].as_array().expect("samples").is_empty(),
        "{body}"
    );
    // Only the cluster's nodes may use /internal.
    let (status, _) = curl(&server, "/internal/queries", &["-b", jar]);
    assert_eq!(status, 403);
}

#[test]
fn cirro_admin_lists_and_cancels_statements() {
    let server = setup();
    let out = admin(&server, "cirro", PASSWORD, &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.contains("superuser: true"), "{status}");
    let out = admin(&server, "cirro", PASSWORD, &["nodes"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("local"));
    let out = admin(&server, "cirro", "wrong", &["status"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("28P01"), "{}", stderr(&out));
    // A reader that goes away (`| head`) ends the output, quietly.
    let mut gone = Command::new(cirro_bin())
        .args(["admin", "--url"])
        .arg(format!("http://127.0.0.1:{}", server.http_port))
        .args(["--json", "queries", "--all"])
        .env("CIRRO_PASSWORD", PASSWORD)
        .env_remove("CIRRO_USER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cirro admin");
    drop(gone.stdout.take());
    let out = gone.wait_with_output().expect("cirro admin");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));

    let marker = "console-admin-long";
    let long = psql_bg(&server, "alice", "alice-pw", &long_statement(marker));
    assert!(eventually(100, || running_id(&server, marker).is_some()));
    let id = running_id(&server, marker).expect("id");
    let out = admin(&server, "bob", "bob-pw", &["queries"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains(&id) && listed.contains("running"),
        "{listed}"
    );
    let out = admin(&server, "bob", "bob-pw", &["cancel", &id]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("42501"), "{}", stderr(&out));
    let out = admin(&server, "cirro", PASSWORD, &["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = long.wait_with_output().expect("alice's psql");
    assert!(stderr(&out).contains("57014"), "{}", stderr(&out));
    let out = admin(&server, "cirro", PASSWORD, &["queries", "--all", "--json"]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json of cirro admin");
    let ended = all
        .as_array()
        .expect("list")
        .iter()
        .find(|q| q["id"].to_string() == id)
        .expect("the cancelled statement");
    assert_eq!(ended["state"], "cancelled");
}

#[test]
fn the_console_serves_tls_with_the_servers_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            // An end-entity certificate (rustls refuses a CA one as a server's).
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(made.status.success(), "{}", stderr(&made));
    let server = Server::start_with(
        DataDir::new(),
        &[
            "--tls-cert",
            cert.to_str().expect("utf8"),
            "--tls-key",
            key.to_str().expect("utf8"),
        ],
    );
    let url = format!("https://127.0.0.1:{}", server.http_port);
    // Trusting the certificate: the login page over TLS.
    let out = Command::new("curl")
        .args(["-s", "-w", "%{http_code}", "-o", "/dev/null", "--cacert"])
        .arg(&cert)
        .arg(format!("{url}/login"))
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    // Plain HTTP on the TLS port gets nothing.
    let out = Command::new("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!("http://127.0.0.1:{}/login", server.http_port))
        .output()
        .expect("curl");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("password"));
    // cirro admin over TLS with the certificate, and refused without one.
    let out = Command::new(cirro_bin())
        .args(["admin", "--url", &url, "--ca-cert"])
        .arg(&cert)
        .arg("status")
        .env("CIRRO_PASSWORD", PASSWORD)
        .env_remove("CIRRO_USER")
        .output()
        .expect("cirro admin");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = Command::new(cirro_bin())
        .args(["admin", "--url", &url, "status"])
        .env("CIRRO_PASSWORD", PASSWORD)
        .env_remove("CIRRO_USER")
        .output()
        .expect("cirro admin");
    assert!(stderr(&out).contains("--ca-cert"), "{}", stderr(&out));
}
