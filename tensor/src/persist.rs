//! Saving and loading parameters and buffers as safetensors.
//!
//! Each parameter and each buffer ([`crate::buffer`]: batch norm's running statistics) is
//! stored under its label with its dimensions in memory order (batch, output, input) and the
//! parameters' precision ([`Session::master_prec`]), as raw little-endian bytes, so a round
//! trip is bit-exact. Loading checks every name, shape and precision first and writes nothing
//! unless all match, so a file that does not fit leaves the session unchanged.
//!
//! Names are the modules' hierarchical names. [`crate::nn::BatchNorm`] names its tensors as
//! PyTorch's `BatchNorm1d` and `BatchNorm2d` do (`bn.weight`, `bn.bias`, `bn.running_mean`,
//! `bn.running_var`, `bn.num_batches_tracked`, each of `C` values but the last, a scalar), so
//! their checkpoint loads into the PyTorch module with `load_state_dict` (the counter is
//! stored as a float, which PyTorch converts to its integer).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rocannl_arrayjit::NdArray;
use rocannl_arrayjit::ops::Prec;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{Error, Result};
use crate::graph::Tensor;
use crate::session::Session;

fn dtype(p: Prec) -> Dtype {
    match p {
        Prec::F16 => Dtype::F16,
        Prec::Bf16 => Dtype::BF16,
        Prec::F32 => Dtype::F32,
        Prec::F64 => Dtype::F64,
        Prec::U32 => Dtype::U32,
    }
}

fn persist(msg: impl Into<String>) -> Error {
    Error::Persist(msg.into())
}

/// What a checkpoint's tensor is, for messages.
fn kind(t: &Tensor) -> &'static str {
    if t.is_buffer() { "buffer" } else { "parameter" }
}

impl Session {
    /// The params and the buffers by name.
    fn named_params(&self) -> Result<BTreeMap<String, Tensor>> {
        let mut out = BTreeMap::new();
        for p in self.graph().params().into_iter().chain(self.graph().buffers()) {
            if out.insert(p.label(), p.clone()).is_some() {
                return Err(persist(format!(
                    "two parameters or buffers are named '{}'",
                    p.label()
                )));
            }
        }
        Ok(out)
    }

    /// Saves every parameter and every buffer to a safetensors file. Under data parallelism
    /// only rank 0 writes it (every rank holds the same parameters); on the other ranks this
    /// does nothing.
    ///
    /// The file is written whole or not at all: to a new file beside it, then renamed over it.
    /// A new checkpoint gets the mode any new file gets (read and write for everyone the umask
    /// allows, as `File::create` makes it); replacing a file keeps that file's mode.
    ///
    /// ```
    /// use rocannl_tensor::{Axes, Graph, Init, ParamSpec, Session};
    /// let g = Graph::new();
    /// let w = g.param("w", ParamSpec::new(Axes::new().input(&[2]).output(&[3])).init(Init::Uniform { lo: -1.0, hi: 1.0 }));
    /// let y = w.matmul(&g.vector("x", &[1.0, 2.0]));
    /// let mut s = Session::new(&g).unwrap();
    /// let r = s.forward(&[&y]).unwrap();
    /// s.run(&r).unwrap();
    /// let path = std::env::temp_dir().join("rocannl_doc_params.safetensors");
    /// s.save_params(&path).unwrap();
    /// let before = s.read(&w).unwrap();
    /// s.write(&w, &[0.0; 6]).unwrap();
    /// s.load_params(&path).unwrap();
    /// assert_eq!(s.read(&w).unwrap(), before);
    /// ```
    pub fn save_params(&self, path: &Path) -> Result<()> {
        if self.group().is_some_and(|g| !g.is_root()) {
            return Ok(());
        }
        let params = self.named_params()?;
        let mut bytes = Vec::new();
        for (name, p) in &params {
            let values = self.read(p).map_err(|_| {
                persist(format!("{} '{name}' has no value yet: run a routine first", kind(p)))
            })?;
            let arr = NdArray::from_f64(self.master_prec(), &p.dims()?, &values)?;
            bytes.push((name.clone(), p.dims()?, arr.to_bytes()));
        }
        let views = bytes
            .iter()
            .map(|(n, dims, b)| {
                TensorView::new(dtype(self.master_prec()), dims.clone(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| persist(format!("parameter '{n}': {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let file = safetensors::tensor::serialize(views, None)
            .map_err(|e| persist(format!("{}: {e}", path.display())))?;
        drop(bytes);
        write_atomically(path, &file)
    }

    /// Loads every parameter and every buffer from a safetensors file written by
    /// [`Session::save_params`]. All names, shapes and precisions are checked before anything is
    /// written.
    pub fn load_params(&mut self, path: &Path) -> Result<()> {
        let data = std::fs::read(path)
            .map_err(|source| Error::Io { path: path.display().to_string(), source })?;
        let st = SafeTensors::deserialize(&data)
            .map_err(|e| persist(format!("{}: {e}", path.display())))?;
        let params = self.named_params()?;
        let mut staged = Vec::new();
        for (name, p) in &params {
            let view = st
                .tensor(name)
                .map_err(|_| persist(format!("{} has no {} '{name}'", path.display(), kind(p))))?;
            let dims = p.dims()?;
            if view.shape() != dims.as_slice() {
                return Err(persist(format!(
                    "{} '{name}' has dims {dims:?} but {} stores {:?}",
                    kind(p),
                    path.display(),
                    view.shape()
                )));
            }
            if view.dtype() != dtype(self.master_prec()) {
                return Err(persist(format!(
                    "{} '{name}' is {} but {} stores {:?}",
                    kind(p),
                    self.master_prec().name(),
                    path.display(),
                    view.dtype()
                )));
            }
            let arr = NdArray::from_bytes(self.master_prec(), &dims, view.data())?;
            staged.push((p.clone(), arr));
        }
        if let Some(extra) = st.names().into_iter().find(|n| !params.contains_key(*n)) {
            return Err(persist(format!(
                "{} has a parameter '{extra}' this graph lacks",
                path.display()
            )));
        }
        for (p, arr) in staged {
            self.write_array(&p, &arr)?;
        }
        Ok(())
    }
}

/// Writes `bytes` to `path` atomically: into a new file in the same folder, renamed over `path`
/// once complete, so that readers see the old file or the new one, never a part. The new file is
/// created as `File::create` creates one (mode 0666 less the umask, which the system applies);
/// when `path` exists, its mode is copied first.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| Error::Io { path: path.display().to_string(), source };
    let name =
        path.file_name().ok_or_else(|| persist(format!("{} names no file", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let kept_mode = std::fs::metadata(path).ok().map(|m| m.permissions());
    let (temp, mut file) = create_temp(dir, name).map_err(io)?;
    let written = (|| {
        if let Some(mode) = kept_mode {
            file.set_permissions(mode)?;
        }
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, path)
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        io(e)
    })
}

/// A new, empty file `.NAME.PID.N.tmp` in `dir`, created exclusively (never an existing one).
fn create_temp(dir: &Path, name: &OsStr) -> std::io::Result<(PathBuf, File)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut attempts = 0;
    loop {
        let mut temp = OsString::from(".");
        temp.push(name);
        temp.push(format!(".{}.{}.tmp", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let temp = dir.join(temp);
        match OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(f) => return Ok((temp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 100 => {
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    }
}
