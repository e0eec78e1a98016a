//! Calls out of a step: the shape-generic kernels (`rc_gemm_*`, `rc_map_*`, attention and
//! lookups) and the bounds-check report, all reached through the run table
//! ([`super::codegen::RunTable`]) so that machine code holds no address of the process that
//! built it.

use gccjit::{BinaryOp, ComparisonOp, LValue, RValue, ToRValue, Type};

use super::codegen::{
    HELPER_ATTENTION_F32, HELPER_GATHER_F32, HELPER_GEMM_BF16, HELPER_GEMM_EPI_F32,
    HELPER_GEMM_EPI_F64, HELPER_GEMM_F32, HELPER_GEMM_F64, HELPER_MAP_F32, HELPER_MAP_F64,
    HELPER_REPORT,
};
use super::emit::Gen;
use crate::low_level::{Call, Gemm, Index, Kernel, Map};
use crate::ops::Prec;
use crate::tnode::NodeId;

impl<'c> Gen<'c> {
    /// A local array of `i64` holding a kernel call's descriptor words (indices over the
    /// enclosing loops and runtime symbols).
    pub(super) fn words(&mut self, what: &str, desc: &[Index]) -> LValue<'c> {
        let arr_ty = self.ctx.new_array_type(None, self.t.i64, desc.len() as u64);
        let name = self.name(what);
        let arr = self.func.new_local(None, arr_ty, name);
        for (k, i) in desc.iter().enumerate() {
            let v = self.index(i);
            let slot = self.ctx.new_array_access(None, arr.to_rvalue(), self.long(k as i64));
            self.block.add_assignment(None, slot, v);
        }
        arr
    }

    /// A call of the shape-generic product through the run table: the descriptor in a local
    /// array, the operands' first cells.
    pub(super) fn gemm(&mut self, g: &Gemm) {
        let arr = self.words("gemm_desc", &g.descriptor());
        let c_ty = self.storage_type(g.prec).make_pointer();
        let factor_ty = if g.bf16_pairs { self.t.u16.make_pointer() } else { c_ty };
        let mut args = Vec::with_capacity(8);
        for o in g.operands() {
            let off = self.index(&o.offset);
            let base = self.ptrs[&o.node].to_rvalue();
            args.push(self.ctx.new_array_access(None, base, off).get_address(None));
        }
        let first = self.ctx.new_array_access(None, arr.to_rvalue(), self.long(0));
        args.push(first.get_address(None));
        let mut params = vec![c_ty, factor_ty, factor_ty, self.t.i64.make_pointer()];
        if let Some(e) = &g.epilogue {
            // The epilogue's own function, called by the kernel with this step's arguments.
            let void_ptr = self.ctx.new_type::<()>().make_pointer();
            let i64 = self.t.i64;
            let epi_ty = self.ctx.new_function_pointer_type(
                None,
                self.ctx.new_type::<()>(),
                &[void_ptr.make_pointer(), i64.make_pointer(), i64, i64, void_ptr, i64, i64],
                false,
            );
            let name = self.name(&format!("{}_epilogue", self.fn_name));
            let mut sub = Gen::with_signature(
                self.ctx,
                self.prog,
                self.slots,
                self.bounds_check,
                &name,
                true,
            );
            sub.epilogue_function(e);
            args.push(self.ctx.new_cast(None, sub.func.get_address(None), epi_ty));
            args.extend([self.bufs, self.syms, self.err]);
            params.extend([epi_ty, void_ptr.make_pointer(), i64.make_pointer(), void_ptr]);
        }
        let fty =
            self.ctx.new_function_pointer_type(None, self.ctx.new_type::<()>(), &params, false);
        let k = match (g.bf16_pairs, g.prec, g.epilogue.is_some()) {
            (true, ..) => HELPER_GEMM_BF16,
            (false, Prec::F64, false) => HELPER_GEMM_F64,
            (false, Prec::F64, true) => HELPER_GEMM_EPI_F64,
            (false, _, true) => HELPER_GEMM_EPI_F32,
            _ => HELPER_GEMM_F32,
        };
        let f = self.helper(k, fty);
        let call = self.ctx.new_call_through_ptr(None, f, &args);
        self.block.add_eval(None, call);
    }

    /// A kernel call (the fused attention, a lookup) through the run table: the tensors' first
    /// cells as `float *` (null for a gradient not wanted; a lookup's ids cast) and the
    /// descriptor's words.
    pub(super) fn call(&mut self, c: &Call) {
        let elem_ptr = self.storage_type(Prec::F32).make_pointer();
        let cells: Vec<RValue<'c>> = c
            .pointers()
            .into_iter()
            .map(|n| match n {
                Some(n) => self.ctx.new_cast(None, self.ptrs[&n].to_rvalue(), elem_ptr),
                None => self.ctx.new_null(elem_ptr),
            })
            .collect();
        let (what, helper) = match c.kernel() {
            Kernel::AttentionF32 => ("attention", HELPER_ATTENTION_F32),
            Kernel::GatherF32 => ("gather", HELPER_GATHER_F32),
        };
        self.pointers_call(what, helper, Prec::F32, &cells, &c.descriptor());
    }

    /// A call of the map kernel through the run table: the operands' first cells and the
    /// descriptor's words.
    pub(super) fn map(&mut self, m: &Map) {
        let cells: Vec<RValue<'c>> = m
            .operands()
            .map(|o| {
                let off = self.index(&o.offset);
                let base = self.ptrs[&o.node].to_rvalue();
                self.ctx.new_array_access(None, base, off).get_address(None)
            })
            .collect();
        let k = if m.prec == Prec::F64 { HELPER_MAP_F64 } else { HELPER_MAP_F32 };
        self.pointers_call("map", k, m.prec, &cells, &m.descriptor());
    }

    /// `helper(ptrs, desc)` for the kernels that take their tensors as an array of pointers
    /// (of `prec`'s storage type) and their sizes as an array of `i64` words, both locals.
    fn pointers_call(
        &mut self,
        what: &str,
        helper: usize,
        prec: Prec,
        cells: &[RValue<'c>],
        desc: &[Index],
    ) {
        let arr = self.words(&format!("{what}_desc"), desc);
        let elem_ptr = self.storage_type(prec).make_pointer();
        let ptrs_ty = self.ctx.new_array_type(None, elem_ptr, cells.len() as u64);
        let name = self.name(&format!("{what}_ptrs"));
        let ptrs = self.func.new_local(None, ptrs_ty, name);
        for (k, &cell) in cells.iter().enumerate() {
            let slot = self.ctx.new_array_access(None, ptrs.to_rvalue(), self.long(k as i64));
            self.block.add_assignment(None, slot, cell);
        }
        let fty = self.ctx.new_function_pointer_type(
            None,
            self.ctx.new_type::<()>(),
            &[elem_ptr.make_pointer(), self.t.i64.make_pointer()],
            false,
        );
        let f = self.helper(helper, fty);
        let first_ptr = self.ctx.new_array_access(None, ptrs.to_rvalue(), self.long(0));
        let first_word = self.ctx.new_array_access(None, arr.to_rvalue(), self.long(0));
        let call = self.ctx.new_call_through_ptr(
            None,
            f,
            &[first_ptr.get_address(None), first_word.get_address(None)],
        );
        self.block.add_eval(None, call);
    }

    pub(super) fn check(&mut self, node: NodeId, axis: usize, i: &Index, bound: usize) {
        let v = self.index(i);
        let tmp = self.new_local(self.t.i64, "chk");
        self.block.add_assignment(None, tmp, v);
        let zero = self.long(0);
        let lt0 = self.ctx.new_comparison(None, ComparisonOp::LessThan, tmp.to_rvalue(), zero);
        let b = self.long(bound as i64);
        let ge = self.ctx.new_comparison(None, ComparisonOp::GreaterThanEquals, tmp.to_rvalue(), b);
        let bad = self.ctx.new_binary_op(None, BinaryOp::LogicalOr, self.t.boolean, lt0, ge);
        let fail = self.new_block("oob");
        let ok = self.new_block("inb");
        self.block.end_with_conditional(None, bad, fail, ok);
        let fty = self.ctx.new_function_pointer_type(
            None,
            self.ctx.new_type::<()>(),
            &[self.err.get_type(), self.t.i64, self.t.i64, self.t.i64, self.t.i64],
            false,
        );
        let f = self.helper(HELPER_REPORT, fty);
        let args = [self.err, self.long(node.0 as i64), self.long(axis as i64), tmp.to_rvalue(), b];
        let call = self.ctx.new_call_through_ptr(None, f, &args);
        fail.add_eval(None, call);
        fail.end_with_void_return(None);
        self.block = ok;
    }

    /// A helper's address from the run table, as a function pointer of type `fty`. It is loaded
    /// into a local at the function's entry the first time it is needed, so loops call through
    /// a register.
    pub(super) fn helper(&mut self, k: usize, fty: Type<'c>) -> RValue<'c> {
        let p = match self.helper_ptrs.get(&k) {
            Some(p) => *p,
            None => {
                let void_ptr = self.ctx.new_type::<()>().make_pointer();
                let table = self.ctx.new_cast(None, self.err, void_ptr.make_pointer());
                let slot = self.ctx.new_array_access(None, table, self.long(k as i64));
                let p = self.func.new_local(None, void_ptr, format!("helper{k}"));
                self.entry.add_assignment(None, p, slot.to_rvalue());
                self.helper_ptrs.insert(k, p);
                p
            }
        };
        self.ctx.new_cast(None, p.to_rvalue(), fty)
    }
}
