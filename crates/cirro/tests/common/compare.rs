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
