//! The Cirro SQL engine of one session: a DataFusion session over the Cirro
//! catalog, and the one statement handler every front end calls (the
//! PostgreSQL and Flight SQL servers, the `cirro sql` shell).
//!
//! ```text
//!  text ─► Engine::parse      cirro-sql: parsed once into a Statement, one
//!                             variant per kind
//!       ─► Engine::run(parsed)                       one statement, no parameters
//!       ─► Engine::prepare(parsed) ─► Engine::execute_prepared(prepared, values)
//! ```
//!
//! Where things live:
//! - `session/`: the [`Engine`] of one session (`mod.rs`), its settings,
//!   its transaction, its prepared statements and the SQL functions it
//!   registers;
//! - `statement/`: the one dispatch on a statement's kind (`mod.rs`), then
//!   one executor per kind (queries and DML, DDL, views, indexes, ALTER,
//!   COPY, access control, maintenance);
//! - `node.rs`: the [`Node`] a process builds once and every session shares
//!   (memory budget, tiers, compiled-expression cache, GPU);
//! - `planner.rs`: every rule Cirro adds to DataFusion's analyzer and
//!   optimizers, in order, and the session state they make;
//! - `system/`: the `cirro` system tables, PostgreSQL's catalog, the
//!   registry of sessions and statements a server keeps;
//! - `storage.rs`: where a table's files are (for the cluster's locality).

mod node;
mod planner;
pub mod rows;
mod session;
mod statement;
mod storage;
pub mod system;

pub use cirro_sql::{
    CopyIn, CopyOutSource, SettingStatement, TextFormat, is_complete, split_statements,
};
pub use node::{Node, NodeConfig};
pub use planner::{EngineOptions, cut_rules, local_rules};
pub use session::prepared::{NUMERIC_AT_BIND, Prepared};
pub use session::settings::SERVER_VERSION;
pub use session::{Engine, EngineConfig, Flag};
pub use statement::Outcome;
pub use statement::access::bootstrap_superuser;
pub use statement::copy_text::encode_row;
pub use storage::TableStorage;
pub use system::{activity, visibility};
