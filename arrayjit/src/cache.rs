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
//! Where: `$ROCANNL_CACHE_DIR` when set, else the user's cache directory (`directories`:
//! `~/.cache/rocannl` on Linux); `ROCANNL_CACHE=off` disables it. Every entry is a file
//! `<key>.<kind>` — `.so` for a shared library of native code, `.ptx` or `.cubin` for CUDA
//! modules ([`EntryKind`]) — with a sidecar `<key>.sha256` holding the SHA-256 of its bytes.
//!
//! Safety of concurrent and damaged caches:
//! - entries are written to a temporary file in the cache directory and renamed into place, so a
//!   reader never sees half an entry, and two processes compiling the same routine at once both
//!   succeed (the last rename wins; both contents are valid);
//! - an entry is used only if its bytes hash to its sidecar's digest: a truncated, corrupted or
//!   half-replaced entry is a miss — compiled again and rewritten — never run;
//! - an unreadable or unwritable directory is a miss too: the routine is compiled as if there
//!   were no cache. Each such problem is reported once per process as a warning on stderr, never
//!   as an error;
//! - the cache is capped (1 GiB by default, `ROCANNL_CACHE_MAX_BYTES`): after a store, the
//!   entries used least recently (by modification time, refreshed on every hit) are removed until
//!   it fits.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

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

/// What a compile found in the cache.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CacheOutcome {
    /// No cache (disabled, or a backend without one).
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
    const ALL: [EntryKind; 3] = [EntryKind::SharedLibrary, EntryKind::Ptx, EntryKind::Cubin];

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
}

static WARNED: AtomicBool = AtomicBool::new(false);
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Reports a cache problem once per process; the cache is an optimization, never an error.
fn warn(what: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("rocannl: warning: compile cache: {what}; compiling without it");
    }
}

impl Cache {
    /// The cache a mode designates, or `None` when it is disabled.
    pub fn open(mode: &CacheMode) -> Option<Cache> {
        // The default folder comes from the environment too (`HOME`, `XDG_CACHE_HOME`).
        crate::env::with_lock(|| Cache::open_unlocked(mode))
    }

    fn open_unlocked(mode: &CacheMode) -> Option<Cache> {
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
        Some(Cache { dir, max_bytes })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
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

    fn entry(&self, key: &str) -> PathBuf {
        self.entry_of(key, EntryKind::SharedLibrary)
    }

    fn entry_of(&self, key: &str, kind: EntryKind) -> PathBuf {
        self.dir.join(format!("{key}.{}", kind.extension()))
    }

    fn digest_file(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.sha256"))
    }

    /// The path of a valid entry, its use recorded for eviction; `None` when there is none or it
    /// does not match its digest (a damaged entry is removed).
    pub fn lookup(&self, key: &str) -> Option<PathBuf> {
        self.lookup_bytes(key, EntryKind::SharedLibrary).map(|(path, _)| path)
    }

    /// The path and bytes of a valid entry of the given kind, its use recorded for eviction;
    /// `None` when there is none or it does not match its digest (a damaged entry is removed).
    pub fn lookup_bytes(&self, key: &str, kind: EntryKind) -> Option<(PathBuf, Vec<u8>)> {
        let path = self.entry_of(key, kind);
        let bytes = fs::read(&path).ok()?;
        let want = fs::read_to_string(self.digest_file(key)).ok();
        if want.as_deref().map(str::trim) != Some(hex(&Sha256::digest(&bytes)).as_str()) {
            warn(&format!("entry {} is damaged", path.display()));
            let _ = fs::remove_file(&path);
            return None;
        }
        // Refresh the modification time: eviction removes the least recently used first.
        if let Ok(f) = fs::File::options().append(true).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some((path, bytes))
    }

    /// The entry holding the compiled step whose content key is `step`, if one was recorded
    /// ([`Cache::store_step`]). The entry itself is checked by [`Cache::lookup`] when loaded.
    pub fn lookup_step(&self, step: &str) -> Option<String> {
        let entry = fs::read_to_string(self.step_file(step)).ok()?;
        let entry = entry.trim();
        (entry.len() == 64 && entry.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| entry.to_string())
    }

    /// Records that the entry `entry` holds the compiled step `step`: the step index, a small
    /// file per step in `steps/`, through which another routine or program finds a step it has
    /// in common with this one. Written to a temporary file and renamed; failures are ignored
    /// (the step is compiled again).
    pub fn store_step(&self, step: &str, entry: &str) {
        let path = self.step_file(step);
        let Some(dir) = path.parent() else { return };
        if fs::create_dir_all(dir).is_err() {
            return;
        }
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(".{step}.{}.{n}.tmp", std::process::id()));
        if fs::write(&temp, entry).is_err() || fs::rename(&temp, &path).is_err() {
            let _ = fs::remove_file(&temp);
        }
    }

    fn step_file(&self, step: &str) -> PathBuf {
        self.dir.join("steps").join(step)
    }

    /// A fresh temporary path in the cache folder (created if needed), for a backend to write an
    /// entry into before [`Cache::store`]; `None` (with a warning) when the folder is unusable.
    pub fn temp_path(&self, key: &str) -> Option<PathBuf> {
        if let Err(e) = fs::create_dir_all(&self.dir) {
            warn(&format!("cannot create {}: {e}", self.dir.display()));
            return None;
        }
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!(".{key}.{}.{n}.tmp", std::process::id()));
        match fs::File::create(&path) {
            Ok(_) => Some(path),
            Err(e) => {
                warn(&format!("cannot write in {}: {e}", self.dir.display()));
                None
            }
        }
    }

    /// Moves a finished temporary file into place as the entry of `key`, with its digest, then
    /// evicts old entries beyond the size cap. Returns the entry's path, or `None` (with a
    /// warning, the temporary file removed) when it could not be stored.
    pub fn store(&self, key: &str, temp: &Path) -> Option<PathBuf> {
        self.store_as(key, temp, EntryKind::SharedLibrary)
    }

    /// Writes `bytes` as the entry of `key` (through a temporary file, as [`Cache::store`]);
    /// `None`, with a warning, when the folder is unusable.
    pub fn store_bytes(&self, key: &str, bytes: &[u8], kind: EntryKind) -> Option<PathBuf> {
        let temp = self.temp_path(key)?;
        if let Err(e) = fs::write(&temp, bytes) {
            let _ = fs::remove_file(&temp);
            warn(&format!("cannot write in {}: {e}", self.dir.display()));
            return None;
        }
        self.store_as(key, &temp, kind)
    }

    /// [`Cache::store`] for an entry of any kind.
    pub fn store_as(&self, key: &str, temp: &Path, kind: EntryKind) -> Option<PathBuf> {
        let stored = (|| -> std::io::Result<PathBuf> {
            let bytes = fs::read(temp)?;
            if bytes.is_empty() {
                return Err(std::io::Error::other("the compiled file is empty"));
            }
            let digest_tmp = temp.with_extension("sha256.tmp");
            let mut f = fs::File::create(&digest_tmp)?;
            f.write_all(hex(&Sha256::digest(&bytes)).as_bytes())?;
            f.sync_all()?;
            drop(f);
            fs::rename(&digest_tmp, self.digest_file(key))?;
            let path = self.entry_of(key, kind);
            fs::rename(temp, &path)?;
            Ok(path)
        })();
        match stored {
            Ok(path) => {
                self.evict();
                Some(path)
            }
            Err(e) => {
                let _ = fs::remove_file(temp);
                warn(&format!("cannot store an entry in {}: {e}", self.dir.display()));
                None
            }
        }
    }

    /// Removes the least recently used entries until the folder fits its cap; also removes
    /// temporary files left by processes that died more than an hour ago.
    fn evict(&self) {
        let Ok(dir) = fs::read_dir(&self.dir) else { return };
        let now = SystemTime::now();
        let mut entries: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
        let mut total = 0u64;
        for e in dir.flatten() {
            let path = e.path();
            let Ok(meta) = e.metadata() else { continue };
            let modified = meta.modified().unwrap_or(now);
            let name = e.file_name().to_string_lossy().to_string();
            if name.ends_with(".tmp") {
                if now.duration_since(modified).is_ok_and(|d| d.as_secs() > 3600) {
                    let _ = fs::remove_file(&path);
                }
                continue;
            }
            if EntryKind::ALL.iter().any(|k| name.ends_with(&format!(".{}", k.extension()))) {
                total += meta.len();
                entries.push((modified, meta.len(), path));
            }
        }
        if total <= self.max_bytes {
            return;
        }
        entries.sort();
        for (_, len, path) in entries {
            if total <= self.max_bytes {
                break;
            }
            let _ = fs::remove_file(&path);
            let _ = fs::remove_file(path.with_extension("sha256"));
            total = total.saturating_sub(len);
        }
        // Step records of removed entries go too.
        let Ok(steps) = fs::read_dir(self.dir.join("steps")) else { return };
        for e in steps.flatten() {
            let stale = fs::read_to_string(e.path())
                .map(|entry| !self.entry(entry.trim()).exists())
                .unwrap_or(true);
            if stale {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = crate::env::temp_dir().join(format!("rocannl-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn put(cache: &Cache, key: &str, bytes: &[u8]) -> PathBuf {
        let t = cache.temp_path(key).expect("a temporary file");
        fs::write(&t, bytes).expect("written");
        cache.store(key, &t).expect("stored")
    }

    #[test]
    fn keys_separate_their_parts() {
        assert_ne!(Cache::key(&[b"ab", b"c"]), Cache::key(&[b"a", b"bc"]));
        assert_eq!(Cache::key(&[b"x"]), Cache::key(&[b"x"]));
        assert_eq!(Cache::key(&[b"x"]).len(), 64);
    }

    #[test]
    fn stored_entries_are_found_and_damaged_ones_are_not() {
        let dir = temp_dir("damage");
        let cache = Cache { dir: dir.clone(), max_bytes: DEFAULT_MAX_BYTES };
        assert_eq!(cache.lookup("k"), None);
        let path = put(&cache, "k", b"compiled code");
        assert_eq!(cache.lookup("k"), Some(path.clone()));
        // Truncated: a miss, and the entry is gone.
        fs::write(&path, b"compiled").expect("truncate");
        assert_eq!(cache.lookup("k"), None);
        assert!(!path.exists());
        // Stored again, then its digest lost: a miss.
        put(&cache, "k", b"compiled code");
        fs::remove_file(dir.join("k.sha256")).expect("remove digest");
        assert_eq!(cache.lookup("k"), None);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_least_recently_used_entries_are_evicted_beyond_the_cap() {
        let dir = temp_dir("evict");
        let cache = Cache { dir: dir.clone(), max_bytes: 25 };
        let old = put(&cache, "a", &[1; 10]);
        let t0 = SystemTime::now() - std::time::Duration::from_secs(100);
        fs::File::options().append(true).open(&old).and_then(|f| f.set_modified(t0)).expect("age");
        put(&cache, "b", &[2; 10]);
        put(&cache, "c", &[3; 10]);
        assert_eq!(cache.lookup("a"), None, "the oldest entry is evicted");
        assert!(cache.lookup("b").is_some() && cache.lookup("c").is_some());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_folder_is_no_error() {
        // A file where the folder should be: nothing can be created inside it.
        let blocker = temp_dir("blocked");
        fs::write(&blocker, b"not a folder").expect("file");
        let cache = Cache { dir: blocker.join("inner"), max_bytes: DEFAULT_MAX_BYTES };
        assert_eq!(cache.temp_path("k"), None);
        assert_eq!(cache.lookup("k"), None);
        let _ = fs::remove_file(&blocker);
    }
}
