//! A running `cirro serve` for the tests that drive it with real clients
//! (psql, psycopg, JDBC, ADBC), and the Python checks in `tests/interop`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use super::{DataDir, cirro_bin};

pub const PASSWORD: &str = "s3cret-Pw";

/// Start `cirro serve` on `data` with `args` and CIRRO_PASSWORD=`password`;
/// returns the process, its PostgreSQL and Flight SQL ports and the line
/// announcing the PostgreSQL port.
pub fn spawn_serve(data: &Path, args: &[&str], password: &str) -> (Child, u16, u16, String) {
    spawn_serve_with(data, args, password, &[], Stdio::null())
}

/// [`spawn_serve`] with extra environment variables and the server's stderr
/// going to `stderr`.
pub fn spawn_serve_with(
    data: &Path,
    args: &[&str],
    password: &str,
    envs: &[(&str, &str)],
    stderr: Stdio,
) -> (Child, u16, u16, String) {
    let (child, pg_port, flight_port, line, _) =
        spawn_serve_console(data, args, password, envs, stderr);
    (child, pg_port, flight_port, line)
}

/// [`spawn_serve_with`], also returning the web console's port.
pub fn spawn_serve_console(
    data: &Path,
    args: &[&str],
    password: &str,
    envs: &[(&str, &str)],
    stderr: Stdio,
) -> (Child, u16, u16, String, u16) {
    let mut child = Command::new(cirro_bin())
        .args(["--data", data.to_str().expect("utf8 path")])
        .args([
            "--threads",
            "2",
            "serve",
            "--pg-port",
            "0",
            "--flight-port",
            "0",
            "--http-port",
            "0",
        ])
        .args(args)
        .env("CIRRO_PASSWORD", password)
        .env_remove("CIRRO_USER")
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start cirro serve");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut port_in = |expected: &str| {
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read the listening line");
        assert!(line.contains(expected), "{line:?}");
        let port = line
            .split_whitespace()
            .find_map(|w| {
                w.trim_end_matches('/')
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
            })
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        (port, line)
    };
    let (pg_port, line) = port_in("PostgreSQL");
    let (flight_port, _) = port_in("Flight SQL");
    let (http_port, _) = port_in("web console");
    (child, pg_port, flight_port, line, http_port)
}

/// A running `cirro serve`, killed on drop.
pub struct Server {
    pub child: Child,
    pub port: u16,
    pub flight_port: u16,
    /// The web console's port (plain HTTP).
    pub http_port: u16,
    pub data: DataDir,
}

impl Server {
    pub fn start() -> Self {
        Self::start_on(DataDir::new())
    }

    pub fn start_on(data: DataDir) -> Self {
        Self::start_with(data, &[])
    }

    /// A server on `data` started with the extra flags `args`.
    pub fn start_with(data: DataDir, args: &[&str]) -> Self {
        let (child, port, flight_port, _, http_port) =
            spawn_serve_console(data.path(), args, PASSWORD, &[], Stdio::null());
        Server {
            child,
            port,
            flight_port,
            http_port,
            data,
        }
    }

    /// A tokio-postgres client as user `cirro` (its connection runs on the
    /// current runtime).
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(
            &format!("{} password={PASSWORD}", self.conninfo("cirro")),
            tokio_postgres::NoTls,
        )
        .await
        .expect("connect");
        tokio::spawn(connection);
        client
    }

    pub fn conninfo(&self, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname=cirro sslmode=disable",
            self.port
        )
    }

    /// psql with `args`, as `user` with `password`.
    pub fn psql(&self, user: &str, password: &str, args: &[&str]) -> Output {
        Command::new("psql")
            .arg(self.conninfo(user))
            .args(["-X", "-v", "ON_ERROR_STOP=1"])
            .args(args)
            .env("PGPASSWORD", password)
            .env("PGCONNECT_TIMEOUT", "10")
            .output()
            .expect("run psql (apt-get install postgresql-client)")
    }

    /// Run SQL through psql as the superuser; stdout on success.
    pub fn sql(&self, sql: &str) -> String {
        self.psql_ok(&["-At", "-c", sql])
    }

    /// Run SQL that must fail as the superuser; the verbose error (with its
    /// SQLSTATE).
    pub fn sql_err(&self, sql: &str) -> String {
        let out = self.psql("cirro", PASSWORD, &["-v", "VERBOSITY=verbose", "-c", sql]);
        assert!(!out.status.success(), "{sql} succeeded");
        stderr(&out)
    }

    /// psql as the superuser with `args`; stdout on success.
    pub fn psql_ok(&self, args: &[&str]) -> String {
        let out = self.psql("cirro", PASSWORD, args);
        let sql = args.join(" ");
        assert!(
            out.status.success(),
            "psql -c {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run one check of `pg_client.py` against this server; it must pass.
    pub fn python_check(&self, check: &str) {
        let dsn = format!("{} password={PASSWORD}", self.conninfo("cirro"));
        python_ok("pg_client.py", &[&dsn, check]);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `script` of `tests/interop` with `args`; it must succeed and print a
/// line starting with "ok". Returns what it printed.
pub fn python_ok(script: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg(interop_dir().join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.lines().any(|l| l.starts_with("ok")),
        "{script} {args:?} failed:\n{stdout}\n{}",
        stderr(&out)
    );
    stdout
}

pub fn python() -> PathBuf {
    std::env::var_os("CIRRO_TEST_PYTHON")
        .map(PathBuf::from)
        .expect("CIRRO_TEST_PYTHON is not set: run the tests with scripts/test.sh")
}

pub fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
