//! Work and memory estimates of a program, computed before anything is allocated or run.
//!
//! A document of 100 bytes can ask for a loop of 10¹² iterations or a buffer of 2⁶⁰ bytes;
//! compiling and running it would tie up the machine or end in an abort. The estimates here are
//! exact counts on the optimized low-level program — every statement execution (loop iterations
//! of the lowered code, guards counted as taken), every buffer the program materializes and the
//! peak of its intermediates (the arena the memory plan sized) — so
//! a caller can refuse it with a typed error naming the limit instead ([`Limits`]).

use super::{Program, Stmt};
use crate::tnode::NodeId;

/// What one run of a program needs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Bytes of the buffers the program materializes that do not exist yet, plus its arena of
    /// intermediates (their peak, see [`super::memory`]).
    pub memory_bytes: u64,
    /// Statement executions: loop iterations of the lowered code.
    pub work: u64,
}

/// Limits on what one routine may need; `None` is no limit.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of new buffers.
    pub max_memory: Option<u64>,
    /// Statement executions per run.
    pub max_work: WorkLimit,
}

/// The most statement executions one run of a routine may take.
///
/// The default depends on how the routine is executed, so that a run the default allows takes
/// seconds to about a minute ([`default_max_work`]): an interpreter executes tens of millions
/// of statements a second where native code executes billions. Which backends interpret is the
/// backend's fact (`BackendKind::default_max_work`), passed in here.
///
/// ```
/// use rocannl_arrayjit::low_level::estimate::{
///     WorkLimit, DEFAULT_MAX_WORK, DEFAULT_MAX_WORK_INTERP, default_max_work,
/// };
/// assert_eq!(WorkLimit::Default.resolve(default_max_work(false)), Some(DEFAULT_MAX_WORK));
/// assert_eq!(WorkLimit::Default.resolve(default_max_work(true)), Some(DEFAULT_MAX_WORK_INTERP));
/// assert_eq!(WorkLimit::At(5).resolve(DEFAULT_MAX_WORK_INTERP), Some(5));
/// assert_eq!(WorkLimit::Unlimited.resolve(DEFAULT_MAX_WORK), None);
/// ```
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum WorkLimit {
    /// The compiling backend's default, [`default_max_work`].
    #[default]
    Default,
    /// At most this many statement executions, on every backend.
    At(u64),
    /// No limit.
    Unlimited,
}

impl WorkLimit {
    /// The limit, given the compiling backend's default: `None` is no limit.
    pub fn resolve(self, default: u64) -> Option<u64> {
        match self {
            WorkLimit::Default => Some(default),
            WorkLimit::At(n) => Some(n),
            WorkLimit::Unlimited => None,
        }
    }
}

/// The default work limit of native backends (gccjit, cuda): 10¹¹ statement executions per run.
pub const DEFAULT_MAX_WORK: u64 = 100_000_000_000;

/// The default work limit of the interpreter (and of the kernel simulator, slower still):
/// 10⁹ statement executions per run. The interpreter executes 15 to 36 million statements a
/// second (docs/backends.md, "Limits"), so a run the default allows takes under about a minute;
/// native code executes 10¹¹ in about as long.
pub const DEFAULT_MAX_WORK_INTERP: u64 = 1_000_000_000;

/// The default work limit ([`WorkLimit::Default`]) of a backend that interprets the program
/// (`interpreted`) or runs native code.
pub fn default_max_work(interpreted: bool) -> u64 {
    if interpreted { DEFAULT_MAX_WORK_INTERP } else { DEFAULT_MAX_WORK }
}

/// The largest default memory limit, 16 GiB.
pub const DEFAULT_MAX_MEMORY: u64 = 16 << 30;

impl Default for Limits {
    /// The smaller of 16 GiB and the memory available, and the backend's default work limit.
    fn default() -> Self {
        Limits { max_memory: Some(default_max_memory()), max_work: WorkLimit::Default }
    }
}

impl Limits {
    /// No limits.
    pub const NONE: Limits = Limits { max_memory: None, max_work: WorkLimit::Unlimited };
}

/// The smaller of 16 GiB and the memory the system reports available (`MemAvailable` in
/// `/proc/meminfo`; 16 GiB where that cannot be read).
pub fn default_max_memory() -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    available.map_or(DEFAULT_MAX_MEMORY, |a| a.min(DEFAULT_MAX_MEMORY))
}

/// Estimates a program; `exists` tells which nodes already have a buffer.
pub fn estimate(prog: &Program, exists: impl Fn(NodeId) -> bool) -> Estimate {
    let in_arena: rustc_hash::FxHashSet<NodeId> = prog.arena.slots.iter().map(|s| s.node).collect();
    let mut memory_bytes = prog.arena.bytes as u64;
    for n in prog.materialized_nodes() {
        if exists(n) || in_arena.contains(&n) {
            continue;
        }
        if let Some(node) = prog.nodes.get(&n) {
            let cells = node
                .dims
                .iter()
                .try_fold(1u64, |a, d| a.checked_mul(*d as u64))
                .unwrap_or(u64::MAX);
            let bytes = cells.saturating_mul(node.prec.size_in_bytes() as u64);
            memory_bytes = memory_bytes.saturating_add(bytes);
        }
    }
    fn go(s: &Stmt, mult: u64) -> u64 {
        match s {
            Stmt::For { extent, body, .. } => {
                let inner = mult.saturating_mul(*extent as u64);
                body.iter().fold(0u64, |acc, b| acc.saturating_add(go(b, inner)))
            }
            Stmt::If { body, .. } => {
                body.iter().fold(0u64, |acc, b| acc.saturating_add(go(b, mult)))
            }
            Stmt::Set { .. } | Stmt::SetLocal { .. } => mult,
            Stmt::Gemm(g) => mult.saturating_mul(
                (g.rows_per_call() as u64 * g.n.extent as u64).saturating_mul(g.k.extent as u64),
            ),
            Stmt::Map(m) => mult.saturating_mul(m.points_total() as u64),
            Stmt::Call(c) => mult.saturating_mul(c.steps() as u64),
            Stmt::Comment(_) => 0,
        }
    }
    let work = prog.body.iter().fold(0u64, |acc, s| acc.saturating_add(go(s, 1)));
    Estimate { memory_bytes, work }
}

pub use crate::error::human_bytes;
