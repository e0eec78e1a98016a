//! The README's example, run as written, so the README stays true: the README shows
//! `examples/taste.rs` verbatim (which `cargo test` builds), and the example is run here with a
//! check that it learns.

#[test]
fn the_readme_example_infers_and_trains() {
    // `cargo test` builds the examples next to the test binaries.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let out = std::process::Command::new(dir.join("examples").join("taste"))
        .output()
        .expect("run the taste example (built by `cargo test`)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let loss: f64 = stdout
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no loss in {stdout}"));
    // The targets' variance is 0.60: the fit explains nearly all of it.
    assert!(loss < 1e-3, "{stdout}");
}

#[test]
fn the_readme_shows_the_taste_example_verbatim() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/taste.rs")).unwrap();
    let code = &example[example.find("use rocannl").unwrap()..];
    assert!(
        readme.contains(&format!("```rust\n{code}```")),
        "README.md differs from examples/taste.rs"
    );
}
