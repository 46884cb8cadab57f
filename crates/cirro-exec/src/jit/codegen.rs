//! Machine code for a [`Kernel`]'s expression tree, made with Cranelift, and
//! a node's cache of compiled kernels ([`Kernels`]).
//!
//! A kernel is one loop over a batch's rows:
//!
//! ```text
//! extern "C" fn(columns: *const *const u8, out: *mut u8, rows: u64) -> u8
//! ```
//!
//! `columns[k]` is the first value of input slot k (Arrow's value buffer at
//! the array's offset), `out` the output buffer: `rows` values of the
//! result's width, or for a boolean result `ceil(rows / 64)` 64-bit words of
//! bits, least significant first (Arrow's bitmap layout). NULLs are not seen
//! here: the caller unions the inputs' validity (every node propagates
//! NULL). The return value is nonzero when an operation that can overflow
//! did on some row (NULL rows included, whose values are arbitrary): the
//! caller then evaluates the batch the interpreted way, which gives the same
//! value or the same error DataFusion would. The check is a flag or'ed per
//! row, so the loop has no branch but its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{AbiParam, InstBuilder, MemFlagsData, Type, Value, types};
use cranelift_codegen::isa::TargetFrontendConfig;
use cranelift_codegen::settings::Configurable;
use cranelift_codegen::{Context, settings};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};

use super::{ArithOp, CmpOp, Node, Output, Overflow, Ty};

/// The signature of every kernel.
pub(crate) type KernelFn = unsafe extern "C" fn(*const *const u8, *mut u8, u64) -> u8;

/// A compiled expression: what [`super::JitExpr`] calls per batch.
#[derive(Debug)]
pub(crate) struct Kernel {
    func: KernelFn,
}

impl Kernel {
    /// Run the kernel over `rows` rows.
    ///
    /// # Safety
    /// `columns` must hold one pointer per input slot of the kernel's tree,
    /// each to at least `rows` values of the slot's type, and `out` room for
    /// the output (see the module's documentation).
    #[allow(unsafe_code)] // calls compiled code, see SAFETY
    pub(crate) unsafe fn call(&self, columns: &[*const u8], out: *mut u8, rows: usize) -> bool {
        // SAFETY: the caller's contract is the kernel's.
        unsafe { (self.func)(columns.as_ptr(), out, rows as u64) != 0 }
    }
}

/// The most kernels a node keeps. Compiled code is never freed (a
/// kernel can run in any query still holding its plan); past this bound an
/// expression is interpreted instead.
const MAX_KERNELS: usize = 4096;

/// Counts of a node's JIT work.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JitStats {
    /// Kernels compiled.
    pub compiled: u64,
    /// Times a kernel was found compiled already.
    pub cache_hits: u64,
    /// Expressions that could not be compiled (Cranelift refused, or the cache was full).
    pub failed: u64,
}

struct Jit {
    module: JITModule,
    context: Context,
    builder_context: FunctionBuilderContext,
    kernels: HashMap<(Node, Output), Arc<Kernel>>,
    /// The number of the next function: one per attempt, so a compilation
    /// that failed half-way leaves no name behind for the next to clash with.
    next_function: usize,
    stats: JitStats,
}

// SAFETY: `JITModule` holds raw code pointers and a `RefCell` symbol table;
// it is only ever touched under the mutex below, one thread at a time.
#[allow(unsafe_code)]
unsafe impl Send for Jit {}

/// One node's compiled kernels: Cranelift's module, made on first use (None
/// where this machine cannot generate code), and the kernels by expression.
/// The node owns one and the planning rule hands it to every expression it
/// compiles; the code it holds is never freed (Cranelift's module leaks it
/// on drop), so a kernel stays callable for as long as a plan holds it.
#[derive(Default)]
pub struct Kernels {
    jit: std::sync::OnceLock<Option<Mutex<Jit>>>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Kernels {
    fn jit(&self) -> Option<&Mutex<Jit>> {
        self.jit
            .get_or_init(|| {
                let module = new_module()
                    .map_err(|e| log::warn!("runtime code generation is unavailable: {e}"))
                    .ok()?;
                let context = module.make_context();
                Some(Mutex::new(Jit {
                    module,
                    context,
                    builder_context: FunctionBuilderContext::new(),
                    kernels: HashMap::new(),
                    next_function: 0,
                    stats: JitStats::default(),
                }))
            })
            .as_ref()
    }

    /// The counts of compiled kernels and cache hits.
    pub fn stats(&self) -> JitStats {
        self.jit
            .get()
            .and_then(Option::as_ref)
            .map(|jit| jit.lock().unwrap_or_else(|e| e.into_inner()).stats)
            .unwrap_or_default()
    }

    /// The kernel of `node` with `output`, compiled now or found in the cache
    /// (`true` when found); None where it cannot be compiled.
    pub(crate) fn kernel(&self, node: &Node, output: Output) -> Option<(Arc<Kernel>, bool)> {
        let mut jit = self.jit()?.lock().unwrap_or_else(|e| e.into_inner());
        let key = (node.clone(), output);
        if let Some(kernel) = jit.kernels.get(&key) {
            let kernel = Arc::clone(kernel);
            jit.stats.cache_hits += 1;
            return Some((kernel, true));
        }
        if jit.kernels.len() >= MAX_KERNELS {
            jit.stats.failed += 1;
            return None;
        }
        match jit.compile(node, output) {
            Ok(func) => {
                let kernel = Arc::new(Kernel { func });
                jit.kernels.insert(key, Arc::clone(&kernel));
                jit.stats.compiled += 1;
                Some((kernel, false))
            }
            Err(e) => {
                log::warn!("could not compile {node:?}: {e}");
                jit.stats.failed += 1;
                None
            }
        }
    }
}

fn new_module() -> Result<JITModule, String> {
    let mut flags = settings::builder();
    let set = |flags: &mut settings::Builder, name: &str, value: &str| {
        flags.set(name, value).map_err(|e| e.to_string())
    };
    set(&mut flags, "use_colocated_libcalls", "false")?;
    set(&mut flags, "is_pic", "false")?;
    set(&mut flags, "opt_level", "speed")?;
    let isa = cranelift_native::builder()
        .map_err(|e| e.to_string())?
        .finish(settings::Flags::new(flags))
        .map_err(|e| e.to_string())?;
    Ok(JITModule::new(JITBuilder::with_isa(
        isa,
        default_libcall_names(),
    )))
}

impl Jit {
    #[allow(unsafe_code)] // the compiled code's address as a function, see SAFETY
    fn compile(&mut self, node: &Node, output: Output) -> Result<KernelFn, String> {
        let config = self.module.target_config();
        let pointer = config.pointer_type();
        let mut signature = self.module.make_signature();
        signature.params.push(AbiParam::new(pointer));
        signature.params.push(AbiParam::new(pointer));
        signature.params.push(AbiParam::new(types::I64));
        signature.returns.push(AbiParam::new(types::I8));
        let name = format!("cirro_kernel_{}", self.next_function);
        self.next_function += 1;
        let id = self
            .module
            .declare_function(&name, Linkage::Local, &signature)
            .map_err(|e| e.to_string())?;
        self.module.clear_context(&mut self.context);
        self.context.func.signature = signature;
        {
            let builder = FunctionBuilder::new(&mut self.context.func, &mut self.builder_context);
            Emitter::new(builder, config).emit(node, output);
        }
        self.module
            .define_function(id, &mut self.context)
            .map_err(|e| format!("{e:?}"))?;
        self.module.clear_context(&mut self.context);
        self.module
            .finalize_definitions()
            .map_err(|e| e.to_string())?;
        let code = self.module.get_finalized_function(id);
        // SAFETY: the function was declared with exactly this signature.
        Ok(unsafe { std::mem::transmute::<*const u8, KernelFn>(code) })
    }
}

/// Emits one kernel's IR.
struct Emitter<'a> {
    b: FunctionBuilder<'a>,
    config: TargetFrontendConfig,
    pointer: Type,
    /// The first value of each input slot, loaded once.
    bases: Vec<Value>,
    /// The overflow flag (I8), or'ed per checked operation.
    flag: Variable,
}

impl<'a> Emitter<'a> {
    fn new(mut b: FunctionBuilder<'a>, config: TargetFrontendConfig) -> Self {
        let flag = b.declare_var(types::I8);
        Self {
            b,
            config,
            pointer: config.pointer_type(),
            bases: Vec::new(),
            flag,
        }
    }

    fn emit(mut self, node: &Node, output: Output) {
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let [columns, out, rows] = self.b.block_params(entry) else {
            unreachable!("the signature has three parameters")
        };
        let (columns, out, rows) = (*columns, *out, *rows);
        let slots = node.slots();
        for slot in 0..slots {
            let base = self.b.ins().load(
                self.pointer,
                MemFlagsData::trusted(),
                columns,
                (slot * std::mem::size_of::<usize>()) as i32,
            );
            self.bases.push(base);
        }
        let zero = self.b.ins().iconst(types::I8, 0);
        self.b.def_var(self.flag, zero);
        match output {
            Output::Value(ty) => self.value_loop(node, ty, out, rows),
            Output::Bits => self.bits_loop(node, out, rows),
        }
        let flag = self.b.use_var(self.flag);
        self.b.ins().return_(&[flag]);
        self.b.seal_all_blocks();
        self.b.finalize(self.config);
    }

    /// `for i in 0..rows { out[i] = node(i) }`
    fn value_loop(&mut self, node: &Node, ty: Ty, out: Value, rows: Value) {
        let i = self.b.declare_var(types::I64);
        let zero = self.b.ins().iconst(types::I64, 0);
        self.b.def_var(i, zero);
        let header = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);

        self.b.switch_to_block(header);
        let row = self.b.use_var(i);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, row, rows);
        self.b.ins().brif(more, body, &[], exit, &[]);

        self.b.switch_to_block(body);
        let row = self.b.use_var(i);
        let value = self.value(node, row);
        let offset = self.b.ins().imul_imm_s(row, ty.bytes() as i64);
        let address = self.b.ins().iadd(out, offset);
        self.b
            .ins()
            .store(MemFlagsData::trusted(), value, address, 0);
        let next = self.b.ins().iadd_imm_s(row, 1);
        self.b.def_var(i, next);
        self.b.ins().jump(header, &[]);

        self.b.switch_to_block(exit);
    }

    /// `for w in 0..ceil(rows / 64) { out[w] = bits of node(64w ..) }`: the
    /// inner loop runs to the word's end (or the last row) with one compare
    /// per row; Cranelift masks a shift's amount to the type's width, so bit
    /// `row % 64` is `1 << row`.
    fn bits_loop(&mut self, node: &Node, out: Value, rows: Value) {
        let row = self.b.declare_var(types::I64);
        let end = self.b.declare_var(types::I64);
        let word = self.b.declare_var(types::I64);
        let zero = self.b.ins().iconst(types::I64, 0);
        self.b.def_var(row, zero);
        self.b.def_var(end, zero);
        self.b.def_var(word, zero);
        let outer = self.b.create_block();
        let start = self.b.create_block();
        let inner = self.b.create_block();
        let body = self.b.create_block();
        let tail = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(outer, &[]);

        // outer: while row < rows
        self.b.switch_to_block(outer);
        let first = self.b.use_var(row);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, first, rows);
        self.b.ins().brif(more, start, &[], exit, &[]);

        // start: end = min(row + 64, rows); word = 0
        self.b.switch_to_block(start);
        let first = self.b.use_var(row);
        let full = self.b.ins().iadd_imm_s(first, 64);
        let last = self.b.ins().umin(full, rows);
        self.b.def_var(end, last);
        let zero = self.b.ins().iconst(types::I64, 0);
        self.b.def_var(word, zero);
        self.b.ins().jump(inner, &[]);

        // inner: while row < end
        self.b.switch_to_block(inner);
        let current = self.b.use_var(row);
        let last = self.b.use_var(end);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, current, last);
        self.b.ins().brif(more, body, &[], tail, &[]);

        self.b.switch_to_block(body);
        let current = self.b.use_var(row);
        let truth = self.truth(node, current);
        let truth = self.b.ins().uextend(types::I64, truth);
        let shifted = self.b.ins().ishl(truth, current);
        let bits = self.b.use_var(word);
        let bits = self.b.ins().bor(bits, shifted);
        self.b.def_var(word, bits);
        let next = self.b.ins().iadd_imm_s(current, 1);
        self.b.def_var(row, next);
        self.b.ins().jump(inner, &[]);

        // tail: out[(row - 1) / 64] = word
        self.b.switch_to_block(tail);
        let current = self.b.use_var(row);
        let previous = self.b.ins().iadd_imm_s(current, -1);
        let index = self.b.ins().ushr_imm_u(previous, 6);
        let offset = self.b.ins().ishl_imm_s(index, 3);
        let address = self.b.ins().iadd(out, offset);
        let bits = self.b.use_var(word);
        self.b
            .ins()
            .store(MemFlagsData::trusted(), bits, address, 0);
        self.b.ins().jump(outer, &[]);

        self.b.switch_to_block(exit);
    }

    fn raise(&mut self, overflowed: Value) {
        let flag = self.b.use_var(self.flag);
        let flag = self.b.ins().bor(flag, overflowed);
        self.b.def_var(self.flag, flag);
    }

    /// Whether an I128 fits an I64 (its high half is its low half's sign).
    fn fits_i64(&mut self, value: Value) -> (Value, Value) {
        let (low, high) = self.b.ins().isplit(value);
        let sign = self.b.ins().sshr_imm_s(low, 63);
        let fits = self.b.ins().icmp(IntCC::Equal, high, sign);
        (low, fits)
    }

    /// The full 128-bit product of two I64.
    fn wide_mul(&mut self, a: Value, b: Value) -> Value {
        let low = self.b.ins().imul(a, b);
        let high = self.b.ins().smulhi(a, b);
        self.b.ins().iconcat(low, high)
    }

    /// A numeric node's value on `row`.
    fn value(&mut self, node: &Node, row: Value) -> Value {
        match node {
            Node::Column { slot, ty } => {
                let offset = self.b.ins().imul_imm_s(row, ty.bytes() as i64);
                let address = self.b.ins().iadd(self.bases[*slot], offset);
                self.b
                    .ins()
                    .load(ty.clif(), MemFlagsData::trusted(), address, 0)
            }
            Node::Const { ty, bits } => self.constant(*ty, *bits),
            Node::Arith {
                op,
                overflow,
                ty,
                left,
                right,
            } => {
                let a = self.value(left, row);
                let b = self.value(right, row);
                self.arith(*op, *overflow, *ty, a, b)
            }
            Node::Widen { to, input } => {
                let value = self.value(input, row);
                if to.is_float() {
                    self.b.ins().fcvt_from_sint(to.clif(), value)
                } else {
                    self.b.ins().sextend(to.clif(), value)
                }
            }
            Node::Scale { factor, input } => {
                let value = self.value(input, row);
                let (low, fits) = self.fits_i64(value);
                let factor = self.b.ins().iconst(types::I64, *factor as i64);
                let product = self.wide_mul(low, factor);
                let overflowed = self.b.ins().bxor_imm_u(fits, 1);
                self.raise(overflowed);
                product
            }
            // Boolean nodes are roots or operands of AND/OR only.
            Node::Cmp { .. } | Node::And(_) | Node::Or(_) => self.truth(node, row),
        }
    }

    fn constant(&mut self, ty: Ty, bits: i128) -> Value {
        match ty {
            Ty::F64 => self.b.ins().f64const(f64::from_bits(bits as u64)),
            Ty::F32 => self.b.ins().f32const(f32::from_bits(bits as u32)),
            Ty::I128 => {
                let low = self.b.ins().iconst(types::I64, bits as i64);
                let high = self.b.ins().iconst(types::I64, (bits >> 64) as i64);
                self.b.ins().iconcat(low, high)
            }
            int => self.b.ins().iconst(int.clif(), bits as i64),
        }
    }

    fn arith(&mut self, op: ArithOp, overflow: Overflow, ty: Ty, a: Value, b: Value) -> Value {
        if ty.is_float() {
            return match op {
                ArithOp::Add => self.b.ins().fadd(a, b),
                ArithOp::Sub => self.b.ins().fsub(a, b),
                ArithOp::Mul => self.b.ins().fmul(a, b),
            };
        }
        let plain = |e: &mut Self, a: Value, b: Value| match op {
            ArithOp::Add => e.b.ins().iadd(a, b),
            ArithOp::Sub => e.b.ins().isub(a, b),
            ArithOp::Mul => e.b.ins().imul(a, b),
        };
        if overflow == Overflow::Wrap {
            return plain(self, a, b);
        }
        match (ty, op) {
            (Ty::I8 | Ty::I16 | Ty::I32, _) => {
                // Exact in 64 bits; overflowed if it does not narrow back.
                let wa = self.b.ins().sextend(types::I64, a);
                let wb = self.b.ins().sextend(types::I64, b);
                let wide = plain(self, wa, wb);
                let narrow = self.b.ins().ireduce(ty.clif(), wide);
                let back = self.b.ins().sextend(types::I64, narrow);
                let overflowed = self.b.ins().icmp(IntCC::NotEqual, back, wide);
                self.raise(overflowed);
                narrow
            }
            (_, ArithOp::Mul) if ty == Ty::I64 => {
                let low = self.b.ins().imul(a, b);
                let high = self.b.ins().smulhi(a, b);
                let sign = self.b.ins().sshr_imm_s(low, 63);
                let overflowed = self.b.ins().icmp(IntCC::NotEqual, high, sign);
                self.raise(overflowed);
                low
            }
            (_, ArithOp::Mul) => {
                // I128 (decimals): exact when both factors fit 64 bits; a
                // wider one is left to the interpreted path.
                let (la, fa) = self.fits_i64(a);
                let (lb, fb) = self.fits_i64(b);
                let product = self.wide_mul(la, lb);
                let both = self.b.ins().band(fa, fb);
                let overflowed = self.b.ins().bxor_imm_u(both, 1);
                self.raise(overflowed);
                product
            }
            (_, ArithOp::Add | ArithOp::Sub) => {
                // Two's complement: the sum overflowed iff both operands
                // (a and -b for a difference) have a sign the result lacks.
                let result = plain(self, a, b);
                let x = self.b.ins().bxor(a, result);
                let y = if op == ArithOp::Add {
                    self.b.ins().bxor(b, result)
                } else {
                    self.b.ins().bxor(a, b)
                };
                let both = self.b.ins().band(x, y);
                let high = if ty == Ty::I128 {
                    self.b.ins().isplit(both).1
                } else {
                    both
                };
                let overflowed = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, high, 0);
                self.raise(overflowed);
                result
            }
        }
    }

    /// A boolean node's value on `row`: an I8 of 0 or 1.
    fn truth(&mut self, node: &Node, row: Value) -> Value {
        match node {
            Node::Cmp { op, left, right } => {
                let a = self.value(left, row);
                let b = self.value(right, row);
                let cc = match op {
                    CmpOp::Eq => IntCC::Equal,
                    CmpOp::NotEq => IntCC::NotEqual,
                    CmpOp::Lt => IntCC::SignedLessThan,
                    CmpOp::LtEq => IntCC::SignedLessThanOrEqual,
                    CmpOp::Gt => IntCC::SignedGreaterThan,
                    CmpOp::GtEq => IntCC::SignedGreaterThanOrEqual,
                };
                self.b.ins().icmp(cc, a, b)
            }
            Node::And(terms) | Node::Or(terms) => {
                let and = matches!(node, Node::And(_));
                let mut acc = self.truth(&terms[0], row);
                for term in &terms[1..] {
                    let next = self.truth(term, row);
                    acc = if and {
                        self.b.ins().band(acc, next)
                    } else {
                        self.b.ins().bor(acc, next)
                    };
                }
                acc
            }
            _ => {
                let value = self.value(node, row);
                self.b.ins().icmp_imm_s(IntCC::NotEqual, value, 0)
            }
        }
    }
}
