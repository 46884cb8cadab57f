//! GPU operators end to end (`SET gpu`, crate `cirro-gpu`) on the Vulkan
//! device present (lavapipe in CI): TPC-H SF0.1 and SSB SF0.01 give the
//! reference answers with every operator that has a GPU twin forced onto
//! the device, EXPLAIN names the twins and EXPLAIN ANALYZE counts their
//! kernels; with the Vulkan loader pointed at nothing the same queries give
//! the same answers on the CPU. Statements that oversubscribe the device's
//! memory take turns, as `cirro.queries.gpu` shows.

use crate::common;

use std::path::Path;

use crate::common::compare::{compare, is_ordered};
use crate::common::{DataDir, shared_dir};

/// The sum of the `gpu_dispatches=N` counts in an EXPLAIN ANALYZE.
fn dispatches(plan: &str) -> u64 {
    metric(plan, "gpu_dispatches")
}

/// The sum of the `<name>=N` counts in an EXPLAIN ANALYZE.
fn metric(plan: &str, name: &str) -> u64 {
    plan.match_indices(&format!("{name}="))
        .filter_map(|(at, m)| {
            plan[at + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// `cirro sql -f` of `sets` then the query file, with no Vulkan device
/// when `no_device`.
fn run(data: &DataDir, sets: &str, query: &Path, no_device: bool) -> Result<String, String> {
    let text = std::fs::read_to_string(query).expect("query file");
    let dir = data.path().join("gpu-queries");
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join(query.file_name().expect("name"));
    std::fs::write(&file, format!("{sets};\n{text}")).expect("write query");
    let mut command = data.command();
    command
        .args(["sql", "--format", "csv", "--delimiter", "|", "-f"])
        .arg(&file);
    if no_device {
        // The loader finds no driver: no device, everything on the CPU.
        command.env("VK_ICD_FILENAMES", "/nonexistent/icd.json");
    }
    let out = command.output().expect("run cirro");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Each `(query, answer)` with `sets` first; the failures.
fn check(data: &DataDir, sets: &str, cases: &[(String, String)], no_device: bool) -> Vec<String> {
    let shared = shared_dir();
    let mut failures = Vec::new();
    for (query, answer) in cases {
        let path = shared.join(query);
        let expected = std::fs::read_to_string(shared.join(answer)).expect("answer");
        let text = std::fs::read_to_string(&path).expect("query");
        match run(data, sets, &path, no_device) {
            Err(e) => failures.push(format!("{sets} (no device: {no_device}): {query}: {e}")),
            Ok(actual) => {
                if let Err(diff) = compare(&actual, &expected, is_ordered(&text)) {
                    failures.push(format!("{sets} (no device: {no_device}): {query}: {diff}"));
                }
            }
        }
    }
    failures
}

fn tpch_cases() -> Vec<(String, String)> {
    (1..=22)
        .map(|q| {
            (
                format!("tpch/queries/q{q:02}.sql"),
                format!("tpch/answers/sf0.1/q{q:02}.csv"),
            )
        })
        .collect()
}

fn ssb_cases() -> Vec<(String, String)> {
    let mut names: Vec<String> = std::fs::read_dir(shared_dir().join("ssb/queries"))
        .expect("ssb queries")
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".sql").map(str::to_string)
        })
        .collect();
    names.sort();
    assert_eq!(names.len(), 13, "{names:?}");
    names
        .into_iter()
        .map(|n| {
            (
                format!("ssb/queries/{n}.sql"),
                format!("ssb/answers-sf0.01/{n}.csv"),
            )
        })
        .collect()
}

#[test]
fn tpch_and_ssb_answers_with_gpu_forced_and_without_a_device() {
    let tpch = DataDir::new();
    tpch.load(&["tpch", "--sf", "0.1"]);
    let ssb = DataDir::new();
    let tbl = shared_dir().join("ssb/data-sf0.01");
    ssb.load(&["ssb", "--from-tbl", tbl.to_str().expect("utf8")]);

    let mut failures = check(&tpch, "SET gpu = force", &tpch_cases(), false);
    failures.extend(check(&ssb, "SET gpu = force", &ssb_cases(), false));
    failures.extend(check(&tpch, "SET gpu = force", &tpch_cases(), true));
    failures.extend(check(&ssb, "SET gpu = force", &ssb_cases(), true));
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Where a twin applies, EXPLAIN shows it and its kernels ran; without a
    // device, or with `SET gpu = off`, the plan has none.
    for (data, query) in [
        (&tpch, "tpch/queries/q06.sql"),
        (&tpch, "tpch/queries/q19.sql"),
        (&ssb, "ssb/queries/q1.1.sql"),
        (&ssb, "ssb/queries/q3.3.sql"),
    ] {
        let text = std::fs::read_to_string(shared_dir().join(query)).expect("query");
        let plan = data.sql_ok(&format!("SET gpu = force; EXPLAIN ANALYZE {text}"));
        assert!(
            plan.contains("GpuFilterExec"),
            "{query}: no GPU operator\n{plan}"
        );
        assert!(dispatches(&plan) > 0, "{query}: no kernel ran\n{plan}");
        let off = data.sql_ok(&format!("SET gpu = off; EXPLAIN {text}"));
        assert!(!off.contains("Gpu"), "{query}\n{off}");
        let file = data.path().join("explain.sql");
        std::fs::write(&file, format!("SET gpu = force; EXPLAIN {text}")).expect("write");
        let out = data
            .command()
            .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
            .args(["sql", "-f"])
            .arg(&file)
            .output()
            .expect("run");
        let plan = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !plan.contains("Gpu"),
            "{query}\n{plan}"
        );
    }
    // Sorts and top-N (Q18's LIMIT 100), hash aggregations (Q1's sums and
    // averages of decimals by two text keys, SSB's sums of products by
    // year and brand) and hash joins (Q4's semi join, Q13's outer join with
    // a residual filter, SSB's star joins) run on the device too.
    for (data, query, operators) in [
        (
            &tpch,
            "tpch/queries/q01.sql",
            &["GpuSortExec", "GpuAggregateExec"][..],
        ),
        (
            &tpch,
            "tpch/queries/q04.sql",
            &["GpuSortExec", "GpuHashJoinExec"][..],
        ),
        (&tpch, "tpch/queries/q13.sql", &["GpuHashJoinExec"][..]),
        (&tpch, "tpch/queries/q18.sql", &["GpuSortExec"][..]),
        (&ssb, "ssb/queries/q1.1.sql", &["GpuAggregateExec"][..]),
        (
            &ssb,
            "ssb/queries/q2.1.sql",
            &["GpuAggregateExec", "GpuHashJoinExec"][..],
        ),
    ] {
        let text = std::fs::read_to_string(shared_dir().join(query)).expect("query");
        let plan = data.sql_ok(&format!("SET gpu = force; EXPLAIN ANALYZE {text}"));
        for operator in operators {
            assert!(plan.contains(operator), "{query}: no {operator}\n{plan}");
        }
        assert!(
            metric(&plan, "cpu_blocks") == 0 && dispatches(&plan) > 0,
            "{query}: no kernel ran, or a block fell back to the CPU\n{plan}"
        );
    }
    // The device's column cache over the hot-data tier: run again, SSB
    // Q1.1 finds every column its GPU filters read on the device (a scan
    // under a GPU filter hands it the tier's batches as they are: the same
    // buffers every query).
    let text = std::fs::read_to_string(shared_dir().join("ssb/queries/q1.1.sql")).expect("query");
    let q = text.trim().trim_end_matches(';');
    let out = ssb.query_csv(&format!(
        "SET gpu = force; {q}; SELECT 'first', cache_hits, cache_misses FROM cirro.gpu; \
         {q}; SELECT 'second', cache_hits, cache_misses FROM cirro.gpu"
    ));
    let counts = |tag: &str| -> (u64, u64) {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{tag}|")))
            .unwrap_or_else(|| panic!("no {tag} counters in\n{out}"));
        let n: Vec<u64> = line
            .split('|')
            .skip(1)
            .map(|v| v.parse().expect("count"))
            .collect();
        (n[0], n[1])
    };
    let (hits, misses) = counts("first");
    let (hits_again, misses_again) = counts("second");
    assert!(misses > 0, "the first run loads its columns\n{out}");
    assert_eq!(
        misses_again, misses,
        "the second run finds every column\n{out}"
    );
    assert!(hits_again > hits, "{out}");
}

/// The GPU sort's rows on the host count against the query's memory: under
/// a limit that cannot hold its input it hands the rows to the CPU's sort
/// (which needs only the top rows here), with the same answer.
#[test]
fn a_gpu_sort_over_its_memory_goes_to_the_cpu_sort() {
    let data = DataDir::new();
    data.sql_ok(
        "CREATE TABLE s AS SELECT value * 7919 % 2000003 AS k, value AS v \
         FROM generate_series(1, 2000000)",
    );
    let query = "SELECT k, v FROM s ORDER BY k DESC, v LIMIT 5";
    let expected = common::answer_after(&data, "SET gpu = off", query);
    let analyzed =
        |sets: &str| data.sql_ok(&format!("SET gpu = force; {sets}; EXPLAIN ANALYZE {query}"));
    let free = analyzed("SET memory_limit = '1GB'");
    assert!(free.contains("GpuSortExec"), "{free}");
    assert_eq!(metric(&free, "cpu_blocks"), 0, "{free}");
    // 2 M rows of two BIGINTs: 32 MB read, more than 16 MB holds.
    let tight = analyzed("SET memory_limit = '16MB'");
    assert!(tight.contains("GpuSortExec"), "{tight}");
    assert!(metric(&tight, "cpu_blocks") >= 1, "{tight}");
    assert_eq!(
        common::answer_after(&data, "SET gpu = force; SET memory_limit = '16MB'", query),
        expected
    );
}

/// Without a desktop session, opening the device prints nothing (Mesa's
/// `device_select` layer probed Wayland and printed an "error:" line).
#[test]
fn the_device_opens_quietly_without_a_desktop_session() {
    let data = DataDir::new();
    let out = data
        .command()
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("DISPLAY")
        .env_remove("NODEVICE_SELECT")
        .args(["sql", "-c", "SET gpu = force"])
        .args([
            "-c",
            "EXPLAIN ANALYZE SELECT count(*) FROM (SELECT value FROM generate_series(1, 100000) \
             AS g(value) ORDER BY value DESC) AS t",
        ])
        .output()
        .expect("run cirro");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Gpu"), "the device did not open: {stdout}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn the_gpu_setting_takes_off_on_and_force() {
    let data = DataDir::new();
    assert_eq!(
        common::answer_after(&data, "SET gpu = FORCE", "SHOW gpu")[1],
        "force"
    );
    assert_eq!(
        common::answer_after(&data, "SET gpu = off; RESET gpu", "SHOW gpu")[1],
        "on"
    );
    let err = data.sql_err("SET gpu = always");
    assert!(
        err.contains("22023") && err.contains("off, on or force"),
        "{err}"
    );
}

#[test]
fn queries_that_oversubscribe_the_device_take_turns_in_cirro_queries() {
    use common::server::{PASSWORD, Server};
    use std::process::{Command, Stdio};
    // 256 kB of device memory: one forced GPU filter's blocks fill it, so
    // two at once cannot share the device.
    let server = Server::start_with(DataDir::new(), &["--gpu-memory", "256kB"]);
    server
        .sql("CREATE TABLE big AS SELECT value AS a FROM generate_series(1, 3000000) AS g(value)");
    let query = "SET gpu = force; SELECT count(*) FROM big WHERE a < 1500000 OR a > 2900000";
    let clients: Vec<_> = (0..2)
        .map(|_| {
            Command::new("psql")
                .arg(server.conninfo("cirro"))
                .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", query])
                .env("PGPASSWORD", PASSWORD)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("psql")
        })
        .collect();
    // Watch cirro.queries while they run (bounded: 400 looks, 20 s).
    let watch = "SELECT coalesce(gpu, '-') FROM cirro.queries \
                 WHERE query LIKE '%FROM big WHERE%' AND query NOT LIKE '%cirro.queries%' \
                 AND state = 'running'";
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    for _ in 0..400 {
        for line in server.sql(watch).lines() {
            seen.insert(line.to_string());
        }
        if seen.contains("waiting") || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for client in clients {
        let out = client.wait_with_output().expect("psql");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // psql prints the SET's tag, then the count.
        assert_eq!(
            text.lines().last(),
            Some("1599999"),
            "both finish with the answer"
        );
    }
    assert!(
        seen.contains("waiting"),
        "no statement waited for the device: {seen:?}"
    );
    let ended = server.sql(
        "SELECT DISTINCT gpu FROM cirro.queries WHERE query LIKE '%FROM big WHERE%' \
         AND query NOT LIKE '%cirro.queries%' AND state = 'finished'",
    );
    assert_eq!(ended.trim(), "used");
    // `cirro.gpu`: the device, its budget and policy, what it did; nothing
    // runs or waits any more.
    let row = server.sql(
        "SELECT device IS NOT NULL, memory_budget, policy, dispatches > 0, \
         bytes_to_device > 0, running, waiting FROM cirro.gpu",
    );
    assert_eq!(row.trim(), "t|262144|cdr|t|t|0|0", "{row}");
}
