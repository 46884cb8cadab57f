//! Transfers between accounts by several writer sessions at once, with reader
//! sessions checking the invariant (total balance, number of accounts) in
//! every snapshot they read. Writers move money with two-statement
//! transactions and with single UPDATE statements; a writer whose commit
//! conflicts gets 40001, changes nothing, and retries. At the end the balance
//! of every account equals the initial balance plus the transfers that were
//! reported committed: no update was lost or applied twice.
//!
//! The fast tier runs 10 seconds; the slow tier a minute.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{DataDir, Session, scalar};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ACCOUNTS: i64 = 12;
const INITIAL: i64 = 1000;
const WRITERS: usize = 3;
const READERS: usize = 2;

#[derive(Default)]
struct Tally {
    committed: Vec<(i64, i64, i64)>,
    conflicts: usize,
    reads: usize,
}

fn transfer(session: &mut Session, rng: &mut StdRng) -> Result<(i64, i64, i64), String> {
    let from = rng.random_range(0..ACCOUNTS);
    let mut to = rng.random_range(0..ACCOUNTS);
    if to == from {
        to = (to + 1) % ACCOUNTS;
    }
    let amount = rng.random_range(1..50);
    if rng.random_bool(0.5) {
        session.run("BEGIN")?;
        session.run(&format!(
            "UPDATE acct SET bal = bal - {amount} WHERE id = {from}"
        ))?;
        session.run(&format!(
            "UPDATE acct SET bal = bal + {amount} WHERE id = {to}"
        ))?;
        session.run("COMMIT")?;
    } else {
        session.run(&format!(
            "UPDATE acct SET bal = bal + CASE WHEN id = {from} THEN -{amount} ELSE {amount} END \
             WHERE id IN ({from}, {to})"
        ))?;
    }
    Ok((from, to, amount))
}

fn run_for(duration: Duration) {
    let data = Arc::new(DataDir::new());
    data.sql_ok("CREATE TABLE acct (id BIGINT NOT NULL, bal BIGINT NOT NULL)");
    data.sql_ok(&format!(
        "INSERT INTO acct SELECT value, {INITIAL} FROM generate_series(0, {}) AS g(value)",
        ACCOUNTS - 1
    ));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let (data, tally, stop) = (Arc::clone(&data), Arc::clone(&tally), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(w as u64 + 1);
            let mut session = Session::open(&data);
            while !stop.load(Ordering::Relaxed) {
                match transfer(&mut session, &mut rng) {
                    Ok(done) => tally.lock().expect("tally").committed.push(done),
                    Err(e) => {
                        assert!(e.contains("SQLSTATE 40001"), "writer {w}: {e}");
                        tally.lock().expect("tally").conflicts += 1;
                        // A script stops at its first error: start a new session.
                        session = Session::open(&data);
                    }
                }
            }
        }));
    }
    for _ in 0..READERS {
        let (data, tally, stop) = (Arc::clone(&data), Arc::clone(&tally), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut session = Session::open(&data);
            while !stop.load(Ordering::Relaxed) {
                let rows = session.rows("SELECT sum(bal), count(*) FROM acct");
                assert_eq!(
                    rows,
                    vec![format!("{},{ACCOUNTS}", ACCOUNTS * INITIAL)],
                    "a reader saw a snapshot that breaks the invariant"
                );
                tally.lock().expect("tally").reads += 1;
            }
        }));
    }
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a session thread failed");
    }
    let tally = tally.lock().expect("tally");
    eprintln!(
        "{:?}: {} transfers committed, {} conflicts (40001), {} snapshot reads",
        duration,
        tally.committed.len(),
        tally.conflicts,
        tally.reads
    );
    assert!(
        tally.conflicts > 0,
        "no conflict was raised: the test did not exercise 40001"
    );
    assert!(!tally.committed.is_empty(), "no transfer committed");
    assert!(tally.reads > 0);
    let mut expected = vec![INITIAL; ACCOUNTS as usize];
    for (from, to, amount) in &tally.committed {
        expected[*from as usize] -= amount;
        expected[*to as usize] += amount;
    }
    let actual = data.query_csv("SELECT bal FROM acct ORDER BY id");
    let actual: Vec<i64> = actual
        .lines()
        .skip(1)
        .map(|l| l.trim().parse().expect("balance"))
        .collect();
    assert_eq!(
        actual, expected,
        "balances do not match the committed transfers"
    );
    assert_eq!(
        scalar(&data, "SELECT sum(bal) FROM acct"),
        (ACCOUNTS * INITIAL).to_string()
    );
}

#[test]
fn transfers_keep_the_total_under_concurrent_writers_and_readers() {
    run_for(Duration::from_secs(10));
}

#[test]
#[ignore = "slow tier: one minute"]
fn transfers_keep_the_total_for_a_minute() {
    run_for(Duration::from_secs(60));
}
