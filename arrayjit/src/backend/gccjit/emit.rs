//! The libgccjit function of one step: its signature, buffer pointers, loops and statements.
//!
//! [`Gen`] holds what building one function needs (the context, the program, the function's
//! blocks and locals); its methods are spread over this file (control flow and addressing),
//! `expr.rs` (values, from the op table's lowerings), `convert.rs` (storage conversions),
//! `calls.rs` (kernel and run-table calls) and `inline_math.rs` (the `f32` special functions).

use gccjit::{
    BinaryOp, Block, ComparisonOp, Context, Function, FunctionType, LValue, RValue, ToRValue, Type,
};
use rustc_hash::FxHashMap;

use super::step::StepKind;
use crate::backend::c_syntax::nodes_of;
use crate::low_level::{Epilogue, Guard, IdxVar, Index, Limit, LocalId, Program, Stmt, Var};
use crate::ops::Prec;
use crate::tnode::{NodeId, row_major_strides};

/// The libgccjit types generated code uses.
pub(super) struct Types<'c> {
    pub(super) f32: Type<'c>,
    pub(super) f64: Type<'c>,
    pub(super) i64: Type<'c>,
    pub(super) u64: Type<'c>,
    pub(super) u16: Type<'c>,
    pub(super) u32: Type<'c>,
    pub(super) int: Type<'c>,
    pub(super) boolean: Type<'c>,
}

/// The builder of one function (a step's, or a product's epilogue's).
pub(super) struct Gen<'c> {
    pub(super) ctx: &'c Context<'static>,
    pub(super) prog: &'c Program,
    pub(super) t: Types<'c>,
    pub(super) func: Function<'c>,
    /// The function's first block: loads of helper addresses.
    pub(super) entry: Block<'c>,
    /// Where the function's code begins.
    pub(super) start: Block<'c>,
    pub(super) block: Block<'c>,
    pub(super) bufs: RValue<'c>,
    pub(super) syms: RValue<'c>,
    pub(super) lo: RValue<'c>,
    pub(super) hi: RValue<'c>,
    pub(super) err: RValue<'c>,
    pub(super) slots: &'c [NodeId],
    pub(super) ptrs: FxHashMap<NodeId, LValue<'c>>,
    pub(super) vars: FxHashMap<Var, LValue<'c>>,
    /// Locals made for loop limits so far (for unique names).
    pub(super) limits: u32,
    pub(super) locals: FxHashMap<LocalId, LValue<'c>>,
    /// The run table's helper addresses, loaded once per function when first needed.
    pub(super) helper_ptrs: FxHashMap<usize, LValue<'c>>,
    /// The call's seeds, by number, loaded once per function when first needed.
    pub(super) seeds: FxHashMap<u64, LValue<'c>>,
    /// C library functions declared as plain external functions (see [`Gen::libm_call`]).
    pub(super) libm: FxHashMap<String, Function<'c>>,
    pub(super) bounds_check: bool,
    pub(super) fresh: usize,
    /// The function's name (its epilogues' names start with it).
    pub(super) fn_name: String,
    /// An epilogue function's first and last column (else unused).
    pub(super) cols: Option<(RValue<'c>, RValue<'c>)>,
}

impl<'c> Gen<'c> {
    /// A step's function: `(bufs, syms, lo, hi, err)`, exported.
    pub(super) fn new(
        ctx: &'c Context<'static>,
        prog: &'c Program,
        slots: &'c [NodeId],
        bounds_check: bool,
        name: &str,
    ) -> Gen<'c> {
        Gen::with_signature(ctx, prog, slots, bounds_check, name, false)
    }

    /// A step's function, or with `epilogue` an epilogue's ([`crate::kernels::EpilogueFn`]:
    /// `(bufs, syms, row0, row1, err, col0, col1)`, internal to the build).
    pub(super) fn with_signature(
        ctx: &'c Context<'static>,
        prog: &'c Program,
        slots: &'c [NodeId],
        bounds_check: bool,
        name: &str,
        epilogue: bool,
    ) -> Gen<'c> {
        let void_ptr = ctx.new_type::<()>().make_pointer();
        let t = Types {
            f32: ctx.new_type::<f32>(),
            f64: ctx.new_type::<f64>(),
            i64: ctx.new_type::<i64>(),
            u64: ctx.new_type::<u64>(),
            u16: ctx.new_type::<u16>(),
            u32: ctx.new_type::<u32>(),
            int: ctx.new_type::<i32>(),
            boolean: ctx.new_type::<bool>(),
        };
        let mut params = vec![
            ctx.new_parameter(None, void_ptr.make_pointer(), "bufs"),
            ctx.new_parameter(None, t.i64.make_pointer(), "syms"),
            ctx.new_parameter(None, t.i64, "lo"),
            ctx.new_parameter(None, t.i64, "hi"),
            ctx.new_parameter(None, void_ptr, "err"),
        ];
        if epilogue {
            params.push(ctx.new_parameter(None, t.i64, "col0"));
            params.push(ctx.new_parameter(None, t.i64, "col1"));
        }
        let kind = if epilogue { FunctionType::Internal } else { FunctionType::Exported };
        let func = ctx.new_function(None, kind, ctx.new_type::<()>(), &params, name, false);
        // Helper addresses are loaded in `entry`, which jumps to `start` once the function is
        // complete; the code proper begins in `start`.
        let entry = func.new_block("entry");
        let block = func.new_block("start");
        Gen {
            entry,
            start: block,
            ctx,
            prog,
            t,
            func,
            block,
            bufs: params[0].to_rvalue(),
            syms: params[1].to_rvalue(),
            lo: params[2].to_rvalue(),
            hi: params[3].to_rvalue(),
            err: params[4].to_rvalue(),
            slots,
            ptrs: FxHashMap::default(),
            vars: FxHashMap::default(),
            limits: 0,
            locals: FxHashMap::default(),
            helper_ptrs: FxHashMap::default(),
            seeds: FxHashMap::default(),
            libm: FxHashMap::default(),
            bounds_check,
            fresh: 0,
            fn_name: name.to_string(),
            cols: epilogue.then(|| (params[5].to_rvalue(), params[6].to_rvalue())),
        }
    }

    pub(super) fn name(&mut self, base: &str) -> String {
        self.fresh += 1;
        format!("{base}{}", self.fresh)
    }

    pub(super) fn new_block(&mut self, base: &str) -> Block<'c> {
        let name = self.name(base);
        self.func.new_block(name)
    }

    pub(super) fn new_local(&mut self, ty: Type<'c>, base: &str) -> LValue<'c> {
        let name = self.name(base);
        self.func.new_local(None, ty, name)
    }

    pub(super) fn storage_type(&self, prec: Prec) -> Type<'c> {
        match prec {
            Prec::F16 | Prec::Bf16 => self.t.u16,
            Prec::F32 => self.t.f32,
            Prec::F64 => self.t.f64,
            Prec::U32 => self.t.u32,
        }
    }

    pub(super) fn compute_type(&self, prec: Prec) -> Type<'c> {
        if prec == Prec::F64 { self.t.f64 } else { self.t.f32 }
    }

    pub(super) fn function(&mut self, body: &[Stmt], kind: &StepKind) {
        self.pointers(body);
        match kind {
            StepKind::Serial => self.stmts(body),
            StepKind::Parallel { .. } => match body {
                [Stmt::For { var, limit, body, .. }] => {
                    let (lo, hi) = (self.lo, self.hi);
                    let hi = self.limited(hi, *limit);
                    self.for_loop(*var, lo, hi, body);
                }
                other => self.stmts(other),
            },
        }
        self.block.end_with_void_return(None);
        self.entry.end_with_jump(None, self.start);
    }

    /// An epilogue's function: its body on rows `lo..hi` × columns `col0..col1`, each row and
    /// column split into the epilogue's variables.
    pub(super) fn epilogue_function(&mut self, e: &Epilogue) {
        self.pointers(&e.body);
        let (lo, hi) = (self.lo, self.hi);
        let (c0, c1) = self.cols.expect("an epilogue's function has columns");
        self.counted(lo, hi, |g, row| {
            g.split(row, &e.rows);
            g.counted(c0, c1, |g, col| {
                g.split(col, &e.cols);
                g.stmts(&e.body);
            });
        });
        self.block.end_with_void_return(None);
        self.entry.end_with_jump(None, self.start);
    }

    /// A loop of a fresh counter from `from` to `to`, `body` given the counter.
    pub(super) fn counted(
        &mut self,
        from: RValue<'c>,
        to: RValue<'c>,
        body: impl FnOnce(&mut Self, RValue<'c>),
    ) {
        let x = self.new_local(self.t.i64, "n");
        self.loop_over(x, from, to, |g| body(g, x.to_rvalue()));
    }

    /// Sets the variables of an epilogue axis (outermost first) from the axis' position.
    pub(super) fn split(&mut self, x: RValue<'c>, axis: &[(Var, usize)]) {
        let mut rest = x;
        for (k, &(v, extent)) in axis.iter().enumerate().rev() {
            let l = self.var(v);
            if k == 0 {
                self.block.add_assignment(None, l, rest);
                break;
            }
            let e = self.long(extent as i64);
            let r = self.ctx.new_binary_op(None, BinaryOp::Modulo, self.t.i64, rest, e);
            self.block.add_assignment(None, l, r);
            let q = self.ctx.new_binary_op(None, BinaryOp::Divide, self.t.i64, rest, e);
            rest = self.temp(q, self.t.i64);
        }
    }

    /// Typed buffer pointers for every node the statements touch.
    pub(super) fn pointers(&mut self, body: &[Stmt]) {
        for n in nodes_of(body) {
            let node = &self.prog.nodes[&n];
            let elem = self.storage_type(node.prec);
            let ty = elem.make_pointer();
            let ptr = self.func.new_local(None, ty, format!("p_n{}", n.0));
            if self.prog.scratch_of(n).is_some_and(|s| s.per_thread) {
                // A small array on this function's stack: private to the calling thread, and
                // known to GCC not to alias any buffer.
                let len = node.num_elements().max(1) as u64;
                let arr_ty = self.ctx.new_array_type(None, elem, len);
                let arr = self.func.new_local(None, arr_ty, format!("a_n{}", n.0));
                let zero = self.ctx.new_rvalue_zero(self.t.i64);
                let first = self.ctx.new_array_access(None, arr.to_rvalue(), zero);
                self.block.add_assignment(None, ptr, first.get_address(None));
            } else {
                let slot = self.slots.iter().position(|s| *s == n).unwrap_or(0);
                let idx = self.ctx.new_rvalue_from_long(self.t.i64, slot as i64);
                let raw = self.ctx.new_array_access(None, self.bufs, idx).to_rvalue();
                self.block.add_assignment(None, ptr, self.ctx.new_cast(None, raw, ty));
            }
            self.ptrs.insert(n, ptr);
        }
    }

    pub(super) fn stmts(&mut self, body: &[Stmt]) {
        for s in body {
            self.stmt(s);
        }
    }

    pub(super) fn var(&mut self, v: Var) -> LValue<'c> {
        if let Some(l) = self.vars.get(&v) {
            return *l;
        }
        let l = self.func.new_local(None, self.t.i64, format!("v{}", v.0));
        self.vars.insert(v, l);
        l
    }

    /// `min(to, ceil(size / per))` for a loop with a [`Limit`] (a dynamic batch's rows), else
    /// `to`.
    pub(super) fn limited(&mut self, to: RValue<'c>, limit: Option<Limit>) -> RValue<'c> {
        let Some(Limit { size, per }) = limit else { return to };
        let slot = self.prog.symbol_slot(size).unwrap_or(0) as i64;
        let n = self.ctx.new_array_access(None, self.syms, self.long(slot)).to_rvalue();
        let per = per as i64;
        let sum = self.ctx.new_binary_op(None, BinaryOp::Plus, self.t.i64, n, self.long(per - 1));
        let rows = self.ctx.new_binary_op(None, BinaryOp::Divide, self.t.i64, sum, self.long(per));
        let out = self.func.new_local(None, self.t.i64, format!("limit{}", self.limits));
        self.limits += 1;
        self.block.add_assignment(None, out, to);
        let less = self.ctx.new_comparison(None, ComparisonOp::LessThan, rows, to);
        let lower = self.new_block("limit");
        let after = self.new_block("limited");
        self.block.end_with_conditional(None, less, lower, after);
        lower.add_assignment(None, out, rows);
        lower.end_with_jump(None, after);
        self.block = after;
        out.to_rvalue()
    }

    pub(super) fn for_loop(&mut self, var: Var, from: RValue<'c>, to: RValue<'c>, body: &[Stmt]) {
        let v = self.var(var);
        self.loop_over(v, from, to, |g| g.stmts(body));
    }

    /// `for (x = from; x < to; ++x) body`.
    pub(super) fn loop_over(
        &mut self,
        x: LValue<'c>,
        from: RValue<'c>,
        to: RValue<'c>,
        body: impl FnOnce(&mut Self),
    ) {
        let cond = self.new_block("cond");
        let inner = self.new_block("body");
        let after = self.new_block("after");
        self.block.add_assignment(None, x, from);
        self.block.end_with_jump(None, cond);
        let test = self.ctx.new_comparison(None, ComparisonOp::LessThan, x.to_rvalue(), to);
        cond.end_with_conditional(None, test, inner, after);
        self.block = inner;
        body(self);
        let one = self.ctx.new_rvalue_one(self.t.i64);
        self.block.add_assignment_op(None, x, BinaryOp::Plus, one);
        self.block.end_with_jump(None, cond);
        self.block = after;
    }

    pub(super) fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::Comment(c) => self.block.add_comment(None, c),
            Stmt::For { var, extent, limit, body, .. } => {
                let zero = self.ctx.new_rvalue_zero(self.t.i64);
                let to = self.ctx.new_rvalue_from_long(self.t.i64, *extent as i64);
                let to = self.limited(to, *limit);
                self.for_loop(*var, zero, to, body);
            }
            Stmt::If { guards, body } => self.guarded(guards, body),
            Stmt::Set { node, idx, value } => {
                let prec = self.prog.nodes[node].prec;
                let ty = self.compute_type(self.prog.compute_prec(value, prec));
                let v = self.expr(value, ty);
                let cell = self.cell(*node, idx);
                let stored = self.storage_value(v, prec);
                self.block.add_assignment(None, cell, stored);
            }
            Stmt::SetLocal { local, value } => {
                let prec = self.prog.locals[local.0 as usize];
                let lty = self.compute_type(prec);
                let ty = self.compute_type(self.prog.compute_prec(value, prec));
                let v = self.expr(value, ty);
                let l = self.local(*local);
                let v = if ty == lty { v } else { self.ctx.new_cast(None, v, lty) };
                self.block.add_assignment(None, l, v);
            }
            Stmt::Gemm(g) => self.gemm(g),
            Stmt::Map(m) => self.map(m),
            Stmt::Call(c) => self.call(c),
        }
    }

    /// `if (every guard's index is within its bound) body`.
    fn guarded(&mut self, guards: &[Guard], body: &[Stmt]) {
        let mut cond: Option<RValue<'c>> = None;
        for g in guards {
            let i = self.index(&g.index);
            let zero = self.ctx.new_rvalue_zero(self.t.i64);
            let bound = self.ctx.new_rvalue_from_long(self.t.i64, g.bound as i64);
            let ge = self.ctx.new_comparison(None, ComparisonOp::GreaterThanEquals, i, zero);
            let lt = self.ctx.new_comparison(None, ComparisonOp::LessThan, i, bound);
            let both = self.ctx.new_binary_op(None, BinaryOp::LogicalAnd, self.t.boolean, ge, lt);
            cond = Some(match cond {
                None => both,
                Some(c) => {
                    self.ctx.new_binary_op(None, BinaryOp::LogicalAnd, self.t.boolean, c, both)
                }
            });
        }
        let then = self.new_block("then");
        let after = self.new_block("endif");
        let cond = cond.unwrap_or_else(|| self.ctx.new_rvalue_one(self.t.boolean));
        self.block.end_with_conditional(None, cond, then, after);
        self.block = then;
        self.stmts(body);
        self.block.end_with_jump(None, after);
        self.block = after;
    }

    pub(super) fn local(&mut self, l: LocalId) -> LValue<'c> {
        if let Some(x) = self.locals.get(&l) {
            return *x;
        }
        let ty = self.compute_type(self.prog.locals[l.0 as usize]);
        let x = self.func.new_local(None, ty, format!("t{}", l.0));
        self.locals.insert(l, x);
        x
    }

    pub(super) fn long(&self, v: i64) -> RValue<'c> {
        self.ctx.new_rvalue_from_long(self.t.i64, v)
    }

    pub(super) fn index(&mut self, i: &Index) -> RValue<'c> {
        let mut acc: Option<RValue<'c>> = None;
        for &(c, x) in &i.terms {
            let v = match x {
                IdxVar::Loop(v) => self.var(v).to_rvalue(),
                IdxVar::Sym(s) => {
                    let slot = self.prog.symbol_slot(s).unwrap_or(0) as i64;
                    self.ctx.new_array_access(None, self.syms, self.long(slot)).to_rvalue()
                }
            };
            let term = if c == 1 {
                v
            } else {
                self.ctx.new_binary_op(None, BinaryOp::Mult, self.t.i64, self.long(c), v)
            };
            acc = Some(match acc {
                None => term,
                Some(a) => self.ctx.new_binary_op(None, BinaryOp::Plus, self.t.i64, a, term),
            });
        }
        match acc {
            None => self.long(i.offset),
            Some(a) if i.offset == 0 => a,
            Some(a) => {
                self.ctx.new_binary_op(None, BinaryOp::Plus, self.t.i64, a, self.long(i.offset))
            }
        }
    }

    pub(super) fn cell(&mut self, node: NodeId, idx: &[Index]) -> LValue<'c> {
        let dims = self.prog.nodes[&node].dims.clone();
        if self.bounds_check {
            for (axis, (i, &d)) in idx.iter().zip(&dims).enumerate() {
                self.check(node, axis, i, d);
            }
        }
        let strides = row_major_strides(&dims);
        let mut terms = Vec::new();
        let mut offset = 0;
        for (i, s) in idx.iter().zip(strides) {
            terms.extend(i.terms.iter().map(|&(c, x)| (c * s as i64, x)));
            offset += i.offset * s as i64;
        }
        let flat = self.index(&Index::new(terms, offset));
        let ptr = self.ptrs[&node].to_rvalue();
        self.ctx.new_array_access(None, ptr, flat)
    }
}
