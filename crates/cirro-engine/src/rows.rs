//! The background flush of a data location's row stores (see
//! `cirro_catalog::rows`), and the flush before statements that change or
//! read tables through their files other than DML.

use std::sync::{Arc, Weak};

use cirro_catalog::Catalog;
use cirro_common::{CirroError, Result};
use datafusion::execution::SessionState;
use datafusion::prelude::SessionContext;

use crate::Engine;

/// A DataFusion session the flush scans and writes with.
fn flush_state(catalog: &Catalog) -> SessionState {
    let ctx = SessionContext::new();
    let root = catalog.root();
    if root.url().scheme() != "file" {
        ctx.register_object_store(root.url(), Arc::clone(root.store()));
    }
    ctx.state()
}

/// Flush `catalog`'s row stores every `flush_every` of its row service
/// ([`cirro_catalog::rows::FLUSH_EVERY`] by default; sooner when they
/// pass their budget) until the catalog is dropped.
pub fn spawn_flusher(catalog: Weak<Catalog>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let waited = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                let Some(catalog) = catalog.upgrade() else {
                    return;
                };
                let Some(service) = catalog.row_service() else {
                    return;
                };
                if waited.elapsed() >= service.flush_every() || service.over_budget() {
                    break;
                }
            }
            let Some(catalog) = catalog.upgrade() else {
                return;
            };
            flush_now(&catalog).await;
        }
    })
}

/// Flush every row store of `catalog` now (failures are logged: the rows
/// stay in the store and the log, and the next flush tries again).
pub async fn flush_now(catalog: &Catalog) {
    let Some(service) = catalog.row_service() else {
        return;
    };
    let state = flush_state(catalog);
    if let Err(e) = service.flush_all(catalog, &state).await {
        log::warn!("row store flush: {e}");
    }
}

impl Engine {
    /// Before a statement that works on tables through their files (ALTER
    /// TABLE, CREATE INDEX, COPY, VACUUM, OPTIMIZE): write the row stores
    /// into them. 0A000 in a transaction that made small writes (they hold
    /// their tables until COMMIT).
    pub(crate) async fn flush_row_stores(&self, what: &str) -> Result<()> {
        let Some(service) = self.catalog.row_service() else {
            return Ok(());
        };
        let in_txn = self.in_transaction();
        let appends = if in_txn && self.session.rows.has_pending() {
            crate::statement::point::take_pending_appends(self, what)?
        } else {
            Vec::new()
        };
        if self.holds_small_write_gates() {
            return Err(CirroError::unsupported(format!(
                "this transaction made small writes, so it cannot run {what}: COMMIT first"
            )));
        }
        let state = self.context().state();
        // The flush waits for the tables' gates, which open transactions
        // with small writes hold: their next statements need the place in
        // admission this one would otherwise keep (32 clients of the soak
        // test stalled so, COPY … TO then flushing).
        self.wait_for("relation", service.flush_all(&self.catalog, &state))
            .await?;
        if in_txn {
            for location in self.session.pinned_locations() {
                crate::statement::point::repin_after_flush(self, &location).await?;
            }
            crate::statement::point::stage_appends(self, appends).await?;
        }
        Ok(())
    }

    fn holds_small_write_gates(&self) -> bool {
        self.peek_transaction(|t| !t.points.gates.is_empty())
            .unwrap_or(false)
    }
}
