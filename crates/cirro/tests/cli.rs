//! The `cirro sql` command line: output formats, scripts, errors, EXPLAIN.

use crate::common;

use crate::common::DataDir;

fn setup() -> DataDir {
    let data = DataDir::new();
    data.sql_ok(
        "CREATE TABLE p (id INT, name VARCHAR, price DECIMAL(10,2), day DATE); \
         INSERT INTO p VALUES (1, 'plain', 1.5, DATE '2024-03-01'), \
                              (2, 'has, comma and \"quote\"', 20, NULL), \
                              (3, NULL, NULL, DATE '1999-12-31')",
    );
    data
}

#[test]
fn csv_output_is_rfc4180_with_header_and_full_scale_decimals() {
    let data = setup();
    let out = data.sql_output("SELECT * FROM p ORDER BY id", &["--format", "csv"]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout,
        "id,name,price,day\n1,plain,1.50,2024-03-01\n2,\"has, comma and \"\"quote\"\"\",20.00,\n3,,,1999-12-31\n"
    );
    // Timing and the row count go to stderr only.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("(3 rows)"), "{stderr}");
}

#[test]
fn csv_header_is_written_for_empty_results_and_delimiter_is_honoured() {
    let data = setup();
    let out = data.sql_output(
        "SELECT id, name FROM p WHERE id > 100",
        &["--format", "csv", "--delimiter", "|"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "id|name\n");
    let out = data.sql_output(
        "SELECT id, name FROM p WHERE id = 1",
        &["--format", "csv", "--delimiter", "|"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "id|name\n1|plain\n");
}

#[test]
fn json_output_is_one_object_per_line_with_decimals_as_strings() {
    let data = setup();
    let out = data.sql_output(
        "SELECT id, name, price, day FROM p ORDER BY id",
        &["--format", "json"],
    );
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(lines[0]["price"], "1.50");
    assert_eq!(lines[0]["day"], "2024-03-01");
    assert!(lines[2]["name"].is_null());
    assert!(lines[2]["price"].is_null());
}

#[test]
fn table_output_is_aligned_with_row_count() {
    let data = setup();
    let stdout = data.sql_ok("SELECT id, name FROM p WHERE id = 1");
    assert!(stdout.contains("| id | name  |"), "{stdout}");
    assert!(stdout.contains("| 1  | plain |"), "{stdout}");
    assert!(stdout.contains("(1 row)"), "{stdout}");
    assert!(stdout.contains("Time: "), "{stdout}");
}

#[test]
fn first_error_stops_the_script_with_sqlstate_and_nonzero_exit() {
    let data = setup();
    let out = data.sql_output("INSERT INTO p VALUES (4, 'x', 1, NULL); SELECT * FROM nope; INSERT INTO p VALUES (5, 'y', 1, NULL)", &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ERROR: ") && stderr.contains("(SQLSTATE 42P01)"),
        "{stderr}"
    );
    assert_eq!(stderr.matches("ERROR:").count(), 1, "{stderr}");
    // The statement before the error ran; the one after did not.
    assert_eq!(
        common::scalar(&data, "SELECT count(*) FROM p WHERE id >= 4"),
        "1"
    );
}

#[test]
fn scripts_from_files_and_stdin_run_every_statement() {
    let data = DataDir::new();
    let script = data.path().join("script.sql");
    std::fs::write(&script, "-- a comment; with a semicolon\nCREATE TABLE s (a INT);\nINSERT INTO s VALUES (1);\n\nINSERT INTO s VALUES (2)\n;\n").expect("write");
    let out = data
        .command()
        .args(["sql", "-f"])
        .arg(&script)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = data.sql_stdin(
        b"INSERT INTO s VALUES (3);\nSELECT sum(a) AS total FROM s;\n",
        &["--format", "csv"],
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "total\n6\n");

    let missing = data
        .command()
        .args(["sql", "-f", "/no/such/file.sql"])
        .output()
        .expect("run");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("SQLSTATE 58P01"));
}

#[test]
fn explain_and_explain_analyze() {
    let data = setup();
    let plan = data.sql_ok("EXPLAIN SELECT name FROM p WHERE id = 2");
    assert!(plan.contains("TableScan: p"), "{plan}");
    assert!(plan.contains("DataSourceExec"), "{plan}");
    let analyzed = data.sql_ok("EXPLAIN ANALYZE SELECT count(*) FROM p");
    assert!(analyzed.contains("output_rows="), "{analyzed}");
}

#[test]
fn explain_and_history_are_wrapped_to_the_screen_width() {
    let data = setup();
    data.sql_ok("UPDATE p SET name = upper(name) WHERE id = 1");
    let run = |sql: &str, columns: Option<&str>| {
        let mut command = data.command();
        command.args(["sql", "-c", sql]);
        if let Some(columns) = columns {
            command.env("COLUMNS", columns);
        }
        let out = command.output().expect("run cirro");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let widest = |text: &str| text.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    let words = |text: &str| {
        text.split(|c: char| c.is_whitespace() || c == '|' || c == '+')
            .filter(|w| !w.is_empty() && !w.chars().all(|c| c == '-'))
            .count()
    };
    for sql in [
        "EXPLAIN SELECT name, count(*) FROM p WHERE id > 1 GROUP BY name ORDER BY name",
        "DESCRIBE HISTORY p",
    ] {
        // piped without COLUMNS: not wrapped, some line is wide
        let wide = run(sql, None);
        assert!(widest(&wide) > 100, "{sql}: nothing wide to wrap:\n{wide}");
        // COLUMNS=80: no line is wider, and no word is lost
        let narrow = run(sql, Some("80"));
        assert!(widest(&narrow) <= 80, "{sql} at 80 columns:\n{narrow}");
        assert!(
            words(&narrow) >= words(&wide),
            "{sql}: words lost:\n{narrow}"
        );
    }
}

#[test]
fn tables_persist_across_processes_and_data_env_is_honoured() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE keep (v VARCHAR); INSERT INTO keep VALUES ('kept')");
    // A new process, locating the data with CIRRO_DATA instead of --data.
    let out = std::process::Command::new(common::cirro_bin())
        .env("CIRRO_DATA", data.path())
        .args(["sql", "--format", "csv", "-c", "SELECT v FROM keep"])
        .output()
        .expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "v\nkept\n");
    // The same location named by a file:// URL.
    let url = format!("file://{}", data.path().display());
    let out = std::process::Command::new(common::cirro_bin())
        .args([
            "--data",
            &url,
            "sql",
            "--format",
            "csv",
            "-c",
            "SELECT v FROM keep",
        ])
        .output()
        .expect("run");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "v\nkept\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Schemes Cirro does not reach are refused clearly.
    let out = std::process::Command::new(common::cirro_bin())
        .args(["--data", "gs://bucket/path", "sql", "-c", "SELECT 1"])
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("SQLSTATE 0A000"));
}

#[test]
fn load_refuses_existing_tables_unless_replace() {
    let data = DataDir::new();
    data.load(&["tpch", "--sf", "0.001"]);
    let out = data
        .command()
        .args(["load", "tpch", "--sf", "0.001"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SQLSTATE 42P07"));
    data.load(&["tpch", "--sf", "0.002", "--replace"]);
    assert_eq!(common::scalar(&data, "SELECT count(*) FROM nation"), "25");
    let out = data
        .command()
        .args(["load", "tpch", "--sf", "0"])
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("SQLSTATE 22023"));
    let out = data
        .command()
        .args(["load", "tpch", "--sf", "0.001", "--schema", "other"])
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("SQLSTATE 3F000"));
    data.sql_ok("CREATE SCHEMA other");
    data.load(&["tpch", "--sf", "0.001", "--schema", "other"]);
    assert_eq!(
        common::scalar(&data, "SELECT count(*) FROM other.region"),
        "5"
    );
}

/// Even a catalog holding a cycle of views (which CREATE VIEW refuses to make)
/// gives an error, not a crash.
#[test]
fn recursive_views_are_refused_and_never_crash() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE base (x INT); CREATE VIEW a AS SELECT x FROM base; CREATE VIEW b AS SELECT x FROM a");
    assert!(
        data.sql_err("CREATE OR REPLACE VIEW a AS SELECT x FROM b")
            .contains("SQLSTATE 42P17")
    );
    // Forge the cycle a → b → a in a new catalog version.
    let catalog_dir = data.path().join("_catalog");
    let mut versions: Vec<_> = std::fs::read_dir(&catalog_dir)
        .expect("catalog")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    versions.sort();
    let latest = versions.last().expect("a version");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(latest).expect("read")).expect("json");
    let version = state["version"].as_u64().expect("version") + 1;
    state["version"] = version.into();
    state["databases"]["cirro"]["schemas"]["public"]["views"]["a"]["sql"] =
        "SELECT x FROM b".into();
    std::fs::write(
        catalog_dir.join(format!("v{version:020}.json")),
        state.to_string(),
    )
    .expect("write");
    let stderr = data.sql_err("SELECT * FROM a");
    assert!(stderr.contains("SQLSTATE 42P17"), "{stderr}");
    // The process ended with an error, not a signal, and the data is still served.
    assert_eq!(common::scalar(&data, "SELECT count(*) FROM base"), "0");
}

/// Malformed input of many kinds: each gives one SQLSTATE error and a normal
/// exit code (1), never a crash, and changes nothing.
#[test]
fn malformed_input_gives_errors_not_crashes() {
    let data = DataDir::new();
    data.sql_ok("CREATE TABLE m (a INT NOT NULL, b VARCHAR)");
    let deep = format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000));
    let long_name = format!("SELECT * FROM {}", "x".repeat(100_000));
    let mut inputs: Vec<String> = vec![
        "SELECT 'unterminated".into(),
        "SELECT \"unterminated".into(),
        "/* unterminated comment".into(),
        "SELECT * FROM m WHERE".into(),
        "INSERT INTO m VALUES (".into(),
        "CREATE TABLE".into(),
        "COPY m FROM".into(),
        "COPY m FROM 'x' (FORMAT csv, DELIMITER 'ab')".into(),
        "DROP DATABASE".into(),
        "SELECT 1/0".into(),
        "SELECT CAST('2020-13-45' AS DATE)".into(),
        "SELECT 99999999999999999999999999999999999999999".into(),
        "\u{0}\u{1}\u{2}garbage\u{7f}".into(),
        "SELECT read_parquet(1)".into(),
        "SELECT * FROM read_csv()".into(),
        "SELECT * FROM read_parquet(NULL)".into(),
        "CREATE VIEW v AS SELECT * FROM v".into(),
        "INSERT INTO m SELECT * FROM m, m".into(),
        deep,
        long_name,
    ];
    // Bytes of pseudo-random printable noise, from a fixed seed.
    let mut seed: u64 = 0x5eed;
    for _ in 0..20 {
        let noise: String = (0..200)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                char::from(b' ' + ((seed >> 33) % 95) as u8)
            })
            .collect();
        inputs.push(noise);
    }
    let mut raw: Vec<Vec<u8>> = inputs.iter().map(|i| i.clone().into_bytes()).collect();
    raw.push(vec![0xff, 0xfe, b'S', b'E', b'L', 0xc3, b';']); // not UTF-8
    for (input, bytes) in inputs
        .iter()
        .map(String::as_str)
        .chain(std::iter::once("<invalid utf-8>"))
        .zip(&raw)
    {
        // Through stdin, so that NUL bytes and invalid UTF-8 arrive too.
        let out = data.sql_stdin(bytes, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        assert!(
            code == Some(1) || code == Some(0),
            "crashed ({:?}) on {:?}: {stderr}",
            out.status,
            &input[..input.len().min(80)]
        );
        if code == Some(1) {
            assert!(
                stderr.contains("(SQLSTATE "),
                "no SQLSTATE for {:?}: {stderr}",
                &input[..input.len().min(80)]
            );
            assert!(
                !stderr.contains("panicked"),
                "panic for {:?}: {stderr}",
                &input[..input.len().min(80)]
            );
        }
    }
    assert_eq!(common::scalar(&data, "SELECT count(*) FROM m"), "0");
}

#[test]
fn statement_timeout_stops_a_long_statement_in_the_shell() {
    let data = DataDir::new();
    let started = std::time::Instant::now();
    let err = data.sql_err(
        "SET statement_timeout = '300ms'; SELECT count(*) FROM generate_series(1, 20000000000)",
    );
    assert!(err.contains("statement timeout (SQLSTATE 57014)"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // Without the setting the same session kind runs statements as before.
    let out = data.sql_ok("SHOW statement_timeout");
    assert!(out.contains('0'), "{out}");
}

/// A file that includes itself ends in an error (54001), not a crash.
#[test]
fn a_file_that_includes_itself_is_an_error() {
    let data = DataDir::new();
    let looped = data.path().join("loop.sql");
    std::fs::write(&looped, format!("SELECT 1;\n\\i {}\n", looped.display())).expect("write");
    let out = data.sql_output(&format!("\\i {}", looped.display()), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // An error exit (a crash has no exit code: it is a signal).
    assert!(matches!(out.status.code(), Some(c) if c != 0), "{stderr}");
    assert!(stderr.contains("SQLSTATE 54001"), "{stderr}");
    assert!(stderr.contains("more than 32 deep"), "{stderr}");
}

/// psql's backslash commands, in a script on stdin: each runs at once, and an
/// unknown one is an error (never the start of a multi-line statement).
#[test]
fn backslash_commands_in_scripts() {
    let data = DataDir::new();
    let dir = data.path();
    let included = dir.join("more.sql");
    std::fs::write(&included, "INSERT INTO t VALUES (2, 'b');\n\\timing off\n").expect("write");
    let results = dir.join("results.txt");
    let script = format!(
        "CREATE TABLE t (id INT NOT NULL PRIMARY KEY, name VARCHAR CHECK (name <> ''));\n\
         CREATE INDEX t_name ON t (name DESC);\n\
         CREATE VIEW v AS SELECT id FROM t;\n\
         INSERT INTO t VALUES (1, 'a');\n\
         \\i {}\n\\dt\n\\dv\n\\d t\n\\l\n\\x on\nSELECT id, name FROM t ORDER BY id;\n\\x off\n\
         \\o {}\nSELECT name FROM t ORDER BY 1;\n\\o\n\\pset format csv\nSELECT id FROM t ORDER BY id;\n\
         \\?\n\\q\nSELECT 'not reached';\n",
        included.display(),
        results.display()
    );
    let out = data.sql_stdin(script.as_bytes(), &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // \i ran the file (its INSERT, then \timing off: no Time lines after it).
    let after_include = stdout
        .split("Timing is off.")
        .nth(1)
        .expect("\\timing off ran");
    assert!(!after_include.contains("Time:"), "{after_include}");
    assert!(stdout.contains("| public | t    | table |"), "{stdout}");
    assert!(stdout.contains("| public | v    | view |"), "{stdout}");
    assert!(
        stdout.contains("| id          | INTEGER   | NO          |"),
        "{stdout}"
    );
    // \d t lists the table's indexes and CHECK constraints under its columns
    assert!(
        stdout.contains(
            "Indexes:\n    \"t_pkey\" PRIMARY KEY (id)\n    \"t_name\" (name DESC)\n\
             Check constraints:\n    \"t_name_check\" CHECK (name <> '')\n"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("| cirro |"), "{stdout}");
    assert!(
        stdout.contains("-[ RECORD 2 ]----\nid   | 2\nname | b\n"),
        "{stdout}"
    );
    // \o sent that result to the file and nothing else.
    let written = std::fs::read_to_string(&results).expect("\\o file");
    assert!(written.starts_with("+------+\n| name |"), "{written}");
    assert!(!stdout.contains("| name |\n"), "{stdout}");
    assert!(stdout.contains("\nid\n1\n2\n"), "{stdout}");
    assert!(
        stdout.contains("\\dt") && stdout.contains("\\pset format"),
        "help"
    );
    assert!(
        !stdout.contains("not reached"),
        "\\q did not stop the script"
    );

    let out = data.sql_stdin(b"\\dx\nSELECT 1;\n", &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("invalid command \\dx"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("| 1"));
}

/// A data location written by an earlier release (tests/fixtures/
/// location-4aa7edb, its README says how) opens: the same rows, the rows
/// its deletion vectors remove stay removed, its view and primary key hold,
/// and it takes new writes.
#[test]
fn a_location_written_by_an_earlier_release_opens_and_takes_writes() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/location-4aa7edb");
    let data = DataDir::new();
    crate::common::copy_tree(&fixture, data.path());
    assert_eq!(
        data.query_csv("SELECT id, name, price, added FROM items ORDER BY id"),
        "id|name|price|added\n1|apple|1.25|2026-01-02\n3|||\n4|fig|11.00|2026-03-04\n5|plum|0.75|2026-04-05\n"
    );
    assert_eq!(
        data.query_csv("SELECT count(*), sum(k), min(v) FROM kv WHERE k > 100"),
        "count|sum|min\n200|40100|v101\n"
    );
    assert_eq!(
        data.query_csv("SELECT * FROM cheap ORDER BY id"),
        "id|name\n1|apple\n5|plum\n"
    );
    assert!(
        data.sql_err("INSERT INTO items VALUES (4, 'dup', 1, NULL)")
            .contains("SQLSTATE 23505")
    );
    data.sql_ok(
        "INSERT INTO items VALUES (6, 'kiwi', 3.00, DATE '2026-05-06'); \
         DELETE FROM items WHERE id = 1; UPDATE kv SET v = 'x' WHERE k <= 10",
    );
    assert_eq!(
        data.query_csv("SELECT id, name FROM items ORDER BY id"),
        "id|name\n3|\n4|fig\n5|plum\n6|kiwi\n"
    );
    assert_eq!(
        data.query_csv("SELECT count(*) FROM kv WHERE v = 'x'"),
        "count\n10\n"
    );
}
