//! Running the `rocannl` command in integration tests: one helper shared by every test file that
//! talks to the binary.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Runs `rocannl` with `args` (a document argument of `-` reads `doc` from standard input), after
/// `configure` has adjusted the command (its environment, say). Returns the exit status, the
/// answer parsed as JSON (`Null` when standard output is not JSON) and standard error.
pub fn rocannl_with(
    args: &[&str],
    doc: &str,
    configure: impl FnOnce(&mut Command),
) -> (i32, Value, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rocannl"));
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    configure(&mut cmd);
    let mut child = cmd.spawn().expect("run rocannl");
    // The command may answer (e.g. a usage error) before reading the document.
    let _ = child.stdin.take().expect("stdin").write_all(doc.as_bytes());
    let out = child.wait_with_output().expect("rocannl finishes");
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v, String::from_utf8_lossy(&out.stderr).to_string())
}

/// [`rocannl_with`] in the test's own environment.
#[allow(dead_code)] // not every test file that shares this module needs it
pub fn rocannl(args: &[&str], doc: &str) -> (i32, Value, String) {
    rocannl_with(args, doc, |_| {})
}
