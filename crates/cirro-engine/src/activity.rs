//! The server's registry of backends: one entry per client session, with
//! what it runs (PostgreSQL's states), shown by `pg_stat_activity` and
//! signalled by `pg_cancel_backend` / `pg_terminate_backend`. The resources
//! and GPU work extend this one list.
//!
//! Backend pids are unique within a cluster: the node id sits in the high
//! bits (`node << 22 | n`), so a pid names one session on one node.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cirro_common::{CirroError, Result, SqlState};

/// Bits of a pid below the node id.
const PID_NODE_SHIFT: u32 = 22;
/// Nodes a pid can name (the sign bit stays clear).
pub const NODE_ID_MAX: u32 = (1 << (31 - PID_NODE_SHIFT)) - 1;

/// What a backend is doing (`pg_stat_activity.state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendState {
    Idle,
    Active,
    IdleInTransaction,
    IdleInTransactionAborted,
}

impl BackendState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Active => "active",
            Self::IdleInTransaction => "idle in transaction",
            Self::IdleInTransactionAborted => "idle in transaction (aborted)",
        }
    }
}

/// How a front end stops one of its sessions.
pub trait BackendSignal: Send + Sync {
    /// Cancel the running statement (57014), as a CancelRequest does.
    fn cancel(&self);
    /// Close the session's connection (and cancel what it runs).
    fn terminate(&self);
}

/// One row of `pg_stat_activity`.
#[derive(Clone, Debug)]
pub struct BackendInfo {
    pub pid: i32,
    pub user: String,
    pub database: String,
    pub application_name: String,
    pub client_addr: Option<String>,
    /// Microseconds since the epoch.
    pub backend_start: i64,
    pub state: BackendState,
    /// The last statement (the running one while active).
    pub query: String,
    pub query_start: Option<i64>,
    pub state_change: i64,
    pub backend_type: &'static str,
}

struct Entry {
    info: BackendInfo,
    signal: Weak<dyn BackendSignal>,
}

/// The backends of this node.
pub struct Activity {
    node: u32,
    next: AtomicU32,
    backends: Mutex<BTreeMap<i32, Entry>>,
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or_default()
}

impl Activity {
    /// The registry of node `node` (0 on a single node).
    pub fn new(node: u32) -> Result<Arc<Self>> {
        if node > NODE_ID_MAX {
            return Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("node id {node} is above the largest, {NODE_ID_MAX}"),
            ));
        }
        Ok(Arc::new(Self {
            node,
            next: AtomicU32::new(1),
            backends: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Register a new session; it leaves the registry when the handle drops.
    pub fn register(
        self: &Arc<Self>,
        user: &str,
        database: &str,
        application_name: &str,
        client_addr: Option<String>,
        signal: Weak<dyn BackendSignal>,
    ) -> Backend {
        let mut backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        let pid = loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed) & ((1 << PID_NODE_SHIFT) - 1);
            let pid = ((self.node << PID_NODE_SHIFT) | n) as i32;
            if n != 0 && !backends.contains_key(&pid) {
                break pid;
            }
        };
        let now = now_micros();
        backends.insert(
            pid,
            Entry {
                info: BackendInfo {
                    pid,
                    user: user.to_string(),
                    database: database.to_string(),
                    application_name: application_name.to_string(),
                    client_addr,
                    backend_start: now,
                    state: BackendState::Idle,
                    query: String::new(),
                    query_start: None,
                    state_change: now,
                    backend_type: "client backend",
                },
                signal,
            },
        );
        Backend {
            activity: Arc::clone(self),
            pid,
        }
    }

    /// Every backend, by pid.
    pub fn backends(&self) -> Vec<BackendInfo> {
        let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        backends.values().map(|e| e.info.clone()).collect()
    }

    /// How many backends are running a statement now.
    pub fn running(&self) -> usize {
        let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        backends
            .values()
            .filter(|e| e.info.state == BackendState::Active)
            .count()
    }

    fn update(&self, pid: i32, change: impl FnOnce(&mut BackendInfo)) {
        let mut backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = backends.get_mut(&pid) {
            change(&mut entry.info);
        }
    }

    /// Signal backend `pid` on behalf of `user` (None: unrestricted), who
    /// must be a superuser or the backend's own user. Ok(false): no such
    /// backend.
    pub fn signal(
        &self,
        pid: i32,
        user: Option<&str>,
        superuser: bool,
        terminate: bool,
    ) -> Result<bool> {
        let found = {
            let backends = self.backends.lock().unwrap_or_else(|e| e.into_inner());
            backends
                .get(&pid)
                .map(|e| (e.info.user.clone(), e.signal.upgrade()))
        };
        let Some((owner, signal)) = found else {
            return Ok(false);
        };
        if !superuser && user.is_some_and(|u| u != owner) {
            let what = if terminate {
                "terminate process"
            } else {
                "cancel query"
            };
            return Err(CirroError::new(
                SqlState::INSUFFICIENT_PRIVILEGE,
                format!(
                    "permission denied to {what}: only a superuser or the role \"{owner}\" may signal backend {pid}"
                ),
            ));
        }
        let Some(signal) = signal else {
            return Ok(false);
        };
        if terminate {
            signal.terminate();
        } else {
            signal.cancel();
        }
        Ok(true)
    }
}

/// A session's place in the registry.
pub struct Backend {
    activity: Arc<Activity>,
    pub pid: i32,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("pid", &self.pid).finish()
    }
}

impl Backend {
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// The session starts running `query`: active until the guard drops,
    /// then `after()`'s state.
    pub fn running<'a>(
        &'a self,
        query: &str,
        after: impl Fn() -> BackendState + Send + Sync + 'a,
    ) -> Running<'a> {
        self.mark_active(query);
        Running {
            backend: self,
            after: Box::new(after),
        }
    }

    /// Like [`Backend::running`], for work that outlives a borrow of the
    /// session (a Flight SQL result streamed by DoGet): active until the
    /// guard drops, then `after`.
    pub fn running_owned(&self, query: &str, after: BackendState) -> RunningOwned {
        self.mark_active(query);
        RunningOwned {
            activity: Arc::clone(&self.activity),
            pid: self.pid,
            after,
        }
    }

    fn mark_active(&self, query: &str) {
        let now = now_micros();
        self.activity.update(self.pid, |info| {
            info.state = BackendState::Active;
            info.query = query.to_string();
            info.query_start = Some(now);
            info.state_change = now;
        });
    }

    fn finished(&self, state: BackendState) {
        let now = now_micros();
        self.activity.update(self.pid, |info| {
            info.state = state;
            info.state_change = now;
        });
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let mut backends = self
            .activity
            .backends
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        backends.remove(&self.pid);
    }
}

/// Marks a backend active while it lives (see [`Backend::running_owned`]).
pub struct RunningOwned {
    activity: Arc<Activity>,
    pid: i32,
    after: BackendState,
}

impl Drop for RunningOwned {
    fn drop(&mut self) {
        let now = now_micros();
        let after = self.after;
        self.activity.update(self.pid, |info| {
            info.state = after;
            info.state_change = now;
        });
    }
}

/// Marks a backend active while it lives (see [`Backend::running`]).
pub struct Running<'a> {
    backend: &'a Backend,
    after: Box<dyn Fn() -> BackendState + Send + Sync + 'a>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.backend.finished((self.after)());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Flags(Mutex<Vec<&'static str>>);

    impl BackendSignal for Flags {
        fn cancel(&self) {
            self.0.lock().expect("lock").push("cancel");
        }
        fn terminate(&self) {
            self.0.lock().expect("lock").push("terminate");
        }
    }

    #[test]
    fn pids_carry_the_node_and_states_follow_statements() {
        let activity = Activity::new(3).expect("node");
        let flags = Arc::new(Flags(Mutex::new(vec![])));
        let signal: Arc<dyn BackendSignal> = flags.clone();
        let a = activity.register("alice", "cirro", "psql", None, Arc::downgrade(&signal));
        let b = activity.register("bob", "cirro", "", None, Arc::downgrade(&signal));
        assert_ne!(a.pid, b.pid);
        assert_eq!(a.pid >> PID_NODE_SHIFT, 3);
        {
            let _running = a.running("SELECT 1", || BackendState::IdleInTransaction);
            let rows = activity.backends();
            assert_eq!(rows[0].state, BackendState::Active);
            assert_eq!(rows[0].query, "SELECT 1");
        }
        assert_eq!(
            activity.backends()[0].state,
            BackendState::IdleInTransaction
        );
        let err = activity
            .signal(a.pid, Some("bob"), false, false)
            .expect_err("bob may not cancel alice");
        assert_eq!(err.state, SqlState::INSUFFICIENT_PRIVILEGE);
        assert!(
            activity
                .signal(a.pid, Some("alice"), false, true)
                .expect("own")
        );
        assert!(
            activity
                .signal(b.pid, Some("alice"), true, false)
                .expect("superuser")
        );
        assert!(
            !activity
                .signal(12345, None, true, false)
                .expect("no such pid")
        );
        assert_eq!(*flags.0.lock().expect("lock"), ["terminate", "cancel"]);
        drop(a);
        assert_eq!(activity.backends().len(), 1);
        assert!(Activity::new(NODE_ID_MAX + 1).is_err());
    }
}
