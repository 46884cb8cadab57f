//! Admission: the queue in front of execution.
//!
//! At most `max_running` statements run at once, and together they reserve
//! at most the queries' memory (each reserves its memory limit, the most its
//! pool will hold). A statement that does not fit waits, in the state
//! `queued`, instead of failing: first by priority (higher first), then in
//! the order it came. The queue is strict: a large statement at its head is
//! not overtaken by smaller ones behind it, so it cannot starve. One that
//! reserves more than the whole budget runs alone.
//!
//! ```text
//!   admit(need, priority)
//!        │ fits and nobody waits ahead?
//!        ├── yes ─────────────────────────────► Ticket (running)
//!        └── no ──► queued ── a ticket drops, ──► Ticket (running)
//!                     │       head fits
//!                     └── dropped (cancel, timeout): leaves the queue
//! ```
//!
//! A [`Ticket`] gives its share back when it drops (the statement's result
//! stream ended or was dropped), and the queue's head is reconsidered.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::channel::oneshot;

/// Counts of the admission queue (for `cirro.nodes`, the console and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AdmissionCounts {
    pub running: usize,
    pub queued: usize,
    /// Bytes the running statements reserved.
    pub reserved: usize,
    /// Statements that had to wait, since the start.
    pub ever_queued: u64,
    /// The most statements waiting at once, since the start.
    pub peak_queued: usize,
}

/// Where a waiting statement stands: higher priority first, then by arrival.
type QueueKey = (std::cmp::Reverse<i32>, u64);

struct Waiter {
    need: usize,
    wake: oneshot::Sender<Ticket>,
}

#[derive(Default)]
struct State {
    running: usize,
    reserved: usize,
    arrivals: u64,
    queue: BTreeMap<QueueKey, Waiter>,
    ever_queued: u64,
    peak_queued: usize,
}

/// The admission queue of a process.
pub struct Admission {
    max_running: usize,
    memory: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("max_running", &self.max_running)
            .field("memory", &self.memory)
            .field("counts", &self.counts())
            .finish()
    }
}

/// A running statement's place: its share returns when this drops.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    need: usize,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        state.running -= 1;
        state.reserved -= self.need;
        let woken = self.admission.dispatch(&mut state);
        drop(state);
        Admission::wake(woken);
    }
}

/// Removes a waiter that gave up (its statement was cancelled or timed out
/// while queued) from the queue.
struct Queued {
    admission: Arc<Admission>,
    key: QueueKey,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        if state.queue.remove(&self.key).is_some() {
            // The head may have left: those behind it may fit now.
            let woken = self.admission.dispatch(&mut state);
            drop(state);
            Admission::wake(woken);
        }
    }
}

impl Admission {
    /// A queue that runs at most `max_running` statements (at least one)
    /// reserving at most `memory` bytes together.
    pub fn new(max_running: usize, memory: usize) -> Arc<Self> {
        Arc::new(Self {
            max_running: max_running.max(1),
            memory,
            state: Mutex::new(State::default()),
        })
    }

    pub fn max_running(&self) -> usize {
        self.max_running
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn counts(&self) -> AdmissionCounts {
        let state = self.lock();
        AdmissionCounts {
            running: state.running,
            queued: state.queue.len(),
            reserved: state.reserved,
            ever_queued: state.ever_queued,
            peak_queued: state.peak_queued,
        }
    }

    fn fits(&self, state: &State, need: usize) -> bool {
        state.running < self.max_running
            && (state.running == 0 || state.reserved + need <= self.memory)
    }

    fn take(self: &Arc<Self>, state: &mut State, need: usize) -> Ticket {
        state.running += 1;
        state.reserved += need;
        Ticket {
            admission: Arc::clone(self),
            need,
        }
    }

    /// Admit the queue's head while it fits; the tickets to hand over once
    /// the lock is released.
    fn dispatch(self: &Arc<Self>, state: &mut State) -> Vec<(oneshot::Sender<Ticket>, Ticket)> {
        let mut woken = Vec::new();
        while let Some(need) = state.queue.first_key_value().map(|(_, w)| w.need) {
            if !self.fits(state, need) {
                break;
            }
            let Some((_, waiter)) = state.queue.pop_first() else {
                break;
            };
            let ticket = self.take(state, waiter.need);
            woken.push((waiter.wake, ticket));
        }
        woken
    }

    /// Hand tickets to their waiters. One whose waiter is gone drops, which
    /// gives its share back (and admits the next).
    fn wake(woken: Vec<(oneshot::Sender<Ticket>, Ticket)>) {
        for (wake, ticket) in woken {
            let _ = wake.send(ticket);
        }
    }

    /// Wait for a place for a statement that reserves `need` bytes, at
    /// `priority`; `on_queued` runs once if it has to wait. Dropping the
    /// future while queued leaves the queue.
    pub async fn admit(
        self: &Arc<Self>,
        need: usize,
        priority: i32,
        on_queued: impl FnOnce(),
    ) -> Ticket {
        let need = need.min(self.memory);
        let (key, wait, queued, woken) = {
            let mut state = self.lock();
            if state.queue.is_empty() && self.fits(&state, need) {
                return self.take(&mut state, need);
            }
            state.arrivals += 1;
            let key = (std::cmp::Reverse(priority), state.arrivals);
            let (wake, wait) = oneshot::channel();
            state.queue.insert(key, Waiter { need, wake });
            // Placed before the head (a higher priority), it may fit now.
            let woken = self.dispatch(&mut state);
            let queued = state.queue.contains_key(&key);
            if queued {
                state.ever_queued += 1;
                state.peak_queued = state.peak_queued.max(state.queue.len());
            }
            (key, wait, queued, woken)
        };
        Self::wake(woken);
        let _queued = Queued {
            admission: Arc::clone(self),
            key,
        };
        if queued {
            on_queued();
        }
        match wait.await {
            Ok(ticket) => ticket,
            // The sender stays in the queue until it is handed a ticket; the
            // guard above removes it only after this returns.
            Err(_) => unreachable!("a queued statement's waiter was dropped without a ticket"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn now_or_never<F: std::future::Future>(f: F) -> Option<F::Output> {
        futures::FutureExt::now_or_never(f)
    }

    #[tokio::test]
    async fn statements_wait_for_room_and_go_by_priority_then_arrival() {
        let admission = Admission::new(2, 100);
        let a = admission.admit(60, 0, || panic!("a fits")).await;
        // Memory: 60 + 60 > 100 — b waits although a place is free.
        let queued = Arc::new(AtomicUsize::new(0));
        let q = Arc::clone(&queued);
        let mut b = Box::pin(admission.admit(60, 0, move || {
            q.fetch_add(1, Ordering::Relaxed);
        }));
        assert!(now_or_never(b.as_mut()).is_none());
        assert_eq!(queued.load(Ordering::Relaxed), 1);
        // A small one does not overtake the head...
        let mut c = Box::pin(admission.admit(10, 0, || {}));
        assert!(now_or_never(c.as_mut()).is_none());
        // ...but a higher priority goes before it, and runs as it fits.
        let d = admission.admit(10, 5, || panic!("d fits")).await;
        let counts = admission.counts();
        assert_eq!((counts.running, counts.queued), (2, 2));
        // a ends: b fits beside d (10 + 60 <= 100); c waits for a place.
        drop(a);
        let b = now_or_never(b.as_mut()).expect("b runs");
        assert!(now_or_never(c.as_mut()).is_none());
        assert_eq!(admission.counts().reserved, 70);
        drop(d);
        let c = now_or_never(c.as_mut()).expect("c runs");
        drop((b, c));
        let counts = admission.counts();
        assert_eq!((counts.running, counts.queued, counts.reserved), (0, 0, 0));
        assert_eq!((counts.ever_queued, counts.peak_queued), (2, 2));
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue_and_the_big_one_runs_alone() {
        let admission = Admission::new(4, 100);
        let a = admission.admit(50, 0, || {}).await;
        let mut big = Box::pin(admission.admit(500, 0, || {}));
        assert!(now_or_never(big.as_mut()).is_none());
        let mut small = Box::pin(admission.admit(10, 0, || {}));
        assert!(now_or_never(small.as_mut()).is_none());
        // The big one gives up (cancelled): the small one behind it runs.
        drop(big);
        let small = now_or_never(small.as_mut()).expect("small runs");
        drop((a, small));
        // Alone, a statement that needs more than the whole budget runs.
        let big = admission.admit(500, 0, || panic!("runs alone")).await;
        assert_eq!(admission.counts().reserved, 100);
        drop(big);
        assert_eq!(
            admission.counts(),
            AdmissionCounts {
                ever_queued: 2,
                peak_queued: 2,
                ..Default::default()
            }
        );
    }
}
