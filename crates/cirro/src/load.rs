//! `cirro load tpch|ssb`: generate a benchmark data set and load it, streaming.
//!
//! Each table is generated on its own thread and handed to the loader through
//! a bounded channel, so memory stays flat whatever the scale factor. Each
//! table is loaded atomically (the table appears with all its rows or not at
//! all); existing tables give 42P07 unless `--replace`.

use std::path::PathBuf;
use std::time::Instant;

use arrow::array::RecordBatch;
use cirro_common::{CirroError, Result, SqlState};
use cirro_datagen::{GeneratedTable, check_scale_factor, ssb, tpch};
use cirro_engine::Engine;
use clap::Subcommand;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};

/// Batches in flight between a generator thread and the loader.
const CHANNEL_BATCHES_MAX: usize = 4;

#[derive(Subcommand, Debug)]
pub enum Dataset {
    /// TPC-H (8 tables), generated exactly as the official dbgen does.
    Tpch {
        /// Scale factor (1 = about 1 GB of raw data).
        #[arg(long)]
        sf: f64,
        /// Schema to load into.
        #[arg(long, default_value = "public")]
        schema: String,
        /// Replace tables that already exist.
        #[arg(long)]
        replace: bool,
    },
    /// Star Schema Benchmark (5 tables): generated, or loaded from dbgen .tbl files.
    Ssb {
        /// Scale factor for the generator.
        #[arg(
            long,
            required_unless_present = "from_tbl",
            conflicts_with = "from_tbl"
        )]
        sf: Option<f64>,
        /// Load dbgen's customer/part/supplier/date/lineorder .tbl files from this directory.
        #[arg(long)]
        from_tbl: Option<PathBuf>,
        /// Schema to load into.
        #[arg(long, default_value = "public")]
        schema: String,
        /// Replace tables that already exist.
        #[arg(long)]
        replace: bool,
    },
}

pub async fn run(engine: &Engine, dataset: Dataset) -> Result<()> {
    match dataset {
        Dataset::Tpch {
            sf,
            schema,
            replace,
        } => {
            check_scale_factor(sf)
                .map_err(|e| CirroError::new(SqlState::INVALID_PARAMETER_VALUE, e))?;
            load_generated(engine, &schema, tpch::tables(sf), replace).await
        }
        Dataset::Ssb {
            sf: Some(sf),
            from_tbl: None,
            schema,
            replace,
        } => {
            check_scale_factor(sf)
                .map_err(|e| CirroError::new(SqlState::INVALID_PARAMETER_VALUE, e))?;
            load_generated(engine, &schema, ssb::tables(sf), replace).await
        }
        Dataset::Ssb {
            from_tbl: Some(dir),
            schema,
            replace,
            ..
        } => load_tbl(engine, &schema, &dir, replace).await,
        Dataset::Ssb { .. } => Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            "give --sf or --from-tbl",
        )),
    }
}

fn progress(name: &str, rows: u64) -> ProgressBar {
    let bar = ProgressBar::new(rows);
    let style =
        ProgressStyle::with_template("{prefix:>10} [{bar:30}] {pos}/{len} rows ({per_sec}, {eta})")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(name.to_string());
    bar
}

fn report(name: &str, rows: u64, started: Instant) {
    eprintln!(
        "loaded {name}: {rows} rows in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

async fn load_generated(
    engine: &Engine,
    schema: &str,
    tables: Vec<GeneratedTable>,
    replace: bool,
) -> Result<()> {
    let names: Vec<&str> = tables.iter().map(|t| t.name).collect();
    engine.check_new_tables(schema, &names, replace).await?;
    for table in tables {
        let started = Instant::now();
        let bar = progress(table.name, table.rows_estimate);
        let (sender, receiver) =
            tokio::sync::mpsc::channel::<Result<RecordBatch>>(CHANNEL_BATCHES_MAX);
        let make = table.batches;
        let generator = std::thread::spawn(move || {
            for batch in make() {
                let batch = batch.map_err(CirroError::from);
                let failed = batch.is_err();
                if sender.blocking_send(batch).is_err() || failed {
                    break;
                }
            }
        });
        let counted = bar.clone();
        let stream = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        })
        .map(move |batch| {
            if let Ok(batch) = &batch {
                counted.inc(batch.num_rows() as u64);
            }
            batch
        });
        let result = engine
            .load_table(schema, table.name, &table.schema, Box::pin(stream), replace)
            .await;
        bar.finish_and_clear();
        // The loader has dropped the receiver: the generator ends at its next send.
        let _ = generator.join();
        report(table.name, result?, started);
    }
    Ok(())
}

async fn load_tbl(
    engine: &Engine,
    schema: &str,
    dir: &std::path::Path,
    replace: bool,
) -> Result<()> {
    let names: Vec<&str> = ssb::TABLE_FILES.iter().map(|(name, _)| *name).collect();
    engine.check_new_tables(schema, &names, replace).await?;
    for (name, file) in ssb::TABLE_FILES {
        let path = dir.join(file);
        let path = path
            .to_str()
            .ok_or_else(|| CirroError::io("the .tbl directory path is not UTF-8"))?;
        let table_schema = ssb::schema_of(name)
            .ok_or_else(|| CirroError::internal(format!("no schema for {name}")))?;
        let started = Instant::now();
        let stream = engine
            .read_delimited(path, &table_schema, b'|', false)
            .await?;
        let rows = engine
            .load_table(schema, name, &table_schema, stream, replace)
            .await?;
        report(name, rows, started);
    }
    Ok(())
}
