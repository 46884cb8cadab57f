//! Cirro tables on shared storage.
//!
//! A Cirro table is a Delta table: a directory holding Parquet data files and a
//! `_delta_log/` of JSON commits. This crate creates and opens such tables, scans
//! them through DataFusion (see [`table::CirroTable`]), and appends to or replaces
//! their contents atomically (see [`write`]). Data files are always written before
//! the commit that makes them visible, so a crash at any point leaves the table at
//! its previous version; unreferenced files are garbage, never data.

pub mod bucket;
pub mod cache;
pub mod dv;
pub mod evolve;
pub mod failpoint;
pub mod footprint;
pub mod maintenance;
pub mod mutate;
pub mod options;
pub mod root;
pub mod rowstore;
pub mod schema;
pub mod stats;
mod stores;
pub mod table;
mod timeouts;
pub mod wal;
mod watch;
pub mod write;

pub use root::StorageRoot;
pub use table::{CirroTable, TableOptions};
