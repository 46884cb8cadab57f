//! `SET [SESSION|LOCAL] name {= | TO} value`, `SET TIME ZONE value`,
//! `SHOW name | ALL`, `RESET name | ALL`, and `SET TRANSACTION modes` /
//! `SET SESSION CHARACTERISTICS AS TRANSACTION modes` (see
//! `transaction.rs`).
//!
//! Cirro's own settings are named `cirro.*`. Names are not checked here: the session knows its settings (and says
//! 42704 for an unknown one). `SET` of a dotted name (`datafusion.execution.…`)
//! and DataFusion's own `SHOW TABLES|COLUMNS|FUNCTIONS|…` are left to
//! DataFusion's parser (None); `SHOW` and `RESET` of a dotted name are the
//! session's.

use cirro_common::Result;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::words::{Words, syntax};

#[derive(Debug, Clone, PartialEq)]
pub enum SettingStatement {
    /// A name (lower case) and its value as written (unquoted).
    Set(String, String),
    /// One setting, or all (None).
    Reset(Option<String>),
    Show(String),
    ShowAll,
    /// `SET TRANSACTION modes` (the transaction in progress) or, with
    /// `session`, `SET SESSION CHARACTERISTICS AS TRANSACTION modes` (the
    /// defaults of the session's transactions).
    TransactionModes {
        session: bool,
        modes: super::transaction::TransactionModes,
    },
}

/// What `SHOW` is followed by when DataFusion answers it.
const DATAFUSION_SHOW: &[&str] = &[
    "tables",
    "columns",
    "functions",
    "create",
    "full",
    "extended",
    "databases",
    "schemas",
    "views",
    "variables",
    "status",
];

/// Parse `tokens` if they are a SET/SHOW/RESET of a session setting.
pub(crate) fn parse(tokens: &[Token]) -> Result<Option<SettingStatement>> {
    let mut words = Words::new(tokens);
    let (set, show) = (words.word_at(0, "set"), words.word_at(0, "show"));
    if !(set || show || words.word_at(0, "reset")) {
        return Ok(None);
    }
    words.at = 1;
    if set && words.keywords(&["session", "characteristics"]) {
        if !words.keywords(&["as", "transaction"]) {
            return Err(syntax(
                "syntax error: expected SET SESSION CHARACTERISTICS AS TRANSACTION modes",
            ));
        }
        let modes = super::transaction::modes(&mut words)?;
        return Ok(Some(SettingStatement::TransactionModes {
            session: true,
            modes,
        }));
    }
    if set
        && (words.word_at(0, "transaction")
            || ((words.word_at(0, "session") || words.word_at(0, "local"))
                && words.word_at(1, "transaction")))
    {
        words.keyword("session");
        words.keyword("local");
        words.keyword("transaction");
        if words.word_at(0, "snapshot") {
            return Err(cirro_common::CirroError::unsupported(
                "SET TRANSACTION SNAPSHOT is not supported",
            ));
        }
        let modes = super::transaction::modes(&mut words)?;
        return Ok(Some(SettingStatement::TransactionModes {
            session: false,
            modes,
        }));
    }
    // `SET SESSION name …` and `SET LOCAL name …`.
    if set && !words.keyword("session") {
        words.keyword("local");
    }
    if show && DATAFUSION_SHOW.iter().any(|w| words.word_at(0, w)) {
        return Ok(None);
    }
    // The name: one word or `TIME ZONE`.
    let mut name = if words.keywords(&["time", "zone"]) {
        "timezone".to_string()
    } else if show && words.keywords(&["transaction", "isolation", "level"]) {
        "transaction_isolation".to_string()
    } else {
        match words.peek() {
            Some(Token::Word(w)) => {
                words.at += 1;
                w.value.to_ascii_lowercase()
            }
            _ => return Ok(None),
        }
    };
    if name == "cirro" && words.token(&Token::Period) {
        name = format!("cirro.{}", words.ident("a setting name")?);
    }
    if words.peek() == Some(&Token::Period) {
        if set {
            return Ok(None); // SET datafusion.* and other dotted names
        }
        // SHOW and RESET of an option of DataFusion or of an extension
        // (`cirro_join_order.prerun_keys`, `distributed.compression`): the
        // session answers them from its options, which DataFusion's own
        // SHOW and RESET do not find for extensions.
        while words.token(&Token::Period) {
            name = format!(
                "{name}.{}",
                words.ident("a setting name")?.to_ascii_lowercase()
            );
        }
    }
    if show {
        words.end()?;
        return Ok(Some(if name == "all" {
            SettingStatement::ShowAll
        } else {
            SettingStatement::Show(name)
        }));
    }
    if !set {
        words.end()?;
        return Ok(Some(SettingStatement::Reset(
            (name != "all").then_some(name),
        )));
    }
    if !(words.token(&Token::Eq) || words.keyword("to")) && name != "timezone" {
        return Err(syntax(format!(
            "syntax error: expected SET {name} = value or SET {name} TO value"
        )));
    }
    let value = words
        .rest()
        .iter()
        .map(|t| match t {
            Token::SingleQuotedString(s) => s.clone(),
            Token::Word(w) => w.value.clone(),
            other => other.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" , ", ", ");
    if value.is_empty() {
        return Err(syntax(format!("SET {name} needs a value")));
    }
    Ok(Some(SettingStatement::Set(name, value)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::transaction::{Isolation, TransactionModes};
    use crate::tests::solid;

    #[test]
    fn parses_settings() {
        let parse_sql = |sql: &str| parse(&solid(sql)).expect("parse");
        assert_eq!(
            parse_sql("SET DateStyle TO 'ISO, MDY'"),
            Some(SettingStatement::Set("datestyle".into(), "ISO, MDY".into()))
        );
        assert_eq!(
            parse_sql("set time zone 'UTC'"),
            Some(SettingStatement::Set("timezone".into(), "UTC".into()))
        );
        assert_eq!(
            parse_sql("SET SESSION statement_timeout = 100"),
            Some(SettingStatement::Set(
                "statement_timeout".into(),
                "100".into()
            ))
        );
        assert_eq!(
            parse_sql("show transaction isolation level"),
            Some(SettingStatement::Show("transaction_isolation".into()))
        );
        assert_eq!(parse_sql("SHOW ALL"), Some(SettingStatement::ShowAll));
        assert_eq!(parse_sql("RESET ALL"), Some(SettingStatement::Reset(None)));
        assert_eq!(
            parse_sql("SHOW cirro_join_order.Prerun_Keys"),
            Some(SettingStatement::Show(
                "cirro_join_order.prerun_keys".into()
            ))
        );
        assert_eq!(
            parse_sql("RESET datafusion.execution.batch_size"),
            Some(SettingStatement::Reset(Some(
                "datafusion.execution.batch_size".into()
            )))
        );
        assert_eq!(parse_sql("SET datafusion.execution.batch_size = 1"), None);
        assert_eq!(
            parse_sql("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
            Some(SettingStatement::TransactionModes {
                session: false,
                modes: TransactionModes {
                    isolation: Some(Isolation::Serializable),
                    ..Default::default()
                }
            })
        );
        assert_eq!(
            parse_sql("SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE"),
            Some(SettingStatement::TransactionModes {
                session: true,
                modes: TransactionModes {
                    read_only: Some(false),
                    ..Default::default()
                }
            })
        );
        assert!(parse(&solid("SET TRANSACTION ISOLATION LEVEL SNAPSHOT")).is_err());
        assert_eq!(parse_sql("SET datafusion.execution.batch_size = 10"), None);
        assert_eq!(parse_sql("SHOW TABLES"), None);
        assert_eq!(
            parse_sql("show cirro.Parses"),
            Some(SettingStatement::Show("cirro.parses".into()))
        );
        assert_eq!(parse_sql("SELECT 1"), None);
        assert!(parse(&solid("SET x")).is_err());
    }
}
