//! PostgreSQL compatibility for sessions of the PostgreSQL and Flight SQL
//! front ends: the `pg_catalog` schema (datafusion-pg-catalog) and the
//! functions drivers call (`version()`, `current_setting`, `to_regtype`,
//! `pg_get_serial_sequence`, `pg_get_indexdef`, `json_build_object`, …).

use std::sync::Arc;

use arrow::array::AsArray;
use arrow::datatypes::DataType;
use async_trait::async_trait;
use cirro_common::{CirroError, Result};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{CatalogProviderList, SchemaProvider, TableProvider};
use datafusion::datasource::{MemTable, TableType};
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility, create_udf,
};
use datafusion::scalar::ScalarValue;
use datafusion_pg_catalog::pg_catalog::catalog_info::CatalogInfo;
use datafusion_pg_catalog::pg_catalog::context::{
    EmptyContextProvider, PgCatalogContextProvider, Role,
};
use datafusion_pg_catalog::pg_catalog::{PgCatalogSchemaProvider, PgCatalogStaticTables};

use datafusion::logical_expr::planner::TypePlanner;

use crate::Engine;
use crate::session::settings::{SERVER_VERSION, Settings, setting_name};
use crate::statement::access::SuperuserCheck;
use crate::system::activity::{Backend, BackendInfo, BackendState};

/// Type planners asked in order; the first that plans a type wins.
#[derive(Debug)]
struct TypePlanners(Vec<Arc<dyn TypePlanner>>);

impl TypePlanner for TypePlanners {
    fn plan_type_field(
        &self,
        sql_type: &datafusion::sql::sqlparser::ast::DataType,
    ) -> DfResult<Option<arrow::datatypes::FieldRef>> {
        for planner in &self.0 {
            if let Some(field) = planner.plan_type_field(sql_type)? {
                return Ok(Some(field));
            }
        }
        Ok(None)
    }
}

impl Engine {
    /// Give this session PostgreSQL's catalog and functions, with `database`
    /// as the current database.
    pub fn enable_pg_compat(&self, database: &str) -> Result<()> {
        let ctx = self.context();
        datafusion_pg_catalog::pg_catalog::setup_pg_catalog(ctx, database, EmptyContextProvider)
            .map_err(|e| CirroError::from(*e))?;
        // It sets a type planner of its own (oid aliases): Cirro's SQL types
        // (FLOAT is double precision, VARCHAR(n) keeps n) come first.
        {
            let state = ctx.state_ref();
            let existing = state.read().clone();
            let mut builder =
                datafusion::execution::session_state::SessionStateBuilder::new_from_existing(
                    existing,
                );
            let mut planners: Vec<Arc<dyn TypePlanner>> = vec![Arc::new(cirro_sql::PgTypes)];
            if let Some(theirs) = builder.type_planner().take() {
                planners.push(theirs);
            }
            let chained = builder
                .with_type_planner(Arc::new(TypePlanners(planners)))
                .build();
            *state.write() = chained;
        }
        // It registers a to_char that returns its pattern: PostgreSQL's
        // template patterns are Cirro's (cirro_exec::functions::pg_datetime).
        use cirro_exec::functions::pg_datetime;
        ctx.register_udf(pg_datetime::to_char_udf());
        ctx.register_udf(pg_datetime::to_date_udf());
        ctx.register_udf(pg_datetime::to_timestamp_udf());
        // Its pg_catalog, replaced: views of this database only, Cirro's
        // users as roles, and only the databases that exist.
        let list = Arc::clone(ctx.state().catalog_list());
        let inner = PgCatalogSchemaProvider::try_new(
            OneDatabase {
                list: Arc::clone(&list),
                database: database.to_string(),
            },
            static_tables()?,
            CirroRoles {
                catalog: Arc::clone(self.catalog()),
            },
        )?;
        let schema = Arc::new(CirroPgCatalog {
            inner,
            list,
            backend: Arc::clone(&self.backend),
            viewer: crate::system::visibility::StatementViewer::new(
                Arc::clone(self.catalog()),
                self.user().map(str::to_string),
            ),
        });
        ctx.catalog(database)
            .ok_or_else(|| CirroError::internal(format!("no catalog for database {database}")))?
            .register_schema("pg_catalog", schema)?;
        crate::session::functions::register_identity(
            ctx,
            &crate::session::functions::session_user_name(self.user()),
            database,
        );
        ctx.register_udf(user_by_id_udf(Arc::clone(self.catalog())));
        ctx.register_udf(backend_pid_udf(Arc::clone(&self.backend)));
        for terminate in [false, true] {
            ctx.register_udf(signal_udf(
                terminate,
                Arc::clone(&self.backend),
                self.superuser_check(),
            ));
        }
        ctx.register_udf(version_udf());
        ctx.register_udf(to_regtype_udf());
        ctx.register_udf(no_serial_sequence_udf());
        ctx.register_udf(collation_is_visible_udf());
        ctx.register_udf(no_index_definition_udf());
        ctx.register_udf(json_build_object_udf());
        ctx.register_udf(current_setting_udf(self.settings.clone()));
        ctx.register_udf(current_schemas_udf());
        Ok(())
    }

    /// Enter this session in the server's registry (see `activity`):
    /// `pg_backend_pid()`, `pg_stat_activity` and the signal functions use it.
    pub fn attach_backend(&self, backend: Backend) -> Result<()> {
        self.backend
            .set(backend)
            .map_err(|_| CirroError::internal("the session already has a backend"))
    }

    /// The session's entry in the server's registry, if any.
    pub fn backend(&self) -> Option<&Backend> {
        self.backend.get()
    }

    /// The state the session is in between statements.
    pub fn idle_state(&self) -> BackendState {
        if self.transaction_aborted() {
            BackendState::IdleInTransactionAborted
        } else if self.in_transaction() {
            BackendState::IdleInTransaction
        } else {
            BackendState::Idle
        }
    }
}

type BackendSlot = Arc<std::sync::OnceLock<Backend>>;

/// `pg_backend_pid()`: the session's pid in the registry.
fn backend_pid_udf(slot: BackendSlot) -> ScalarUDF {
    create_udf(
        "pg_backend_pid",
        vec![],
        DataType::Int32,
        Volatility::Stable,
        Arc::new(move |_: &[ColumnarValue]| {
            let pid = slot.get().map(|b| b.pid);
            Ok(ColumnarValue::Scalar(ScalarValue::Int32(pid)))
        }),
    )
}

/// `pg_cancel_backend(pid)` / `pg_terminate_backend(pid)`: true when the
/// backend was signalled, false when there is none; 42501 unless a
/// superuser or the backend's own user.
fn signal_udf(terminate: bool, slot: BackendSlot, superuser: SuperuserCheck) -> ScalarUDF {
    let name = if terminate {
        "pg_terminate_backend"
    } else {
        "pg_cancel_backend"
    };
    create_udf(
        name,
        vec![DataType::Int64],
        DataType::Boolean,
        Volatility::Volatile,
        Arc::new(move |args: &[ColumnarValue]| {
            let pids = ColumnarValue::values_to_arrays(args)?;
            let pids = pids[0].as_primitive::<arrow::datatypes::Int64Type>();
            let mut out = arrow::array::BooleanBuilder::with_capacity(pids.len());
            for pid in pids.iter() {
                let (Some(pid), Some(backend)) = (pid, slot.get()) else {
                    out.append_null();
                    continue;
                };
                let Ok(pid) = i32::try_from(pid) else {
                    out.append_value(false);
                    continue;
                };
                let activity = backend.activity();
                let remote = activity.in_cluster()
                    && crate::system::activity::pid_node(pid) != activity.node();
                let signalled = if !remote {
                    activity.signal(pid, superuser.user(), superuser.holds(), terminate)
                } else {
                    // Another node's backend: ask it (a rare, administrative
                    // call; the scalar function waits for the answer).
                    tokio::task::block_in_place(|| {
                        tokio::runtime::Handle::current().block_on(activity.signal_cluster(
                            pid,
                            superuser.user(),
                            superuser.holds(),
                            terminate,
                        ))
                    })
                }
                .map_err(CirroError::into_datafusion)?;
                out.append_value(signalled);
            }
            Ok(ColumnarValue::Array(Arc::new(out.finish())))
        }),
    )
}

/// PostgreSQL's `pg_stat_activity` over the registry's backends.
fn pg_stat_activity(backends: &[BackendInfo]) -> DfResult<Arc<dyn TableProvider>> {
    use arrow::array::{ArrayRef, Int32Array, StringArray, TimestampMicrosecondArray};
    let n = backends.len();
    let time = |f: &dyn Fn(&BackendInfo) -> Option<i64>| {
        let values: Vec<Option<i64>> = backends.iter().map(f).collect();
        Arc::new(TimestampMicrosecondArray::from(values).with_timezone("UTC")) as ArrayRef
    };
    let text = |f: &dyn Fn(&BackendInfo) -> Option<String>| {
        Arc::new(StringArray::from(
            backends.iter().map(f).collect::<Vec<_>>(),
        )) as ArrayRef
    };
    let none_int = || Arc::new(Int32Array::from(vec![None::<i32>; n])) as ArrayRef;
    let pids = Int32Array::from_iter_values(backends.iter().map(|b| b.pid));
    memory_table(vec![
        ("datid", none_int()),
        ("datname", text(&|b| Some(b.database.clone()))),
        ("pid", Arc::new(pids)),
        ("leader_pid", none_int()),
        ("usesysid", none_int()),
        ("usename", text(&|b| Some(b.user.clone()))),
        (
            "application_name",
            text(&|b| Some(b.application_name.clone())),
        ),
        ("client_addr", text(&|b| b.client_addr.clone())),
        ("backend_start", time(&|b| Some(b.backend_start))),
        ("query_start", time(&|b| b.query_start)),
        ("state_change", time(&|b| Some(b.state_change))),
        (
            "wait_event_type",
            text(&|b| {
                b.wait_event.map(|e| {
                    match e {
                        "transactionid" | "relation" => "Lock",
                        _ => "Extension",
                    }
                    .to_string()
                })
            }),
        ),
        ("wait_event", text(&|b| b.wait_event.map(str::to_string))),
        ("state", text(&|b| Some(b.state.as_str().to_string()))),
        ("query", text(&|b| Some(b.query.clone()))),
        ("backend_type", text(&|b| Some(b.backend_type.to_string()))),
    ])
}

/// A one-batch table of named columns, all nullable.
pub(crate) fn memory_table(
    columns: Vec<(&str, arrow::array::ArrayRef)>,
) -> DfResult<Arc<dyn TableProvider>> {
    use arrow::datatypes::{Field, Schema};
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(name, array)| Field::new(*name, array.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = arrow::array::RecordBatch::try_new(
        Arc::clone(&schema),
        columns.into_iter().map(|(_, a)| a).collect(),
    )?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

/// `pg_get_userbyid(oid)`: Cirro's catalog views give every object the owner
/// oid 10, PostgreSQL's bootstrap superuser; here the first superuser created.
fn user_by_id_udf(catalog: Arc<cirro_catalog::Catalog>) -> ScalarUDF {
    create_udf(
        "pg_get_userbyid",
        vec![DataType::Int32],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |args: &[ColumnarValue]| {
            let snapshot = catalog.snapshot();
            let owner = snapshot
                .users
                .iter()
                .filter(|(_, u)| u.superuser)
                .min_by_key(|(name, u)| (u.created_ms, (*name).clone()))
                .map(|(name, _)| name.clone());
            let rows = args.first().map_or(1, |a| match a {
                ColumnarValue::Array(array) => array.len(),
                ColumnarValue::Scalar(_) => 1,
            });
            let array = arrow::array::StringArray::from(vec![owner; rows]);
            Ok(ColumnarValue::Array(Arc::new(array)))
        }),
    )
}

/// The static pg_catalog tables, loaded once per process.
fn static_tables() -> Result<Arc<PgCatalogStaticTables>> {
    static TABLES: std::sync::OnceLock<Arc<PgCatalogStaticTables>> = std::sync::OnceLock::new();
    if let Some(tables) = TABLES.get() {
        return Ok(Arc::clone(tables));
    }
    let tables = Arc::new(PgCatalogStaticTables::try_new()?);
    Ok(Arc::clone(TABLES.get_or_init(|| tables)))
}

/// The catalog views of one database (PostgreSQL's are per database).
#[derive(Clone, Debug)]
struct OneDatabase {
    list: Arc<dyn CatalogProviderList>,
    database: String,
}

#[async_trait]
impl CatalogInfo for OneDatabase {
    async fn catalog_names(&self) -> DfResult<Vec<String>> {
        Ok(self
            .list
            .catalog(&self.database)
            .map(|_| vec![self.database.clone()])
            .unwrap_or_default())
    }

    async fn schema_names(&self, catalog: &str) -> DfResult<Option<Vec<String>>> {
        if catalog != self.database {
            return Ok(None);
        }
        self.list.schema_names(catalog).await
    }

    async fn table_names(&self, catalog: &str, schema: &str) -> DfResult<Option<Vec<String>>> {
        if catalog != self.database {
            return Ok(None);
        }
        self.list.table_names(catalog, schema).await
    }

    async fn table_schema(
        &self,
        catalog: &str,
        schema: &str,
        table: &str,
    ) -> DfResult<Option<SchemaRef>> {
        self.list.table_schema(catalog, schema, table).await
    }

    async fn table_type(
        &self,
        catalog: &str,
        schema: &str,
        table: &str,
    ) -> DfResult<Option<TableType>> {
        self.list.table_type(catalog, schema, table).await
    }
}

/// Cirro's users as PostgreSQL roles (`pg_roles`, psql's `\du`).
#[derive(Clone)]
struct CirroRoles {
    catalog: Arc<cirro_catalog::Catalog>,
}

impl std::fmt::Debug for CirroRoles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CirroRoles")
    }
}

#[async_trait]
impl PgCatalogContextProvider for CirroRoles {
    async fn roles(&self) -> Vec<String> {
        self.catalog.snapshot().users.keys().cloned().collect()
    }

    async fn role(&self, name: &str) -> Option<Role> {
        let snapshot = self.catalog.snapshot();
        let user = snapshot.users.get(name)?;
        Some(Role {
            name: name.to_string(),
            is_superuser: user.superuser,
            can_login: true,
            can_create_db: user.superuser,
            can_create_role: user.superuser,
            can_create_user: user.superuser,
            can_replication: false,
            grants: vec![],
            inherited_roles: vec![],
        })
    }
}

/// datafusion-pg-catalog's schema with `pg_database` listing the databases
/// that exist (its own always adds a `postgres` database).
#[derive(Debug)]
struct CirroPgCatalog {
    inner: PgCatalogSchemaProvider<OneDatabase, CirroRoles>,
    list: Arc<dyn CatalogProviderList>,
    backend: BackendSlot,
    viewer: crate::system::visibility::StatementViewer,
}

#[async_trait]
impl SchemaProvider for CirroPgCatalog {
    fn table_names(&self) -> Vec<String> {
        let mut names = self.inner.table_names();
        names.push("pg_stat_activity".to_string());
        names
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        if name.eq_ignore_ascii_case("pg_stat_activity") {
            let backends = self
                .backend
                .get()
                .map(|b| self.viewer.backends(b.activity().backends()))
                .unwrap_or_default();
            return Ok(Some(pg_stat_activity(&backends)?));
        }
        if name.eq_ignore_ascii_case("pg_database") {
            let names = CatalogProviderList::catalog_names(self.list.as_ref());
            return Ok(Some(pg_database(&names)?));
        }
        self.inner.table(name).await
    }

    fn table_exist(&self, name: &str) -> bool {
        name.eq_ignore_ascii_case("pg_stat_activity") || self.inner.table_exist(name)
    }
}

/// PostgreSQL's `pg_database` over `names`.
fn pg_database(names: &[String]) -> DfResult<Arc<dyn TableProvider>> {
    use arrow::array::{ArrayRef, BooleanArray, Int32Array, StringArray, new_null_array};
    use arrow::datatypes::Field;
    let mut names = names.to_vec();
    names.sort();
    let n = names.len();
    let int = |v: i32| Arc::new(Int32Array::from(vec![v; n])) as ArrayRef;
    let text = |v: &str| Arc::new(StringArray::from(vec![v; n])) as ArrayRef;
    let flag = |v: bool| Arc::new(BooleanArray::from(vec![v; n])) as ArrayRef;
    let acl = DataType::List(Arc::new(Field::new("item", DataType::Int32, true)));
    let columns: Vec<(&str, ArrayRef)> = vec![
        (
            "oid",
            Arc::new(Int32Array::from_iter_values(
                (0..n).map(|i| 16384 + i as i32),
            )),
        ),
        ("datname", Arc::new(StringArray::from(names.clone()))),
        ("datdba", int(10)),
        ("encoding", int(6)),
        ("datlocprovider", text("c")),
        ("datcollate", text("C.UTF-8")),
        ("datctype", text("C.UTF-8")),
        ("datistemplate", flag(false)),
        ("datallowconn", flag(true)),
        ("datconnlimit", int(-1)),
        ("datlastsysoid", int(16383)),
        ("datfrozenxid", int(1)),
        ("datminmxid", int(1)),
        ("dattablespace", int(1663)),
        ("daticulocale", new_null_array(&DataType::Utf8, n)),
        ("daticurules", new_null_array(&DataType::Utf8, n)),
        ("datacl", new_null_array(&acl, n)),
    ];
    memory_table(columns)
}

/// `version()` as PostgreSQL clients parse it (`PostgreSQL <major>.<minor>`).
fn version_udf() -> ScalarUDF {
    let text = format!(
        "PostgreSQL {SERVER_VERSION} (Cirro {}) on x86_64-pc-linux-gnu",
        env!("CARGO_PKG_VERSION")
    );
    create_udf(
        "version",
        vec![],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(text.clone()))))
        }),
    )
}

/// The OID of a built-in type by the names PostgreSQL accepts for it.
fn builtin_type_oid(name: &str) -> Option<i32> {
    let name = name.trim().to_ascii_lowercase();
    let name = name.strip_prefix("pg_catalog.").unwrap_or(&name);
    if let Some(element) = name.strip_suffix("[]") {
        // The array type of each (pg_type.typarray).
        return match builtin_type_oid(element)? {
            16 => Some(1000),
            17 => Some(1001),
            20 => Some(1016),
            21 => Some(1005),
            23 => Some(1007),
            25 => Some(1009),
            700 => Some(1021),
            701 => Some(1022),
            1043 => Some(1015),
            1082 => Some(1182),
            1114 => Some(1115),
            1184 => Some(1185),
            1700 => Some(1231),
            _ => None,
        };
    }
    Some(match name {
        "bool" | "boolean" => 16,
        "bytea" => 17,
        "char" => 18,
        "name" => 19,
        "int8" | "bigint" => 20,
        "int2" | "smallint" => 21,
        "int4" | "integer" | "int" => 23,
        "text" => 25,
        "oid" => 26,
        "json" => 114,
        "float4" | "real" => 700,
        "float8" | "double precision" => 701,
        "bpchar" | "character" => 1042,
        "varchar" | "character varying" => 1043,
        "date" => 1082,
        "time" | "time without time zone" => 1083,
        "timestamp" | "timestamp without time zone" => 1114,
        "timestamptz" | "timestamp with time zone" => 1184,
        "interval" => 1186,
        "numeric" | "decimal" => 1700,
        "uuid" => 2950,
        "jsonb" => 3802,
        _ => return None,
    })
}

/// `to_regtype(name)`: the type's OID, or NULL for a type Cirro does not
/// have (drivers probe for extension types such as hstore this way).
fn to_regtype_udf() -> ScalarUDF {
    create_udf(
        "to_regtype",
        vec![DataType::Utf8],
        DataType::Int32,
        Volatility::Stable,
        Arc::new(|args: &[ColumnarValue]| {
            let arrays = ColumnarValue::values_to_arrays(args)?;
            let names = arrays[0].as_string::<i32>();
            let oids: arrow::array::Int32Array = names
                .iter()
                .map(|name| name.and_then(builtin_type_oid))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(oids)))
        }),
    )
}

/// `pg_get_serial_sequence(table, column)`: NULL, as Cirro has no
/// sequences (SQLAlchemy's column reflection asks).
fn no_serial_sequence_udf() -> ScalarUDF {
    create_udf(
        "pg_get_serial_sequence",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(|_args: &[ColumnarValue]| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)))),
    )
}

/// `current_setting(name [, missing_ok])`: the session's value of a setting,
/// as SHOW gives it; an unknown name is 42704, or NULL when missing_ok.
fn current_setting_udf(settings: Settings) -> ScalarUDF {
    let lookup = move |args: ScalarFunctionArgs| {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let names = arrays[0].as_string::<i32>();
        let missing_ok = arrays.get(1).map(|a| a.as_boolean().clone());
        let mut values = arrow::array::StringBuilder::new();
        for (i, name) in names.iter().enumerate() {
            let Some(name) = name else {
                values.append_null();
                continue;
            };
            match setting_name(name) {
                Ok(known) => values.append_value(settings.get(known)),
                Err(_) if missing_ok.as_ref().is_some_and(|m| m.value(i)) => values.append_null(),
                Err(e) => {
                    return Err(datafusion::error::DataFusionError::External(Box::new(e)));
                }
            }
        }
        Ok(ColumnarValue::Array(Arc::new(values.finish())))
    };
    TextFunction::udf(
        "current_setting",
        Signature::one_of(
            vec![
                TypeSignature::Exact(vec![DataType::Utf8]),
                TypeSignature::Exact(vec![DataType::Utf8, DataType::Boolean]),
            ],
            Volatility::Stable,
        ),
        lookup,
    )
}

/// `current_schemas(include_implicit)`: the schemas an unqualified name is
/// looked up in, as PostgreSQL lists them: `pg_catalog` first when the
/// implicit schemas are asked for, then `public`, where Cirro resolves
/// unqualified table names. (datafusion-pg-catalog's answers one row
/// whatever its input's, with `information_schema` among them, which
/// PostgreSQL does not search.) pgbench finds its tables' schema by its
/// position in this list.
fn current_schemas_udf() -> ScalarUDF {
    let item = Arc::new(arrow::datatypes::Field::new("item", DataType::Utf8, true));
    let list_type = DataType::List(Arc::clone(&item));
    let null = ScalarValue::try_from(&list_type).unwrap_or(ScalarValue::Null);
    let schemas = move |implicit: Option<bool>| -> ScalarValue {
        let names: &[&str] = match implicit {
            None => return null.clone(),
            Some(true) => &["pg_catalog", cirro_catalog::DEFAULT_SCHEMA],
            Some(false) => &[cirro_catalog::DEFAULT_SCHEMA],
        };
        let names: Vec<ScalarValue> = names
            .iter()
            .map(|n| ScalarValue::Utf8(Some(n.to_string())))
            .collect();
        ScalarValue::List(ScalarValue::new_list_nullable(&names, &DataType::Utf8))
    };
    create_udf(
        "current_schemas",
        vec![DataType::Boolean],
        list_type,
        Volatility::Stable,
        Arc::new(move |args: &[ColumnarValue]| match &args[0] {
            ColumnarValue::Scalar(ScalarValue::Boolean(implicit)) => {
                Ok(ColumnarValue::Scalar(schemas(*implicit)))
            }
            ColumnarValue::Array(array) if array.data_type() == &DataType::Boolean => {
                let lists = array.as_boolean().iter().map(&schemas);
                Ok(ColumnarValue::Array(ScalarValue::iter_to_array(lists)?))
            }
            other => Err(datafusion::error::DataFusionError::Plan(format!(
                "current_schemas takes a boolean, not {}",
                other.data_type()
            ))),
        }),
    )
}

/// `pg_get_indexdef(index [, column, pretty])`: NULL, as for an unknown
/// index: Cirro tables have no indexes, and the pg_index rows are
/// PostgreSQL's own (SQLAlchemy's index reflection plans a call to it).
fn no_index_definition_udf() -> ScalarUDF {
    TextFunction::udf(
        "pg_get_indexdef",
        Signature::variadic_any(Volatility::Stable),
        |_args: ScalarFunctionArgs| Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None))),
    )
}

type TextBody =
    dyn Fn(ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> + Send + Sync;

/// A function returning text, with any signature (`create_udf` takes only
/// exact argument types) and a body that may hold state.
struct TextFunction {
    name: &'static str,
    signature: Signature,
    body: Arc<TextBody>,
}

impl TextFunction {
    fn udf(
        name: &'static str,
        signature: Signature,
        body: impl Fn(ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue>
        + Send
        + Sync
        + 'static,
    ) -> ScalarUDF {
        ScalarUDF::new_from_impl(Self {
            name,
            signature,
            body: Arc::new(body),
        })
    }
}

impl std::fmt::Debug for TextFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for TextFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && Arc::ptr_eq(&self.body, &other.body)
    }
}

impl Eq for TextFunction {}

impl std::hash::Hash for TextFunction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl ScalarUDFImpl for TextFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> datafusion::error::Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::error::Result<ColumnarValue> {
        (self.body)(args)
    }
}

/// `pg_collation_is_visible(oid)`: true (one schema of collations).
fn collation_is_visible_udf() -> ScalarUDF {
    create_udf(
        "pg_collation_is_visible",
        vec![DataType::Int32],
        DataType::Boolean,
        Volatility::Stable,
        Arc::new(|_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))))
        }),
    )
}

/// `json_build_object(key, value, …)` as JSON text (SQLAlchemy's column
/// reflection builds identity and collation details with it).
fn json_build_object_udf() -> ScalarUDF {
    TextFunction::udf(
        "json_build_object",
        Signature::variadic_any(Volatility::Immutable),
        json_build_object,
    )
}

fn json_build_object(args: ScalarFunctionArgs) -> datafusion::error::Result<ColumnarValue> {
    if args.args.len() % 2 != 0 {
        return Err(datafusion::error::DataFusionError::Execution(
            "argument list must have even number of elements".to_string(),
        ));
    }
    let arrays = ColumnarValue::values_to_arrays(&args.args)?;
    let rows = args.number_rows;
    let mut out = arrow::array::StringBuilder::new();
    for row in 0..rows {
        let mut object = serde_json::Map::new();
        for pair in arrays.chunks(2) {
            let key = ScalarValue::try_from_array(&pair[0], row)?;
            let value = ScalarValue::try_from_array(&pair[1], row)?;
            let value = match value {
                v if v.is_null() => serde_json::Value::Null,
                ScalarValue::Boolean(Some(b)) => serde_json::Value::Bool(b),
                v if v.data_type().is_numeric() => {
                    serde_json::from_str(&v.to_string()).unwrap_or(serde_json::Value::Null)
                }
                v => serde_json::Value::String(v.to_string()),
            };
            let key = if key.is_null() {
                String::new()
            } else {
                key.to_string()
            };
            object.insert(key, value);
        }
        out.append_value(serde_json::Value::Object(object).to_string());
    }
    Ok(ColumnarValue::Array(Arc::new(out.finish())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_resolve_to_builtin_oids() {
        assert_eq!(builtin_type_oid("integer"), Some(23));
        assert_eq!(builtin_type_oid("pg_catalog.INT8"), Some(20));
        assert_eq!(builtin_type_oid("text[]"), Some(1009));
        assert_eq!(builtin_type_oid("hstore"), None);
    }
}
