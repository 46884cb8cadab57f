//! Helpers shared by the integration tests: run the real `cirro` binary on a
//! temporary data location, and compare results with reference answers.
#![allow(dead_code)]

pub mod cluster;
pub mod compare;
pub mod duckdb;
pub mod hdfs;
pub mod postgres;
pub mod s3;
pub mod server;
pub mod sqlgen;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `cirro` binary built for these tests.
pub fn cirro_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cirro")
}

/// A tmpfs of a given size, mounted on a temporary folder for a test of a
/// full disk (it needs root, as the project's machines and CI run), and
/// unmounted on drop.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn mount(bytes: u64) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("cirro-tmpfs-")
            .tempdir()
            .expect("dir");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "cannot mount a tmpfs (the test needs root)"
        );
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// `../shared` beside the repository. Tests that need it fail (not skip) when
/// it is missing.
pub fn shared_dir() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let shared = repo.join("../shared");
    assert!(
        shared.join("tpch").is_dir(),
        "the reference data ../shared/tpch is missing (looked in {})",
        shared.display()
    );
    shared.canonicalize().expect("canonical shared path")
}

/// `cirro --data DATA`, without the environment that would point it
/// elsewhere or crash it.
pub fn command_at(data: &Path) -> Command {
    let mut command = Command::new(cirro_bin());
    command
        .arg("--data")
        .arg(data)
        .env_remove("CIRRO_DATA")
        .env_remove("CIRRO_CRASH_POINT")
        // tables are wrapped to COLUMNS when it is set
        .env_remove("COLUMNS");
    command
}

/// Run `cirro sql -c SQL`, which must succeed, on the data location `data`;
/// returns stdout.
pub fn sql_ok_at(data: &Path, sql: &str) -> String {
    let out = command_at(data)
        .arg("sql")
        .arg("-c")
        .arg(sql)
        .output()
        .expect("run cirro");
    assert!(
        out.status.success(),
        "cirro sql failed for {sql}:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A data location in a fresh temporary directory.
pub struct DataDir {
    pub dir: tempfile::TempDir,
}

impl DataDir {
    pub fn new() -> Self {
        Self {
            dir: tempfile::Builder::new()
                .prefix("cirro-test-")
                .tempdir()
                .expect("temp dir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn command(&self) -> Command {
        command_at(self.path())
    }

    /// Run `cirro sql -c SQL` with extra arguments, returning the raw output.
    pub fn sql_output(&self, sql: &str, extra: &[&str]) -> Output {
        let mut command = self.command();
        command.arg("sql").args(extra).arg("-c").arg(sql);
        command.output().expect("run cirro")
    }

    /// Run SQL that must succeed; returns stdout.
    pub fn sql_ok(&self, sql: &str) -> String {
        sql_ok_at(self.path(), sql)
    }

    /// Run a query and return its CSV rows (header first), `|`-separated.
    pub fn query_csv(&self, sql: &str) -> String {
        let out = self.sql_output(sql, &["--format", "csv", "--delimiter", "|"]);
        assert!(
            out.status.success(),
            "query failed: {sql}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run SQL that must fail; returns stderr.
    pub fn sql_err(&self, sql: &str) -> String {
        let out = self.sql_output(sql, &[]);
        assert!(!out.status.success(), "expected failure for {sql}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Run `cirro load ARGS…`, which must succeed.
    pub fn load(&self, args: &[&str]) {
        let out = self
            .command()
            .arg("load")
            .args(args)
            .output()
            .expect("run cirro load");
        assert!(
            out.status.success(),
            "cirro load {args:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `sql`'s CSV lines after the settings `sets`, in one process; sorted
/// (after the header) unless the query orders them.
pub fn answer_after(data: &DataDir, sets: &str, sql: &str) -> Vec<String> {
    let text = data.query_csv(&format!("{sets}; {sql}"));
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if !sql.contains("ORDER BY") && lines.len() > 1 {
        lines[1..].sort();
    }
    lines
}

/// A single-value query result as text.
pub fn scalar(data: &DataDir, sql: &str) -> String {
    let csv = data.query_csv(sql);
    let mut lines = csv.lines();
    lines.next().expect("header");
    lines.next().expect("one row").to_string()
}

impl DataDir {
    /// Run a query file as given (`cirro sql -f`) and return its `|`-separated
    /// CSV output, or the error it printed.
    pub fn run_query_file(&self, path: &Path) -> Result<String, String> {
        let out = self
            .command()
            .args(["sql", "--format", "csv", "--delimiter", "|", "-f"])
            .arg(path)
            .output()
            .expect("run query");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Run each `(name, query file, answer file)` and compare; returns the failures.
    pub fn check_answers(&self, cases: &[(String, PathBuf, PathBuf)]) -> Vec<String> {
        let mut failures = Vec::new();
        for (name, query_path, answer_path) in cases {
            let query = std::fs::read_to_string(query_path).expect("query file");
            let expected = std::fs::read_to_string(answer_path).expect("answer file");
            match self.run_query_file(query_path) {
                Err(stderr) => failures.push(format!("{name}: failed: {stderr}")),
                Ok(actual) => {
                    if let Err(diff) =
                        compare::compare(&actual, &expected, compare::is_ordered(&query))
                    {
                        failures.push(format!("{name}: {diff}"));
                    }
                }
            }
        }
        failures
    }

    /// Run `cirro sql ARGS…` with `input` on stdin.
    pub fn sql_stdin(&self, input: &[u8], args: &[&str]) -> Output {
        use std::io::Write;
        use std::process::Stdio;
        let mut child = self
            .command()
            .arg("sql")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cirro");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("write stdin");
        child.wait_with_output().expect("wait for cirro")
    }
}

/// One long-lived `cirro sql` process fed statement by statement through
/// stdin, so a test can interleave the statements of several sessions (and
/// hold a transaction open while another session commits).
pub struct Session {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    stderr: std::io::BufReader<std::process::ChildStderr>,
}

/// What one statement of a [`Session`] produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// A command's tag (`UPDATE 3`).
    Tag(String),
    /// A query's rows, as CSV lines without the header.
    Rows(Vec<String>),
}

impl Session {
    pub fn open(data: &DataDir) -> Self {
        Self::open_with(data, &[])
    }

    /// A session of a process started with the extra arguments `args`
    /// (global flags such as `--cache-memory 1MB`).
    pub fn open_with(data: &DataDir, args: &[&str]) -> Self {
        use std::process::Stdio;
        let mut child = data
            .command()
            .args(["sql", "--format", "csv", "--null", "NULL"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cirro");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        Self {
            child,
            stdin,
            stdout,
            stderr,
        }
    }

    /// Run one statement; `Err` holds the error line (`ERROR: … (SQLSTATE x)`).
    /// After an error the process has ended, as scripts stop at the first one.
    pub fn run(&mut self, sql: &str) -> Result<Reply, String> {
        use std::io::{BufRead, Write};
        writeln!(self.stdin, "{sql};").map_err(|e| format!("session closed: {e}"))?;
        self.stdin
            .flush()
            .map_err(|e| format!("session closed: {e}"))?;
        loop {
            let mut line = String::new();
            if self.stderr.read_line(&mut line).unwrap_or(0) == 0 {
                return Err("session ended without a reply".into());
            }
            let line = line.trim();
            if line.is_empty() || line.starts_with("NOTICE:") || line.starts_with("Time:") {
                continue;
            }
            // A log record (`[2026-… WARN  module] …`, env_logger's format) is
            // not a reply: taken for one, it would shift every later reply
            // onto the statement after (a failed COMMIT counted as done).
            if line.starts_with('[') {
                eprintln!("session log: {line}");
                continue;
            }
            if line.starts_with("ERROR:") {
                return Err(line.to_string());
            }
            if let Some(count) = line
                .strip_prefix('(')
                .and_then(|l| l.strip_suffix(" rows)").or_else(|| l.strip_suffix(" row)")))
                .and_then(|n| n.parse::<usize>().ok())
            {
                let mut rows = Vec::new();
                for i in 0..=count {
                    let mut row = String::new();
                    self.stdout.read_line(&mut row).expect("query output");
                    if i > 0 {
                        rows.push(row.trim_end().to_string());
                    }
                }
                return Ok(Reply::Rows(rows));
            }
            return Ok(Reply::Tag(line.to_string()));
        }
    }

    /// Run a statement that must succeed.
    pub fn ok(&mut self, sql: &str) -> Reply {
        self.run(sql)
            .unwrap_or_else(|e| panic!("{sql} failed: {e}"))
    }

    /// Run a query that must succeed and return its rows.
    pub fn rows(&mut self, sql: &str) -> Vec<String> {
        match self.ok(sql) {
            Reply::Rows(rows) => rows,
            other => panic!("{sql} gave {other:?}, not rows"),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The directory of table `name` in the default database and schema.
pub fn table_dir(data: &DataDir, name: &str) -> PathBuf {
    table_dir_in(data.path(), name)
}

/// The directory of table `name` in the default database and schema of
/// the data location at `location`.
pub fn table_dir_in(location: &Path, name: &str) -> PathBuf {
    let schema_dir = location.join("data/cirro/public");
    std::fs::read_dir(&schema_dir)
        .expect("schema dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{name}-")))
        })
        .expect("table directory")
}

/// CPU time `pid` has used (user + system), in clock ticks (1/100 s), from
/// /proc.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc stat");
    // Fields after the command name (which may hold spaces) start at "state".
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .expect("stat format")
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// Poll `check` every 100 ms, at most `tries` times.
/// Run `command` with the crash point `point` set (see
/// `cirro_storage::failpoint`) until it announces that it reached it
/// (60 s at most), then kill it; whether it reached it.
pub fn kill_at_crash_point(mut command: Command, point: &str) -> bool {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = command
        .env("CIRRO_CRASH_POINT", point)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cirro");
    let stderr = child.stderr.take().expect("stderr");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let announced = format!("CIRRO_CRASH_POINT {point} reached");
    let reached = (0..600).any(|_| {
        receiver
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_ok_and(|line| line.contains(&announced))
    });
    let _ = child.kill();
    let _ = child.wait();
    reached
}

pub fn eventually(tries: usize, mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..tries {
        if check() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// Held by the slow tier's heavy tests (20 M-row joins, 16 clients, one
/// node or three) so that they run one at a time: on this 2-core machine
/// two of them at once starve a cluster's nodes until their connections
/// time out (08006), which is not what they test.
pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copy the tree at `from` into `to` (made if missing).
pub fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read the tree") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}
