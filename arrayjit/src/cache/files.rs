//! The only ways the compile cache touches the file system: folders checked before they are
//! trusted, files read without following links or blocking, files written under fresh names.
//!
//! The cache loads shared libraries it finds on disk, so whoever can write a file where the
//! cache reads one can run code in every process that uses it. And the cache folder is chosen by
//! an environment variable, so it may be a folder the user shares with others, or one full of
//! the user's own files. Everything the cache does to the disk therefore goes through the few
//! functions here, each written against one way of being fooled:
//!
//! - [`check_folder`]: a folder is used only if it is a real folder (not a link: the entries
//!   folder is examined with `lstat`), owned by the user running the process and not writable by
//!   group or others — anyone else able to write there could plant an entry or swap a file
//!   between our check and our use (ssh's `StrictModes` rule);
//! - [`read_regular`]: a file is opened with `O_NOFOLLOW` (a planted link is not followed),
//!   `O_NONBLOCK` (a FIFO does not block the open) and then examined on the open handle
//!   (`fstat`): it is read only if it is a regular file of the user's, not writable by group or
//!   others, and no larger than a cap, and the read itself stops at the cap;
//! - [`write_new`]: a file is written to a temporary file of a fresh random name created with
//!   `O_CREAT | O_EXCL` (the `tempfile` crate), so that no planted link or file at a predictable
//!   name is ever opened, then renamed over its final name (a rename replaces a link, it never
//!   writes through it);
//! - [`is_temp_name`]: the pattern of those temporary files, the only temporary files eviction
//!   may remove.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read as _, Write as _};
#[cfg(unix)]
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;

/// The start of every temporary file the cache creates.
pub const TEMP_PREFIX: &str = ".rocannl-";
/// The end of every temporary file the cache creates.
pub const TEMP_SUFFIX: &str = ".tmp";
/// The random characters of a temporary file's name.
const TEMP_RANDOM: usize = 12;

/// Why a folder is not used.
#[derive(Debug)]
pub enum Refusal {
    /// It does not exist (not worth a warning when only reading).
    Missing,
    /// It could not be created or examined.
    Io(io::Error),
    /// It is something else than a folder, a link included.
    NotAFolder,
    /// Another user owns it.
    Foreign(u32),
    /// Group or others may write in it.
    Shared(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Missing => write!(f, "it does not exist"),
            Refusal::Io(e) => write!(f, "{e}"),
            Refusal::NotAFolder => write!(f, "it is not a folder"),
            Refusal::Foreign(uid) => write!(f, "it belongs to user {uid}, not to this user"),
            Refusal::Shared(mode) => {
                write!(f, "group or others may write in it (mode {mode:o}; `chmod go-w` it)")
            }
        }
    }
}

/// The effective user id of this process: the owner of everything the cache trusts.
#[cfg(unix)]
pub fn euid() -> u32 {
    // SAFETY: no preconditions, cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a file or folder is the user's and not writable by anyone else.
#[cfg(unix)]
fn owned(meta: &fs::Metadata) -> Result<(), Refusal> {
    if meta.uid() != euid() {
        return Err(Refusal::Foreign(meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Refusal::Shared(meta.mode() & 0o7777));
    }
    Ok(())
}

/// Elsewhere nothing is trusted (the cache is off there: [`super::Cache::open`]).
#[cfg(not(unix))]
fn owned(_: &fs::Metadata) -> Result<(), Refusal> {
    Err(Refusal::Io(io::ErrorKind::Unsupported.into()))
}

/// Checks that `dir` is a folder the cache may trust (see the module documentation), creating
/// it first (mode 0700, and its missing parents) with `create`. `follow`: whether `dir` itself
/// may be a link to a folder (the folder the user named may be; the cache's own folders inside
/// it may not).
pub fn check_folder(dir: &Path, create: bool, follow: bool) -> Result<(), Refusal> {
    if create {
        let mut builder = fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        builder.mode(0o700);
        if let Err(e) = builder.create(dir) {
            return Err(Refusal::Io(e));
        }
    }
    let meta = if follow { fs::metadata(dir) } else { fs::symlink_metadata(dir) };
    let meta = match meta {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Refusal::Missing),
        Err(e) => return Err(Refusal::Io(e)),
    };
    if !meta.is_dir() {
        return Err(Refusal::NotAFolder);
    }
    owned(&meta)
}

/// What a read found.
#[derive(Debug)]
pub enum Read {
    /// The file's bytes, and the open file (to refresh its time).
    Bytes(fs::File, Vec<u8>),
    /// There is no such file.
    Missing,
    /// There is something unusable at the name: a link, a folder, a FIFO or device, another
    /// user's file, a file others may write, one larger than the cap, or one that failed to read.
    Unusable(String),
}

/// Reads a file of at most `cap` bytes without following a link at its name, without blocking
/// on a FIFO or device, and only if it is a regular file of the user's (see the module
/// documentation).
pub fn read_regular(path: &Path, cap: u64) -> Read {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    let opened = options.open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Read::Missing,
        Err(e) => return Read::Unusable(e.to_string()),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Read::Unusable(e.to_string()),
    };
    if !meta.file_type().is_file() {
        return Read::Unusable("not a regular file".into());
    }
    if let Err(why) = owned(&meta) {
        return Read::Unusable(why.to_string());
    }
    if meta.len() > cap {
        return Read::Unusable(format!("{} bytes, more than the cap of {cap}", meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded again: the file may grow while it is read.
    if let Err(e) = (&file).take(cap + 1).read_to_end(&mut bytes) {
        return Read::Unusable(e.to_string());
    }
    if bytes.len() as u64 > cap {
        return Read::Unusable(format!("grew past the cap of {cap} bytes"));
    }
    Read::Bytes(file, bytes)
}

/// Removes `path` if it is still the file `file` was opened from (not one renamed into its
/// place since, by another process).
pub fn remove_if_same(path: &Path, file: &fs::File) {
    let (Ok(at), Ok(opened)) = (fs::symlink_metadata(path), file.metadata()) else { return };
    #[cfg(unix)]
    if (at.dev(), at.ino()) != (opened.dev(), opened.ino()) {
        return;
    }
    #[cfg(not(unix))]
    let _ = (at, opened);
    let _ = fs::remove_file(path);
}

/// Writes `bytes` to a fresh temporary file in `dir` (see the module documentation), flushed
/// to the disk, then renames it to `dir/name`. On failure the temporary file is removed.
pub fn write_new(dir: &Path, name: &OsStr, bytes: &[u8]) -> io::Result<()> {
    let mut temp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .suffix(TEMP_SUFFIX)
        .rand_bytes(TEMP_RANDOM)
        .tempfile_in(dir)?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(dir.join(name)).map(drop).map_err(|e| e.error)
}

/// Whether `name` is one of the cache's temporary files ([`write_new`]).
pub fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX).and_then(|rest| rest.strip_suffix(TEMP_SUFFIX)).is_some_and(
        |random| random.len() == TEMP_RANDOM && random.bytes().all(|b| b.is_ascii_alphanumeric()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_match_their_own_pattern_only() {
        let dir = tempfile::tempdir_in(crate::env::temp_dir()).expect("a folder");
        write_new(dir.path(), OsStr::new("x"), b"1").expect("written");
        let temp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .suffix(TEMP_SUFFIX)
            .rand_bytes(TEMP_RANDOM)
            .tempfile_in(dir.path())
            .expect("a temporary file");
        let name = temp.path().file_name().and_then(OsStr::to_str).expect("a name");
        assert!(is_temp_name(name), "{name}");
        for other in [".rocannl-abc.tmp", "rocannl-abcdefghijkl.tmp", ".rocannl-abcdefgh/jkl.tmp"] {
            assert!(!is_temp_name(other), "{other}");
        }
        assert!(!is_temp_name(".rocannl-abcdefghijk-.tmp"));
    }
}
