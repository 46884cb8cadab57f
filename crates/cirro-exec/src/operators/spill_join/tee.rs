//! The two taps of a spilling hash join: the build tap keeps a copy of the
//! rows DataFusion's hash join collects, so that they are not lost when it
//! gives up for want of memory; the probe tap tells when the join got past
//! its build (the copy is then dropped) and keeps the probe input unread
//! for the spilling join when it never did.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{Stream, StreamExt};

/// What the build tap of one partition saw.
#[derive(Default)]
pub(super) struct BuildSlot {
    /// The rows passed to the join so far (or all of them).
    pub recorded: Vec<RecordBatch>,
    /// The input, when the join dropped it before its end.
    pub rest: Option<SendableRecordBatchStream>,
    /// The input failed: its error is the join's, nothing to take over.
    pub failed: bool,
    /// The join's build is done (the probe started): nothing is kept.
    pub released: bool,
    /// The copy's memory.
    pub reservation: Option<MemoryReservation>,
}

impl fmt::Debug for BuildSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} batches kept", self.recorded.len())
    }
}

impl fmt::Debug for ProbeSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "polled: {}", self.polled)
    }
}

impl BuildSlot {
    /// Stop keeping rows: the join has them.
    pub(super) fn release(&mut self) {
        self.released = true;
        self.recorded = Vec::new();
        if let Some(r) = self.reservation.take() {
            r.free();
        }
    }
}

/// What the probe tap of one partition saw.
#[derive(Default)]
pub(super) struct ProbeSlot {
    /// The join read from the probe side (its build was done).
    pub polled: bool,
    /// The input, when the join dropped it unread.
    pub parked: Option<SendableRecordBatchStream>,
}

pub(super) type Slots<T> = Arc<Mutex<Vec<Arc<Mutex<T>>>>>;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The slot of `partition`, made fresh when an execution starts.
fn fresh_slot<T: Default>(slots: &Slots<T>, partition: usize) -> Arc<Mutex<T>> {
    let mut slots = lock(slots);
    if slots.len() <= partition {
        slots.resize_with(partition + 1, Default::default);
    }
    slots[partition] = Arc::default();
    Arc::clone(&slots[partition])
}

pub(super) fn slot<T: Default>(slots: &Slots<T>, partition: usize) -> Option<Arc<Mutex<T>>> {
    lock(slots).get(partition).cloned()
}

/// A tap over an input of the join: `Build` keeps copies, `Probe` watches.
#[derive(Debug)]
pub(super) struct TapExec {
    input: Arc<dyn ExecutionPlan>,
    kind: Kind,
}

#[derive(Clone)]
pub(super) enum Kind {
    Build(Slots<BuildSlot>),
    Probe {
        slots: Slots<ProbeSlot>,
        builds: Slots<BuildSlot>,
        /// The build slot a probe partition releases: its own, or the one
        /// shared build (DataFusion's CollectLeft).
        shared_build: bool,
    },
}

impl fmt::Debug for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Build(_) => "build",
            Kind::Probe { .. } => "probe",
        })
    }
}

impl TapExec {
    pub(super) fn new(input: Arc<dyn ExecutionPlan>, kind: Kind) -> Self {
        Self { input, kind }
    }
}

impl DisplayAs for TapExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SpillingHashJoinTap: {:?}", self.kind)
    }
}

impl ExecutionPlan for TapExec {
    fn name(&self) -> &str {
        "SpillingHashJoinTap"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            children.swap_remove(0),
            self.kind.clone(),
        )))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        match &self.kind {
            Kind::Build(slots) => {
                let slot = fresh_slot(slots, partition);
                lock(&slot).reservation = Some(
                    MemoryConsumer::new(format!("SpillingHashJoinCopy[{partition}]"))
                        .register(context.memory_pool()),
                );
                Ok(Box::pin(BuildTap {
                    schema: input.schema(),
                    input: Some(input),
                    slot,
                    ended: false,
                }))
            }
            Kind::Probe {
                slots,
                builds,
                shared_build,
            } => {
                let slot = fresh_slot(slots, partition);
                let build = if *shared_build { 0 } else { partition };
                Ok(Box::pin(ProbeTap {
                    schema: input.schema(),
                    input: Some(input),
                    slot,
                    builds: Arc::clone(builds),
                    build,
                }))
            }
        }
    }
}

struct BuildTap {
    schema: SchemaRef,
    input: Option<SendableRecordBatchStream>,
    slot: Arc<Mutex<BuildSlot>>,
    ended: bool,
}

impl Stream for BuildTap {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(input) = self.input.as_mut() else {
            return Poll::Ready(None);
        };
        let item = std::task::ready!(input.poll_next_unpin(cx));
        let mut slot = lock(&self.slot);
        match item {
            Some(Ok(batch)) => {
                if slot.released {
                    return Poll::Ready(Some(Ok(batch)));
                }
                let size = batch.get_array_memory_size();
                let kept = slot
                    .reservation
                    .as_ref()
                    .map(|r| r.try_grow(size))
                    .transpose();
                slot.recorded.push(batch.clone());
                if let Err(e) = kept {
                    // The copy is made: count it, and make the join give up
                    // before it takes the batch too.
                    if let Some(r) = slot.reservation.as_ref() {
                        r.grow(size);
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(batch)))
            }
            Some(Err(e)) => {
                slot.failed = true;
                Poll::Ready(Some(Err(e)))
            }
            None => {
                drop(slot);
                self.ended = true;
                self.input = None;
                Poll::Ready(None)
            }
        }
    }
}

impl Drop for BuildTap {
    fn drop(&mut self) {
        if let Some(input) = self.input.take()
            && !self.ended
        {
            lock(&self.slot).rest = Some(input);
        }
    }
}

impl RecordBatchStream for BuildTap {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

struct ProbeTap {
    schema: SchemaRef,
    input: Option<SendableRecordBatchStream>,
    slot: Arc<Mutex<ProbeSlot>>,
    builds: Slots<BuildSlot>,
    build: usize,
}

impl Stream for ProbeTap {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        {
            let mut slot = lock(&self.slot);
            if !slot.polled {
                slot.polled = true;
                drop(slot);
                if let Some(build) = self::slot(&self.builds, self.build) {
                    lock(&build).release();
                }
            }
        }
        match self.input.as_mut() {
            Some(input) => input.poll_next_unpin(cx),
            None => Poll::Ready(None),
        }
    }
}

impl Drop for ProbeTap {
    fn drop(&mut self) {
        let mut slot = lock(&self.slot);
        if !slot.polled {
            slot.parked = self.input.take();
        }
    }
}

impl RecordBatchStream for ProbeTap {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// Whether `e` is a refusal of memory (however DataFusion wrapped it).
pub(super) fn out_of_memory(e: &DataFusionError) -> bool {
    matches!(e.find_root(), DataFusionError::ResourcesExhausted(_))
}
