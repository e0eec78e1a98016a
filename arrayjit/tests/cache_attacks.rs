//! The compile cache under attack: the project's adversarial suite for `cache`.
//!
//! The cache loads native code from disk, takes its folder from an environment variable and
//! deletes files to stay within its cap, so each test here plants something where the cache
//! reads, writes or removes — links, FIFOs, folders, devices, enormous or foreign files, folders
//! others may write, names that are not keys — and checks that the cache neither follows,
//! blocks, trusts nor deletes it, and that nothing of it is an error: at worst a miss. Tests of
//! the backends built on it (a routine compiled from an attacked cache) are in
//! `cache_attacks_gccjit.rs`. Every test works in a temporary folder of its own; none needs
//! to run as root or not (where root's powers change one assertion, it is skipped as root).
#![cfg(unix)]

use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use rocannl_arrayjit::cache::{Cache, CacheMode, DEFAULT_MAX_BYTES, ENTRIES, EntryKind};

fn temp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rocannl-cache-attacks-")
        .tempdir_in(rocannl_arrayjit::env::temp_dir())
        .expect("a temporary folder")
}

fn open(dir: &Path) -> Cache {
    Cache::open(&CacheMode::Dir(dir.to_path_buf())).expect("a cache")
}

fn key(name: &str) -> String {
    Cache::key(&[name.as_bytes()])
}

fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("a path without NUL");
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn age(path: &Path, secs: u64) {
    let t = SystemTime::now() - Duration::from_secs(secs);
    fs::File::options().append(true).open(path).and_then(|f| f.set_modified(t)).expect("age");
}

/// Runs `f` on another thread and fails the test if it takes more than 30 s (a blocked open of
/// a FIFO, say) instead of hanging.
fn within_30s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{what} blocked"))
}

/// A cache in a fresh folder holding one valid entry of `key`; returns the entry's path.
fn stored(cache: &Cache, key: &str, bytes: &[u8]) -> PathBuf {
    cache.store_bytes(key, bytes, EntryKind::SharedLibrary).expect("stored")
}

/// The digest file of `key` in `cache`.
fn digest(cache: &Cache, key: &str) -> PathBuf {
    cache.entries_dir().join(format!("{key}.sha256"))
}

#[test]
fn eviction_never_removes_files_the_cache_did_not_create() {
    let tmp = temp();
    let dir = tmp.path();
    // The user's own folder, with files of every name the old cache removed.
    let mine: Vec<PathBuf> = ["mine.so", "lib.ptx", "kernel.cubin", "notes.tmp", "a.sha256"]
        .iter()
        .map(|n| dir.join(n))
        .chain([dir.join(format!("{}.so", key("x"))), dir.join(format!(".{}.1.0.tmp", key("y")))])
        .collect();
    for f in &mine {
        fs::write(f, b"the user's").expect("a file of the user's");
        age(f, 7200);
    }
    let cache = open(dir).with_max_bytes(1);
    // Inside the cache's own folder too: names that are not the cache's, and a link.
    stored(&cache, &key("first"), b"entry");
    let entries = cache.entries_dir();
    let victim = dir.join("victim.so");
    fs::write(&victim, b"precious").expect("victim");
    symlink(&victim, entries.join(format!("{}.so", key("link")))).expect("link");
    let foreign = ["readme.so", "notes.tmp", ".rocannl-short.tmp", "ABC.sha256"];
    for n in foreign {
        fs::write(entries.join(n), b"not the cache's").expect("planted");
        age(&entries.join(n), 7200);
    }
    fs::write(entries.join(format!("{}.so", key("up").to_uppercase())), b"x").expect("planted");
    for i in 0..4 {
        stored(&cache, &key(&format!("k{i}")), &[i; 64]);
    }
    for f in mine.iter().chain([&victim]) {
        assert!(fs::read(f).is_ok_and(|b| !b.is_empty()), "{} was removed", f.display());
    }
    for n in foreign {
        assert!(entries.join(n).exists(), "{n} was removed");
    }
    assert!(fs::symlink_metadata(entries.join(format!("{}.so", key("link")))).is_ok());
    assert_eq!(fs::read(&victim).expect("victim"), b"precious");
}

#[test]
fn eviction_removes_only_its_own_stale_temporary_files() {
    let tmp = temp();
    let cache = open(tmp.path());
    stored(&cache, &key("first"), b"entry");
    let entries = cache.entries_dir();
    let stale = entries.join(".rocannl-abcdefABCDEF.tmp");
    let fresh = entries.join(".rocannl-0123456789ab.tmp");
    let odd = entries.join(".rocannl-abc.tmp");
    for f in [&stale, &fresh, &odd] {
        fs::write(f, b"partial").expect("temporary file");
    }
    age(&stale, 7200);
    age(&odd, 7200);
    // The next process's first store scans the folder.
    let next = open(tmp.path());
    stored(&next, &key("second"), b"entry");
    assert!(!stale.exists(), "a stale temporary file of the cache's is removed");
    assert!(fresh.exists(), "a temporary file being written is not");
    assert!(odd.exists(), "nor a file of another pattern");
}

#[test]
fn eviction_follows_no_link_to_a_folder() {
    let tmp = temp();
    let cache = open(tmp.path()).with_max_bytes(1);
    stored(&cache, &key("first"), b"entry");
    // `steps` a link to a folder of the user's holding files named like step records that
    // name no entry: eviction would remove them if it followed the link.
    let theirs = tmp.path().join("theirs");
    fs::create_dir(&theirs).expect("folder");
    let record = theirs.join(key("record"));
    fs::write(&record, key("gone")).expect("record");
    symlink(&theirs, cache.entries_dir().join("steps")).expect("link");
    stored(&cache, &key("second"), b"another entry");
    assert!(record.exists(), "a file behind a link was removed");
    assert_eq!(cache.lookup_step(&key("record")), None, "nor is it read");
}

#[test]
fn a_planted_symlink_at_a_temporary_name_is_not_followed() {
    let tmp = temp();
    let cache = open(tmp.path());
    fs::create_dir_all(cache.entries_dir()).expect("folder");
    chmod(&cache.entries_dir(), 0o700);
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").expect("victim");
    // Every name of the old, predictable pattern `.<key>.<pid>.<n>.tmp`, and a few others.
    let k = key("entry");
    let pid = std::process::id();
    for n in 0..64 {
        let name = format!(".{k}.{pid}.{n}.tmp");
        symlink(&victim, cache.entries_dir().join(name)).expect("link");
        symlink(&victim, cache.entries_dir().join(format!(".{k}.{pid}.{n}.sha256.tmp")))
            .expect("link");
    }
    let entry = stored(&cache, &k, b"compiled");
    cache.store_step(&key("step"), &k);
    assert_eq!(fs::read(&victim).expect("victim"), b"precious");
    assert_eq!(cache.lookup(&k), Some(entry));
    assert_eq!(cache.lookup_step(&key("step")), Some(k));
}

#[test]
fn a_planted_symlink_at_an_entry_name_is_not_followed() {
    let tmp = temp();
    let cache = open(tmp.path());
    let k = key("entry");
    stored(&cache, &key("other"), b"compiled");
    // A valid library elsewhere, with its digest planted: reached only through the link.
    let elsewhere = tmp.path().join("elsewhere.so");
    fs::write(&elsewhere, b"compiled").expect("file");
    fs::copy(digest(&cache, &key("other")), digest(&cache, &k)).expect("digest");
    let at = cache.entries_dir().join(format!("{k}.so"));
    symlink(&elsewhere, &at).expect("link");
    assert_eq!(cache.lookup(&k), None);
    // A store replaces the link, never writes through it.
    stored(&cache, &k, b"new code");
    assert_eq!(fs::read(&elsewhere).expect("file"), b"compiled");
    assert!(fs::symlink_metadata(&at).expect("entry").file_type().is_file());
    assert_eq!(
        cache.lookup_bytes(&k, EntryKind::SharedLibrary).map(|(_, b)| b),
        Some(b"new code".to_vec())
    );
}

#[test]
fn a_fifo_entry_is_a_miss_and_does_not_block() {
    let tmp = temp();
    let cache = open(tmp.path());
    let k = key("entry");
    stored(&cache, &key("other"), b"compiled");
    let entries = cache.entries_dir();
    mkfifo(&entries.join(format!("{k}.so")));
    mkfifo(&entries.join(format!("{k}.ptx")));
    fs::write(entries.join(format!("{k}.cubin")), b"code").expect("entry");
    mkfifo(&digest(&cache, &k));
    cache.store_step(&key("step"), &key("other"));
    let steps = entries.join("steps");
    mkfifo(&steps.join(key("fifo")));
    let c = cache.clone();
    let found = within_30s("a lookup of a FIFO", move || {
        (
            c.lookup(&k),
            c.lookup_bytes(&k, EntryKind::Ptx),
            c.lookup_bytes(&k, EntryKind::Cubin),
            c.lookup_step(&key("fifo")),
        )
    });
    assert_eq!(found, (None, None, None, None));
    // Eviction passes them by too.
    let c = cache.clone().with_max_bytes(1);
    within_30s("eviction past FIFOs", move || c.store_bytes(&key("more"), b"x", EntryKind::Ptx));
}

#[test]
fn a_link_to_a_device_is_a_miss_and_does_not_hang() {
    let tmp = temp();
    let cache = open(tmp.path());
    let k = key("entry");
    stored(&cache, &k, b"compiled");
    // The digest a link to an endless device: an unbounded read never ends.
    fs::remove_file(digest(&cache, &k)).expect("digest");
    symlink("/dev/zero", digest(&cache, &k)).expect("link");
    let c = cache.clone();
    assert_eq!(within_30s("a digest from /dev/zero", move || c.lookup(&k)), None);
    let k = key("device");
    symlink("/dev/zero", cache.entries_dir().join(format!("{k}.ptx"))).expect("link");
    let c = cache.clone();
    let found = within_30s("an entry from /dev/zero", move || c.lookup_bytes(&k, EntryKind::Ptx));
    assert_eq!(found, None);
}

#[test]
fn an_enormous_entry_is_a_miss_and_is_not_read() {
    let tmp = temp();
    let cache = open(tmp.path());
    let k = key("entry");
    stored(&cache, &k, b"compiled");
    // Sparse: 64 GiB that take no space, and would take minutes to read and hash.
    let entry = cache.entries_dir().join(format!("{k}.so"));
    fs::File::options().write(true).open(&entry).and_then(|f| f.set_len(64 << 30)).expect("grow");
    let c = cache.clone();
    let started = Instant::now();
    assert_eq!(within_30s("an enormous entry", move || c.lookup(&k)), None);
    assert!(started.elapsed() < Duration::from_secs(10), "read: {:?}", started.elapsed());
    // An enormous digest, the same.
    let k = key("digest");
    stored(&cache, &k, b"compiled");
    fs::File::options()
        .write(true)
        .open(digest(&cache, &k))
        .and_then(|f| f.set_len(64 << 30))
        .expect("grow");
    let c = cache.clone();
    assert_eq!(within_30s("an enormous digest", move || c.lookup(&k)), None);
}

#[test]
fn folders_and_foreign_files_at_entry_names_are_misses() {
    let tmp = temp();
    let cache = open(tmp.path());
    let entries = cache.entries_dir();
    let k = key("entry");
    stored(&cache, &key("other"), b"compiled");
    // A folder where the entry should be: a miss, and a store fails without an error.
    fs::create_dir(entries.join(format!("{k}.so"))).expect("folder");
    fs::copy(digest(&cache, &key("other")), digest(&cache, &k)).expect("digest");
    assert_eq!(cache.lookup(&k), None);
    assert_eq!(cache.store_bytes(&k, b"compiled", EntryKind::SharedLibrary), None);
    assert!(entries.join(format!("{k}.so")).is_dir(), "the folder is left alone");
    // A folder where the digest should be.
    let k = key("digest");
    stored(&cache, &k, b"compiled");
    fs::remove_file(digest(&cache, &k)).expect("digest");
    fs::create_dir(digest(&cache, &k)).expect("folder");
    assert_eq!(cache.lookup(&k), None);
    // A valid entry others may write: anyone could have put code there.
    let k = key("shared");
    let path = stored(&cache, &k, b"compiled");
    chmod(&path, 0o666);
    assert_eq!(cache.lookup(&k), None);
    // Bytes replaced without their digest: a miss, never the wrong code.
    let k = key("replaced");
    let path = stored(&cache, &k, b"compiled");
    fs::write(&path, b"planted!").expect("replace");
    assert_eq!(cache.lookup(&k), None);
}

#[test]
fn an_unreadable_entry_is_a_miss() {
    let tmp = temp();
    let cache = open(tmp.path());
    let k = key("entry");
    let path = stored(&cache, &k, b"compiled");
    chmod(&path, 0o000);
    let found = cache.lookup(&k);
    // Root reads it all the same, and it is valid; for anyone else it is a miss.
    if !is_root() {
        assert_eq!(found, None);
    }
}

#[test]
fn an_entry_of_another_user_is_refused() {
    // Only root can give a file away; for anyone else no file of another user can be planted
    // in the user's own folder, which is what this checks.
    if !is_root() {
        return;
    }
    let tmp = temp();
    let cache = open(tmp.path());
    let k = key("entry");
    let path = stored(&cache, &k, b"compiled");
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).expect("chown");
    assert_eq!(cache.lookup(&k), None);
}

#[test]
fn a_folder_writable_by_others_is_refused() {
    for (mode_of_folder, mode_of_entries) in [(0o777, 0o700), (0o770, 0o700), (0o700, 0o777)] {
        let tmp = temp();
        let cache = open(tmp.path());
        let k = key("planted");
        // A valid entry with its digest, as anyone who may write there could plant it.
        stored(&cache, &k, b"compiled");
        chmod(tmp.path(), mode_of_folder);
        chmod(&cache.entries_dir(), mode_of_entries);
        assert_eq!(cache.lookup(&k), None, "{mode_of_folder:o} {mode_of_entries:o}");
        assert_eq!(cache.store_bytes(&key("new"), b"code", EntryKind::Ptx), None);
        cache.store_step(&key("step"), &k);
        assert_eq!(cache.lookup_step(&key("step")), None);
        let names = fs::read_dir(cache.entries_dir()).expect("folder").count();
        assert_eq!(names, 2, "nothing written in a refused folder");
        chmod(tmp.path(), 0o700);
    }
}

#[test]
fn a_folder_owned_by_another_user_is_refused() {
    let tmp = temp();
    let dir = if is_root() {
        // Root can give a folder of its own away.
        let dir = tmp.path().join("theirs");
        fs::create_dir(&dir).expect("folder");
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown");
        dir
    } else {
        // Anyone else has one at hand.
        PathBuf::from("/")
    };
    let cache = open(&dir);
    assert_eq!(cache.store_bytes(&key("k"), b"code", EntryKind::Ptx), None);
    assert_eq!(cache.lookup_bytes(&key("k"), EntryKind::Ptx), None);
    assert!(!dir.join(ENTRIES).exists(), "nothing created in another user's folder");
}

#[test]
fn an_entries_folder_that_is_a_link_is_refused() {
    let tmp = temp();
    // A valid cache elsewhere, the user's own...
    let other = open(&tmp.path().join("other"));
    let k = key("entry");
    stored(&other, &k, b"compiled");
    // ...reached through a link at the entries folder's name.
    let cache = open(&tmp.path().join("cache"));
    fs::create_dir(cache.dir()).expect("folder");
    symlink(other.entries_dir(), cache.entries_dir()).expect("link");
    assert_eq!(cache.lookup(&k), None);
    assert_eq!(cache.store_bytes(&key("new"), b"code", EntryKind::Ptx), None);
    assert_eq!(fs::read_dir(other.entries_dir()).expect("folder").count(), 2);
}

#[test]
fn a_file_where_a_folder_should_be_is_a_miss() {
    let tmp = temp();
    // Where the folder the user named should be...
    let file = tmp.path().join("file");
    fs::write(&file, b"the user's").expect("file");
    for cache in [open(&file), open(&file.join("inner"))] {
        assert_eq!(cache.store_bytes(&key("k"), b"code", EntryKind::Ptx), None);
        assert_eq!(cache.lookup_bytes(&key("k"), EntryKind::Ptx), None);
    }
    // ...and where the cache's own folder should be.
    let cache = open(&tmp.path().join("cache"));
    fs::create_dir(cache.dir()).expect("folder");
    fs::write(cache.entries_dir(), b"the user's").expect("file");
    assert_eq!(cache.store_bytes(&key("k"), b"code", EntryKind::Ptx), None);
    assert_eq!(fs::read(&file).expect("file"), b"the user's");
    assert_eq!(fs::read(cache.entries_dir()).expect("file"), b"the user's");
}

#[test]
fn a_read_only_folder_is_a_miss() {
    let tmp = temp();
    let cache = open(tmp.path());
    stored(&cache, &key("first"), b"compiled");
    chmod(&cache.entries_dir(), 0o500);
    let stored_again = cache.store_bytes(&key("k"), b"code", EntryKind::Ptx);
    // Root writes all the same; for anyone else, a miss (and no error either way).
    if !is_root() {
        assert_eq!(stored_again, None);
    }
    assert!(cache.lookup(&key("first")).is_some(), "what is there is still served");
    chmod(&cache.entries_dir(), 0o700);
}

#[test]
fn a_non_utf8_cache_folder_is_no_error() {
    let tmp = temp();
    let dir = tmp.path().join(OsStr::from_bytes(b"cache-\xff\xfe"));
    let cache = open(&dir);
    let k = key("entry");
    let path = stored(&cache, &k, b"compiled");
    assert!(path.starts_with(&dir));
    assert_eq!(cache.lookup(&k), Some(path));
    cache.store_step(&key("step"), &k);
    assert_eq!(cache.lookup_step(&key("step")), Some(k));
}

#[test]
fn names_that_are_not_keys_are_never_read_written_or_removed() {
    let tmp = temp();
    let cache = open(&tmp.path().join("cache"));
    stored(&cache, &key("first"), b"compiled");
    let outside = tmp.path().join("outside.so");
    fs::write(&outside, b"the user's").expect("file");
    for bad in ["../outside", "../../outside", "/etc/passwd", "", "ABC", &key("x").to_uppercase()] {
        assert_eq!(cache.store_bytes(bad, b"code", EntryKind::SharedLibrary), None, "{bad}");
        assert_eq!(cache.lookup(bad), None, "{bad}");
        assert_eq!(cache.lookup_step(bad), None, "{bad}");
        cache.store_step(bad, &key("first"));
        cache.store_step(&key("step"), bad);
    }
    assert_eq!(fs::read(&outside).expect("file"), b"the user's");
    assert_eq!(cache.lookup_step(&key("step")), None);
}

#[test]
fn a_step_record_holding_a_path_is_ignored() {
    let tmp = temp();
    let cache = open(tmp.path());
    let (step, entry) = (key("step"), key("entry"));
    stored(&cache, &entry, b"compiled");
    cache.store_step(&step, &entry);
    let record = cache.entries_dir().join("steps").join(&step);
    for planted in ["../../../../etc/passwd", "/etc/passwd", "..", &entry.to_uppercase()] {
        fs::write(&record, planted).expect("record");
        assert_eq!(cache.lookup_step(&step), None, "{planted}");
    }
    // A link in place of a record is not followed.
    fs::remove_file(&record).expect("record");
    let elsewhere = tmp.path().join("elsewhere");
    fs::write(&elsewhere, &entry).expect("file");
    symlink(&elsewhere, &record).expect("link");
    assert_eq!(cache.lookup_step(&step), None);
}

#[test]
fn racing_writers_readers_and_evictions_never_see_a_wrong_entry() {
    let tmp = temp();
    let cache = open(tmp.path()).with_max_bytes(4096);
    let keys: Vec<String> = (0..8).map(|i| key(&format!("k{i}"))).collect();
    // Two builds of one routine need not be byte for byte the same: writers of one key race
    // with different bytes, and a reader must get one of them whole, or nothing.
    let bytes = |k: &str, variant: usize| [k.as_bytes(), &[variant as u8; 64]].concat().repeat(8);
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (cache, keys) = (cache.clone(), keys.clone());
            std::thread::spawn(move || {
                for round in 0..40 {
                    let k = &keys[(t + round) % keys.len()];
                    if (t + round) % 2 == 0 {
                        cache.store_bytes(k, &bytes(k, t % 3), EntryKind::Ptx);
                    } else if let Some((_, got)) = cache.lookup_bytes(k, EntryKind::Ptx) {
                        assert!((0..3).any(|v| got == bytes(k, v)), "a wrong entry was served");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a racing thread");
    }
    let leftovers = fs::read_dir(cache.entries_dir())
        .expect("folder")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .count();
    assert_eq!(leftovers, 0, "no temporary file left behind");
    let total: u64 = fs::read_dir(cache.entries_dir())
        .expect("folder")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".ptx"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum();
    assert!(total <= 4096 + 2048, "over the cap: {total}");
}

#[test]
fn the_cache_off_touches_nothing() {
    assert!(Cache::open(&CacheMode::Off).is_none());
    assert_eq!(DEFAULT_MAX_BYTES, 1 << 30);
}
