//! A hash join that spills: DataFusion's hash join while its build side
//! fits the query's memory, a grace hash join on disk when it does not.
//!
//! # Algorithm
//!
//! 1. **In memory.** [`SpillingHashJoinExec`] runs DataFusion's
//!    `HashJoinExec` (same keys, filter, type, projection, mode and dynamic
//!    filters) over two taps. The build tap passes the build rows to the
//!    join and keeps a counted copy of them; the probe tap tells when the
//!    join first reads its probe side — its build is then done, and the copy
//!    is dropped. A join that fits costs a copy of references to batches.
//! 2. **Take-over.** When the join's build is refused memory (DataFusion's
//!    "resources exhausted", raised by the join or by the build tap when the
//!    copy cannot grow) and the probe side was never read, the join's stream
//!    is dropped: the taps keep the build rows seen so far, the unread rest
//!    of the build input and the unread probe input. (Any other error, or
//!    one after the probe side was read, is the query's.)
//! 3. **Partition.** Both sides are split into [`grace::FANOUT_FIRST`] spill
//!    files each by a hash of the join keys (a seed of its own, so that rows
//!    DataFusion's repartitioning put together spread again). Equal keys
//!    land in the same part on both sides, so the join is the union of the
//!    parts' joins — for every join type, since a row of either side meets
//!    all the rows it could match in its part.
//! 4. **Join part by part.** A part whose build side fits a quarter of the
//!    query's limit is read back and joined in memory by DataFusion's hash
//!    join (CollectLeft over the part's two files).
//! 5. **Skew.** A part that does not fit (or whose join is refused memory)
//!    is split again into 8 with the next level's seed, up to 4 levels.
//! 6. **One key.** A part that a split cannot make smaller (every build row
//!    has the same hash: one key, or a few that collide) is joined a chunk
//!    of its build rows at a time against all its probe rows. What a chunk's
//!    join says of a build row is final (the row is in that chunk only);
//!    what it says of a probe row is gathered over the chunks by the probe
//!    rows' numbers in the part, and said at the end: Right and Full joins
//!    add the probe rows no chunk matched, RightSemi/RightAnti/RightMark
//!    emit the probe rows by whether some chunk matched them.
//!
//! DataFusion's CollectLeft mode builds once for all probe partitions: each
//! partition that fails hands its probe input to the shared state, and the
//! last one to arrive runs the spilled join over all of them (the others end
//! empty). In Partitioned mode each partition spills on its own.
//!
//! A null-aware anti join (`NOT IN`) and a join whose output order a parent
//! relies on are left to DataFusion's join (the rule does not wrap them):
//! the first needs all probe rows at once, the second an order parts lose.
//!
//! # States of one output partition
//!
//! ```text
//!            execute
//!               │
//!               ▼
//!        ┌─────────────┐  rows                        ┌──────┐
//!        │  Joining    ├─────────────────────────────▶│ Done │
//!        │ (DataFusion)│  end / any other error       └──────┘
//!        └──────┬──────┘                                  ▲
//!               │ memory refused, probe side unread       │
//!               ▼                                         │
//!        ┌─────────────┐ CollectLeft, not the last        │
//!        │  Take-over  ├──────────────────────────────────┤ (empty)
//!        └──────┬──────┘                                  │
//!               │ rows kept + rest of build, probe input  │
//!               ▼                                         │
//!        ┌─────────────┐                                  │
//!        │ Partitioning│ both sides → 32 spill files each │
//!        └──────┬──────┘                                  │
//!               ▼                                         │
//!        ┌─────────────┐ fits    ┌───────────┐            │
//!        │  Next part  ├────────▶│ In memory ├──┐         │
//!        └──┬───┬──────┘         └─────┬─────┘  │ rows    │
//!           │   │ too big / refused    │refused │         │
//!           │   ▼                      ▼        │         │
//!           │ ┌────────────┐  splits ┌────────┐ │         │
//!           │ │ Split (×8) ├────────▶│ parts  │ │         │
//!           │ └─────┬──────┘         └────────┘ │         │
//!           │       │ one key: no split helps   │         │
//!           │       ▼                           │         │
//!           │ ┌────────────┐ rows, then the     │         │
//!           │ │  Chunks    ├─ probe rows' end ──┤         │
//!           │ └────────────┘                    │         │
//!           │ no part left                      ▼         │
//!           └──────────────────────────────────────────────┘
//! ```
//!
//! Spill files are DataFusion's (Arrow IPC in the query's spill area), each
//! deleted when the part that reads it is done or the query is dropped.

mod grace;
mod tee;
#[cfg(test)]
mod tests;

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::Result;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::metrics::{
    ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, SpillMetrics,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    InputDistributionRequirements, PlanProperties,
};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, Stream, StreamExt};

use grace::{Grace, GraceMetrics, JoinSpec};
use tee::{BuildSlot, Kind, ProbeSlot, Slots, TapExec, lock, out_of_memory, slot};

/// DataFusion's hash join, continued on disk when its build side does not
/// fit (see the module's comment).
#[derive(Clone, Debug)]
pub struct SpillingHashJoinExec {
    /// The join as planned, over the original inputs.
    plain: Arc<HashJoinExec>,
    /// The same join over the taps: what runs.
    join: Arc<HashJoinExec>,
    builds: Slots<BuildSlot>,
    probes: Slots<ProbeSlot>,
    /// CollectLeft: the probe inputs handed over so far.
    arrivals: Arc<Mutex<Arrivals>>,
    spec: Arc<JoinSpec>,
    metrics: ExecutionPlanMetricsSet,
}

#[derive(Default)]
struct Arrivals {
    count: usize,
    probes: Vec<SendableRecordBatchStream>,
}

impl fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} arrived", self.count)
    }
}

impl SpillingHashJoinExec {
    /// `join` made able to spill; None for the joins it leaves to
    /// DataFusion (see the module's comment).
    pub fn try_new(join: &HashJoinExec) -> Result<Option<Self>> {
        if join.null_aware || join.properties().output_ordering().is_some() {
            return Ok(None);
        }
        let builds: Slots<BuildSlot> = Arc::default();
        let probes: Slots<ProbeSlot> = Arc::default();
        let build_tap = Arc::new(TapExec::new(
            Arc::clone(join.left()),
            Kind::Build(Arc::clone(&builds)),
        ));
        let probe_tap = Arc::new(TapExec::new(
            Arc::clone(join.right()),
            Kind::Probe {
                slots: Arc::clone(&probes),
                builds: Arc::clone(&builds),
                shared_build: join.mode == PartitionMode::CollectLeft,
            },
        ));
        let tapped = join
            .builder()
            .with_new_children(vec![build_tap, probe_tap])?
            .build()?;
        let spec = Arc::new(JoinSpec {
            on: join.on().to_vec(),
            filter: join.filter().cloned(),
            join_type: *join.join_type(),
            projection: join.projection.as_ref().map(|p| p.to_vec()),
            null_equality: join.null_equality(),
            build_schema: join.left().schema(),
            probe_schema: join.right().schema(),
            schema: join.schema(),
        });
        Ok(Some(Self {
            plain: Arc::new(join.builder().build()?),
            join: Arc::new(tapped),
            builds,
            probes,
            arrivals: Arc::default(),
            spec,
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }

    /// The join as DataFusion planned it.
    pub fn hash_join(&self) -> &HashJoinExec {
        &self.plain
    }

    fn wrap(join: HashJoinExec) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(match Self::try_new(&join)? {
            Some(spilling) => Arc::new(spilling),
            None => Arc::new(join),
        })
    }

    /// Continue partition `partition` on disk, if its join was refused
    /// memory while building (see the module's comment).
    fn take_over(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
    ) -> Option<BoxFuture<'static, Result<BoxStream<'static, Result<RecordBatch>>>>> {
        let collect_left = self.plain.mode == PartitionMode::CollectLeft;
        let build = slot(&self.builds, if collect_left { 0 } else { partition })?;
        let probe = slot(&self.probes, partition)?;
        {
            let build = lock(&build);
            if build.failed || build.released {
                return None;
            }
        }
        let probe = {
            let mut probe = lock(&probe);
            if probe.polled {
                return None;
            }
            probe.parked.take()?
        };
        let probes = if collect_left {
            let partitions = self.plain.right().output_partitioning().partition_count();
            let mut arrivals = lock(&self.arrivals);
            arrivals.count += 1;
            arrivals.probes.push(probe);
            if arrivals.count < partitions {
                return Some(futures::future::ready(Ok(futures::stream::empty().boxed())).boxed());
            }
            std::mem::take(&mut arrivals.probes)
        } else {
            vec![probe]
        };
        let (kept, memory, rest) = {
            let mut build = lock(&build);
            (
                std::mem::take(&mut build.recorded),
                build.reservation.take(),
                build.rest.take(),
            )
        };
        let metrics = GraceMetrics {
            spill: SpillMetrics::new(&self.metrics, partition),
            parts: MetricBuilder::new(&self.metrics).counter("spilled_parts", partition),
            splits: MetricBuilder::new(&self.metrics).counter("spilled_splits", partition),
            chunks: MetricBuilder::new(&self.metrics).counter("spilled_chunks", partition),
        };
        log::debug!(
            "hash join partition {partition}: the build side does not fit, joining on disk"
        );
        let grace = Grace::new(Arc::clone(&self.spec), Arc::clone(context), metrics);
        Some(grace.run(kept, memory, rest, probes).boxed())
    }
}

impl SpillingHashJoinExec {
    /// Partition `partition` is done with DataFusion's join and will not
    /// take over: drop what its taps kept. An unread probe input left
    /// parked would keep the plan below it waiting: a partitioned hash join
    /// there holds its partitions at a barrier until each one reported its
    /// build or was dropped (TPC-H Q18 on 32 threads hung when a partition
    /// of the semi join above, its build side empty, never read its probe).
    fn release(&self, partition: usize) {
        if let Some(probe) = slot(&self.probes, partition) {
            lock(&probe).parked = None;
        }
        // The one build of CollectLeft is every partition's: it went well
        // for all (this one ended) or is taken over by the last to arrive.
        if self.plain.mode != PartitionMode::CollectLeft
            && let Some(build) = slot(&self.builds, partition)
        {
            let mut build = lock(&build);
            build.rest = None;
            build.release();
        }
    }
}

impl DisplayAs for SpillingHashJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        // Printed as the join it runs, so that a plan reads the same on a
        // single node (where joins spill) and on a cluster (where they do
        // not yet); EXPLAIN ANALYZE adds the spill counters.
        self.plain.fmt_as(t, f)
    }
}

impl ExecutionPlan for SpillingHashJoinExec {
    fn name(&self) -> &str {
        "SpillingHashJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.plain.properties()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.plain.input_distribution_requirements()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.plain.apply_expressions(f)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        // Parts lose the order of either side.
        vec![false, false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.plain.left(), self.plain.right()]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Self::wrap(
            self.plain
                .builder()
                .recompute_properties()
                .with_new_children(children)?
                .build()?,
        )
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Self::wrap(self.plain.builder().reset_state().build()?)
    }

    fn dynamic_expressions_produced(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        self.plain.dynamic_expressions_produced()
    }

    fn metrics(&self) -> Option<MetricsSet> {
        let mut metrics = self.join.metrics().unwrap_or_default();
        for metric in self.metrics.clone_inner().iter() {
            metrics.push(Arc::clone(metric));
        }
        Some(metrics)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let joining = self.join.execute(partition, Arc::clone(&context))?;
        Ok(Box::pin(SpillingStream {
            schema: self.schema(),
            state: State::Joining(joining),
            exec: self.clone(),
            partition,
            context,
            yielded: false,
        }))
    }
}

enum State {
    Joining(SendableRecordBatchStream),
    Starting(BoxFuture<'static, Result<BoxStream<'static, Result<RecordBatch>>>>),
    Spilled(BoxStream<'static, Result<RecordBatch>>),
    Done,
}

struct SpillingStream {
    schema: SchemaRef,
    state: State,
    exec: SpillingHashJoinExec,
    partition: usize,
    context: Arc<TaskContext>,
    /// Rows went out of DataFusion's join: no take-over after that.
    yielded: bool,
}

impl Stream for SpillingStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match &mut self.state {
                State::Joining(joining) => match std::task::ready!(joining.poll_next_unpin(cx)) {
                    Some(Err(e)) if !self.yielded && out_of_memory(&e) => {
                        // Dropping the join parks its inputs in the taps.
                        self.state = State::Done;
                        match self.exec.take_over(self.partition, &self.context) {
                            Some(start) => self.state = State::Starting(start),
                            None => {
                                self.exec.release(self.partition);
                                return Poll::Ready(Some(Err(e)));
                            }
                        }
                    }
                    Some(Ok(batch)) => {
                        self.yielded = true;
                        return Poll::Ready(Some(Ok(batch)));
                    }
                    other => {
                        // Dropped first: that parks what its taps kept.
                        self.state = State::Done;
                        self.exec.release(self.partition);
                        return Poll::Ready(other);
                    }
                },
                State::Starting(start) => match std::task::ready!(start.poll_unpin(cx)) {
                    Ok(rows) => self.state = State::Spilled(rows),
                    Err(e) => {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                },
                State::Spilled(rows) => return rows.poll_next_unpin(cx),
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

impl Drop for SpillingStream {
    fn drop(&mut self) {
        // Stopped while DataFusion's join ran (a LIMIT above was satisfied,
        // the statement was cancelled): nothing will take over.
        if matches!(self.state, State::Joining(_)) {
            self.state = State::Done;
            self.exec.release(self.partition);
        }
    }
}

impl RecordBatchStream for SpillingStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
