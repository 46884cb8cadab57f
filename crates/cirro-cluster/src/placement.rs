//! Which files each task of a stage scans, for scans of bucketed tables.
//!
//! A bucketed scan (`cirro-storage/src/bucket.rs`) declares `Hash(k, p)`:
//! its partition j holds the buckets b with b mod p = j, and a join or
//! aggregation above it relies on that. datafusion-distributed runs a stage
//! as T tasks, each with the stage's p partitions, and when the stage also
//! reads a hash shuffle, task t's partition j receives the rows whose hash
//! mod pT is t·p + j (the shuffle's producers split into pT partitions, and
//! consumer t takes the t-th run of p). So task t's partition j of a
//! bucketed scan must hold exactly those rows too:
//!
//! ```text
//!  n buckets, p partitions per task, T tasks, m = p·T
//!  m divides n:  task t, partition j  ←  the buckets b with b mod m = t·p + j
//!                (whole buckets: every bucket is read by one task, and bucket
//!                 b of every table scanned alike lands in the same task)
//!  otherwise:    task t, partition j  ←  the buckets b with b mod p = j, keeping
//!                the rows with cirro_hash_slot(m, k) in [t·p, t·p + p)
//! ```
//!
//! (`hash mod m = t·p + j` gives `hash mod p = j`, as p divides m, so the
//! partition's rows are within its buckets either way.) The first case
//! reads each file once; the second reads each file in every task that needs
//! part of it, which is why bucket counts should be multiples of the nodes
//! times the cores (the docs say so). The datafusion-distributed default
//! (files dealt round-robin over the tasks' partitions) would break the
//! declared partitioning, so this handler takes every scan that declares one.

use std::sync::Arc;

use cirro_storage::bucket::FileBucket;
use datafusion::common::{Result, ScalarValue, internal_err};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig};
use datafusion::datasource::source::DataSourceExec;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::expressions::{BinaryExpr, Literal};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};
use datafusion::prelude::SessionConfig;
use datafusion_distributed::{
    DistributedLeafExec, ScaleUpLeafNodeEvent, ScaleUpLeafNodeEventResponse,
};

/// The scale-up handler for scans that declare a hash partitioning (see the
/// module docs); None for other leaves (the default handles them).
pub(crate) fn bucketed_scan_tasks(
    ev: ScaleUpLeafNodeEvent,
) -> Option<Result<ScaleUpLeafNodeEventResponse>> {
    let dse = ev.plan.downcast_ref::<DataSourceExec>()?;
    let scan = dse.data_source().downcast_ref::<FileScanConfig>()?;
    scan.output_partitioning.as_ref()?;
    let Partitioning::Hash(keys, partitions) = ev.plan.output_partitioning().clone() else {
        // The key is not among the scan's columns: nothing above relies on
        // the partitioning, any split is right; but the default would keep
        // declaring it, so split here too, as one bucket-blind run.
        return Some(split(ev.plan, scan, None, ev.task_count, ev.session_config));
    };
    Some(split(
        ev.plan,
        scan,
        Some((&keys, partitions)),
        ev.task_count,
        ev.session_config,
    ))
}

/// The per-task scans of `plan` (see the module docs). Without `hash`
/// (keys and p), files are dealt to the tasks whole, round-robin.
fn split(
    plan: &Arc<dyn ExecutionPlan>,
    scan: &FileScanConfig,
    hash: Option<(&[Arc<dyn PhysicalExpr>], usize)>,
    tasks: usize,
    config: &SessionConfig,
) -> Result<ScaleUpLeafNodeEventResponse> {
    let files: Vec<&PartitionedFile> = scan.file_groups.iter().flat_map(|g| g.iter()).collect();
    let tasks = tasks.max(1);
    let variants = match hash {
        None => {
            let groups = scan.file_groups.len().max(1);
            (0..tasks)
                .map(|t| {
                    let mut mine: Vec<Vec<PartitionedFile>> = vec![Vec::new(); groups];
                    for (i, file) in files.iter().enumerate().filter(|(i, _)| i % tasks == t) {
                        mine[(i / tasks) % groups].push((*file).clone());
                    }
                    Ok(scan_of(scan, mine))
                })
                .collect::<Result<Vec<_>>>()?
        }
        Some((keys, partitions)) => {
            let mut buckets = Vec::with_capacity(files.len());
            for file in &files {
                let Some(bucket) = file.extension::<FileBucket>() else {
                    return internal_err!(
                        "a file of a hash-partitioned scan has no bucket: {}",
                        file.object_meta.location
                    );
                };
                buckets.push(*bucket);
            }
            let count = buckets.first().map(|b| b.buckets as usize).unwrap_or(1);
            let slots = partitions * tasks;
            let whole = count % slots == 0;
            (0..tasks)
                .map(|t| {
                    let mut mine: Vec<Vec<PartitionedFile>> = vec![Vec::new(); partitions];
                    for (file, bucket) in files.iter().zip(&buckets) {
                        let b = bucket.bucket as usize;
                        if !whole || (b % slots) / partitions == t {
                            mine[b % partitions].push((*file).clone());
                        }
                    }
                    let scan = scan_of(scan, mine);
                    if whole {
                        return Ok(scan);
                    }
                    let keep = slot_range(keys, slots, t * partitions, partitions, &scan, config)?;
                    Ok(Arc::new(FilterExec::try_new(keep, scan)?) as Arc<dyn ExecutionPlan>)
                })
                .collect::<Result<Vec<_>>>()?
        }
    };
    let leaf = DistributedLeafExec::try_new(Arc::clone(plan), variants)?;
    Ok(ScaleUpLeafNodeEventResponse::new(Arc::new(leaf)))
}

/// `scan` reading `groups` (one per partition).
fn scan_of(scan: &FileScanConfig, groups: Vec<Vec<PartitionedFile>>) -> Arc<dyn ExecutionPlan> {
    let mut config = scan.clone();
    config.file_groups = groups.into_iter().map(FileGroup::new).collect();
    DataSourceExec::from_data_source(config)
}

/// `cirro_hash_slot(slots, keys…) >= first AND … < first + count`.
fn slot_range(
    keys: &[Arc<dyn PhysicalExpr>],
    slots: usize,
    first: usize,
    count: usize,
    input: &Arc<dyn ExecutionPlan>,
    config: &SessionConfig,
) -> Result<Arc<dyn PhysicalExpr>> {
    let literal =
        |v: u64| Arc::new(Literal::new(ScalarValue::UInt64(Some(v)))) as Arc<dyn PhysicalExpr>;
    let mut args = vec![literal(slots as u64)];
    args.extend(keys.iter().cloned());
    let slot = Arc::new(ScalarFunctionExpr::try_new(
        cirro_exec::functions::slot::hash_slot_udf(),
        args,
        input.schema().as_ref(),
        Arc::clone(config.options()),
    )?) as Arc<dyn PhysicalExpr>;
    let slot = Arc::new(datafusion::physical_expr::expressions::CastExpr::new(
        slot,
        datafusion::arrow::datatypes::DataType::UInt64,
        None,
    )) as Arc<dyn PhysicalExpr>;
    let low = Arc::new(BinaryExpr::new(
        Arc::clone(&slot),
        Operator::GtEq,
        literal(first as u64),
    ));
    let high = Arc::new(BinaryExpr::new(
        slot,
        Operator::Lt,
        literal((first + count) as u64),
    ));
    Ok(Arc::new(BinaryExpr::new(low, Operator::And, high)))
}
