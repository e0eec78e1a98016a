//! Checkpoint files as files: the mode a new checkpoint gets, the mode a replaced one keeps, and
//! no temporary file left behind.

use std::path::{Path, PathBuf};

use rocannl_tensor::{Axes, BackendKind, Graph, Init, ParamSpec, Session, SessionOptions};

/// A session whose one parameter has been initialized.
fn session() -> Session {
    let g = Graph::new();
    let w = g.param(
        "w",
        ParamSpec::new(Axes::new().output(&[3])).init(Init::Values(vec![1.0, 2.0, 3.0])),
    );
    let y = w.scale(2.0);
    let opts = SessionOptions { backend: BackendKind::Interp, ..SessionOptions::default() };
    let mut s = Session::with_options(&g, opts).unwrap();
    let r = s.forward(&[&y]).unwrap();
    s.run(&r).unwrap();
    s
}

/// A fresh, empty folder of this test's own.
fn folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rocannl-persist-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(unix)]
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The files of a folder, by name.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A new checkpoint gets the mode any new file gets here (0666 less the umask, whatever the
/// umask is): the mode of a file `File::create` makes beside it.
#[cfg(unix)]
#[test]
fn a_new_checkpoint_gets_the_mode_of_any_new_file() {
    let dir = folder("new");
    let reference = dir.join("reference");
    std::fs::File::create(&reference).unwrap();
    let path = dir.join("ckpt.safetensors");
    session().save_params(&path).unwrap();
    assert_eq!(mode(&path), mode(&reference), "a checkpoint is an ordinary new file");
    assert_ne!(mode(&path) & 0o044, 0, "readable beyond its owner under the usual umasks");
    assert_eq!(listing(&dir), ["ckpt.safetensors", "reference"], "no temporary file is left");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Saving over an existing checkpoint keeps that file's mode, whatever it is, and the new
/// contents load.
#[cfg(unix)]
#[test]
fn replacing_a_checkpoint_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = folder("replace");
    let path = dir.join("ckpt.safetensors");
    let mut s = session();
    for kept in [0o640, 0o604, 0o400] {
        std::fs::write(&path, b"an older file").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(kept)).unwrap();
        s.save_params(&path).unwrap();
        assert_eq!(mode(&path), kept, "the replaced file's mode {kept:o}");
        s.load_params(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    assert_eq!(listing(&dir), ["ckpt.safetensors"], "no temporary file is left");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A checkpoint that cannot be written (its folder is missing) is an error naming the file,
/// and leaves nothing behind.
#[test]
fn a_checkpoint_in_a_missing_folder_is_an_error_naming_it() {
    let dir = folder("missing");
    let path = dir.join("no-such-folder").join("ckpt.safetensors");
    let e = session().save_params(&path).unwrap_err().to_string();
    assert!(e.contains("ckpt.safetensors"), "{e}");
    assert!(listing(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
