//! The shape of a parsed statement, bounded and made cheap to plan before
//! anything walks it recursively.
//!
//! The parser builds a chain of left-associative operators (`1+1+…`,
//! `a OR b OR …`, `x::t::t…`) in a loop, so a long chain costs it nothing but
//! gives a tree as deep as the chain is long: every later pass (our visitors,
//! DataFusion's planner and optimizer, dropping the tree) recurses once per
//! level, and DataFusion's type coercion asks each level for the type of the
//! whole subtree below it (quadratic). So, right after parsing:
//!
//! - AND/OR chains of [`FLATTEN_LENGTH_MIN`] terms or more are rebuilt as
//!   balanced trees (depth log2(n); AND and OR are associative, also with
//!   NULLs), and inside an OR chain, the equalities of one column with literals
//!   become one `col IN (v, w, …)` (the definition of IN).
//! - Any other chain may be at most [`EXPRESSION_CHAIN_LENGTH_MAX`] operators
//!   long (sums cannot be regrouped: with overflow checks and floating point,
//!   `(a+b)+c` and `a+(b+c)` differ). The statement threads' stacks are sized
//!   for that depth ([`STATEMENT_THREAD_STACK_BYTES`]). Every
//!   [`CHAIN_SEGMENT_LEVELS`]-th level of a longer chain is wrapped in
//!   `cirro_segment(…)`, the identity, which keeps the planner's per-level
//!   walks short (see `cirro-exec/src/rules/chains.rs`).
//!
//! Before the parser runs, the text is bounded by [`STATEMENT_BYTES_MAX`] and
//! its operator tokens by [`EXPRESSION_OPERATORS_MAX`], which bounds how deep
//! any tree the parser can build is (so that even the tree of a refused
//! statement can be dropped safely); nesting (parentheses, subqueries) is
//! bounded by the parser's recursion limit ([`STATEMENT_NESTING_DEPTH_MAX`]).
//! Subquery expressions may nest [`SUBQUERY_NESTING_DEPTH_MAX`] deep (DataFusion's
//! plan checks are exponential in that depth). Every limit gives 54001
//! before any deep walk.
//!
//! [`STATEMENT_THREAD_STACK_BYTES`]: cirro_common::limits::STATEMENT_THREAD_STACK_BYTES
//! [`STATEMENT_NESTING_DEPTH_MAX`]: cirro_common::limits::STATEMENT_NESTING_DEPTH_MAX

use std::ops::ControlFlow;

use cirro_common::limits::{
    CHAIN_SEGMENT_FUNCTION, CHAIN_SEGMENT_LEVELS, EXPRESSION_CHAIN_LENGTH_MAX,
    EXPRESSION_OPERATORS_MAX, STATEMENT_BYTES_MAX, SUBQUERY_NESTING_DEPTH_MAX,
};
use cirro_common::{CirroError, Result, SqlState};
use datafusion::sql::parser::{CopyToSource, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, Function, FunctionArg, FunctionArgExpr, FunctionArgumentList,
    FunctionArguments, Ident, ObjectName, UnaryOperator, Value,
};
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::walk::{WalkMut, WalkerMut};

/// AND/OR chains shorter than this keep the shape the user wrote (and the
/// EXPLAIN output they expect); a balanced tree of up to 2^31 terms has a
/// left spine shorter than this, so a rebuilt chain is never rebuilt again.
pub const FLATTEN_LENGTH_MIN: usize = 32;

/// Refuse statement text over [`STATEMENT_BYTES_MAX`] (54001).
pub fn check_length(sql: &str) -> Result<()> {
    if sql.len() > STATEMENT_BYTES_MAX {
        return Err(too_complex(format!(
            "the statement is {} bytes long (at most {STATEMENT_BYTES_MAX})",
            sql.len()
        )));
    }
    Ok(())
}

/// Words that the parser's operator loop treats as infix or postfix operators.
const OPERATOR_WORDS: [&str; 12] = [
    "AND", "OR", "IS", "IN", "LIKE", "ILIKE", "BETWEEN", "SIMILAR", "COLLATE", "AT", "REGEXP",
    "RLIKE",
];

/// Refuse a statement with more than [`EXPRESSION_OPERATORS_MAX`] operator
/// tokens (54001): `+` and `-` count where they follow an operand (so signed
/// numbers in a long VALUES list do not), commas, parentheses and names do not.
pub fn check_operators(solid: &[Token]) -> Result<()> {
    let mut operators = 0;
    let mut after_operand = false;
    for token in solid {
        let (operator, operand) = match token {
            Token::Word(w)
                if w.quote_style.is_none()
                    && OPERATOR_WORDS
                        .iter()
                        .any(|o| w.value.eq_ignore_ascii_case(o)) =>
            {
                (true, false)
            }
            Token::Word(_)
            | Token::Number(..)
            | Token::Placeholder(_)
            | Token::RParen
            | Token::RBracket => (false, true),
            Token::Plus | Token::Minus => (after_operand, false),
            Token::Comma
            | Token::LParen
            | Token::LBracket
            | Token::LBrace
            | Token::RBrace
            | Token::Period
            | Token::Colon
            | Token::SemiColon
            | Token::Whitespace(_)
            | Token::EOF => (false, false),
            other => match is_literal(other) {
                true => (false, true),
                false => (true, false),
            },
        };
        operators += usize::from(operator);
        after_operand = operand;
    }
    if operators > EXPRESSION_OPERATORS_MAX {
        return Err(too_complex(format!(
            "the statement has {operators} operators (at most {EXPRESSION_OPERATORS_MAX})"
        )));
    }
    Ok(())
}

fn is_literal(token: &Token) -> bool {
    matches!(
        token,
        Token::SingleQuotedString(_)
            | Token::DoubleQuotedString(_)
            | Token::TripleSingleQuotedString(_)
            | Token::TripleDoubleQuotedString(_)
            | Token::DollarQuotedString(_)
            | Token::SingleQuotedByteStringLiteral(_)
            | Token::DoubleQuotedByteStringLiteral(_)
            | Token::TripleSingleQuotedByteStringLiteral(_)
            | Token::TripleDoubleQuotedByteStringLiteral(_)
            | Token::SingleQuotedRawStringLiteral(_)
            | Token::DoubleQuotedRawStringLiteral(_)
            | Token::TripleSingleQuotedRawStringLiteral(_)
            | Token::TripleDoubleQuotedRawStringLiteral(_)
            | Token::NationalStringLiteral(_)
            | Token::EscapedStringLiteral(_)
            | Token::UnicodeStringLiteral(_)
            | Token::HexStringLiteral(_)
    )
}

/// Bound and rebalance the expressions of one parsed statement (see the
/// module comment).
pub fn shape(statement: &mut DFStatement) -> Result<()> {
    let mut shaper = Shaper::default();
    match statement {
        DFStatement::Statement(inner) => {
            let _ = inner.walk_mut(&mut shaper);
        }
        DFStatement::Explain(explain) => return shape(&mut explain.statement),
        DFStatement::CopyTo(copy) => {
            if let CopyToSource::Query(query) = &mut copy.source {
                let _ = query.walk_mut(&mut shaper);
            }
        }
        _ => {}
    }
    match shaper.error {
        None => Ok(()),
        Some(err) => Err(err),
    }
}

fn too_complex(what: String) -> CirroError {
    CirroError::new(
        SqlState::STATEMENT_TOO_COMPLEX,
        format!("statement too complex: {what}"),
    )
}

#[derive(Default)]
struct Shaper {
    /// Subquery expressions around the expression being visited.
    subquery_depth: usize,
    /// Why the walk stopped: the statement is too complex, or a literal bad.
    error: Option<CirroError>,
}

fn is_subquery(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. }
    )
}

impl WalkerMut for Shaper {
    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if is_subquery(expr) {
            self.subquery_depth -= 1;
        }
        // After the children: the call it becomes is not visited again.
        cast_cuts_to_length(expr);
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match self.shape_before_children(expr) {
            ControlFlow::Continue(()) => ControlFlow::Continue(()),
            ControlFlow::Break(error) => {
                self.error = Some(error);
                ControlFlow::Break(())
            }
        }
    }
}

impl Shaper {
    fn shape_before_children(&mut self, expr: &mut Expr) -> ControlFlow<CirroError> {
        if is_subquery(expr) {
            self.subquery_depth += 1;
            if self.subquery_depth > SUBQUERY_NESTING_DEPTH_MAX {
                return ControlFlow::Break(too_complex(format!(
                    "subqueries nested more than {SUBQUERY_NESTING_DEPTH_MAX} deep"
                )));
            }
            return ControlFlow::Continue(());
        }
        distinct_from_precedence(expr);
        current_role_is_a_function(expr);
        mod_is_the_remainder(expr);
        parameter_concatenates_as_text(expr);
        complete_time_literal(expr);
        if let Err(e) = numeric_literal(expr) {
            return ControlFlow::Break(e);
        }
        if let Expr::BinaryOp {
            op: op @ (BinaryOperator::And | BinaryOperator::Or),
            ..
        } = expr
        {
            let op = op.clone();
            if logical_spine(expr, &op) >= FLATTEN_LENGTH_MIN {
                rebuild_logical(expr, op);
            }
            return ControlFlow::Continue(());
        }
        // Segments end a chain for this count, so a segmented chain's pieces
        // are each measured once, below: linear in all.
        let mut length = 0;
        let mut node: &Expr = expr;
        while let Some(child) = chain_child(node) {
            length += 1;
            if length > EXPRESSION_CHAIN_LENGTH_MAX {
                return ControlFlow::Break(too_complex(format!(
                    "a chain of operators is more than {EXPRESSION_CHAIN_LENGTH_MAX} long"
                )));
            }
            node = child;
        }
        if length > CHAIN_SEGMENT_LEVELS {
            segment_chain(expr, length);
        }
        ControlFlow::Continue(())
    }
}

/// sqlparser (0.62) parses all that follows `a IS [NOT] DISTINCT FROM` as its
/// right side, so `a IS DISTINCT FROM b AND c` became `a IS DISTINCT FROM (b
/// AND c)`: a wrong answer where the operands are booleans. PostgreSQL binds
/// IS tighter than AND and OR: move the comparison down onto the leftmost
/// operand of the (unparenthesized) AND/OR.
fn distinct_from_precedence(expr: &mut Expr) {
    let (Expr::IsDistinctFrom(_, right) | Expr::IsNotDistinctFrom(_, right)) = expr else {
        return;
    };
    if !is_logical(right) {
        return;
    }
    let (left, right, negated) = match std::mem::replace(expr, Expr::value(Value::Null)) {
        Expr::IsDistinctFrom(left, right) => (left, right, false),
        Expr::IsNotDistinctFrom(left, right) => (left, right, true),
        _ => unreachable!("matched above"),
    };
    let mut top = *right;
    let leaf = leftmost_operand(&mut top);
    let operand = Box::new(std::mem::replace(leaf, Expr::value(Value::Null)));
    *leaf = if negated {
        Expr::IsNotDistinctFrom(left, operand)
    } else {
        Expr::IsDistinctFrom(left, operand)
    };
    *expr = top;
}

/// `current_role` (a reserved word in PostgreSQL, a plain name to sqlparser)
/// as the function it is.
fn current_role_is_a_function(expr: &mut Expr) {
    if let Expr::Identifier(ident) = expr
        && ident.quote_style.is_none()
        && ident.value.eq_ignore_ascii_case("current_role")
    {
        *expr = Expr::Function(Function {
            name: ObjectName::from(vec![Ident::new("current_role")]),
            uses_odbc_syntax: false,
            parameters: FunctionArguments::None,
            args: FunctionArguments::None,
            filter: None,
            null_treatment: None,
            over: None,
            within_group: vec![],
        });
    }
}

/// `TIMESTAMP '2024-05-17 10:00'` and `TIME '10:00'`: PostgreSQL reads a
/// time without seconds; Arrow's parser needs them. Add `:00`.
fn complete_time_literal(expr: &mut Expr) {
    use datafusion::sql::sqlparser::ast::DataType as SqlType;
    let Expr::TypedString(typed) = expr else {
        return;
    };
    if !matches!(
        typed.data_type,
        SqlType::Timestamp(..) | SqlType::Time(..) | SqlType::Datetime(_)
    ) {
        return;
    }
    let Value::SingleQuotedString(text) = &mut typed.value.value else {
        return;
    };
    let time = text.rsplit([' ', 'T']).next().unwrap_or(text);
    let clock = time.split(['+', '-', 'Z', 'z']).next().unwrap_or(time);
    let is_hh_mm = clock.len() == 5
        && clock.as_bytes()[2] == b':'
        && clock
            .bytes()
            .enumerate()
            .all(|(i, b)| i == 2 || b.is_ascii_digit());
    if is_hh_mm {
        let at = text.len() - time.len() + clock.len();
        text.insert_str(at, ":00");
    }
}

/// A parameter concatenated with `||` as text (`CAST($1 AS TEXT) || 3`), as
/// PostgreSQL resolves `unknown || x` (`anytextcat`): DataFusion gave `$1`
/// the other operand's type and then found no string to concatenate
/// (42804). A parameter of another declared type becomes its text, as
/// PostgreSQL's `anynonarray || text` makes it.
fn parameter_concatenates_as_text(expr: &mut Expr) {
    let Expr::BinaryOp {
        left,
        op: BinaryOperator::StringConcat,
        right,
    } = expr
    else {
        return;
    };
    for side in [left, right] {
        if matches!(side.as_ref(), Expr::Value(v) if matches!(v.value, Value::Placeholder(_))) {
            let parameter = std::mem::replace(side.as_mut(), Expr::value(Value::Null));
            **side = Expr::Cast {
                kind: datafusion::sql::sqlparser::ast::CastKind::Cast,
                expr: Box::new(parameter),
                data_type: datafusion::sql::sqlparser::ast::DataType::Text,
                array: false,
                format: None,
            };
        }
    }
}

/// `mod(a, b)`, PostgreSQL's remainder function, as `a % b` (DataFusion
/// has the operator only).
fn mod_is_the_remainder(expr: &mut Expr) {
    let Expr::Function(function) = expr else {
        return;
    };
    let is_mod = function.name.0.len() == 1
        && function.name.0[0]
            .as_ident()
            .is_some_and(|i| i.quote_style.is_none() && i.value.eq_ignore_ascii_case("mod"));
    let FunctionArguments::List(list) = &function.args else {
        return;
    };
    if !is_mod || list.args.len() != 2 || function.over.is_some() {
        return;
    }
    let operand = |arg: &FunctionArg| match arg {
        FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(Expr::Nested(Box::new(e.clone()))),
        _ => None,
    };
    let (Some(left), Some(right)) = (operand(&list.args[0]), operand(&list.args[1])) else {
        return;
    };
    *expr = Expr::Nested(Box::new(Expr::BinaryOp {
        left: Box::new(left),
        op: BinaryOperator::Modulo,
        right: Box::new(right),
    }));
}

/// An explicit cast to VARCHAR(n) or CHAR(n) cuts the value to n
/// characters, as PostgreSQL's does (where storing a longer value in such
/// a column is an error, 22001): `left(CAST(x AS VARCHAR(n)), n)`.
fn cast_cuts_to_length(expr: &mut Expr) {
    let Expr::Cast { data_type, .. } = expr else {
        return;
    };
    let Some(length) = crate::names::declared_length(data_type) else {
        return;
    };
    let cast = std::mem::replace(expr, Expr::value(Value::Null));
    *expr = Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new("left")]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: vec![
                FunctionArg::Unnamed(FunctionArgExpr::Expr(cast)),
                FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::value(Value::Number(
                    length.to_string(),
                    false,
                )))),
            ],
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    });
}

/// Digits a NUMERIC literal may have (Decimal128's precision).
const NUMERIC_LITERAL_DIGITS_MAX: usize = 38;

/// A number literal read as PostgreSQL reads it, where DataFusion's reading
/// differs (DataFusion reads a number with a point or an exponent as
/// NUMERIC, see the session's `parse_float_as_decimal`):
/// - an exponent is a NUMERIC of the value's digits (`1e3` is 1000, scale 0;
///   `1.5e-3` is 0.0015), written out so that no negative scale arises;
/// - an integer beyond BIGINT is a NUMERIC (DataFusion: an unsigned
///   BIGINT up to 2^64 - 1);
/// - beyond [`NUMERIC_LITERAL_DIGITS_MAX`] digits: a literal with an
///   exponent is a double precision (`-1e300`), one without is 22003.
fn numeric_literal(expr: &mut Expr) -> Result<()> {
    let Expr::Value(value) = expr else {
        return Ok(());
    };
    let Value::Number(text, _) = &value.value else {
        return Ok(());
    };
    let Some(spelled) = spell_number(text) else {
        return Ok(());
    };
    let (whole, fraction) = spelled.split_once('.').unwrap_or((&spelled, ""));
    let digits = whole.trim_start_matches('0').len() + fraction.len();
    let has_exponent = text.contains(['e', 'E']);
    if digits > NUMERIC_LITERAL_DIGITS_MAX {
        if !has_exponent {
            return Err(CirroError::new(
                SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                format!("numeric literal {text} has more than {NUMERIC_LITERAL_DIGITS_MAX} digits"),
            ));
        }
        let text = text.clone();
        *expr = Expr::Cast {
            kind: datafusion::sql::sqlparser::ast::CastKind::DoubleColon,
            expr: Box::new(Expr::value(Value::SingleQuotedString(text))),
            data_type: datafusion::sql::sqlparser::ast::DataType::DoublePrecision,
            array: false,
            format: None,
        };
        return Ok(());
    }
    let is_integer = !spelled.contains('.');
    let new_text = if is_integer && (has_exponent || spelled.parse::<i64>().is_err()) {
        // DataFusion reads "…e0" as a NUMERIC of scale 0.
        format!("{spelled}e0")
    } else if has_exponent {
        spelled
    } else {
        return Ok(());
    };
    if let Value::Number(text, _) = &mut value.value {
        *text = new_text;
    }
    Ok(())
}

/// An unsigned number literal written out without an exponent, with its
/// leading zeros dropped (None if it is not a plain number).
fn spell_number(text: &str) -> Option<String> {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if !(whole.bytes().all(|b| b.is_ascii_digit()) && fraction.bytes().all(|b| b.is_ascii_digit()))
        || whole.is_empty() && fraction.is_empty()
    {
        return None;
    }
    // A value of more digits than this is spelled no further (it is beyond
    // any NUMERIC anyway).
    let point = whole.len() as i64 + exponent.clamp(-1000, 1000);
    let digits = format!("{whole}{fraction}");
    let spelled = if point >= digits.len() as i64 {
        format!(
            "{digits}{}",
            "0".repeat((point - digits.len() as i64) as usize)
        )
    } else if point <= 0 {
        format!("0.{}{digits}", "0".repeat((-point) as usize))
    } else {
        format!(
            "{}.{}",
            &digits[..point as usize],
            &digits[point as usize..]
        )
    };
    let (whole, fraction) = spelled.split_once('.').unwrap_or((&spelled, ""));
    let whole = whole.trim_start_matches('0');
    let whole = if whole.is_empty() { "0" } else { whole };
    Some(if fraction.is_empty() {
        whole.to_string()
    } else {
        format!("{whole}.{fraction}")
    })
}

fn is_logical(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::BinaryOp {
            op: BinaryOperator::And | BinaryOperator::Or,
            ..
        }
    )
}

fn leftmost_operand(mut expr: &mut Expr) -> &mut Expr {
    while is_logical(expr) {
        let Expr::BinaryOp { left, .. } = expr else {
            unreachable!("is_logical");
        };
        expr = left.as_mut();
    }
    expr
}

/// Wrap the levels of a `length`-long chain that lie a multiple of
/// [`CHAIN_SEGMENT_LEVELS`] above its bottom (its top excepted) in
/// `cirro_segment(…)`. Each piece is then at most that long, and is not
/// segmented again when the visitor reaches it.
fn segment_chain(expr: &mut Expr, length: usize) {
    let mut node = expr;
    for above_bottom in (1..=length).rev() {
        if above_bottom % CHAIN_SEGMENT_LEVELS == 0 && above_bottom < length {
            let level = std::mem::replace(node, Expr::value(Value::Null));
            *node = segment_call(level);
            node = segment_argument(node);
        }
        node = match chain_child_mut(node) {
            Some(child) => child,
            None => return,
        };
    }
}

fn segment_call(expr: Expr) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(CHAIN_SEGMENT_FUNCTION)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(expr))],
            clauses: Vec::new(),
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: Vec::new(),
    })
}

fn segment_argument(call: &mut Expr) -> &mut Expr {
    match call {
        Expr::Function(Function {
            args: FunctionArguments::List(list),
            ..
        }) => match list.args.first_mut() {
            Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(expr))) => expr,
            _ => unreachable!("segment_call builds one unnamed argument"),
        },
        _ => unreachable!("segment_call builds a function call"),
    }
}

/// The operand of an expression that the parser's operator loop puts on the
/// left (the next level of a chain), for every infix and postfix operator;
/// one match for [`chain_child`] and [`chain_child_mut`].
macro_rules! chain_child_of {
    ($expr:expr) => {
        match $expr {
            Expr::BinaryOp { left, .. }
            | Expr::AnyOp { left, .. }
            | Expr::AllOp { left, .. }
            | Expr::IsDistinctFrom(left, _)
            | Expr::IsNotDistinctFrom(left, _) => Some(left),
            Expr::Cast { expr, .. }
            | Expr::Between { expr, .. }
            | Expr::Like { expr, .. }
            | Expr::ILike { expr, .. }
            | Expr::SimilarTo { expr, .. }
            | Expr::RLike { expr, .. }
            | Expr::InList { expr, .. }
            | Expr::InSubquery { expr, .. }
            | Expr::InUnnest { expr, .. }
            | Expr::Collate { expr, .. }
            | Expr::IsNull(expr)
            | Expr::IsNotNull(expr)
            | Expr::IsTrue(expr)
            | Expr::IsNotTrue(expr)
            | Expr::IsFalse(expr)
            | Expr::IsNotFalse(expr)
            | Expr::IsUnknown(expr)
            | Expr::IsNotUnknown(expr) => Some(expr),
            Expr::AtTimeZone { timestamp, .. } => Some(timestamp),
            Expr::CompoundFieldAccess { root, .. } => Some(root),
            Expr::JsonAccess { value, .. } => Some(value),
            _ => None,
        }
    };
}

fn chain_child(expr: &Expr) -> Option<&Expr> {
    chain_child_of!(expr)
}

fn chain_child_mut(expr: &mut Expr) -> Option<&mut Expr> {
    chain_child_of!(expr)
}

/// How many `op` nodes the left spine of `expr` has (parentheses included:
/// `(a OR b) OR c` is one chain).
fn logical_spine(mut expr: &Expr, op: &BinaryOperator) -> usize {
    let mut length = 0;
    loop {
        match expr {
            Expr::BinaryOp { left, op: o, .. } if o == op => {
                length += 1;
                expr = left;
            }
            Expr::Nested(inner) if matches!(inner.as_ref(), Expr::BinaryOp { op: o, .. } if o == op) =>
            {
                expr = inner;
            }
            _ => return length,
        }
    }
}

/// Replace the `op` chain at `expr` by a balanced tree of its terms (in their
/// order), with OR's column-equals-literal terms gathered into IN lists.
fn rebuild_logical(expr: &mut Expr, op: BinaryOperator) {
    // Collect the terms without recursion: the chain may be very deep.
    let mut terms = Vec::new();
    let mut pending = vec![std::mem::replace(expr, Expr::value(Value::Null))];
    while let Some(node) = pending.pop() {
        match node {
            Expr::BinaryOp { left, op: o, right } if o == op => {
                pending.push(*right);
                pending.push(*left);
            }
            Expr::Nested(inner) if matches!(inner.as_ref(), Expr::BinaryOp { op: o, .. } if *o == op) =>
            {
                pending.push(*inner);
            }
            term => terms.push(term),
        }
    }
    if op == BinaryOperator::Or {
        terms = gather_in_lists(terms);
    }
    *expr = balanced(terms, &op);
}

/// `col = 1 OR x > 2 OR col = 3` → `col IN (1, 3) OR x > 2`: the terms that
/// compare one column (or qualified column) with a number or string literal,
/// two or more per column, become one IN list where the first of them stood.
/// Literals of one kind only (all numbers or all strings), so the list's
/// common type is what each comparison would have used.
fn gather_in_lists(terms: Vec<Expr>) -> Vec<Expr> {
    #[derive(PartialEq)]
    enum Kind {
        Number,
        Text,
    }
    // For each term: the index of its group, if it compares a column with a literal.
    let mut groups: Vec<(Expr, Kind, Vec<usize>)> = Vec::new();
    let mut group_of = vec![None; terms.len()];
    for (i, term) in terms.iter().enumerate() {
        let Expr::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } = term
        else {
            continue;
        };
        let (column, literal) = match (is_column(left), is_column(right)) {
            (true, false) => (left, right),
            (false, true) => (right, left),
            _ => continue,
        };
        let kind = match literal.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(..) => Kind::Number,
                Value::SingleQuotedString(_) => Kind::Text,
                _ => continue,
            },
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                expr,
            } if matches!(expr.as_ref(), Expr::Value(v) if matches!(v.value, Value::Number(..))) => {
                Kind::Number
            }
            _ => continue,
        };
        let index = match groups
            .iter()
            .position(|(c, k, _)| c == column.as_ref() && *k == kind)
        {
            Some(index) => index,
            None => {
                groups.push((column.as_ref().clone(), kind, Vec::new()));
                groups.len() - 1
            }
        };
        groups[index].2.push(i);
        group_of[i] = Some(index);
    }
    let mut lists: Vec<Option<Vec<Expr>>> = groups
        .iter()
        .map(|(_, _, members)| (members.len() >= 2).then(Vec::new))
        .collect();
    let mut first_at = vec![usize::MAX; groups.len()];
    let mut out: Vec<Option<Expr>> = Vec::with_capacity(terms.len());
    for (i, term) in terms.into_iter().enumerate() {
        let gathered = group_of[i].and_then(|g| lists[g].as_mut().map(|list| (g, list)));
        match gathered {
            Some((g, list)) => {
                let Expr::BinaryOp { left, right, .. } = term else {
                    unreachable!("grouped terms are equalities")
                };
                list.push(if is_column(&left) { *right } else { *left });
                if first_at[g] == usize::MAX {
                    first_at[g] = out.len();
                    out.push(None);
                }
            }
            None => out.push(Some(term)),
        }
    }
    for (g, (column, _, _)) in groups.into_iter().enumerate() {
        if let Some(list) = lists[g].take() {
            out[first_at[g]] = Some(Expr::InList {
                expr: Box::new(column),
                list,
                negated: false,
            });
        }
    }
    out.into_iter().flatten().collect()
}

fn is_column(expr: &Expr) -> bool {
    matches!(expr, Expr::Identifier(_) | Expr::CompoundIdentifier(_))
}

/// The terms joined by `op` as a balanced tree, left to right.
fn balanced(mut terms: Vec<Expr>, op: &BinaryOperator) -> Expr {
    while terms.len() > 1 {
        let mut next = Vec::with_capacity(terms.len().div_ceil(2));
        let mut iter = terms.into_iter();
        while let Some(left) = iter.next() {
            next.push(match iter.next() {
                Some(right) => Expr::BinaryOp {
                    left: Box::new(left),
                    op: op.clone(),
                    right: Box::new(right),
                },
                None => left,
            });
        }
        terms = next;
    }
    terms.pop().unwrap_or(Expr::value(Value::Null))
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_are_spelled_out() {
        use super::spell_number;
        for (text, spelled) in [
            ("1e3", "1000"),
            ("1.5e-3", "0.0015"),
            ("1.50e1", "15.0"),
            ("007.25", "7.25"),
            ("12E+2", "1200"),
            (".5", "0.5"),
            ("0.000", "0.000"),
        ] {
            assert_eq!(spell_number(text).as_deref(), Some(spelled), "{text}");
        }
        assert_eq!(spell_number("0x1F"), None);
    }

    use super::*;
    use crate::parse;

    fn where_clause(sql: &str) -> String {
        let parsed = parse(sql).expect("parse");
        let Some(statement) = parsed.statement.to_datafusion() else {
            panic!("not SQL")
        };
        let text = statement.to_string();
        text.split_once(" WHERE ")
            .map(|(_, w)| w.to_string())
            .unwrap_or(text)
    }

    #[test]
    fn short_chains_keep_their_shape() {
        assert_eq!(
            where_clause("SELECT 1 FROM t WHERE a = 1 OR a = 2 OR b = 3"),
            "a = 1 OR a = 2 OR b = 3"
        );
    }

    #[test]
    fn is_distinct_from_binds_tighter_than_and_or() {
        let parsed =
            parse("SELECT 1 FROM t WHERE a IS NOT DISTINCT FROM b AND c OR d").expect("parse");
        let text = format!("{:?}", parsed.statement);
        let selection = &text[text.find("selection: Some(").expect("where")..];
        assert!(
            selection.starts_with(
                "selection: Some(BinaryOp { left: BinaryOp { left: IsNotDistinctFrom(Identifier"
            ),
            "{selection}"
        );
        // Parenthesized, the right side stays whole.
        let parsed = parse("SELECT 1 FROM t WHERE a IS DISTINCT FROM (b AND c)").expect("parse");
        let text = format!("{:?}", parsed.statement);
        assert!(text.contains("selection: Some(IsDistinctFrom("), "{text}");
    }

    #[test]
    fn times_without_seconds_get_them() {
        assert_eq!(
            where_clause(
                "SELECT 1 FROM t WHERE a = TIMESTAMP '2024-05-17 10:00' AND b = TIME '10:00' \
                 AND c = TIMESTAMP '2024-05-17T10:00+02:00' AND d = TIMESTAMP '2024-05-17 10:00:05'"
            ),
            "a = TIMESTAMP '2024-05-17 10:00:00' AND b = TIME '10:00:00' \
             AND c = TIMESTAMP '2024-05-17T10:00:00+02:00' AND d = TIMESTAMP '2024-05-17 10:00:05'"
        );
    }

    #[test]
    fn long_or_chains_become_in_lists_in_place() {
        let terms: Vec<String> = (0..40).map(|i| format!("id = {i}")).collect();
        let sql = format!(
            "SELECT 1 FROM t WHERE x > 1 OR {} OR name = 'a' OR 'b' = name OR t.id = -5",
            terms.join(" OR ")
        );
        let values: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        assert_eq!(
            where_clause(&sql),
            format!(
                "x > 1 OR id IN ({}) OR name IN ('a', 'b') OR t.id = -5",
                values.join(", ")
            )
        );
    }

    #[test]
    fn long_and_chains_are_balanced() {
        let terms: Vec<String> = (0..64).map(|i| format!("c{i} > 0")).collect();
        let sql = format!("SELECT 1 FROM t WHERE {}", terms.join(" AND "));
        let parsed = parse(&sql).expect("parse");
        let Some(statement) = parsed.statement.to_datafusion() else {
            panic!("not SQL")
        };
        let text = statement.to_string();
        // 64 terms: 6 levels, the same terms in the same order.
        assert!(text.contains("c0 > 0 AND c1 > 0"), "{text}");
        let order: Vec<usize> = (0..64)
            .map(|i| text.find(&format!("c{i} > 0")).expect("term kept"))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        let DFStatement::Statement(inner) = statement else {
            panic!()
        };
        let datafusion::sql::sqlparser::ast::Statement::Query(query) = *inner else {
            panic!()
        };
        let datafusion::sql::sqlparser::ast::SetExpr::Select(select) = *query.body else {
            panic!()
        };
        let selection = select.selection.expect("where");
        assert_eq!(logical_spine(&selection, &BinaryOperator::And), 6);
    }

    /// Run `f` on a thread with the stack that statement threads get.
    fn on_statement_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(cirro_common::limits::STATEMENT_THREAD_STACK_BYTES)
            .spawn(f)
            .expect("spawn")
            .join()
            .expect("no panic");
    }

    #[test]
    fn long_chains_are_segmented() {
        let chain = vec!["x"; 70].join(" + ");
        let text = where_clause(&format!("SELECT 1 FROM t WHERE {chain} > 0"));
        // 69 operators (and the comparison on top): segments 32 and 64 levels up.
        assert_eq!(text.matches("cirro_segment(").count(), 2, "{text}");
        assert!(
            text.starts_with("cirro_segment(cirro_segment(x + x"),
            "{text}"
        );
        assert_eq!(text.matches('x').count(), 70, "{text}");
    }

    #[test]
    fn limits_give_54001() {
        on_statement_stack(limits_at_their_bounds);
    }

    fn limits_at_their_bounds() {
        let chain = vec!["1"; EXPRESSION_CHAIN_LENGTH_MAX + 2].join("+");
        let err = parse(&format!("SELECT {chain}")).expect_err("too long a chain");
        assert_eq!(err.state, SqlState::STATEMENT_TOO_COMPLEX, "{err:?}");
        let ok = vec!["1"; EXPRESSION_CHAIN_LENGTH_MAX].join("+");
        parse(&format!("SELECT {ok}")).expect("a chain at the limit parses");

        let ors: Vec<String> = (0..=EXPRESSION_OPERATORS_MAX / 2)
            .map(|i| format!("a = {i}"))
            .collect();
        let err = parse(&format!("SELECT 1 FROM t WHERE {}", ors.join(" OR ")))
            .expect_err("too many operators");
        assert_eq!(err.state, SqlState::STATEMENT_TOO_COMPLEX, "{err:?}");
        // Signed numbers and commas are not operators: a long VALUES list is fine.
        let rows: Vec<String> = (0..EXPRESSION_OPERATORS_MAX)
            .map(|i| format!("(-{i}, +1)"))
            .collect();
        parse(&format!("INSERT INTO t VALUES {}", rows.join(", "))).expect("long VALUES");

        let nested = format!("SELECT {}1{}", "(".repeat(1000), ")".repeat(1000));
        let err = parse(&nested).expect_err("too deep");
        assert_eq!(err.state, SqlState::STATEMENT_TOO_COMPLEX, "{err:?}");

        let long = format!("SELECT '{}'", "x".repeat(STATEMENT_BYTES_MAX));
        let err = parse(&long).expect_err("too long");
        assert_eq!(err.state, SqlState::STATEMENT_TOO_COMPLEX, "{err:?}");
    }
}
