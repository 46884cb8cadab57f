//! Memory: the server's budget and each query's pool inside it.
//!
//! A server holds one [`MemoryBudget`]: what its queries may hold together
//! (the memory limit less the hot-data tier, which is carved out of it). A
//! query runs with a [`QueryMemory`], a DataFusion [`MemoryPool`] of its own
//! limit (`SET memory_limit`) that takes every byte from the budget as well:
//! an operator that asks for more than either allows is refused, and a
//! refused operator that can spill (sort, aggregation, window, the spilling
//! hash join) writes to the spill area and goes on.
//!
//! A session's DataFusion runtime has one pool for all its statements, a
//! [`SessionMemory`]: each reservation belongs to the query that was running
//! when it was registered, so that the rows of a statement still streamed to
//! the client when the next one starts stay counted against the first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use datafusion::common::DataFusionError;
use datafusion::error::Result as DfResult;
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};

/// Add `n` to `counter` if the sum stays within `limit`.
fn add_within(counter: &AtomicUsize, n: usize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
            now.checked_add(n).filter(|&next| next <= limit)
        })
        .is_ok()
}

/// Bytes held against a limit, and the most held at once: what a server's
/// queries hold together (its budget), or one query.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
    peak: AtomicUsize,
    /// Requests refused to operators that can spill (each made its
    /// operator spill), and to the others.
    refused_spilling: AtomicU64,
    refused_other: AtomicU64,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            refused_spilling: AtomicU64::new(0),
            refused_other: AtomicU64::new(0),
        }
    }

    /// Requests refused since the server started: to operators that can
    /// spill (each spilled what it held), and to the others (which fail
    /// their query with 53200, or, as the spilling join's in-memory part,
    /// hand their rows to a part that spills).
    pub fn refusals(&self) -> (u64, u64) {
        (
            self.refused_spilling.load(Ordering::Relaxed),
            self.refused_other.load(Ordering::Relaxed),
        )
    }

    /// Bytes the budget holds.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes the running queries hold now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The most the queries held at once since the server started.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Take `n` bytes if they fit.
    fn try_take(&self, n: usize) -> bool {
        let taken = add_within(&self.used, n, self.limit);
        if taken {
            self.peak.fetch_max(self.used(), Ordering::Relaxed);
        }
        taken
    }

    /// Take `n` bytes even past the limit (memory already allocated).
    fn take(&self, n: usize) {
        let next = self.used.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(next, Ordering::Relaxed);
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// One query's memory: its limit, what it holds now and at most.
///
/// First come, first served inside the limit (DataFusion's greedy pool), with
/// two rules more:
///
/// - the operators that can spill hold at most 7/8 of it together, so that
///   an operator that cannot (an aggregation without groups, a hash join's
///   table) still finds room. (DataFusion's fair pool divides the spillers'
///   memory by the number of spilling operators registered, which an
///   aggregation of 128 radix partitions makes crumbs of: a partition
///   refused its first 80 kB has nothing to spill and fails the query.)
/// - a spilling operator that holds (almost) nothing — one starting, or one
///   that spilled everything and now merges its spill files back — may take
///   its first bytes past the query's limit, up to an 8th of it for all such
///   together (the server's budget still holds): refused, it would fail the
///   query, having nothing to spill. While the query is past its limit every
///   other request is refused, so the operators that hold memory spill and
///   bring it back under. (TPC-H Q18 at 64 MB with 16 threads: a final
///   aggregation's partition asked 384 kB to merge its spill files back
///   while the rest of the plan held 63 MB.)
#[derive(Debug)]
pub struct QueryMemory {
    /// What the query holds, against its limit.
    held: MemoryBudget,
    budget: Arc<MemoryBudget>,
    /// What the operators that can spill hold.
    spillable: AtomicUsize,
    /// What `RepartitionExec`s' output channels hold (see
    /// [`QueryMemory::grow_repartition`]).
    repartition: AtomicUsize,
    /// What each consumer holds, by its id: named in a refusal, so that the
    /// error says where the memory went.
    holders: Mutex<HashMap<usize, Holder>>,
    /// The node, on a cluster (a refusal names it).
    node: OnceLock<String>,
}

#[derive(Debug)]
struct Holder {
    name: String,
    bytes: usize,
}

/// The share of a query's limit kept from the operators that can spill, for
/// those that cannot.
pub const UNSPILLABLE_SHARE: f64 = 0.125;

/// A spilling operator holding at most a 64th of the query's limit may grow
/// past the spilling operators' share (see `try_grow`).
const SPILLER_FLOOR_DIVISOR: usize = 64;

/// How far past its limit a query's starting spillers may go together: an
/// 8th of the limit (see [`QueryMemory`]).
const STARTING_OVERDRAFT_DIVISOR: usize = 8;

/// Holders a refusal names.
const HOLDERS_NAMED: usize = 3;

impl QueryMemory {
    pub fn new(limit: usize, budget: Arc<MemoryBudget>) -> Self {
        Self {
            held: MemoryBudget::new(limit),
            budget,
            spillable: AtomicUsize::new(0),
            repartition: AtomicUsize::new(0),
            holders: Mutex::new(HashMap::new()),
            node: OnceLock::new(),
        }
    }

    /// Name the node the pool is on in its refusals (the first name given
    /// stays).
    pub fn set_node(&self, node: &str) {
        let _ = self.node.set(node.to_string());
    }

    /// Count `grown` bytes more and `shrunk` fewer for `reservation`'s
    /// consumer.
    fn track(&self, reservation: &MemoryReservation, grown: usize, shrunk: usize) {
        let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let consumer = reservation.consumer();
        let holder = holders.entry(consumer.id()).or_insert_with(|| Holder {
            name: consumer.name().to_string(),
            bytes: 0,
        });
        holder.bytes = (holder.bytes + grown).saturating_sub(shrunk);
    }

    /// The consumers that hold the most, largest first: `name size, …`.
    fn largest_holders(&self) -> String {
        let holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
        let mut largest: Vec<_> = holders.values().filter(|h| h.bytes > 0).collect();
        largest.sort_by(|a, b| b.bytes.cmp(&a.bytes));
        let named: Vec<_> = largest
            .iter()
            .take(HOLDERS_NAMED)
            .map(|h| format!("{} {}", h.name, format_bytes(h.bytes)))
            .collect();
        let mut text = named.join(", ");
        if largest.len() > HOLDERS_NAMED {
            text.push_str(&format!(
                " and {} more consumers",
                largest.len() - HOLDERS_NAMED
            ));
        }
        text
    }

    /// The query's limit in bytes.
    pub fn limit(&self) -> usize {
        self.held.limit()
    }

    /// Bytes the query's operators hold now.
    pub fn used(&self) -> usize {
        self.held.used()
    }

    /// The most they held at once.
    pub fn peak(&self) -> usize {
        self.held.peak()
    }

    /// What the spilling operators may hold together.
    fn spillable_limit(&self) -> usize {
        (self.limit() as f64 * (1.0 - UNSPILLABLE_SHARE)) as usize
    }

    fn refused(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
        why: &str,
    ) -> DataFusionError {
        let counter = match reservation.consumer().can_spill() {
            true => &self.budget.refused_spilling,
            false => &self.budget.refused_other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let on = match self.node.get() {
            Some(node) => format!(" on {node}"),
            None => String::new(),
        };
        let mut message = format!(
            "the {why} is reached{on}: {} could not have {} more ({} held by it, {} by the query",
            reservation.consumer().name(),
            format_bytes(additional),
            format_bytes(reservation.size()),
            format_bytes(self.used()),
        );
        let largest = self.largest_holders();
        if !largest.is_empty() {
            message.push_str(&format!("; most by {largest}"));
        }
        message.push(')');
        DataFusionError::ResourcesExhausted(message)
    }

    /// [`QueryMemory::refused`] by the server's budget.
    fn budget_refused(
        &self,
        reservation: &MemoryReservation,
        additional: usize,
    ) -> DataFusionError {
        self.refused(
            reservation,
            additional,
            &format!(
                "server's memory for queries ({}, in use by all queries)",
                format_bytes(self.budget.limit)
            ),
        )
    }
}

impl std::fmt::Display for QueryMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "query memory: {} of {} in use",
            format_bytes(self.used()),
            format_bytes(self.limit())
        )
    }
}

impl MemoryPool for QueryMemory {
    fn name(&self) -> &str {
        "cirro-query"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        if reservation.consumer().can_spill() {
            self.spillable.fetch_add(additional, Ordering::Relaxed);
        }
        if is_repartition_channel(reservation.consumer()) {
            self.repartition.fetch_add(additional, Ordering::Relaxed);
        }
        self.budget.take(additional);
        self.held.take(additional);
        self.track(reservation, additional, 0);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        if reservation.consumer().can_spill() {
            self.spillable.fetch_sub(shrink, Ordering::Relaxed);
        }
        if is_repartition_channel(reservation.consumer()) {
            self.repartition.fetch_sub(shrink, Ordering::Relaxed);
        }
        self.budget.give(shrink);
        self.held.give(shrink);
        self.track(reservation, 0, shrink);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        self.holders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&consumer.id());
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        if is_repartition_channel(reservation.consumer()) {
            return self.grow_repartition(reservation, additional);
        }
        let spills = reservation.consumer().can_spill();
        // A spilling operator that holds nothing, or almost nothing, has
        // nothing to spill: refused, it would fail the query. It may take
        // its first bytes from the share kept for the others (the query's
        // limit still holds): one partition of an aggregation that grew
        // first must not starve its sibling, nor, on a cluster, one task's
        // aggregation the same query's other tasks on the node (a first
        // batch's groups: 978 kB of an 8 MB limit). Its first request may
        // be as large as all starting operators together may go past.
        let starting = reservation.size() + additional <= self.limit() / SPILLER_FLOOR_DIVISOR
            || (reservation.size() == 0 && additional <= self.limit() / STARTING_OVERDRAFT_DIVISOR);
        if spills && !add_within(&self.spillable, additional, self.spillable_limit()) {
            if starting {
                self.spillable.fetch_add(additional, Ordering::Relaxed);
            } else {
                return Err(self.refused(
                    reservation,
                    additional,
                    &format!(
                        "memory the query's spilling operators may hold ({} of its limit of {})",
                        format_bytes(self.spillable_limit()),
                        format_bytes(self.limit())
                    ),
                ));
            }
        }
        let undo = |this: &Self| {
            if spills {
                this.spillable.fetch_sub(additional, Ordering::Relaxed);
            }
        };
        // A starting spiller may go a little past the query's limit (see
        // the type's comment); the others are held to it.
        let mut ceiling = if spills && starting {
            self.held.limit + self.limit() / STARTING_OVERDRAFT_DIVISOR
        } else {
            self.held.limit
        };
        // Repartition buffers past the limit make the spillers that hold
        // memory spill; an operator that has nothing to spill (one that
        // cannot, or one starting) is not refused for them: it would fail
        // the query (a spilling join's in-memory part, DataFusion's
        // CollectLeft build, asked 11 kB while two channels held 1.2 MB
        // of a 1 MB limit).
        if !spills || starting {
            ceiling += self.repartition.load(Ordering::Relaxed);
        }
        // The query's peak counts once the budget gave the bytes too.
        if !add_within(&self.held.used, additional, ceiling) {
            undo(self);
            return Err(self.refused(
                reservation,
                additional,
                &format!("query's memory limit ({})", format_bytes(self.limit())),
            ));
        }
        if !self.budget.try_take(additional) {
            undo(self);
            self.held.give(additional);
            return Err(self.budget_refused(reservation, additional));
        }
        self.held
            .peak
            .fetch_max(self.held.used(), Ordering::Relaxed);
        self.track(reservation, additional, 0);
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit())
    }
}

/// Whether `consumer` holds the batches a `RepartitionExec` buffers for one
/// of its outputs (DataFusion names them `RepartitionExec[<output>]`).
fn is_repartition_channel(consumer: &MemoryConsumer) -> bool {
    consumer
        .name()
        .strip_prefix("RepartitionExec[")
        .and_then(|rest| rest.strip_suffix(']'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl QueryMemory {
    /// A `RepartitionExec`'s buffered batches are held to the server's
    /// budget only, not to the query's limit: refused, DataFusion 55.2
    /// writes them to a spill pool whose reader can wait forever when two
    /// of the operator's inputs spilled at once (apache/datafusion#24883,
    /// fixed after 55.2; a Partitioned spilling join's test and TPC-H Q18
    /// at 64 MB on 32 threads hung here). Its bytes still count against
    /// the query, so while they put it past its limit every operator that
    /// holds memory it could spill is refused and spills (those with
    /// nothing to spill are held to the limit without them). Drop this
    /// when DataFusion has the fix.
    fn grow_repartition(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        if !self.budget.try_take(additional) {
            return Err(self.budget_refused(reservation, additional));
        }
        if reservation.consumer().can_spill() {
            self.spillable.fetch_add(additional, Ordering::Relaxed);
        }
        self.repartition.fetch_add(additional, Ordering::Relaxed);
        self.held.take(additional);
        self.track(reservation, additional, 0);
        Ok(())
    }
}

/// `n` bytes as PostgreSQL writes sizes (`64MB`, `1536kB`).
pub fn format_bytes(n: usize) -> String {
    const UNITS: [(&str, usize); 4] = [
        ("TB", 1 << 40),
        ("GB", 1 << 30),
        ("MB", 1 << 20),
        ("kB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size && n % size == 0 {
            return format!("{}{unit}", n / size);
        }
    }
    if n >= 10 << 20 {
        return format!("{}MB", n >> 20);
    }
    if n >= 10 << 10 {
        return format!("{}kB", n >> 10);
    }
    format!("{n}B")
}

/// The pool of a session's runtime: each reservation goes to the query that
/// ran when it was registered (see the module's comment).
#[derive(Debug)]
pub struct SessionMemory {
    budget: Arc<MemoryBudget>,
    current: Mutex<Arc<QueryMemory>>,
    owners: Mutex<HashMap<usize, Arc<QueryMemory>>>,
}

impl SessionMemory {
    /// A session's pool; until its first query, reservations count against
    /// the budget alone.
    pub fn new(budget: Arc<MemoryBudget>) -> Self {
        let idle = Arc::new(QueryMemory::new(budget.limit(), Arc::clone(&budget)));
        Self {
            budget,
            current: Mutex::new(idle),
            owners: Mutex::new(HashMap::new()),
        }
    }

    /// Start a query of `limit` bytes: the reservations registered from now
    /// on are its.
    pub fn begin(&self, limit: usize) -> Arc<QueryMemory> {
        let query = Arc::new(QueryMemory::new(limit, Arc::clone(&self.budget)));
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&query);
        query
    }

    /// The query started last.
    pub fn current(&self) -> Arc<QueryMemory> {
        Arc::clone(&self.current.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn owner(&self, reservation: &MemoryReservation) -> Arc<QueryMemory> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        match owners.get(&reservation.consumer().id()) {
            Some(query) => Arc::clone(query),
            None => self.current(),
        }
    }
}

impl std::fmt::Display for SessionMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "session memory, current {}", self.current())
    }
}

impl MemoryPool for SessionMemory {
    fn name(&self) -> &str {
        "cirro-session"
    }

    fn register(&self, consumer: &MemoryConsumer) {
        let query = self.current();
        query.register(consumer);
        self.owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(consumer.id(), query);
    }

    fn unregister(&self, consumer: &MemoryConsumer) {
        let query = self
            .owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&consumer.id());
        if let Some(query) = query {
            query.unregister(consumer);
        }
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.owner(reservation).grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.owner(reservation).shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DfResult<()> {
        self.owner(reservation).try_grow(reservation, additional)
    }

    fn reserved(&self) -> usize {
        self.current().used()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.current().limit())
    }
}

/// The pools of the queries a node runs, by query id: a session's
/// statement registers its pool, and the tasks of that statement that
/// reach the node (its own, or another node's through the worker service)
/// count in it, so that a query's limit holds on every node it touches
/// and all of them count in the node's budget.
#[derive(Debug)]
pub struct QueryPools {
    budget: Arc<MemoryBudget>,
    pools: Mutex<HashMap<String, Weak<QueryMemory>>>,
}

impl QueryPools {
    pub fn new(budget: Arc<MemoryBudget>) -> Self {
        Self {
            budget,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// Make `query` the pool of the query `id` on this node.
    pub fn register(&self, id: &str, query: &Arc<QueryMemory>) {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.retain(|_, pool| pool.strong_count() > 0);
        pools.insert(id.to_string(), Arc::downgrade(query));
    }

    /// The pool of the query `id` on this node: the one registered or
    /// joined while it still has a holder, else a new one of `limit` bytes
    /// (at most the budget).
    pub fn join(&self, id: &str, limit: usize) -> Arc<QueryMemory> {
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pool) = pools.get(id).and_then(Weak::upgrade) {
            return pool;
        }
        pools.retain(|_, pool| pool.strong_count() > 0);
        let limit = limit.min(self.budget.limit());
        let pool = Arc::new(QueryMemory::new(limit, Arc::clone(&self.budget)));
        pools.insert(id.to_string(), Arc::downgrade(&pool));
        pool
    }

    /// Queries with a live pool on this node.
    pub fn live(&self) -> usize {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools
            .values()
            .filter(|pool| pool.strong_count() > 0)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session's pool over a budget of `bytes`.
    fn session(bytes: usize) -> (Arc<MemoryBudget>, Arc<SessionMemory>, Arc<dyn MemoryPool>) {
        let budget = Arc::new(MemoryBudget::new(bytes));
        let session = Arc::new(SessionMemory::new(Arc::clone(&budget)));
        let pool: Arc<dyn MemoryPool> = session.clone();
        (budget, session, pool)
    }

    fn reservation(pool: &Arc<dyn MemoryPool>, name: &str, spill: bool) -> MemoryReservation {
        MemoryConsumer::new(name)
            .with_can_spill(spill)
            .register(pool)
    }

    #[test]
    fn a_querys_tasks_on_a_node_share_its_pool_within_the_nodes_budget() {
        let budget = Arc::new(MemoryBudget::new(1000));
        let pools = QueryPools::new(Arc::clone(&budget));
        // The coordinator's session registers its statement's pool; a task
        // of that statement on the same node counts in it.
        let session = Arc::new(QueryMemory::new(600, Arc::clone(&budget)));
        pools.register("q1", &session);
        let task = pools.join("q1", 600);
        assert!(Arc::ptr_eq(&session, &task));
        task.set_node("node2");
        let pool: Arc<dyn MemoryPool> = task;
        let a = reservation(&pool, "HashJoinInput", false);
        a.try_grow(500).unwrap();
        let err = a.try_grow(200).unwrap_err().to_string();
        assert!(
            err.contains("memory limit (600B) is reached on node2: HashJoinInput"),
            "{err}"
        );
        // Another query's tasks get a pool of their own, held to the
        // budget the first one shares: 500 of 1000 are taken.
        let other: Arc<dyn MemoryPool> = pools.join("q2", 5000);
        assert!(matches!(other.memory_limit(), MemoryLimit::Finite(1000)));
        let b = reservation(&other, "SortExec", true);
        let err = b.try_grow(600).unwrap_err().to_string();
        assert!(err.contains("server's memory for queries"), "{err}");
        assert_eq!(budget.refusals(), (1, 1));
        assert_eq!(pools.live(), 2);
        // A pool whose holders all ended is gone; the id starts afresh.
        drop((a, b, other, pool, session));
        assert_eq!(pools.live(), 0);
        assert_eq!(budget.used(), 0);
        assert_eq!(pools.join("q1", 100).limit(), 100);
    }

    #[test]
    fn a_query_is_held_to_its_limit_and_the_budget() {
        let (budget, session, pool) = session(1000);
        let first = session.begin(600);
        let a = reservation(&pool, "a", false);
        a.try_grow(500).unwrap();
        let err = a.try_grow(200).unwrap_err().to_string();
        assert!(err.contains("memory limit (600B)"), "{err}");
        assert_eq!(first.used(), 500);
        // A second query of the session takes from the same budget.
        let second = session.begin(600);
        let b = reservation(&pool, "b", false);
        let err = b.try_grow(550).unwrap_err().to_string();
        assert!(err.contains("server's memory"), "{err}");
        b.try_grow(450).unwrap();
        assert_eq!(
            (first.used(), second.used(), budget.used()),
            (500, 450, 950)
        );
        // The first query's reservation still counts against it, not the second.
        a.shrink(300);
        assert_eq!(
            (first.used(), second.used(), budget.used()),
            (200, 450, 650)
        );
        drop(a);
        drop(b);
        assert_eq!((first.used(), second.used(), budget.used()), (0, 0, 0));
        assert_eq!(
            (first.peak(), second.peak(), budget.peak()),
            (500, 450, 950)
        );
    }

    #[test]
    fn spilling_operators_leave_room_for_the_others() {
        let (_, session, pool) = session(1 << 20);
        session.begin(1000);
        let sort1 = reservation(&pool, "sort1", true);
        let sort2 = reservation(&pool, "sort2", true);
        sort1.try_grow(600).unwrap();
        let err = sort2.try_grow(300).unwrap_err().to_string();
        assert!(err.contains("spilling operators"), "{err}");
        sort2.try_grow(275).unwrap();
        // One that holds nothing yet may start in the others' share, with
        // up to an 8th of the limit...
        let sort3 = reservation(&pool, "sort3", true);
        sort3.try_grow(10).unwrap();
        let sort4 = reservation(&pool, "sort4", true);
        assert!(sort4.try_grow(126).is_err());
        sort4.try_grow(100).unwrap();
        sort4.shrink(100);
        // ...but not grow there.
        assert!(sort3.try_grow(10).is_err());
        let fixed = reservation(&pool, "aggregate", false);
        fixed.try_grow(115).unwrap();
        let err = fixed.try_grow(1).unwrap_err().to_string();
        assert!(
            err.contains("the query's memory limit (1000B) is reached")
                && err.contains("most by sort1 600B, sort2 275B, aggregate 115B and 1 more"),
            "the limit holds, and the refusal names the largest holders: {err}"
        );
        // At the limit, a spiller holding (almost) nothing may still start,
        // a little past it: an 8th of the limit for all such together.
        let starters: Vec<_> = (0..10)
            .map(|i| reservation(&pool, &format!("start{i}"), true))
            .collect();
        let started = starters.iter().filter(|r| r.try_grow(15).is_ok()).count();
        assert_eq!(started, 8, "125 bytes past the limit: eight of 15");
        assert!(fixed.try_grow(1).is_err(), "the limit holds for the others");
        assert!(
            sort1.try_grow(1).is_err(),
            "and for the spillers that hold memory"
        );
        drop(starters);
        sort1.shrink(600);
        fixed.try_grow(500).unwrap();
    }

    #[test]
    fn repartition_buffers_are_held_to_the_budget_only() {
        let (budget, session, pool) = session(3000);
        let query = session.begin(1000);
        let channel = reservation(&pool, "RepartitionExec[3]", true);
        channel.try_grow(1500).unwrap();
        assert_eq!((query.used(), budget.used()), (1500, 1500));
        // Past its limit, the query's other operators are refused (past
        // what one that holds nothing may start with, an 8th)...
        let sort = reservation(&pool, "SortExec[0]", true);
        assert!(sort.try_grow(200).is_err());
        // ...but one with nothing to spill is held to the limit without
        // the channel's bytes: refused, it would fail the query.
        let build = reservation(&pool, "HashJoinInput", false);
        build.try_grow(900).unwrap();
        assert!(build.try_grow(101).is_err(), "the limit holds for it");
        drop(build);
        // ...and the channel stops at the server's budget.
        assert!(channel.try_grow(1501).is_err());
        channel.shrink(1500);
        sort.try_grow(200).unwrap();
        // Only the output channels: not a merge, not a look-alike.
        for name in [
            "RepartitionExec[Merge 0]",
            "RepartitionExec",
            "RepartitionExec[]",
        ] {
            let other = reservation(&pool, name, true);
            assert!(other.try_grow(950).is_err(), "{name}");
        }
    }

    #[test]
    fn sizes_print_in_postgresql_units() {
        assert_eq!(format_bytes(64 << 20), "64MB");
        assert_eq!(format_bytes(2 << 30), "2GB");
        assert_eq!(format_bytes(1536 << 10), "1536kB");
        assert_eq!(format_bytes(100), "100B");
    }
}
