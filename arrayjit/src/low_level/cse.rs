//! Common-subexpression elimination within a statement.
//!
//! Virtualization inlines a definition at every read, so `y = x * x` with a cheap `x = a + b`
//! becomes `mul(add(a, b), add(a, b))`. This pass computes each repeated subexpression once
//! into a fresh scalar local placed just before the statement (`t3 := add(a, b)`;
//! `y := mul(t3, t3)`), largest first, until no subexpression repeats.

use super::{Expr, LocalId, Program, Stmt};
use crate::ops::Prec;

/// Eliminates repeated subexpressions in every statement.
pub fn run(prog: &mut Program) {
    let body = std::mem::take(&mut prog.body);
    prog.body = cse_block(prog, body);
}

fn cse_block(prog: &mut Program, body: Vec<Stmt>) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    for s in body {
        match s {
            Stmt::For { var, extent, parallel, body } => {
                let body = cse_block(prog, body);
                out.push(Stmt::For { var, extent, parallel, body });
            }
            Stmt::If { guards, body } => {
                let body = cse_block(prog, body);
                out.push(Stmt::If { guards, body });
            }
            Stmt::Set { node, idx, value } => {
                let prec = prog.nodes.get(&node).map_or(Prec::F64, |n| n.prec.compute());
                let value = extract(prog, value, prec, &mut out);
                out.push(Stmt::Set { node, idx, value });
            }
            Stmt::SetLocal { local, value } => {
                let prec = prog.locals[local.0 as usize].compute();
                let value = extract(prog, value, prec, &mut out);
                out.push(Stmt::SetLocal { local, value });
            }
            s => out.push(s),
        }
    }
    out
}

fn extract(prog: &mut Program, mut value: Expr, prec: Prec, out: &mut Vec<Stmt>) -> Expr {
    while let Some(rep) = largest_repeated(&value) {
        let t = prog.fresh_local(prec);
        value = replace(value, &rep, t);
        out.push(Stmt::SetLocal { local: t, value: rep });
    }
    value
}

fn worth_sharing(e: &Expr) -> bool {
    matches!(e, Expr::Get(..) | Expr::Unop(..) | Expr::Binop(..) | Expr::Ternop(..))
        || matches!(e, Expr::Uniform { .. })
}

fn largest_repeated(value: &Expr) -> Option<Expr> {
    let mut subs: Vec<&Expr> = Vec::new();
    value.visit(&mut |e| {
        if worth_sharing(e) {
            subs.push(e);
        }
    });
    let mut best: Option<&Expr> = None;
    for (i, e) in subs.iter().enumerate() {
        if subs[i + 1..].contains(e) && best.is_none_or(|b| e.cost() > b.cost()) {
            best = Some(e);
        }
    }
    best.cloned()
}

fn replace(value: Expr, target: &Expr, t: LocalId) -> Expr {
    if value == *target {
        return Expr::Local(t);
    }
    match value {
        Expr::Unop(op, a) => Expr::Unop(op, Box::new(replace(*a, target, t))),
        Expr::Binop(op, a, b) => Expr::bin(op, replace(*a, target, t), replace(*b, target, t)),
        Expr::Ternop(op, a, b, c) => Expr::Ternop(
            op,
            Box::new(replace(*a, target, t)),
            Box::new(replace(*b, target, t)),
            Box::new(replace(*c, target, t)),
        ),
        e => e,
    }
}
