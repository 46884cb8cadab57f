//! The GPU operators against DataFusion's answers, on the machine's device
//! (lavapipe in CI): one test binary, a module per operator.

mod common;

mod aggregate;
mod cache;
mod filter;
mod join;
mod memory;
mod projection;
mod scheduler;
mod sort;
