//! Persisted views: CREATE VIEW stores the query's SQL in the catalog; a
//! reference to the view plans that SQL again (in the view's own database and
//! schema), so a view always reads its tables' current data.

use std::sync::Arc;

use async_trait::async_trait;
use cirro_catalog::state::now_ms;
use cirro_catalog::{ViewEntry, ViewPlanner};
use cirro_common::limits::VIEW_NESTING_DEPTH_MAX;
use cirro_common::{CirroError, Result, SqlState};

use datafusion::common::TableReference;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::session_state::SessionState;
use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder, col};
use datafusion::sql::planner::object_name_to_table_reference;
use datafusion::sql::sqlparser::ast::CreateView;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::{Engine, Outcome};

tokio::task_local! {
    /// How many views deep the current planning is.
    static VIEW_DEPTH: usize;
}

/// Gives a copy of the engine's current session state (None once it is gone).
pub(crate) type StateSource = Arc<dyn Fn() -> Option<SessionState> + Send + Sync>;

/// Plans stored views with a copy of the engine's session state.
pub(crate) struct SessionViewPlanner {
    state: StateSource,
}

impl std::fmt::Debug for SessionViewPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionViewPlanner")
    }
}

impl SessionViewPlanner {
    pub(crate) fn new(state: StateSource) -> Self {
        Self { state }
    }

    /// A planner over the session of `ctx` (held weakly: no reference cycle).
    pub(crate) fn for_context(ctx: &datafusion::execution::context::SessionContext) -> Self {
        let weak = ctx.state_weak_ref();
        Self::new(Arc::new(move || {
            weak.upgrade().map(|state| state.read().clone())
        }))
    }
}

#[async_trait]
impl ViewPlanner for SessionViewPlanner {
    async fn plan_view(&self, db: &str, schema: &str, view: &ViewEntry) -> DfResult<LogicalPlan> {
        let mut state =
            (self.state)().ok_or_else(|| DataFusionError::Internal("session is gone".into()))?;
        let options = state.config_mut().options_mut();
        options.catalog.default_catalog = db.to_string();
        options.catalog.default_schema = schema.to_string();
        // Planning a view plans the views it reads, within this same task: the
        // depth bounds that recursion even if the catalog held a cycle.
        let depth = VIEW_DEPTH.try_with(|d| *d).unwrap_or(0);
        if depth >= VIEW_NESTING_DEPTH_MAX {
            return Err(CirroError::new(
                SqlState::INVALID_OBJECT_DEFINITION,
                format!(
                    "views are nested more than {VIEW_NESTING_DEPTH_MAX} deep (or read themselves)"
                ),
            )
            .into_datafusion());
        }
        let plan = VIEW_DEPTH
            .scope(depth + 1, state.create_logical_plan(&view.sql))
            .await?;
        apply_column_names(plan, &view.columns)
    }
}

/// Rename the plan's output columns to `names` (from `CREATE VIEW v (a, b)`).
fn apply_column_names(plan: LogicalPlan, names: &[String]) -> DfResult<LogicalPlan> {
    if names.is_empty() {
        return Ok(plan);
    }
    let columns = plan.schema().columns();
    if columns.len() != names.len() {
        return Err(CirroError::new(
            SqlState::SYNTAX_ERROR,
            format!(
                "the view names {} columns but its query returns {}",
                names.len(),
                columns.len()
            ),
        )
        .into_datafusion());
    }
    let exprs = columns.into_iter().zip(names).map(|(c, n)| col(c).alias(n));
    LogicalPlanBuilder::from(plan).project(exprs)?.build()
}

/// The relations that the query text `sql` names, resolved against `db.schema`.
fn relations_of(sql: &str, db: &str, schema: &str) -> Vec<(String, String, String)> {
    let dialect = GenericDialect {};
    let Ok(statements) = Parser::parse_sql(&dialect, sql) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for statement in &statements {
        // Names the query's own WITH defines are not relations of the catalog.
        let ctes: Vec<String> = match statement {
            Statement::Query(query) => query
                .with
                .iter()
                .flat_map(|with| with.cte_tables.iter())
                .map(|cte| cte.alias.name.value.to_ascii_lowercase())
                .collect(),
            _ => Vec::new(),
        };
        cirro_sql::walk::each_relation(statement, &mut |name| {
            if let Ok(reference) = object_name_to_table_reference(name.clone(), true) {
                if matches!(reference, TableReference::Bare { .. })
                    && ctes.iter().any(|c| c == reference.table())
                {
                    return;
                }
                let resolved = reference.resolve(db, schema);
                names.push((
                    resolved.catalog.to_string(),
                    resolved.schema.to_string(),
                    resolved.table.to_string(),
                ));
            }
        });
    }
    names
}

/// Whether the view query `sql` (in `db.schema`) reads `target`, directly or
/// through other views. Works on the SQL text: DataFusion inlines views while
/// planning, so a plan no longer names the views it read.
fn reads_relation(
    catalog: &cirro_catalog::CatalogState,
    sql: &str,
    db: &str,
    schema: &str,
    target: &(String, String, String),
    depth: usize,
) -> bool {
    if depth > VIEW_NESTING_DEPTH_MAX {
        return true;
    }
    relations_of(sql, db, schema).into_iter().any(|relation| {
        if relation == *target {
            return true;
        }
        let (d, s, t) = &relation;
        match catalog.view(d, s, t) {
            Some(view) => reads_relation(catalog, &view.sql, d, s, target, depth + 1),
            None => false,
        }
    })
}

pub(crate) async fn create_view(engine: &Engine, view: &CreateView) -> Result<Outcome> {
    if view.materialized {
        return Err(CirroError::unsupported(
            "materialized views are not supported",
        ));
    }
    let reference = object_name_to_table_reference(view.name.clone(), true)?;
    let (db, schema, name) = engine.resolve(&reference);
    let sql = view.query.to_string();
    let columns: Vec<String> = view.columns.iter().map(|c| c.name.value.clone()).collect();
    let entry = ViewEntry {
        sql,
        columns,
        created_ms: now_ms(),
        owner: engine.user().map(str::to_string),
    };

    // Plan it now: a view that does not plan is refused at creation.
    let planner = SessionViewPlanner::for_context(engine.context());
    let plan = planner.plan_view(&db, &schema, &entry).await?;
    drop(plan);
    let target = (db.clone(), schema.clone(), name.clone());
    if reads_relation(&engine.snapshot(), &entry.sql, &db, &schema, &target, 0) {
        return Err(CirroError::new(
            SqlState::INVALID_OBJECT_DEFINITION,
            format!("infinite recursion: view \"{name}\" would read itself"),
        ));
    }

    let mut existed = false;
    engine
        .commit_catalog(|state| {
            let target = state.schema_mut(&db, &schema)?;
            if target.tables.contains_key(&name) {
                return Err(if view.or_replace {
                    CirroError::new(
                        SqlState::WRONG_OBJECT_TYPE,
                        format!("\"{name}\" is a table, not a view"),
                    )
                } else {
                    CirroError::new(
                        SqlState::DUPLICATE_TABLE,
                        format!("relation \"{name}\" already exists"),
                    )
                });
            }
            existed = target.views.contains_key(&name);
            if existed && view.if_not_exists {
                return Ok(());
            }
            if existed && !view.or_replace {
                return Err(CirroError::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{name}\" already exists"),
                ));
            }
            target.views.insert(name.clone(), entry.clone());
            Ok(())
        })
        .await?;
    Ok(Outcome::skipped_if(
        "CREATE VIEW",
        existed && view.if_not_exists,
        format!("relation \"{name}\" already exists, skipping"),
    ))
}

pub(crate) async fn drop_view(
    engine: &Engine,
    name: &TableReference,
    if_exists: bool,
    cascade: bool,
) -> Result<Outcome> {
    let (db, schema, view) = engine.resolve(name);
    engine.check_view_owner(&db, &schema, &view)?;
    let mut removed = false;
    let mut cascaded = Vec::new();
    engine
        .commit_catalog(|state| {
            let relation = (db.clone(), schema.clone(), view.clone());
            cascaded = if state.view(&db, &schema, &view).is_some() {
                dependents_closure(state, &relation)
            } else {
                Vec::new()
            };
            if !cascaded.is_empty() && !cascade {
                return Err(objects_depend(
                    &format!("drop view {view}"),
                    &format!("view {view}"),
                    &dependents(state, &relation),
                ));
            }
            remove_views(state, &cascaded);
            let target = match state.schema_mut(&db, &schema) {
                Ok(target) => target,
                Err(_) if if_exists => {
                    removed = false;
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            if target.tables.contains_key(&view) {
                return Err(CirroError::new(
                    SqlState::WRONG_OBJECT_TYPE,
                    format!("\"{view}\" is a table; use DROP TABLE"),
                ));
            }
            removed = target.views.remove(&view).is_some();
            if !removed && !if_exists {
                return Err(CirroError::new(
                    SqlState::UNDEFINED_TABLE,
                    format!("view \"{view}\" does not exist"),
                ));
            }
            Ok(())
        })
        .await?;
    if let Some(notice) = cascade_notice(&cascaded) {
        return Ok(Outcome::with_notice("DROP VIEW", notice));
    }
    Ok(Outcome::skipped_if(
        "DROP VIEW",
        !removed,
        format!("view \"{view}\" does not exist, skipping"),
    ))
}

// ------------------------------------------------------------ dependencies
//
// A view keeps its query's text, so a table (or view) it reads cannot be
// dropped, and a column it names cannot be dropped, renamed or retyped,
// while the view exists: PostgreSQL refuses those with 2BP01 unless CASCADE
// (which drops the views too). Renaming a table a view reads is refused as
// well: PostgreSQL's views follow the renamed table, Cirro's would lose it.

/// A relation's database, schema and name.
pub(crate) type Relation = (String, String, String);

/// The views that name `target` directly, in every database and schema.
pub(crate) fn dependents(state: &cirro_catalog::CatalogState, target: &Relation) -> Vec<Relation> {
    let mut found = Vec::new();
    for (db, database) in &state.databases {
        for (schema, entry) in &database.schemas {
            for (name, view) in &entry.views {
                let me = (db.clone(), schema.clone(), name.clone());
                if me != *target && relations_of(&view.sql, db, schema).contains(target) {
                    found.push(me);
                }
            }
        }
    }
    found
}

/// `target`'s dependents, theirs, and so on, each once: what CASCADE drops.
pub(crate) fn dependents_closure(
    state: &cirro_catalog::CatalogState,
    target: &Relation,
) -> Vec<Relation> {
    let mut all: Vec<Relation> = Vec::new();
    let mut next = dependents(state, target);
    while let Some(view) = next.pop() {
        if all.contains(&view) || view == *target {
            continue;
        }
        next.extend(dependents(state, &view));
        all.push(view);
    }
    all
}

/// Whether the query text `sql` names column `column` (as an identifier,
/// or through a `*`).
fn names_column(sql: &str, column: &str) -> bool {
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&cirro_sql::CirroDialect, sql).tokenize() else {
        return true;
    };
    let solid: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    solid.iter().enumerate().any(|(i, token)| match token {
        Token::Word(w) => {
            let name = if w.quote_style.is_some() {
                w.value.clone()
            } else {
                w.value.to_lowercase()
            };
            name == column
        }
        Token::Mul => i.checked_sub(1).is_some_and(|p| {
            matches!(solid[p], Token::Period | Token::Comma)
                || matches!(solid[p], Token::Word(w) if w.value.eq_ignore_ascii_case("select")
                    || w.value.eq_ignore_ascii_case("distinct"))
        }),
        _ => false,
    })
}

/// The views reading `target` directly that name one of `columns`.
pub(crate) fn column_dependents(
    state: &cirro_catalog::CatalogState,
    target: &Relation,
    columns: &[String],
) -> Vec<Relation> {
    dependents(state, target)
        .into_iter()
        .filter(|(db, schema, name)| {
            state
                .view(db, schema, name)
                .is_some_and(|view| columns.iter().any(|c| names_column(&view.sql, c)))
        })
        .collect()
}

/// 2BP01 for `what` (e.g. `drop table mt`), which `views` depend on.
pub(crate) fn objects_depend(what: &str, on: &str, views: &[Relation]) -> CirroError {
    let detail: Vec<String> = views
        .iter()
        .map(|(_, _, name)| format!("view {name} depends on {on}"))
        .collect();
    CirroError::new(
        SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
        format!(
            "cannot {what} because other objects depend on it ({}); use CASCADE to drop the dependent objects too",
            detail.join(", ")
        ),
    )
}

/// Remove `views` from the catalog state (CASCADE).
pub(crate) fn remove_views(state: &mut cirro_catalog::CatalogState, views: &[Relation]) {
    for (db, schema, name) in views {
        if let Some(entry) = state
            .databases
            .get_mut(db)
            .and_then(|d| d.schemas.get_mut(schema))
        {
            entry.views.remove(name);
        }
    }
}

/// PostgreSQL's notice for the views a CASCADE dropped.
pub(crate) fn cascade_notice(views: &[Relation]) -> Option<String> {
    match views {
        [] => None,
        [(_, _, one)] => Some(format!("drop cascades to view {one}")),
        many => Some(format!(
            "drop cascades to {} other objects: {}",
            many.len(),
            many.iter()
                .map(|(_, _, n)| format!("view {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
