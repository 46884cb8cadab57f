//! PostgreSQL 15 as the reference: generated statements (operators,
//! functions, casts, aggregates over every type Cirro has, with parameters
//! bound by psycopg from Python ints, floats, Decimals and strings) run on
//! a real PostgreSQL and on `cirro serve`; answers, column names and
//! SQLSTATE classes must agree, except for the constructs the committed
//! allowlist (`tests/interop/pg_allowlist.txt`) names with a reason. The
//! harness is `tests/interop/pg_differential.py`.
//!
//! Constructs with differences that are bugs not fixed yet are listed in
//! `tests/interop/pg_known_differences.txt`: reported and counted, they do
//! not fail the test, which holds every other construct to PostgreSQL.
//!
//! The fast tier runs 1,100 statements (seed 1: 20 or more per construct), the slow tier 4,400 more
//! (seeds 2–5); a self-test plants a difference and expects it found.

use std::path::PathBuf;
use std::process::Command;

use crate::common::postgres::Postgres;
use crate::common::server::{PASSWORD, Server, interop_dir, python};

fn allowlist() -> PathBuf {
    interop_dir().join("pg_allowlist.txt")
}

/// Constructs whose differences are open bugs (see the harness's `--known`):
/// reported, not failing, each removed once fixed.
fn known() -> PathBuf {
    interop_dir().join("pg_known_differences.txt")
}

/// Run the harness; (whether it passed, its report).
fn differential(
    server: &Server,
    postgres: &Postgres,
    seed: u64,
    count: u64,
    extra: &[&str],
) -> (bool, String) {
    let cirro = format!("{} password={PASSWORD}", server.conninfo("cirro"));
    let out = Command::new(python())
        .arg(interop_dir().join("pg_differential.py"))
        .args([
            &cirro,
            &postgres.dsn(),
            &seed.to_string(),
            &count.to_string(),
        ])
        .arg(allowlist())
        .arg("--known")
        .arg(known())
        .args(extra)
        .output()
        .expect("python");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), report)
}

fn run_seeds(seeds: &[u64], count: u64) {
    let postgres = Postgres::start();
    let server = Server::start();
    for &seed in seeds {
        let (passed, report) = differential(&server, &postgres, seed, count, &[]);
        println!("{report}");
        assert!(
            passed,
            "differences from PostgreSQL (seed {seed}):\n{report}"
        );
        assert!(
            report.contains(&format!("seed {seed}: statements {count},")),
            "{report}"
        );
    }
}

#[test]
fn statements_answer_as_postgresql_answers() {
    run_seeds(&[1], 1100);
}

#[test]
#[ignore = "slow tier: scripts/test.sh --slow"]
fn more_statements_answer_as_postgresql_answers() {
    run_seeds(&[2, 3, 4, 5], 1100);
}

#[test]
fn a_planted_difference_is_found() {
    let postgres = Postgres::start();
    let server = Server::start();
    let (passed, report) = differential(&server, &postgres, 7, 200, &["--plant", "int +"]);
    assert!(!passed, "the planted difference went unnoticed:\n{report}");
    assert!(report.contains("DIFFERENCE [int +]"), "{report}");
    // Nothing else differs in that run.
    assert!(
        report
            .lines()
            .filter(|l| l.starts_with("DIFFERENCE ["))
            .all(|l| l.starts_with("DIFFERENCE [int +]")),
        "{report}"
    );
}

/// The allowlist stays small: at most 30 constructs, each with a reason.
#[test]
fn the_allowlist_is_short_and_explained() {
    let text = std::fs::read_to_string(allowlist()).expect("allowlist");
    let entries: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(entries.len() <= 30, "{} entries", entries.len());
    for entry in entries {
        let (construct, reason) = entry.split_once(" | ").expect("construct | reason");
        assert!(
            !construct.trim().is_empty() && reason.trim().len() > 10,
            "{entry}"
        );
    }
}
