//! Statements over one row found by its primary key, and VALUES, computed
//! without DataFusion's optimizer and physical planner: planning a point
//! read took longer than reading the row (a prepared point read 1.9 ms,
//! `SELECT 1` 1.1 ms), where PostgreSQL answers in a tenth of a
//! millisecond.
//!
//! A plan qualifies where, after Cirro's analyzer (type coercion, checked
//! arithmetic, PostgreSQL's operators, guards: everything that decides a
//! value), it is
//! - `[Projection →] Filter → TableScan` of a table with a row store and a
//!   primary key, whose filter fixes every key column to a constant: the
//!   row comes from the transaction's pending changes, the row store at the
//!   statement's snapshot, or the table's files by key
//!   (`cirro_storage::cache::lookup`), and the filter and projection are
//!   evaluated on it;
//! - `[Projection →] Values` (an INSERT's rows).
//!
//! Expressions are simplified as the optimizer would (`now()` is the
//! statement's start), and guarded conditions made lazy as in a plan
//! (`cirro_exec::rules::lazy_guards`). Everything else, subqueries
//! included, takes the planner.
//!
//! A prepared point read, and a prepared small write by key (`point.rs`),
//! is analyzed and made physical once, at its first execution
//! ([`Compiled`]): its placeholders become columns of a one-row batch of
//! the bound values, so an execution binds no plan and runs no analyzer,
//! only the lookup and the expressions.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use cirro_common::{CirroError, Result};
use cirro_storage::CirroTable;
use cirro_storage::rowstore::RowStore;
use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::execution_props::ExecutionProps;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::utils::split_conjunction;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan, Operator};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

use crate::Engine;
use crate::statement::{Outcome, point};

/// Whether `plan` can be answered here, by its shape before analysis (a
/// cheap test before the analyzer runs).
fn may_qualify(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Projection(p) => may_qualify_below(&p.input),
        other => may_qualify_below(other),
    }
}

fn may_qualify_below(plan: &LogicalPlan) -> bool {
    match plan {
        LogicalPlan::Values(_) => true,
        LogicalPlan::Filter(f) => match f.input.as_ref() {
            LogicalPlan::TableScan(scan) => {
                scan.filters.is_empty()
                    && scan.fetch.is_none()
                    && table_of(&scan.source).is_some_and(|t| {
                        (t.as_ref() as &dyn std::any::Any)
                            .downcast_ref::<CirroTable>()
                            .is_some_and(|t| t.rows().is_some())
                    })
            }
            _ => false,
        },
        _ => false,
    }
}

/// `provider` as a Cirro table with a row store.
pub(crate) fn with_rows(
    provider: &Arc<dyn datafusion::catalog::TableProvider>,
) -> Option<&CirroTable> {
    (provider.as_ref() as &dyn std::any::Any)
        .downcast_ref::<CirroTable>()
        .filter(|t| t.rows().is_some())
}

fn table_of(
    source: &Arc<dyn datafusion::logical_expr::TableSource>,
) -> Option<Arc<dyn datafusion::catalog::TableProvider>> {
    source_as_provider(source)
        .ok()
        .filter(|p| (p.as_ref() as &dyn std::any::Any).is::<CirroTable>())
}

/// A query answered by key, as its rows; None where it takes the planner.
pub(crate) async fn select(engine: &Engine, plan: &LogicalPlan) -> Result<Option<Outcome>> {
    if !matches!(plan, LogicalPlan::Projection(_)) || !may_qualify(plan) {
        return Ok(None);
    }
    let Some(batch) = evaluate(engine, plan).await? else {
        return Ok(None);
    };
    let schema = batch.schema();
    let stream = RecordBatchStreamAdapter::new(schema, futures::stream::iter([Ok(batch)]));
    Ok(Some(Outcome::Rows(Box::pin(stream))))
}

/// The rows of `plan` (see the module docs), in its analyzed output
/// schema; None where it takes the planner.
pub(crate) async fn evaluate(engine: &Engine, plan: &LogicalPlan) -> Result<Option<RecordBatch>> {
    if !may_qualify(plan) {
        return Ok(None);
    }
    let (analyzed, props, config) = {
        let state = engine.context().state_ref();
        let state = state.read();
        let analyzed =
            state
                .analyzer()
                .execute_and_check(plan.clone(), state.config_options(), |_, _| {})?;
        let mut props = ExecutionProps::new();
        props.mark_start_execution(Arc::clone(state.config_options()));
        (analyzed, props, Arc::clone(state.config_options()))
    };
    let eval = Evaluator { props, config };
    let (projection, below) = match &analyzed {
        LogicalPlan::Projection(p) => (Some(p), p.input.as_ref()),
        other => (None, other),
    };
    if has_subquery(&analyzed) {
        return Ok(None);
    }
    let rows = match below {
        LogicalPlan::Values(values) => {
            let empty = DFSchema::empty();
            let batch = RecordBatch::try_new_with_options(
                Arc::new(Schema::empty()),
                vec![],
                &RecordBatchOptions::new().with_row_count(Some(1)),
            )?;
            let mut rows: Vec<RecordBatch> = Vec::with_capacity(values.values.len());
            let schema = relaxed(values.schema.as_arrow());
            for row in &values.values {
                let columns = row
                    .iter()
                    .map(|e| eval.column(e, &empty, &batch))
                    .collect::<Result<Vec<ArrayRef>>>()?;
                rows.push(RecordBatch::try_new(Arc::clone(&schema), columns)?);
            }
            arrow::compute::concat_batches(&schema, &rows)?
        }
        LogicalPlan::Filter(filter) => {
            let LogicalPlan::TableScan(scan) = filter.input.as_ref() else {
                return Ok(None);
            };
            let Some(provider) = table_of(&scan.source) else {
                return Ok(None);
            };
            let Some(table) = with_rows(&provider) else {
                return Ok(None);
            };
            let Some(reader) = table.rows() else {
                return Ok(None);
            };
            let Some(key) = fixed_key(&filter.predicate, &reader.store) else {
                return Ok(None);
            };
            let found = match row_by_key(engine, table, &key).await? {
                Some(row) => row,
                None => RecordBatch::new_empty(relaxed(reader.store.schema())),
            };
            // The scan's columns, as its schema lists them.
            let found = match &scan.projection {
                Some(indices) => found.project(indices)?,
                None => found,
            };
            let found = RecordBatch::try_new(
                relaxed(scan.projected_schema.as_arrow()),
                found.columns().to_vec(),
            )?;
            let keep = eval.column(&filter.predicate, filter.input.schema(), &found)?;
            let keep = arrow::array::AsArray::as_boolean_opt(&keep)
                .ok_or_else(|| CirroError::internal("a filter that is not boolean"))?;
            arrow::compute::filter_record_batch(&found, keep)?
        }
        _ => return Ok(None),
    };
    engine
        .counters
        .by_key
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Some(projection) = projection else {
        return Ok(Some(rows));
    };
    let columns = projection
        .expr
        .iter()
        .map(|e| eval.column(e, projection.input.schema(), &rows))
        .collect::<Result<Vec<ArrayRef>>>()?;
    let schema = relaxed(projection.schema.as_arrow());
    let options = RecordBatchOptions::new().with_row_count(Some(rows.num_rows()));
    Ok(Some(RecordBatch::try_new_with_options(
        schema, columns, &options,
    )?))
}

/// `schema` with every column nullable (NOT NULL is checked by the
/// writes, with PostgreSQL's message).
fn relaxed(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ))
}

fn has_subquery(plan: &LogicalPlan) -> bool {
    any_expr(plan, |e| {
        is_subquery(e) || matches!(e, Expr::Placeholder(_))
    })
}

fn is_subquery(e: &Expr) -> bool {
    matches!(
        e,
        Expr::ScalarSubquery(_)
            | Expr::Exists(_)
            | Expr::InSubquery(_)
            | Expr::OuterReferenceColumn(..)
    )
}

/// Whether an expression of `plan`'s nodes, or one inside it, is `found`.
fn any_expr(plan: &LogicalPlan, found: impl Fn(&Expr) -> bool) -> bool {
    let mut any = false;
    let _ = plan.apply(|node| {
        let _ = node.apply_expressions(|e| {
            let _ = e.apply(|e| {
                if found(e) {
                    any = true;
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            });
            Ok(if any {
                TreeNodeRecursion::Stop
            } else {
                TreeNodeRecursion::Continue
            })
        });
        Ok(if any {
            TreeNodeRecursion::Stop
        } else {
            TreeNodeRecursion::Continue
        })
    });
    any
}

/// Evaluates analyzed expressions on a few rows.
struct Evaluator {
    props: ExecutionProps,
    config: Arc<datafusion::config::ConfigOptions>,
}

impl Evaluator {
    fn physical(&self, expr: &Expr, schema: &DFSchema) -> Result<Arc<dyn PhysicalExpr>> {
        let context = SimplifyContext::builder()
            .with_schema(Arc::new(schema.clone()))
            .with_config_options(Arc::clone(&self.config))
            .with_query_execution_start_time(self.props.query_execution_start_time)
            .build();
        let simplified = ExprSimplifier::new(context).simplify(expr.clone())?;
        let physical = create_physical_expr(
            &simplified,
            schema,
            &self.props,
            &PhysicalPlanningContext::default(),
        )?;
        Ok(cirro_exec::rules::lazy_guards(physical)?)
    }

    /// `expr` over `batch` (whose columns `schema` names), as an array of
    /// its rows.
    fn column(&self, expr: &Expr, schema: &DFSchema, batch: &RecordBatch) -> Result<ArrayRef> {
        let physical = self.physical(expr, schema)?;
        Ok(physical.evaluate(batch)?.into_array(batch.num_rows())?)
    }
}

/// The constant each key column of `store` is fixed to by `predicate`'s
/// `key = constant` conjuncts, cast to the column's type: (column, value);
/// None if some key column is not fixed (or to NULL).
pub(crate) fn fixed_key(predicate: &Expr, store: &RowStore) -> Option<Vec<(usize, ScalarValue)>> {
    let schema = store.schema();
    let key = store.key_columns()?;
    let conjuncts = split_conjunction(predicate);
    let mut values = Vec::with_capacity(key.len());
    for &k in key {
        let field = schema.field(k);
        let found = conjuncts.iter().find_map(|c| {
            let Expr::BinaryExpr(b) = c else { return None };
            if b.op != Operator::Eq {
                return None;
            }
            let is_key = |e: &Expr| is_column(e, field.name(), field.data_type());
            let value = if is_key(&b.left) {
                constant(&b.right)
            } else if is_key(&b.right) {
                constant(&b.left)
            } else {
                None
            }?;
            lossless(&value, field.data_type())
        })?;
        if found.is_null() {
            return None;
        }
        values.push((k, found));
    }
    Some(values)
}

/// `value` as a key column of type `to`, if the cast keeps it (a lossy one,
/// `int_key = 1.5`, would fix the wrong key).
fn lossless(value: &ScalarValue, to: &DataType) -> Option<ScalarValue> {
    let cast = value.cast_to(to).ok()?;
    let back = cast.cast_to(&value.data_type()).ok()?;
    (back == *value).then_some(cast)
}

/// Whether `expr` is the column `name` (of type `data_type`), or a cast of
/// it that keeps values apart (widening an integer, changing a string's
/// encoding): `text_key::int = 5` holds for '05' too, so it fixes no key.
fn is_column(expr: &Expr, name: &str, data_type: &DataType) -> bool {
    match expr {
        Expr::Column(c) => c.name == name,
        Expr::Cast(c) => {
            let to = c.field.data_type();
            let keeps_apart = match (data_type, to) {
                (from, to) if from.is_integer() && to.is_integer() => {
                    let (wide, wider) = (from.primitive_width(), to.primitive_width());
                    match (from.is_signed_integer(), to.is_signed_integer()) {
                        (true, true) | (false, false) => wide <= wider,
                        (false, true) => wide < wider,
                        (true, false) => false,
                    }
                }
                (from, DataType::Decimal128(precision, scale)) if from.is_integer() => {
                    i16::from(*precision) - i16::from(*scale) >= integer_digits(from)
                }
                (
                    DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8,
                    DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8,
                ) => true,
                _ => false,
            };
            keeps_apart && is_column(&c.expr, name, data_type)
        }
        _ => false,
    }
}

/// Decimal digits an integer type's values can have.
fn integer_digits(data_type: &DataType) -> i16 {
    match data_type.primitive_width() {
        Some(1) => 3,
        Some(2) => 5,
        Some(4) => 10,
        _ => 20,
    }
}

fn constant(expr: &Expr) -> Option<ScalarValue> {
    match expr {
        Expr::Literal(v, _) => Some(v.clone()),
        Expr::Cast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
        Expr::TryCast(c) => constant(&c.expr)?.cast_to(c.field.data_type()).ok(),
        _ => None,
    }
}

/// The row with `key` as the statement sees it: the transaction's pending
/// change, else the row store's version at its snapshot, else the files'
/// live row; a one-row batch of the table's columns (NOT NULL relaxed), or
/// None.
pub(crate) async fn row_by_key(
    engine: &Engine,
    table: &CirroTable,
    key: &[(usize, ScalarValue)],
) -> Result<Option<RecordBatch>> {
    let reader = table
        .rows()
        .ok_or_else(|| CirroError::internal("a lookup by key without a row store"))?;
    let store = &reader.store;
    let arrays = key
        .iter()
        .map(|(_, v)| v.to_array())
        .collect::<datafusion::common::Result<Vec<ArrayRef>>>()?;
    let encoded = store
        .encode_keys(&arrays)?
        .pop()
        .ok_or_else(|| CirroError::internal("no key encoded"))?;
    let schema = relaxed(store.schema());
    if let Some(seen) = reader.lookup(&encoded, table.version()) {
        return Ok(match seen {
            Some(row) => Some(RecordBatch::try_new(schema, row.columns().to_vec())?),
            None => None,
        });
    }
    let runtime = engine.context().runtime_env();
    let found = cirro_storage::cache::lookup::find_row(
        table,
        &runtime,
        Some(engine.node().cache().as_ref()),
        key,
    )
    .await?;
    // Where the files hold the key: scans drop that row while the store
    // holds the key (`cirro_storage::rowstore::RowAt`).
    store.note(
        table.version(),
        encoded,
        found.as_ref().map(|f| f.at.clone()),
    );
    let Some(found) = found else {
        return Ok(None);
    };
    // The files' columns in the store's types (Utf8View strings, as scans).
    Ok(Some(cast_columns(found.row.columns(), schema)?))
}

/// `column` cast to `to`, failing where a value does not fit (22003, "integer
/// out of range", as PostgreSQL) rather than turning it into NULL as
/// Arrow's default cast does.
pub(crate) fn checked_cast(column: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    let options = arrow::compute::CastOptions {
        safe: false,
        ..Default::default()
    };
    Ok(arrow::compute::cast_with_options(column, to, &options)?)
}

/// `columns` cast to `schema`'s types, as a batch of it.
pub(crate) fn cast_columns(columns: &[ArrayRef], schema: SchemaRef) -> Result<RecordBatch> {
    let columns = columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(Arc::clone(c))
            } else {
                checked_cast(c, f.data_type())
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// A prepared statement by key, analyzed, simplified and made physical
/// once, with each placeholder a column of a one-row batch of the values
/// bound: a point read (`Projection → Filter → TableScan` by key, see the
/// module docs), or a small write (`point.rs`): an UPDATE or DELETE of the
/// row a key fixes, or an INSERT of one row of VALUES. An execution
/// evaluates the key from the values, looks the row up and evaluates the
/// filter and the output on it. Only where every function is immutable or
/// has one value per statement (`now()`: the statement's start, bound at
/// each execution as one more column); `random()` is each row's.
pub(crate) struct Compiled {
    /// The table read or changed.
    table: datafusion::common::TableReference,
    /// The table's columns when compiled (another schema: not used).
    table_schema: SchemaRef,
    /// What a write does with the rows (None: a query returns them).
    write: Option<point::Kind>,
    /// `$1…`, then a column for each of `fixed`.
    params: SchemaRef,
    /// Functions with one value per statement (`now()`), bound at each
    /// execution.
    fixed: Vec<Expr>,
    config: Arc<datafusion::config::ConfigOptions>,
    source: Source,
    output: Vec<Arc<dyn PhysicalExpr>>,
    output_schema: SchemaRef,
}

/// Where a compiled statement's rows come from.
enum Source {
    /// The row a key fixes, if the filter holds for it.
    Row {
        /// Each key column (in the row store) and what fixes it, over
        /// `params`.
        key: Vec<(usize, Arc<dyn PhysicalExpr>)>,
        /// The row store's key columns when compiled.
        key_columns: Vec<usize>,
        /// The scan's columns of the table.
        projection: Option<Vec<usize>>,
        /// The scan's columns, then the parameters: what the filter and
        /// the output read.
        joined: SchemaRef,
        /// The filter's conjuncts other than those that fix the key (None:
        /// none, the row found is the answer).
        filter: Option<Arc<dyn PhysicalExpr>>,
    },
    /// One row of VALUES, each over `params`.
    Values {
        row: Vec<Arc<dyn PhysicalExpr>>,
        /// The VALUES' columns, then the parameters: what the output reads.
        joined: SchemaRef,
    },
}

/// The name a placeholder's column takes in a compiled statement.
fn param_column(id: &str) -> datafusion::common::Column {
    datafusion::common::Column::new_unqualified(id)
}

/// Compile `plan`, a prepared query or small write whose placeholders
/// `$1…` have `types` (see [`Compiled`]); None where it does not qualify.
pub(crate) fn compile(
    engine: &Engine,
    plan: &LogicalPlan,
    types: &[Option<DataType>],
) -> Result<Option<Compiled>> {
    let (input, write) = match plan {
        LogicalPlan::Projection(_) => (plan, None),
        LogicalPlan::Dml(dml) => {
            let Ok(target) = crate::statement::dml::target_table(dml, "DML") else {
                return Ok(None);
            };
            let Some(reader) = target.rows() else {
                return Ok(None);
            };
            if !point::only_primary_key(&target) {
                return Ok(None);
            }
            let Some(kind) = point::kind_of(dml, &reader.store) else {
                return Ok(None);
            };
            (dml.input.as_ref(), Some((kind, dml)))
        }
        _ => return Ok(None),
    };
    if !may_qualify(input) {
        return Ok(None);
    }
    let Some(types) = types.iter().cloned().collect::<Option<Vec<DataType>>>() else {
        return Ok(None);
    };
    let (analyzed, props, config) = {
        let state = engine.context().state_ref();
        let state = state.read();
        let Ok(analyzed) =
            state
                .analyzer()
                .execute_and_check(input.clone(), state.config_options(), |_, _| {})
        else {
            return Ok(None);
        };
        // A copy of the session's options that the compiled form (and the
        // functions in its expressions) keep: holding the session's own
        // would make each later statement copy them all when it sets its
        // query id (`begin_query`: `Arc::make_mut` of a shared Arc).
        let config = Arc::new(state.config_options().as_ref().clone());
        let mut props = ExecutionProps::new();
        props.mark_start_execution(Arc::clone(&config));
        (analyzed, props, config)
    };
    let (projection, below) = match &analyzed {
        LogicalPlan::Projection(p) => (Some(p), p.input.as_ref()),
        other => (None, other),
    };
    if (write.is_none() && projection.is_none()) || any_expr(&analyzed, is_subquery) {
        return Ok(None);
    }
    // Placeholders and functions fixed per statement become columns.
    let mut columns = Columns {
        bound: types.len(),
        unknown: false,
        fixed: Vec::new(),
    };
    let (filter, values_row) = match below {
        LogicalPlan::Filter(filter) => (Some(columns.of(&filter.predicate)), None),
        LogicalPlan::Values(values) if values.values.len() == 1 => (
            None,
            Some(
                values.values[0]
                    .iter()
                    .map(|e| columns.of(e))
                    .collect::<Vec<_>>(),
            ),
        ),
        _ => return Ok(None),
    };
    let exprs: Option<Vec<Expr>> =
        projection.map(|p| p.expr.iter().map(|e| columns.of(e)).collect());
    if columns.unknown {
        return Ok(None);
    }
    let mut fields: Vec<arrow::datatypes::Field> = types
        .iter()
        .enumerate()
        .map(|(i, t)| arrow::datatypes::Field::new(format!("${}", i + 1), t.clone(), true))
        .collect();
    for (i, f) in columns.fixed.iter().enumerate() {
        let Ok(data_type) = f.get_type(&DFSchema::empty()) else {
            return Ok(None);
        };
        fields.push(arrow::datatypes::Field::new(
            fixed_column(i),
            data_type,
            true,
        ));
    }
    let params = Arc::new(Schema::new(fields));
    let params_df = DFSchema::try_from(params.as_ref().clone())?;
    let all: Vec<&Expr> = filter
        .iter()
        .chain(values_row.iter().flatten())
        .chain(exprs.iter().flatten())
        .collect();
    if !all.iter().all(|e| immutable(e)) {
        return Ok(None);
    }
    let eval = Evaluator { props, config };
    let known = |id: &str| params.field_with_name(id).is_ok();
    let (table, table_schema, source, joined, own) = match (filter, values_row) {
        (Some(predicate), None) => {
            let LogicalPlan::Filter(f) = below else {
                return Ok(None);
            };
            let LogicalPlan::TableScan(scan) = f.input.as_ref() else {
                return Ok(None);
            };
            if let Some((_, dml)) = write
                && !scan.table_name.resolved_eq(&dml.table_name)
            {
                return Ok(None);
            }
            let Some(provider) = table_of(&scan.source) else {
                return Ok(None);
            };
            let Some(reader) = with_rows(&provider).and_then(|t| t.rows()) else {
                return Ok(None);
            };
            let store = &reader.store;
            let Some(key_columns) = store.key_columns() else {
                return Ok(None);
            };
            let conjuncts = split_conjunction(&predicate);
            let mut key = Vec::with_capacity(key_columns.len());
            // The conjuncts that fix the key: the row found by the key
            // satisfies them (its key equals the values, see `find_row`).
            let mut fixing = vec![false; conjuncts.len()];
            for &k in key_columns {
                let field = store.schema().field(k);
                let value = conjuncts.iter().enumerate().find_map(|(i, c)| {
                    let Expr::BinaryExpr(b) = c else { return None };
                    if b.op != Operator::Eq {
                        return None;
                    }
                    let is_key = |e: &Expr| is_column(e, field.name(), field.data_type());
                    if is_key(&b.left) && of_params(&b.right, &known) {
                        Some((i, b.right.as_ref().clone()))
                    } else if is_key(&b.right) && of_params(&b.left, &known) {
                        Some((i, b.left.as_ref().clone()))
                    } else {
                        None
                    }
                });
                let Some((i, value)) = value else {
                    return Ok(None);
                };
                fixing[i] = true;
                key.push((k, eval.physical(&value, &params_df)?));
            }
            let Ok(joined) = scan.projected_schema.join(&params_df) else {
                return Ok(None);
            };
            let rest = conjuncts
                .iter()
                .zip(&fixing)
                .filter(|(_, fixes)| !**fixes)
                .map(|(c, _)| (*c).clone())
                .reduce(Expr::and);
            let filter = rest.map(|rest| eval.physical(&rest, &joined)).transpose()?;
            let source = Source::Row {
                key,
                key_columns: key_columns.to_vec(),
                projection: scan.projection.clone(),
                joined: relaxed(joined.as_arrow()),
                filter,
            };
            let table_schema = provider.schema();
            let own = scan.projected_schema.as_ref().clone();
            (scan.table_name.clone(), table_schema, source, joined, own)
        }
        (None, Some(row)) => {
            let (Some((point::Kind::Insert, dml)), LogicalPlan::Values(values)) = (write, below)
            else {
                return Ok(None);
            };
            let row = row
                .iter()
                .map(|e| eval.physical(e, &params_df))
                .collect::<Result<Vec<_>>>()?;
            // The VALUES' columns in the types of the values bound (the
            // plan's may be those the placeholders were planned with; the
            // projection above casts them to the table's).
            let fields = row
                .iter()
                .zip(values.schema.fields())
                .map(|(e, f)| {
                    Ok(arrow::datatypes::Field::new(
                        f.name(),
                        e.data_type(&params)?,
                        true,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let own = DFSchema::try_from(Schema::new(fields))?;
            let Ok(joined) = own.join(&params_df) else {
                return Ok(None);
            };
            let target = source_as_provider(&dml.target)?;
            let source = Source::Values {
                row,
                joined: relaxed(joined.as_arrow()),
            };
            (
                dml.table_name.clone(),
                datafusion::catalog::TableProvider::schema(target.as_ref()),
                source,
                joined,
                own,
            )
        }
        _ => return Ok(None),
    };
    let joined = Arc::new(joined);
    let (output, names): (Vec<Arc<dyn PhysicalExpr>>, &DFSchema) = match (&exprs, projection) {
        (Some(exprs), Some(projection)) => (
            exprs
                .iter()
                .map(|e| eval.physical(e, &joined))
                .collect::<Result<Vec<_>>>()?,
            projection.schema.as_ref(),
        ),
        // A DELETE's rows: the scan's columns as they are.
        _ => (
            (0..own.fields().len())
                .map(|i| {
                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                        own.field(i).name(),
                        i,
                    )) as Arc<dyn PhysicalExpr>
                })
                .collect(),
            &own,
        ),
    };
    // In the types the expressions give (the values bound may be of
    // narrower types than the plan's, see VALUES above).
    let output_schema = Arc::new(Schema::new(
        output
            .iter()
            .zip(names.fields())
            .map(|(e, f)| {
                Ok(arrow::datatypes::Field::new(
                    f.name(),
                    e.data_type(joined.as_arrow())?,
                    true,
                ))
            })
            .collect::<Result<Vec<_>>>()?,
    ));
    Ok(Some(Compiled {
        table,
        table_schema,
        write: write.map(|(kind, _)| kind),
        params,
        fixed: columns.fixed,
        config: Arc::clone(&eval.config),
        source,
        output,
        output_schema,
    }))
}

/// Turns a compiled statement's placeholders, and the functions with one
/// value per statement, into columns of its parameters' batch.
struct Columns {
    /// How many placeholders the statement has.
    bound: usize,
    /// Whether a placeholder was not one of them.
    unknown: bool,
    fixed: Vec<Expr>,
}

impl Columns {
    fn of(&mut self, expr: &Expr) -> Expr {
        use datafusion::common::tree_node::Transformed;
        expr.clone()
            .transform(|e| {
                Ok(match e {
                    Expr::Placeholder(p) => {
                        let known =
                            p.id.strip_prefix('$')
                                .and_then(|n| n.parse::<usize>().ok())
                                .is_some_and(|n| n >= 1 && n <= self.bound);
                        if !known {
                            self.unknown = true;
                        }
                        Transformed::yes(Expr::Column(param_column(&p.id)))
                    }
                    Expr::ScalarFunction(f)
                        if f.args.is_empty()
                            && f.func.signature().volatility
                                == datafusion::logical_expr::Volatility::Stable =>
                    {
                        let e = Expr::ScalarFunction(f);
                        let i = match self.fixed.iter().position(|x| *x == e) {
                            Some(i) => i,
                            None => {
                                self.fixed.push(e);
                                self.fixed.len() - 1
                            }
                        };
                        Transformed::yes(Expr::Column(param_column(&fixed_column(i))))
                    }
                    other => Transformed::no(other),
                })
            })
            .map(|t| t.data)
            .unwrap_or_else(|_| {
                self.unknown = true;
                expr.clone()
            })
    }
}

/// The column of the `i`th function fixed per statement.
fn fixed_column(i: usize) -> String {
    format!("$fixed{i}")
}

/// Whether `expr` reads nothing but parameters (and constants).
fn of_params(expr: &Expr, known: &impl Fn(&str) -> bool) -> bool {
    let mut only = true;
    let _ = expr.apply(|e| {
        if let Expr::Column(c) = e
            && (c.relation.is_some() || !known(&c.name))
        {
            only = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    only
}

/// Whether every function `expr` calls gives the same result for the same
/// arguments (so evaluating it once per execution, from expressions
/// simplified once, is right).
fn immutable(expr: &Expr) -> bool {
    let mut all = true;
    let _ = expr.apply(|e| {
        if let Expr::ScalarFunction(f) = e
            && f.func.signature().volatility != datafusion::logical_expr::Volatility::Immutable
        {
            all = false;
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    all
}

impl Compiled {
    /// The table it reads or changes.
    pub(crate) fn table(&self) -> &datafusion::common::TableReference {
        &self.table
    }

    /// Whether `table` is the one it was compiled for: the same columns,
    /// with a row store.
    pub(crate) fn fits(&self, table: &CirroTable) -> bool {
        let current = datafusion::catalog::TableProvider::schema(table);
        (Arc::ptr_eq(&current, &self.table_schema) || current == self.table_schema)
            && table.rows().is_some()
    }

    /// `values` (each of its parameter's type) and the values of the
    /// functions fixed per statement, as a one-row batch of the
    /// parameters; None where a value is of another type.
    fn bind(&self, values: &[ScalarValue]) -> Result<Option<RecordBatch>> {
        let bound = self.params.fields().len() - self.fixed.len();
        if values.len() != bound {
            return Ok(None);
        }
        let mut columns = Vec::with_capacity(self.params.fields().len());
        for (value, field) in values.iter().zip(self.params.fields()) {
            if &value.data_type() != field.data_type() {
                return Ok(None);
            }
            columns.push(value.to_array()?);
        }
        if !self.fixed.is_empty() {
            let mut props = ExecutionProps::new();
            props.mark_start_execution(Arc::clone(&self.config));
            let context = SimplifyContext::builder()
                .with_config_options(Arc::clone(&self.config))
                .with_query_execution_start_time(props.query_execution_start_time)
                .build();
            let simplifier = ExprSimplifier::new(context);
            for (f, field) in self.fixed.iter().zip(&self.params.fields()[bound..]) {
                let Expr::Literal(value, _) = simplifier.simplify(f.clone())? else {
                    return Ok(None);
                };
                if &value.data_type() != field.data_type() {
                    return Ok(None);
                }
                columns.push(value.to_array()?);
            }
        }
        Ok(Some(RecordBatch::try_new_with_options(
            Arc::clone(&self.params),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(1)),
        )?))
    }

    /// The key `params` fix, in the types of `store`'s key columns (none
    /// for VALUES); None where they fix none (a NULL, a value the key's
    /// type cannot hold, another key).
    pub(crate) fn key(
        &self,
        store: &RowStore,
        params: &RecordBatch,
    ) -> Result<Option<Vec<(usize, ScalarValue)>>> {
        let Source::Row {
            key, key_columns, ..
        } = &self.source
        else {
            return Ok(Some(Vec::new()));
        };
        if store.key_columns() != Some(key_columns.as_slice()) {
            return Ok(None);
        }
        let mut values = Vec::with_capacity(key.len());
        for (k, expr) in key {
            let value = expr.evaluate(params)?.into_array(1)?;
            let value = ScalarValue::try_from_array(&value, 0)?;
            let field = store.schema().field(*k);
            let Some(cast) = lossless(&value, field.data_type()).filter(|c| !c.is_null()) else {
                return Ok(None);
            };
            values.push((*k, cast));
        }
        Ok(Some(values))
    }

    /// The statement's rows over `table` (with its row store), for `key`
    /// and `params` ([`Compiled::key`], [`Compiled::bind`]): the output's
    /// columns.
    pub(crate) async fn rows(
        &self,
        engine: &Engine,
        table: &CirroTable,
        key: &[(usize, ScalarValue)],
        params: &RecordBatch,
    ) -> Result<RecordBatch> {
        let batch = match &self.source {
            Source::Row {
                projection,
                joined,
                filter,
                ..
            } => {
                let reader = table
                    .rows()
                    .ok_or_else(|| CirroError::internal("a lookup by key without a row store"))?;
                let found = match row_by_key(engine, table, key).await? {
                    Some(row) => row,
                    None => RecordBatch::new_empty(relaxed(reader.store.schema())),
                };
                let found = match projection {
                    Some(indices) => found.project(indices)?,
                    None => found,
                };
                let rows = found.num_rows();
                let mut columns = found.columns().to_vec();
                columns.extend(params.columns().iter().map(|c| c.slice(0, rows.min(1))));
                let batch = RecordBatch::try_new_with_options(
                    Arc::clone(joined),
                    columns,
                    &RecordBatchOptions::new().with_row_count(Some(rows)),
                )?;
                match filter {
                    Some(filter) => {
                        let keep = filter.evaluate(&batch)?.into_array(rows)?;
                        let keep = arrow::array::AsArray::as_boolean_opt(&keep)
                            .ok_or_else(|| CirroError::internal("a filter that is not boolean"))?;
                        arrow::compute::filter_record_batch(&batch, keep)?
                    }
                    None => batch,
                }
            }
            Source::Values { row, joined } => {
                let mut columns = row
                    .iter()
                    .map(|e| Ok(e.evaluate(params)?.into_array(1)?))
                    .collect::<Result<Vec<ArrayRef>>>()?;
                columns.extend(params.columns().iter().cloned());
                RecordBatch::try_new(Arc::clone(joined), columns)?
            }
        };
        let columns = self
            .output
            .iter()
            .map(|e| Ok(e.evaluate(&batch)?.into_array(batch.num_rows())?))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let out =
            RecordBatch::try_new_with_options(Arc::clone(&self.output_schema), columns, &options)?;
        engine
            .counters
            .by_key
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    }

    /// Run with `values` bound (each of its parameter's type): a query's
    /// rows or a write's outcome; None where the general path must (a key
    /// that does not fix a row's key, a table whose columns changed), and
    /// then nothing was done.
    pub(crate) async fn run(
        &self,
        engine: &Engine,
        values: &[ScalarValue],
    ) -> Result<Option<Outcome>> {
        let Some(params) = self.bind(values)? else {
            return Ok(None);
        };
        let outcome = match self.write {
            Some(kind) => point::run_compiled(engine, self, kind, &params).await?,
            None => self.read(engine, &params).await?,
        };
        if outcome.is_some() {
            engine
                .counters
                .compiled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(outcome)
    }

    async fn read(&self, engine: &Engine, params: &RecordBatch) -> Result<Option<Outcome>> {
        let (db, schema, name) = engine.resolve(&self.table);
        let provider = engine
            .context()
            .table_provider(datafusion::common::TableReference::full(db, schema, name))
            .await?;
        let Some(table) = with_rows(&provider) else {
            return Ok(None);
        };
        let Some(reader) = table.rows().filter(|_| self.fits(table)) else {
            return Ok(None);
        };
        let Some(key) = self.key(&reader.store, params)? else {
            return Ok(None);
        };
        let out = self.rows(engine, table, &key, params).await?;
        let stream = RecordBatchStreamAdapter::new(out.schema(), futures::stream::iter([Ok(out)]));
        Ok(Some(Outcome::Rows(Box::pin(stream))))
    }
}
