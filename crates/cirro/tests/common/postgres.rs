//! A real PostgreSQL 15 (Debian's `postgresql-15`, which `scripts/test.sh`
//! installs), started for a test: initdb and pg_ctl run as the `postgres`
//! user on a free port of 127.0.0.1, in a temporary folder; stopped on drop.
//! A test that needs it fails when it cannot start: never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian installs PostgreSQL 15's server programs.
const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

pub struct Postgres {
    dir: tempfile::TempDir,
    pub port: u16,
}

fn bin(name: &str) -> PathBuf {
    Path::new(PG_BIN).join(name)
}

/// Run `program args` as the postgres user; panics with its output if it fails.
fn as_postgres(program: &Path, args: &[&str]) {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .output()
        .expect("run runuser");
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl Postgres {
    pub fn start() -> Self {
        assert!(
            bin("postgres").exists(),
            "PostgreSQL 15 is missing ({PG_BIN}): apt-get install postgresql-15 (scripts/test.sh does)"
        );
        let dir = tempfile::Builder::new()
            .prefix("cirro-postgres-")
            .tempdir()
            .expect("tempdir");
        let status = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.path())
            .status()
            .expect("chown");
        assert!(status.success(), "chown the PostgreSQL folder");
        let data = dir.path().join("data");
        let data = data.to_str().expect("utf8");
        as_postgres(
            &bin("initdb"),
            &[
                "-D",
                data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ],
        );
        let port = free_port();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c TimeZone=UTC \
             -c DateStyle=ISO,MDY -c extra_float_digits=1",
            dir.path().display()
        );
        let log = dir.path().join("log");
        as_postgres(
            &bin("pg_ctl"),
            &[
                "-D",
                data,
                "-o",
                &options,
                "-l",
                log.to_str().expect("utf8"),
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
        Self { dir, port }
    }

    /// A libpq connection string for database `postgres`.
    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable",
            self.port
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin("pg_ctl"))
            .args([
                "-D",
                data.to_str().unwrap_or_default(),
                "-m",
                "immediate",
                "stop",
            ])
            .output();
    }
}
