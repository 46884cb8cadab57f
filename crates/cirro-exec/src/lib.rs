//! Cirro's own planning rules and operators on top of DataFusion's.
//!
//! - `rules/`: analyzer and optimizer rules (the engine's planner puts them
//!   in their places around DataFusion's own);
//! - `functions/`: the scalar functions those rules put into plans;
//! - `jit/`: expressions compiled to machine code (Cranelift);
//! - `operators/`: Cirro's own operators, which those rules place (the
//!   partial phase of an aggregation over clustered keys, that phase fused
//!   with the filter below it, the hash join that spills, shared subplans);
//! - `distribution`: the seam to a cluster's distributed execution;
//! - `resources`: the memory budget, the queries' pools, the spill area.

pub mod conjunction;
pub mod distribution;
pub mod functions;
pub mod jit;
pub mod operators;
pub mod resources;
pub mod rules;
