//! The shell's backslash commands (psql's names). Each runs at once; an
//! unknown one is an error, never the start of a statement.

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use cirro_common::{CirroError, Result, SqlState};
use cirro_engine::{Engine, Outcome};

use crate::Format;
use crate::shell::{Shell, print_outcome, read_file, run_script, run_statement};

const HELP: &str = "\
General
  \\q                     quit
  \\? | \\h               this help
Informational
  \\d [NAME]              list tables and views, or describe table/view NAME
  \\dt                    list tables
  \\dv                    list views
  \\du                    list users
  \\l                     list databases
Input/Output
  \\i FILE                run the statements (and commands) in FILE
  \\o [FILE]              send results to FILE, or back to the screen
Formatting
  \\pset format FORMAT    table (aligned), csv, json
  \\x [on|off]            expanded display (one line per column)
  \\timing [on|off]       show how long each statement took";

fn invalid(message: impl Into<String>) -> CirroError {
    CirroError::new(SqlState::SYNTAX_ERROR, message)
}

/// `on`, `off`, or (None) the opposite of `current`.
fn toggle(argument: Option<&str>, current: bool, command: &str) -> Result<bool> {
    match argument.map(str::to_ascii_lowercase).as_deref() {
        None => Ok(!current),
        Some("on" | "true" | "1") => Ok(true),
        Some("off" | "false" | "0") => Ok(false),
        Some(other) => Err(invalid(format!(
            "\\{command}: unrecognized value \"{other}\": on or off expected"
        ))),
    }
}

fn relations(kind: Option<&str>) -> String {
    let filter = match kind {
        Some(kind) => format!("AND table_type = '{kind}'"),
        None => String::new(),
    };
    format!(
        "SELECT table_schema AS \"Schema\", table_name AS \"Name\", \
         CASE table_type WHEN 'BASE TABLE' THEN 'table' ELSE lower(table_type) END AS \"Type\" \
         FROM information_schema.tables \
         WHERE table_catalog = current_database() \
         AND table_schema NOT IN ('information_schema', 'pg_catalog', 'cirro') {filter} ORDER BY 1, 2"
    )
}

/// Files `\i` may nest (a file that includes itself stops here, with an
/// error, instead of exhausting the stack).
const INCLUDE_DEPTH_MAX: usize = 32;

/// Run one backslash command line.
pub(crate) async fn run(engine: &Engine, shell: &mut Shell, line: &str) -> Result<()> {
    let mut words = line.split_whitespace();
    let command = words.next().unwrap_or("\\");
    let argument = words.next();
    let name = command.trim_start_matches('\\');
    match name {
        "q" => shell.quit = true,
        "?" | "h" | "help" => println!("{HELP}"),
        "timing" => {
            shell.timing = toggle(argument, shell.timing, name)?;
            println!("Timing is {}.", if shell.timing { "on" } else { "off" });
        }
        "x" => {
            let expanded = toggle(argument, shell.writer.expanded(), name)?;
            shell.writer.set_expanded(expanded);
            println!(
                "Expanded display is {}.",
                if expanded { "on" } else { "off" }
            );
        }
        "pset" => match (argument, words.next()) {
            (Some("format"), Some(format)) => {
                let format = match format.to_ascii_lowercase().as_str() {
                    "table" | "aligned" => Format::Table,
                    "csv" => Format::Csv,
                    "json" => Format::Json,
                    other => {
                        return Err(invalid(format!(
                            "\\pset: allowed formats are table (aligned), csv, json; not \"{other}\""
                        )));
                    }
                };
                shell.writer.set_format(format);
                println!("Output format is {format:?}.");
            }
            _ => return Err(invalid("\\pset: only \\pset format FORMAT is supported")),
        },
        "o" => {
            shell.output = match argument {
                None => None,
                Some(path) => Some(std::fs::File::create(path).map_err(|e| {
                    CirroError::new(SqlState::IO_ERROR, format!("\\o: {path}: {e}"))
                })?),
            };
            // Tables in a file are not wrapped to the screen.
            shell.writer.set_width(if shell.output.is_some() {
                None
            } else {
                crate::output::screen_width()
            });
        }
        "i" | "include" => {
            let path = argument.ok_or_else(|| invalid("\\i: missing required argument"))?;
            if shell.include_depth >= INCLUDE_DEPTH_MAX {
                return Err(CirroError::new(
                    SqlState::STATEMENT_TOO_COMPLEX,
                    format!(
                        "\\i {path}: files include each other more than {INCLUDE_DEPTH_MAX} deep"
                    ),
                ));
            }
            let text = read_file(path)?;
            shell.include_depth += 1;
            let result = run_script(engine, shell, &text).await;
            shell.include_depth -= 1;
            result?;
        }
        "d" => match argument {
            None => run_statement(engine, shell, &relations(None)).await?,
            Some(table) => {
                run_statement(engine, shell, &format!("DESCRIBE {table}")).await?;
                let footer = engine.describe_footer(table).await?;
                if !footer.is_empty() {
                    crate::shell::print_text(shell, &footer.join("\n"))?;
                }
            }
        },
        "dt" => run_statement(engine, shell, &relations(Some("BASE TABLE"))).await?,
        "dv" => run_statement(engine, shell, &relations(Some("VIEW"))).await?,
        "l" => {
            let sql = "SELECT DISTINCT catalog_name AS \"Name\" \
                       FROM information_schema.schemata ORDER BY 1";
            run_statement(engine, shell, sql).await?
        }
        "du" => {
            let started = Instant::now();
            let snapshot = engine.catalog().snapshot();
            let names = StringArray::from_iter_values(snapshot.users.keys());
            let attributes = StringArray::from_iter_values(
                snapshot
                    .users
                    .values()
                    .map(|u| if u.superuser { "Superuser" } else { "" }),
            );
            let schema = Arc::new(Schema::new(vec![
                Field::new("Role name", DataType::Utf8, false),
                Field::new("Attributes", DataType::Utf8, false),
            ]));
            let batch = RecordBatch::try_new(schema, vec![Arc::new(names), Arc::new(attributes)])?;
            let stream = engine.context().read_batch(batch)?.execute_stream().await?;
            print_outcome(shell, Outcome::Rows(stream), started).await?;
        }
        _ => {
            return Err(invalid(format!(
                "invalid command {command}; try \\? for help"
            )));
        }
    }
    Ok(())
}
