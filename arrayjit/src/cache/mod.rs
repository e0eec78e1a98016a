//! The persistent compile cache: compiled routines kept on disk and reused across processes.
//!
//! Compiling a training step through GCC takes seconds; the same program compiled again — the
//! next run of a script, a second process, an evaluation routine identical to last time's — is
//! served from here in milliseconds. An entry is keyed by a SHA-256 of everything the machine
//! code depends on: the optimized, scheduled program as generated source, the compile options,
//! the code generator's version and the host CPU's target flags (the backend supplies them).
//!
//! A backend may also index what is inside its entries: `steps/<key>` names the entry holding
//! one compiled step (a function of a routine, keyed by its own content), so that a routine
//! sharing most of its steps with one compiled before — an evaluation forward and the training
//! step of one model — compiles only the steps it does not share.
//!
//! # Where, and what it touches
//!
//! The folder is `$ROCANNL_CACHE_DIR` when set, else the user's cache directory
//! (`directories`: `~/.cache/rocannl` on Linux); `ROCANNL_CACHE=off` disables the cache. The
//! cache keeps everything in a folder of its own inside it, [`ENTRIES`] (`rocannl-v1/`, created
//! with mode 0700), and touches nothing else: pointing `ROCANNL_CACHE_DIR` at a folder that
//! holds other files leaves them alone. In its folder:
//! - `<key>.<kind>`: an entry — `.so` for a shared library of native code, `.ptx` or `.cubin`
//!   for CUDA modules ([`EntryKind`]) — where `<key>` is 64 lowercase hex digits;
//! - `<key>.sha256`: the SHA-256 of the entry's bytes;
//! - `steps/<key>`: a step record, holding the key of an entry;
//! - `.rocannl-<12 random letters and digits>.tmp`: a file being written.
//!
//! Eviction and every other removal only remove regular files of exactly these names in that
//! folder (`cache/evict.rs`), never following a link.
//!
//! # What it refuses, and why
//!
//! An entry is native code that this process loads and runs, so a file someone else could have
//! written is never used. All file access goes through `cache/files.rs`:
//! - the folder named by the user, and the cache's own folder, are used only if they are the
//!   user's, not writable by group or others (and the cache's own folder not a link): otherwise
//!   anyone else could plant a library with a matching digest, or replace one between its check
//!   and its load. Such a folder is refused with a warning and the routine compiled without the
//!   cache (as ssh refuses a key in a folder others may write). The folders above are not
//!   checked (ccache does not either);
//! - an entry, digest or step record is read without following a link at its name and without
//!   blocking on a FIFO or device; it is used only if it is a regular file of the user's, not
//!   writable by group or others, and at most [`MAX_ENTRY_BYTES`] long (read bounded);
//! - everything is written to a temporary file of a fresh random name, created exclusively
//!   (`O_CREAT | O_EXCL`, the `tempfile` crate), flushed, and renamed into place: a reader never
//!   sees half an entry, no planted link at a predictable name is ever written through, and two
//!   processes compiling the same routine at once both succeed (the last rename wins; both
//!   contents are valid);
//! - an entry is used only if its bytes hash to its digest: a truncated, corrupted or
//!   half-replaced entry is a miss — compiled again and rewritten — never run; a step record
//!   must hold a well-formed key (it can name only an entry of this folder, and what a routine
//!   takes from the entry is checked by name).
//!
//! The cache is an optimization, never an error: a folder that cannot be created or is refused,
//! a full disk, a read-only folder, a name that is not UTF-8 (paths are never converted to
//! text), a damaged or unusable entry — each is a miss, the routine compiled as if there were no
//! cache, reported once per process as a warning on stderr.
//!
//! The cache is capped (1 GiB by default, `ROCANNL_CACHE_MAX_BYTES`): after a store, the entries
//! used least recently (by modification time, refreshed on every hit) are removed until it fits.
//! Only Unix systems have it (its checks are Unix's); elsewhere it is off.

mod evict;
mod files;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use files::{Read, Refusal};

/// Where compiled routines are cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CacheMode {
    /// From the environment: `ROCANNL_CACHE=off` disables, `ROCANNL_CACHE_DIR` sets the folder,
    /// else the user's cache directory.
    #[default]
    FromEnv,
    /// No cache.
    Off,
    /// This folder.
    Dir(PathBuf),
}

/// The default size cap of a cache folder.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// The largest entry the cache reads or writes: a file at an entry's name that is larger is a
/// miss, never read.
pub const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// The cache's own folder inside the folder the user names: everything the cache writes is in
/// it. The version changes with the layout.
pub const ENTRIES: &str = "rocannl-v1";

/// The step index's folder inside [`ENTRIES`].
const STEPS: &str = "steps";

/// The largest digest or step record read (64 hex digits and a little slack).
const STEP_RECORD_CAP: u64 = 128;

/// What a compile found in the cache.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum CacheOutcome {
    /// No cache (disabled, or a backend without one).
    #[default]
    Off,
    /// Compiled and stored.
    Miss,
    /// Served from the cache.
    Hit,
}

/// What an entry holds, which is its file's extension.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A shared library of native code (gccjit).
    SharedLibrary,
    /// A CUDA module as PTX text (NVRTC).
    Ptx,
    /// A CUDA module as a cubin of SASS (NVRTC).
    Cubin,
}

impl EntryKind {
    /// Every kind.
    pub const ALL: [EntryKind; 3] = [EntryKind::SharedLibrary, EntryKind::Ptx, EntryKind::Cubin];

    /// The entry file's extension.
    pub fn extension(self) -> &'static str {
        match self {
            EntryKind::SharedLibrary => "so",
            EntryKind::Ptx => "ptx",
            EntryKind::Cubin => "cubin",
        }
    }
}

/// An open cache folder.
#[derive(Clone, Debug)]
pub struct Cache {
    dir: PathBuf,
    max_bytes: u64,
    /// The bytes of entries the folder held at the last scan plus those stored through this
    /// handle (and its clones) since; `None` before the first scan. A store scans the folder
    /// only when this may exceed the cap: a scan reads the metadata of every file, which in a
    /// folder of tens of thousands of entries costs more than the store.
    known_bytes: std::sync::Arc<std::sync::Mutex<Option<u64>>>,
}

static WARNED: AtomicBool = AtomicBool::new(false);

/// Reports a cache problem once per process; the cache is an optimization, never an error.
fn warn(what: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("rocannl: warning: compile cache: {what}; compiling without it");
    }
}

/// Whether `s` is a key as [`Cache::key`] makes them: 64 lowercase hex digits. Only such names
/// are ever looked up, written or removed.
pub fn is_key(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Cache {
    /// The cache a mode designates, or `None` when it is disabled. Touches no file: a folder
    /// that turns out unusable is a miss on every use.
    pub fn open(mode: &CacheMode) -> Option<Cache> {
        // The default folder comes from the environment too (`HOME`, `XDG_CACHE_HOME`).
        Cache::open_unlocked(mode)
    }

    fn open_unlocked(mode: &CacheMode) -> Option<Cache> {
        if cfg!(not(unix)) {
            return None;
        }
        let max_bytes = crate::env::var("ROCANNL_CACHE_MAX_BYTES")
            .and_then(|s| s.parse().ok())
            .unwrap_or(DEFAULT_MAX_BYTES);
        let dir = match mode {
            CacheMode::Off => return None,
            CacheMode::Dir(d) => d.clone(),
            CacheMode::FromEnv => {
                if crate::env::var("ROCANNL_CACHE").is_some_and(|v| v.eq_ignore_ascii_case("off")) {
                    return None;
                }
                match crate::env::var_os("ROCANNL_CACHE_DIR") {
                    Some(d) if !d.is_empty() => PathBuf::from(d),
                    _ => {
                        directories::ProjectDirs::from("", "", "rocannl")?.cache_dir().to_path_buf()
                    }
                }
            }
        };
        Some(Cache::at(dir, max_bytes))
    }

    /// The cache in folder `dir` with the size cap `max_bytes`, not yet scanned.
    fn at(dir: PathBuf, max_bytes: u64) -> Cache {
        Cache { dir, max_bytes, known_bytes: Default::default() }
    }

    /// The same cache with another size cap.
    pub fn with_max_bytes(self, max_bytes: u64) -> Cache {
        Cache { max_bytes, ..self }
    }

    /// The folder the user named.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache's own folder in it ([`ENTRIES`]), where everything it writes goes.
    pub fn entries_dir(&self) -> PathBuf {
        self.dir.join(ENTRIES)
    }

    /// The key of an entry: a SHA-256 over the parts, each length-prefixed so that no two
    /// different lists of parts collide by concatenation.
    pub fn key(parts: &[&[u8]]) -> String {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        hex(&h.finalize())
    }

    /// The path of a valid entry (a shared library), its use recorded for eviction; `None` when
    /// there is none or it is not usable (see the module documentation).
    pub fn lookup(&self, key: &str) -> Option<PathBuf> {
        self.lookup_bytes(key, EntryKind::SharedLibrary).map(|(path, _)| path)
    }

    /// The path and bytes of a valid entry of the given kind, its use recorded for eviction;
    /// `None` when there is none, it is not usable, or it does not match its digest (a damaged
    /// entry is removed).
    pub fn lookup_bytes(&self, key: &str, kind: EntryKind) -> Option<(PathBuf, Vec<u8>)> {
        if !is_key(key) {
            return None;
        }
        let dir = self.folder(false)?;
        let path = dir.join(format!("{key}.{}", kind.extension()));
        let (file, bytes) = match files::read_regular(&path, MAX_ENTRY_BYTES) {
            Read::Bytes(file, bytes) => (file, bytes),
            Read::Missing => return None,
            Read::Unusable(why) => {
                warn(&format!("ignoring entry {}: {why}", path.display()));
                return None;
            }
        };
        let digest = match files::read_regular(&dir.join(format!("{key}.sha256")), STEP_RECORD_CAP)
        {
            Read::Bytes(_, digest) => digest,
            _ => Vec::new(),
        };
        if digest.trim_ascii() != hex(&Sha256::digest(&bytes)).as_bytes() {
            warn(&format!("entry {} is damaged", path.display()));
            // Unless another process has just put a new entry in its place.
            files::remove_if_same(&path, &file);
            return None;
        }
        // Eviction removes the least recently used first (through the handle: the file read).
        let _ = file.set_modified(SystemTime::now());
        Some((path, bytes))
    }

    /// The entry holding the compiled step whose content key is `step`, if one was recorded
    /// ([`Cache::store_step`]). The entry itself is checked by [`Cache::lookup`] when loaded.
    pub fn lookup_step(&self, step: &str) -> Option<String> {
        if !is_key(step) {
            return None;
        }
        let steps = self.folder(false)?.join(STEPS);
        self.read_step(&steps, step)
    }

    fn read_step(&self, steps: &Path, step: &str) -> Option<String> {
        files::check_folder(steps, false, false).ok()?;
        let Read::Bytes(_, bytes) = files::read_regular(&steps.join(step), STEP_RECORD_CAP) else {
            return None;
        };
        let entry = std::str::from_utf8(&bytes).ok()?.trim();
        is_key(entry).then(|| entry.to_string())
    }

    /// Records that the entry `entry` holds the compiled step `step`: the step index, a small
    /// file per step in `steps/`, through which another routine or program finds a step it has
    /// in common with this one. Failures are ignored (the step is compiled again).
    pub fn store_step(&self, step: &str, entry: &str) {
        if !is_key(step) || !is_key(entry) {
            return;
        }
        let Some(dir) = self.folder(true) else { return };
        let steps = dir.join(STEPS);
        self.write_step(&steps, step, entry);
    }

    fn write_step(&self, steps: &Path, step: &str, entry: &str) {
        if files::check_folder(steps, true, false).is_ok() {
            let _ = files::write_new(steps, OsStr::new(step), entry.as_bytes());
        }
    }

    /// Stores the file at `path` (a shared library just built, say) as the entry of `key`
    /// ([`Cache::store_bytes`]); `path` itself is left as it is.
    pub fn store_file(&self, key: &str, path: &Path, kind: EntryKind) -> Option<PathBuf> {
        let bytes = self.read_built(path)?;
        self.store_bytes(key, &bytes, kind)
    }

    fn read_built(&self, path: &Path) -> Option<Vec<u8>> {
        match files::read_regular(path, MAX_ENTRY_BYTES) {
            Read::Bytes(_, bytes) => Some(bytes),
            Read::Missing => None,
            Read::Unusable(why) => {
                warn(&format!("cannot store {}: {why}", path.display()));
                None
            }
        }
    }

    /// Writes `bytes` as the entry of `key` with its digest, each through a temporary file
    /// renamed into place, then evicts old entries beyond the size cap. Returns the entry's
    /// path, or `None` (with a warning) when it could not be stored.
    pub fn store_bytes(&self, key: &str, bytes: &[u8], kind: EntryKind) -> Option<PathBuf> {
        if !is_key(key) || bytes.is_empty() || bytes.len() as u64 > MAX_ENTRY_BYTES {
            return None;
        }
        let dir = self.folder(true)?;
        let name = format!("{key}.{}", kind.extension());
        match self.write_entry(&dir, key, &name, bytes) {
            Ok(()) => {
                self.keep_within_cap(&dir, bytes.len() as u64);
                Some(dir.join(name))
            }
            Err(e) => {
                warn(&format!("cannot store an entry in {}: {e}", dir.display()));
                None
            }
        }
    }

    /// Evicts beyond the cap after a store of `stored` bytes, scanning the folder on the first
    /// store and then only when the last scan's total and the bytes stored since exceed the
    /// cap. Entries other processes store are counted at the next scan (of any process), so
    /// the folder may pass the cap by what they stored meanwhile, as with concurrent stores
    /// before.
    fn keep_within_cap(&self, dir: &Path, stored: u64) {
        let mut known = self.known_bytes.lock().unwrap_or_else(|e| e.into_inner());
        *known = Some(match *known {
            Some(total) if total.saturating_add(stored) <= self.max_bytes => total + stored,
            _ => evict::evict(dir, self.max_bytes),
        });
    }

    /// The digest first: an entry in place always has its digest (or a newer one, which a
    /// reader takes for damage and compiles again).
    fn write_entry(&self, dir: &Path, key: &str, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let digest = hex(&Sha256::digest(bytes));
        files::write_new(dir, OsStr::new(&format!("{key}.sha256")), digest.as_bytes())?;
        files::write_new(dir, OsStr::new(name), bytes)
    }

    /// The cache's own folder, checked (and created first with `create`); `None` when it is
    /// refused (with a warning) or, when only reading, does not exist yet.
    fn folder(&self, create: bool) -> Option<PathBuf> {
        let entries = self.entries_dir();
        let checked = files::check_folder(&self.dir, create, true)
            .map_err(|why| (self.dir.as_path(), why))
            .and_then(|()| {
                files::check_folder(&entries, create, false).map_err(|why| (entries.as_path(), why))
            });
        match checked {
            Ok(()) => Some(entries.clone()),
            Err((_, Refusal::Missing)) if !create => None,
            Err((dir, why)) => {
                warn(&format!("refusing the folder {}: {why}", dir.display()));
                None
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn cache(max_bytes: u64) -> (tempfile::TempDir, Cache) {
        let dir = tempfile::tempdir_in(crate::env::temp_dir()).expect("a folder");
        let cache = Cache::at(dir.path().join("cache"), max_bytes);
        (dir, cache)
    }

    fn key(name: &str) -> String {
        Cache::key(&[name.as_bytes()])
    }

    fn put(cache: &Cache, key: &str, bytes: &[u8]) -> PathBuf {
        cache.store_bytes(key, bytes, EntryKind::SharedLibrary).expect("stored")
    }

    #[test]
    fn keys_separate_their_parts() {
        assert_ne!(Cache::key(&[b"ab", b"c"]), Cache::key(&[b"a", b"bc"]));
        assert_eq!(Cache::key(&[b"x"]), Cache::key(&[b"x"]));
        assert!(is_key(&Cache::key(&[b"x"])));
    }

    #[test]
    fn stored_entries_are_found_and_damaged_ones_are_not() {
        let (_tmp, cache) = cache(DEFAULT_MAX_BYTES);
        let k = key("k");
        assert_eq!(cache.lookup(&k), None);
        let path = put(&cache, &k, b"compiled code");
        assert_eq!(path, cache.entries_dir().join(format!("{k}.so")));
        assert_eq!(cache.lookup(&k), Some(path.clone()));
        // Truncated: a miss, and the entry is gone.
        std::fs::write(&path, b"compiled").expect("truncate");
        assert_eq!(cache.lookup(&k), None);
        assert!(!path.exists());
        // Stored again, then its digest lost: a miss.
        put(&cache, &k, b"compiled code");
        std::fs::remove_file(cache.entries_dir().join(format!("{k}.sha256"))).expect("digest");
        assert_eq!(cache.lookup(&k), None);
    }

    #[test]
    fn the_least_recently_used_entries_are_evicted_beyond_the_cap() {
        let (_tmp, cache) = cache(25);
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let old = put(&cache, &a, &[1; 10]);
        let t0 = SystemTime::now() - std::time::Duration::from_secs(100);
        std::fs::File::options()
            .append(true)
            .open(&old)
            .and_then(|f| f.set_modified(t0))
            .expect("age");
        put(&cache, &b, &[2; 10]);
        put(&cache, &c, &[3; 10]);
        assert_eq!(cache.lookup(&a), None, "the oldest entry is evicted");
        assert!(!cache.entries_dir().join(format!("{a}.sha256")).exists(), "with its digest");
        assert!(cache.lookup(&b).is_some() && cache.lookup(&c).is_some());
    }

    /// Stores under the cap do not scan the folder again: an entry another process left there
    /// is counted (and evicted if need be) at the first store, then at the store that may take
    /// the folder past the cap, not at every store.
    #[test]
    fn the_folder_is_scanned_first_and_when_the_cap_may_be_passed() {
        let (_tmp, cache) = cache(35);
        let (old, a, b, c) = (key("old"), key("a"), key("b"), key("c"));
        // Another process's entry, older than this one's.
        let other = cache.clone().with_max_bytes(u64::MAX);
        let path = put(&other, &old, &[9; 10]);
        let t0 = SystemTime::now() - std::time::Duration::from_secs(100);
        let aged = std::fs::File::options().append(true).open(&path);
        aged.and_then(|f| f.set_modified(t0)).expect("age");
        // A fresh handle scans at its first store: 20 bytes, within the cap.
        let fresh = Cache::at(cache.dir.clone(), 35);
        put(&fresh, &a, &[1; 10]);
        assert_eq!(*fresh.known_bytes.lock().unwrap(), Some(20));
        // 30 bytes: counted, no scan needed.
        put(&fresh, &b, &[2; 10]);
        assert_eq!(*fresh.known_bytes.lock().unwrap(), Some(30));
        assert!(path.exists(), "30 bytes: within the cap");
        // 40 bytes would pass the cap: the scan evicts the oldest entry, the other process's.
        put(&fresh, &c, &[3; 10]);
        assert_eq!(*fresh.known_bytes.lock().unwrap(), Some(30));
        assert!(!path.exists());
        assert!([&a, &b, &c].iter().all(|k| fresh.lookup(k).is_some()));
    }

    #[test]
    fn an_unwritable_folder_is_no_error() {
        // A file where the folder should be: nothing can be created inside it.
        let (tmp, _) = cache(DEFAULT_MAX_BYTES);
        let blocker = tmp.path().join("blocked");
        std::fs::write(&blocker, b"not a folder").expect("file");
        let cache = Cache::at(blocker.join("inner"), DEFAULT_MAX_BYTES);
        assert_eq!(cache.store_bytes(&key("k"), b"code", EntryKind::Ptx), None);
        assert_eq!(cache.lookup(&key("k")), None);
        assert_eq!(cache.lookup_step(&key("k")), None);
        cache.store_step(&key("k"), &key("e"));
    }

    #[test]
    fn step_records_name_only_well_formed_keys() {
        let (_tmp, cache) = cache(DEFAULT_MAX_BYTES);
        let (step, entry) = (key("step"), key("entry"));
        cache.store_step(&step, &entry);
        assert_eq!(cache.lookup_step(&step), Some(entry.clone()));
        // Nothing is written or read under a name that is not a key.
        cache.store_step("../../escape", &entry);
        cache.store_step(&step, "../x");
        assert_eq!(cache.lookup_step(&step), Some(entry));
        assert_eq!(cache.lookup_step("../steps"), None);
        assert!(!cache.dir.join("escape").exists());
    }
}
