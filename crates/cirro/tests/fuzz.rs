//! SQL fuzzing over the PostgreSQL wire: random statements (expressions of
//! every column type and operator, aggregates, subqueries, casts, deep
//! nesting and long operator chains up to 10x the limits in
//! `cirro_common::limits`) against one `cirro serve`, with fixed seeds.
//!
//! Every statement must answer rows or a clean error: never an internal
//! error (XX000), a panic (the server's stderr is read) or a lost connection
//! (an abort). What the fuzzer once found is kept in [`REGRESSIONS`].
//!
//! The self-test switches the nesting limit off
//! (`CIRRO_UNSAFE_NESTING_DEPTH_MAX`) and must see the server die on the
//! fuzzer's deep statements: the fuzzer can find the crash the limit prevents.

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::DataDir;
use crate::common::server::{PASSWORD, spawn_serve_with};
use crate::common::sqlgen::{Draw, Ty};
use cirro_common::limits::{
    EXPRESSION_CHAIN_LENGTH_MAX, NESTING_DEPTH_OVERRIDE_ENV, STATEMENT_BYTES_MAX,
    STATEMENT_NESTING_DEPTH_MAX,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEEDS: [u64; 5] = [11, 23, 37, 41, 53];
const STATEMENTS_PER_SEED: usize = 1_000;
/// The whole run must finish within this (it takes well under a minute).
const RUN_SECONDS_MAX: u64 = 400;
/// Statements the self-test may send before the server must have died.
const SELF_TEST_STATEMENTS_MAX: usize = 100;
/// The deepest nesting the fuzzer sends: about as deep as a statement under
/// `STATEMENT_BYTES_MAX` can be (2 bytes a level for parentheses), so past
/// 10x every stack the limit protects (a 256 MiB statement thread overflows
/// near 500,000 parentheses without the limit).
const DEPTH_MAX: usize = STATEMENT_BYTES_MAX / 8;

/// Statements the fuzzer found failing once (each fixed), run first.
const REGRESSIONS: &[&str] = &[
    // A NUMERIC value arrow-pg cannot encode: its row iterator repeated the
    // error forever; the statement hung and the server's memory grew.
    "SELECT NULLIF(n + 9223372036854775807, COALESCE(s + 32767 % extract(year FROM dt) / floor(sqrt(abs(NULL))), (floor(1.005)))) FROM f",
    "SELECT CAST(922337203685477.25 AS DECIMAL(36,15))",
    // Nested subqueries plan in time exponential in their depth (54001 past 16).
    "SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT (SELECT i)))))))))))))))))))) FROM f",
];

/// The table every statement reads: every column type, NULLs and extremes.
const SETUP: &[&str] = &[
    "CREATE TABLE f (s SMALLINT, i INT, b BIGINT, d DOUBLE, n DECIMAL(12,2), t VARCHAR, o BOOLEAN, dt DATE, ts TIMESTAMP)",
    "INSERT INTO f VALUES \
     (1, 1, 1, 1.5, 1.25, 'a', true, DATE '2024-01-01', TIMESTAMP '2024-01-01 10:00:00'), \
     (-1, -7, -9, -2.5, -3.75, 'Bb', false, DATE '1999-12-31', TIMESTAMP '1999-12-31 23:59:59'), \
     (0, 0, 0, 0.0, 0.00, '', NULL, DATE '2000-02-29', TIMESTAMP '2000-02-29 00:00:00'), \
     (32767, 2147483647, 9223372036854775807, 1e308, 9999999999.99, 'zz top', true, DATE '9999-12-31', TIMESTAMP '2262-04-11 00:00:00'), \
     (-32768, -2147483648, -9223372036854775808, -1e308, -9999999999.99, 'ünï', false, DATE '0001-01-01', TIMESTAMP '1677-09-22 00:00:00'), \
     (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), \
     (7, 42, 1000000, 3.14159, 42.42, '42', true, DATE '2024-02-29', TIMESTAMP '2024-02-29 12:34:56'), \
     (7, 42, 1000000, 'NaN', 0.01, '%_', false, DATE '1970-01-01', TIMESTAMP '1970-01-01 00:00:00')",
];

struct Gen {
    rng: StdRng,
}

impl Gen {
    fn leaf(&mut self, ty: Ty) -> String {
        if self.rng.chance(5) {
            return "NULL".into();
        }
        let column = self.rng.chance(60);
        match ty {
            Ty::Int if column => self.rng.pick(&["s", "i", "b"]).into(),
            Ty::Int => self
                .rng
                .pick(&[
                    "0",
                    "1",
                    "-1",
                    "7",
                    "32767",
                    "-32768",
                    "2147483647",
                    "-2147483648",
                    "9223372036854775807",
                    "-9223372036854775807",
                    "CAST(40000 AS INT)",
                    "CAST(3 AS SMALLINT)",
                ])
                .into(),
            Ty::Num if column => self.rng.pick(&["d", "n"]).into(),
            Ty::Num => self
                .rng
                .pick(&[
                    "0.5",
                    "1.005",
                    "-2.25",
                    "1e308",
                    "CAST('NaN' AS DOUBLE)",
                    "CAST('Infinity' AS DOUBLE)",
                    "CAST(123.456 AS DECIMAL(6,3))",
                    "99999999999999999999999999999999999.99",
                    "0.000001",
                ])
                .into(),
            Ty::Text if column => "t".into(),
            Ty::Text => self
                .rng
                .pick(&[
                    "''",
                    "'abc'",
                    "'42'",
                    "'2024-05-17'",
                    "'ü'",
                    "'%'",
                    "'x''y'",
                ])
                .into(),
            Ty::Bool if column => "o".into(),
            Ty::Bool => self.rng.pick(&["true", "false"]).into(),
            Ty::Date if column => "dt".into(),
            Ty::Date => self
                .rng
                .pick(&[
                    "DATE '2024-02-29'",
                    "DATE '0001-01-01'",
                    "DATE '9999-12-31'",
                ])
                .into(),
            Ty::Ts if column => "ts".into(),
            Ty::Ts => self
                .rng
                .pick(&[
                    "TIMESTAMP '2024-05-17 10:00'",
                    "TIMESTAMP '1970-01-01 00:00:00'",
                    "now()",
                ])
                .into(),
        }
    }

    fn sql_type(&mut self, ty: Ty) -> &'static str {
        match ty {
            Ty::Int => self.rng.pick(&["SMALLINT", "INT", "BIGINT"]),
            Ty::Num => self.rng.pick(&[
                "DOUBLE",
                "REAL",
                "DECIMAL(12,2)",
                "DECIMAL(5,4)",
                "DECIMAL(38,0)",
            ]),
            Ty::Text => self.rng.pick(&["VARCHAR", "TEXT"]),
            Ty::Bool => "BOOLEAN",
            Ty::Date => "DATE",
            Ty::Ts => "TIMESTAMP",
        }
    }

    /// An expression of type `ty` at most `depth` levels deep.
    fn expr(&mut self, ty: Ty, depth: usize) -> String {
        if depth == 0 || self.rng.chance(25) {
            return self.leaf(ty);
        }
        let d = depth - 1;
        // Forms any type has.
        match self.rng.random_range(0..14) {
            0 => {
                let from = self.rng.any_type();
                let inner = self.expr(from, d);
                return format!("CAST({inner} AS {})", self.sql_type(ty));
            }
            1 => {
                let (c, a, b) = (self.expr(Ty::Bool, d), self.expr(ty, d), self.expr(ty, d));
                return format!("CASE WHEN {c} THEN {a} ELSE {b} END");
            }
            2 => {
                let (a, b) = (self.expr(ty, d), self.expr(ty, d));
                return format!("COALESCE({a}, {b})");
            }
            3 => return format!("({})", self.expr(ty, d)),
            4 if self.rng.chance(30) => {
                let (e, w) = (self.expr(ty, d.min(3)), self.expr(Ty::Bool, d.min(3)));
                let agg = if matches!(ty, Ty::Int | Ty::Num) {
                    "max"
                } else {
                    "min"
                };
                return format!("(SELECT {agg}({e}) FROM f WHERE {w})");
            }
            5 => {
                let (a, b) = (self.expr(ty, d), self.expr(ty, d));
                return format!("NULLIF({a}, {b})");
            }
            _ => {}
        }
        match ty {
            Ty::Int => match self.rng.random_range(0..9) {
                0..=3 => {
                    let op = self.rng.pick(&["+", "-", "*", "/", "%"]);
                    format!("{} {op} {}", self.expr(Ty::Int, d), self.expr(Ty::Int, d))
                }
                4 => format!("-{}", self.expr(Ty::Int, d)),
                5 => format!("abs({})", self.expr(Ty::Int, d)),
                6 => format!("length({})", self.expr(Ty::Text, d)),
                7 => format!("extract(year FROM {})", self.expr(Ty::Date, d)),
                _ => {
                    let f = self.rng.pick(&["greatest", "least"]);
                    format!("{f}({}, {})", self.expr(Ty::Int, d), self.expr(Ty::Int, d))
                }
            },
            Ty::Num => match self.rng.random_range(0..7) {
                0..=2 => {
                    let op = self.rng.pick(&["+", "-", "*", "/"]);
                    let (a, b) = (self.num_or_int(d), self.num_or_int(d));
                    format!("{a} {op} {b}")
                }
                3 => format!(
                    "round({}, {})",
                    self.expr(Ty::Num, d),
                    self.rng.random_range(-2..5)
                ),
                4 => format!("sqrt(abs({}))", self.expr(Ty::Num, d)),
                5 => format!(
                    "power({}, {})",
                    self.expr(Ty::Num, d),
                    self.rng.random_range(0..4)
                ),
                _ => format!("floor({})", self.expr(Ty::Num, d)),
            },
            Ty::Text => match self.rng.random_range(0..7) {
                0 | 1 => format!("{} || {}", self.expr(Ty::Text, d), self.expr(Ty::Text, d)),
                2 => format!("upper({})", self.expr(Ty::Text, d)),
                3 => format!(
                    "substr({}, {}, {})",
                    self.expr(Ty::Text, d),
                    self.expr(Ty::Int, d),
                    self.expr(Ty::Int, d)
                ),
                4 => format!("trim({})", self.expr(Ty::Text, d)),
                5 => format!(
                    "replace({}, {}, {})",
                    self.expr(Ty::Text, d),
                    self.leaf(Ty::Text),
                    self.leaf(Ty::Text)
                ),
                _ => format!("CAST({} AS VARCHAR)", self.expr(Ty::Int, d)),
            },
            Ty::Bool => match self.rng.random_range(0..10) {
                0..=2 => {
                    let operand = self.rng.any_type();
                    let op = self.rng.pick(&["=", "<>", "<", "<=", ">", ">="]);
                    format!("{} {op} {}", self.expr(operand, d), self.expr(operand, d))
                }
                3 => {
                    let op = self.rng.pick(&["AND", "OR"]);
                    format!("{} {op} {}", self.expr(Ty::Bool, d), self.expr(Ty::Bool, d))
                }
                4 => format!("NOT {}", self.expr(Ty::Bool, d)),
                5 => {
                    let operand = self.rng.any_type();
                    let not = self.rng.pick(&["", "NOT "]);
                    format!("{} IS {not}NULL", self.expr(operand, d))
                }
                6 => {
                    let operand = self.rng.any_type();
                    let list: Vec<String> = (0..self.rng.random_range(0..4))
                        .map(|_| self.leaf(operand))
                        .collect();
                    let not = self.rng.pick(&["", "NOT "]);
                    format!("{} {not}IN ({})", self.expr(operand, d), list.join(", "))
                }
                7 => format!(
                    "{} BETWEEN {} AND {}",
                    self.expr(Ty::Int, d),
                    self.expr(Ty::Int, d),
                    self.expr(Ty::Int, d)
                ),
                8 => format!("{} LIKE {}", self.expr(Ty::Text, d), self.leaf(Ty::Text)),
                _ => {
                    let operand = self.rng.any_type();
                    format!(
                        "{} IS DISTINCT FROM {}",
                        self.expr(operand, d),
                        self.expr(operand, d)
                    )
                }
            },
            Ty::Date => match self.rng.random_range(0..3) {
                0 => format!("CAST({} AS DATE)", self.expr(Ty::Ts, d)),
                1 => format!("{} + INTERVAL '1 day'", self.expr(Ty::Date, d)),
                _ => format!("CAST({} AS DATE)", self.expr(Ty::Text, d)),
            },
            Ty::Ts => match self.rng.random_range(0..3) {
                0 => format!("date_trunc('month', {})", self.expr(Ty::Ts, d)),
                1 => format!("{} - INTERVAL '2 hours'", self.expr(Ty::Ts, d)),
                _ => format!("CAST({} AS TIMESTAMP)", self.expr(Ty::Date, d)),
            },
        }
    }

    fn num_or_int(&mut self, depth: usize) -> String {
        let ty = if self.rng.chance(50) {
            Ty::Num
        } else {
            Ty::Int
        };
        self.expr(ty, depth)
    }

    /// Nesting past the limit now and then, else a few levels.
    fn depth(&mut self) -> usize {
        if self.rng.chance(1) {
            self.deep_depth()
        } else {
            self.rng.random_range(1..6)
        }
    }

    /// A depth from half the nesting limit up to [`DEPTH_MAX`], spread
    /// evenly over its orders of magnitude (log-uniform): 10x the limit as
    /// often as 1,000x.
    fn deep_depth(&mut self) -> usize {
        let low = (STATEMENT_NESTING_DEPTH_MAX / 2) as f64;
        let exponent = self.rng.random_range(0.0..=(DEPTH_MAX as f64 / low).ln());
        (low * exponent.exp()) as usize
    }

    /// A deep statement: parentheses, unary minus, NOT, function calls,
    /// scalar subqueries or CASE nested `depth` times.
    fn deep(&mut self, depth: usize) -> String {
        let (open, close) = match self.rng.random_range(0..6) {
            0 => ("(", ")"),
            1 => ("abs(", ")"),
            2 => ("(SELECT ", ")"),
            3 => ("CASE WHEN true THEN ", " END"),
            4 => ("coalesce(", ", 0)"),
            _ => ("- ", ""),
        };
        format!(
            "SELECT {}i{} FROM f",
            open.repeat(depth),
            close.repeat(depth)
        )
    }

    /// A chain of one operator, now and then past the chain limit. (Long
    /// `+` and `||` chains under the limit plan in time quadratic in their
    /// length, 47 s at the limit: the hardening test runs those; AND/OR
    /// chains are regrouped, so any length plans fast.)
    fn chain(&mut self) -> String {
        let (op, term) = *[
            (" + ", "1"),
            (" || ", "'x'"),
            (" OR ", "i = 1"),
            (" AND ", "o"),
        ]
        .get(self.rng.random_range(0..4))
        .expect("an operator");
        let logical = op == " OR " || op == " AND ";
        let length = match self.rng.random_range(0..20) {
            0 if logical => self.rng.random_range(2..=EXPRESSION_CHAIN_LENGTH_MAX * 10),
            0 => self
                .rng
                .random_range(EXPRESSION_CHAIN_LENGTH_MAX + 1..=EXPRESSION_CHAIN_LENGTH_MAX * 10),
            // (`||` chains name every level while planning: 800 terms take
            // 1.3 s, so they stay short here until that is linear too.)
            1 if op != " || " => self.rng.random_range(200..2_000),
            _ => self.rng.random_range(2..200),
        };
        format!("SELECT {} FROM f", vec![term; length].join(op))
    }

    fn statement(&mut self) -> String {
        let depth = self.depth();
        if depth > 6 {
            return self.deep(depth);
        }
        match self.rng.random_range(0..20) {
            0 => self.chain(),
            1..=4 => {
                let ty = self.rng.any_type();
                let key = self.expr(ty, 2);
                let agg_ty = if self.rng.chance(50) {
                    Ty::Int
                } else {
                    Ty::Num
                };
                let arg = self.expr(agg_ty, depth);
                let agg = self
                    .rng
                    .pick(&["sum", "avg", "min", "max", "count", "count(DISTINCT"]);
                let call = if agg.ends_with("DISTINCT") {
                    format!("{agg} {arg})")
                } else {
                    format!("{agg}({arg})")
                };
                format!("SELECT {key} AS k, {call} FROM f GROUP BY {key} ORDER BY 1 NULLS FIRST")
            }
            5 => {
                let (a, b) = (self.expr(Ty::Int, depth), self.expr(Ty::Bool, depth));
                format!("SELECT x.i, y.b FROM f x JOIN f y ON x.i = y.i AND {b} WHERE {a} > 0")
            }
            6 => {
                let e = self.expr(Ty::Int, depth);
                format!("SELECT DISTINCT {e} FROM f ORDER BY 1 LIMIT 5")
            }
            7 => {
                let e = self.expr(Ty::Bool, depth);
                format!("SELECT count(*) FROM f WHERE i IN (SELECT i FROM f WHERE {e})")
            }
            _ => {
                let items: Vec<String> = (0..self.rng.random_range(1..4))
                    .map(|_| {
                        let ty = self.rng.any_type();
                        self.expr(ty, depth)
                    })
                    .collect();
                let filter = if self.rng.chance(40) {
                    format!(" WHERE {}", self.expr(Ty::Bool, depth))
                } else {
                    String::new()
                };
                format!("SELECT {} FROM f{filter}", items.join(", "))
            }
        }
    }
}

/// A `cirro serve` whose stderr a thread collects.
struct Fuzzed {
    child: Child,
    port: u16,
    stderr: std::thread::JoinHandle<String>,
    _data: DataDir,
}

impl Fuzzed {
    fn start(envs: &[(&str, &str)]) -> Self {
        let data = DataDir::new();
        let (mut child, port, _, _) =
            spawn_serve_with(data.path(), &[], PASSWORD, envs, Stdio::piped());
        let mut pipe = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        });
        Fuzzed {
            child,
            port,
            stderr,
            _data: data,
        }
    }

    async fn connect(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(
            &format!(
                "host=127.0.0.1 port={} user=cirro password={PASSWORD} dbname=cirro",
                self.port
            ),
            tokio_postgres::NoTls,
        )
        .await
        .expect("connect");
        tokio::spawn(connection);
        client
    }

    /// Stop the server; its stderr.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.join().unwrap_or_default()
    }
}

/// A statement that has not answered (rows, or 57014 from the statement
/// timeout) after this long has hung: a failure.
const STATEMENT_SECONDS_MAX: u64 = 30;

enum Verdict {
    Fine,
    Internal(String),
    Lost(String),
    Hung,
}

async fn run(client: &tokio_postgres::Client, sql: &str) -> Verdict {
    let answer = tokio::time::timeout(
        Duration::from_secs(STATEMENT_SECONDS_MAX),
        client.simple_query(sql),
    )
    .await;
    let Ok(answer) = answer else {
        return Verdict::Hung;
    };
    match answer {
        Ok(_) => Verdict::Fine,
        Err(e) if e.is_closed() || e.as_db_error().is_none() => Verdict::Lost(e.to_string()),
        Err(e) => {
            let db = e.as_db_error().expect("a server error");
            if db.code().code() == "XX000" {
                Verdict::Internal(db.message().to_string())
            } else {
                Verdict::Fine
            }
        }
    }
}

fn shorten(sql: &str) -> String {
    if sql.len() <= 300 {
        sql.to_string()
    } else {
        format!("{}… ({} bytes)", &sql[..300], sql.len())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_statements_never_crash_panic_or_fail_internally() {
    let server = Fuzzed::start(&[]);
    let client = server.connect().await;
    for sql in SETUP {
        client.simple_query(sql).await.expect("setup");
    }
    client
        .simple_query("SET statement_timeout = '10s'")
        .await
        .expect("timeout");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut statements = 0;
    let mut fine_rows = 0;
    let mut lost = None;
    let generated = SEEDS.iter().flat_map(|&seed| {
        let mut generator = Gen {
            rng: StdRng::seed_from_u64(seed),
        };
        (0..STATEMENTS_PER_SEED).map(move |_| generator.statement())
    });
    for sql in REGRESSIONS.iter().map(|s| s.to_string()).chain(generated) {
        assert!(
            started.elapsed() < Duration::from_secs(RUN_SECONDS_MAX),
            "the fuzz run took over {RUN_SECONDS_MAX} s ({statements} statements)"
        );
        statements += 1;
        let began = Instant::now();
        let verdict = run(&client, &sql).await;
        if began.elapsed() > Duration::from_secs(2) {
            eprintln!(
                "slow ({:.1} s): {}",
                began.elapsed().as_secs_f64(),
                shorten(&sql)
            );
        }
        if statements % 500 == 0 {
            eprintln!(
                "{statements} statements, {:.0} s",
                started.elapsed().as_secs_f64()
            );
        }
        match verdict {
            Verdict::Fine => fine_rows += 1,
            Verdict::Hung => {
                lost = Some(format!(
                    "no answer within {STATEMENT_SECONDS_MAX} s\n    {}",
                    shorten(&sql)
                ));
                break;
            }
            Verdict::Internal(message) => {
                failures.push(format!("XX000 {message}\n    {}", shorten(&sql)))
            }
            Verdict::Lost(message) => {
                lost = Some(format!("{message}\n    {}", shorten(&sql)));
                break;
            }
        }
    }
    let stderr = server.stop();
    let panics: Vec<&str> = stderr.lines().filter(|l| l.contains("panicked")).collect();
    assert!(
        lost.is_none(),
        "the connection was lost (the server died?): {}\nstderr: {stderr}",
        lost.unwrap_or_default()
    );
    assert!(
        failures.is_empty() && panics.is_empty(),
        "{} internal errors and {} panics in {statements} statements:\n{}\n{}",
        failures.len(),
        panics.len(),
        failures.join("\n"),
        panics.join("\n")
    );
    assert!(statements >= SEEDS.len() * STATEMENTS_PER_SEED);
    eprintln!(
        "{statements} statements in {:.1} s, {fine_rows} answered or refused cleanly",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_test_without_the_nesting_limit_the_fuzzer_finds_the_crash() {
    let server = Fuzzed::start(&[(NESTING_DEPTH_OVERRIDE_ENV, "100000000")]);
    let client = server.connect().await;
    for sql in SETUP {
        client.simple_query(sql).await.expect("setup");
    }
    let mut generator = Gen {
        rng: StdRng::seed_from_u64(SEEDS[0]),
    };
    client
        .simple_query("SET statement_timeout = '10s'")
        .await
        .expect("timeout");
    let started = Instant::now();
    let mut crashed = None;
    for n in 0..SELF_TEST_STATEMENTS_MAX {
        assert!(started.elapsed() < Duration::from_secs(RUN_SECONDS_MAX));
        // The fuzzer's deep statements.
        let depth = generator.deep_depth();
        let sql = generator.deep(depth);
        match run(&client, &sql).await {
            Verdict::Lost(_) => {
                crashed = Some((n, depth));
                break;
            }
            Verdict::Hung => panic!(
                "no answer within {STATEMENT_SECONDS_MAX} s: {}",
                shorten(&sql)
            ),
            Verdict::Fine | Verdict::Internal(_) => {}
        }
    }
    let stderr = server.stop();
    let Some((n, depth)) = crashed else {
        panic!(
            "with the nesting limit off, {SELF_TEST_STATEMENTS_MAX} deep statements did not take the server down"
        );
    };
    assert!(
        stderr.contains("overflow"),
        "the server died, but not of a stack overflow: {stderr}"
    );
    eprintln!(
        "without the limit, statement {} (nesting {depth}) overflowed the stack, after {:.1} s",
        n + 1,
        started.elapsed().as_secs_f64()
    );
}
