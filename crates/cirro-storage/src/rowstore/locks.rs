//! Row locks: a writer of a key holds the key's lock until its transaction
//! ends, so two writers of one row take turns (PostgreSQL's row-level
//! locks); writers of different rows never wait for each other.
//!
//! A writer that finds the key locked waits for the holder to end. Before
//! it waits it follows the chain of waits from the holder: if the chain
//! comes back to the writer, waiting would never end, and the writer fails
//! with 40P01 (deadlock detected) instead, as PostgreSQL does.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use cirro_common::{CirroError, Result, SqlState};
use tokio::sync::Notify;

use super::Key;

/// Who holds locks: a transaction (or a statement outside one).
pub type Owner = u64;

#[derive(Debug, Default)]
struct State {
    /// (table, key) → its holder, with what wakes its waiters.
    held: HashMap<(String, Key), (Owner, Arc<Notify>)>,
    /// Waiter → the holder it waits for.
    waits: HashMap<Owner, Owner>,
}

/// The row locks of one process.
#[derive(Debug, Default)]
pub struct RowLocks {
    state: Mutex<State>,
}

/// A held lock; released (and its waiters woken) on drop.
#[derive(Debug)]
pub struct RowLock {
    locks: Arc<RowLocks>,
    table: String,
    key: Key,
}

impl Drop for RowLock {
    fn drop(&mut self) {
        let mut state = self.locks.state.lock().unwrap_or_else(|p| p.into_inner());
        let entry = (
            std::mem::take(&mut self.table),
            std::mem::take(&mut self.key),
        );
        if let Some((_, notify)) = state.held.remove(&entry) {
            notify.notify_waiters();
        }
    }
}

/// Removes a waiter's edge when its wait ends (or is cancelled).
struct Waiting<'a> {
    locks: &'a RowLocks,
    owner: Owner,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.locks.state.lock().unwrap_or_else(|p| p.into_inner());
        state.waits.remove(&self.owner);
    }
}

impl RowLocks {
    /// Lock `key` of `table` for `owner`, waiting while another owner holds
    /// it. None if `owner` holds it already. 40P01 if waiting would deadlock.
    pub async fn lock(
        self: &Arc<Self>,
        table: &str,
        key: &[u8],
        owner: Owner,
    ) -> Result<Option<RowLock>> {
        let entry = (table.to_string(), Key::from(key));
        loop {
            let notify = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                match state.held.get(&entry) {
                    None => {
                        state
                            .held
                            .insert(entry.clone(), (owner, Arc::new(Notify::new())));
                        return Ok(Some(RowLock {
                            locks: Arc::clone(self),
                            table: entry.0,
                            key: entry.1,
                        }));
                    }
                    Some((holder, _)) if *holder == owner => return Ok(None),
                    Some((holder, notify)) => {
                        let (holder, notify) = (*holder, Arc::clone(notify));
                        // Would the holder (through whom it waits for) wait
                        // for this owner?
                        let mut at = holder;
                        let mut steps = 0;
                        while let Some(&next) = state.waits.get(&at) {
                            if next == owner || steps > state.waits.len() {
                                return Err(CirroError::new(
                                    SqlState::DEADLOCK_DETECTED,
                                    "deadlock detected: two transactions wait for rows \
                                     the other one changed; this one was rolled back, \
                                     retry it",
                                ));
                            }
                            at = next;
                            steps += 1;
                        }
                        state.waits.insert(owner, holder);
                        notify
                    }
                }
            };
            let _waiting = Waiting { locks: self, owner };
            let mut notified = pin!(notify.notified());
            notified.as_mut().enable();
            // Released between the check and `enable`: look again.
            let released = {
                let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                state
                    .held
                    .get(&entry)
                    .is_none_or(|(_, n)| !Arc::ptr_eq(n, &notify))
            };
            if !released {
                notified.await;
            }
        }
    }

    /// Locks held now (for tests and `cirro.locks`).
    pub fn held(&self) -> usize {
        self.state.lock().map(|s| s.held.len()).unwrap_or(0)
    }
}
