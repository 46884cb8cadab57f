//! `cirro sql`: the interactive shell and the script runner.
//!
//! Scripts (`-c`, `-f`, or SQL piped to stdin) run statement by statement and
//! stop at the first error, which is printed as `ERROR: … (SQLSTATE xxxxx)` on
//! stderr with a non-zero exit. In the interactive shell a statement may span
//! lines and ends with `;`; Ctrl-C cancels the running statement (or clears the
//! line being typed) and the shell carries on; Ctrl-D or `\q` leaves.
//!
//! psql's backslash commands work wherever a statement could start (shell,
//! scripts, stdin): `\d [name]`, `\dt`, `\dv`, `\du`, `\l`, `\timing`,
//! `\x`, `\o [file]`, `\i file`, `\pset format …`, `\?`, `\q`; any other
//! is an error at once (see `meta.rs`).

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Instant;

use cirro_common::{CirroError, Result, SqlState};
use cirro_engine::{Engine, Outcome, is_complete, split_statements};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use crate::output::{ResultWriter, print_error};
use crate::{Format, SqlArgs};

const PROMPT: &str = "cirro=> ";
const PROMPT_MORE: &str = "cirro-> ";
const HISTORY_FILE: &str = ".cirro_history";

/// What the shell's backslash commands change.
pub(crate) struct Shell {
    pub(crate) writer: ResultWriter,
    /// Print `Time: …` after each statement (`\timing`).
    pub(crate) timing: bool,
    /// Where results go (`\o file`); None: stdout.
    pub(crate) output: Option<std::fs::File>,
    /// `\q` was given.
    pub(crate) quit: bool,
    /// Files `\i` is running now, one inside the other.
    pub(crate) include_depth: usize,
}

pub async fn run(engine: &Engine, args: SqlArgs) -> Result<ExitCode> {
    let mut shell = Shell {
        writer: ResultWriter::new(args.format, &args.delimiter, &args.null)?,
        timing: true,
        output: None,
        quit: false,
        include_depth: 0,
    };
    if !args.commands.is_empty() || !args.files.is_empty() {
        for command in &args.commands {
            run_script(engine, &mut shell, command).await?;
        }
        for file in &args.files {
            let text = read_file(file)?;
            run_script(engine, &mut shell, &text).await?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !std::io::stdin().is_terminal() {
        run_piped(engine, &mut shell).await?;
        return Ok(ExitCode::SUCCESS);
    }
    interactive(engine, &mut shell).await
}

pub(crate) fn read_file(path: &str) -> Result<String> {
    let mut text = String::new();
    let result = if path == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .map(|_| ())
    };
    result.map_err(|e| {
        let state = if e.kind() == std::io::ErrorKind::NotFound {
            SqlState::UNDEFINED_FILE
        } else {
            SqlState::IO_ERROR
        };
        CirroError::new(state, format!("could not read \"{path}\": {e}"))
    })?;
    Ok(text)
}

/// Run a script: its statements, and the backslash commands on lines of
/// their own between them. The first error ends it.
pub(crate) async fn run_script(engine: &Engine, shell: &mut Shell, text: &str) -> Result<()> {
    let mut buffer = String::new();
    for line in text.lines() {
        if shell.quit {
            return Ok(());
        }
        feed_line(engine, shell, &mut buffer, line).await?;
    }
    run_rest(engine, shell, &buffer).await
}

/// Take one line of input: a backslash command where a statement could
/// start, else part of the statement in `buffer`, run once complete.
async fn feed_line(
    engine: &Engine,
    shell: &mut Shell,
    buffer: &mut String,
    line: &str,
) -> Result<()> {
    if buffer.trim().is_empty() && line.trim_start().starts_with('\\') {
        return Box::pin(crate::meta::run(engine, shell, line.trim())).await;
    }
    buffer.push_str(line);
    buffer.push('\n');
    if is_complete(buffer) {
        run_rest(engine, shell, &std::mem::take(buffer)).await?;
    }
    Ok(())
}

/// Run the statements of `text` (no backslash commands).
async fn run_rest(engine: &Engine, shell: &mut Shell, text: &str) -> Result<()> {
    for statement in split_statements(text) {
        run_statement(engine, shell, &statement).await?;
    }
    Ok(())
}

/// SQL piped to stdin: each statement runs as soon as its `;` arrives (so a
/// driver can hold one process and send statements one at a time), and the
/// first error ends the run.
async fn run_piped(engine: &Engine, shell: &mut Shell) -> Result<()> {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<std::io::Result<String>>(16);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in std::io::BufRead::lines(stdin.lock()) {
            if sender.blocking_send(line).is_err() {
                break;
            }
        }
    });
    let mut buffer = String::new();
    while let Some(line) = receiver.recv().await {
        let line = line.map_err(|e| CirroError::io(format!("cannot read stdin: {e}")))?;
        if shell.quit {
            return Ok(());
        }
        feed_line(engine, shell, &mut buffer, &line).await?;
    }
    run_rest(engine, shell, &buffer).await
}

/// Run one statement and print what it produced. A panic inside the engine (a
/// bug, in Cirro or a library) becomes an XX000 error for this statement
/// instead of ending the process.
pub(crate) async fn run_statement(engine: &Engine, shell: &mut Shell, sql: &str) -> Result<()> {
    use futures::FutureExt;
    let work = std::panic::AssertUnwindSafe(execute_and_print(engine, shell, sql)).catch_unwind();
    // statement_timeout (SET statement_timeout = '2s') holds here as on the
    // servers: the statement is dropped, which stops its work.
    let ran = match engine.statement_timeout() {
        Some(limit) => match tokio::time::timeout(limit, work).await {
            Ok(ran) => ran,
            Err(_) => {
                engine.fail_transaction();
                return Err(CirroError::new(
                    SqlState::QUERY_CANCELED,
                    "canceling statement due to statement timeout",
                ));
            }
        },
        None => work.await,
    };
    match ran {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(CirroError::internal(format!(
                "internal error (please report): {message}"
            )))
        }
    }
}

async fn execute_and_print(engine: &Engine, shell: &mut Shell, sql: &str) -> Result<()> {
    let started = Instant::now();
    let outcome = engine.execute(sql).await?;
    print_outcome(shell, outcome, started).await
}

/// Print a statement's rows or tag (to `\o`'s file if set), with the time
/// it took unless `\timing` is off.
/// Print lines of text where results go (the screen, or `\o`'s file).
pub(crate) fn print_text(shell: &mut Shell, text: &str) -> Result<()> {
    let result = match &mut shell.output {
        Some(file) => writeln!(file, "{text}"),
        None => writeln!(std::io::stdout().lock(), "{text}"),
    };
    result.map_err(|e| CirroError::io(format!("cannot write output: {e}")))
}

pub(crate) async fn print_outcome(
    shell: &mut Shell,
    outcome: Outcome,
    started: Instant,
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut lock;
    let out: &mut dyn Write = match &mut shell.output {
        Some(file) => file,
        None => {
            lock = stdout.lock();
            &mut lock
        }
    };
    let data_only = shell.writer.format() != Format::Table;
    let time = |summary: String| {
        if shell.timing {
            let elapsed = started.elapsed().as_secs_f64() * 1000.0;
            format!("{summary}\nTime: {elapsed:.3} ms")
        } else {
            summary
        }
    };
    let summary = match outcome {
        Outcome::Rows(stream) => {
            let rows = shell.writer.write_stream(out, stream).await?;
            time(format!("({rows} row{})", if rows == 1 { "" } else { "s" }))
        }
        Outcome::Command { tag, notice, .. } => {
            if let Some(notice) = notice {
                eprintln!("NOTICE: {notice}");
            }
            time(tag)
        }
    };
    if data_only {
        eprintln!("{summary}");
    } else {
        writeln!(out, "{summary}").map_err(|e| CirroError::io(e.to_string()))?;
    }
    Ok(())
}

fn history_path() -> Option<std::path::PathBuf> {
    std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(HISTORY_FILE))
}

async fn interactive(engine: &Engine, shell: &mut Shell) -> Result<ExitCode> {
    let mut editor = DefaultEditor::new()
        .map_err(|e| CirroError::io(format!("cannot start the line editor: {e}")))?;
    let history = history_path();
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    // Take over SIGINT for the whole session: while a statement runs, Ctrl-C
    // cancels it (at the prompt the line editor reads Ctrl-C as a key).
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| CirroError::io(format!("cannot handle Ctrl-C: {e}")))?;
    println!(
        "Cirro {} — type SQL ending in ';', \\? for help, \\q to quit.",
        env!("CARGO_PKG_VERSION")
    );
    let mut buffer = String::new();
    loop {
        let prompt = if buffer.is_empty() {
            PROMPT
        } else {
            PROMPT_MORE
        };
        match editor.readline(prompt) {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() && matches!(trimmed, "quit" | "exit") {
                    break;
                }
                if buffer.trim().is_empty() && trimmed.starts_with('\\') {
                    let _ = editor.add_history_entry(trimmed);
                    if let Err(e) = crate::meta::run(engine, shell, trimmed).await {
                        print_error(&e);
                    }
                    if shell.quit {
                        break;
                    }
                    continue;
                }
                if !buffer.is_empty() {
                    buffer.push('\n');
                }
                buffer.push_str(&line);
                if !is_complete(&buffer) {
                    continue;
                }
                let _ = editor.add_history_entry(buffer.as_str());
                let text = std::mem::take(&mut buffer);
                for statement in split_statements(&text) {
                    let result = tokio::select! {
                        result = run_statement(engine, shell, &statement) => result,
                        _ = interrupts.recv() => Err(CirroError::new(
                            SqlState::QUERY_CANCELED,
                            "canceling statement due to user request",
                        )),
                    };
                    if let Err(e) = result {
                        print_error(&e);
                        break;
                    }
                }
            }
            Err(ReadlineError::Interrupted) => {
                buffer.clear();
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(CirroError::io(format!("cannot read input: {e}"))),
        }
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    Ok(ExitCode::SUCCESS)
}
