//! Users and privileges: `CREATE/ALTER/DROP USER`, `GRANT/REVOKE`, and the
//! check every statement of a session with a user passes before it runs.
//!
//! A session opened without a user (the local `cirro sql` shell, which has the
//! data directory anyway) may do everything. A session of the server runs as
//! the user who logged in:
//! - a superuser may do everything;
//! - reading a table needs SELECT, INSERT/COPY FROM STDIN needs INSERT,
//!   UPDATE needs UPDATE, DELETE/TRUNCATE needs DELETE, and MERGE needs the
//!   privileges of its actions (UPDATE, DELETE, INSERT); a row-changing
//!   statement also needs SELECT on every other table it reads. The owner of
//!   a table (its creator) holds all of them;
//! - reading a view needs SELECT on the tables it reads;
//! - DROP/OPTIMIZE/VACUUM of a table and GRANT/REVOKE on it need ownership;
//! - managing users, databases and schemas, and reading or writing files on
//!   the server (`read_parquet`, `read_csv`, `COPY … FROM/TO 'file'`, URL
//!   tables), needs a superuser, checked before any file is opened: the error
//!   is the same whether the file exists or not. A user may change their own
//!   password.

use std::sync::Arc;

use cirro_catalog::users::{PREDEFINED_ROLES, Privilege, ScramVerifier, UserEntry, undefined_user};
use cirro_catalog::{Catalog, TableEntry};
use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::{AccessStatement, UserOptions};
use datafusion::catalog::default_table_source::source_as_provider;
use datafusion::common::TableReference;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::listing::ListingTable;
use datafusion::logical_expr::{LogicalPlan, WriteOp};

use crate::{Engine, Outcome};

fn valid_password(password: &str) -> Result<&str> {
    if password.is_empty() {
        return Err(CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            "the password must not be empty",
        ));
    }
    Ok(password)
}

/// Whether a session's user is a superuser, asked of the current catalog
/// (ALTER USER takes effect at once). The table functions and URL tables the
/// engine registers in DataFusion hold one, and ask it before they open any
/// file, so that an unprivileged user learns nothing about the server's files.
#[derive(Clone)]
pub(crate) struct SuperuserCheck {
    catalog: Arc<Catalog>,
    /// None: the local shell, unrestricted.
    user: Option<String>,
}

impl std::fmt::Debug for SuperuserCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SuperuserCheck")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl SuperuserCheck {
    pub(crate) fn new(catalog: Arc<Catalog>, user: Option<String>) -> Self {
        Self { catalog, user }
    }

    /// The session's user (None: the local shell).
    pub(crate) fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    pub(crate) fn holds(&self) -> bool {
        match &self.user {
            None => true,
            Some(user) => self
                .catalog
                .snapshot()
                .users
                .get(user)
                .is_some_and(|u| u.superuser),
        }
    }

    /// 42501 unless a superuser: `what` needs a superuser.
    pub(crate) fn require(&self, what: &str) -> Result<()> {
        if self.holds() {
            return Ok(());
        }
        Err(CirroError::new(
            SqlState::INSUFFICIENT_PRIVILEGE,
            format!("permission denied: {what} needs a superuser"),
        ))
    }
}

/// Whether `user` holds `privilege` on a table by ownership or grant
/// (superusers aside).
pub(crate) fn user_holds(user: &str, entry: &TableEntry, privilege: Privilege) -> bool {
    entry.owner.as_deref() == Some(user)
        || entry
            .grants
            .get(user)
            .is_some_and(|granted| granted.contains(&privilege))
}

impl Engine {
    /// The user this session runs as (None: the local shell, unrestricted).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    pub(crate) fn superuser_check(&self) -> SuperuserCheck {
        SuperuserCheck::new(Arc::clone(&self.catalog), self.user.clone())
    }

    fn is_superuser(&self) -> bool {
        self.superuser_check().holds()
    }

    pub(crate) fn require_superuser(&self, what: &str) -> Result<()> {
        self.superuser_check().require(what)
    }

    pub(crate) fn holds(&self, entry: &TableEntry, privilege: Privilege) -> bool {
        let Some(user) = &self.user else {
            return true;
        };
        user_holds(user, entry, privilege) || self.is_superuser()
    }

    /// Fail with 42501 unless the session may use `privilege` on table
    /// `db.schema.name` (a missing table is left to the statement to report).
    pub(crate) fn check_table(
        &self,
        db: &str,
        schema: &str,
        name: &str,
        privilege: Privilege,
    ) -> Result<()> {
        let snapshot = self.snapshot();
        match snapshot.table(db, schema, name) {
            Some(entry) if !self.holds(entry, privilege) => Err(CirroError::new(
                SqlState::INSUFFICIENT_PRIVILEGE,
                format!("permission denied for table {name} ({privilege} is not granted)"),
            )),
            _ => Ok(()),
        }
    }

    /// Fail with 42501 unless the session owns table `db.schema.name`.
    pub(crate) fn check_owner(&self, db: &str, schema: &str, name: &str, what: &str) -> Result<()> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        let snapshot = self.snapshot();
        match snapshot.table(db, schema, name) {
            Some(entry)
                if entry.owner.as_deref() != Some(user.as_str()) && !self.is_superuser() =>
            {
                Err(CirroError::new(
                    SqlState::INSUFFICIENT_PRIVILEGE,
                    format!("must be owner of table {name} to {what}"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Fail with 42501 unless the session may drop view `db.schema.name`.
    pub(crate) fn check_view_owner(&self, db: &str, schema: &str, name: &str) -> Result<()> {
        let Some(user) = &self.user else {
            return Ok(());
        };
        let snapshot = self.snapshot();
        match snapshot.view(db, schema, name) {
            Some(view) if view.owner.as_deref() != Some(user.as_str()) && !self.is_superuser() => {
                Err(CirroError::new(
                    SqlState::INSUFFICIENT_PRIVILEGE,
                    format!("must be owner of view {name} to DROP it"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Check everything `plan` reads and writes against the session's
    /// privileges.
    pub(crate) fn check_plan(&self, plan: &LogicalPlan) -> Result<()> {
        if self.user.is_none() || self.is_superuser() {
            return Ok(());
        }
        let mut target = None;
        match plan {
            LogicalPlan::Dml(dml) => {
                let (db, schema, name) = self.resolve(&dml.table_name);
                let needed: &[Privilege] = match &dml.op {
                    WriteOp::Insert(_) => &[Privilege::Insert],
                    WriteOp::Update => &[Privilege::Update],
                    WriteOp::Delete | WriteOp::Truncate => &[Privilege::Delete],
                    WriteOp::MergeInto(_) => {
                        &[Privilege::Insert, Privilege::Update, Privilege::Delete]
                    }
                    _ => &[Privilege::Insert, Privilege::Update, Privilege::Delete],
                };
                for privilege in needed {
                    self.check_table(&db, &schema, &name, *privilege)?;
                }
                target = Some((db, schema, name));
            }
            LogicalPlan::Copy(_) => {
                self.require_superuser("COPY … TO a file on the server")?;
            }
            _ => {}
        }
        self.check_reads(plan, target.as_ref())
    }

    /// SELECT on every table `plan` scans (the DML target excepted: its own
    /// privilege covers reading the rows it changes), through views.
    fn check_reads(
        &self,
        plan: &LogicalPlan,
        target: Option<&(String, String, String)>,
    ) -> Result<()> {
        let mut result = Ok(());
        plan.apply_with_subqueries(|node| {
            if let LogicalPlan::TableScan(scan) = node {
                let checked = self.check_scan(&scan.table_name, &scan.source, target);
                if checked.is_err() {
                    result = checked;
                    return Ok(TreeNodeRecursion::Stop);
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        result
    }

    fn check_scan(
        &self,
        reference: &TableReference,
        source: &std::sync::Arc<dyn datafusion::logical_expr::TableSource>,
        target: Option<&(String, String, String)>,
    ) -> Result<()> {
        let (db, schema, name) = self.resolve(reference);
        let snapshot = self.snapshot();
        if snapshot.table(&db, &schema, &name).is_some() {
            if target.is_some_and(|t| *t == (db.clone(), schema.clone(), name.clone())) {
                return Ok(());
            }
            return self.check_table(&db, &schema, &name, Privilege::Select);
        }
        if let Some(view_plan) = source.get_logical_plan() {
            return self.check_reads(&view_plan, None);
        }
        if let Ok(provider) = source_as_provider(source)
            && provider.downcast_ref::<ListingTable>().is_some()
        {
            return self.require_superuser("reading files on the server");
        }
        // System tables (information_schema, pg_catalog), table functions
        // that generate rows, and past versions (checked when opened).
        Ok(())
    }

    pub(crate) async fn execute_access(&self, statement: AccessStatement) -> Result<Outcome> {
        match statement {
            AccessStatement::CreateUser { name, options } => self.create_user(name, options).await,
            AccessStatement::AlterUser { name, options } => self.alter_user(name, options).await,
            AccessStatement::AlterUserSetting {
                name,
                setting,
                value,
            } => self.alter_user_setting(name, setting, value).await,
            AccessStatement::DropUser { names, if_exists } => {
                self.drop_users(names, if_exists).await
            }
            AccessStatement::Grant {
                privileges,
                tables,
                users,
                revoke,
            } => self.grant(privileges, tables, users, revoke).await,
            AccessStatement::GrantRole {
                roles,
                users,
                revoke,
            } => self.grant_role(roles, users, revoke).await,
        }
    }

    /// CREATE USER.
    async fn create_user(&self, name: String, options: UserOptions) -> Result<Outcome> {
        self.require_superuser("CREATE USER")?;
        let password = options.password.ok_or_else(|| {
            CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("CREATE USER {name} needs PASSWORD '…' (users log in with it)"),
            )
        })?;
        let verifier = ScramVerifier::new(valid_password(&password)?).to_string();
        let superuser = options.superuser.unwrap_or(false);
        self.catalog
            .commit(|state| {
                if state.users.contains_key(&name) {
                    return Err(CirroError::new(
                        SqlState::DUPLICATE_OBJECT,
                        format!("role \"{name}\" already exists"),
                    ));
                }
                state.users.insert(
                    name.clone(),
                    UserEntry {
                        verifier: verifier.clone(),
                        superuser,
                        created_ms: cirro_catalog::state::now_ms(),
                        settings: Default::default(),
                        roles: Default::default(),
                    },
                );
                Ok(())
            })
            .await?;
        Ok(Outcome::command("CREATE ROLE"))
    }

    /// ALTER USER.
    async fn alter_user(&self, name: String, options: UserOptions) -> Result<Outcome> {
        let own_password =
            self.user.as_deref() == Some(name.as_str()) && options.superuser.is_none();
        if !own_password {
            self.require_superuser("ALTER USER (except a user's own password)")?;
        }
        let verifier = match &options.password {
            Some(p) => Some(ScramVerifier::new(valid_password(p)?).to_string()),
            None => None,
        };
        self.catalog
            .commit(|state| {
                let user = state
                    .users
                    .get_mut(&name)
                    .ok_or_else(|| undefined_user(&name))?;
                if let Some(v) = &verifier {
                    user.verifier = v.clone();
                }
                if let Some(s) = options.superuser {
                    user.superuser = s;
                }
                Ok(())
            })
            .await?;
        Ok(Outcome::command("ALTER ROLE"))
    }

    /// ALTER USER … SET.
    async fn alter_user_setting(
        &self,
        name: String,
        setting: Option<String>,
        value: Option<String>,
    ) -> Result<Outcome> {
        self.require_superuser("ALTER USER … SET")?;
        // Checked as SET would check it; kept as given.
        let checked = match (&setting, &value) {
            (Some(setting), Some(value)) => {
                let known = crate::session::settings::setting_name(setting)?;
                Some((
                    known,
                    crate::session::settings::checked_value(
                        self.node.resources(),
                        known,
                        value.clone(),
                    )?,
                ))
            }
            (Some(setting), None) => {
                crate::session::settings::setting_name(setting)?;
                None
            }
            (None, _) => None,
        };
        self.catalog
            .commit(|state| {
                let user = state
                    .users
                    .get_mut(&name)
                    .ok_or_else(|| undefined_user(&name))?;
                match (&checked, &setting) {
                    (Some((known, value)), _) => {
                        user.settings.insert(known.to_string(), value.clone());
                    }
                    (None, Some(setting)) => {
                        user.settings.remove(&setting.to_ascii_lowercase());
                    }
                    (None, None) => user.settings.clear(),
                }
                Ok(())
            })
            .await?;
        Ok(Outcome::command("ALTER ROLE"))
    }

    /// DROP USER.
    async fn drop_users(&self, names: Vec<String>, if_exists: bool) -> Result<Outcome> {
        self.require_superuser("DROP USER")?;
        if let Some(me) = &self.user
            && names.contains(me)
        {
            return Err(CirroError::new(
                SqlState::INSUFFICIENT_PRIVILEGE,
                "current user cannot be dropped",
            ));
        }
        let mut missing = Vec::new();
        self.catalog
            .commit(|state| {
                missing.clear();
                for name in &names {
                    if state.users.remove(name).is_none() {
                        if !if_exists {
                            return Err(undefined_user(name));
                        }
                        missing.push(name.clone());
                    }
                    // Grants go with the user; tables it owns stay
                    // (superusers can still reach them).
                    for db in state.databases.values_mut() {
                        for schema in db.schemas.values_mut() {
                            for table in schema.tables.values_mut() {
                                table.grants.remove(name);
                            }
                        }
                    }
                }
                Ok(())
            })
            .await?;
        Ok(match missing.first() {
            Some(name) => Outcome::with_notice(
                "DROP ROLE",
                format!("role \"{name}\" does not exist, skipping"),
            ),
            None => Outcome::command("DROP ROLE"),
        })
    }

    /// GRANT and REVOKE on tables.
    async fn grant(
        &self,
        privileges: std::collections::BTreeSet<Privilege>,
        tables: Vec<TableReference>,
        users: Vec<String>,
        revoke: bool,
    ) -> Result<Outcome> {
        let targets: Vec<_> = tables.iter().map(|t| self.resolve(t)).collect();
        let what = if revoke { "REVOKE" } else { "GRANT" };
        for (db, schema, name) in &targets {
            self.check_owner(db, schema, name, &format!("{what} on it"))?;
        }
        self.catalog
            .commit(|state| {
                for user in &users {
                    if !state.users.contains_key(user) {
                        return Err(undefined_user(user));
                    }
                }
                for (db, schema, name) in &targets {
                    let entry = state
                        .schema_mut(db, schema)?
                        .tables
                        .get_mut(name)
                        .ok_or_else(|| {
                            CirroError::new(
                                SqlState::UNDEFINED_TABLE,
                                format!("relation \"{name}\" does not exist"),
                            )
                        })?;
                    for user in &users {
                        let granted = entry.grants.entry(user.clone()).or_default();
                        if revoke {
                            granted.retain(|p| !privileges.contains(p));
                        } else {
                            granted.extend(privileges.iter().copied());
                        }
                        if granted.is_empty() {
                            entry.grants.remove(user);
                        }
                    }
                }
                Ok(())
            })
            .await?;
        Ok(Outcome::command(what))
    }

    /// GRANT and REVOKE of roles.
    async fn grant_role(
        &self,
        roles: Vec<String>,
        users: Vec<String>,
        revoke: bool,
    ) -> Result<Outcome> {
        let what = if revoke { "REVOKE" } else { "GRANT" };
        self.require_superuser(&format!("{what} of a role"))?;
        for role in &roles {
            if !PREDEFINED_ROLES.contains(&role.as_str()) {
                return Err(CirroError::new(
                    SqlState::UNDEFINED_OBJECT,
                    format!(
                        "role \"{role}\" does not exist (the roles that can be granted: {})",
                        PREDEFINED_ROLES.join(", ")
                    ),
                ));
            }
        }
        self.catalog
            .commit(|state| {
                for name in &users {
                    let user = state
                        .users
                        .get_mut(name)
                        .ok_or_else(|| undefined_user(name))?;
                    for role in &roles {
                        if revoke {
                            user.roles.remove(role);
                        } else {
                            user.roles.insert(role.clone());
                        }
                    }
                }
                Ok(())
            })
            .await?;
        Ok(Outcome::command(if revoke {
            "REVOKE ROLE"
        } else {
            "GRANT ROLE"
        }))
    }
}

/// Create the first superuser of a data location that has no users yet;
/// return whether it was created (an existing user is never changed).
pub async fn bootstrap_superuser(
    catalog: &cirro_catalog::Catalog,
    name: &str,
    password: &str,
) -> Result<bool> {
    let verifier = ScramVerifier::new(valid_password(password)?).to_string();
    let mut created = false;
    catalog
        .commit(|state| {
            created = state.users.is_empty();
            if created {
                state.users.insert(
                    name.to_string(),
                    UserEntry {
                        verifier: verifier.clone(),
                        superuser: true,
                        created_ms: cirro_catalog::state::now_ms(),
                        settings: Default::default(),
                        roles: Default::default(),
                    },
                );
            }
            Ok(())
        })
        .await?;
    Ok(created)
}
