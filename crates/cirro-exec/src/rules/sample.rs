//! A sampling run for the group keys the statistics say nothing about
//! (CirroData §5.2): before a cluster cuts a plan into stages, each
//! grouped aggregation whose groups neither `ANALYZE`'s distinct counts
//! nor the keys' value ranges estimate ([`super::estimated_groups`]) has
//! its keys' scan read for at most [`SAMPLE_ROWS`] rows, spread over the
//! scan's partitions, and each key column's distinct values over the
//! whole scan estimated from the sample. The estimate goes into the
//! scan's statistics (an inexact distinct count), where the coordinator's
//! choice of what crosses the network ([`super::AggregationExchange`])
//! and EXPLAIN read it like one `ANALYZE` left.
//!
//! The estimator is Chao's (bias-corrected Chao1; A. Chao, "Nonparametric
//! estimation of the number of classes in a population", 1984): with `d`
//! distinct values among the rows read, `f1` of them seen once and `f2`
//! twice, `D = d + f1 (f1 - 1) / (2 (f2 + 1))`, between `d` and the scan's
//! rows. Keys seen many times each (few groups) give about `d`; keys
//! nearly all seen once (about as many groups as rows) give about the
//! rows, which is the distinction the choice needs. The rows read are the
//! first of each partition, not a random sample: keys written in order
//! (each key's rows together) look fewer than they are. DataFusion's probe
//! at run time still skips a partial phase that does not shrink its rows.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Result, Statistics};
use datafusion::config::ConfigOptions;
use datafusion::datasource::physical_plan::{FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use futures::StreamExt;

use super::AggregationOptions;
use super::aggregation::{distinct_values, estimated_groups, two_phases};

/// The most rows a sampling run reads, over all the keys of a query.
pub const SAMPLE_ROWS: usize = 65_536;

/// What a sampling run found for one key column.
#[derive(Clone, Debug)]
pub struct KeySample {
    pub column: String,
    /// Rows read, and the scan's rows.
    pub rows: usize,
    pub total: usize,
    /// Distinct values among the rows read, and the estimate for all.
    pub distinct: usize,
    pub estimate: f64,
    pub elapsed: Duration,
}

impl std::fmt::Display for KeySample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "group key {} sampled: {} distinct in {} of {} rows, ≈{:.0} in all ({} ms)",
            self.column,
            self.distinct,
            self.rows,
            self.total,
            self.estimate,
            self.elapsed.as_millis()
        )
    }
}

/// Chao's estimate of the distinct values of `total` rows from `rows` of
/// them holding `distinct` values, `once` of them once and `twice` twice.
pub fn estimate_distinct(
    rows: usize,
    total: usize,
    distinct: usize,
    once: usize,
    twice: usize,
) -> f64 {
    if rows >= total {
        return distinct as f64;
    }
    let (d, f1, f2) = (distinct as f64, once as f64, twice as f64);
    (d + f1 * (f1 - 1.0).max(0.0) / (2.0 * (f2 + 1.0))).clamp(d, total as f64)
}

/// A key column to sample: the scan it is read by and its name there.
struct Target {
    scan: Arc<dyn ExecutionPlan>,
    column: String,
}

/// `plan` with sampled distinct counts in the scans of the group keys that
/// need them (see the module docs), and what each sampling run found.
/// Nothing is sampled unless the session's `aggregation_exchange` is
/// `auto` and adaptive aggregation is on.
pub async fn sample_group_keys(
    plan: Arc<dyn ExecutionPlan>,
    options: &ConfigOptions,
    ctx: Arc<TaskContext>,
) -> Result<(Arc<dyn ExecutionPlan>, Vec<KeySample>)> {
    let aggregation = AggregationOptions::of(options);
    if !aggregation.exchange.eq_ignore_ascii_case("auto") || aggregation.mode == "off" {
        return Ok((plan, Vec::new()));
    }
    let targets = targets(&plan)?;
    if targets.is_empty() {
        return Ok((plan, Vec::new()));
    }
    let per_target = SAMPLE_ROWS / targets.len();
    let mut samples = Vec::new();
    let mut stamped: Vec<(Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>)> = Vec::new();
    for target in targets {
        let scan = match stamped
            .iter()
            .find(|(old, _)| Arc::ptr_eq(old, &target.scan))
        {
            Some((_, new)) => Arc::clone(new),
            None => Arc::clone(&target.scan),
        };
        let Some(sample) = sample(&scan, &target.column, per_target, &ctx).await? else {
            continue;
        };
        let Some(new) = with_distinct(&scan, &target.column, sample.estimate)? else {
            continue;
        };
        samples.push(sample);
        match stamped
            .iter_mut()
            .find(|(old, _)| Arc::ptr_eq(old, &target.scan))
        {
            Some(entry) => entry.1 = new,
            None => stamped.push((target.scan, new)),
        }
    }
    let plan = plan
        .transform_up(
            |node| match stamped.iter().find(|(old, _)| Arc::ptr_eq(old, &node)) {
                Some((_, new)) => Ok(Transformed::yes(Arc::clone(new))),
                None => Ok(Transformed::no(node)),
            },
        )?
        .data;
    Ok((plan, samples))
}

/// The key columns of `plan`'s two-phase aggregations whose groups cannot
/// be estimated and that a scan reads unchanged.
fn targets(plan: &Arc<dyn ExecutionPlan>) -> Result<Vec<Target>> {
    let mut targets: Vec<Target> = Vec::new();
    plan.apply(|node| {
        let Some(last) = node.downcast_ref::<AggregateExec>() else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let Some((_, partial)) = two_phases(last) else {
            return Ok(TreeNodeRecursion::Continue);
        };
        if estimated_groups(partial.group_expr(), partial.input()).is_some() {
            return Ok(TreeNodeRecursion::Continue);
        }
        let stats =
            StatisticsContext::new().compute(partial.input().as_ref(), &StatisticsArgs::new())?;
        for (expr, _) in partial.group_expr().expr() {
            if distinct_values(&stats, expr).is_some() {
                continue;
            }
            let Some(column) = expr.downcast_ref::<Column>() else {
                continue;
            };
            let Some((scan, name)) = scan_column(partial.input(), column.name()) else {
                continue;
            };
            let known = targets
                .iter()
                .any(|t| Arc::ptr_eq(&t.scan, &scan) && t.column == name);
            if !known {
                targets.push(Target { scan, column: name });
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(targets)
}

/// The file scan below `node` that reads `column` unchanged (through
/// operators of one input; a projection must pass it on as a column), and
/// the column's name there.
fn scan_column(
    node: &Arc<dyn ExecutionPlan>,
    column: &str,
) -> Option<(Arc<dyn ExecutionPlan>, String)> {
    let mut node = Arc::clone(node);
    let mut name = column.to_string();
    loop {
        if let Some(scan) = node.downcast_ref::<DataSourceExec>() {
            scan.data_source().downcast_ref::<FileScanConfig>()?;
            node.schema().index_of(&name).ok()?;
            return Some((node, name));
        }
        if let Some(projection) = node.downcast_ref::<ProjectionExec>() {
            let index = node.schema().index_of(&name).ok()?;
            let source = projection
                .expr()
                .get(index)?
                .expr
                .downcast_ref::<Column>()?;
            name = source.name().to_string();
        }
        let children = node.children();
        if children.len() != 1 {
            return None;
        }
        let child = Arc::clone(children[0]);
        child.schema().index_of(&name).ok()?;
        node = child;
    }
}

/// A sampling run of `column` of `scan`: at most `limit` rows, taken from
/// its partitions in turn; None when the scan's rows are unknown and it
/// was not read to its end.
async fn sample(
    scan: &Arc<dyn ExecutionPlan>,
    column: &str,
    limit: usize,
    ctx: &Arc<TaskContext>,
) -> Result<Option<KeySample>> {
    let started = Instant::now();
    let index = scan.schema().index_of(column)?;
    let partitions = scan
        .properties()
        .output_partitioning()
        .partition_count()
        .max(1);
    let share = limit.div_ceil(partitions).max(1);
    let state = RandomState::with_seed(0x5a3b1e);
    let mut counts: HashMap<u64, u32> = HashMap::new();
    let mut rows = 0usize;
    let mut exhausted = true;
    let mut hashes = Vec::new();
    for partition in 0..partitions {
        let mut stream = scan.execute(partition, Arc::clone(ctx))?;
        let mut taken = 0usize;
        while taken < share {
            let Some(batch) = stream.next().await else {
                break;
            };
            let batch = batch?;
            let n = batch.num_rows().min(share - taken);
            let values = batch.column(index).slice(0, n);
            hashes.clear();
            hashes.resize(n, 0);
            create_hashes([&values], &state, &mut hashes)?;
            for hash in &hashes {
                *counts.entry(*hash).or_default() += 1;
            }
            taken += n;
        }
        if taken >= share {
            exhausted = false;
        }
        rows += taken;
    }
    let stats = StatisticsContext::new().compute(scan.as_ref(), &StatisticsArgs::new())?;
    let total = match stats.num_rows.get_value() {
        Some(total) => (*total).max(rows),
        None if exhausted => rows,
        None => return Ok(None),
    };
    let total = if exhausted { rows } else { total };
    let once = counts.values().filter(|&&c| c == 1).count();
    let twice = counts.values().filter(|&&c| c == 2).count();
    let distinct = counts.len();
    Ok(Some(KeySample {
        column: column.to_string(),
        rows,
        total,
        distinct,
        estimate: estimate_distinct(rows, total, distinct, once, twice),
        elapsed: started.elapsed(),
    }))
}

/// `scan` with `estimate` as the distinct count of `column` in its
/// statistics (inexact); None where its column is not found.
fn with_distinct(
    scan: &Arc<dyn ExecutionPlan>,
    column: &str,
    estimate: f64,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    let Some(exec) = scan.downcast_ref::<DataSourceExec>() else {
        return Ok(None);
    };
    let Some(config) = exec.data_source().downcast_ref::<FileScanConfig>() else {
        return Ok(None);
    };
    let table = config.file_source.table_schema().table_schema();
    let Ok(index) = table.index_of(column) else {
        return Ok(None);
    };
    let mut statistics: Statistics = config.statistics();
    let Some(stats) = statistics.column_statistics.get_mut(index) else {
        return Ok(None);
    };
    stats.distinct_count = Precision::Inexact(estimate.round() as usize);
    let config = FileScanConfigBuilder::from(config.clone())
        .with_statistics(statistics)
        .build();
    Ok(Some(DataSourceExec::from_data_source(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_tells_few_values_from_about_as_many_as_rows() {
        // The whole scan read: what was seen.
        assert_eq!(estimate_distinct(1000, 1000, 37, 0, 0), 37.0);
        // Few values, each seen many times: as many.
        assert_eq!(estimate_distinct(65_536, 6_000_000, 7, 0, 0), 7.0);
        // Every value seen once: as many as the rows.
        assert_eq!(estimate_distinct(65_536, 6_000_000, 65_536, 65_536, 0), 6e6);
        // 1000 values seen once, 500 twice, 100 three times.
        let some = estimate_distinct(2300, 1_000_000, 1600, 1000, 500);
        assert!(
            (some - (1600.0 + 1000.0 * 999.0 / 1002.0)).abs() < 1e-9,
            "{some}"
        );
    }
}
