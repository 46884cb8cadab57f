//! Deletion vectors across the network: DataFusion's plan protobuf keeps
//! a Parquet scan's file names and byte ranges but not the row selection
//! each file carries, so [`DeletionVectorsExec`] sits above such a scan on
//! the coordinator and [`crate::codec::CirroCodec`] carries the selections to the worker
//! and puts them back onto the decoded scan's files.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, Statistics,
};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

/// A Parquet scan's deletion vectors, carried to the workers: DataFusion's
/// protobuf keeps a scan's file names and byte ranges but not the row
/// selection each file carries, so this node sits above such a scan, keeps
/// the selections by file, and [`crate::codec::CirroCodec`] puts them back onto the
/// decoded scan's files. It runs as its input does.
#[derive(Debug)]
pub struct DeletionVectorsExec {
    input: Arc<dyn ExecutionPlan>,
    selections: Arc<HashMap<String, RowSelection>>,
}

impl DeletionVectorsExec {
    /// `plan` with one above every scan whose files carry row selections.
    pub(crate) fn wrap_scans(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let selections = row_selections(&node);
            if selections.is_empty() {
                return Ok(datafusion::common::tree_node::Transformed::no(node));
            }
            Ok(datafusion::common::tree_node::Transformed::yes(
                Arc::new(DeletionVectorsExec {
                    input: node,
                    selections: Arc::new(selections),
                }) as Arc<dyn ExecutionPlan>,
            ))
        })
        .map(|t| t.data)
    }
}

/// The row selections of `node`'s files, when it is a file scan.
fn row_selections(node: &Arc<dyn ExecutionPlan>) -> HashMap<String, RowSelection> {
    let Some(scan) = node
        .downcast_ref::<DataSourceExec>()
        .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
    else {
        return HashMap::new();
    };
    scan.file_groups
        .iter()
        .flat_map(|group| group.iter())
        .filter_map(|file| {
            let selection = file.extension::<ParquetRowSelection>()?;
            Some((
                file.object_meta.location.to_string(),
                selection.selection().clone(),
            ))
        })
        .collect()
}

impl DisplayAs for DeletionVectorsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "DeletionVectorsExec: files={}", self.selections.len())
    }
}

impl ExecutionPlan for DeletionVectorsExec {
    fn name(&self) -> &str {
        "DeletionVectorsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn cardinality_effect(&self) -> datafusion::physical_plan::execution_plan::CardinalityEffect {
        datafusion::physical_plan::execution_plan::CardinalityEffect::Equal
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self {
            input: crate::analyze::only_child(children, self.name())?,
            selections: Arc::clone(&self.selections),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }

    fn child_stats_requests(
        &self,
        partition: Option<usize>,
    ) -> Vec<datafusion::physical_plan::statistics::ChildStats> {
        vec![datafusion::physical_plan::statistics::ChildStats::At(
            partition,
        )]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &datafusion::physical_plan::statistics::StatisticsArgs,
    ) -> DfResult<Arc<Statistics>> {
        Ok(Arc::clone(&input_stats[0]))
    }
}

/// `input` (a decoded scan) with `selections` put back onto its files.
fn reattach(
    input: &Arc<dyn ExecutionPlan>,
    selections: &HashMap<String, RowSelection>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let Some(scan) = input
        .downcast_ref::<DataSourceExec>()
        .and_then(|s| s.data_source().downcast_ref::<FileScanConfig>())
    else {
        return Ok(Arc::clone(input));
    };
    let mut scan = scan.clone();
    scan.file_groups = std::mem::take(&mut scan.file_groups)
        .into_iter()
        .map(|group| {
            let statistics = group.file_statistics(None).cloned();
            let files = group
                .into_inner()
                .into_iter()
                .map(|mut file| {
                    if let Some(selection) = selections.get(&file.object_meta.location.to_string())
                    {
                        file.extensions
                            .insert(ParquetRowSelection::new(selection.clone()));
                    }
                    file
                })
                .collect();
            let group = FileGroup::new(files);
            match statistics {
                Some(statistics) => group.with_statistics(Arc::new(statistics)),
                None => group,
            }
        })
        .collect();
    Ok(DataSourceExec::from_data_source(scan))
}

impl DeletionVectorsExec {
    /// `input` (the decoded scan) with the selections of `buf` (what
    /// [`Self::encode`] wrote: `[[rows, skip], …]` per file, in JSON).
    pub(crate) fn decode(buf: &[u8], input: &Arc<dyn ExecutionPlan>) -> DfResult<Self> {
        let encoded: HashMap<String, Vec<(usize, bool)>> = serde_json::from_slice(buf)
            .map_err(|e| DataFusionError::Internal(format!("DeletionVectorsExec: {e}")))?;
        let selections: HashMap<String, RowSelection> = encoded
            .into_iter()
            .map(|(file, runs)| {
                let selectors: Vec<RowSelector> = runs
                    .into_iter()
                    .map(|(rows, skip)| {
                        if skip {
                            RowSelector::skip(rows)
                        } else {
                            RowSelector::select(rows)
                        }
                    })
                    .collect();
                (file, RowSelection::from(selectors))
            })
            .collect();
        Ok(DeletionVectorsExec {
            input: reattach(input, &selections)?,
            selections: Arc::new(selections),
        })
    }

    /// The selections, for [`Self::decode`].
    pub(crate) fn encode(&self, buf: &mut Vec<u8>) -> DfResult<()> {
        let encoded: HashMap<&String, Vec<(usize, bool)>> = self
            .selections
            .iter()
            .map(|(file, selection)| {
                (
                    file,
                    selection.iter().map(|s| (s.row_count, s.skip)).collect(),
                )
            })
            .collect();
        serde_json::to_writer(buf, &encoded)
            .map_err(|e| DataFusionError::Internal(format!("DeletionVectorsExec: {e}")))
    }
}
