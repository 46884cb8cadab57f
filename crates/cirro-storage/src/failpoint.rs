//! Crash points for the crash tests.
//!
//! When the environment variable `CIRRO_CRASH_POINT` names a point that the
//! process reaches, the process announces it on stderr (`CIRRO_CRASH_POINT <name>
//! reached`) and stops there, waiting to be killed. The crash tests use this to
//! SIGKILL the process at exactly known states (for example after the data files
//! of an INSERT are on disk but before its commit). Without the variable, a point
//! costs one cached environment lookup.

use std::sync::OnceLock;
use std::time::Duration;

const ENV: &str = "CIRRO_CRASH_POINT";

fn configured() -> Option<&'static (String, u64)> {
    static POINT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    POINT
        .get_or_init(|| {
            let value = std::env::var(ENV).ok()?;
            // `name` or `name:N` (stop on the N-th time the point is reached).
            match value.rsplit_once(':') {
                Some((name, count)) => Some((name.to_string(), count.parse().unwrap_or(1))),
                None => Some((value, 1)),
            }
        })
        .as_ref()
}

/// Stop here (forever) if the crash point `name` is configured and this is its
/// `hit`-th arrival (1-based).
pub fn reach(name: &str, hit: u64) {
    let Some((wanted, count)) = configured() else {
        return;
    };
    if wanted == name && *count == hit {
        eprintln!("{ENV} {name} reached");
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}
