//! Shared pieces of every Cirro crate: the error type with its SQLSTATE code,
//! the mapping from DataFusion, Arrow and Delta errors onto SQLSTATE codes, and
//! the named limits that bound queues, files and batches.

pub mod batch;
pub mod char_length;
pub mod error;
pub mod limits;
pub mod privilege;

pub use error::{CirroError, Result, SqlState};
pub use privilege::Privilege;
