//! Keeping the cache within its size cap, removing only what the cache itself wrote.
//!
//! Eviction is the only part of the cache that removes files it was not just handed, so it is
//! the part that could destroy the user's files. It looks only inside the cache's own entries
//! folder ([`super::ENTRIES`]), never in the folder the user named, and there it removes only
//! regular files (examined without following links) whose whole name is one of the cache's own:
//! an entry `<64 hex digits>.<so|ptx|cubin>`, a digest `<64 hex digits>.sha256`, a step record
//! `steps/<64 hex digits>`, or a temporary file of the cache's pattern
//! ([`super::files::is_temp_name`]). Anything else there — a file of another name, a link, a
//! folder, a FIFO — is neither counted nor removed.
//!
//! A scan reads the metadata of every file in the folder, which costs more than a store once the
//! folder holds tens of thousands of entries (0.25 s for 38k here), so a cache handle scans at
//! its first store and then only when what it has stored since may take the folder past the cap
//! ([`super::Cache`]): stale temporary files of dead processes go at the next process's first
//! store.
//!
//! Eviction may run in several processes at once and while others read: a removal is only ever
//! a future miss (an entry loaded already stays mapped), and every removal tolerates the file
//! being gone already.

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::files::{self, Read};
use super::{EntryKind, is_key};

/// A temporary file or digest without entry older than this is left over by a process that
/// died, and removed.
const STALE: Duration = Duration::from_secs(3600);

/// What a name in the entries folder is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Name<'a> {
    /// An entry: its key and kind.
    Entry(&'a str, EntryKind),
    /// An entry's digest.
    Digest(&'a str),
    /// A temporary file.
    Temp,
}

/// The cache's own name `name` is, if it is one.
pub fn classify(name: &str) -> Option<Name<'_>> {
    if files::is_temp_name(name) {
        return Some(Name::Temp);
    }
    let (key, ext) = name.split_once('.')?;
    if !is_key(key) {
        return None;
    }
    if ext == "sha256" {
        return Some(Name::Digest(key));
    }
    EntryKind::ALL.into_iter().find(|k| k.extension() == ext).map(|k| Name::Entry(key, k))
}

/// One entry found by a scan.
struct Found {
    modified: SystemTime,
    len: u64,
    name: String,
}

/// Removes the least recently used entries of the entries folder `dir` until it holds at most
/// `max_bytes`; removes stale temporary files and digests without entry; after removing
/// entries, removes the step records that name none. Returns the bytes of the entries left (0
/// when the folder cannot be read).
pub fn evict(dir: &Path, max_bytes: u64) -> u64 {
    let Ok(listing) = fs::read_dir(dir) else { return 0 };
    let now = SystemTime::now();
    let mut entries: Vec<Found> = Vec::new();
    let mut digests: Vec<(String, SystemTime)> = Vec::new();
    for e in listing.flatten() {
        // `DirEntry::metadata` does not follow links.
        let Ok(meta) = e.metadata() else { continue };
        let Some(name) = e.file_name().to_str().map(str::to_string) else { continue };
        let Some(kind) = classify(&name) else { continue };
        if !meta.file_type().is_file() {
            continue;
        }
        let modified = meta.modified().unwrap_or(now);
        match kind {
            Name::Temp if stale(now, modified) => remove(dir, &name),
            Name::Temp => {}
            Name::Digest(_) => digests.push((name, modified)),
            Name::Entry(..) => entries.push(Found { modified, len: meta.len(), name }),
        }
    }
    for (name, modified) in digests {
        let key = &name[..64];
        let orphan = EntryKind::ALL.iter().all(|k| !is_file(&dir.join(entry_name(key, *k))));
        if orphan && stale(now, modified) {
            remove(dir, &name);
        }
    }
    let mut total: u64 = entries.iter().map(|f| f.len).sum();
    if total <= max_bytes {
        return total;
    }
    entries.sort_by(|a, b| (a.modified, &a.name).cmp(&(b.modified, &b.name)));
    for found in entries {
        if total <= max_bytes {
            break;
        }
        remove(dir, &found.name);
        remove(dir, &format!("{}.sha256", &found.name[..64]));
        total = total.saturating_sub(found.len);
    }
    drop_stale_steps(dir);
    total
}

fn entry_name(key: &str, kind: EntryKind) -> String {
    format!("{key}.{}", kind.extension())
}

fn stale(now: SystemTime, modified: SystemTime) -> bool {
    now.duration_since(modified).is_ok_and(|d| d > STALE)
}

/// Whether `path` is a regular file (a link is not).
fn is_file(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// Removes `dir/name` if it is a regular file (a link or anything else stays); gone already is
/// fine.
fn remove(dir: &Path, name: &str) {
    let path = dir.join(name);
    if is_file(&path) {
        let _ = fs::remove_file(path);
    }
}

/// Removes the step records whose entry is gone, or which do not name an entry at all, and
/// stale temporary files of the step index.
fn drop_stale_steps(dir: &Path) {
    let steps = dir.join(super::STEPS);
    if files::check_folder(&steps, false, false).is_err() {
        return;
    }
    let Ok(listing) = fs::read_dir(&steps) else { return };
    let now = SystemTime::now();
    for e in listing.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else { continue };
        let Ok(meta) = e.metadata() else { continue };
        if !meta.file_type().is_file() {
            continue;
        }
        if files::is_temp_name(&name) && stale(now, meta.modified().unwrap_or(now)) {
            remove(&steps, &name);
        }
        if !is_key(&name) {
            continue;
        }
        let live = match files::read_regular(&steps.join(&name), super::STEP_RECORD_CAP) {
            Read::Bytes(_, bytes) => std::str::from_utf8(&bytes).is_ok_and(|entry| {
                let entry = entry.trim();
                is_key(entry) && is_file(&dir.join(entry_name(entry, EntryKind::SharedLibrary)))
            }),
            Read::Missing => continue,
            Read::Unusable(_) => false,
        };
        if !live {
            remove(&steps, &name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_caches_own_names_are_classified() {
        let key = "0123456789abcdef".repeat(4);
        assert_eq!(
            classify(&format!("{key}.so")),
            Some(Name::Entry(&key, EntryKind::SharedLibrary))
        );
        assert_eq!(classify(&format!("{key}.cubin")), Some(Name::Entry(&key, EntryKind::Cubin)));
        assert_eq!(classify(&format!("{key}.sha256")), Some(Name::Digest(&key)));
        let upper = key.to_uppercase();
        for other in [
            "libfoo.so".to_string(),
            format!("{upper}.so"),
            format!("{key}.so.1"),
            format!("{key}.tmp"),
            format!("{}.so", &key[..63]),
            format!("{key}0.so"),
            format!("x{key}.ptx"),
            "notes.tmp".to_string(),
            format!(".{key}.123.0.tmp"),
        ] {
            assert_eq!(classify(&other), None, "{other}");
        }
    }
}
