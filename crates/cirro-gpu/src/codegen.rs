//! Code generation: a filter's predicate compiled into a WGSL kernel that
//! writes one flag per row and the count each workgroup kept (the first
//! step of a selection: flags → prefix sum → gather, `kernels.rs`); a
//! projection's arithmetic compiled into a kernel that writes one 64-bit
//! column per expression ([`compile_projection`]).
//!
//! What compiles: columns of the types `columns.rs` represents, constants,
//! comparisons (`= <> < <= > >=`) of two values of one type or of text
//! with a text constant, `AND`/`OR`/`NOT` with SQL's three-valued logic,
//! `IS [NOT] NULL`, `IN (constants)` and `LIKE 'prefix%'`. Anything else
//! leaves the filter on the CPU. The kernel's source depends only on the
//! expression and the columns' nullability, so the device's kernel cache
//! (keyed by source) compiles each predicate once per process; text
//! constants are not in the source but in the parameters, as bounds in
//! each block's dictionary.

use std::fmt::Write;

use arrow::datatypes::{DataType, Schema};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, CastExpr, Column, InListExpr, IsNotNullExpr, IsNullExpr, LikeExpr, Literal, NotExpr,
};
use datafusion::scalar::ScalarValue;

use crate::columns::{Repr, encode};

/// A column a kernel reads: its index in the input, how it is stored, and
/// whether its validity bitmap is bound too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub column: usize,
    pub repr: Repr,
    pub nullable: bool,
}

/// How a text test turns into a range of codes in a block's dictionary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextBound {
    /// `[first ≥ s, first > s)`: the code of `s` if present (empty if not).
    Equal(String),
    /// `[first ≥ p, first not starting with p)`: the codes starting with `p`.
    Prefix(String),
}

impl TextBound {
    /// The range of codes in `dictionary` (sorted, distinct).
    pub fn range(&self, dictionary: &[String]) -> (u32, u32) {
        match self {
            TextBound::Equal(s) => (
                dictionary.partition_point(|d| d.as_str() < s.as_str()) as u32,
                dictionary.partition_point(|d| d.as_str() <= s.as_str()) as u32,
            ),
            TextBound::Prefix(p) => {
                let lo = dictionary.partition_point(|d| d.as_str() < p.as_str());
                let len = dictionary[lo..].partition_point(|d| d.starts_with(p.as_str()));
                (lo as u32, (lo + len) as u32)
            }
        }
    }
}

/// A text test's column (an index into the kernel's bindings) and bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextTest {
    pub binding: usize,
    pub bound: TextBound,
}

/// A compiled predicate: the kernel's source, the columns it binds (after
/// `params`, `flags` and `counts`: values, then validity where nullable, per
/// column) and the text tests whose bounds go into `params` (slots `1 + 2t`
/// and `2 + 2t`; slot 0 is the number of rows).
#[derive(Debug, Clone)]
pub struct PredicateKernel {
    pub source: String,
    pub bindings: Vec<Binding>,
    pub texts: Vec<TextTest>,
}

impl PredicateKernel {
    /// Buffers the kernel binds.
    pub fn buffers(&self) -> usize {
        3 + self
            .bindings
            .iter()
            .map(|b| 1 + usize::from(b.nullable))
            .sum::<usize>()
    }
}

/// `predicate` over `schema` compiled, or None where some part of it
/// cannot run on the device.
pub fn compile_predicate(
    predicate: &std::sync::Arc<dyn PhysicalExpr>,
    schema: &Schema,
) -> Option<PredicateKernel> {
    let mut generator = Generator::new(schema, false);
    let top = generator.expr(predicate)?;
    if top.ty != Ty::Bool {
        return None;
    }
    let mut source = String::new();
    source.push_str(
        "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
         @group(0) @binding(1) var<storage, read_write> flags: array<u32>;\n\
         @group(0) @binding(2) var<storage, read_write> counts: array<u32>;\n",
    );
    generator.declare_bindings(&mut source, 3);
    let _ = write!(
        source,
        "var<workgroup> kept: atomic<u32>;\n\
         @compute @workgroup_size(256)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32) {{\n\
         let group = wid.y * nwg.x + wid.x;\n\
         let row = group * 256u + lid;\n\
         if (lid == 0u) {{ atomicStore(&kept, 0u); }}\n\
         workgroupBarrier();\n\
         var keep = 0u;\n\
         if (row < params[0]) {{\n{}\
         if (!{} && {}) {{ keep = 1u; }}\n\
         }}\n\
         flags[row] = keep;\n\
         if (keep == 1u) {{ atomicAdd(&kept, 1u); }}\n\
         workgroupBarrier();\n\
         if (lid == 0u) {{ counts[group] = atomicLoad(&kept); }}\n\
         }}\n",
        generator.body, top.n, top.v
    );
    Some(PredicateKernel {
        source,
        bindings: generator.bindings,
        texts: generator.texts,
    })
}

/// A compiled projection: the kernel's source and the columns it binds
/// (after `params`, `overflow` and one `array<i64>` output per
/// expression: values, then validity where nullable, per column). The
/// kernel sets `overflow[0]` where a row whose value is not NULL passes
/// its type's range (DataFusion's checked arithmetic would fail there:
/// the block goes to the CPU, which answers as DataFusion does).
#[derive(Debug, Clone)]
pub struct ProjectionKernel {
    pub source: String,
    pub bindings: Vec<Binding>,
    /// Each expression's SQL type (its output words are `i64`).
    pub types: Vec<DataType>,
}

impl ProjectionKernel {
    /// Buffers the kernel binds.
    pub fn buffers(&self) -> usize {
        2 + self.types.len()
            + self
                .bindings
                .iter()
                .map(|b| 1 + usize::from(b.nullable))
                .sum::<usize>()
    }
}

/// `exprs` over `schema` compiled into one kernel, or None where one of
/// them cannot run on the device: columns, constants, `+`, `-`, `*` and
/// casts of signed integers and decimals (≤ 18 digits in, values within
/// 64 bits out), NULLs propagated.
pub fn compile_projection(
    exprs: &[std::sync::Arc<dyn PhysicalExpr>],
    schema: &Schema,
) -> Option<ProjectionKernel> {
    let mut generator = Generator::new(schema, true);
    let mut outputs = Vec::new();
    for e in exprs {
        let data_type = e.data_type(schema).ok()?;
        scale_of(&data_type)?;
        let v = generator.expr(e)?;
        match &v.ty {
            Ty::Word(t) | Ty::Wide(t) if *t == data_type => {}
            _ => return None,
        }
        outputs.push((v, data_type));
    }
    let mut source = String::from(
        "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
         @group(0) @binding(1) var<storage, read_write> overflow: array<atomic<u32>>;\n",
    );
    for j in 0..outputs.len() {
        let _ = writeln!(
            source,
            "@group(0) @binding({}) var<storage, read_write> out{j}: array<i64>;",
            2 + j
        );
    }
    generator.declare_bindings(&mut source, 2 + outputs.len());
    let mut stores = String::new();
    for (j, (v, _)) in outputs.iter().enumerate() {
        let _ = writeln!(stores, "out{j}[row] = i64({});", v.v);
    }
    let bad = match generator.checks.is_empty() {
        true => "false".to_string(),
        false => generator.checks.join(" || "),
    };
    let _ = write!(
        source,
        "@compute @workgroup_size(256)\n\
         fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, \
         @builtin(local_invocation_index) lid: u32) {{\n\
         let row = (wid.y * nwg.x + wid.x) * 256u + lid;\n\
         if (row >= params[0]) {{ return; }}\n{}{stores}\
         if ({bad}) {{ atomicOr(&overflow[0], 1u); }}\n\
         }}\n",
        generator.body
    );
    Some(ProjectionKernel {
        source,
        bindings: generator.bindings,
        types: outputs.into_iter().map(|(_, t)| t).collect(),
    })
}

/// The decimal scale of an integer or decimal type the arithmetic takes
/// (integers: 0); None for other types.
fn scale_of(data_type: &DataType) -> Option<u32> {
    match data_type {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => Some(0),
        DataType::Decimal128(_, s) if *s >= 0 => Some(*s as u32),
        _ => None,
    }
}

/// The WGSL condition under which the `i64` value `v` is outside
/// `data_type`'s range (a decimal: its precision, where that is below 19
/// digits); None where every `i64` fits.
fn out_of_range(v: &str, data_type: &DataType) -> Option<String> {
    let bound = |lo: i64, hi: i64| {
        Some(format!(
            "({v} < {} || {v} > {})",
            i64_literal(lo),
            i64_literal(hi)
        ))
    };
    match data_type {
        DataType::Int8 => bound(i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => bound(i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => bound(i32::MIN.into(), i32::MAX.into()),
        DataType::Decimal128(p, _) if *p <= 18 => {
            let max = 10i64.pow(u32::from(*p)) - 1;
            bound(-max, max)
        }
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Ty {
    Bool,
    /// An integer word (`i32`/`i64`) of this SQL type.
    Word(DataType),
    /// An `i64` value of this SQL type (arithmetic's result).
    Wide(DataType),
    /// Text codes of binding k (only compared with constants).
    Code(usize),
    /// A text constant (only compared with codes).
    Text(String),
}

/// A generated value: WGSL names of its value and of whether it is NULL.
struct Val {
    v: String,
    n: String,
    ty: Ty,
}

struct Generator<'a> {
    schema: &'a Schema,
    body: String,
    next: usize,
    bindings: Vec<Binding>,
    texts: Vec<TextTest>,
    /// Whether `+ - *` and casts compile (a projection's kernel).
    arithmetic: bool,
    /// Conditions under which a row's arithmetic overflows.
    checks: Vec<String>,
}

impl<'a> Generator<'a> {
    fn new(schema: &'a Schema, arithmetic: bool) -> Self {
        Self {
            schema,
            body: String::new(),
            next: 0,
            bindings: Vec::new(),
            texts: Vec::new(),
            arithmetic,
            checks: Vec::new(),
        }
    }

    /// The bound columns' declarations, from binding `slot` on.
    fn declare_bindings(&self, source: &mut String, mut slot: usize) {
        for (k, b) in self.bindings.iter().enumerate() {
            let _ = writeln!(
                source,
                "@group(0) @binding({slot}) var<storage, read> c{k}: array<{}>;",
                b.repr.wgsl()
            );
            slot += 1;
            if b.nullable {
                let _ = writeln!(
                    source,
                    "@group(0) @binding({slot}) var<storage, read> m{k}: array<u32>;"
                );
                slot += 1;
            }
        }
    }

    /// `a` as an `i64` of `scale` (its own scale or more): multiplied by
    /// the power of ten between, the product checked.
    fn widen(&mut self, a: &Val, from: u32, scale: u32) -> Option<String> {
        let wide = format!("i64({})", a.v);
        if scale == from {
            return Some(wide);
        }
        let factor = 10i64.checked_pow(scale.checked_sub(from)?)?;
        let product = self.let_(
            format!("{wide} * {}", i64_literal(factor)),
            "false".into(),
            Ty::Wide(DataType::Int64),
        );
        let limit = i64::MAX / factor;
        self.check(
            &a.n,
            format!(
                "({wide} > {} || {wide} < {})",
                i64_literal(limit),
                i64_literal(-limit)
            ),
        );
        Some(product.v)
    }

    /// An overflow where the value (NULL where `null`) is not NULL.
    fn check(&mut self, null: &str, condition: String) {
        match null {
            "true" => {}
            "false" => self.checks.push(condition),
            n => self.checks.push(format!("(!{n} && {condition})")),
        }
    }

    /// `a op b` (`+ - *`) of integers and decimals, in `i64`, overflow
    /// and the result type's range checked.
    fn arith(&mut self, op: Operator, a: Val, b: Val, result: DataType) -> Option<Val> {
        // A NULL constant: left to the CPU (the host derives a result's
        // validity from its columns').
        if a.n == "true" || b.n == "true" {
            return None;
        }
        let (Ty::Word(ta) | Ty::Wide(ta)) = &a.ty else {
            return None;
        };
        let (Ty::Word(tb) | Ty::Wide(tb)) = &b.ty else {
            return None;
        };
        let (sa, sb, sr) = (scale_of(ta)?, scale_of(tb)?, scale_of(&result)?);
        let null = or_null(&a.n, &b.n);
        let (x, y, value) = match op {
            Operator::Plus | Operator::Minus => {
                let (x, y) = (self.widen(&a, sa, sr)?, self.widen(&b, sb, sr)?);
                let sign = if op == Operator::Plus { "+" } else { "-" };
                let r = format!("{x} {sign} {y}");
                (x, y, r)
            }
            Operator::Multiply if sr == sa + sb => {
                let (x, y) = (format!("i64({})", a.v), format!("i64({})", b.v));
                let r = format!("{x} * {y}");
                (x, y, r)
            }
            _ => return None,
        };
        let r = self.let_(value, null.clone(), Ty::Wide(result.clone()));
        let small = |v: &str| format!("({v} <= 2147483647li && {v} >= -2147483647li)");
        let overflow = match op {
            Operator::Plus => format!("((({x}) ^ {r}) & (({y}) ^ {r})) < 0li", r = r.v),
            Operator::Minus => format!("((({x}) ^ ({y})) & (({x}) ^ {r})) < 0li", r = r.v),
            // Factors within 31 bits cannot overflow; otherwise the
            // quotient tells.
            _ => format!(
                "!({} && {}) && (({x}) != 0li && ({r} / ({x}) != ({y}) || (({x}) == -1li && ({y}) == {})))",
                small(&x),
                small(&y),
                i64_literal(i64::MIN),
                r = r.v
            ),
        };
        self.check(&null, overflow);
        if let Some(range) = out_of_range(&r.v, &result) {
            self.check(&null, range);
        }
        Some(r)
    }

    /// A cast between integers and decimals that keeps every value (a
    /// wider type, or a larger scale; a narrower range checked).
    fn cast(&mut self, a: Val, to: DataType) -> Option<Val> {
        if a.n == "true" {
            return None;
        }
        let (Ty::Word(from) | Ty::Wide(from)) = &a.ty else {
            return None;
        };
        let (sa, sr) = (scale_of(from)?, scale_of(&to)?);
        let v = self.widen(&a, sa, sr)?;
        let r = self.let_(v, a.n.clone(), Ty::Wide(to.clone()));
        if let Some(range) = out_of_range(&r.v, &to) {
            self.check(&a.n, range);
        }
        Some(r)
    }

    /// A fresh `let` of `value` (and of `null`, unless it is a constant).
    fn let_(&mut self, value: String, null: String, ty: Ty) -> Val {
        let id = self.next;
        self.next += 1;
        let _ = writeln!(self.body, "let v{id} = {value};");
        let n = if null == "false" || null == "true" {
            null
        } else {
            let _ = writeln!(self.body, "let n{id} = {null};");
            format!("n{id}")
        };
        Val {
            v: format!("v{id}"),
            n,
            ty,
        }
    }

    fn binding(&mut self, column: usize, repr: Repr, nullable: bool) -> usize {
        if let Some(k) = self.bindings.iter().position(|b| b.column == column) {
            return k;
        }
        self.bindings.push(Binding {
            column,
            repr,
            nullable,
        });
        self.bindings.len() - 1
    }

    fn expr(&mut self, e: &std::sync::Arc<dyn PhysicalExpr>) -> Option<Val> {
        if let Some(c) = e.downcast_ref::<Column>() {
            return self.column(c);
        }
        if let Some(l) = e.downcast_ref::<Literal>() {
            return self.literal(l.value());
        }
        if let Some(b) = e.downcast_ref::<BinaryExpr>() {
            if self.arithmetic
                && matches!(
                    b.op(),
                    Operator::Plus | Operator::Minus | Operator::Multiply
                )
            {
                let result = e.data_type(self.schema).ok()?;
                let x = self.expr(b.left())?;
                let y = self.expr(b.right())?;
                return self.arith(*b.op(), x, y, result);
            }
            return self.binary(b.op(), b.left(), b.right());
        }
        if let Some(c) = e.downcast_ref::<CastExpr>() {
            if !self.arithmetic {
                return None;
            }
            let a = self.expr(c.expr())?;
            return self.cast(a, c.cast_type().clone());
        }
        if let Some(n) = e.downcast_ref::<NotExpr>() {
            let a = self.expr(n.arg())?;
            if a.ty != Ty::Bool {
                return None;
            }
            return Some(self.let_(format!("!{}", a.v), a.n, Ty::Bool));
        }
        if let Some(n) = e.downcast_ref::<IsNullExpr>() {
            let a = self.expr(n.arg())?;
            return Some(self.let_(a.n, "false".into(), Ty::Bool));
        }
        if let Some(n) = e.downcast_ref::<IsNotNullExpr>() {
            let a = self.expr(n.arg())?;
            return Some(self.let_(format!("!{}", a.n), "false".into(), Ty::Bool));
        }
        if let Some(list) = e.downcast_ref::<InListExpr>() {
            return self.in_list(list);
        }
        if let Some(like) = e.downcast_ref::<LikeExpr>() {
            return self.like(like);
        }
        None
    }

    fn column(&mut self, c: &Column) -> Option<Val> {
        let field = self.schema.fields().get(c.index())?;
        let repr = crate::columns::repr_of(field.data_type())?;
        let k = self.binding(c.index(), repr, field.is_nullable());
        let null = if field.is_nullable() {
            format!("((m{k}[row >> 5u] >> (row & 31u)) & 1u) == 0u")
        } else {
            "false".to_string()
        };
        Some(match repr {
            Repr::Bits => self.let_(
                format!("((c{k}[row >> 5u] >> (row & 31u)) & 1u) == 1u"),
                null,
                Ty::Bool,
            ),
            Repr::Code => self.let_(format!("c{k}[row]"), null, Ty::Code(k)),
            Repr::I32 | Repr::I64 => self.let_(
                format!("c{k}[row]"),
                null,
                Ty::Word(field.data_type().clone()),
            ),
        })
    }

    fn literal(&mut self, value: &ScalarValue) -> Option<Val> {
        let data_type = value.data_type();
        // Arithmetic reads a NUMERIC constant wider than 18 digits (an
        // integer constant is coerced to DECIMAL(20, 0)) whose value fits
        // 64 bits.
        if let ScalarValue::Decimal128(Some(x), p, _) = value
            && self.arithmetic
            && *p > 18
        {
            return Some(Val {
                v: i64_literal(i64::try_from(*x).ok()?),
                n: "false".into(),
                ty: Ty::Word(data_type),
            });
        }
        if let ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) = value {
            return Some(Val {
                v: String::new(),
                n: if s.is_none() { "true" } else { "false" }.into(),
                ty: Ty::Text(s.clone().unwrap_or_default()),
            });
        }
        let null = if value.is_null() { "true" } else { "false" };
        if let ScalarValue::Boolean(b) = value {
            return Some(Val {
                v: b.unwrap_or(false).to_string(),
                n: null.into(),
                ty: Ty::Bool,
            });
        }
        let encoded = encode(&value.to_array().ok()?)?;
        let bytes = encoded.values.as_slice();
        let v = match encoded.repr {
            Repr::I32 => i32_literal(i32::from_le_bytes(bytes.get(..4)?.try_into().ok()?)),
            Repr::I64 => i64_literal(i64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)),
            _ => return None,
        };
        Some(Val {
            v,
            n: null.into(),
            ty: Ty::Word(data_type),
        })
    }

    fn binary(
        &mut self,
        op: &Operator,
        left: &std::sync::Arc<dyn PhysicalExpr>,
        right: &std::sync::Arc<dyn PhysicalExpr>,
    ) -> Option<Val> {
        let a = self.expr(left)?;
        let b = self.expr(right)?;
        match op {
            Operator::And | Operator::Or => {
                if a.ty != Ty::Bool || b.ty != Ty::Bool {
                    return None;
                }
                // Kleene: a known false (AND) or true (OR) decides.
                let (decides_a, decides_b, value) = if *op == Operator::And {
                    (
                        format!("(!{} && !{})", a.n, a.v),
                        format!("(!{} && !{})", b.n, b.v),
                        format!("{} && {} && !{} && !{}", a.v, b.v, a.n, b.n),
                    )
                } else {
                    (
                        format!("(!{} && {})", a.n, a.v),
                        format!("(!{} && {})", b.n, b.v),
                        format!("(!{} && {}) || (!{} && {})", a.n, a.v, b.n, b.v),
                    )
                };
                let null = format!("!({decides_a} || {decides_b}) && ({} || {})", a.n, b.n);
                Some(self.let_(value, null, Ty::Bool))
            }
            Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq => self.compare(*op, a, b),
            _ => None,
        }
    }

    fn compare(&mut self, op: Operator, a: Val, b: Val) -> Option<Val> {
        let null = or_null(&a.n, &b.n);
        match (&a.ty, &b.ty) {
            (Ty::Code(_), Ty::Text(_)) => self.text_compare(op, a, b),
            (Ty::Text(_), Ty::Code(_)) => self.text_compare(op.swap()?, b, a),
            (Ty::Word(x), Ty::Word(y)) if x == y => {
                let value = format!("{} {} {}", a.v, wgsl_op(op)?, b.v);
                Some(self.let_(value, null, Ty::Bool))
            }
            (Ty::Bool, Ty::Bool) if matches!(op, Operator::Eq | Operator::NotEq) => {
                let value = format!("{} {} {}", a.v, wgsl_op(op)?, b.v);
                Some(self.let_(value, null, Ty::Bool))
            }
            _ => None,
        }
    }

    /// Codes against a constant's range `[lo, hi)` in the dictionary.
    fn text_compare(&mut self, op: Operator, codes: Val, text: Val) -> Option<Val> {
        let (Ty::Code(k), Ty::Text(s)) = (&codes.ty, &text.ty) else {
            return None;
        };
        let (lo, hi) = self.text_bounds(*k, TextBound::Equal(s.clone()));
        let c = &codes.v;
        let value = match op {
            Operator::Eq => format!("{c} >= {lo} && {c} < {hi}"),
            Operator::NotEq => format!("!({c} >= {lo} && {c} < {hi})"),
            Operator::Lt => format!("{c} < {lo}"),
            Operator::LtEq => format!("{c} < {hi}"),
            Operator::Gt => format!("{c} >= {hi}"),
            Operator::GtEq => format!("{c} >= {lo}"),
            _ => return None,
        };
        let null = or_null(&codes.n, &text.n);
        Some(self.let_(value, null, Ty::Bool))
    }

    /// The parameter slots of a text test's bounds.
    fn text_bounds(&mut self, binding: usize, bound: TextBound) -> (String, String) {
        let t = self.texts.len();
        self.texts.push(TextTest { binding, bound });
        (
            format!("params[{}u]", 1 + 2 * t),
            format!("params[{}u]", 2 + 2 * t),
        )
    }

    fn in_list(&mut self, list: &InListExpr) -> Option<Val> {
        let x = self.expr(list.expr())?;
        let mut terms = Vec::new();
        for item in list.list() {
            let item = self.expr(item)?;
            // A NULL in the list makes a miss NULL: left to the CPU.
            if item.n != "false" {
                return None;
            }
            let eq = self.compare(Operator::Eq, clone_val(&x), item)?;
            terms.push(eq.v);
        }
        if terms.is_empty() {
            return None;
        }
        let any = terms.join(" || ");
        let value = if list.negated() {
            format!("!({any})")
        } else {
            any
        };
        Some(self.let_(value, x.n, Ty::Bool))
    }

    /// `LIKE 'prefix%'` (no other wildcard, case-sensitive) on text codes.
    fn like(&mut self, like: &LikeExpr) -> Option<Val> {
        if like.case_insensitive() {
            return None;
        }
        let codes = self.expr(like.expr())?;
        let Ty::Code(k) = codes.ty else {
            return None;
        };
        let pattern = like.pattern().downcast_ref::<Literal>()?;
        let (ScalarValue::Utf8(Some(p))
        | ScalarValue::LargeUtf8(Some(p))
        | ScalarValue::Utf8View(Some(p))) = pattern.value()
        else {
            return None;
        };
        let prefix = p.strip_suffix('%')?;
        if prefix.contains(['%', '_', '\\']) {
            return None;
        }
        let (lo, hi) = self.text_bounds(k, TextBound::Prefix(prefix.to_string()));
        let c = &codes.v;
        let inside = format!("{c} >= {lo} && {c} < {hi}");
        let value = if like.negated() {
            format!("!({inside})")
        } else {
            inside
        };
        Some(self.let_(value, codes.n, Ty::Bool))
    }
}

fn clone_val(v: &Val) -> Val {
    Val {
        v: v.v.clone(),
        n: v.n.clone(),
        ty: v.ty.clone(),
    }
}

fn or_null(a: &str, b: &str) -> String {
    match (a, b) {
        ("true", _) | (_, "true") => "true".into(),
        ("false", x) | (x, "false") => x.into(),
        (x, y) => format!("({x} || {y})"),
    }
}

fn wgsl_op(op: Operator) -> Option<&'static str> {
    Some(match op {
        Operator::Eq => "==",
        Operator::NotEq => "!=",
        Operator::Lt => "<",
        Operator::LtEq => "<=",
        Operator::Gt => ">",
        Operator::GtEq => ">=",
        _ => return None,
    })
}

/// WGSL has no negative literals: `i32::MIN` is written as an expression.
fn i32_literal(x: i32) -> String {
    if x == i32::MIN {
        "(-2147483647i - 1i)".into()
    } else {
        format!("({x}i)")
    }
}

fn i64_literal(x: i64) -> String {
    if x == i64::MIN {
        "(-9223372036854775807li - 1li)".into()
    } else {
        format!("({x}li)")
    }
}
