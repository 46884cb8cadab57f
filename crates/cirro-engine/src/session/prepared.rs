//! Prepared statements with typed parameters: planned once, executed many
//! times with different values (the PostgreSQL extended protocol's
//! Parse/Bind/Execute, Flight SQL's prepared statements).
//!
//! ```text
//!  prepare(parsed)   AS OF resolved, SQL → logical plan with placeholders ($1 …),
//!                    their types inferred from where they stand (k = $1: k's type)
//!  execute(values)   catalog version unchanged?  yes: reuse the plan
//!                                               no:  plan the statement again
//!                    each Cirro table scan gets the table's current snapshot
//!                    values cast to the placeholders' types (PostgreSQL's
//!                    implicit casts: an int4 for a BIGINT, text for a date)
//!                    plan.with_param_values(values) → privileges → run
//! ```
//!
//! Values go into the plan as literals (DataFusion's parameter values), never
//! into SQL text. A plan holds the table snapshots it was planned with, so
//! every execution swaps each scan's table for the current one (a cheap
//! rewrite; a transaction's pinned view where one is open). A DROP/CREATE of
//! a table, a new view or a GRANT changes the catalog version, and the
//! statement is planned again. Plans that read views are planned at every
//! execution (a view's plan holds its own snapshots).
//!
//! SQL's `PREPARE name AS statement`, `EXECUTE name (values)` and
//! `DEALLOCATE name` use the same prepared statements, kept by the session.
//!
//! Statements Cirro runs itself (SET, COPY, transactions, …) and DDL keep no
//! plan: executing them runs them as [`Engine::run`] does, and a `$n` in them
//! is refused (42P02).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow::datatypes::{DataType, Field, SchemaRef};
use cirro_catalog::PAST_VERSION_PREFIX;
use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::{Parsed, Statement as CirroStatement};
use cirro_storage::CirroTable;
use datafusion::catalog::TableProvider;
use datafusion::catalog::default_table_source::{provider_as_source, source_as_provider};
use datafusion::common::TableReference;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::logical_expr::expr::{InList, Placeholder};
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, TableType};
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, Parens, Query, SetExpr, Statement as SqlStatement, Values,
};

use crate::session::txn;
use crate::statement::no_parameter;
use crate::{Engine, Outcome};

/// A statement prepared for execution with parameters.
pub struct Prepared {
    statement: CirroStatement,
    /// The type each placeholder `$1 … $n` takes where it stands (None:
    /// anything goes, as in `SELECT $1`).
    placeholder_types: Vec<Option<DataType>>,
    /// The types the client declared (Parse's parameter types, `PREPARE
    /// name (types)`), which win over inferred ones.
    declared: Vec<Option<DataType>>,
    /// The columns of the rows it returns (None: a command).
    schema: Option<SchemaRef>,
    /// The `$n` of a `PREPARE p AS …` statement (its inner statement's).
    inner_placeholders: usize,
    /// The plan, for statements that keep one.
    plan: Option<Mutex<CachedPlan>>,
    /// Whether its executions wait for admission (found at the first).
    admission: std::sync::OnceLock<bool>,
}

struct CachedPlan {
    plan: LogicalPlan,
    /// The catalog version it was planned against.
    catalog_version: u64,
    /// Whether it reads a view or a system table, or shows settings or the
    /// catalog (then it is planned at every execution: such plans hold
    /// their data).
    replans: bool,
    /// The plan as a point read by key, compiled at its first execution
    /// (None: not tried yet; Some(None): it does not qualify).
    compiled: Option<Option<Arc<crate::statement::by_key::Compiled>>>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("placeholder_types", &self.placeholder_types)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// The type of each placeholder where it could be inferred.
    pub fn placeholder_types(&self) -> &[Option<DataType>] {
        &self.placeholder_types
    }

    /// The columns of the rows it returns (None: a command).
    pub fn schema(&self) -> Option<&SchemaRef> {
        self.schema.as_ref()
    }

    pub fn statement(&self) -> &CirroStatement {
        &self.statement
    }
}

/// The columns of the rows a statement that keeps no plan returns (it is
/// run at each execution).
fn unplanned_schema(statement: &CirroStatement) -> Option<SchemaRef> {
    match statement {
        CirroStatement::Setting(setting) => crate::session::settings::setting_schema(setting),
        CirroStatement::Maintenance(m) => Some(crate::statement::history::result_schema(m)),
        CirroStatement::Describe(_) => Some(crate::statement::describe::describe_schema()),
        CirroStatement::ShowCreateTable(_) => {
            Some(crate::statement::describe::show_create_schema())
        }
        _ => None,
    }
}

/// Whether a provider is a view (its plan is inlined when optimized).
fn is_view(provider: &Arc<dyn TableProvider>) -> bool {
    provider.table_type() == TableType::View
}

/// Whether a provider holds rows taken when it was resolved: the system
/// tables (`cirro.cache`, `pg_stat_activity`, `cirro.queries`, …) are
/// memory tables filled at planning, so a kept plan would show them as
/// they were when it was made.
fn is_snapshot(provider: &Arc<dyn TableProvider>) -> bool {
    (provider.as_ref() as &dyn std::any::Any).is::<datafusion::datasource::MemTable>()
}

/// `plan` (as planned, before type coercion) with each placeholder whose
/// type the client declared taking that type: the analyzer then coerces
/// around it as PostgreSQL does around a typed parameter (`k < $1` with a
/// float8 `$1` compares as floats). Undeclared ones (a client's `unknown`,
/// as psycopg sends a `str`) that planning left without a type are typed
/// where PostgreSQL's resolution types them: cast to text they are text
/// (`CAST($1 AS TEXT)`, what `$1 || x` is shaped into, see
/// `cirro_sql::shape`), two compared with one another are text (`$1 = $2`;
/// binding failed without a type), and in an IN list they take the type of
/// the list's first literal, else text.
fn declare_placeholders(plan: LogicalPlan, declared: &[Option<DataType>]) -> Result<LogicalPlan> {
    let declared_type = |id: &str| {
        let index = id.strip_prefix('$')?.parse::<usize>().ok()?;
        declared.get(index.checked_sub(1)?)?.clone()
    };
    // A placeholder the client sent no type for and planning left without.
    let untyped = |e: &Expr| {
        matches!(e, Expr::Placeholder(p) if declared_type(&p.id).is_none()
            && p.field.as_ref().is_none_or(|f| f.data_type().is_null()))
    };
    // A cast to text of such a placeholder (a cast to another type keeps
    // the text it converts from: `CAST($1 AS INT)` of ' 7 ' is 7).
    let to_text = |c: &datafusion::logical_expr::expr::Cast| {
        untyped(&c.expr)
            && matches!(
                c.field.data_type(),
                DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8
            )
    };
    let resolved_binary =
        |b: &BinaryExpr| b.op.supports_propagation() && untyped(&b.left) && untyped(&b.right);
    let resolved_list = |l: &InList| untyped(&l.expr) || l.list.iter().any(untyped);
    let resolved = |e: &Expr| match e {
        Expr::BinaryExpr(b) => resolved_binary(b),
        Expr::InList(l) => resolved_list(l),
        Expr::Cast(c) => to_text(c),
        _ => false,
    };
    if declared.iter().all(Option::is_none) && !any_expression(&plan, &resolved)? {
        return Ok(plan);
    }
    let typed = |mut p: Placeholder, t: &DataType| {
        if p.field.as_ref().map(|f| f.data_type()) == Some(t) {
            return Transformed::no(Expr::Placeholder(p));
        }
        p.field = Some(Arc::new(Field::new(p.id.clone(), t.clone(), true)));
        Transformed::yes(Expr::Placeholder(p))
    };
    // `e` with the type `t` if it is a placeholder `which` picks.
    let retype = |e: Expr, which: &dyn Fn(&Expr) -> bool, t: &DataType| {
        if !which(&e) {
            return Transformed::no(e);
        }
        match e {
            Expr::Placeholder(p) => typed(p, t),
            other => Transformed::no(other),
        }
    };
    let plan = plan.transform_up_with_subqueries(|node| {
        let node = node.map_expressions(|expr| {
            expr.transform_up(|e| match e {
                Expr::Placeholder(p) => match declared_type(&p.id) {
                    Some(t) => Ok(typed(p, &t)),
                    None => Ok(Transformed::no(Expr::Placeholder(p))),
                },
                Expr::BinaryExpr(b) if resolved_binary(&b) => {
                    let BinaryExpr { left, op, right } = b;
                    let (l, r) = (
                        retype(*left, &untyped, &DataType::Utf8),
                        retype(*right, &untyped, &DataType::Utf8),
                    );
                    Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                        Box::new(l.data),
                        op,
                        Box::new(r.data),
                    ))))
                }
                Expr::Cast(mut cast) if to_text(&cast) => {
                    let target = cast.field.data_type().clone();
                    cast.expr = Box::new(retype(*cast.expr, &untyped, &target).data);
                    Ok(Transformed::yes(Expr::Cast(cast)))
                }
                Expr::InList(mut list) if resolved_list(&list) => {
                    let context = std::iter::once(list.expr.as_ref())
                        .chain(list.list.iter())
                        .find_map(|e| match e {
                            Expr::Literal(v, _) if !v.is_null() => Some(v.data_type()),
                            _ => None,
                        })
                        .unwrap_or(DataType::Utf8);
                    list.expr = Box::new(retype(*list.expr, &untyped, &context).data);
                    list.list = list
                        .list
                        .into_iter()
                        .map(|e| retype(e, &untyped, &context).data)
                        .collect();
                    Ok(Transformed::yes(Expr::InList(list)))
                }
                other => Ok(Transformed::no(other)),
            })
        })?;
        // A node above a changed one gets its input's new types too.
        node.map_data(|n| n.recompute_schema())
    })?;
    Ok(plan.data)
}

/// Whether an expression of `plan` (or of its subqueries) has a part that
/// `found` picks.
fn any_expression(plan: &LogicalPlan, found: &dyn Fn(&Expr) -> bool) -> Result<bool> {
    let mut any = false;
    plan.apply_with_subqueries(|node| {
        for e in node.expressions() {
            if e.exists(|part| Ok(found(part)))? {
                any = true;
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(any)
}

/// The type a front end declares for a NUMERIC parameter whose scale comes
/// with each value (`NUMERIC_AT_BIND`, Decimal128(0, 0), a marker no real
/// decimal has): planned as [`NUMERIC_PLANNED`] at Parse (so the client is
/// told NUMERIC), and planned again for each execution's value.
pub const NUMERIC_AT_BIND: DataType = DataType::Decimal128(0, 0);

/// What a NUMERIC parameter is planned as before its value is known.
const NUMERIC_PLANNED: DataType = DataType::Decimal128(38, 10);

fn is_numeric_at_bind(declared: &Option<DataType>) -> bool {
    declared.as_ref() == Some(&NUMERIC_AT_BIND)
}

/// A bound NUMERIC as a valid Arrow decimal: a client's `0.06` arrives as
/// DECIMAL(1,2) (digits counted without the leading zeros), which Arrow
/// cannot hold; it becomes DECIMAL(38,2), the same value.
fn valid_decimal(value: ScalarValue) -> ScalarValue {
    match value {
        ScalarValue::Decimal128(v, p, s) if s >= 0 && (p < s as u8 || p == 0) => {
            ScalarValue::Decimal128(v, arrow::datatypes::DECIMAL128_MAX_PRECISION, s)
        }
        other => other,
    }
}

/// `value` as a value of `to`, cast as PostgreSQL casts a parameter to the
/// type of the place it stands in: text parses (22P02 when it cannot), a
/// number widens or must fit (22003), a fraction rounds to an integer
/// (floats to the nearest even, NUMERIC half away from zero) and a NUMERIC
/// to a smaller scale.
pub(crate) fn cast_parameter(
    value: ScalarValue,
    to: &DataType,
    index: usize,
) -> Result<ScalarValue> {
    let value = valid_decimal(value);
    if &value.data_type() == to {
        return Ok(value);
    }
    let from = value.data_type();
    let value = if to.is_integer() {
        cirro_exec::functions::numeric::round_scalar_to_integer(value)
    } else {
        value
    };
    value.cast_to(to).map_err(|e| {
        let state = if matches!(
            from,
            DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8
        ) {
            SqlState::INVALID_TEXT_REPRESENTATION
        } else if from.is_numeric() && to.is_numeric() {
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE
        } else {
            SqlState::DATATYPE_MISMATCH
        };
        let message = match state {
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE => format!(
                "parameter ${index}: {} out of range",
                cirro_storage::schema::sql_type_name(to).to_lowercase()
            ),
            _ => format!(
                "parameter ${index} ({}) cannot be used as {}: {e}",
                cirro_storage::schema::sql_type_name(&from).to_lowercase(),
                cirro_storage::schema::sql_type_name(to).to_lowercase()
            ),
        };
        CirroError::new(state, message)
    })
}

impl Engine {
    /// Prepare a statement: plan it once (see the module docs). Errors in
    /// the statement (syntax, missing tables, privileges) are reported here,
    /// as PostgreSQL reports them at Parse.
    pub fn prepare(&self, parsed: Parsed) -> futures::future::BoxFuture<'_, Result<Prepared>> {
        self.prepare_typed(parsed, Vec::new())
    }

    /// [`Engine::prepare`] with the types the client declared for `$1 …`
    /// (None where it left one to be inferred), as PostgreSQL's Parse takes
    /// them: a declared type is the parameter's type, and the statement is
    /// planned around it (`$1 * 2` with a float8 `$1` is a float).
    pub fn prepare_typed(
        &self,
        parsed: Parsed,
        declared: Vec<Option<DataType>>,
    ) -> futures::future::BoxFuture<'_, Result<Prepared>> {
        Box::pin(async move {
            let result = self.prepare_inner(parsed, declared).await;
            self.session.end_statement();
            if result.is_err() {
                self.fail_transaction();
            }
            result
        })
    }

    async fn prepare_inner(
        &self,
        parsed: Parsed,
        declared: Vec<Option<DataType>>,
    ) -> Result<Prepared> {
        if self.transaction_aborted() && !parsed.statement.ends_transaction() {
            return Err(txn::aborted());
        }
        self.catalog.refresh().await?;
        self.session.start_statement(&self.catalog);
        // The session's view: a transaction's DDL makes a version of its own.
        let snapshot = self.snapshot();
        let Parsed {
            statement,
            placeholders,
            ..
        } = parsed;
        // `PREPARE p AS … $1 …` binds nothing itself: its `$n` are the inner
        // statement's.
        let own_placeholders = match statement {
            CirroStatement::Prepare { .. } => 0,
            _ => placeholders,
        };
        let unplanned = |schema| Prepared {
            statement: statement.clone(),
            placeholder_types: vec![None; own_placeholders],
            declared: Vec::new(),
            schema,
            inner_placeholders: placeholders - own_placeholders,
            plan: None,
            admission: std::sync::OnceLock::new(),
        };
        if let CirroStatement::Execute { name, .. } = &statement {
            // `EXECUTE name (…)` returns what the named statement returns.
            let schema = self.sql_prepared(name)?.schema.clone();
            return Ok(unplanned(schema));
        }
        let returns_rows = statement.returns_rows();
        if !statement.keeps_plan() {
            if own_placeholders > 0 {
                return Err(no_parameter(1));
            }
            let schema = returns_rows.then(|| unplanned_schema(&statement)).flatten();
            return Ok(unplanned(schema));
        }
        // plan_prepared plans a NUMERIC bound at Bind as NUMERIC_PLANNED.
        let (plan, replans) = self.plan_prepared(&statement, &declared).await?;
        let types = plan.get_parameter_types()?;
        let placeholder_types = (1..=placeholders)
            .map(|i| types.get(&format!("${i}")).cloned().flatten())
            .collect();
        let schema = returns_rows.then(|| self.output_schema(&plan));
        Ok(Prepared {
            statement,
            placeholder_types,
            declared,
            schema,
            inner_placeholders: 0,
            plan: Some(Mutex::new(CachedPlan {
                plan,
                catalog_version: snapshot.version,
                replans,
                compiled: None,
            })),
            admission: std::sync::OnceLock::new(),
        })
    }

    /// The columns `plan` returns once analyzed: Cirro's analyzer rules change
    /// types (`sum` of a BIGINT is NUMERIC), and a client must be told the
    /// types the rows will have. (The plan as planned, if it cannot be
    /// analyzed before its parameters are known.)
    fn output_schema(&self, plan: &LogicalPlan) -> arrow::datatypes::SchemaRef {
        let state = self.ctx.state();
        let analyzed =
            state
                .analyzer()
                .execute_and_check(plan.clone(), state.config_options(), |_, _| {});
        let schema = match &analyzed {
            Ok(analyzed) => analyzed.schema(),
            Err(_) => plan.schema(),
        };
        Arc::new(schema.as_arrow().clone())
    }

    /// Plan a statement that keeps its plan; says whether it must be
    /// planned again for each execution (it reads views or system tables).
    async fn plan_prepared(
        &self,
        statement: &CirroStatement,
        declared: &[Option<DataType>],
    ) -> Result<(LogicalPlan, bool)> {
        let Some(mut sql) = statement.to_datafusion() else {
            return Err(CirroError::internal("only SQL statements keep a plan"));
        };
        crate::statement::time_travel::resolve_time_travel(self, &mut sql).await?;
        let shows = statement.shows_data();
        let declared: Vec<Option<DataType>> = declared
            .iter()
            .map(|d| {
                if is_numeric_at_bind(d) {
                    Some(NUMERIC_PLANNED)
                } else {
                    d.clone()
                }
            })
            .collect();
        let plan = declare_placeholders(self.plan(sql).await?, &declared)?;
        self.check_plan(&plan)?;
        let mut replans = shows;
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::TableScan(scan) = node
                && let Ok(provider) = source_as_provider(&scan.source)
                && (is_view(&provider) || is_snapshot(&provider))
            {
                replans = true;
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok((plan, replans))
    }

    /// Execute a prepared statement with `values` for its placeholders.
    /// An error fails the open transaction.
    pub fn execute_prepared<'a>(
        &'a self,
        prepared: &'a Prepared,
        values: Vec<ScalarValue>,
    ) -> futures::future::BoxFuture<'a, Result<Outcome>> {
        Box::pin(async move {
            let result = self
                .tracked(
                    *prepared.admission.get_or_init(|| {
                        crate::system::queries::needs_admission(self, &prepared.statement)
                    }),
                    async {
                        match self.execute_prepared_inner(prepared, &values).await {
                            // A write that waited for an ALTER TABLE of its
                            // table, having written nothing: run again,
                            // over the new columns.
                            Err(e) if crate::statement::point::plan_again(self, &e) => {
                                Box::pin(self.execute_prepared_inner(prepared, &values)).await
                            }
                            outcome => outcome,
                        }
                    },
                )
                .await;
            self.session.end_statement();
            if result.is_err() {
                self.fail_transaction();
            }
            result
        })
    }

    /// The paths other than a compiled statement's are boxed: the future
    /// stays small, so that boxing it (`execute_prepared`) copies little on
    /// each execution of a point read.
    async fn execute_prepared_inner(
        &self,
        prepared: &Prepared,
        values: &[ScalarValue],
    ) -> Result<Outcome> {
        let wanted = prepared.placeholder_types.len();
        if values.len() != wanted {
            return Err(CirroError::new(
                SqlState::PROTOCOL_VIOLATION,
                format!(
                    "bind message supplies {} parameters, but prepared statement requires {wanted}",
                    values.len()
                ),
            ));
        }
        let Some(cached) = &prepared.plan else {
            return Box::pin(
                self.run_statement(prepared.statement.clone(), prepared.inner_placeholders),
            )
            .await;
        };
        if self.transaction_aborted() {
            return Err(txn::aborted());
        }
        self.check_read_only(&prepared.statement)?;
        // NUMERIC parameters take the scale of the value bound to them, as
        // a PostgreSQL NUMERIC value carries its own: planned for these
        // values (not cached).
        let values: Vec<ScalarValue> = values.iter().cloned().map(valid_decimal).collect();
        let at_bind = prepared.declared.iter().any(is_numeric_at_bind);
        let bind_declared: Vec<Option<DataType>> = prepared
            .declared
            .iter()
            .zip(&values)
            .map(|(declared, value)| match (declared, value) {
                (Some(d), ScalarValue::Decimal128(_, p, s))
                    if is_numeric_at_bind(&Some(d.clone())) =>
                {
                    Some(DataType::Decimal128((*p).max(*s as u8).max(1), *s))
                }
                (Some(d), _) if is_numeric_at_bind(&Some(d.clone())) => Some(NUMERIC_PLANNED),
                (other, _) => other.clone(),
            })
            .collect();
        let types: Vec<Option<DataType>> = if at_bind {
            bind_declared.clone()
        } else {
            prepared.placeholder_types.clone()
        };
        let values = values
            .into_iter()
            .enumerate()
            .map(|(i, value)| {
                match types
                    .get(i)
                    .cloned()
                    .flatten()
                    .or_else(|| prepared.placeholder_types[i].clone())
                {
                    Some(to) => cast_parameter(value, &to, i + 1),
                    None => Ok(value),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        if at_bind {
            self.session.start_statement(&self.catalog);
            let (plan, _) =
                Box::pin(self.plan_prepared(&prepared.statement, &bind_declared)).await?;
            let plan = plan.with_param_values(values)?;
            self.check_plan(&plan)?;
            return Box::pin(self.execute_plan(plan)).await;
        }
        self.catalog.refresh().await?;
        self.session.start_statement(&self.catalog);
        // The session's view: a transaction's DDL makes a version of its own.
        let snapshot = self.snapshot();
        let reuse = cached
            .lock()
            .ok()
            .filter(|c| c.catalog_version == snapshot.version && !c.replans)
            .map(|mut c| {
                // A point read by key: compiled once, run without the plan.
                let compiled = match &c.compiled {
                    Some(compiled) => compiled.clone(),
                    None => {
                        let compiled = crate::statement::by_key::compile(self, &c.plan, &types)
                            .ok()
                            .flatten()
                            .map(Arc::new);
                        c.compiled = Some(compiled.clone());
                        compiled
                    }
                };
                (c.plan.clone(), compiled)
            });
        if let Some((plan, Some(compiled))) = &reuse {
            self.check_plan(plan)?;
            if let Some(outcome) = compiled.run(self, &values).await? {
                return Ok(outcome);
            }
        }
        let plan = match reuse {
            Some((plan, _)) => Box::pin(self.with_current_tables(plan)).await?,
            None => {
                let (plan, replans) =
                    Box::pin(self.plan_prepared(&prepared.statement, &prepared.declared)).await?;
                if let Ok(mut c) = cached.lock() {
                    *c = CachedPlan {
                        plan: plan.clone(),
                        catalog_version: snapshot.version,
                        replans,
                        compiled: None,
                    };
                }
                plan
            }
        };
        let plan = plan.with_param_values(values)?;
        self.check_plan(&plan)?;
        Box::pin(self.execute_plan(plan)).await
    }

    fn sql_prepared(&self, name: &str) -> Result<Arc<Prepared>> {
        self.sql_prepared
            .lock()
            .ok()
            .and_then(|p| p.get(name).cloned())
            .ok_or_else(|| {
                CirroError::new(
                    SqlState::INVALID_SQL_STATEMENT_NAME,
                    format!("prepared statement \"{name}\" does not exist"),
                )
            })
    }

    /// `PREPARE name AS statement`: prepared as over the protocols, kept
    /// by the session under `name` (42P05 if taken).
    pub(crate) async fn prepare_sql(
        &self,
        name: &str,
        data_types: &[datafusion::sql::sqlparser::ast::DataType],
        statement: CirroStatement,
        placeholders: usize,
    ) -> Result<Outcome> {
        let name = name.to_string();
        let parsed = Parsed {
            statement,
            placeholders,
            parses: 0,
        };
        let declared = self.declared_types(data_types).await?;
        let prepared = Arc::new(self.prepare_inner(parsed, declared).await?);
        let mut all = self
            .sql_prepared
            .lock()
            .map_err(|_| CirroError::internal("prepared statements lock poisoned"))?;
        if all.contains_key(&name) {
            return Err(CirroError::new(
                SqlState::DUPLICATE_PREPARED_STATEMENT,
                format!("prepared statement \"{name}\" already exists"),
            ));
        }
        all.insert(name, prepared);
        Ok(Outcome::command("PREPARE"))
    }

    /// The Arrow types of `PREPARE name (types)`'s SQL types, as a CAST to
    /// them would plan them.
    async fn declared_types(
        &self,
        data_types: &[datafusion::sql::sqlparser::ast::DataType],
    ) -> Result<Vec<Option<DataType>>> {
        if data_types.is_empty() {
            return Ok(Vec::new());
        }
        let casts: Vec<String> = data_types
            .iter()
            .map(|t| format!("CAST(NULL AS {t})"))
            .collect();
        let sql = format!("SELECT {}", casts.join(", "));
        let statement = cirro_sql::parse(&sql)?.statement;
        let Some(statement) = statement.to_datafusion() else {
            return Err(CirroError::internal("a cast parsed into another statement"));
        };
        let plan = self.plan(statement).await?;
        Ok(plan
            .schema()
            .fields()
            .iter()
            .map(|f| Some(f.data_type().clone()))
            .collect())
    }

    /// `EXECUTE name (values)`: the values are computed (they may be any
    /// expressions without columns), then the statement runs with them.
    pub(crate) async fn execute_sql(&self, name: &str, parameters: &[SqlExpr]) -> Result<Outcome> {
        let prepared = self.sql_prepared(name)?;
        let values = self.values_of(parameters).await?;
        // Boxed (execute_prepared): running an unplanned statement may come
        // back here.
        self.execute_prepared(&prepared, values).await
    }

    /// `DEALLOCATE name` of a statement PREPAREd in SQL; whether it existed.
    pub fn forget_prepared(&self, name: &str) -> bool {
        self.sql_prepared
            .lock()
            .map(|mut p| p.remove(name).is_some())
            .unwrap_or(false)
    }

    /// `DEALLOCATE name` (26000 if there is none) or
    /// `DEALLOCATE ALL` (None), of statements PREPAREd in SQL.
    pub(crate) fn deallocate(&self, name: Option<String>) -> Result<Outcome> {
        match name {
            None => {
                self.forget_all_prepared();
                Ok(Outcome::command("DEALLOCATE ALL"))
            }
            Some(name) if self.forget_prepared(&name) => Ok(Outcome::command("DEALLOCATE")),
            Some(name) => Err(CirroError::new(
                SqlState::INVALID_SQL_STATEMENT_NAME,
                format!("prepared statement \"{name}\" does not exist"),
            )),
        }
    }

    /// `DEALLOCATE ALL` of the statements PREPAREd in SQL.
    pub fn forget_all_prepared(&self) {
        if let Ok(mut prepared) = self.sql_prepared.lock() {
            prepared.clear();
        }
    }

    /// The values of expressions without columns (`VALUES (e1, e2, …)`).
    async fn values_of(&self, expressions: &[SqlExpr]) -> Result<Vec<ScalarValue>> {
        if expressions.is_empty() {
            return Ok(vec![]);
        }
        let values = Values {
            explicit_row: false,
            value_keyword: false,
            rows: vec![Parens::with_empty_span(expressions.to_vec())],
        };
        let query = Query {
            with: None,
            body: Box::new(SetExpr::Values(values)),
            order_by: None,
            limit_clause: None,
            fetch: None,
            locks: vec![],
            for_clause: None,
            settings: None,
            format_clause: None,
            pipe_operators: vec![],
        };
        let plan = self
            .plan(DfStatement::Statement(Box::new(SqlStatement::Query(
                Box::new(query),
            ))))
            .await?;
        let batches = self.ctx.execute_logical_plan(plan).await?.collect().await?;
        let batch = batches
            .iter()
            .find(|b| b.num_rows() > 0)
            .ok_or_else(|| CirroError::internal("EXECUTE's values computed no row"))?;
        batch
            .columns()
            .iter()
            .map(|column| Ok(ScalarValue::try_from_array(column, 0)?))
            .collect()
    }

    /// `plan` with every Cirro table it scans or changes swapped for the
    /// table's current snapshot (or the open transaction's view of it).
    /// Past versions (time travel) keep theirs.
    async fn with_current_tables(&self, plan: LogicalPlan) -> Result<LogicalPlan> {
        let mut names: Vec<TableReference> = Vec::new();
        plan.apply_with_subqueries(|node| {
            let (name, source) = match node {
                LogicalPlan::TableScan(scan) => (&scan.table_name, &scan.source),
                LogicalPlan::Dml(dml) => (&dml.table_name, &dml.target),
                _ => return Ok(TreeNodeRecursion::Continue),
            };
            let is_cirro = source_as_provider(source)
                .is_ok_and(|p| (p.as_ref() as &dyn std::any::Any).is::<CirroTable>());
            if is_cirro && !name.table().starts_with(PAST_VERSION_PREFIX) {
                names.push(name.clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if names.is_empty() {
            return Ok(plan);
        }
        let mut current: HashMap<TableReference, Arc<dyn TableProvider>> = HashMap::new();
        for name in names {
            if current.contains_key(&name) {
                continue;
            }
            let (db, schema, table) = self.resolve(&name);
            let provider = self
                .ctx
                .table_provider(TableReference::full(db, schema, table))
                .await?;
            current.insert(name, provider);
        }
        let plan = plan.transform_up_with_subqueries(|node| {
            Ok(match node {
                LogicalPlan::TableScan(mut scan) => match current.get(&scan.table_name) {
                    Some(provider) => {
                        scan.source = provider_as_source(Arc::clone(provider));
                        Transformed::yes(LogicalPlan::TableScan(scan))
                    }
                    None => Transformed::no(LogicalPlan::TableScan(scan)),
                },
                LogicalPlan::Dml(mut dml) => match current.get(&dml.table_name) {
                    Some(provider) => {
                        dml.target = provider_as_source(Arc::clone(provider));
                        Transformed::yes(LogicalPlan::Dml(dml))
                    }
                    None => Transformed::no(LogicalPlan::Dml(dml)),
                },
                other => Transformed::no(other),
            })
        })?;
        Ok(plan.data)
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::AsArray;
    use cirro_common::SqlState;
    use datafusion::scalar::ScalarValue;
    use futures::TryStreamExt;

    use crate::{Engine, EngineConfig, Outcome};

    async fn rows(outcome: Outcome) -> Vec<String> {
        let Outcome::Rows(stream) = outcome else {
            panic!("not rows");
        };
        let batches: Vec<_> = stream.try_collect().await.expect("rows");
        batches
            .iter()
            .flat_map(|b| {
                let column = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8)
                    .expect("cast");
                column
                    .as_string::<i32>()
                    .iter()
                    .map(|v| v.unwrap_or("NULL").to_string())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn plans(engine: &Engine) -> u64 {
        engine
            .counters
            .plans
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn run(engine: &Engine, sql: &str) -> Outcome {
        engine
            .execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn planned_once_reads_current_data_and_replans_after_ddl() {
        let dir = tempfile::tempdir().expect("dir");
        let engine = Engine::open(dir.path().to_str().expect("utf8"), EngineConfig::default())
            .await
            .expect("open");
        run(&engine, "CREATE TABLE pt (k BIGINT NOT NULL, v VARCHAR)").await;
        run(
            &engine,
            "INSERT INTO pt SELECT value, 'v' || value FROM generate_series(1, 300)",
        )
        .await;
        let parsed = engine
            .parse("SELECT v FROM pt WHERE k = $1")
            .expect("parse");
        let prepared = engine.prepare(parsed).await.expect("prepare");
        assert_eq!(
            prepared.placeholder_types(),
            &[Some(arrow::datatypes::DataType::Int64)]
        );
        let before = plans(&engine);
        for i in 0..1000i32 {
            let key = i % 300 + 1;
            // An int4 value for the BIGINT placeholder: cast as PostgreSQL does.
            let got = rows(
                engine
                    .execute_prepared(&prepared, vec![ScalarValue::Int32(Some(key))])
                    .await
                    .expect("execute"),
            )
            .await;
            assert_eq!(got, vec![format!("v{key}")]);
        }
        assert_eq!(plans(&engine), before, "1,000 executions planned nothing");
        // Rows written since are read: every scan takes the current snapshot.
        run(&engine, "INSERT INTO pt VALUES (1000, 'new')").await;
        let text = ScalarValue::Utf8(Some("1000".into()));
        let outcome = engine.execute_prepared(&prepared, vec![text]).await;
        assert_eq!(rows(outcome.expect("execute")).await, vec!["new"]);
        // ... also inside a transaction, which sees its own changes.
        run(&engine, "BEGIN").await;
        run(&engine, "DELETE FROM pt WHERE k = 1000").await;
        let outcome = engine
            .execute_prepared(&prepared, vec![ScalarValue::Int64(Some(1000))])
            .await;
        assert!(rows(outcome.expect("execute")).await.is_empty());
        run(&engine, "ROLLBACK").await;
        // A table dropped and created anew: planned again, new rows.
        let planned = plans(&engine);
        run(&engine, "DROP TABLE pt").await;
        run(&engine, "CREATE TABLE pt (k BIGINT NOT NULL, v VARCHAR)").await;
        run(&engine, "INSERT INTO pt VALUES (1, 'recreated')").await;
        let after_ddl = plans(&engine);
        assert!(after_ddl > planned);
        let outcome = engine
            .execute_prepared(&prepared, vec![ScalarValue::Int64(Some(1))])
            .await;
        assert_eq!(rows(outcome.expect("execute")).await, vec!["recreated"]);
        assert_eq!(plans(&engine), after_ddl + 1, "planned again once");
        // Bad values: clear errors, and the session goes on.
        let err = engine
            .execute_prepared(&prepared, vec![ScalarValue::Utf8(Some("seven".into()))])
            .await
            .err()
            .expect("not a number");
        assert_eq!(err.state, SqlState::INVALID_TEXT_REPRESENTATION);
        let err = engine
            .execute_prepared(&prepared, vec![])
            .await
            .err()
            .expect("too few");
        assert_eq!(err.state, SqlState::PROTOCOL_VIOLATION);
        let err = engine
            .execute_prepared(
                &prepared,
                vec![ScalarValue::Int64(Some(1)), ScalarValue::Int64(Some(2))],
            )
            .await
            .err()
            .expect("too many");
        assert_eq!(err.state, SqlState::PROTOCOL_VIOLATION);
        let err = engine
            .execute_prepared(&prepared, vec![ScalarValue::Float64(Some(1e30))])
            .await
            .err()
            .expect("out of range");
        assert_eq!(err.state, SqlState::NUMERIC_VALUE_OUT_OF_RANGE);
        // A placeholder where none may stand.
        let parsed = engine.parse("SET application_name = $1").expect("parse");
        let err = engine.prepare(parsed).await.err().expect("refused");
        assert_eq!(err.state, SqlState::UNDEFINED_PARAMETER);
        let err = engine.execute("SELECT $1").await.err().expect("no values");
        assert_eq!(err.state, SqlState::UNDEFINED_PARAMETER);
        let outcome = engine
            .execute_prepared(&prepared, vec![ScalarValue::Int64(Some(1))])
            .await;
        assert_eq!(rows(outcome.expect("execute")).await, vec!["recreated"]);
    }

    /// System tables are filled when planned: a prepared query over one
    /// shows them as they are at each execution, not as they were at the
    /// first (psycopg prepares a statement from its fifth execution on).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prepared_queries_over_system_tables_show_the_present() {
        let dir = tempfile::tempdir().expect("dir");
        let engine = Engine::open(dir.path().to_str().expect("utf8"), EngineConfig::default())
            .await
            .expect("open");
        run(&engine, "CREATE TABLE st (k BIGINT, v VARCHAR)").await;
        run(&engine, "INSERT INTO st VALUES (1, 'a'), (2, 'b')").await;
        // This test's files in the process's hot-data tier.
        let tag = dir
            .path()
            .file_name()
            .expect("name")
            .to_str()
            .expect("utf8");
        let parsed = engine
            .parse(&format!(
                "SELECT coalesce(sum(hits), 0) FROM cirro.cache WHERE strpos(file, '{tag}') > 0"
            ))
            .expect("parse");
        let prepared = engine.prepare(parsed).await.expect("prepare");
        let first = rows(
            engine
                .execute_prepared(&prepared, vec![])
                .await
                .expect("execute"),
        )
        .await;
        assert_eq!(first, vec!["0"]);
        // Reads only: the catalog's version stays, the cache moves on.
        for _ in 0..2 {
            assert_eq!(
                rows(run(&engine, "SELECT sum(k) FROM st").await).await,
                vec!["3"]
            );
        }
        let now = rows(
            engine
                .execute_prepared(&prepared, vec![])
                .await
                .expect("execute"),
        )
        .await;
        assert_ne!(now, first, "the cache as it is now");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prepared_dml_and_time_travel() {
        let dir = tempfile::tempdir().expect("dir");
        let engine = Engine::open(dir.path().to_str().expect("utf8"), EngineConfig::default())
            .await
            .expect("open");
        run(
            &engine,
            "CREATE TABLE t (id INT NOT NULL, s VARCHAR, d DATE)",
        )
        .await;
        let parsed = engine
            .parse("INSERT INTO t VALUES ($1, $2, $3)")
            .expect("parse");
        let insert = engine.prepare(parsed).await.expect("prepare");
        let injection = "'); DROP TABLE t; --";
        for (id, day) in [(1, "2024-02-29"), (2, "2024-03-01")] {
            let values = vec![
                ScalarValue::Int64(Some(id)),
                ScalarValue::Utf8(Some(injection.into())),
                ScalarValue::Utf8(Some(day.into())),
            ];
            match engine
                .execute_prepared(&insert, values)
                .await
                .expect("insert")
            {
                Outcome::Command { tag, .. } => assert_eq!(tag, "INSERT 0 1"),
                Outcome::Rows(_) => panic!("rows"),
            }
        }
        let got = rows(run(&engine, "SELECT s FROM t WHERE d = DATE '2024-02-29'").await).await;
        assert_eq!(got, vec![injection]);
        let parsed = engine
            .parse("UPDATE t SET s = $1 WHERE id = $2")
            .expect("parse");
        let update = engine.prepare(parsed).await.expect("prepare");
        let values = vec![
            ScalarValue::Utf8(Some("changed".into())),
            ScalarValue::Int32(Some(2)),
        ];
        engine
            .execute_prepared(&update, values)
            .await
            .expect("update");
        // Version 1 is the first INSERT: one row, still the original text.
        let parsed = engine
            .parse("SELECT count(*) FROM t VERSION AS OF 1 WHERE s = $1")
            .expect("parse");
        let past = engine.prepare(parsed).await.expect("prepare");
        let outcome = engine
            .execute_prepared(&past, vec![ScalarValue::Utf8(Some(injection.into()))])
            .await;
        assert_eq!(rows(outcome.expect("execute")).await, vec!["1"]);
        let got = rows(run(&engine, "SELECT s FROM t ORDER BY id").await).await;
        assert_eq!(got, vec![injection, "changed"]);
    }
}
