//! `cirro bench`: hands over to the benchmark harness in `bench/` (Python),
//! through `bench/bootstrap.py`, which makes the harness's own Python
//! environment with the pinned peers on first use. The harness is told which
//! `cirro` binary to measure: this one.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use cirro_common::{CirroError, SqlState};

/// Where the harness lives: `CIRRO_BENCH_DIR`, else `bench/` of the source
/// tree this binary was built from.
fn bench_dir() -> Result<PathBuf, CirroError> {
    let dir = std::env::var_os("CIRRO_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench")));
    if dir.join("bootstrap.py").is_file() {
        Ok(dir)
    } else {
        Err(CirroError::new(
            SqlState::UNDEFINED_FILE,
            format!(
                "the benchmark harness is not at {} (set CIRRO_BENCH_DIR to the bench/ directory of a Cirro checkout)",
                dir.display()
            ),
        ))
    }
}

pub fn run(args: &[String], threads: Option<usize>) -> Result<ExitCode, CirroError> {
    let dir = bench_dir()?;
    let exe = std::env::current_exe().map_err(|e| CirroError::io(e.to_string()))?;
    let mut command =
        Command::new(std::env::var("CIRRO_PYTHON").unwrap_or_else(|_| "python3".into()));
    command
        .arg(dir.join("bootstrap.py"))
        .args(args)
        .env("CIRRO_BIN", &exe);
    // `cirro --threads 4 bench tpch` means the same as `cirro bench tpch --threads 4`.
    if let Some(t) = threads.filter(|_| !args.iter().any(|a| a.starts_with("--threads"))) {
        command.args(["--threads", &t.to_string()]);
    }
    let status = command.status().map_err(|e| {
        CirroError::io(format!(
            "cannot run python3 for the benchmark harness: {e} (install python3)"
        ))
    })?;
    Ok(status
        .code()
        .map_or(ExitCode::FAILURE, |c| ExitCode::from(c as u8)))
}
