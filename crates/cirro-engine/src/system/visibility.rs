//! Who sees which statement texts, as PostgreSQL's `pg_stat_activity` has
//! it: a user sees the text (and the plan and error) of its own sessions'
//! statements only; superusers see everyone's; a member of
//! `pg_read_all_stats` sees every text, with each literal shown as `$n`
//! where the statement names a table (or view, or table function) it may not
//! SELECT. Others' rows stay listed with `<insufficient privilege>` as their
//! text, as PostgreSQL shows them.
//!
//! `cirro.queries`, `pg_stat_activity`, the console's `/api/queries` and the
//! Flight SQL server (which runs the same SQL) all pass their rows through
//! one [`StatementViewer`]. Passwords never reach a text: the registry keeps
//! texts with their `PASSWORD '…'` redacted (`cirro_sql::redact_passwords`).

use std::sync::Arc;

use cirro_catalog::users::READ_ALL_STATS;
use cirro_catalog::{Catalog, CatalogState, DEFAULT_SCHEMA, Privilege};

use crate::system::activity::{BackendInfo, QueryView};

/// What PostgreSQL shows in place of a text the viewer may not see.
pub const HIDDEN_TEXT: &str = "<insufficient privilege>";

/// Schemas every user may read (system tables).
const SYSTEM_SCHEMAS: &[&str] = &["cirro", "pg_catalog", "information_schema"];

/// How much of one statement a viewer sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sight {
    /// Text, plan, error.
    Full,
    /// The text with literals as `$n`; no plan, no error.
    Normalized,
    /// Nothing but that it exists.
    Hidden,
}

/// One viewer of the statement registry.
#[derive(Clone)]
pub struct StatementViewer {
    catalog: Arc<Catalog>,
    /// None: the local shell, which has the data directory anyway.
    user: Option<String>,
}

impl std::fmt::Debug for StatementViewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatementViewer")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl StatementViewer {
    pub fn new(catalog: Arc<Catalog>, user: Option<String>) -> Self {
        Self { catalog, user }
    }

    fn sight(&self, state: &CatalogState, owner: &str, database: &str, text: &str) -> Sight {
        let Some(user) = &self.user else {
            return Sight::Full;
        };
        let Some(entry) = state.users.get(user) else {
            return Sight::Hidden;
        };
        if entry.superuser || owner == user {
            return Sight::Full;
        }
        if !entry.roles.contains(READ_ALL_STATS) {
            return Sight::Hidden;
        }
        match cirro_sql::redact::relations(text) {
            Some(names)
                if names
                    .iter()
                    .all(|n| self.may_select(state, user, database, n)) =>
            {
                Sight::Full
            }
            _ => Sight::Normalized,
        }
    }

    fn may_select(
        &self,
        state: &CatalogState,
        user: &str,
        database: &str,
        name: &[String],
    ) -> bool {
        let (db, schema, table) = match name {
            [table] => (database, DEFAULT_SCHEMA, table.as_str()),
            [schema, table] => (database, schema.as_str(), table.as_str()),
            [db, schema, table] => (db.as_str(), schema.as_str(), table.as_str()),
            _ => return false,
        };
        if let Some(entry) = state.table(db, schema, table) {
            return crate::statement::access::user_holds(user, entry, Privilege::Select);
        }
        if let Some(view) = state.view(db, schema, table) {
            return view.owner.as_deref() == Some(user);
        }
        SYSTEM_SCHEMAS.contains(&schema) && name.len() > 1
    }

    /// `views` as this viewer may see them (the same rows, texts hidden or
    /// normalized where it may not see them).
    pub fn queries(&self, mut views: Vec<QueryView>) -> Vec<QueryView> {
        let state = self.catalog.snapshot();
        for view in &mut views {
            let sight = self.sight(&state, &view.user, &view.database, &view.query);
            if sight == Sight::Full {
                continue;
            }
            view.query = match sight {
                Sight::Normalized => cirro_sql::normalize_literals(&view.query)
                    .unwrap_or_else(|| HIDDEN_TEXT.to_string()),
                _ => HIDDEN_TEXT.to_string(),
            };
            view.plan = None;
            view.error = None;
        }
        views
    }

    /// `backends` as this viewer may see them.
    pub fn backends(&self, mut backends: Vec<BackendInfo>) -> Vec<BackendInfo> {
        let state = self.catalog.snapshot();
        for backend in &mut backends {
            match self.sight(&state, &backend.user, &backend.database, &backend.query) {
                Sight::Full => {}
                Sight::Normalized => {
                    backend.query = cirro_sql::normalize_literals(&backend.query)
                        .unwrap_or_else(|| HIDDEN_TEXT.to_string())
                }
                Sight::Hidden => backend.query = HIDDEN_TEXT.to_string(),
            }
        }
        backends
    }
}
