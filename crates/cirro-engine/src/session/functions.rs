//! Table functions that read files in place: `read_parquet('path')` and
//! `read_csv('path' [, 'delimiter' [, header]])`, and URL tables (`SELECT *
//! FROM 'file.parquet'`, DataFusion's, behind a privilege check). Reading
//! files on the server needs a superuser, checked before anything is opened.

use std::sync::Arc;

use cirro_common::{CirroError, SqlState};

use crate::statement::access::SuperuserCheck;
use datafusion::catalog::{DynamicFileCatalog, UrlTableFactory};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableProvider;
use datafusion::datasource::dynamic_file::DynamicListTableFactory;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::file_format::csv::CsvFormat;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::Expr;
use datafusion_session::SessionStore;

/// The user a session's identity functions report: its login, or for the
/// local shell (no login) the operating system's user.
pub(crate) fn session_user_name(user: Option<&str>) -> String {
    user.map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "cirro".to_string())
}

/// `current_user`, `session_user`, `user`, `current_role` (PostgreSQL's: the
/// session's user; Cirro has no SET ROLE, so they agree) and
/// `current_database()` / `current_catalog`.
pub(crate) fn register_identity(ctx: &SessionContext, user: &str, database: &str) {
    for name in ["current_user", "session_user", "user", "current_role"] {
        ctx.register_udf(constant_text(name, user));
    }
    for name in ["current_database", "current_catalog"] {
        ctx.register_udf(constant_text(name, database));
    }
}

fn constant_text(name: &str, value: &str) -> datafusion::logical_expr::ScalarUDF {
    let value = ScalarValue::Utf8(Some(value.to_string()));
    datafusion::logical_expr::create_udf(
        name,
        vec![],
        arrow::datatypes::DataType::Utf8,
        datafusion::logical_expr::Volatility::Stable,
        Arc::new(move |_: &[datafusion::logical_expr::ColumnarValue]| {
            Ok(datafusion::logical_expr::ColumnarValue::Scalar(
                value.clone(),
            ))
        }),
    )
}

pub(crate) fn register(ctx: &SessionContext, superuser: &SuperuserCheck) {
    for csv in [false, true] {
        let function = ReadFile {
            csv,
            superuser: superuser.clone(),
        };
        ctx.register_udtf(function.name(), Arc::new(function));
    }
    ctx.register_udf(cirro_exec::rules::segment_udf().as_ref().clone());
    // PostgreSQL's template patterns, in place of DataFusion's chrono ones.
    use cirro_exec::functions::pg_datetime;
    ctx.register_udf(pg_datetime::to_char_udf());
    ctx.register_udf(pg_datetime::to_date_udf());
    ctx.register_udf(pg_datetime::to_timestamp_udf());
}

const READING_FILES: &str = "reading files on the server";

/// `ctx` with DataFusion's URL tables (`SELECT * FROM 'file.csv'`), which
/// only a superuser may use: for anyone else a name that looks like a path
/// is refused before the file system is asked.
pub(crate) fn enable_url_tables(ctx: SessionContext, superuser: SuperuserCheck) -> SessionContext {
    let inner = Arc::new(DynamicListTableFactory::new(SessionStore::new()));
    let factory = Arc::new(GuardedUrlTables {
        inner: Arc::clone(&inner),
        superuser,
    });
    let catalogs = Arc::new(DynamicFileCatalog::new(
        Arc::clone(ctx.state().catalog_list()),
        factory,
    ));
    let session_id = ctx.session_id();
    let ctx: SessionContext = ctx
        .into_state_builder()
        .with_session_id(session_id)
        .with_catalog_list(catalogs)
        .build()
        .into();
    inner.session_store().with_state(ctx.state_weak_ref());
    ctx
}

#[derive(Debug)]
struct GuardedUrlTables {
    inner: Arc<DynamicListTableFactory>,
    superuser: SuperuserCheck,
}

#[async_trait::async_trait]
impl UrlTableFactory for GuardedUrlTables {
    async fn try_new(&self, url: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let looks_like_a_path = url.contains('/') || url.contains('.') || url.contains(':');
        if looks_like_a_path {
            self.superuser
                .require(READING_FILES)
                .map_err(CirroError::into_datafusion)?;
        } else if !self.superuser.holds() {
            return Ok(None);
        }
        self.inner.try_new(url).await
    }
}

#[derive(Debug)]
struct ReadFile {
    csv: bool,
    superuser: SuperuserCheck,
}

fn literal(expr: &Expr) -> Option<ScalarValue> {
    match expr {
        Expr::Literal(value, _) => Some(value.clone()),
        _ => None,
    }
}

fn bad_argument(message: impl Into<String>) -> DataFusionError {
    CirroError::new(SqlState::INVALID_PARAMETER_VALUE, message).into_datafusion()
}

impl ReadFile {
    fn name(&self) -> &'static str {
        if self.csv { "read_csv" } else { "read_parquet" }
    }

    fn options(
        &self,
        session: &dyn Session,
        exprs: &[Expr],
        path: &str,
    ) -> DfResult<ListingOptions> {
        let extension = std::path::Path::new(path)
            .extension()
            .filter(|_| !std::path::Path::new(path).is_dir())
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default();
        let format: Arc<dyn FileFormat> = if self.csv {
            let mut format = CsvFormat::default()
                .with_options(session.table_options().csv.clone())
                .with_has_header(true);
            if let Some(value) = exprs.get(1).and_then(literal) {
                let text = value.to_string();
                let [byte] = text.as_bytes() else {
                    return Err(bad_argument(
                        "read_csv: the delimiter must be one character",
                    ));
                };
                format = format.with_delimiter(*byte);
            }
            if let Some(value) = exprs.get(2).and_then(literal) {
                match value {
                    ScalarValue::Boolean(Some(header)) => format = format.with_has_header(header),
                    _ => return Err(bad_argument("read_csv: header must be true or false")),
                }
            }
            Arc::new(format)
        } else {
            Arc::new(ParquetFormat::default().with_options(session.table_options().parquet.clone()))
        };
        Ok(ListingOptions::new(format).with_file_extension(extension))
    }
}

impl TableFunctionImpl for ReadFile {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        self.superuser
            .require(READING_FILES)
            .map_err(CirroError::into_datafusion)?;
        let exprs = args.exprs();
        let session = args.session();
        let path = match exprs.first().and_then(literal) {
            Some(
                ScalarValue::Utf8(Some(p))
                | ScalarValue::Utf8View(Some(p))
                | ScalarValue::LargeUtf8(Some(p)),
            ) => p,
            _ => {
                return Err(bad_argument(format!(
                    "{}: the first argument must be a file path string",
                    self.name()
                )));
            }
        };
        if !path.contains("://") && !std::path::Path::new(&path).exists() {
            return Err(CirroError::new(
                SqlState::UNDEFINED_FILE,
                format!("could not open file \"{path}\" for reading: No such file or directory"),
            )
            .into_datafusion());
        }
        let url = ListingTableUrl::parse(&path)?;
        let options = self.options(session, exprs, &path)?;
        // Schema inference is async; table functions are not. Run it on this
        // runtime's blocking section (the engine always runs multi-threaded).
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| DataFusionError::Internal("read functions need a Tokio runtime".into()))?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return Err(DataFusionError::Internal(
                "read functions need a multi-threaded runtime".into(),
            ));
        }
        let schema =
            tokio::task::block_in_place(|| handle.block_on(options.infer_schema(session, &url)))?;
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .with_schema(schema);
        Ok(Arc::new(ListingTable::try_new(config)?))
    }
}
