//! One client's session, whichever front end carries it: its engine (the
//! statement handler, with the transaction, settings and catalog pins) and
//! the handle that cancels its running statement.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cirro_common::{CirroError, Result, SqlState};
use cirro_engine::Engine;
use tokio::sync::Notify;

/// Cancels the statement a session is running (CancelRequest, the client
/// going away, statement_timeout).
#[derive(Debug, Default)]
pub(crate) struct Canceller {
    cancelled: AtomicBool,
    notify: Notify,
    terminated: AtomicBool,
    terminate: Notify,
}

impl cirro_engine::activity::BackendSignal for Canceller {
    fn cancel(&self) {
        Canceller::cancel(self);
    }

    fn terminate(&self) {
        self.terminated.store(true, Ordering::SeqCst);
        self.terminate.notify_waiters();
        Canceller::cancel(self);
    }
}

impl Canceller {
    /// Resolves once the session is terminated (`pg_terminate_backend`).
    pub(crate) async fn terminated(&self) {
        loop {
            let notified = self.terminate.notified();
            if self.terminated.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }

    /// Whether `pg_terminate_backend` ended the session.
    pub(crate) fn is_terminated(&self) -> bool {
        self.terminated.load(Ordering::SeqCst)
    }

    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Forget a cancel that arrived between statements (PostgreSQL ignores it).
    pub(crate) fn reset(&self) {
        self.cancelled.store(false, Ordering::SeqCst);
    }

    /// Resolves with the error the statement ends with: 57014 on cancel or
    /// when `timeout` (if any) passes.
    pub(crate) async fn interrupted(&self, timeout: Option<Duration>) -> CirroError {
        let cancelled = async {
            loop {
                let notified = self.notify.notified();
                if self.cancelled.load(Ordering::SeqCst) {
                    return;
                }
                notified.await;
            }
        };
        match timeout {
            Some(limit) => tokio::select! {
                _ = cancelled => canceled(),
                _ = tokio::time::sleep(limit) => CirroError::new(
                    SqlState::QUERY_CANCELED,
                    "canceling statement due to statement timeout",
                ),
            },
            None => {
                cancelled.await;
                canceled()
            }
        }
    }
}

fn canceled() -> CirroError {
    CirroError::new(
        SqlState::QUERY_CANCELED,
        "canceling statement due to user request",
    )
}

pub(crate) struct Session {
    pub(crate) engine: Engine,
    pub(crate) canceller: Arc<Canceller>,
    /// Prepared statements forgotten by `DEALLOCATE` (see [`Deallocated`]).
    pub(crate) deallocated: std::sync::Mutex<Deallocated>,
}

/// What `DEALLOCATE` forgot. The protocol's statements live in pgwire's
/// store, which a SQL statement cannot reach, so each statement carries the
/// generation it was parsed in and is refused (26000) when a later
/// `DEALLOCATE ALL`, or `DEALLOCATE` of its name, came after it.
#[derive(Debug, Default)]
pub(crate) struct Deallocated {
    /// Generation of the next statement parsed.
    next: u64,
    /// Statements before this generation are gone (`DEALLOCATE ALL`).
    all_before: u64,
    /// Per name: statements of that name before this generation are gone.
    names: std::collections::HashMap<String, u64>,
}

impl Deallocated {
    /// The generation of a statement being parsed now.
    pub(crate) fn parsed(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    pub(crate) fn forget(&mut self, name: Option<String>) {
        match name {
            None => {
                self.all_before = self.next + 1;
                self.names.clear();
            }
            Some(name) => {
                self.names.insert(name, self.next + 1);
            }
        }
    }

    pub(crate) fn is_gone(&self, name: &str, generation: u64) -> bool {
        generation < self.all_before || self.names.get(name).is_some_and(|g| generation < *g)
    }
}

impl Session {
    /// A session over `engine` with PostgreSQL's catalog and functions
    /// (`database` is the current database).
    pub(crate) fn new(engine: Engine, database: &str, canceller: Arc<Canceller>) -> Result<Self> {
        engine.enable_pg_compat(database)?;
        Ok(Self {
            engine,
            canceller,
            deallocated: std::sync::Mutex::new(Deallocated::default()),
        })
    }

    /// The statement timeout in force (None: no limit).
    pub(crate) fn statement_timeout(&self) -> Option<Duration> {
        self.engine.statement_timeout()
    }
}
