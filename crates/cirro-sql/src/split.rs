//! Splitting SQL text into statements at top-level semicolons.
//!
//! Semicolons inside string literals (`'a;b'`, with `''` escapes), quoted
//! identifiers (`"a;b"`), dollar-quoted strings (`$$a;b$$`), line comments
//! (`-- a;b`) and block comments (`/* a;b */`) do not end a statement.

/// Where a scan of SQL text stands at its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Normal,
    Single,
    Double,
    Dollar,
    LineComment,
    BlockComment(usize),
}

/// The statements of `text`, each without its terminating semicolon, trimmed;
/// empty statements (and comment-only ones) are dropped.
pub fn split_statements(text: &str) -> Vec<String> {
    let (parts, rest, _) = scan(text);
    let mut statements: Vec<String> = parts;
    statements.push(rest);
    statements
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !is_blank(s))
        .collect()
}

/// Whether `text` ends with a complete statement: its last non-blank character is
/// a top-level semicolon. The interactive shell reads lines until this holds.
pub fn is_complete(text: &str) -> bool {
    let (parts, rest, mode) = scan(text);
    matches!(mode, Mode::Normal | Mode::LineComment) && !parts.is_empty() && is_blank(&rest)
}

/// Whether `text` holds nothing but whitespace and comments.
pub fn is_blank(text: &str) -> bool {
    let (_, rest, _) = scan_inner(text, true);
    rest.trim().is_empty()
}

fn scan(text: &str) -> (Vec<String>, String, Mode) {
    scan_inner(text, false)
}

/// Returns the completed statements, the unterminated rest and the final mode.
/// With `strip_comments`, comments are left out of the output.
fn scan_inner(text: &str, strip_comments: bool) -> (Vec<String>, String, Mode) {
    let chars: Vec<char> = text.chars().collect();
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut mode = Mode::Normal;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let mut keep = true;
        match mode {
            Mode::Normal => match c {
                '\'' => mode = Mode::Single,
                '"' => mode = Mode::Double,
                '$' if next == Some('$') => {
                    mode = Mode::Dollar;
                    current.push_str("$$");
                    i += 2;
                    continue;
                }
                '-' if next == Some('-') => {
                    mode = Mode::LineComment;
                    keep = !strip_comments;
                }
                '/' if next == Some('*') => {
                    mode = Mode::BlockComment(1);
                    if !strip_comments {
                        current.push_str("/*");
                    }
                    i += 2;
                    continue;
                }
                ';' => {
                    statements.push(std::mem::take(&mut current));
                    i += 1;
                    continue;
                }
                _ => {}
            },
            Mode::Single => {
                if c == '\'' {
                    if next == Some('\'') {
                        current.push_str("''");
                        i += 2;
                        continue;
                    }
                    mode = Mode::Normal;
                }
            }
            Mode::Double => {
                if c == '"' {
                    mode = Mode::Normal;
                }
            }
            Mode::Dollar => {
                if c == '$' && next == Some('$') {
                    mode = Mode::Normal;
                    current.push_str("$$");
                    i += 2;
                    continue;
                }
            }
            Mode::LineComment => {
                keep = !strip_comments;
                if c == '\n' {
                    mode = Mode::Normal;
                    keep = true;
                }
            }
            Mode::BlockComment(depth) => {
                keep = !strip_comments;
                if c == '*' && next == Some('/') {
                    if !strip_comments {
                        current.push_str("*/");
                    }
                    mode = if depth == 1 {
                        Mode::Normal
                    } else {
                        Mode::BlockComment(depth - 1)
                    };
                    if strip_comments && mode == Mode::Normal {
                        current.push(' ');
                    }
                    i += 2;
                    continue;
                } else if c == '/' && next == Some('*') {
                    if !strip_comments {
                        current.push_str("/*");
                    }
                    mode = Mode::BlockComment(depth + 1);
                    i += 2;
                    continue;
                }
            }
        }
        if keep {
            current.push(c);
        }
        i += 1;
    }
    (statements, current, mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_top_level_semicolons_only() {
        let text =
            "select 'a;b' as x; -- c;d\nselect \"e;f\" from t /* g; */ ;\n\n select $$h;i$$;;";
        let parts = split_statements(text);
        assert_eq!(parts.len(), 3, "{parts:?}");
        assert_eq!(parts[0], "select 'a;b' as x");
        assert!(parts[1].contains("\"e;f\""));
        assert!(parts[2].contains("$$h;i$$"));
    }

    #[test]
    fn comment_only_and_empty_input_give_nothing() {
        assert!(split_statements("").is_empty());
        assert!(split_statements("  -- nothing here\n /* nor; here */ ;").is_empty());
    }

    #[test]
    fn escaped_quotes_stay_inside_the_literal() {
        let parts = split_statements("select 'it''s; fine'; select 2");
        assert_eq!(
            parts,
            vec!["select 'it''s; fine'".to_string(), "select 2".to_string()]
        );
    }

    #[test]
    fn completeness_for_the_shell() {
        assert!(is_complete("select 1;"));
        assert!(is_complete("select 1; "));
        assert!(!is_complete("select 1"));
        assert!(!is_complete("select ';"));
        assert!(!is_complete("select 1; select 2"));
        assert!(is_complete("select 1; -- trailing comment"));
        assert!(!is_complete("/* open comment ;"));
    }
}
