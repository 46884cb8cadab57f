//! DELETE, UPDATE and MERGE: DataFusion plans them, Cirro runs them.
//!
//! DataFusion turns each statement into a logical plan over the target table
//! (DELETE: a filter over the table; UPDATE: a projection of the new values;
//! MERGE: the source plan plus the ON condition and the WHEN clauses). Cirro
//! swaps the target's scan for one that also yields each row's id (data file
//! and position in it, see `cirro_storage::table::ROW_INDEX_COLUMN`), runs the
//! plan through DataFusion — subqueries, joins and expressions as in any query
//! — and hands the row ids and new rows to a `cirro_storage::mutate::Mutation`,
//! which commits them as deletion vectors and new files in one Delta commit.
//!
//! MERGE is planned as `source LEFT JOIN target` (FULL JOIN when there is a
//! `WHEN NOT MATCHED BY SOURCE` clause; INNER when only MATCHED clauses) with a
//! presence marker on each side, then one CASE picks the first WHEN clause that
//! applies to each joined row, so clauses are tried in order and the first
//! match wins.

use std::any::Any;
use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::compute::filter_record_batch;
use arrow::datatypes::Int32Type;
use cirro_common::{CirroError, Result, SqlState};
use cirro_storage::CirroTable;
use cirro_storage::mutate::{Change, Mutation};
use cirro_storage::table::{FILE_INDEX_COLUMN, ROW_INDEX_COLUMN};
use cirro_storage::write::write_files;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, TableReference};
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::dml::{MergeIntoAction, MergeIntoClause, MergeIntoClauseKind};
use datafusion::logical_expr::expr::Case;
use datafusion::logical_expr::{
    DmlStatement, Expr, JoinType, LogicalPlan, LogicalPlanBuilder, TableSource, WriteOp, cast, lit,
};
use deltalake::protocol::DeltaOperation;
use deltalake::protocol::SaveMode;
use futures::StreamExt;

use crate::Engine;

/// Marker column on the MERGE source side: true on every source row.
const SOURCE_MARKER: &str = "__cirro_source";
/// Index of the WHEN clause a MERGE row takes (NULL: none).
const ACTION_COLUMN: &str = "__cirro_action";

/// A row-changing statement, run but not committed.
pub(crate) struct Prepared {
    pub change: Change,
    /// Rows the statement affected (its tag's count).
    pub count: u64,
    pub operation: DeltaOperation,
}

/// The Cirro table a DML statement targets.
pub(crate) fn target_table(dml: &DmlStatement, tag: &str) -> Result<CirroTable> {
    if dml
        .table_name
        .table()
        .starts_with(cirro_catalog::PAST_VERSION_PREFIX)
    {
        return Err(CirroError::unsupported(format!(
            "{tag} cannot change a past version of a table"
        )));
    }
    let provider = source_as_provider(&dml.target)?;
    match (provider.as_ref() as &dyn Any).downcast_ref::<CirroTable>() {
        Some(table) => Ok(table.without_row_ids()),
        None => Err(CirroError::unsupported(format!(
            "{tag} is only supported on Cirro tables"
        ))),
    }
}

/// Run an INSERT, DELETE, UPDATE, MERGE or TRUNCATE statement on a Cirro
/// table: write its new files and return the change, uncommitted.
pub(crate) async fn prepare(engine: &Engine, dml: &DmlStatement, tag: &str) -> Result<Prepared> {
    let table = target_table(dml, tag)?;
    let state = engine.context().state();
    match &dml.op {
        WriteOp::Insert(op) => {
            let overwrite = match op {
                InsertOp::Append => false,
                InsertOp::Overwrite => true,
                InsertOp::Replace => {
                    return Err(CirroError::unsupported("REPLACE INTO is not supported"));
                }
            };
            let mut input = dml.input.as_ref().clone();
            let order = table.options().write_order();
            if !order.is_empty() {
                // New rows of a clustered or indexed table are written in key order.
                let keys = order
                    .iter()
                    .map(|k| {
                        Expr::Column(Column::from_name(&k.name)).sort(!k.descending, k.descending)
                    })
                    .collect::<Vec<_>>();
                input = LogicalPlanBuilder::from(input).sort(keys)?.build()?;
            }
            let frame = engine.context().execute_logical_plan(input).await?;
            let error = engine.input_error();
            let stream = crate::statement::query::rows_in_order(frame)
                .await?
                .map(move |b| b.map_err(&error));
            let (adds, count) = write_files(&table, stream).await?;
            let mode = if overwrite {
                SaveMode::Overwrite
            } else {
                SaveMode::Append
            };
            Ok(Prepared {
                change: Change::append(&table, adds, overwrite),
                count,
                operation: DeltaOperation::Write {
                    mode,
                    partition_by: None,
                    predicate: None,
                },
            })
        }
        WriteOp::Truncate => Ok(Prepared {
            change: Change::append(&table, Vec::new(), true),
            count: 0,
            operation: DeltaOperation::Write {
                mode: SaveMode::Overwrite,
                partition_by: None,
                predicate: None,
            },
        }),
        WriteOp::Delete | WriteOp::Update | WriteOp::MergeInto(_) => {
            let (plan, layout) = row_plan(dml, &table)?;
            let (change, count) = run(engine, &state, &table, plan, layout).await?;
            let operation = match &dml.op {
                WriteOp::Delete => DeltaOperation::Delete { predicate: None },
                WriteOp::Update => DeltaOperation::Update { predicate: None },
                WriteOp::MergeInto(merge) => DeltaOperation::Merge {
                    predicate: None,
                    merge_predicate: Some(format!("{}", merge.on)),
                    matched_predicates: vec![],
                    not_matched_predicates: vec![],
                    not_matched_by_source_predicates: vec![],
                },
                _ => return Err(CirroError::internal("not a row-changing statement")),
            };
            Ok(Prepared {
                change,
                count,
                operation,
            })
        }
        _ => Err(CirroError::unsupported(format!("{tag} is not supported"))),
    }
}

/// The query Cirro runs for a DELETE, UPDATE or MERGE on `table`: the
/// statement's plan over a scan with row ids, and how its rows are laid out.
fn row_plan(dml: &DmlStatement, table: &CirroTable) -> Result<(LogicalPlan, Layout)> {
    let with_ids = provider_as_source(Arc::new(table.with_row_ids()));
    match &dml.op {
        WriteOp::Delete => {
            let input = replace_target_scan(&dml.input, &dml.table_name, &with_ids)?;
            let plan = LogicalPlanBuilder::from(input)
                .project(vec![row_id(FILE_INDEX_COLUMN), row_id(ROW_INDEX_COLUMN)])?
                .build()?;
            Ok((plan, Layout::Delete))
        }
        WriteOp::Update => {
            let LogicalPlan::Projection(projection) = dml.input.as_ref() else {
                return Err(CirroError::internal("UPDATE plan without a projection"));
            };
            let input = replace_target_scan(&projection.input, &dml.table_name, &with_ids)?;
            let mut exprs = projection.expr.clone();
            exprs.push(row_id(FILE_INDEX_COLUMN));
            exprs.push(row_id(ROW_INDEX_COLUMN));
            let plan = LogicalPlanBuilder::from(input).project(exprs)?.build()?;
            let columns = table.table_schema().fields().len();
            Ok((plan, Layout::Update { columns }))
        }
        WriteOp::MergeInto(merge) => {
            let (plan, kinds) = merge_plan(
                table,
                &with_ids,
                &dml.table_name,
                &dml.input,
                &merge.on,
                &merge.clauses,
            )?;
            let columns = table.table_schema().fields().len();
            Ok((plan, Layout::Merge { columns, kinds }))
        }
        _ => Err(CirroError::internal("not a row-changing statement")),
    }
}

/// EXPLAIN of a DELETE, UPDATE or MERGE: the plan of the query that finds
/// the rows to change and computes their new values (what Cirro runs before
/// writing).
pub(crate) fn explain_plan(dml: &DmlStatement, verbose: bool, tag: &str) -> Result<LogicalPlan> {
    let table = target_table(dml, tag)?;
    let (plan, _) = row_plan(dml, &table)?;
    Ok(LogicalPlanBuilder::from(plan)
        .explain(verbose, false)?
        .build()?)
}

/// The tag of a statement that changes rows in place (DELETE, UPDATE, MERGE);
/// `None` for other writes.
pub(crate) fn row_change_tag(op: &WriteOp) -> Option<&'static str> {
    match op {
        WriteOp::Delete => Some("DELETE"),
        WriteOp::Update => Some("UPDATE"),
        WriteOp::MergeInto(_) => Some("MERGE"),
        _ => None,
    }
}

/// The command tag of a DML statement that affected `count` rows.
pub(crate) fn tag_of(tag: &str, count: u64) -> String {
    if tag == "TRUNCATE TABLE" {
        tag.to_string()
    } else {
        format!("{tag} {count}")
    }
}

fn row_id(name: &str) -> Expr {
    Expr::Column(Column::from_name(name))
}

/// Replace the scan of the DML target in `plan` (not in its subqueries) by a
/// scan of `with_ids`, which has the same columns plus the row ids, and
/// recompute the schemas above it.
pub(crate) fn replace_target_scan(
    plan: &LogicalPlan,
    target: &TableReference,
    with_ids: &Arc<dyn TableSource>,
) -> Result<LogicalPlan> {
    let mut replaced = false;
    let plan = plan
        .clone()
        .transform_up(|node| {
            if let LogicalPlan::TableScan(scan) = &node {
                if !replaced && scan.table_name.resolved_eq(target) {
                    replaced = true;
                    let scan = LogicalPlanBuilder::scan_with_filters(
                        scan.table_name.clone(),
                        Arc::clone(with_ids),
                        None,
                        scan.filters.clone(),
                    )?
                    .build()?;
                    return Ok(Transformed::yes(scan));
                }
                return Ok(Transformed::no(node));
            }
            if replaced {
                Ok(Transformed::yes(node.recompute_schema()?))
            } else {
                Ok(Transformed::no(node))
            }
        })?
        .data;
    if !replaced {
        return Err(CirroError::internal(format!(
            "the plan does not scan the target table {target}"
        )));
    }
    Ok(plan)
}

/// What a MERGE clause does with a joined row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClauseKind {
    Update,
    Delete,
    Insert,
}

/// How the rows of a DML plan are laid out.
enum Layout {
    /// `[file, row]`: delete these rows.
    Delete,
    /// `[columns…, file, row]`: replace these rows by the new values.
    Update { columns: usize },
    /// `[action, file, row, columns…]`: action indexes `kinds`.
    Merge {
        columns: usize,
        kinds: Vec<ClauseKind>,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    affected: u64,
}

/// Run `plan` and feed its rows into `mutation`.
async fn feed(
    engine: &Engine,
    plan: LogicalPlan,
    layout: &Layout,
    mutation: &mut Mutation,
) -> Result<Counts> {
    let frame = engine.context().execute_logical_plan(plan).await?;
    let mut stream = frame.execute_stream().await?;
    let mut counts = Counts::default();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        match layout {
            Layout::Delete => {
                counts.affected += mutation.delete_rows(batch.column(0), batch.column(1))?;
            }
            Layout::Update { columns } => {
                counts.affected +=
                    mutation.delete_rows(batch.column(*columns), batch.column(columns + 1))?;
                mutation
                    .insert(batch.project(&(0..*columns).collect::<Vec<_>>())?)
                    .await?;
            }
            Layout::Merge { columns, kinds } => {
                let actions = batch.column(0).as_primitive::<Int32Type>();
                let kind_of = |i: usize| -> Option<ClauseKind> {
                    actions
                        .is_valid(i)
                        .then(|| kinds.get(actions.value(i) as usize).copied())
                        .flatten()
                };
                let mask = |wanted: &[ClauseKind]| -> BooleanArray {
                    (0..batch.num_rows())
                        .map(|i| Some(kind_of(i).is_some_and(|k| wanted.contains(&k))))
                        .collect()
                };
                let removes =
                    filter_record_batch(&batch, &mask(&[ClauseKind::Update, ClauseKind::Delete]))?;
                mutation.delete_rows(removes.column(1), removes.column(2))?;
                let inserts =
                    filter_record_batch(&batch, &mask(&[ClauseKind::Update, ClauseKind::Insert]))?;
                if inserts.num_rows() > 0 {
                    mutation
                        .insert(inserts.project(&(3..3 + columns).collect::<Vec<_>>())?)
                        .await?;
                }
                counts.affected += (0..batch.num_rows())
                    .filter(|&i| kind_of(i).is_some())
                    .count() as u64;
            }
        }
    }
    Ok(counts)
}

/// Run `plan`, feeding its rows into a new mutation of `table`, and write
/// the change. Returns it with the number of rows the statement affected.
async fn run(
    engine: &Engine,
    state: &dyn Session,
    table: &CirroTable,
    plan: LogicalPlan,
    layout: Layout,
) -> Result<(Change, u64)> {
    let mut mutation = Mutation::new(table)?;
    let counts = match feed(engine, plan, &layout, &mut mutation).await {
        Ok(counts) => counts,
        Err(e) => {
            mutation.abort().await;
            return Err(e);
        }
    };
    let change = mutation.prepare(state).await?;
    Ok((change, counts.affected))
}

/// The value a MERGE clause gives `field` (None: the clause deletes).
fn clause_value(
    clause: &MergeIntoClause,
    field: &arrow::datatypes::FieldRef,
    fields: &arrow::datatypes::Fields,
    target_column: &dyn Fn(&str) -> Expr,
) -> Result<Option<Expr>> {
    Ok(match &clause.action {
        MergeIntoAction::Update(assignments) => Some(
            assignments
                .iter()
                .find(|(column, _)| column == field.name())
                .map(|(_, value)| value.clone())
                .unwrap_or_else(|| target_column(field.name())),
        ),
        MergeIntoAction::Insert { columns, values } => {
            if columns.is_empty() {
                let position = fields.iter().position(|f| f.name() == field.name());
                if values.len() != fields.len() {
                    return Err(CirroError::new(
                        SqlState::SYNTAX_ERROR,
                        format!(
                            "INSERT has {} values but the table has {} columns",
                            values.len(),
                            fields.len()
                        ),
                    ));
                }
                position.map(|p| values[p].clone())
            } else {
                Some(
                    columns
                        .iter()
                        .position(|c| c == field.name())
                        .map(|p| values[p].clone())
                        .unwrap_or_else(|| lit(datafusion::common::ScalarValue::Null)),
                )
            }
        }
        MergeIntoAction::Delete => None,
    })
}

/// Build the MERGE plan: `[action, file, row, new values…]`, one row per
/// joined row that some WHEN clause applies to.
fn merge_plan(
    table: &CirroTable,
    with_ids: &Arc<dyn TableSource>,
    target: &TableReference,
    source: &LogicalPlan,
    on: &Expr,
    clauses: &[MergeIntoClause],
) -> Result<(LogicalPlan, Vec<ClauseKind>)> {
    let by_source = clauses
        .iter()
        .any(|c| c.kind.canonical() == MergeIntoClauseKind::NotMatchedBySource);
    let by_target = clauses.iter().any(|c| c.kind.is_not_matched_by_target());
    let join_type = match (by_target, by_source) {
        (_, true) => JoinType::Full,
        (true, false) => JoinType::Left,
        (false, false) => JoinType::Inner,
    };
    let mut source_exprs: Vec<Expr> = source
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    source_exprs.push(lit(true).alias(SOURCE_MARKER));
    let source = LogicalPlanBuilder::from(source.clone())
        .project(source_exprs)?
        .build()?;
    let target_scan =
        LogicalPlanBuilder::scan(target.clone(), Arc::clone(with_ids), None)?.build()?;
    let joined = LogicalPlanBuilder::from(source)
        .join_on(target_scan, join_type, vec![on.clone()])?
        .build()?;

    let target_present = row_id(ROW_INDEX_COLUMN).is_not_null();
    let source_present = row_id(SOURCE_MARKER).is_not_null();
    let mut when_then = Vec::new();
    let mut kinds = Vec::new();
    for (index, clause) in clauses.iter().enumerate() {
        let applies = match clause.kind.canonical() {
            MergeIntoClauseKind::Matched => target_present.clone().and(source_present.clone()),
            MergeIntoClauseKind::NotMatchedBySource => {
                target_present.clone().and(row_id(SOURCE_MARKER).is_null())
            }
            _ => source_present
                .clone()
                .and(row_id(ROW_INDEX_COLUMN).is_null()),
        };
        let applies = match &clause.predicate {
            Some(predicate) => applies.and(predicate.clone()),
            None => applies,
        };
        when_then.push((Box::new(applies), Box::new(lit(index as i32))));
        kinds.push(match &clause.action {
            MergeIntoAction::Update(_) => ClauseKind::Update,
            MergeIntoAction::Delete => ClauseKind::Delete,
            MergeIntoAction::Insert { .. } => ClauseKind::Insert,
        });
    }
    let action = Expr::Case(Case::new(None, when_then, None)).alias(ACTION_COLUMN);

    let fields = table.table_schema().fields();
    let target_column = |name: &str| Expr::Column(Column::new(Some(target.clone()), name));
    let mut exprs = vec![action, row_id(FILE_INDEX_COLUMN), row_id(ROW_INDEX_COLUMN)];
    for field in fields.iter() {
        let mut branches = Vec::new();
        for (index, clause) in clauses.iter().enumerate() {
            let value = clause_value(clause, field, fields, &target_column)?;
            if let Some(value) = value {
                branches.push((
                    Box::new(row_id(ACTION_COLUMN).eq(lit(index as i32))),
                    Box::new(cast(value, field.data_type().clone())),
                ));
            }
        }
        let value = if branches.is_empty() {
            cast(
                lit(datafusion::common::ScalarValue::Null),
                field.data_type().clone(),
            )
        } else {
            Expr::Case(Case::new(None, branches, None))
        };
        exprs.push(value.alias(field.name()));
    }
    // The action is computed once, below the projection that uses it.
    let mut with_action: Vec<Expr> = joined
        .schema()
        .columns()
        .into_iter()
        .map(Expr::Column)
        .collect();
    with_action.push(exprs[0].clone());
    exprs[0] = row_id(ACTION_COLUMN);
    let plan = LogicalPlanBuilder::from(joined)
        .project(with_action)?
        .filter(row_id(ACTION_COLUMN).is_not_null())?
        .project(exprs)?
        .build()?;
    Ok((plan, kinds))
}
