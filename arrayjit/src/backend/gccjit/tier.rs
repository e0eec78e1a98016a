//! Tiered builds: a quick first build that runs at once, the optimized one made in the
//! background and swapped in when it is ready.
//!
//! GCC at `-O0` compiles a routine several times faster than at `-O3`, and since products and
//! other contractions call the precompiled kernels ([`crate::kernels`]) the code it leaves
//! unoptimized is the pointwise part of a step: a training step built at `-O0` runs at a few
//! times the optimized step's time, not hundreds. So a routine's first runs need not wait for
//! the optimized build. With [`crate::CompileOptions::tiered`], a routine whose steps are not
//! all in the compile cache is built at `-O0` (no cache entry: it is thrown away later) and
//! returned at once, while a background thread builds the missing steps at their own levels in
//! child processes ([`super::fork`]), stores them in the cache, and hands the libraries over;
//! the next run swaps their functions in. Both builds compute the same bits: GCC may neither
//! reassociate nor contract floating-point arithmetic at any level (tested in
//! `arrayjit/tests/conformance.rs`), so when the swap happens changes no value.
//!
//! One background build runs at a time (a lock of the process): routines compiled one after another
//! (a training step, then an evaluation forward) are optimized in that order instead of
//! sharing the cores among all of them. Dropping the backend stops its pending builds: their
//! children are killed (as they are when the process ends: a child dies with the thread that
//! forked it) and their private temporary folder removed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::codegen::{self, BuildOptions, Output};
use super::fork;
use super::step::StepKind;
use crate::cache::Cache;
use crate::low_level::{Program, Stmt};
use crate::tnode::NodeId;

/// The optimization level of a tiered routine's first build.
pub const FIRST_TIER_LEVEL: u8 = 0;

/// Serializes background builds across the process.
static BACKGROUND: Mutex<()> = Mutex::new(());

/// What a background build compiles from, owned by its thread.
pub struct Owned {
    /// The deduplicated program.
    pub prog: Program,
    /// Its distinct steps.
    pub steps: Vec<(Vec<Stmt>, StepKind)>,
    /// Each distinct step's buffer slots.
    pub slots: Vec<Vec<NodeId>>,
    /// Each distinct step's function name.
    pub names: Vec<String>,
    /// Each distinct step's content key (for the cache's step index).
    pub step_keys: Vec<String>,
    /// The builds (steps and levels) and the child each is made in.
    pub builds: Vec<BuildOptions>,
    /// The bin (child process) of each build.
    pub bin_of: Vec<usize>,
}

impl Owned {
    /// What each build compiles from.
    pub fn code(&self) -> codegen::Steps<'_> {
        codegen::Steps {
            prog: &self.prog,
            steps: &self.steps,
            slots: &self.slots,
            names: &self.names,
        }
    }
}

/// The optimized code of a routine: one library per build, and the distinct steps each holds.
pub struct Upgrade {
    /// The libraries, loaded.
    pub libs: Vec<libloading::Library>,
    /// For each library, the distinct steps whose functions it holds.
    pub steps: Vec<Vec<usize>>,
}

/// Shared between a background build and its owner: whether to stop, and the children to kill.
#[derive(Default)]
struct Cancel {
    stop: AtomicBool,
    children: Mutex<Vec<libc::pid_t>>,
}

impl Cancel {
    fn kill_children(&self) {
        for pid in self.children.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            // SAFETY: signals our own child, not reaped yet (a child leaves the list before it
            // is reaped).
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
    }
}

/// Where a tiered routine's optimized build is: waiting for the routine's first run to end
/// (so that it competes neither with what the program does until then, parameter
/// initialization included, nor with the first run itself), or under way.
pub enum Tier {
    /// Not started yet (`None` only while it starts).
    Waiting(Option<(Box<Owned>, Option<Cache>)>),
    /// Under way (or ended, not yet swapped in).
    Building(Background),
}

impl Tier {
    /// Starts the build if it is still waiting.
    pub fn start(&mut self) {
        if let Tier::Waiting(waiting) = self
            && let Some((owned, cache)) = waiting.take()
        {
            *self = Tier::Building(Background::start(*owned, cache));
        }
    }

    /// Whether the build has ended: swapping it in will not wait.
    pub fn ready(&self) -> bool {
        matches!(self, Tier::Building(b) if b.ready())
    }

    /// Starts the build if needed and waits for it; its code, or `None` when it failed.
    pub fn finish(mut self) -> Option<Upgrade> {
        self.start();
        match self {
            Tier::Building(b) => b.join(),
            Tier::Waiting(..) => None,
        }
    }
}

/// A background build in progress.
pub struct Background {
    handle: Option<JoinHandle<Option<Upgrade>>>,
    cancel: Arc<Cancel>,
}

impl Background {
    /// Starts building `owned` in the background, through the compile cache when there is one.
    pub fn start(owned: Owned, cache: Option<Cache>) -> Background {
        let cancel = Arc::new(Cancel::default());
        let c = cancel.clone();
        let handle = std::thread::Builder::new()
            .name("rocannl-build".into())
            .spawn(move || {
                // One at a time; a build stopped while it waits for its turn (its context
                // dropped) ends at once instead of after the build before it.
                let _one_at_a_time = loop {
                    if c.stop.load(Ordering::Acquire) {
                        return None;
                    }
                    match BACKGROUND.try_lock() {
                        Ok(guard) => break guard,
                        Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                        Err(std::sync::TryLockError::WouldBlock) => {
                            std::thread::sleep(std::time::Duration::from_millis(2))
                        }
                    }
                };
                if c.stop.load(Ordering::Acquire) {
                    return None;
                }
                build(&owned, cache.as_ref(), &c)
            })
            .ok();
        Background { handle, cancel }
    }

    /// Whether the build has ended (successfully or not): joining will not wait.
    pub fn ready(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_finished())
    }

    /// Waits for the build; its code, or `None` when it failed (the first tier then stays).
    pub fn join(mut self) -> Option<Upgrade> {
        self.handle.take().and_then(|h| h.join().ok().flatten())
    }
}

impl Drop for Background {
    /// Stops a build nobody will use: its children are killed, then the thread is joined.
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.cancel.stop.store(true, Ordering::Release);
            self.cancel.kill_children();
            let _ = h.join();
        }
    }
}

/// Builds every build of `owned` in child processes (none in this process: the thread would
/// hold GCC's lock and make the owner's next compile wait), stores them in the cache, and
/// loads them. `None` when any part failed or the build was stopped.
fn build(owned: &Owned, cache: Option<&Cache>, cancel: &Cancel) -> Option<Upgrade> {
    let keys: Vec<String> = owned
        .builds
        .iter()
        .map(|b| {
            let parts: Vec<&[u8]> =
                b.steps.iter().map(|k| owned.step_keys[*k].as_bytes()).collect();
            Cache::key(&parts)
        })
        .collect();
    // Where each build writes: a private temporary folder. Nowhere to write: no background
    // build.
    let scratch = fork::Scratch::new()?;
    let targets: Vec<PathBuf> = (0..keys.len()).map(|i| scratch.library(i)).collect();
    let bins = super::build::group_by_bin(&owned.bin_of, |_| true);
    let jobs: Vec<Box<dyn FnOnce() -> bool + '_>> = bins
        .iter()
        .map(|bin| {
            let targets = &targets;
            let job = move || {
                bin.iter().all(|&i| {
                    let out = Output::SharedLibrary(&targets[i]);
                    let o = owned;
                    codegen::build_unlocked(o.code(), &o.builds[i], out).is_ok()
                })
            };
            Box::new(job) as Box<dyn FnOnce() -> bool + '_>
        })
        .collect();
    let mut children = Vec::new();
    let mut ok = true;
    for child in fork::spawn(jobs) {
        match child {
            Ok(c) => children.push(c),
            // No fork: no background build (building here would hold GCC's lock).
            Err(_) => ok = false,
        }
    }
    {
        let mut pids = cancel.children.lock().unwrap_or_else(|e| e.into_inner());
        pids.extend(children.iter().map(|c| c.pid()));
    }
    if cancel.stop.load(Ordering::Acquire) {
        cancel.kill_children();
    }
    for c in children {
        // Off the list before it is reaped: a reaped child's id may be reused.
        c.wait_ended();
        cancel.children.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| *p != c.pid());
        ok &= c.wait();
    }
    if !ok || cancel.stop.load(Ordering::Acquire) {
        return None;
    }
    let mut libs = Vec::with_capacity(targets.len());
    for (i, path) in targets.iter().enumerate() {
        let (lib, stored) = super::build::install(cache, &keys[i], path)?;
        if let (Some(c), true) = (cache, stored) {
            for k in &owned.builds[i].steps {
                c.store_step(&owned.step_keys[*k], &keys[i]);
            }
        }
        libs.push(lib);
    }
    let steps = owned.builds.iter().map(|b| b.steps.clone()).collect();
    Some(Upgrade { libs, steps })
}
