//! Differential test: the same random sequence of INSERT, UPDATE, DELETE and
//! MERGE runs against a Cirro table and a DuckDB table, and the full contents
//! are compared after every statement. Several fixed seeds; Cirro runs
//! OPTIMIZE now and then as well (it must not change the contents).

use crate::common::duckdb::DuckDb;
use crate::common::{DataDir, Reply, Session};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const STATEMENTS: usize = 200;
const SEEDS: [u64; 3] = [7, 1234, 99_991];

fn value_list(rng: &mut StdRng, ids: &[i64]) -> String {
    ids.iter()
        .map(|id| {
            let a = if rng.random_bool(0.1) {
                "NULL".to_string()
            } else {
                rng.random_range(-50..500).to_string()
            };
            let b = match rng.random_range(0..4) {
                0 => "NULL".to_string(),
                n => format!("'s{}'", n * 10 + rng.random_range(0..5)),
            };
            let c = format!(
                "{}.{:02}",
                rng.random_range(0..1000),
                rng.random_range(0..100)
            );
            format!("({id}, {a}, {b}, {c})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn condition(rng: &mut StdRng) -> String {
    match rng.random_range(0..7) {
        0 => format!(
            "id % {} = {}",
            rng.random_range(2..9),
            rng.random_range(0..2)
        ),
        1 => format!("a > {}", rng.random_range(0..450)),
        2 => "b IS NULL".to_string(),
        3 => format!(
            "b = 's{}'",
            rng.random_range(1..4) * 10 + rng.random_range(0..5)
        ),
        4 => format!(
            "id BETWEEN {} AND {}",
            rng.random_range(0..100),
            rng.random_range(100..200)
        ),
        5 => format!(
            "id IN (SELECT id FROM t WHERE c < {})",
            rng.random_range(0..1000)
        ),
        _ => format!("a IS NULL OR a < {}", rng.random_range(0..100)),
    }
}

/// One random statement, valid for both engines.
fn statement(rng: &mut StdRng) -> String {
    match rng.random_range(0..10) {
        0..=2 => {
            let n = rng.random_range(1..30);
            let ids: Vec<i64> = (0..n).map(|_| rng.random_range(0..200)).collect();
            format!("INSERT INTO t VALUES {}", value_list(rng, &ids))
        }
        3..=5 => {
            let set = match rng.random_range(0..4) {
                0 => format!("a = a + {}", rng.random_range(1..10)),
                1 => "a = NULL".to_string(),
                2 => format!("b = 's{}', c = c * 2", rng.random_range(10..50)),
                _ => "b = CASE WHEN a > 100 THEN 'big' ELSE b END".to_string(),
            };
            format!("UPDATE t SET {set} WHERE {}", condition(rng))
        }
        6..=7 => format!("DELETE FROM t WHERE {}", condition(rng)),
        _ => {
            // distinct source ids: no target row matches twice
            let mut ids: Vec<i64> = (0..rng.random_range(1..15))
                .map(|_| rng.random_range(0..220))
                .collect();
            ids.sort_unstable();
            ids.dedup();
            let values = value_list(rng, &ids);
            let cutoff = rng.random_range(0..400);
            format!(
                "MERGE INTO t USING (SELECT * FROM (VALUES {values}) AS v(id, a, b, c)) AS s ON t.id = s.id \
                 WHEN MATCHED AND s.a < {cutoff} THEN DELETE \
                 WHEN MATCHED THEN UPDATE SET a = s.a, b = s.b \
                 WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.a, s.b, s.c)"
            )
        }
    }
}

const CONTENTS: &str = "SELECT id, a, b, c FROM t ORDER BY id, a NULLS FIRST, b NULLS FIRST, c";

#[test]
fn random_dml_matches_duckdb_after_every_statement() {
    for seed in SEEDS {
        let data = DataDir::new();
        let mut cirro = Session::open(&data);
        let mut duck = DuckDb::start();
        let create = "CREATE TABLE t (id INT NOT NULL, a INT, b VARCHAR, c DECIMAL(10,2))";
        cirro.ok(create);
        duck.run(create);
        let mut rng = StdRng::seed_from_u64(seed);
        for step in 0..STATEMENTS {
            let sql = statement(&mut rng);
            let tag = cirro
                .run(&sql)
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {sql}: {e}"));
            assert!(matches!(tag, Reply::Tag(_)), "{sql} gave {tag:?}");
            duck.run(&sql);
            if step % 50 == 49 {
                cirro.ok("OPTIMIZE t");
            }
            let ours = cirro.rows(CONTENTS);
            let theirs = duck.run(CONTENTS);
            assert!(
                ours == theirs,
                "seed {seed}, step {step}: contents differ after\n{sql}\ncirro ({} rows) vs duckdb ({} rows)",
                ours.len(),
                theirs.len()
            );
        }
        assert!(!cirro.rows("SELECT count(*) FROM t").is_empty());
    }
}
