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
//! A prepared point read is analyzed and made physical once, at its first
//! execution ([`Compiled`]): its placeholders become columns of a one-row
//! batch of the bound values, so an execution binds no plan and runs no
//! analyzer, only the lookup and the expressions.

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
use datafusion::logical_expr::{Expr, LogicalPlan, Operator};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;

use crate::Engine;
use crate::statement::Outcome;

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
            let Some(table) =
                (provider.as_ref() as &dyn std::any::Any).downcast_ref::<CirroTable>()
            else {
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
    let Some(found) = found else {
        return Ok(None);
    };
    // The files' columns in the store's types (Utf8View strings, as scans).
    Ok(Some(cast_columns(found.columns(), schema)?))
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
                Ok(arrow::compute::cast(c, f.data_type())?)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// A prepared point read (`[Projection →] Filter → TableScan` by key, see
/// the module docs) analyzed, simplified and made physical once, with each
/// placeholder a column of a one-row batch of the values bound: an
/// execution evaluates the key from the values, looks the row up and
/// evaluates the filter and the output on it. Only where every function
/// is immutable (`now()` is the statement's, `random()` each row's).
pub(crate) struct Compiled {
    table: datafusion::common::TableReference,
    /// The table's columns when compiled (another schema: not used).
    table_schema: SchemaRef,
    /// Each key column (in the row store) and what fixes it, over `params`.
    key: Vec<(usize, Arc<dyn PhysicalExpr>)>,
    params: SchemaRef,
    /// The scan's columns of the table.
    projection: Option<Vec<usize>>,
    /// The scan's columns, then the parameters: what the filter and the
    /// output read.
    joined: SchemaRef,
    filter: Arc<dyn PhysicalExpr>,
    output: Vec<Arc<dyn PhysicalExpr>>,
    output_schema: SchemaRef,
}

/// The name a placeholder's column takes in a compiled statement.
fn param_column(id: &str) -> datafusion::common::Column {
    datafusion::common::Column::new_unqualified(id)
}

/// Compile `plan`, a prepared query whose placeholders `$1…` have `types`
/// (see [`Compiled`]); None where it does not qualify.
pub(crate) fn compile(
    engine: &Engine,
    plan: &LogicalPlan,
    types: &[Option<DataType>],
) -> Result<Option<Compiled>> {
    if !matches!(plan, LogicalPlan::Projection(_)) || !may_qualify(plan) {
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
                .execute_and_check(plan.clone(), state.config_options(), |_, _| {})
        else {
            return Ok(None);
        };
        let mut props = ExecutionProps::new();
        props.mark_start_execution(Arc::clone(state.config_options()));
        (analyzed, props, Arc::clone(state.config_options()))
    };
    let LogicalPlan::Projection(projection) = &analyzed else {
        return Ok(None);
    };
    let LogicalPlan::Filter(filter) = projection.input.as_ref() else {
        return Ok(None);
    };
    let LogicalPlan::TableScan(scan) = filter.input.as_ref() else {
        return Ok(None);
    };
    if any_expr(&analyzed, is_subquery) || !only_immutable(&analyzed) {
        return Ok(None);
    }
    let Some(provider) = table_of(&scan.source) else {
        return Ok(None);
    };
    let Some(table) = (provider.as_ref() as &dyn std::any::Any).downcast_ref::<CirroTable>() else {
        return Ok(None);
    };
    let Some(reader) = table.rows() else {
        return Ok(None);
    };
    let params = Arc::new(Schema::new(
        types
            .iter()
            .enumerate()
            .map(|(i, t)| arrow::datatypes::Field::new(format!("${}", i + 1), t.clone(), true))
            .collect::<Vec<_>>(),
    ));
    let params_df = DFSchema::try_from(params.as_ref().clone())?;
    let Ok(joined) = scan.projected_schema.join(&params_df) else {
        return Ok(None);
    };
    let known = |id: &str| params.field_with_name(id).is_ok();
    let mut unknown = false;
    let mut to_columns = |e: &Expr| -> Expr {
        e.clone()
            .transform(|e| {
                Ok(match e {
                    Expr::Placeholder(p) => {
                        if !known(&p.id) {
                            unknown = true;
                        }
                        datafusion::common::tree_node::Transformed::yes(Expr::Column(param_column(
                            &p.id,
                        )))
                    }
                    other => datafusion::common::tree_node::Transformed::no(other),
                })
            })
            .map(|t| t.data)
            .unwrap_or_else(|_| e.clone())
    };
    let predicate = to_columns(&filter.predicate);
    let exprs: Vec<Expr> = projection.expr.iter().map(&mut to_columns).collect();
    if unknown {
        return Ok(None);
    }
    let eval = Evaluator { props, config };
    let store = &reader.store;
    let Some(key_columns) = store.key_columns() else {
        return Ok(None);
    };
    let conjuncts = split_conjunction(&predicate);
    let mut key = Vec::with_capacity(key_columns.len());
    for &k in key_columns {
        let field = store.schema().field(k);
        let value = conjuncts.iter().find_map(|c| {
            let Expr::BinaryExpr(b) = c else { return None };
            if b.op != Operator::Eq {
                return None;
            }
            let is_key = |e: &Expr| is_column(e, field.name(), field.data_type());
            if is_key(&b.left) && of_params(&b.right, &known) {
                Some(b.right.as_ref().clone())
            } else if is_key(&b.right) && of_params(&b.left, &known) {
                Some(b.left.as_ref().clone())
            } else {
                None
            }
        });
        let Some(value) = value else {
            return Ok(None);
        };
        key.push((k, eval.physical(&value, &params_df)?));
    }
    let joined = Arc::new(joined);
    let filter = eval.physical(&predicate, &joined)?;
    let output = exprs
        .iter()
        .map(|e| eval.physical(e, &joined))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(Compiled {
        table: scan.table_name.clone(),
        table_schema: datafusion::catalog::TableProvider::schema(table),
        key,
        params,
        projection: scan.projection.clone(),
        joined: relaxed(joined.as_arrow()),
        filter,
        output,
        output_schema: relaxed(projection.schema.as_arrow()),
    }))
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

/// Whether every function `plan`'s expressions call gives the same result
/// for the same arguments (so evaluating it once per execution, from
/// expressions simplified once, is right).
fn only_immutable(plan: &LogicalPlan) -> bool {
    !any_expr(plan, |e| {
        matches!(e, Expr::ScalarFunction(f)
            if f.func.signature().volatility != datafusion::logical_expr::Volatility::Immutable)
    })
}

impl Compiled {
    /// Run with `values` bound (each of its parameter's type): its rows,
    /// or None where the general path must (a key that does not fix a
    /// row's key, a table whose columns changed).
    pub(crate) async fn run(
        &self,
        engine: &Engine,
        values: &[ScalarValue],
    ) -> Result<Option<Outcome>> {
        if values.len() != self.params.fields().len() {
            return Ok(None);
        }
        let mut columns = Vec::with_capacity(values.len());
        for (value, field) in values.iter().zip(self.params.fields()) {
            if &value.data_type() != field.data_type() {
                return Ok(None);
            }
            columns.push(value.to_array()?);
        }
        let params = RecordBatch::try_new_with_options(
            Arc::clone(&self.params),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(1)),
        )?;
        let (db, schema, name) = engine.resolve(&self.table);
        let provider = engine
            .context()
            .table_provider(datafusion::common::TableReference::full(db, schema, name))
            .await?;
        let Some(table) = (provider.as_ref() as &dyn std::any::Any).downcast_ref::<CirroTable>()
        else {
            return Ok(None);
        };
        let current = datafusion::catalog::TableProvider::schema(table);
        if !Arc::ptr_eq(&current, &self.table_schema) && current != self.table_schema {
            return Ok(None);
        }
        let Some(reader) = table.rows() else {
            return Ok(None);
        };
        let mut key = Vec::with_capacity(self.key.len());
        for (k, expr) in &self.key {
            let value = expr.evaluate(&params)?.into_array(1)?;
            let value = ScalarValue::try_from_array(&value, 0)?;
            let field = reader.store.schema().field(*k);
            let Some(cast) = lossless(&value, field.data_type()).filter(|c| !c.is_null()) else {
                return Ok(None);
            };
            key.push((*k, cast));
        }
        let found = match row_by_key(engine, table, &key).await? {
            Some(row) => row,
            None => RecordBatch::new_empty(relaxed(reader.store.schema())),
        };
        let found = match &self.projection {
            Some(indices) => found.project(indices)?,
            None => found,
        };
        let rows = found.num_rows();
        let mut columns = found.columns().to_vec();
        columns.extend(params.columns().iter().map(|c| c.slice(0, rows.min(1))));
        let batch = RecordBatch::try_new_with_options(
            Arc::clone(&self.joined),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        let keep = self.filter.evaluate(&batch)?.into_array(rows)?;
        let keep = arrow::array::AsArray::as_boolean_opt(&keep)
            .ok_or_else(|| CirroError::internal("a filter that is not boolean"))?;
        let batch = arrow::compute::filter_record_batch(&batch, keep)?;
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
        let stream = RecordBatchStreamAdapter::new(out.schema(), futures::stream::iter([Ok(out)]));
        Ok(Some(Outcome::Rows(Box::pin(stream))))
    }
}
