//! One function per distinct step: steps that differ only in which buffers they touch share
//! their machine code.
//!
//! GCC spends a few milliseconds on every function it compiles, however small (about 3 ms at
//! `-O1` and 8 ms at `-O3` for a two-loop nest on a Zen 4 core), and a model's routine is
//! hundreds of small steps, many of them the same code on different tensors: the layers of a
//! transformer, the heads' projections, the same gradient rule applied to tensors of one shape.
//! A step's code depends on its statements, the dims and precisions of its tensors and its
//! kind, not on which tensors they are: buffers come from a table passed at each call. So each
//! step is put in a canonical form — nodes, loop variables and locals renumbered in order of
//! first appearance — and steps with equal canonical forms are compiled once. Each call keeps
//! its own buffer table, in the canonical node order.
//!
//! The canonical program is also what the compile cache keys on, so two routines that compile
//! to the same distinct steps share a cache entry whatever their node numbering.
//!
//! Random-number seeds are values, not code: a canonical step names its seeds by number
//! (`uniform(0, …)` is the step's first seed) and each call passes its own seeds in one more
//! slot of its buffer table, after the nodes. So a parameter initialization or a dropout mask
//! with another seed (another `Graph::with_seed`, another run of the same script) calls the
//! same machine code and finds it in the compile cache.

use rustc_hash::FxHashMap;

use super::step::StepKind;
use crate::low_level::{Expr, IdxVar, Index, LocalId, Program, Scratch, Stmt, Var};
use crate::ops::Prec;
use crate::tnode::{NodeId, TensorNode};

/// The distinct steps of a planned program and the calls that run them.
#[derive(Debug)]
pub struct Deduped {
    /// The distinct steps' program: its nodes are the canonical ones (numbered per distinct
    /// step from a base, so that no two steps share one), its locals are the canonical locals
    /// of every distinct step, its symbols are the original program's.
    pub prog: Program,
    /// The distinct steps, in order of first call.
    pub steps: Vec<(Vec<Stmt>, StepKind)>,
    /// Per distinct step, its canonical nodes in buffer-table order.
    pub slots: Vec<Vec<NodeId>>,
    /// Per distinct step, everything its machine code depends on within the program (its
    /// canonical statements, kind, tensors' dims, precisions and scratch kinds, locals'
    /// precisions), as text: the step's identity across routines.
    pub keys: Vec<String>,
    /// Per original step, in run order: the distinct step it calls and the real node behind
    /// each of that step's slots.
    pub calls: Vec<Call>,
}

/// One call of a distinct step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The distinct step.
    pub step: usize,
    /// The real node of each slot.
    pub nodes: Vec<NodeId>,
    /// The seed behind each of the step's seed numbers.
    pub seeds: Vec<u64>,
}

impl Deduped {
    /// The real node a call touches where its step's code names the canonical node `canon`.
    pub fn real_node(&self, call: usize, canon: NodeId) -> Option<NodeId> {
        let c = &self.calls[call];
        let j = self.slots[c.step].iter().position(|n| *n == canon)?;
        c.nodes.get(j).copied()
    }
}

/// Groups the steps of a planned program by canonical form.
pub fn dedup(prog: &Program, steps: &[(Vec<Stmt>, StepKind)]) -> Deduped {
    let mut out = Program { name: prog.name.clone(), ..empty_like(prog) };
    let mut by_key: FxHashMap<String, usize> = FxHashMap::default();
    let mut distinct: Vec<(Vec<Stmt>, StepKind)> = Vec::new();
    let mut slots: Vec<Vec<NodeId>> = Vec::new();
    let mut keys: Vec<String> = Vec::new();
    let mut calls = Vec::with_capacity(steps.len());
    for (body, kind) in steps {
        let mut c = Canon::default();
        let canon_body = c.stmts(body);
        let key = key(prog, &canon_body, kind, &c);
        let step = match by_key.get(&key) {
            Some(&d) => d,
            None => {
                // Globally unique canonical ids: a base per distinct step.
                let node_base = out.nodes.len() as u32;
                let local_base = out.locals.len() as u32;
                let mut nodes = Vec::with_capacity(c.nodes.len());
                for (j, real) in c.nodes.iter().enumerate() {
                    let id = NodeId(node_base + j as u32);
                    let mut node: TensorNode = prog.nodes[real].clone();
                    node.id = id;
                    out.nodes.insert(id, node);
                    if let Some(s) = prog.scratch_of(*real) {
                        out.scratch.push(Scratch { node: id, per_thread: s.per_thread });
                    }
                    nodes.push(id);
                }
                out.locals.extend(c.locals.iter().map(|l| prog.locals[l.0 as usize]));
                let rebased: Vec<Stmt> =
                    canon_body.iter().map(|s| rebase(s, node_base, local_base)).collect();
                out.next_var = out.next_var.max(c.vars.len() as u32);
                distinct.push((rebased, kind.clone()));
                slots.push(nodes);
                keys.push(key.clone());
                by_key.insert(key, distinct.len() - 1);
                distinct.len() - 1
            }
        };
        calls.push(Call { step, nodes: c.nodes, seeds: c.seeds });
    }
    Deduped { prog: out, steps: distinct, slots, keys, calls }
}

/// A hash of a statement's canonical form and its tensors' dims and precisions: equal for
/// statements that compile to the same code.
pub fn canonical_hash(prog: &Program, s: &Stmt) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut c = Canon::default();
    let body = c.stmts(std::slice::from_ref(s));
    let mut h = rustc_hash::FxHasher::default();
    key(prog, &body, &StepKind::Serial, &c).hash(&mut h);
    // The multiplicative hash mixes into its high bits; callers take remainders.
    h.finish() >> 32
}

/// Everything a step's machine code depends on: its canonical statements (which carry the
/// strides, extents, constants and symbols), its kind, and per canonical node its dims,
/// precision and scratch kind, per local its precision.
fn key(prog: &Program, body: &[Stmt], kind: &StepKind, c: &Canon) -> String {
    use std::fmt::Write as _;
    let mut k = format!("{kind:?}\n");
    for n in &c.nodes {
        let node = &prog.nodes[n];
        let scratch = prog.scratch_of(*n).map(|s| s.per_thread);
        let _ = writeln!(k, "{:?} {:?} {scratch:?}", node.dims, node.prec);
    }
    let precs: Vec<Prec> = c.locals.iter().map(|l| prog.locals[l.0 as usize]).collect();
    let _ = writeln!(k, "{precs:?}");
    let p = Program { body: body.to_vec(), ..empty_like(prog) };
    k.push_str(&p.to_string());
    k
}

/// A program with `prog`'s runtime symbols and nothing else.
fn empty_like(prog: &Program) -> Program {
    Program {
        name: String::new(),
        body: Vec::new(),
        locals: Vec::new(),
        next_var: 0,
        nodes: FxHashMap::default(),
        virtual_nodes: Vec::new(),
        runtime_symbols: prog.runtime_symbols.clone(),
        runtime_checks: Vec::new(),
        scratch: Vec::new(),
        arena: Default::default(),
    }
}

/// Renumbering in order of first appearance.
#[derive(Default)]
struct Canon {
    nodes: Vec<NodeId>,
    node_of: FxHashMap<NodeId, NodeId>,
    vars: Vec<Var>,
    var_of: FxHashMap<Var, Var>,
    locals: Vec<LocalId>,
    local_of: FxHashMap<LocalId, LocalId>,
    seeds: Vec<u64>,
}

impl Canon {
    fn node(&mut self, n: NodeId) -> NodeId {
        let next = NodeId(self.nodes.len() as u32);
        *self.node_of.entry(n).or_insert_with(|| {
            self.nodes.push(n);
            next
        })
    }

    fn var(&mut self, v: Var) -> Var {
        let next = Var(self.vars.len() as u32);
        *self.var_of.entry(v).or_insert_with(|| {
            self.vars.push(v);
            next
        })
    }

    fn local(&mut self, l: LocalId) -> LocalId {
        let next = LocalId(self.locals.len() as u32);
        *self.local_of.entry(l).or_insert_with(|| {
            self.locals.push(l);
            next
        })
    }

    /// A seed's number in the step: its position among the step's distinct seeds.
    fn seed(&mut self, seed: u64) -> u64 {
        match self.seeds.iter().position(|s| *s == seed) {
            Some(k) => k as u64,
            None => {
                self.seeds.push(seed);
                self.seeds.len() as u64 - 1
            }
        }
    }

    fn index(&mut self, i: &Index) -> Index {
        let terms = i
            .terms
            .iter()
            .map(|&(c, x)| match x {
                IdxVar::Loop(v) => (c, IdxVar::Loop(self.var(v))),
                sym => (c, sym),
            })
            .collect();
        Index { terms, offset: i.offset }
    }

    /// The statements in canonical form, without comments (they name the real tensors).
    fn stmts(&mut self, body: &[Stmt]) -> Vec<Stmt> {
        body.iter().filter(|s| !matches!(s, Stmt::Comment(_))).map(|s| self.stmt(s)).collect()
    }

    fn stmt(&mut self, s: &Stmt) -> Stmt {
        match s {
            Stmt::Comment(c) => Stmt::Comment(c.clone()),
            Stmt::For { var, extent, limit, parallel, body } => Stmt::For {
                var: self.var(*var),
                extent: *extent,
                limit: *limit,
                parallel: *parallel,
                body: self.stmts(body),
            },
            Stmt::If { guards, body } => Stmt::If {
                guards: guards
                    .iter()
                    .map(|g| crate::low_level::Guard {
                        index: self.index(&g.index),
                        bound: g.bound,
                    })
                    .collect(),
                body: self.stmts(body),
            },
            Stmt::Set { node, idx, value } => {
                let value = self.expr(value);
                let node = self.node(*node);
                Stmt::Set { node, idx: idx.iter().map(|i| self.index(i)).collect(), value }
            }
            Stmt::SetLocal { local, value } => {
                let value = self.expr(value);
                Stmt::SetLocal { local: self.local(*local), value }
            }
            Stmt::Gemm(g) => {
                let mut g = (**g).clone();
                for o in g.operands_mut() {
                    o.node = self.node(o.node);
                    o.offset = self.index(&o.offset);
                }
                g.rows = g.rows.map(|(v, per)| (self.var(v), per));
                if let Some(e) = &mut g.epilogue {
                    for (v, _) in e.rows.iter_mut().chain(&mut e.cols) {
                        *v = self.var(*v);
                    }
                    e.body = self.stmts(&e.body);
                }
                Stmt::Gemm(Box::new(g))
            }
            Stmt::Map(m) => {
                let mut m = (**m).clone();
                for o in m.operands_mut() {
                    o.node = self.node(o.node);
                    o.offset = self.index(&o.offset);
                }
                for a in m.cells.iter_mut().chain(&mut m.points) {
                    if let Some((size, _)) = &mut a.count {
                        *size = self.index(size);
                    }
                }
                Stmt::Map(Box::new(m))
            }
            Stmt::Call(c) => {
                let c = c.map_nodes(|n| self.node(n));
                Stmt::Call(Box::new(c.map_index(|i| self.index(i))))
            }
        }
    }

    fn expr(&mut self, e: &Expr) -> Expr {
        match e {
            Expr::Const(c) => Expr::Const(*c),
            Expr::Get(n, idx) => {
                let n = self.node(*n);
                Expr::Get(n, idx.iter().map(|i| self.index(i)).collect())
            }
            Expr::Local(l) => Expr::Local(self.local(*l)),
            Expr::IndexValue(i) => Expr::IndexValue(self.index(i)),
            Expr::Uniform { seed, offset } => {
                Expr::Uniform { seed: self.seed(*seed), offset: self.index(offset) }
            }
            Expr::Unop(op, a) => Expr::Unop(*op, Box::new(self.expr(a))),
            Expr::Binop(op, a, b) => {
                Expr::Binop(*op, Box::new(self.expr(a)), Box::new(self.expr(b)))
            }
            Expr::Ternop(op, a, b, c) => Expr::Ternop(
                *op,
                Box::new(self.expr(a)),
                Box::new(self.expr(b)),
                Box::new(self.expr(c)),
            ),
        }
    }
}

/// Shifts a canonical step's nodes and locals to the distinct step's bases.
fn rebase(s: &Stmt, node_base: u32, local_base: u32) -> Stmt {
    let n = |n: NodeId| NodeId(n.0 + node_base);
    let l = |l: LocalId| LocalId(l.0 + local_base);
    fn expr(e: &Expr, n: &impl Fn(NodeId) -> NodeId, l: &impl Fn(LocalId) -> LocalId) -> Expr {
        match e {
            Expr::Get(x, idx) => Expr::Get(n(*x), idx.clone()),
            Expr::Local(x) => Expr::Local(l(*x)),
            Expr::Unop(op, a) => Expr::Unop(*op, Box::new(expr(a, n, l))),
            Expr::Binop(op, a, b) => {
                Expr::Binop(*op, Box::new(expr(a, n, l)), Box::new(expr(b, n, l)))
            }
            Expr::Ternop(op, a, b, c) => Expr::Ternop(
                *op,
                Box::new(expr(a, n, l)),
                Box::new(expr(b, n, l)),
                Box::new(expr(c, n, l)),
            ),
            other => other.clone(),
        }
    }
    match s {
        Stmt::For { body, .. } | Stmt::If { body, .. } => {
            s.with_body(body.iter().map(|b| rebase(b, node_base, local_base)).collect())
        }
        Stmt::Set { node, idx, value } => {
            Stmt::Set { node: n(*node), idx: idx.clone(), value: expr(value, &n, &l) }
        }
        Stmt::SetLocal { local, value } => {
            Stmt::SetLocal { local: l(*local), value: expr(value, &n, &l) }
        }
        Stmt::Gemm(g) => {
            let mut g = (**g).clone();
            for o in g.operands_mut() {
                o.node = n(o.node);
            }
            if let Some(e) = &mut g.epilogue {
                e.body = e.body.iter().map(|b| rebase(b, node_base, local_base)).collect();
            }
            Stmt::Gemm(Box::new(g))
        }
        Stmt::Map(m) => {
            let mut m = (**m).clone();
            for o in m.operands_mut() {
                o.node = n(o.node);
            }
            Stmt::Map(Box::new(m))
        }
        Stmt::Call(c) => Stmt::Call(Box::new(c.map_nodes(n))),
        Stmt::Comment(c) => Stmt::Comment(c.clone()),
    }
}
