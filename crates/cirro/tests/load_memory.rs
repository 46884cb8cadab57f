//! `cirro load tpch --sf 1` streams: its peak resident memory stays under 1 GB.
//! (Measured on that one child, through `wait4`: the test binary runs other
//! tests' children beside it.)

use crate::common;

const PEAK_RSS_BYTES_MAX: i64 = 1_000_000_000;

/// Waits for the child `pid`; its exit status and its own peak resident
/// memory (with any children it waited for), in bytes.
#[allow(unsafe_code)]
fn wait_with_peak_rss(pid: u32) -> (i32, i64) {
    let mut status: libc::c_int = 0;
    // SAFETY: wait4 only writes into the status and the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid as libc::pid_t, "wait4 failed");
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    (code, usage.ru_maxrss * 1024)
}

#[test]
fn tpch_sf1_load_stays_under_1gb_resident() {
    let data = common::DataDir::new();
    let child = data
        .command()
        .args(["load", "tpch", "--sf", "1"])
        .spawn()
        .expect("run load");
    // (Reaped here: `child` is not waited for again.)
    let (code, peak) = wait_with_peak_rss(child.id());
    assert_eq!(code, 0, "cirro load tpch --sf 1 failed");
    eprintln!(
        "peak resident memory of `cirro load tpch --sf 1`: {} MB",
        peak / 1_000_000
    );
    assert!(
        peak > 10_000_000,
        "implausible peak {peak}: was the load measured?"
    );
    assert!(
        peak < PEAK_RSS_BYTES_MAX,
        "peak resident memory {} MB ≥ 1 GB",
        peak / 1_000_000
    );
    assert_eq!(
        common::scalar(&data, "SELECT count(*) FROM lineitem"),
        "6001215"
    );
}
