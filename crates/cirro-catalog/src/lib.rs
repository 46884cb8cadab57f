//! The Cirro catalog: databases, schemas, tables and views, kept on the same
//! storage as the data so that every process (and later every node) sees it.
//!
//! The catalog is a sequence of immutable snapshots, `_catalog/v<version>.json`
//! under the data location. A change reads the latest snapshot, applies itself,
//! and writes the next version with create-if-absent: exactly one writer wins a
//! version, a loser re-reads and retries its change (or fails if it no longer
//! applies, e.g. the table now exists). A crash leaves either the old or the new
//! snapshot as latest, never a mixture.
//!
//! A table's entry points at a directory holding its Delta table. Directories
//! are named `<name>-<uuid>`, so DROP TABLE and CREATE TABLE AS are each one
//! catalog commit: data for a new table is written first, the catalog makes it
//! visible; a dropped table's directory is removed after the catalog forgets it.

pub mod commits;
pub mod coordination;
pub mod providers;
pub mod rows;
pub mod state;
pub mod users;
pub mod versions;

pub use commits::{CommitTicket, MultiCommits, Reader};
pub use coordination::{Coordination, HeldLock, NodeInfo};
pub use providers::{CirroCatalogList, PAST_VERSION_PREFIX, SessionTables, ViewPlanner};
pub use state::{Catalog, CatalogState, DEFAULT_DATABASE, DEFAULT_SCHEMA, TableEntry, ViewEntry};
pub use users::{Privilege, ScramVerifier, UserEntry};
pub use versions::{FileVersions, MemoryVersions, VersionStore};
