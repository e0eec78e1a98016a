//! The stable text printer of programs and statements: the format of debugging dumps and of
//! the lowered-code snapshots, so any change here shows in every snapshot.

use std::fmt::{self, Write as _};

use super::{Program, Stmt, Var, fmt_indices};

impl fmt::Display for Program {
    /// The stable text form: one statement per line, loops and guards as indented blocks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        for s in &self.body {
            print_stmt(&mut out, s, 0);
        }
        if !self.arena.slots.is_empty() {
            let _ = writeln!(out, "# arena of {} bytes:", self.arena.bytes);
            for a in &self.arena.slots {
                let (first, last) = a.live;
                let _ =
                    writeln!(out, "#   {} at {} for statements {first}..={last}", a.node, a.offset);
            }
        }
        f.write_str(&out)
    }
}

/// Prints one statement at `depth`, as the program's printer does.
pub fn print_stmt(out: &mut String, s: &Stmt, depth: usize) {
    let pad = "  ".repeat(depth);
    match s {
        Stmt::Comment(c) => {
            let _ = writeln!(out, "{pad}# {c}");
        }
        Stmt::For { var, extent, limit, parallel, body } => {
            let par = if *parallel { " par" } else { "" };
            let lim = limit.map_or(String::new(), |l| format!(" to {l}"));
            let _ = writeln!(out, "{pad}for {var} in 0..{extent}{lim}{par} {{");
            body.iter().for_each(|s| print_stmt(out, s, depth + 1));
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::If { guards, body } => {
            let conds: Vec<String> =
                guards.iter().map(|g| format!("0 <= {} < {}", g.index, g.bound)).collect();
            let _ = writeln!(out, "{pad}if {} {{", conds.join(" && "));
            body.iter().for_each(|s| print_stmt(out, s, depth + 1));
            let _ = writeln!(out, "{pad}}}");
        }
        Stmt::Set { node, idx, value } => {
            let _ = writeln!(out, "{pad}{node}{} := {value}", fmt_indices(idx));
        }
        Stmt::SetLocal { local, value } => {
            let _ = writeln!(out, "{pad}{local} := {value}");
        }
        Stmt::Gemm(g) => match &g.epilogue {
            None => {
                let _ = writeln!(out, "{pad}{g}");
            }
            Some(e) => {
                let vars = |axis: &[(Var, usize)]| {
                    let v: Vec<String> = axis.iter().map(|(v, e)| format!("{v} < {e}")).collect();
                    v.join(", ")
                };
                let _ = writeln!(
                    out,
                    "{pad}{g} then per cell ({}; {}) {{",
                    vars(&e.rows),
                    vars(&e.cols)
                );
                e.body.iter().for_each(|s| print_stmt(out, s, depth + 1));
                let _ = writeln!(out, "{pad}}}");
            }
        },
        Stmt::Map(m) => {
            let _ = writeln!(out, "{pad}{m}");
        }
        Stmt::Call(c) => {
            let _ = writeln!(out, "{pad}{c}");
        }
    }
}
