//! `cirro load tpch --sf 1` streams: its peak resident memory stays under 1 GB.
//! (In a test binary of its own, so that the children measured are its own.)

mod common;

const PEAK_RSS_BYTES_MAX: i64 = 1_000_000_000;

#[allow(unsafe_code)]
fn children_peak_rss_bytes() -> i64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    assert_eq!(rc, 0, "getrusage failed");
    usage.ru_maxrss * 1024
}

#[test]
fn tpch_sf1_load_stays_under_1gb_resident() {
    let data = common::DataDir::new();
    let status = data
        .command()
        .args(["load", "tpch", "--sf", "1"])
        .status()
        .expect("run load");
    assert!(status.success());
    let peak = children_peak_rss_bytes();
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
