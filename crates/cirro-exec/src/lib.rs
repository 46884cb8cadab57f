//! Cirro's own planning rules and operators on top of DataFusion's.
//!
//! - `rules/`: analyzer and optimizer rules ([`rules::analyzer_rules`] puts
//!   them in their places around DataFusion's own);
//! - `functions/`: the scalar functions those rules put into plans;
//! - `jit/`: expressions compiled to machine code (Cranelift);
//! - `run_aggregate`: the partial phase of an aggregation over clustered keys;
//! - `filtered_aggregate`: a partial phase fused with the filter below it;
//! - `distribution`: the seam to a cluster's distributed execution;
//! - `resources`: the memory budget, the queries' pools, the spill area;
//! - `spill_join`: the hash join that spills.

pub mod conjunction;
pub mod distribution;
pub mod filtered_aggregate;
pub mod functions;
pub mod jit;
pub mod resources;
pub mod rules;
pub mod run_aggregate;
pub mod spill_join;
