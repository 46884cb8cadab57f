//! The seam between a session and the cluster it runs in: how a cluster
//! node's sessions plan queries across nodes (implemented in
//! `cirro-cluster` on `datafusion-distributed`). A single node has none.

use std::sync::Arc;

use datafusion::config::ConfigExtension;
use datafusion::error::DataFusionError;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use futures::future::BoxFuture;

/// An exchange of rows between the nodes of a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchange {
    /// Each row goes to the task of its key's hash.
    Shuffle,
    /// Every row goes to every task.
    Broadcast,
}

/// Query execution across the nodes of a cluster.
pub trait Distribution: Send + Sync + std::fmt::Debug {
    /// Set up a new session to distribute the queries it plans (its query
    /// planner, worker resolver, codecs).
    fn configure(&self, builder: SessionStateBuilder) -> SessionStateBuilder;

    /// The tasks each stage of a query planned now runs as: the live
    /// nodes (see `JoinOrderOptions::stage_tasks`).
    fn stage_tasks(&self) -> usize;

    /// Whether `plan` runs on several nodes.
    fn is_distributed(&self, plan: &Arc<dyn ExecutionPlan>) -> bool;

    /// How `plan`'s operator receives rows from other nodes, if it does
    /// (EXPLAIN's join and aggregation marks).
    fn exchange(&self, plan: &dyn ExecutionPlan) -> Option<Exchange>;

    /// Whether `error` says a node failed or could not be reached (not that
    /// the query itself is wrong): a read-only query is then run once more
    /// on the remaining nodes.
    fn is_node_failure(&self, error: &DataFusionError) -> bool;

    /// Before that retry: find out which nodes do not answer, and leave
    /// them out of new plans until they register again.
    fn forget_failed_nodes(&self) -> BoxFuture<'_, ()>;

    /// Which nodes ran the tasks of the queries the session with `config`
    /// ran since the last call (one line per stage), after what their
    /// planning's sampling runs found (a line per key), for `EXPLAIN
    /// ANALYZE`.
    fn take_task_placement(&self, config: &datafusion::prelude::SessionConfig) -> Vec<String>;

    /// Set up `config` to run an `EXPLAIN ANALYZE`: every task sends its
    /// operators' metrics back (other queries' do not).
    fn for_analyze(
        &self,
        config: &mut datafusion::prelude::SessionConfig,
    ) -> Result<(), DataFusionError>;
}

/// The physical rules one node applies to the plans it executes itself
/// (the local half of the planner: the hot-data tier, compiled
/// expressions, …), for a cluster node to apply to the tasks it runs, its
/// own queries' and other nodes'.
pub type LocalRules = Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>>;

/// Visits the types of a list of session option extensions
/// ([`OptionList`]).
pub trait OptionVisitor {
    fn visit<T: ConfigExtension + Default + Clone>(&mut self);
}

/// The session option extensions Cirro's rules read (`SET cache`, `SET
/// jit`, …): a session registers them, and a cluster sends their values
/// with every task so that a worker's local rules see the session's
/// settings.
pub trait OptionList {
    fn visit<V: OptionVisitor>(visitor: &mut V);
}
