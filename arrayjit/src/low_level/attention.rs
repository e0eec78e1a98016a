//! The fused attention call in loop nests, and its expansion into ordinary nests.
//!
//! Lowering turns an [`AttentionAsgn`] into loops over its (batch, head) pairs around one
//! [`AttentionCall`] each: distinct pairs touch disjoint cells, so the loops are parallel and
//! the native backend splits them across its threads like any other nest, each iteration a
//! call of [`crate::kernels::attention`] for one pair. The call keeps the scores out of memory,
//! which no loop nest of this IR can: its temporaries are blocks of one thread's cache.
//!
//! Every other backend (the interpreter, CUDA, the C listing; the native one in bounds-check
//! mode, which checks every access of generated code, and for routines run once) gets the
//! same computation as ordinary nests over a score tensor `P` of `[batch…, s, h, t]` cells
//! (and its gradient `dS` backward), from [`super::expand_calls`], run before the memory plan so
//! that those two get arena slots like any intermediate:
//!
//! ```text
//! forward:  P = scale·q·kᵀ (−∞ where t > s, causal)   per row: m = max P, P = exp(P − m),
//!           l = Σ P, lse = m + log l, P = P / l        out = P·v
//! backward: P = exp(scale·q·kᵀ − lse) (0 where t > s)  per row: D = Σ dO·O,
//!           dS = P·(dO·vᵀ − D)·scale                   dq += dS·k, dk += dSᵀ·q, dv += Pᵀ·dO
//! ```

use std::fmt;

use super::{Expr, Index, Limit, LocalId, Program, Stmt, Var};
use crate::assignments::AttentionAsgn;
use crate::kernels::attention::{Attention, DESC_LEN};
use crate::ops::{BinOp, Prec, TernOp, UnOp};
use crate::tnode::{MemoryMode, NodeId, TensorNode};

/// One (batch, head) pair of an attention: the kernel call the native backend makes.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionCall {
    /// The tensors, flags and batch limit.
    pub asgn: AttentionAsgn,
    /// The sizes (the batch axes flattened).
    pub sizes: Attention,
    /// The batch axes' sizes, outermost first (their product is `sizes.batch`).
    pub batch_dims: Vec<usize>,
    /// The pair: `batch · heads + head`, affine in the enclosing loops.
    pub pair: Index,
}

impl AttentionCall {
    /// Every node the call reads or writes.
    pub fn nodes(&self) -> Vec<NodeId> {
        let mut out = self.asgn.read();
        out.extend(self.asgn.written());
        out.sort();
        out.dedup();
        out
    }

    /// The call with every node renamed by `f`.
    pub fn map_nodes(&self, mut f: impl FnMut(NodeId) -> NodeId) -> AttentionCall {
        let mut c = self.clone();
        let a = &mut c.asgn;
        for n in [&mut a.q, &mut a.k, &mut a.v, &mut a.out, &mut a.lse] {
            *n = f(*n);
        }
        if let Some(g) = &mut a.grads {
            g.d_out = f(g.d_out);
            for n in [&mut g.d_q, &mut g.d_k, &mut g.d_v].into_iter().flatten() {
                *n = f(*n);
            }
        }
        c
    }

    /// The pointers the kernel takes, in its order (`q, k, v, out, lse, d_out, d_q, d_k, d_v`),
    /// `None` for those this pass does not have.
    pub fn pointers(&self) -> [Option<NodeId>; 9] {
        let a = &self.asgn;
        let g = a.grads.as_ref();
        [
            Some(a.q),
            Some(a.k),
            Some(a.v),
            Some(a.out),
            Some(a.lse),
            g.map(|g| g.d_out),
            g.and_then(|g| g.d_q),
            g.and_then(|g| g.d_k),
            g.and_then(|g| g.d_v),
        ]
    }

    /// The descriptor words ([`Attention::descriptor`]), the pair's affine in the enclosing
    /// loops.
    pub fn descriptor(&self) -> [Index; DESC_LEN] {
        let words = self.sizes.descriptor(self.asgn.grads.is_some(), 0);
        std::array::from_fn(|k| {
            if k == DESC_LEN - 1 { self.pair.clone() } else { Index::fixed(words[k]) }
        })
    }

    /// Multiply-adds of one call (the causal half where masked).
    pub fn steps(&self) -> usize {
        let s = &self.sizes;
        let cells = if s.causal {
            (0..s.queries).map(|i| (i + 1).min(s.keys)).sum::<usize>()
        } else {
            s.queries * s.keys
        };
        let products = if self.asgn.grads.is_some() { 5 } else { 2 };
        cells.saturating_mul(s.depth.max(s.width)).saturating_mul(products)
    }
}

impl fmt::Display for AttentionCall {
    /// The assignment's text, with the pair: `n5, n6 := attention(n1, n2, n3; causal,
    /// scale=0.25) pair 4*v0 + v1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} pair {}", self.asgn, self.pair)
    }
}

/// The first id of the score tensors the expansion adds: a range no context hands out
/// (contexts number their nodes from 0), so an expansion never names another tensor.
pub const SCORE_NODES: u32 = 0xF000_0000;

/// The ordinary nests of one attention's calls (see the module documentation), adding their
/// score tensors to the program.
pub(super) fn expand(prog: &mut Program, call: &AttentionCall) -> Vec<Stmt> {
    Nests::new(prog, call).build()
}

/// The builder of one attention's nests.
struct Nests<'a> {
    prog: &'a mut Program,
    call: &'a AttentionCall,
    /// Arithmetic precision of the locals.
    compute: Prec,
}

/// The axes a nest runs over, in the tensors' terms.
#[derive(Copy, Clone, PartialEq)]
enum Ax {
    Query,
    Key,
    Head,
    Depth,
    Width,
}

/// A nest's loops: the batch axes, then `axes`; and the index of each.
struct Loops {
    loops: Vec<(Var, usize, Option<Limit>)>,
    batch: Vec<Index>,
    at: Vec<(Ax, Index)>,
}

impl Loops {
    /// A cell of `node` at the batch indices then `rest`.
    fn get(&self, node: NodeId, rest: &[Index]) -> Expr {
        Expr::Get(node, self.batch.iter().chain(rest).cloned().collect())
    }

    /// The store of `value` into a cell of `node` at the batch indices then `rest`.
    fn set(&self, node: NodeId, rest: &[Index], value: Expr) -> Stmt {
        Stmt::Set { node, idx: self.batch.iter().chain(rest).cloned().collect(), value }
    }

    fn of(&self, ax: Ax) -> Index {
        self.at.iter().find(|(a, _)| *a == ax).map(|(_, i)| i.clone()).expect("a loop of the nest")
    }

    /// `body` in the loops, all parallel (distinct iterations write distinct cells).
    fn wrap(&self, body: Vec<Stmt>) -> Vec<Stmt> {
        self.loops.iter().rev().fold(body, |body, &(var, extent, limit)| {
            vec![Stmt::For { var, extent, limit, parallel: true, body }]
        })
    }
}

impl<'a> Nests<'a> {
    fn new(prog: &'a mut Program, call: &'a AttentionCall) -> Nests<'a> {
        let compute = prog.nodes[&call.asgn.q].prec.compute();
        Nests { prog, call, compute }
    }

    /// The size of an axis.
    fn size(&self, ax: Ax) -> usize {
        let s = &self.call.sizes;
        match ax {
            Ax::Query => s.queries,
            Ax::Key => s.keys,
            Ax::Head => s.heads,
            Ax::Depth => s.depth,
            Ax::Width => s.width,
        }
    }

    /// Fresh loops over the batch axes (the first limited by the batch's dynamic size) and
    /// `axes`.
    fn loops(&mut self, axes: &[Ax]) -> Loops {
        let mut l = Loops { loops: vec![], batch: vec![], at: vec![] };
        let limit = self.call.asgn.batch_limit.map(|size| Limit { size, per: 1 });
        for (k, &extent) in self.call.batch_dims.iter().enumerate() {
            let v = self.prog.fresh_var();
            l.loops.push((v, extent, if k == 0 { limit } else { None }));
            l.batch.push(Index::var(v));
        }
        for &ax in axes {
            let v = self.prog.fresh_var();
            l.loops.push((v, self.size(ax), None));
            l.at.push((ax, Index::var(v)));
        }
        l
    }

    /// `acc := 0; for x in 0..extent { acc := fma(a(x), b(x), acc) }`.
    fn dot(
        &mut self,
        acc: LocalId,
        extent: usize,
        terms: impl Fn(Index) -> (Expr, Expr),
    ) -> [Stmt; 2] {
        let x = self.prog.fresh_var();
        let (a, b) = terms(Index::var(x));
        let step = Expr::Ternop(TernOp::Fma, Box::new(a), Box::new(b), Box::new(Expr::Local(acc)));
        [
            Stmt::SetLocal { local: acc, value: Expr::Const(0.0) },
            Stmt::For {
                var: x,
                extent,
                limit: None,
                parallel: false,
                body: vec![Stmt::SetLocal { local: acc, value: step }],
            },
        ]
    }

    /// A score tensor `[batch…, s, h, t]` in the queries' precision.
    fn score_node(&mut self, label: &str) -> NodeId {
        let taken = self.prog.nodes.keys().filter(|n| n.0 >= SCORE_NODES).count() as u32;
        let id = NodeId(SCORE_NODES + taken);
        let s = &self.call.sizes;
        let mut dims = self.call.batch_dims.clone();
        dims.extend([s.queries, s.heads, s.keys]);
        let prec = self.prog.nodes[&self.call.asgn.q].prec;
        let node = TensorNode::new(id, label, &dims, prec, MemoryMode::Local);
        self.prog.nodes.insert(id, node);
        id
    }

    /// `where(t > s, masked, value)` when causal, else `value`.
    fn masked(&self, l: &Loops, masked: f64, value: Expr) -> Expr {
        if !self.call.sizes.causal {
            return value;
        }
        let after = Expr::Binop(
            BinOp::Lt,
            Box::new(Expr::IndexValue(l.of(Ax::Query))),
            Box::new(Expr::IndexValue(l.of(Ax::Key))),
        );
        Expr::Ternop(TernOp::Where, Box::new(after), Box::new(Expr::Const(masked)), Box::new(value))
    }

    /// `scale·q·kᵀ` for the loops' query and key, into `acc` (the statements computing it).
    fn score(&mut self, l: &Loops, acc: LocalId) -> [Stmt; 2] {
        let (q, k) = (self.call.asgn.q, self.call.asgn.k);
        let (s, t, h) = (l.of(Ax::Query), l.of(Ax::Key), l.of(Ax::Head));
        let batch = l.batch.clone();
        let cell = move |n: NodeId, pos: &Index, d: &Index| {
            let idx = batch.iter().chain([pos, &h, d]).cloned().collect();
            Expr::Get(n, idx)
        };
        self.dot(acc, self.call.sizes.depth, |d| (cell(q, &s, &d), cell(k, &t, &d)))
    }

    fn build(mut self) -> Vec<Stmt> {
        match self.call.asgn.grads.is_some() {
            false => self.forward(),
            true => self.backward(),
        }
    }

    fn forward(&mut self) -> Vec<Stmt> {
        let a = self.call.asgn.clone();
        let p = self.score_node("attention_scores");
        let scale = Expr::Const(self.call.asgn.scale);
        let mut out = vec![Stmt::Comment("attention: scores".into())];
        // P = scale·q·kᵀ, −∞ where masked.
        let l = self.loops(&[Ax::Query, Ax::Head, Ax::Key]);
        let acc = self.prog.fresh_local(self.compute);
        let mut body = self.score(&l, acc).to_vec();
        let scaled = Expr::Binop(BinOp::Mul, Box::new(Expr::Local(acc)), Box::new(scale));
        let value = self.masked(&l, f64::NEG_INFINITY, scaled);
        let (s, h, t) = (l.of(Ax::Query), l.of(Ax::Head), l.of(Ax::Key));
        body.push(l.set(p, &[s, h, t], value));
        out.extend(l.wrap(body));
        out.push(Stmt::Comment("attention: softmax".into()));
        out.extend(self.softmax_rows(p, a.lse));
        out.push(Stmt::Comment("attention: output".into()));
        // out = P·v.
        let l = self.loops(&[Ax::Query, Ax::Head, Ax::Width]);
        let acc = self.prog.fresh_local(self.compute);
        let (s, h, e) = (l.of(Ax::Query), l.of(Ax::Head), l.of(Ax::Width));
        let mut body = self
            .dot(acc, self.call.sizes.keys, |t| {
                (
                    l.get(p, &[s.clone(), h.clone(), t.clone()]),
                    l.get(a.v, &[t, h.clone(), e.clone()]),
                )
            })
            .to_vec();
        body.push(l.set(a.out, &[s, h, e], Expr::Local(acc)));
        out.extend(l.wrap(body));
        out
    }

    /// Per row of `p`: `m = max`, `p = exp(p − m)`, `l = Σ p`, `lse = m + log l`, `p = p / l`.
    fn softmax_rows(&mut self, p: NodeId, lse: NodeId) -> Vec<Stmt> {
        let l = self.loops(&[Ax::Query, Ax::Head]);
        let (s, h) = (l.of(Ax::Query), l.of(Ax::Head));
        let keys = self.call.sizes.keys;
        let (m, sum, x) = (
            self.prog.fresh_local(self.compute),
            self.prog.fresh_local(self.compute),
            self.prog.fresh_local(self.compute),
        );
        let mut row = |f: &mut dyn FnMut(Expr, Index) -> Vec<Stmt>| {
            let t = self.prog.fresh_var();
            let cell = l.get(p, &[s.clone(), h.clone(), Index::var(t)]);
            let body = f(cell, Index::var(t));
            Stmt::For { var: t, extent: keys, limit: None, parallel: false, body }
        };
        let bin = |op, a: Expr, b: Expr| Expr::Binop(op, Box::new(a), Box::new(b));
        let pidx =
            |t: Index| l.batch.iter().cloned().chain([s.clone(), h.clone(), t]).collect::<Vec<_>>();
        let max_loop = row(&mut |cell, _| {
            vec![Stmt::SetLocal { local: m, value: bin(BinOp::Max, Expr::Local(m), cell) }]
        });
        let exp_loop = row(&mut |cell, t| {
            let e = Expr::Unop(UnOp::Exp, Box::new(bin(BinOp::Sub, cell, Expr::Local(m))));
            vec![
                Stmt::SetLocal { local: x, value: e },
                Stmt::Set { node: p, idx: pidx(t), value: Expr::Local(x) },
                Stmt::SetLocal {
                    local: sum,
                    value: bin(BinOp::Add, Expr::Local(sum), Expr::Local(x)),
                },
            ]
        });
        let div_loop = row(&mut |cell, t| {
            vec![Stmt::Set {
                node: p,
                idx: pidx(t),
                value: bin(BinOp::Div, cell, Expr::Local(sum)),
            }]
        });
        let log_l = Expr::Unop(UnOp::Log, Box::new(Expr::Local(sum)));
        let body = vec![
            Stmt::SetLocal { local: m, value: Expr::Const(f64::NEG_INFINITY) },
            max_loop,
            Stmt::SetLocal { local: sum, value: Expr::Const(0.0) },
            exp_loop,
            l.set(lse, &[s.clone(), h.clone()], bin(BinOp::Add, Expr::Local(m), log_l)),
            div_loop,
        ];
        l.wrap(body)
    }

    fn backward(&mut self) -> Vec<Stmt> {
        let a = self.call.asgn.clone();
        let g = a.grads.clone().expect("a backward call");
        let (p, ds) =
            (self.score_node("attention_probs"), self.score_node("attention_score_grads"));
        let scale = self.call.asgn.scale;
        let bin = |op, a: Expr, b: Expr| Expr::Binop(op, Box::new(a), Box::new(b));
        let mut out = vec![Stmt::Comment("attention gradient: probabilities".into())];
        // P = exp(scale·q·kᵀ − lse), 0 where masked.
        let l = self.loops(&[Ax::Query, Ax::Head, Ax::Key]);
        let acc = self.prog.fresh_local(self.compute);
        let (s, h, t) = (l.of(Ax::Query), l.of(Ax::Head), l.of(Ax::Key));
        let mut body = self.score(&l, acc).to_vec();
        let shifted = bin(
            BinOp::Sub,
            bin(BinOp::Mul, Expr::Local(acc), Expr::Const(scale)),
            l.get(a.lse, &[s.clone(), h.clone()]),
        );
        let value = self.masked(&l, 0.0, Expr::Unop(UnOp::Exp, Box::new(shifted)));
        body.push(l.set(p, &[s, h, t], value));
        out.extend(l.wrap(body));
        out.push(Stmt::Comment("attention gradient: score gradients".into()));
        out.extend(self.score_grads(p, ds, &g));
        let prods: [(Option<NodeId>, [Ax; 3], NodeId, NodeId); 3] = [
            (g.d_q, [Ax::Query, Ax::Depth, Ax::Key], ds, a.k),
            (g.d_k, [Ax::Key, Ax::Depth, Ax::Query], ds, a.q),
            (g.d_v, [Ax::Key, Ax::Width, Ax::Query], p, g.d_out),
        ];
        for (grad, axes, scores, other) in prods {
            let Some(grad) = grad else { continue };
            out.push(Stmt::Comment("attention gradient: a product".into()));
            out.extend(self.grad_product(grad, axes, scores, other));
        }
        out
    }

    /// Per row: `D = Σ dO·O`, then `dS = P·(dO·vᵀ − D)·scale` for every key.
    fn score_grads(
        &mut self,
        p: NodeId,
        ds: NodeId,
        g: &crate::assignments::AttentionGrads,
    ) -> Vec<Stmt> {
        let a = self.call.asgn.clone();
        let scale = self.call.asgn.scale;
        let width = self.call.sizes.width;
        let l = self.loops(&[Ax::Query, Ax::Head]);
        let (s, h) = (l.of(Ax::Query), l.of(Ax::Head));
        let (big_d, acc) =
            (self.prog.fresh_local(self.compute), self.prog.fresh_local(self.compute));
        let mut body = self
            .dot(big_d, width, |e| {
                let at = [s.clone(), h.clone(), e];
                (l.get(g.d_out, &at), l.get(a.out, &at))
            })
            .to_vec();
        let t = self.prog.fresh_var();
        let ti = Index::var(t);
        let mut row = self
            .dot(acc, width, |e| {
                let (gi, vi) = ([s.clone(), h.clone(), e.clone()], [ti.clone(), h.clone(), e]);
                (l.get(g.d_out, &gi), l.get(a.v, &vi))
            })
            .to_vec();
        let bin = |op, a: Expr, b: Expr| Expr::Binop(op, Box::new(a), Box::new(b));
        let cell = [s.clone(), h.clone(), ti.clone()];
        let diff = bin(BinOp::Sub, Expr::Local(acc), Expr::Local(big_d));
        let value = bin(BinOp::Mul, bin(BinOp::Mul, l.get(p, &cell), diff), Expr::Const(scale));
        row.push(l.set(ds, &cell, value));
        body.push(Stmt::For {
            var: t,
            extent: self.call.sizes.keys,
            limit: None,
            parallel: false,
            body: row,
        });
        l.wrap(body)
    }

    /// `grad[pos, h, col] += Σ_over scores[s, h, t]·other[over, h, col]` over the loops of
    /// `pos`, the heads and `col`, then the reduction `over`; `scores` indexed by query and key.
    fn grad_product(
        &mut self,
        grad: NodeId,
        [pos, col, over]: [Ax; 3],
        scores: NodeId,
        other: NodeId,
    ) -> Vec<Stmt> {
        let l = self.loops(&[pos, Ax::Head, col]);
        let acc = self.prog.fresh_local(self.compute);
        let (pi, hi, ci) = (l.of(pos), l.of(Ax::Head), l.of(col));
        let extent = self.size(over);
        let mut body = self
            .dot(acc, extent, |r| {
                let (s, t) =
                    if over == Ax::Key { (pi.clone(), r.clone()) } else { (r.clone(), pi.clone()) };
                (l.get(scores, &[s, hi.clone(), t]), l.get(other, &[r, hi.clone(), ci.clone()]))
            })
            .to_vec();
        let cell = [pi.clone(), hi.clone(), ci.clone()];
        let sum = Expr::Binop(BinOp::Add, Box::new(l.get(grad, &cell)), Box::new(Expr::Local(acc)));
        body.push(l.set(grad, &cell, sum));
        l.wrap(body)
    }
}
