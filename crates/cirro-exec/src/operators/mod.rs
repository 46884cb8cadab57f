//! Cirro's own operators (`ExecutionPlan`s), each placed by a rule in
//! `rules/`: the partial aggregation over clustered keys
//! (`run_aggregate.rs`), that aggregation fused with the filter below it
//! (`filtered_aggregate.rs`), the hash join that spills (`spill_join/`),
//! one copy of a repeated subtree (`shared.rs`), and the partitions of a
//! query written into a table in their order (`concat.rs`).

pub mod concat;
pub mod filtered_aggregate;
pub mod run_aggregate;
pub mod shared;
pub mod spill_join;
