//! `cirro`: the one binary of Cirro.
//!
//! - `cirro sql` — the SQL shell, or a script runner with `-c` / `-f`;
//! - `cirro load tpch|ssb` — generate and load the benchmark data sets.
//!
//! Every command works on one data location (`--data`, `CIRRO_DATA`, default
//! `./cirro-data`), which holds the catalog and the tables.

mod load;
mod output;
mod shell;

use std::process::ExitCode;

use cirro_common::CirroError;
use cirro_engine::{Engine, EngineConfig};
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "cirro",
    version,
    about = "Cirro: a SQL analytics engine for data on shared storage"
)]
struct Cli {
    /// Data location: a directory (created if missing) or a file:// URL.
    #[arg(
        long,
        global = true,
        env = "CIRRO_DATA",
        default_value = "./cirro-data"
    )]
    data: String,
    /// Threads for query execution (DataFusion target_partitions); default: all cores.
    #[arg(long, global = true, env = "CIRRO_THREADS")]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run SQL: an interactive shell, or the statements of -c and -f.
    Sql(SqlArgs),
    /// Generate and load a benchmark data set.
    Load {
        #[command(subcommand)]
        dataset: load::Dataset,
    },
}

#[derive(clap::Args, Debug)]
pub struct SqlArgs {
    /// SQL to run (several statements separated by ';'); may be repeated.
    #[arg(short = 'c', long = "command")]
    commands: Vec<String>,
    /// A file of SQL statements to run; may be repeated ('-' reads stdin).
    #[arg(short = 'f', long = "file")]
    files: Vec<String>,
    /// Output format of query results.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Field delimiter for --format csv.
    #[arg(long, default_value = ",")]
    delimiter: String,
    /// Text printed for NULL in csv and table output (default: empty).
    #[arg(long, default_value = "")]
    null: String,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ERROR: cannot start the runtime: {e} (SQLSTATE XX000)");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            output::print_error(&e);
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, CirroError> {
    let config = EngineConfig {
        target_partitions: cli.threads,
    };
    let engine = Engine::open(&cli.data, config).await?;
    match cli.command {
        Command::Sql(args) => shell::run(&engine, args).await,
        Command::Load { dataset } => load::run(&engine, dataset)
            .await
            .map(|()| ExitCode::SUCCESS),
    }
}
