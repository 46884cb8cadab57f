//! `CREATE/ALTER USER|ROLE name [WITH] [PASSWORD 'p'] [SUPERUSER|NOSUPERUSER] [LOGIN]`,
//! `ALTER USER|ROLE name SET setting {TO|=} value|DEFAULT`, `ALTER USER|ROLE name
//! RESET setting|ALL` (the user's session defaults),
//! `DROP USER|ROLE [IF EXISTS] a, b`,
//! `GRANT|REVOKE privileges|ALL [PRIVILEGES] ON [TABLE] t, u TO|FROM a, b`.

use std::collections::BTreeSet;

use cirro_common::{CirroError, Privilege, Result};
use datafusion::common::TableReference;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::words::{Words, syntax};

/// A statement about users or privileges.
#[derive(Debug, Clone, PartialEq)]
pub enum AccessStatement {
    CreateUser {
        name: String,
        options: UserOptions,
    },
    AlterUser {
        name: String,
        options: UserOptions,
    },
    /// A user's session default: `SET setting = value` (both Some), `RESET
    /// setting` or `SET setting = DEFAULT` (value None), `RESET ALL` (both
    /// None).
    AlterUserSetting {
        name: String,
        setting: Option<String>,
        value: Option<String>,
    },
    DropUser {
        names: Vec<String>,
        if_exists: bool,
    },
    Grant {
        privileges: BTreeSet<Privilege>,
        tables: Vec<TableReference>,
        users: Vec<String>,
        revoke: bool,
    },
    /// `GRANT role TO user` / `REVOKE role FROM user`.
    GrantRole {
        roles: Vec<String>,
        users: Vec<String>,
        revoke: bool,
    },
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct UserOptions {
    pub password: Option<String>,
    pub superuser: Option<bool>,
}

/// Parse `tokens` if they are a user or privilege statement (None otherwise).
pub(crate) fn parse(tokens: &[Token]) -> Result<Option<AccessStatement>> {
    let mut words = Words::new(tokens);
    let role = |w: &mut Words| w.keyword("user") || w.keyword("role");
    let create = words.keyword("create");
    let statement = if create || words.keyword("alter") {
        if !role(&mut words) {
            return Ok(None);
        }
        let name = words.ident("a user name")?;
        if !create && (words.word_at(0, "set") || words.word_at(0, "reset")) {
            let statement = user_setting(&mut words, name)?;
            words.end()?;
            return Ok(Some(statement));
        }
        let options = user_options(&mut words)?;
        if create {
            AccessStatement::CreateUser { name, options }
        } else {
            AccessStatement::AlterUser { name, options }
        }
    } else if words.keyword("drop") {
        if !role(&mut words) {
            return Ok(None);
        }
        let if_exists = words.keywords(&["if", "exists"]);
        AccessStatement::DropUser {
            names: words.list(|w| w.ident("a user name"))?,
            if_exists,
        }
    } else if words.word_at(0, "grant") || words.word_at(0, "revoke") {
        let revoke = words.keyword("revoke");
        if !revoke {
            words.keyword("grant");
        }
        grant(&mut words, revoke)?
    } else {
        return Ok(None);
    };
    words.end()?;
    Ok(Some(statement))
}

fn grant(words: &mut Words, revoke: bool) -> Result<AccessStatement> {
    // `GRANT role [, …] TO user`: names, then TO (FROM) without ON.
    let start = words.at;
    if let Ok(roles) = words.list(|w| w.ident("a role name"))
        && words.keyword(if revoke { "from" } else { "to" })
        && !roles
            .iter()
            .any(|r| r.eq_ignore_ascii_case("all") || Privilege::parse(r).is_some())
    {
        return Ok(AccessStatement::GrantRole {
            roles,
            users: words.list(|w| w.ident("a user name"))?,
            revoke,
        });
    }
    words.at = start;
    let privileges = if words.keyword("all") {
        words.keyword("privileges");
        Privilege::ALL.into_iter().collect()
    } else {
        words
            .list(|w| {
                let word = w.ident("a privilege")?;
                Privilege::parse(&word).ok_or_else(|| {
                    CirroError::unsupported(format!(
                        "privilege {} is not supported (SELECT, INSERT, UPDATE, DELETE, ALL)",
                        word.to_uppercase()
                    ))
                })
            })?
            .into_iter()
            .collect()
    };
    if !words.keyword("on") {
        return Err(syntax("expected ON <table> after the privileges"));
    }
    words.keyword("table");
    let tables = words.list(Words::table)?;
    if !words.keyword(if revoke { "from" } else { "to" }) {
        return Err(syntax(if revoke {
            "expected FROM <user>"
        } else {
            "expected TO <user>"
        }));
    }
    Ok(AccessStatement::Grant {
        privileges,
        tables,
        users: words.list(|w| w.ident("a user name"))?,
        revoke,
    })
}

/// `SET setting {TO|=} value|DEFAULT`, `RESET setting|ALL` after `ALTER
/// USER name`.
fn user_setting(words: &mut Words, name: String) -> Result<AccessStatement> {
    if words.keyword("reset") {
        let setting = if words.keyword("all") {
            None
        } else {
            Some(words.ident("a setting name")?)
        };
        return Ok(AccessStatement::AlterUserSetting {
            name,
            setting,
            value: None,
        });
    }
    words.keyword("set");
    let setting = words.ident("a setting name")?;
    if !(words.keyword("to") || matches!(words.peek(), Some(Token::Eq))) {
        return Err(syntax("expected TO or = after the setting's name"));
    }
    if matches!(words.peek(), Some(Token::Eq)) {
        words.at += 1;
    }
    let negative = matches!(words.peek(), Some(Token::Minus));
    if negative {
        words.at += 1;
    }
    let value = match words.peek() {
        Some(Token::SingleQuotedString(s)) => s.clone(),
        Some(Token::Number(n, _)) => n.clone(),
        Some(Token::Word(w)) if !negative => w.value.clone(),
        _ => return Err(syntax("expected the setting's value")),
    };
    words.at += 1;
    let value = if negative { format!("-{value}") } else { value };
    let value = (!value.eq_ignore_ascii_case("default")).then_some(value);
    Ok(AccessStatement::AlterUserSetting {
        name,
        setting: Some(setting),
        value,
    })
}

fn user_options(words: &mut Words) -> Result<UserOptions> {
    words.keyword("with");
    let mut options = UserOptions::default();
    loop {
        if words.keyword("password") {
            if words.keyword("null") {
                return Err(CirroError::unsupported(
                    "a user without a password cannot log in; give a password",
                ));
            }
            options.password = Some(words.string("the password")?);
            continue;
        }
        match words.peek() {
            Some(Token::Word(w)) if w.quote_style.is_none() => {
                match w.value.to_ascii_uppercase().as_str() {
                    "SUPERUSER" => options.superuser = Some(true),
                    "NOSUPERUSER" => options.superuser = Some(false),
                    // Every user may log in.
                    "LOGIN" => {}
                    other => {
                        return Err(CirroError::unsupported(format!(
                            "user option {other} is not supported (PASSWORD, SUPERUSER, NOSUPERUSER, LOGIN)"
                        )));
                    }
                }
                words.at += 1;
            }
            _ => break,
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::solid;

    fn parse_sql(sql: &str) -> Result<Option<AccessStatement>> {
        parse(&solid(sql))
    }

    #[test]
    fn parses_user_and_grant_statements() {
        let create = parse_sql("CREATE USER alice WITH PASSWORD 'a''b' SUPERUSER").expect("parse");
        assert_eq!(
            create,
            Some(AccessStatement::CreateUser {
                name: "alice".into(),
                options: UserOptions {
                    password: Some("a'b".into()),
                    superuser: Some(true)
                }
            })
        );
        let setting = |sql: &str| match parse_sql(sql).expect("parse") {
            Some(AccessStatement::AlterUserSetting {
                name,
                setting,
                value,
            }) => (name, setting, value),
            other => panic!("{sql}: {other:?}"),
        };
        assert_eq!(
            setting("ALTER USER bob SET memory_limit = '64MB'"),
            (
                "bob".into(),
                Some("memory_limit".into()),
                Some("64MB".into())
            )
        );
        assert_eq!(
            setting("alter role bob set priority to -5"),
            ("bob".into(), Some("priority".into()), Some("-5".into()))
        );
        assert_eq!(
            setting("ALTER USER bob SET priority TO DEFAULT"),
            ("bob".into(), Some("priority".into()), None)
        );
        assert_eq!(
            setting("ALTER USER bob RESET ALL"),
            ("bob".into(), None, None)
        );
        assert!(parse_sql("ALTER USER bob SET priority 5").is_err());
        assert!(parse_sql("ALTER USER bob SET priority = 5 6").is_err());
        let grant = parse_sql("grant select, insert on table s.t, u to bob, \"Carol\"")
            .expect("parse")
            .expect("a statement");
        match grant {
            AccessStatement::Grant {
                privileges,
                tables,
                users,
                revoke,
            } => {
                assert!(!revoke);
                assert_eq!(
                    privileges.into_iter().collect::<Vec<_>>(),
                    vec![Privilege::Select, Privilege::Insert]
                );
                assert_eq!(
                    tables,
                    vec![TableReference::partial("s", "t"), TableReference::bare("u")]
                );
                assert_eq!(users, vec!["bob".to_string(), "Carol".to_string()]);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            parse_sql("REVOKE ALL PRIVILEGES ON t FROM bob").expect("parse"),
            Some(AccessStatement::Grant { revoke: true, .. })
        ));
        assert_eq!(parse_sql("CREATE TABLE t (a INT)").expect("parse"), None);
        assert_eq!(parse_sql("SELECT 1").expect("parse"), None);
        assert!(parse_sql("GRANT TRUNCATE ON t TO bob").is_err());
        assert!(parse_sql("CREATE USER x PASSWORD 'p' extra").is_err());
        assert!(parse_sql("GRANT SELECT ON t bob").is_err());
        assert_eq!(
            parse_sql("GRANT pg_read_all_stats TO bob, carol").expect("parse"),
            Some(AccessStatement::GrantRole {
                roles: vec!["pg_read_all_stats".into()],
                users: vec!["bob".into(), "carol".into()],
                revoke: false
            })
        );
        assert!(matches!(
            parse_sql("REVOKE pg_read_all_stats FROM bob").expect("parse"),
            Some(AccessStatement::GrantRole { revoke: true, .. })
        ));
    }
}
