//! Star Schema Benchmark: the 13 queries on `../shared/ssb/data-sf0.01` loaded
//! with `cirro load ssb --from-tbl`, and the generator's row counts and filter
//! factors at SF1 against the specification.

use crate::common::{DataDir, scalar, shared_dir};

const QUERIES: [&str; 13] = [
    "1.1", "1.2", "1.3", "2.1", "2.2", "2.3", "3.1", "3.2", "3.3", "3.4", "4.1", "4.2", "4.3",
];

#[test]
fn ssb_queries_match_reference_answers() {
    let shared = shared_dir();
    let data = DataDir::new();
    let tbl = shared.join("ssb/data-sf0.01");
    data.load(&["ssb", "--from-tbl", tbl.to_str().expect("utf8")]);
    assert_eq!(scalar(&data, "select count(*) from lineorder"), "60175");
    assert_eq!(scalar(&data, "select count(*) from dwdate"), "2556");
    let cases: Vec<_> = QUERIES
        .iter()
        .map(|q| {
            (
                format!("q{q}"),
                shared.join(format!("ssb/queries/q{q}.sql")),
                shared.join(format!("ssb/answers-sf0.01/q{q}.csv")),
            )
        })
        .collect();
    let failures = data.check_answers(&cases);
    assert!(
        failures.is_empty(),
        "SSB mismatches:\n{}",
        failures.join("\n")
    );
}

fn fraction(data: &DataDir, where_clause: &str, total: f64) -> f64 {
    let sql = format!(
        "select count(*) from lineorder, dwdate, customer, supplier, part \
         where lo_orderdate = d_datekey and lo_custkey = c_custkey and lo_suppkey = s_suppkey \
         and lo_partkey = p_partkey and {where_clause}"
    );
    scalar(data, &sql).parse::<f64>().expect("count") / total
}

#[test]
fn ssb_generator_follows_the_specification_at_sf1() {
    let data = DataDir::new();
    data.load(&["ssb", "--sf", "1"]);
    let count = |table: &str| {
        scalar(&data, &format!("select count(*) from {table}"))
            .parse::<f64>()
            .expect("count")
    };
    assert_eq!(count("customer"), 30_000.0);
    assert_eq!(count("part"), 200_000.0);
    assert_eq!(count("supplier"), 2_000.0);
    assert_eq!(count("dwdate"), 2_556.0);
    let lineorder = count("lineorder");
    assert!(
        (lineorder / 6_000_000.0 - 1.0).abs() < 0.01,
        "lineorder has {lineorder} rows"
    );

    // Filter factors from the SSB specification, section 3.
    let cases = [
        (
            "Q1.1",
            "d_year = 1993 and lo_discount between 1 and 3 and lo_quantity < 25",
            (1.0 / 7.0) * 0.5 * (3.0 / 11.0),
        ),
        (
            "Q2.1",
            "p_category = 'MFGR#12' and s_region = 'AMERICA'",
            (1.0 / 25.0) * (1.0 / 5.0),
        ),
        (
            "Q3.1",
            "c_region = 'ASIA' and s_region = 'ASIA' and d_year >= 1992 and d_year <= 1997",
            (1.0 / 5.0) * (1.0 / 5.0) * (6.0 / 7.0),
        ),
        (
            "Q4.1",
            "c_region = 'AMERICA' and s_region = 'AMERICA' and (p_mfgr = 'MFGR#1' or p_mfgr = 'MFGR#2')",
            (1.0 / 5.0) * (1.0 / 5.0) * (2.0 / 5.0),
        ),
    ];
    for (name, predicate, expected) in cases {
        let actual = fraction(&data, predicate, lineorder);
        assert!(
            (actual / expected - 1.0).abs() <= 0.10,
            "{name}: filter factor {actual:.5}, specification {expected:.5}"
        );
    }
}
