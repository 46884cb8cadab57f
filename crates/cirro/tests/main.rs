//! Cirro's integration tests, one module per file, in one test binary:
//! libtest keeps two tests running at any time across all of them, so one
//! file's long test (a chain of 20,000 operators, the cluster runs of the
//! sqllogictest suite) overlaps the others instead of leaving a core idle
//! at the end of its own binary, and the tests link once instead of 35
//! times. Run one file's tests with `cargo test --profile ci -p cirro
//! --test integration <file>::`.

mod common;

// libtest starts tests in the order of their names, one per core: the
// sqllogictest runs (the longest, up to five minutes on an HDFS cluster)
// sort first under this name, so the rest run beside them rather than one
// of them running alone at the end.
#[path = "slt.rs"]
mod _slt;

mod aggregation;
mod bench;
mod cache;
mod cache_dir;
mod cli;
mod cluster;
mod concurrency;
mod concurrency_invariant;
mod console;
mod crash;
mod crash_dml;
mod crash_rows;
mod ddl_transactions;
mod differential;
mod differential_queries;
mod disk_full;
mod fuzz;
mod gpu;
mod hardening;
mod history;
mod interop;
mod jit;
mod load_memory;
mod pg_reference;
mod privacy;
mod pruning;
mod remote_storage;
mod resources;
mod server;
mod shared;
mod shell;
mod ssb;
mod statement_path;
mod tpch;
mod transactions;
