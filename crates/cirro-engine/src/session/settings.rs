//! Session settings: the PostgreSQL ones clients set and read (`SET
//! DateStyle`, `SHOW server_version`, `current_setting(…)`, ParameterStatus
//! reports), Cirro's own (`cirro.*`), and DataFusion's (`datafusion.*`, kept
//! by DataFusion). `SHOW ALL` lists all three; `docs/configuration.md`
//! documents them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow::array::{ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use cirro_common::{CirroError, Result, SqlState};
use cirro_sql::SettingStatement;
use datafusion::config::{ConfigEntry, ConfigOptions};

use crate::{Engine, Outcome};

/// The server_version clients see: PostgreSQL 16's protocol and catalog.
pub const SERVER_VERSION: &str = "16.6";

/// Settings clients set and read, with their defaults. Only these are
/// accepted (42704 otherwise); `datafusion.*` settings go to the engine.
const SETTINGS: &[(&str, &str)] = &[
    ("adaptive_aggregation", "on"),
    ("aggregation_exchange", "auto"),
    ("application_name", ""),
    ("bytea_output", "hex"),
    ("cache", "on"),
    ("client_encoding", "UTF8"),
    ("client_min_messages", "notice"),
    ("datestyle", "ISO, MDY"),
    ("default_table_access_method", "heap"),
    ("default_transaction_isolation", "read committed"),
    ("default_transaction_read_only", "off"),
    ("extra_float_digits", "1"),
    ("gpu", "on"),
    ("integer_datetimes", "on"),
    ("intervalstyle", "postgres"),
    ("jit", "on"),
    ("join_order", "on"),
    ("lc_messages", "C"),
    ("lc_monetary", "C"),
    ("lc_numeric", "C"),
    ("lc_time", "C"),
    ("max_identifier_length", "63"),
    ("memory_limit", "default"),
    ("priority", "0"),
    ("search_path", "\"$user\", public"),
    ("server_encoding", "UTF8"),
    ("server_version", SERVER_VERSION),
    ("server_version_num", "160006"),
    ("spill_join", "on"),
    ("standard_conforming_strings", "on"),
    ("statement_timeout", "0"),
    ("synchronous_commit", "on"),
    ("timezone", "UTC"),
    ("transaction_isolation", "read committed"),
    ("transaction_read_only", "off"),
];

/// The highest priority in the admission queue (and minus the lowest).
const PRIORITY_MAX: i32 = 1000;

/// Settings whose changes PostgreSQL reports to the client (GUC_REPORT).
const REPORTED: &[(&str, &str)] = &[
    ("application_name", "application_name"),
    ("client_encoding", "client_encoding"),
    ("datestyle", "DateStyle"),
    ("intervalstyle", "IntervalStyle"),
    ("standard_conforming_strings", "standard_conforming_strings"),
    ("timezone", "TimeZone"),
];

/// A session's changes to the SETTINGS defaults, over its user's own
/// defaults (`ALTER USER name SET setting = value`).
#[derive(Clone, Default)]
pub(crate) struct Settings {
    session: Arc<Mutex<BTreeMap<&'static str, String>>>,
    user: Arc<Mutex<BTreeMap<&'static str, String>>>,
}

impl Settings {
    /// Set a known setting for the rest of the session.
    pub(crate) fn set(&self, name: &'static str, value: String) {
        if let Ok(mut settings) = self.session.lock() {
            settings.insert(name, value);
        }
    }

    /// The value in force of a known setting.
    pub(crate) fn get(&self, name: &'static str) -> String {
        self.session
            .lock()
            .ok()
            .and_then(|s| s.get(name).cloned())
            .unwrap_or_else(|| self.default_of(name))
    }

    /// What RESET returns a setting to: the user's default, else the
    /// server's.
    fn default_of(&self, name: &'static str) -> String {
        self.user
            .lock()
            .ok()
            .and_then(|s| s.get(name).cloned())
            .or_else(|| {
                SETTINGS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            })
            .unwrap_or_default()
    }
}

/// Cirro's read-only session counters, shown by `SHOW cirro.<name>`.
pub(crate) const COUNTERS: &[(&str, &str)] = &[
    (
        "cirro.parses",
        "times a parser ran over a statement of this session",
    ),
    (
        "cirro.plans",
        "statements of this session planned (SQL to a logical plan)",
    ),
    (
        "cirro.by_key",
        "rows of this session's statements computed without DataFusion's planner: a row \
         found by its primary key, or VALUES (see --row-store)",
    ),
    (
        "cirro.compiled",
        "executions of this session's prepared statements run from the form compiled at \
         their first execution (a point read or small write by key), without a plan",
    ),
];

pub(crate) fn setting_name(name: &str) -> Result<&'static str> {
    let lower = name.to_ascii_lowercase();
    SETTINGS
        .iter()
        .find(|(n, _)| *n == lower)
        .map(|(n, _)| *n)
        .ok_or_else(|| unknown_setting(name))
}

fn unknown_setting(name: &str) -> CirroError {
    CirroError::new(
        SqlState::UNDEFINED_OBJECT,
        format!("unrecognized configuration parameter \"{name}\""),
    )
}

/// Every DataFusion option of a session under the name SET takes:
/// DataFusion's own (`datafusion.execution.batch_size`) and each
/// extension's under its namespace (`cirro_join_order.prerun_keys`,
/// `distributed.compression`). DataFusion's `entries()` lists an
/// extension's options by their bare names, which SET, SHOW and RESET do
/// not take.
pub(crate) fn option_entries(options: &ConfigOptions) -> Vec<ConfigEntry> {
    let mut entries: Vec<ConfigEntry> = options
        .entries()
        .into_iter()
        .filter(|e| e.key.starts_with("datafusion."))
        .collect();
    for (prefix, extension) in options.extensions.iter() {
        entries.extend(extension.entries().into_iter().map(|mut e| {
            if !e.key.starts_with(&format!("{prefix}.")) {
                e.key = format!("{prefix}.{}", e.key);
            }
            e
        }));
    }
    entries
}

/// `options` with the option `key` (None: every option) back at its value
/// in `initial`: `initial` with every other option the session changed
/// set again. (DataFusion's own RESET knows only `datafusion.*` and
/// resets to DataFusion's defaults, not the session's.)
fn reset_options(
    initial: &ConfigOptions,
    current: &ConfigOptions,
    key: Option<&str>,
) -> Result<ConfigOptions> {
    let mut reset = initial.clone();
    let Some(key) = key else {
        return Ok(reset);
    };
    let before: BTreeMap<String, Option<String>> = option_entries(initial)
        .into_iter()
        .map(|e| (e.key, e.value))
        .collect();
    let mut known = false;
    for entry in option_entries(current) {
        if entry.key.eq_ignore_ascii_case(key) {
            known = true;
            continue;
        }
        if let Some(value) = entry.value
            && before.get(&entry.key) != Some(&Some(value.clone()))
        {
            reset.set(&entry.key, &value)?;
        }
    }
    if !known {
        return Err(unknown_setting(key));
    }
    Ok(reset)
}

/// A statement_timeout value: milliseconds, or a number with a unit.
pub(crate) fn parse_timeout(value: &str) -> Result<Duration> {
    let text = value.trim().to_ascii_lowercase();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let bad = || {
        CirroError::new(
            SqlState::INVALID_PARAMETER_VALUE,
            format!("invalid value for parameter \"statement_timeout\": \"{value}\""),
        )
    };
    let number: f64 = number.parse().map_err(|_| bad())?;
    let ms = match unit.trim() {
        "" | "ms" => number,
        "s" => number * 1e3,
        "min" => number * 60e3,
        "h" => number * 3600e3,
        "d" => number * 86_400e3,
        _ => return Err(bad()),
    };
    if !(0.0..=i32::MAX as f64).contains(&ms) {
        return Err(bad());
    }
    Ok(Duration::from_millis(ms as u64))
}

impl Engine {
    /// The memory limit of the session's next statement in bytes (`SET
    /// memory_limit`, else the server's default).
    pub fn memory_limit(&self) -> usize {
        let resources = self.node.resources();
        resources
            .parse_query_memory(&self.settings.get("memory_limit"))
            .unwrap_or_else(|_| resources.query_memory())
    }

    /// Start a statement: the memory its operators reserve from now on is
    /// counted in a pool of its own, of the session's memory limit.
    pub(crate) fn begin_query(&self) -> Arc<cirro_exec::resources::QueryMemory> {
        let limit = self.memory_limit();
        // The statement's id and limit go with its tasks: every node counts
        // them in one pool of this limit (see `QueryPools`).
        let id = cirro_exec::resources::new_query_id();
        let state = self.context().state_ref();
        let mut state = state.write();
        cirro_exec::resources::set_query_options(
            state.config_mut().options_mut(),
            Some(&id),
            limit,
        );
        drop(state);
        let memory = self.memory.begin(limit);
        self.node.resources().pools().register(&id, &memory);
        memory
    }

    /// The pool of the statement started last.
    pub fn query_memory(&self) -> Arc<cirro_exec::resources::QueryMemory> {
        self.memory.current()
    }

    /// The statement timeout in force (None: no limit).
    pub fn statement_timeout(&self) -> Option<Duration> {
        parse_timeout(&self.settings.get("statement_timeout"))
            .ok()
            .filter(|d| !d.is_zero())
    }

    /// Take the session user's defaults (`ALTER USER … SET`): the values
    /// SHOW gives and RESET returns to until the session sets its own.
    /// Values the server no longer accepts are skipped with a warning.
    pub(crate) fn apply_user_settings(&self) {
        let Some(user) = self.user.as_deref() else {
            return;
        };
        let Some(entry) = self.catalog.snapshot().users.get(user).cloned() else {
            return;
        };
        for (name, value) in entry.settings {
            let checked = setting_name(&name)
                .and_then(|n| Ok((n, checked_value(self.node.resources(), n, value)?)));
            match checked {
                Ok((name, value)) => {
                    if let Err(e) = self.apply_setting(name, &value) {
                        log::warn!("user {user}'s setting {name}: {e}");
                        continue;
                    }
                    if let Ok(mut defaults) = self.settings.user.lock() {
                        defaults.insert(name, value);
                    }
                }
                Err(e) => log::warn!("user {user}'s setting {name} is skipped: {e}"),
            }
        }
    }

    /// A read-only setting: a counter or a flag of the process.
    fn read_only_value(&self, name: &str) -> Option<String> {
        use std::sync::atomic::Ordering;
        match name {
            "cirro.parses" => Some(self.counters.parses.load(Ordering::Relaxed).to_string()),
            "cirro.plans" => Some(self.counters.plans.load(Ordering::Relaxed).to_string()),
            "cirro.by_key" => Some(self.counters.by_key.load(Ordering::Relaxed).to_string()),
            "cirro.compiled" => Some(self.counters.compiled.load(Ordering::Relaxed).to_string()),
            _ => self
                .flags
                .iter()
                .find(|f| f.name == name)
                .map(|f| f.value.clone()),
        }
    }

    /// Hand a setting that steers planning to the engine: `cache` is the
    /// hot-data tier's switch in the session's DataFusion options,
    /// `adaptive_aggregation` the aggregation rule's, `aggregation_exchange`
    /// the cluster's aggregation exchange's, `jit` the compiling
    /// rule's, `join_order` the join ordering rule's, `spill_join` the
    /// spilling hash join's.
    fn apply_setting(&self, name: &str, value: &str) -> Result<()> {
        let (key, value) = match name {
            "adaptive_aggregation" => ("cirro_aggregation.mode", value),
            "aggregation_exchange" => ("cirro_aggregation.exchange", value),
            "jit" => ("cirro_jit.mode", value),
            #[cfg(feature = "gpu")]
            "gpu" => ("cirro_gpu.mode", value),
            "join_order" => ("cirro_join_order.mode", value),
            "spill_join" => ("cirro_join_order.spill", value),
            "cache" => (
                "cirro_cache.enabled",
                if value == "on" { "true" } else { "false" },
            ),
            _ => return Ok(()),
        };
        self.context()
            .state_ref()
            .write()
            .config_mut()
            .options_mut()
            .set(key, value)?;
        Ok(())
    }

    /// The value of a setting as SHOW gives it, or 42704.
    pub(crate) fn setting_value(&self, name: &str) -> Result<String> {
        if let Some(value) = self.read_only_value(name) {
            return Ok(value);
        }
        if name.contains('.') {
            let state = self.context().state();
            return option_entries(state.config().options())
                .into_iter()
                .find(|e| e.key.eq_ignore_ascii_case(name))
                .map(|e| e.value.unwrap_or_default())
                .ok_or_else(|| unknown_setting(name));
        }
        let name = setting_name(name)?;
        if name == "memory_limit" {
            return Ok(cirro_exec::resources::format_bytes(self.memory_limit()));
        }
        if name == "transaction_isolation" {
            return Ok(self.transaction_isolation().name().to_string());
        }
        if name == "transaction_read_only" {
            let on = self.transaction_read_only();
            return Ok(if on { "on" } else { "off" }.to_string());
        }
        Ok(self.settings.get(name))
    }

    /// Run a SET/SHOW/RESET; changes of reported settings come back as the
    /// command's `reports` (ParameterStatus on the PostgreSQL protocol).
    pub(crate) async fn run_setting(&self, statement: SettingStatement) -> Result<Outcome> {
        let reported = |name: &str, value: String| {
            REPORTED
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, shown)| (shown.to_string(), value))
        };
        let command = |tag: &str, reports: Vec<(String, String)>| Outcome::Command {
            tag: tag.to_string(),
            notice: None,
            reports,
        };
        match statement {
            SettingStatement::Set(name, value) => {
                if self.read_only_value(&name).is_some() {
                    return Err(read_only(&name));
                }
                let name = setting_name(&name)?;
                let value = checked_value(self.node.resources(), name, value)?;
                if name == "transaction_isolation" {
                    // The open transaction's level, as SET TRANSACTION.
                    let modes = cirro_sql::TransactionModes {
                        isolation: cirro_sql::Isolation::from_name(&value),
                        ..Default::default()
                    };
                    return self.set_transaction_modes(false, modes);
                }
                if name == "transaction_read_only" {
                    let modes = cirro_sql::TransactionModes {
                        read_only: Some(value == "on"),
                        ..Default::default()
                    };
                    return self.set_transaction_modes(false, modes);
                }
                if name == "priority" && !self.superuser_check().holds() {
                    let own = self.settings.default_of("priority");
                    if value.parse::<i32>().ok() > own.parse::<i32>().ok() {
                        return Err(CirroError::new(
                            SqlState::INSUFFICIENT_PRIVILEGE,
                            format!(
                                "permission denied to raise priority above {own}: only a superuser may (ALTER USER … SET priority)"
                            ),
                        ));
                    }
                }
                if let Ok(mut settings) = self.settings.session.lock() {
                    settings.insert(name, value.clone());
                }
                self.apply_setting(name, &value)?;
                Ok(command("SET", reported(name, value).into_iter().collect()))
            }
            SettingStatement::Reset(Some(name)) if name.contains('.') => {
                if self.read_only_value(&name).is_some() {
                    return Err(read_only(&name));
                }
                let state = self.context().state_ref();
                let mut state = state.write();
                let reset =
                    reset_options(&self.initial_options, state.config().options(), Some(&name))?;
                *state.config_mut().options_mut() = reset;
                Ok(command("RESET", Vec::new()))
            }
            SettingStatement::Reset(name) => {
                if name.is_none() {
                    // RESET ALL: DataFusion's and the extensions' options
                    // too; the settings below are then applied again.
                    let reset = reset_options(&self.initial_options, &self.initial_options, None)?;
                    *self
                        .context()
                        .state_ref()
                        .write()
                        .config_mut()
                        .options_mut() = reset;
                    for (n, _) in SETTINGS {
                        let value = self.settings.default_of(n);
                        self.apply_setting(n, &value)?;
                    }
                }
                let name = name.map(|n| setting_name(&n)).transpose()?;
                let mut report = Vec::new();
                if let Ok(mut settings) = self.settings.session.lock() {
                    let names: Vec<&'static str> = match name {
                        Some(n) => vec![n],
                        None => settings.keys().copied().collect(),
                    };
                    for n in names {
                        settings.remove(n);
                        let default = self.settings.default_of(n);
                        self.apply_setting(n, &default)?;
                        report.extend(reported(n, default));
                    }
                }
                Ok(command("RESET", report))
            }
            SettingStatement::Show(name) => {
                let value = self.setting_value(&name)?;
                let schema = Arc::new(Schema::new(vec![Field::new(&name, DataType::Utf8, false)]));
                let column: ArrayRef = Arc::new(StringArray::from(vec![value]));
                self.batch_rows(RecordBatch::try_new(schema, vec![column])?)
                    .await
            }
            SettingStatement::ShowAll => {
                let mut rows: Vec<(String, String, String)> = SETTINGS
                    .iter()
                    .map(|(n, _)| {
                        let value = self.setting_value(n).unwrap_or_default();
                        (n.to_string(), value, String::new())
                    })
                    .collect();
                for (name, description) in COUNTERS {
                    let value = self.read_only_value(name).unwrap_or_default();
                    rows.push((name.to_string(), value, description.to_string()));
                }
                for flag in self.flags.iter() {
                    rows.push((
                        flag.name.to_string(),
                        flag.value.clone(),
                        flag.description.to_string(),
                    ));
                }
                let state = self.context().state();
                for entry in option_entries(state.config().options()) {
                    rows.push((
                        entry.key,
                        entry.value.unwrap_or_default(),
                        entry.description.to_string(),
                    ));
                }
                let column = |f: fn(&(String, String, String)) -> &str| -> ArrayRef {
                    Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
                };
                let columns = vec![column(|r| &r.0), column(|r| &r.1), column(|r| &r.2)];
                self.batch_rows(RecordBatch::try_new(show_all_schema(), columns)?)
                    .await
            }
            SettingStatement::TransactionModes { session, modes } => {
                self.set_transaction_modes(session, modes)
            }
        }
    }
}

fn read_only(name: &str) -> CirroError {
    CirroError::new(
        SqlState::INSUFFICIENT_PRIVILEGE,
        format!("parameter \"{name}\" cannot be changed"),
    )
}

/// The value to keep for `SET name = value`, or why it is refused.
pub(crate) fn checked_value(
    resources: &cirro_exec::resources::Resources,
    name: &'static str,
    value: String,
) -> Result<String> {
    match name {
        // (`SET priority = -5` comes as "- 5".)
        "priority" => match value.split_whitespace().collect::<String>().parse::<i32>() {
            Ok(p) if (-PRIORITY_MAX..=PRIORITY_MAX).contains(&p) => Ok(p.to_string()),
            _ => Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!(
                    "invalid value for parameter \"priority\": \"{value}\" (a whole number from -{PRIORITY_MAX} to {PRIORITY_MAX}; higher is admitted first)"
                ),
            )),
        },
        "statement_timeout" => {
            parse_timeout(&value)?;
            Ok(value)
        }
        "default_transaction_isolation" | "transaction_isolation" => {
            let level = cirro_sql::Isolation::from_name(&value).ok_or_else(|| {
                CirroError::new(
                    SqlState::INVALID_PARAMETER_VALUE,
                    format!(
                        "invalid value for parameter \"{name}\": \"{value}\" (read committed, \
                         repeatable read; read uncommitted runs as read committed)"
                    ),
                )
            })?;
            Ok(crate::session::txn::supported_isolation(level)?
                .name()
                .to_string())
        }
        "memory_limit" => {
            let bytes = resources.parse_query_memory(&value)?;
            Ok(cirro_exec::resources::format_bytes(bytes))
        }
        "cache"
        | "join_order"
        | "spill_join"
        | "default_transaction_read_only"
        | "transaction_read_only" => match value.to_ascii_lowercase().as_str() {
            "on" | "true" | "1" | "yes" => Ok("on".to_string()),
            "off" | "false" | "0" | "no" => Ok("off".to_string()),
            _ => Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("invalid value for parameter \"{name}\": \"{value}\" (on or off)"),
            )),
        },
        // With the row store: off answers a small write's COMMIT before its
        // log record is synced (within 200 ms); PostgreSQL's other values
        // wait for the sync, as `on` does (there are no standbys).
        "synchronous_commit" => match value.to_ascii_lowercase().as_str() {
            "on" | "true" | "1" | "yes" | "local" | "remote_write" | "remote_apply" => {
                Ok(value.to_ascii_lowercase())
            }
            "off" | "false" | "0" | "no" => Ok("off".to_string()),
            _ => Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!(
                    "invalid value for parameter \"{name}\": \"{value}\" (on, off, local, \
                     remote_write or remote_apply)"
                ),
            )),
        },
        "aggregation_exchange" => match value.to_ascii_lowercase().as_str() {
            v @ ("auto" | "partial" | "rows") => Ok(v.to_string()),
            _ => Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!(
                    "invalid value for parameter \"{name}\": \"{value}\" (auto, partial or rows)"
                ),
            )),
        },
        "adaptive_aggregation" | "jit" | "gpu" => match value.to_ascii_lowercase().as_str() {
            "on" | "true" | "1" | "yes" => Ok("on".to_string()),
            "off" | "false" | "0" | "no" => Ok("off".to_string()),
            "force" => Ok("force".to_string()),
            _ => Err(CirroError::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("invalid value for parameter \"{name}\": \"{value}\" (off, on or force)"),
            )),
        },
        "client_encoding" => {
            let v = value.to_ascii_uppercase().replace('-', "");
            if v != "UTF8" && v != "UNICODE" {
                return Err(CirroError::unsupported(format!(
                    "client_encoding {value} is not supported: the server speaks UTF8"
                )));
            }
            Ok("UTF8".to_string())
        }
        "server_version"
        | "server_version_num"
        | "server_encoding"
        | "integer_datetimes"
        | "max_identifier_length" => Err(read_only(name)),
        _ => Ok(value),
    }
}

fn show_all_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("setting", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
    ]))
}

/// The columns a SET/SHOW/RESET returns (None: a command).
pub(crate) fn setting_schema(statement: &SettingStatement) -> Option<SchemaRef> {
    match statement {
        SettingStatement::Show(name) => Some(Arc::new(Schema::new(vec![Field::new(
            name,
            DataType::Utf8,
            false,
        )]))),
        SettingStatement::ShowAll => Some(show_all_schema()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_take_units() {
        assert_eq!(
            parse_timeout("1500").expect("ms"),
            Duration::from_millis(1500)
        );
        assert_eq!(parse_timeout("2s").expect("s"), Duration::from_secs(2));
        assert!(parse_timeout("soon").is_err());
        assert!(setting_name("no_such_thing").is_err());
        assert_eq!(setting_name("DateStyle").expect("known"), "datestyle");
    }
}

#[cfg(test)]
mod show_all {
    use std::sync::Arc;

    use arrow::array::AsArray;
    use futures::TryStreamExt;

    use crate::{Engine, EngineConfig, Flag, Outcome};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn show_all_lists_every_kind_of_setting() {
        let dir = tempfile::tempdir().expect("dir");
        let config = EngineConfig {
            flags: Arc::new(vec![Flag {
                name: "cirro.pg_port",
                value: "5433".into(),
                description: "PostgreSQL protocol port",
            }]),
            ..EngineConfig::default()
        };
        let engine = Engine::open(dir.path().to_str().expect("utf8"), config)
            .await
            .expect("open");
        engine
            .execute("SET statement_timeout = '2s'")
            .await
            .expect("set");
        let Outcome::Rows(stream) = engine.execute("SHOW ALL").await.expect("show all") else {
            panic!("no rows");
        };
        let batches: Vec<_> = stream.try_collect().await.expect("rows");
        let mut settings = std::collections::HashMap::new();
        for batch in &batches {
            let names = batch.column(0).as_string::<i32>();
            let values = batch.column(1).as_string::<i32>();
            for row in 0..batch.num_rows() {
                settings.insert(names.value(row).to_string(), values.value(row).to_string());
            }
        }
        assert_eq!(settings["statement_timeout"], "2s");
        assert_eq!(settings["server_version"], super::SERVER_VERSION);
        assert_eq!(settings["cirro.pg_port"], "5433");
        assert!(settings["cirro.parses"].parse::<u64>().expect("a count") >= 2);
        assert!(settings.contains_key("datafusion.execution.batch_size"));
        // An extension's options under its namespace, as SET takes them.
        assert_eq!(settings["cirro_join_order.prerun_keys"], "10000");
        assert!(!settings.contains_key("prerun_keys"));
        let err = engine
            .execute("SET cirro.pg_port = 1")
            .await
            .err()
            .expect("read-only");
        assert_eq!(err.state, cirro_common::SqlState::INSUFFICIENT_PRIVILEGE);
    }
}
