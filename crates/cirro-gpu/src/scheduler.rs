//! The scheduler of concurrent GPU queries (Hetero-DB's MultiQx-GPU):
//! queries share the device as long as their device-memory demands fit in
//! it; a query whose demand would not fit waits, instead of thrashing or
//! aborting on an exhausted device.
//!
//! A query's demand is the weighted mean of its GPU operators' device
//! memory, m = Σ(tᵢ·mᵢ)/Σtᵢ, each operator weighted by its estimated time
//! tᵢ (its rows): an operator that holds much memory for a moment counts
//! less than one that holds it all along. It is updated as the query runs
//! (an operator arrives, changes its estimate, or ends). A query is
//! admitted when the sum of the admitted queries' demands and its own stays
//! within the device's memory, or when nothing else runs (a query larger
//! than the device runs alone, in chunks); waiting queries are reconsidered,
//! in arrival order, whenever one finishes or a demand changes.
//!
//! Queries are keyed by their session (a session runs one statement at a
//! time).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One operator's estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Operator {
    time: f64,
    memory: u64,
}

#[derive(Debug)]
struct Query {
    operators: HashMap<u64, Operator>,
    admitted: bool,
    arrived: u64,
    waiting_since: Option<Instant>,
}

impl Query {
    /// m = Σ(tᵢ·mᵢ)/Σtᵢ (the plain mean where no time is known).
    fn demand(&self) -> u64 {
        let time: f64 = self.operators.values().map(|o| o.time.max(0.0)).sum();
        if self.operators.is_empty() {
            return 0;
        }
        if time <= 0.0 {
            let sum: u64 = self.operators.values().map(|o| o.memory).sum();
            return sum / self.operators.len() as u64;
        }
        let weighted: f64 = self
            .operators
            .values()
            .map(|o| o.time.max(0.0) * o.memory as f64)
            .sum();
        (weighted / time) as u64
    }
}

#[derive(Debug, Default)]
struct State {
    queries: HashMap<String, Query>,
    next: u64,
}

/// What `cirro.queries` shows of a query on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuQuery {
    pub query: String,
    /// Running on the device (else waiting for it).
    pub running: bool,
    /// Its weighted device-memory demand, bytes.
    pub demand: u64,
}

/// Admission to one device (its tickets share its state).
#[derive(Debug)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    capacity: u64,
    state: Mutex<State>,
    changed: Condvar,
}

/// An operator's place on the device; dropping it ends the operator (and
/// the query's, with its last operator).
#[derive(Debug)]
pub struct Ticket {
    scheduler: Arc<Shared>,
    query: String,
    operator: u64,
    /// How long the operator waited to be admitted.
    pub waited: Duration,
}

impl Scheduler {
    /// A scheduler for a device of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            shared: Arc::new(Shared {
                capacity,
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
            }),
        }
    }

    /// An operator of `query` estimated to run `time` (any unit: rows) and
    /// hold `memory` bytes: returns when the query is admitted.
    pub fn enter(&self, query: &str, time: f64, memory: u64) -> Ticket {
        let start = Instant::now();
        let mut state = match self.shared.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        let operator = state.next;
        state.next += 1;
        let arrived = state.next;
        let entry = state
            .queries
            .entry(query.to_string())
            .or_insert_with(|| Query {
                operators: HashMap::new(),
                admitted: false,
                arrived,
                waiting_since: None,
            });
        entry.operators.insert(operator, Operator { time, memory });
        // A changed demand may let others in (or keep them out).
        self.shared.changed.notify_all();
        loop {
            if admit(&mut state, self.shared.capacity, query) {
                break;
            }
            if let Some(q) = state.queries.get_mut(query) {
                q.waiting_since.get_or_insert(start);
            }
            // Woken when a query ends or a demand changes; the timeout only
            // re-checks.
            state = match self
                .shared
                .changed
                .wait_timeout(state, Duration::from_millis(200))
            {
                Ok((s, _)) => s,
                Err(p) => p.into_inner().0,
            };
        }
        if let Some(q) = state.queries.get_mut(query) {
            q.waiting_since = None;
        }
        Ticket {
            scheduler: Arc::clone(&self.shared),
            query: query.to_string(),
            operator,
            waited: start.elapsed(),
        }
    }

    /// The queries on the device, running or waiting.
    pub fn queries(&self) -> Vec<GpuQuery> {
        let Ok(state) = self.shared.state.lock() else {
            return Vec::new();
        };
        let mut out: Vec<(u64, GpuQuery)> = state
            .queries
            .iter()
            .map(|(name, q)| {
                (
                    q.arrived,
                    GpuQuery {
                        query: name.clone(),
                        running: q.admitted,
                        demand: q.demand(),
                    },
                )
            })
            .collect();
        out.sort_by_key(|(arrived, _)| *arrived);
        out.into_iter().map(|(_, q)| q).collect()
    }
}

/// Whether `query` may run now: admitted already, or its demand fits
/// beside the admitted ones (or nothing runs) and no query that came
/// before it and fits is waiting.
fn admit(state: &mut State, capacity: u64, query: &str) -> bool {
    let Some(q) = state.queries.get(query) else {
        return true;
    };
    if q.admitted {
        return true;
    }
    let running: u64 = state
        .queries
        .values()
        .filter(|q| q.admitted)
        .map(Query::demand)
        .sum();
    let fits = |demand: u64| running == 0 || running.saturating_add(demand) <= capacity;
    if !fits(q.demand()) {
        return false;
    }
    // Arrival order among the waiting queries that fit.
    let earlier_fits = state.queries.iter().any(|(name, other)| {
        name != query && !other.admitted && other.arrived < q.arrived && fits(other.demand())
    });
    if earlier_fits && running > 0 {
        return false;
    }
    if let Some(q) = state.queries.get_mut(query) {
        q.admitted = true;
    }
    true
}

impl Ticket {
    /// The operator's estimate changed: the query's demand follows.
    pub fn update(&self, time: f64, memory: u64) {
        if let Ok(mut state) = self.scheduler.state.lock()
            && let Some(q) = state.queries.get_mut(&self.query)
        {
            q.operators.insert(self.operator, Operator { time, memory });
        }
        self.scheduler.changed.notify_all();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Ok(mut state) = self.scheduler.state.lock() {
            let empty = match state.queries.get_mut(&self.query) {
                Some(q) => {
                    q.operators.remove(&self.operator);
                    q.operators.is_empty()
                }
                None => false,
            };
            if empty {
                state.queries.remove(&self.query);
            }
        }
        self.scheduler.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn demand_is_the_time_weighted_mean() {
        let s = Scheduler::new(1000);
        let a = s.enter("q", 3.0, 100);
        let b = s.enter("q", 1.0, 500);
        // (3·100 + 1·500) / 4 = 200.
        assert_eq!(s.queries()[0].demand, 200);
        b.update(1.0, 900);
        assert_eq!(s.queries()[0].demand, 300);
        drop(b);
        assert_eq!(s.queries()[0].demand, 100);
        drop(a);
        assert!(s.queries().is_empty());
    }

    #[test]
    fn a_query_that_does_not_fit_waits_for_one_to_end() {
        let s = Arc::new(Scheduler::new(1000));
        let first = s.enter("a", 1.0, 700);
        assert_eq!(first.waited < Duration::from_millis(50), true);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let t = s.enter("b", 1.0, 700);
                tx.send(t.waited).ok();
            })
        };
        // b waits while a runs.
        let deadline = Instant::now() + Duration::from_secs(5);
        while s.queries().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let shown = s.queries();
        assert_eq!(
            shown,
            vec![
                GpuQuery {
                    query: "a".into(),
                    running: true,
                    demand: 700
                },
                GpuQuery {
                    query: "b".into(),
                    running: false,
                    demand: 700
                },
            ]
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "b was admitted beside a");
        drop(first);
        let waited = rx.recv_timeout(Duration::from_secs(5)).expect("b admitted");
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        waiter.join().expect("join");
    }

    #[test]
    fn queries_that_fit_together_run_together_and_a_lone_giant_runs() {
        let s = Scheduler::new(1000);
        let a = s.enter("a", 1.0, 400);
        let b = s.enter("b", 1.0, 500);
        assert!(a.waited < Duration::from_millis(50) && b.waited < Duration::from_millis(50));
        assert!(s.queries().iter().all(|q| q.running));
        drop((a, b));
        // Larger than the device, alone: admitted (it works in chunks).
        let giant = s.enter("g", 1.0, 5000);
        assert!(s.queries()[0].running);
        // Another operator of an admitted query never waits.
        let more = s.enter("g", 1.0, 5000);
        assert!(more.waited < Duration::from_millis(50));
        drop((giant, more));
    }
}
