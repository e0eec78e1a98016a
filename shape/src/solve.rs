//! The constraint solver's state and its driver loop.
//!
//! [`Solver::solve`] takes a list of constraints and a [`Stage`], and simplifies them until only
//! those that cannot make progress remain: equations are unified ([`crate::unify`]),
//! inequalities are turned into bounds and least upper bounds ([`crate::ineq`]), row
//! constraints are propagated ([`crate::row_constraint`]) and, from stage 2 on, variables are
//! closed ([`crate::close`], as the [`Stage`] allows). Solving a constraint can derive more
//! constraints (breadth first); a constraint that cannot make progress yet is *deferred* and
//! retried once the environment has changed: propagation constraints whenever the queue runs
//! dry, closing constraints when no other closing constraint is left to act.

use std::sync::Arc;

use rustc_hash::FxHashSet;

use crate::constraint::{Constr, Constraint, Origin};
use crate::dim::ConvDim;
use crate::env::Environment;
use crate::error::{Conflict, conflict};
use crate::row::Row;
use crate::stage::Stage;
use crate::var::{DimVar, RowVar, VarGen};

/// How many constraints one call of [`Solver::solve`] may process before it gives up with an
/// error instead of looping forever on a pathological input: this many, plus
/// [`FUEL_PER_VAR`] for every variable of the graph (a graph of a million axes needs a few
/// million steps; a diverging solution makes ever more variables and constraints, and stops
/// once it has used up what the graph it started from allows).
const FUEL: u64 = 1_000_000;

/// See [`FUEL`].
const FUEL_PER_VAR: u64 = 64;

/// A convolution axis `conv = size` that only closing decided (see [`Solver::open_convs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct OpenConv {
    /// The axis, with its output and kernel as they were before closing.
    pub conv: Arc<ConvDim>,
    /// The axis' size.
    pub size: usize,
    /// The operations it came from.
    pub origin: Origin,
}

/// The solver: environment, variable generator and closing bookkeeping.
#[derive(Clone, Debug, Default)]
pub struct Solver {
    /// What is known about every variable.
    pub env: Environment,
    /// Fresh variables.
    pub vars: VarGen,
    /// The current stage.
    pub stage: Stage,
    /// Dimension variables closed to 1 without any upper bound (a guess).
    pub guessed_dims: FxHashSet<DimVar>,
    /// Convolution axes of known size whose output and kernel were both still unknown when
    /// stage 7 began: closing chose them, a guess reported by the inference driver.
    pub(crate) open_convs: Vec<OpenConv>,
    /// Row variables closed to no axes without any upper bound (a guess).
    pub guessed_rows: FxHashSet<RowVar>,
    /// For row variables made by expanding another, indexed by variable: how many expansions
    /// away from a declared row they are (a lower bound on the axes of the rows they occur in).
    pub(crate) row_depth: Vec<u8>,
    /// Indexed by row variable: whether it is an einsum pattern's row variable, or was made by
    /// expanding one (a pattern's leading axes anchor at the start of the row it is matched
    /// with; see [`crate::ineq`]).
    pub(crate) template_rows: Vec<bool>,
    /// Indexed by dimension variable: whether it is the label of a convolution kernel (an
    /// inequality whose upper side is the label itself is an equation; see [`crate::ineq`]).
    pub(crate) kernel_dims: Vec<bool>,
    /// Propagation constraints waiting for the environment to change.
    pub(crate) deferred: Vec<Constr>,
    /// Closing constraints waiting for the environment to change.
    pub(crate) deferred_closers: Vec<Constr>,
    /// The environment version when the first of `deferred` was deferred (none of them can
    /// progress before the environment changes).
    deferred_at: u64,
    /// The same for `deferred_closers`.
    closers_deferred_at: u64,
    /// From stage 6 on: whether a constraint stuck on an ambiguity may close a row variable now
    /// (one at a time, each followed by full propagation; see [`Solver::take_closing_turn`]).
    closing_turn: bool,
    /// The environment version when the deferred constraints were last offered a closing turn.
    turn_offered_at: Option<u64>,
    /// An optional trace of processed constraints, for debugging and snapshots.
    pub trace: Option<Vec<String>>,
    /// The queues of [`Solver::solve`], empty between calls (kept for their capacity).
    queues: Queues,
    /// Emptied lists of derived constraints, reused for the next ones.
    spare: Vec<Vec<Constr>>,
}

impl Solver {
    /// Whether `v` is the row variable of an einsum pattern (or made by expanding one).
    pub fn is_template_row(&self, v: RowVar) -> bool {
        flag(&self.template_rows, v.0)
    }

    /// Records that `v` is the row variable of an einsum pattern.
    pub fn mark_template_row(&mut self, v: RowVar) {
        set_flag(&mut self.template_rows, v.0);
    }

    /// Whether `v` is the label of a convolution kernel.
    pub fn is_kernel_dim(&self, v: DimVar) -> bool {
        flag(&self.kernel_dims, v.0)
    }

    /// Records that `v` is the label of a convolution kernel: the argument axes matched with it
    /// are the kernel's, equal to it rather than broadcast against it.
    pub fn mark_kernel_dim(&mut self, v: DimVar) {
        set_flag(&mut self.kernel_dims, v.0);
    }

    /// An empty list for derived constraints: one the solver has finished with, if any.
    pub(crate) fn derived_list(&mut self) -> Vec<Constr> {
        self.spare.pop().unwrap_or_default()
    }

    /// A list of one derived constraint.
    pub(crate) fn derive_one(&mut self, c: Constr) -> Vec<Constr> {
        let mut out = self.derived_list();
        out.push(c);
        out
    }

    /// Moves the constraints of `more` to the end of `out`, keeping the emptied list for reuse.
    pub(crate) fn absorb(&mut self, out: &mut Vec<Constr>, mut more: Vec<Constr>) {
        if out.is_empty() && out.capacity() < more.len() {
            std::mem::swap(out, &mut more);
        } else {
            out.append(&mut more);
        }
        self.recycle(more);
    }

    /// Keeps an emptied list of derived constraints for reuse (a few, and not large ones).
    fn recycle(&mut self, list: Vec<Constr>) {
        debug_assert!(list.is_empty());
        if list.capacity() > 0 && list.capacity() <= 64 && self.spare.len() < 32 {
            self.spare.push(list);
        }
    }

    /// Keeps a constraint for later (it cannot make progress now).
    #[inline]
    pub(crate) fn defer(&mut self, c: Constr) {
        let (list, since) = if is_closer(&c) {
            (&mut self.deferred_closers, &mut self.closers_deferred_at)
        } else {
            (&mut self.deferred, &mut self.deferred_at)
        };
        if list.is_empty() {
            *since = self.env.version;
        }
        list.push(c);
    }

    /// Simplifies `constraints` at `stage`, returning those that remain unsolved.
    ///
    /// Closing constraints (leaf rows and dimensions, shape rows) act only when propagation has
    /// settled: no equation, inequality or row constraint is queued, and the deferred ones have
    /// been retried since the environment last changed. They are taken one at a time, each
    /// followed by full propagation, so closing one variable never pre-empts information
    /// another constraint was about to provide (the closed shapes would then depend on the
    /// order in which operations were added). A closing constraint that cannot act yet waits
    /// until the other closing constraints have had their turn.
    pub fn solve(
        &mut self,
        stage: Stage,
        constraints: Vec<Constr>,
    ) -> Result<Vec<Constr>, Conflict> {
        self.stage = stage;
        // From stage 6 on, leaf rows and dimensions close before the rows of composite shapes,
        // which are then forced from below by their components (the seed's reason for closing
        // leaves to their bounds and everything else to the smallest value).
        let late = stage >= Stage::RowsToNoMoreAxes;
        let mut queues = std::mem::take(&mut self.queues);
        queues.clear();
        queues.late = late;
        queues.route_all(&mut dedup(constraints));
        let mut fuel = FUEL + FUEL_PER_VAR * self.vars.count();
        loop {
            let which = if !queues.regular.is_empty() {
                Which::Regular
            } else {
                // A closing turn lasts one round of retried constraints and what they derive.
                self.closing_turn = false;
                let version = self.env.version;
                if !self.deferred.is_empty() && self.deferred_at != version {
                    // Propagation reached a fixed point, but the environment changed since
                    // these were deferred: they may progress now.
                    queues.regular.append(&mut self.deferred);
                    continue;
                }
                if late && !self.deferred.is_empty() && self.turn_offered_at != Some(version) {
                    // Stuck, from stage 6 on: one of the constraints waiting on an ambiguity
                    // may close a row variable, the one deepest in the graph first (the rows of
                    // the tensors built first), and everything it implies propagates before
                    // the next closes. Closing several at once, in whatever order they were
                    // deferred, could close a result's row before the argument it is forced
                    // from.
                    self.turn_offered_at = Some(version);
                    self.closing_turn = true;
                    let mut stuck = std::mem::take(&mut self.deferred);
                    stuck.sort_by_cached_key(|c| self.closing_order(c));
                    queues.regular.append(&mut stuck);
                    continue;
                }
                if !queues.closers.is_empty() {
                    Which::Closers
                } else if !queues.shape_closers.is_empty() {
                    Which::ShapeClosers
                } else if !self.deferred_closers.is_empty() && self.closers_deferred_at != version {
                    // Every closing constraint had its turn; those that could not act may now.
                    self.deferred_closers.drain(..).for_each(|c| queues.route(c));
                    continue;
                } else {
                    let mut rest = std::mem::take(&mut self.deferred);
                    rest.append(&mut self.deferred_closers);
                    self.queues = queues;
                    return Ok(rest);
                }
            };
            // Solved where it waits in its queue, and removed from it afterwards.
            let c = queues.queue(which).front().expect("the queue has a constraint");
            fuel = fuel.checked_sub(1).ok_or_else(|| {
                conflict(
                    "shape inference did not converge (the constraints keep growing)",
                    &c.origin,
                )
            })?;
            if let Some(trace) = &mut self.trace {
                trace.push(format!("{:?}: {}", self.stage, c.c));
            }
            let mut derived = self.solve_one(c)?;
            let again = match which {
                // A composite shape's row closes one variable at a time; the row is finished
                // before the next row starts, so the shapes built first (the arguments) are
                // closed before the results they force from below.
                Which::ShapeClosers => derived
                    .iter()
                    .position(|d| matches!(d.c, Constraint::ShapeRow { .. }))
                    .map(|i| derived.swap_remove(i)),
                _ => None,
            };
            match again {
                Some(row) => queues.queue(which).replace_front(row),
                None => queues.queue(which).drop_front(),
            }
            queues.route_all(&mut derived);
            self.recycle(derived);
        }
    }

    /// From stage 6 on, whether a constraint stuck on an ambiguity may close a row variable
    /// now: the first to ask in a round of retried constraints may (and the others wait for the
    /// next round).
    pub(crate) fn take_closing_turn(&mut self) -> bool {
        std::mem::take(&mut self.closing_turn)
    }

    /// The order in which stuck constraints get a closing turn, by the row variable each would
    /// close: a tensor's before an einsum pattern's, then by the shape its row belongs to
    /// (shapes are numbered as they are built, arguments before results).
    fn closing_order(&self, c: &Constr) -> (bool, u32) {
        let subst = |r: &Arc<Row>| self.env.subst_row_cow(r).into_owned();
        let pick = match &c.c {
            Constraint::RowIneq { cur, subr } => self.row_to_close(&subst(cur), &subst(subr)),
            Constraint::RowEq { r1, .. } => {
                let r = subst(r1);
                r.var().map(|v| (v, r.id))
            }
            Constraint::BatchSlice { cur, arg, .. } => {
                self.slice_row_to_close(&subst(cur), &subst(arg))
            }
            _ => None,
        };
        pick.map_or((true, u32::MAX), |(v, id)| (self.is_template_row(v), id.shape.0))
    }

    /// Solves one constraint, returning what it derives (deferring it if it cannot progress).
    fn solve_one(&mut self, c: &Constr) -> Result<Vec<Constr>, Conflict> {
        let origin = &c.origin;
        match &c.c {
            Constraint::DimEq { d1, d2 } => self.unify_dim(d1, d2, origin),
            Constraint::RowEq { r1, r2 } => self.unify_shared_rows(r1, r2, origin),
            Constraint::DimIneq { cur, subr } => self.solve_dim_ineq(cur, subr, origin),
            Constraint::RowIneq { cur, subr } => self.solve_shared_row_ineq(cur, subr, origin),
            Constraint::DimConstr { d, constr } => self.apply_dim_constraint(d, constr, origin),
            Constraint::RowsConstr { rows, constr } => {
                self.apply_rows_constraint(rows, constr, origin)
            }
            Constraint::BatchSlice { cur, arg, slot } => {
                self.solve_batch_slice(cur, arg, slot, origin)
            }
            Constraint::TerminalDim(d) => self.close_dim_terminal(d, origin),
            Constraint::TerminalRow(r) => self.close_row_terminal(r, origin),
            Constraint::ShapeRow { row, from } => self.close_shape_row(row, *from, origin),
        }
    }
}

/// The constraints to process, in the order they are taken: propagation first, then closing
/// of leaf rows and dimensions, then (from stage 6 on) closing of the rows of composite shapes.
#[derive(Clone, Debug, Default)]
struct Queues {
    late: bool,
    regular: Fifo,
    closers: Fifo,
    shape_closers: Fifo,
}

/// A first-in first-out list of constraints: read at the front in place, appended in one piece;
/// the constraints taken are dropped together when the list empties or would have to grow.
#[derive(Clone, Debug, Default)]
struct Fifo {
    items: Vec<Constr>,
    head: usize,
}

impl Fifo {
    fn is_empty(&self) -> bool {
        self.head == self.items.len()
    }

    fn front(&self) -> Option<&Constr> {
        self.items.get(self.head)
    }

    /// Takes the front constraint away.
    fn drop_front(&mut self) {
        self.head += 1;
        if self.head == self.items.len() {
            self.clear();
        }
    }

    /// Before adding `n` constraints: drops those taken already when that avoids growing.
    fn make_room(&mut self, n: usize) {
        if self.head > 0 && self.items.len() + n > self.items.capacity() {
            self.items.drain(..self.head);
            self.head = 0;
        }
    }

    /// Puts `c` in place of the front constraint (taken next).
    fn replace_front(&mut self, c: Constr) {
        self.items[self.head] = c;
    }

    fn push(&mut self, c: Constr) {
        self.make_room(1);
        self.items.push(c);
    }

    /// Moves all of `cs` to the back, leaving `cs` empty (with its capacity).
    fn append(&mut self, cs: &mut Vec<Constr>) {
        self.make_room(cs.len());
        self.items.append(cs);
    }

    fn clear(&mut self) {
        self.items.clear();
        self.head = 0;
    }
}

/// One of the queues.
#[derive(Copy, Clone)]
enum Which {
    Regular,
    Closers,
    ShapeClosers,
}

impl Queues {
    fn queue(&mut self, which: Which) -> &mut Fifo {
        match which {
            Which::Regular => &mut self.regular,
            Which::Closers => &mut self.closers,
            Which::ShapeClosers => &mut self.shape_closers,
        }
    }

    /// Routes constraints in order, leaving `cs` empty; propagation constraints alone are moved
    /// in one piece.
    fn route_all(&mut self, cs: &mut Vec<Constr>) {
        if cs.iter().any(is_closer) {
            cs.drain(..).for_each(|c| self.route(c));
        } else {
            self.regular.append(cs);
        }
    }

    fn clear(&mut self) {
        self.regular.clear();
        self.closers.clear();
        self.shape_closers.clear();
    }

    fn route(&mut self, c: Constr) {
        if self.late && matches!(c.c, Constraint::ShapeRow { .. }) {
            self.shape_closers.push(c);
        } else if is_closer(&c) {
            self.closers.push(c);
        } else {
            self.regular.push(c);
        }
    }
}

/// Whether a constraint closes variables (rather than propagating information).
#[inline]
fn is_closer(c: &Constr) -> bool {
    matches!(
        c.c,
        Constraint::TerminalDim(_) | Constraint::TerminalRow(_) | Constraint::ShapeRow { .. }
    )
}

/// Removes repeated constraints, keeping the first occurrence of each (short lists, as in
/// online solving, are left alone: hashing them costs more than an occasional repeat).
fn dedup(cs: Vec<Constr>) -> Vec<Constr> {
    if cs.len() < 32 {
        return cs;
    }
    let keep: Vec<bool> = {
        let mut seen = FxHashSet::default();
        cs.iter().map(|c| seen.insert(c)).collect()
    };
    cs.into_iter().zip(keep).filter_map(|(c, k)| k.then_some(c)).collect()
}

/// A flag of a table indexed by variable number (unset beyond its end).
fn flag(table: &[bool], v: u32) -> bool {
    table.get(v as usize).copied().unwrap_or(false)
}

/// Sets a flag of a table indexed by variable number, growing it as needed.
fn set_flag(table: &mut Vec<bool>, v: u32) {
    let i = v as usize;
    if table.len() <= i {
        table.resize(i + 1, false);
    }
    table[i] = true;
}
