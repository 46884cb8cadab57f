//! Comparing query results with reference answers, by the rules of
//! `../shared/tpch/README.md`: header row ignored; text compared exactly after
//! trimming; numbers within 1e-6 relative or 1e-5 absolute; row order compared
//! only where the query has ORDER BY.

/// Parse `|`-separated CSV text (header first) into rows of cells, header dropped.
pub fn parse(text: &str) -> Vec<Vec<String>> {
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(b'|')
        .has_headers(true)
        .flexible(true)
        .from_reader(text.as_bytes());
    reader
        .records()
        .map(|r| {
            r.expect("csv row")
                .iter()
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

fn cells_match(actual: &str, expected: &str) -> bool {
    if actual == expected {
        return true;
    }
    match (actual.parse::<f64>(), expected.parse::<f64>()) {
        (Ok(a), Ok(e)) => {
            let diff = (a - e).abs();
            diff <= 1e-5 || diff <= 1e-6 * e.abs().max(a.abs())
        }
        _ => false,
    }
}

fn row_matches(actual: &[String], expected: &[String]) -> bool {
    actual.len() == expected.len() && actual.iter().zip(expected).all(|(a, e)| cells_match(a, e))
}

/// Compare `actual` with `expected` (both CSV text with a header row).
/// Returns a description of the first difference.
pub fn compare(actual: &str, expected: &str, ordered: bool) -> Result<(), String> {
    let mut actual_rows = parse(actual);
    let mut expected_rows = parse(expected);
    if actual_rows.len() != expected_rows.len() {
        return Err(format!(
            "{} rows, expected {}",
            actual_rows.len(),
            expected_rows.len()
        ));
    }
    if !ordered {
        actual_rows.sort();
        expected_rows.sort();
    }
    for (i, (a, e)) in actual_rows.iter().zip(&expected_rows).enumerate() {
        if !row_matches(a, e) {
            return Err(format!("row {i}: got {a:?}, expected {e:?}"));
        }
    }
    Ok(())
}

/// Whether the query text orders its result.
pub fn is_ordered(query: &str) -> bool {
    query
        .to_ascii_lowercase()
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .any(|w| w == ["order", "by"])
}

/// `clients` clients at once, each running the TPC-H SF1 `queries` in its
/// own order (client `c` starts at the `c`-th) through `psql(client, sql)`
/// (psql's `-A -F | -P footer=off` output); what failed or answered other
/// than the reference, one line each.
pub fn tpch_sf1_clients(
    clients: usize,
    queries: &[u32],
    psql: impl Fn(usize, &str) -> std::process::Output + Sync,
) -> Vec<String> {
    let shared = super::shared_dir();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let (shared, psql) = (&shared, &psql);
                scope.spawn(move || {
                    let mut failures = Vec::new();
                    for i in 0..queries.len() {
                        let q = queries[(c + i) % queries.len()];
                        let query = std::fs::read_to_string(
                            shared.join(format!("tpch/queries/q{q:02}.sql")),
                        )
                        .expect("query");
                        let expected = std::fs::read_to_string(
                            shared.join(format!("tpch/answers/sf1/q{q:02}.csv")),
                        )
                        .expect("answer");
                        let out = psql(c, query.trim());
                        if !out.status.success() {
                            failures.push(format!(
                                "client {c} q{q:02}: {}",
                                String::from_utf8_lossy(&out.stderr)
                            ));
                        } else if let Err(diff) = compare(
                            &String::from_utf8_lossy(&out.stdout),
                            &expected,
                            is_ordered(&query),
                        ) {
                            failures.push(format!("client {c} q{q:02}: {diff}"));
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client"))
            .collect()
    })
}
