//! Runtime code generation: hot expressions compiled to machine code.
//!
//! DataFusion evaluates an expression one operator at a time, each over the
//! whole batch: `l_extendedprice * (1 - l_discount) * (1 + l_tax)` makes
//! four arrays and reads each back; a filter of five comparisons makes five
//! bitmaps and ANDs them. [`JitExpr`] compiles such a tree with Cranelift
//! into one loop that reads each input once per row and writes the result
//! (CirroData does this with LLVM). The rule that places it is
//! `rules::jit` (`SET jit = off | on | force`).
//!
//! What compiles (everything else stays interpreted, as do the parts of a
//! tree around a compiled subtree):
//! - columns and non-NULL constants of the integer types, DATE, DECIMAL
//!   (128-bit) and the float types;
//! - `+ - *`: on floats as IEEE does them; on integers wrapping where
//!   DataFusion's operator wraps, and checked where Cirro's PostgreSQL
//!   operators (`checked_add`, … of `functions/checked.rs`) fail with
//!   22003; on decimals at Arrow's scales (a sum at the larger scale, a
//!   product at the sum of the scales), checked as Arrow checks them;
//! - widening casts of integers (to a wider integer or DOUBLE);
//! - `= <> < <= > >=` on integers, dates and decimals (not floats: Arrow
//!   orders them totally, NaN and -0 included);
//! - `AND`/`OR` in a filter's predicate, where reached from its root through
//!   AND/OR only: there NULL and false both drop the row, so the kernel may
//!   read NULL as false.
//!
//! Semantics are the interpreted path's, which stays the fallback and the
//! reference: NULLs are the union of the inputs' (every compiled node
//! propagates NULL; a filter's kernel with AND/OR takes the interpreted path
//! on batches whose inputs have NULLs); an operation that can overflow sets
//! a flag instead of failing, and a batch whose flag is set is evaluated
//! again interpreted, which gives the same value or the same error. Kernels
//! are cached per node ([`Kernels`], which the node hands to the rule) by
//! expression tree and input types ([`codegen`]); a [`JitExpr`] compiles on its first batch, so planning
//! (and EXPLAIN) costs nothing.

mod codegen;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, ArrayData, ArrayRef, BooleanArray, make_array};
use arrow::buffer::{BooleanBuffer, MutableBuffer, NullBuffer};
use arrow::datatypes::{DataType, Schema};
use arrow::record_batch::RecordBatch;
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{ColumnarValue, Operator};
use datafusion::physical_expr::expressions::{BinaryExpr, CastExpr, Column, Literal};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};

pub use codegen::{JitStats, Kernels};

/// A value type as the kernels see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Ty {
    I8,
    I16,
    I32,
    I64,
    /// DECIMAL(p ≤ 38, s): its unscaled value.
    I128,
    F32,
    F64,
}

impl Ty {
    pub(crate) fn bytes(self) -> usize {
        match self {
            Ty::I8 => 1,
            Ty::I16 => 2,
            Ty::I32 | Ty::F32 => 4,
            Ty::I64 | Ty::F64 => 8,
            Ty::I128 => 16,
        }
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    fn bits(self) -> u32 {
        self.bytes() as u32 * 8
    }

    pub(crate) fn clif(self) -> cranelift_codegen::ir::Type {
        use cranelift_codegen::ir::types;
        match self {
            Ty::I8 => types::I8,
            Ty::I16 => types::I16,
            Ty::I32 => types::I32,
            Ty::I64 => types::I64,
            Ty::I128 => types::I128,
            Ty::F32 => types::F32,
            Ty::F64 => types::F64,
        }
    }
}

/// A numeric type with its decimal scale (None for integers and floats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Num {
    ty: Ty,
    scale: Option<i8>,
}

impl Num {
    fn of(data_type: &DataType) -> Option<Num> {
        let (ty, scale) = match data_type {
            DataType::Int8 => (Ty::I8, None),
            DataType::Int16 => (Ty::I16, None),
            DataType::Int32 | DataType::Date32 => (Ty::I32, None),
            DataType::Int64 | DataType::Date64 => (Ty::I64, None),
            DataType::Float32 => (Ty::F32, None),
            DataType::Float64 => (Ty::F64, None),
            DataType::Decimal128(_, s) => (Ty::I128, Some(*s)),
            _ => return None,
        };
        Some(Num { ty, scale })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ArithOp {
    Add,
    Sub,
    Mul,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CmpOp {
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
}

/// What an integer operation does on overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Overflow {
    /// Wraps, as DataFusion's integer operators do (floats: IEEE).
    Wrap,
    /// Sets the kernel's flag: the batch is evaluated again interpreted.
    Flag,
}

/// A compiled expression's tree. Slots number the input columns in order of
/// first use.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    Column {
        slot: usize,
        ty: Ty,
    },
    /// A constant; floats as their bits.
    Const {
        ty: Ty,
        bits: i128,
    },
    Arith {
        op: ArithOp,
        overflow: Overflow,
        ty: Ty,
        left: Box<Node>,
        right: Box<Node>,
    },
    /// An integer widened to a wider integer or a float.
    Widen {
        to: Ty,
        input: Box<Node>,
    },
    /// A decimal's unscaled value times 10^k (`factor`, below 2^63): a
    /// smaller scale brought to a larger one.
    Scale {
        factor: i128,
        input: Box<Node>,
    },
    Cmp {
        op: CmpOp,
        left: Box<Node>,
        right: Box<Node>,
    },
    And(Vec<Node>),
    Or(Vec<Node>),
}

impl Node {
    /// The number of input slots.
    pub(crate) fn slots(&self) -> usize {
        match self {
            Node::Column { slot, .. } => slot + 1,
            Node::Const { .. } => 0,
            Node::Arith { left, right, .. } | Node::Cmp { left, right, .. } => {
                left.slots().max(right.slots())
            }
            Node::Widen { input, .. } | Node::Scale { input, .. } => input.slots(),
            Node::And(terms) | Node::Or(terms) => terms.iter().map(Node::slots).max().unwrap_or(0),
        }
    }

    /// Operations in the tree: what the rule weighs a compilation by.
    fn operations(&self) -> usize {
        match self {
            Node::Column { .. } | Node::Const { .. } => 0,
            Node::Arith { left, right, .. } | Node::Cmp { left, right, .. } => {
                1 + left.operations() + right.operations()
            }
            Node::Widen { input, .. } | Node::Scale { input, .. } => 1 + input.operations(),
            Node::And(terms) | Node::Or(terms) => {
                terms.len() - 1 + terms.iter().map(Node::operations).sum::<usize>()
            }
        }
    }

    /// AND/OR operations in the tree.
    fn logic_operations(&self) -> usize {
        match self {
            Node::And(terms) | Node::Or(terms) => {
                terms.len() - 1 + terms.iter().map(Node::logic_operations).sum::<usize>()
            }
            Node::Cmp { left, right, .. } | Node::Arith { left, right, .. } => {
                left.logic_operations() + right.logic_operations()
            }
            Node::Widen { input, .. } | Node::Scale { input, .. } => input.logic_operations(),
            Node::Column { .. } | Node::Const { .. } => 0,
        }
    }

    /// Comparisons in the tree.
    fn comparisons(&self) -> usize {
        match self {
            Node::Cmp { left, right, .. } => 1 + left.comparisons() + right.comparisons(),
            Node::Arith { left, right, .. } => left.comparisons() + right.comparisons(),
            Node::Widen { input, .. } | Node::Scale { input, .. } => input.comparisons(),
            Node::And(terms) | Node::Or(terms) => terms.iter().map(Node::comparisons).sum(),
            Node::Column { .. } | Node::Const { .. } => 0,
        }
    }

    fn has_logic(&self) -> bool {
        match self {
            Node::And(_) | Node::Or(_) => true,
            Node::Arith { left, right, .. } | Node::Cmp { left, right, .. } => {
                left.has_logic() || right.has_logic()
            }
            Node::Widen { input, .. } | Node::Scale { input, .. } => input.has_logic(),
            Node::Column { .. } | Node::Const { .. } => false,
        }
    }
}

/// What a kernel writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Output {
    Value(Ty),
    /// A bitmap (booleans).
    Bits,
}

/// What a translated subtree gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Num(Num),
    Bool,
}

/// Turns a DataFusion expression into a [`Node`] tree, or None where a
/// part of it does not compile.
struct Translator<'a> {
    schema: &'a Schema,
    /// The batch column of each slot.
    columns: Vec<usize>,
}

impl Translator<'_> {
    fn slot(&mut self, index: usize) -> usize {
        match self.columns.iter().position(|&c| c == index) {
            Some(slot) => slot,
            None => {
                self.columns.push(index);
                self.columns.len() - 1
            }
        }
    }

    /// `logic`: the node is reached from a filter's root through AND/OR only.
    fn translate(&mut self, expr: &Arc<dyn PhysicalExpr>, logic: bool) -> Option<(Node, Kind)> {
        let (node, kind) = self.node(expr, logic)?;
        // What the node computes must be what DataFusion says it returns.
        let declared = expr.data_type(self.schema).ok()?;
        match kind {
            Kind::Bool if declared == DataType::Boolean => {}
            Kind::Num(num) if Num::of(&declared) == Some(num) => {}
            _ => return None,
        }
        Some((node, kind))
    }

    fn node(&mut self, expr: &Arc<dyn PhysicalExpr>, logic: bool) -> Option<(Node, Kind)> {
        if let Some(column) = expr.downcast_ref::<Column>() {
            let field = self.schema.fields().get(column.index())?;
            if field.name() != column.name() {
                return None;
            }
            let num = Num::of(field.data_type())?;
            let slot = self.slot(column.index());
            return Some((Node::Column { slot, ty: num.ty }, Kind::Num(num)));
        }
        if let Some(literal) = expr.downcast_ref::<Literal>() {
            return constant(literal.value());
        }
        if let Some(binary) = expr.downcast_ref::<BinaryExpr>() {
            let op = *binary.op();
            if let Some(arith) = arith_op(op) {
                return self.arith(arith, Overflow::Wrap, binary.left(), binary.right());
            }
            if let Some(cmp) = cmp_op(op) {
                let (left, lk) = self.translate(binary.left(), false)?;
                let (right, rk) = self.translate(binary.right(), false)?;
                let (Kind::Num(l), Kind::Num(r)) = (lk, rk) else {
                    return None;
                };
                if l != r || l.ty.is_float() {
                    return None;
                }
                let node = Node::Cmp {
                    op: cmp,
                    left: Box::new(left),
                    right: Box::new(right),
                };
                return Some((node, Kind::Bool));
            }
            if logic && matches!(op, Operator::And | Operator::Or) {
                let mut terms = Vec::new();
                for side in [binary.left(), binary.right()] {
                    let (node, kind) = self.translate(side, true)?;
                    if kind != Kind::Bool {
                        return None;
                    }
                    // Flatten `a AND (b AND c)` into one list.
                    match (op, node) {
                        (Operator::And, Node::And(inner)) | (Operator::Or, Node::Or(inner)) => {
                            terms.extend(inner)
                        }
                        (_, node) => terms.push(node),
                    }
                }
                let node = if op == Operator::And {
                    Node::And(terms)
                } else {
                    Node::Or(terms)
                };
                return Some((node, Kind::Bool));
            }
            return None;
        }
        if let Some(function) = expr.downcast_ref::<ScalarFunctionExpr>() {
            let op = match function.name() {
                "checked_add" => ArithOp::Add,
                "checked_subtract" => ArithOp::Sub,
                "checked_multiply" => ArithOp::Mul,
                _ => return None,
            };
            let [left, right] = function.args() else {
                return None;
            };
            let (node, kind) = self.arith(op, Overflow::Flag, left, right)?;
            // Cirro's checked operators are for integers only.
            return matches!(kind, Kind::Num(Num { scale: None, ty }) if !ty.is_float())
                .then_some((node, kind));
        }
        if let Some(cast) = expr.downcast_ref::<CastExpr>() {
            let (input, kind) = self.translate(cast.expr(), false)?;
            let Kind::Num(from) = kind else {
                return None;
            };
            let to = Num::of(cast.cast_type())?;
            let integer = |n: Num| n.scale.is_none() && !n.ty.is_float();
            let widens = integer(from)
                && ((integer(to) && to.ty.bits() > from.ty.bits()) || to.ty == Ty::F64);
            // A cast to DATE reads the same bits but is not a widening.
            if !widens || matches!(cast.cast_type(), DataType::Date32 | DataType::Date64) {
                return None;
            }
            let node = Node::Widen {
                to: to.ty,
                input: Box::new(input),
            };
            return Some((node, Kind::Num(to)));
        }
        None
    }

    fn arith(
        &mut self,
        op: ArithOp,
        overflow: Overflow,
        left: &Arc<dyn PhysicalExpr>,
        right: &Arc<dyn PhysicalExpr>,
    ) -> Option<(Node, Kind)> {
        let (mut left, Kind::Num(l)) = self.translate(left, false)? else {
            return None;
        };
        let (mut right, Kind::Num(r)) = self.translate(right, false)? else {
            return None;
        };
        if l.ty != r.ty {
            return None;
        }
        let (overflow, scale) = match (l.scale, r.scale) {
            (None, None) if l.ty.is_float() => (Overflow::Wrap, None),
            (None, None) => (overflow, None),
            (Some(ls), Some(rs)) => {
                // Arrow checks decimal arithmetic whatever the operator.
                let scale = match op {
                    ArithOp::Mul => ls.checked_add(rs).filter(|s| *s <= 38)?,
                    ArithOp::Add | ArithOp::Sub => {
                        let scale = ls.max(rs);
                        left = rescale(left, scale - ls)?;
                        right = rescale(right, scale - rs)?;
                        scale
                    }
                };
                (Overflow::Flag, Some(scale))
            }
            _ => return None,
        };
        let node = Node::Arith {
            op,
            overflow,
            ty: l.ty,
            left: Box::new(left),
            right: Box::new(right),
        };
        Some((node, Kind::Num(Num { ty: l.ty, scale })))
    }
}

/// `node` (a decimal's unscaled value) brought up `by` decimal digits.
fn rescale(node: Node, by: i8) -> Option<Node> {
    if by == 0 {
        return Some(node);
    }
    let factor = 10i128.checked_pow(u32::try_from(by).ok()?)?;
    if let Node::Const { ty, bits } = node {
        return Some(Node::Const {
            ty,
            bits: bits.checked_mul(factor)?,
        });
    }
    (factor <= i64::MAX as i128).then(|| Node::Scale {
        factor,
        input: Box::new(node),
    })
}

fn constant(value: &ScalarValue) -> Option<(Node, Kind)> {
    let (ty, bits, scale) = match value {
        ScalarValue::Int8(Some(v)) => (Ty::I8, *v as i128, None),
        ScalarValue::Int16(Some(v)) => (Ty::I16, *v as i128, None),
        ScalarValue::Int32(Some(v)) | ScalarValue::Date32(Some(v)) => (Ty::I32, *v as i128, None),
        ScalarValue::Int64(Some(v)) | ScalarValue::Date64(Some(v)) => (Ty::I64, *v as i128, None),
        ScalarValue::Float32(Some(v)) => (Ty::F32, v.to_bits() as i128, None),
        ScalarValue::Float64(Some(v)) => (Ty::F64, v.to_bits() as i128, None),
        ScalarValue::Decimal128(Some(v), _, s) => (Ty::I128, *v, Some(*s)),
        _ => return None,
    };
    Some((Node::Const { ty, bits }, Kind::Num(Num { ty, scale })))
}

fn arith_op(op: Operator) -> Option<ArithOp> {
    match op {
        Operator::Plus => Some(ArithOp::Add),
        Operator::Minus => Some(ArithOp::Sub),
        Operator::Multiply => Some(ArithOp::Mul),
        _ => None,
    }
}

fn cmp_op(op: Operator) -> Option<CmpOp> {
    match op {
        Operator::Eq => Some(CmpOp::Eq),
        Operator::NotEq => Some(CmpOp::NotEq),
        Operator::Lt => Some(CmpOp::Lt),
        Operator::LtEq => Some(CmpOp::LtEq),
        Operator::Gt => Some(CmpOp::Gt),
        Operator::GtEq => Some(CmpOp::GtEq),
        _ => None,
    }
}

/// What one compiled expression did, shown in EXPLAIN ANALYZE.
#[derive(Debug, Default)]
struct Counters {
    /// Batches the kernel computed.
    batches: AtomicU64,
    /// Batches evaluated interpreted (an overflow flag, or NULLs under AND/OR).
    interpreted: AtomicU64,
}

/// An expression evaluated by a compiled kernel, the interpreted `inner`
/// kept as the fallback. In plans: `jit(inner)`; after execution (EXPLAIN
/// ANALYZE) with the kernel's origin (`compiled` now or `cached`), the
/// batches it computed and those left to the interpreted path.
#[derive(Debug)]
pub struct JitExpr {
    inner: Arc<dyn PhysicalExpr>,
    node: Node,
    output: Output,
    /// The batch column of each input slot.
    columns: Vec<usize>,
    data_type: DataType,
    /// A filter's predicate: NULL may read as false.
    filter: bool,
    /// The kernel, and whether it came from the cache; None if it could not
    /// be compiled (the expression is then interpreted).
    kernel: OnceLock<Option<(Arc<codegen::Kernel>, bool)>>,
    /// The node's kernel cache the kernel comes from.
    kernels: Arc<Kernels>,
    counters: Counters,
}

impl JitExpr {
    /// `expr` compiled against `schema`, or None where a part of it does not
    /// compile or it has no operation. `filter`: `expr` is a filter's
    /// predicate (AND/OR may then compile, NULL read as false). The kernel
    /// is compiled into (or found in) `kernels` when first run.
    pub fn try_new(
        expr: &Arc<dyn PhysicalExpr>,
        schema: &Schema,
        filter: bool,
        kernels: &Arc<Kernels>,
    ) -> Option<Self> {
        let mut translator = Translator {
            schema,
            columns: Vec::new(),
        };
        let (node, kind) = translator.translate(expr, filter)?;
        if translator.columns.is_empty() || node.operations() == 0 {
            return None;
        }
        let output = match kind {
            Kind::Bool => Output::Bits,
            Kind::Num(num) => Output::Value(num.ty),
        };
        Some(Self {
            inner: Arc::clone(expr),
            node,
            output,
            columns: translator.columns,
            data_type: expr.data_type(schema).ok()?,
            filter,
            kernel: OnceLock::new(),
            kernels: Arc::clone(kernels),
            counters: Counters::default(),
        })
    }

    /// The operations the kernel does per row.
    pub fn operations(&self) -> usize {
        self.node.operations()
    }

    /// Whether the kernel computes a condition (a bitmap) of comparisons
    /// only, and how many: what the rule weighs such a kernel by (arithmetic
    /// always pays).
    pub fn comparisons_only(&self) -> Option<usize> {
        let comparisons = self.node.comparisons();
        let arithmetic = self.node.operations() > comparisons + self.node.logic_operations();
        (self.output == Output::Bits && !arithmetic).then_some(comparisons)
    }

    /// The interpreted expression.
    pub fn inner(&self) -> &Arc<dyn PhysicalExpr> {
        &self.inner
    }

    /// Batches computed by the kernel and batches interpreted so far.
    pub fn batches(&self) -> (u64, u64) {
        (
            self.counters.batches.load(Ordering::Relaxed),
            self.counters.interpreted.load(Ordering::Relaxed),
        )
    }

    fn interpreted(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        self.counters.interpreted.fetch_add(1, Ordering::Relaxed);
        self.inner.evaluate(batch)
    }

    /// The kernel's result, or None where the batch must be interpreted.
    #[allow(unsafe_code)] // raw pointers into the batch for the kernel, see SAFETY
    fn compiled(&self, batch: &RecordBatch) -> Option<ArrayRef> {
        let (kernel, _) = self
            .kernel
            .get_or_init(|| self.kernels.kernel(&self.node, self.output))
            .as_ref()?;
        let rows = batch.num_rows();
        let mut pointers = Vec::with_capacity(self.columns.len());
        let mut nulls: Option<NullBuffer> = None;
        let mut slot_types = Vec::with_capacity(self.columns.len());
        self.node.slot_types(&mut slot_types);
        for (slot, &index) in self.columns.iter().enumerate() {
            let data = batch.columns().get(index)?.to_data();
            let ty = slot_types.get(slot).copied().flatten()?;
            // The plan's types are the batch's; checked here because the
            // kernel reads raw memory.
            if Num::of(data.data_type()).map(|n| n.ty) != Some(ty)
                || data.len() != rows
                || data.buffers().len() != 1
                || data.buffers()[0].len() < (data.offset() + rows) * ty.bytes()
            {
                return None;
            }
            // SAFETY: in bounds, checked just above.
            pointers.push(unsafe { data.buffers()[0].as_ptr().add(data.offset() * ty.bytes()) });
            nulls = NullBuffer::union(nulls.as_ref(), data.nulls());
        }
        if self.filter && nulls.is_some() && self.node.has_logic() {
            return None;
        }
        let out_bytes = match self.output {
            Output::Value(ty) => rows * ty.bytes(),
            Output::Bits => rows.div_ceil(64) * 8,
        };
        let mut out = MutableBuffer::from_len_zeroed(out_bytes);
        // SAFETY: one pointer per slot to `rows` values of its type, and
        // `out` sized as the kernel writes.
        let overflowed = unsafe { kernel.call(&pointers, out.as_mut_ptr(), rows) };
        if overflowed {
            return None;
        }
        let array: ArrayRef = match self.output {
            Output::Bits => {
                let values = BooleanBuffer::new(out.into(), 0, rows);
                if self.filter {
                    // NULL drops the row as false does.
                    let values = match &nulls {
                        Some(valid) => &values & valid.inner(),
                        None => values,
                    };
                    Arc::new(BooleanArray::new(values, None))
                } else {
                    Arc::new(BooleanArray::new(values, nulls))
                }
            }
            Output::Value(_) => {
                let data = ArrayData::builder(self.data_type.clone())
                    .len(rows)
                    .add_buffer(out.into())
                    .nulls(nulls)
                    .build()
                    .ok()?;
                make_array(data)
            }
        };
        Some(array)
    }
}

impl Node {
    /// Each slot's type, by slot.
    fn slot_types(&self, types: &mut Vec<Option<Ty>>) {
        match self {
            Node::Column { slot, ty } => {
                if types.len() <= *slot {
                    types.resize(slot + 1, None);
                }
                types[*slot] = Some(*ty);
            }
            Node::Const { .. } => {}
            Node::Arith { left, right, .. } | Node::Cmp { left, right, .. } => {
                left.slot_types(types);
                right.slot_types(types);
            }
            Node::Widen { input, .. } | Node::Scale { input, .. } => input.slot_types(types),
            Node::And(terms) | Node::Or(terms) => {
                terms.iter().for_each(|t| t.slot_types(types));
            }
        }
    }
}

impl fmt::Display for JitExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "jit({})", self.inner)?;
        let (batches, interpreted) = self.batches();
        if let Some(state) = self.kernel.get() {
            let origin = match state {
                Some((_, true)) => "cached",
                Some((_, false)) => "compiled",
                None => "not compiled",
            };
            write!(
                f,
                "[{origin}, batches={batches}, interpreted={interpreted}]"
            )?;
        }
        Ok(())
    }
}

impl PartialEq for JitExpr {
    fn eq(&self, other: &Self) -> bool {
        self.filter == other.filter && self.inner.as_ref() == other.inner.as_ref()
    }
}

impl Eq for JitExpr {}

impl Hash for JitExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.filter.hash(state);
        self.inner.hash(state);
    }
}

impl PhysicalExpr for JitExpr {
    fn data_type(&self, input_schema: &Schema) -> Result<DataType> {
        self.inner.data_type(input_schema)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.inner.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        match self.compiled(batch) {
            Some(array) => {
                self.counters.batches.fetch_add(1, Ordering::Relaxed);
                Ok(ColumnarValue::Array(array))
            }
            None => self.interpreted(batch),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.inner]
    }

    /// A rewrite of the inner expression (columns renumbered) is the inner
    /// expression's: the kernel is found again on the next batch.
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        Ok(children
            .into_iter()
            .next()
            .unwrap_or_else(|| Arc::clone(&self.inner)))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt_sql(f)
    }
}

#[cfg(test)]
mod tests;
