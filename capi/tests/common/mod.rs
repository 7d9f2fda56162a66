//! Building C programs against the header and the freshly built librds.so.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's top directory.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The directory of the librds.so cargo built with this test: the test
/// binary's own (`target/<profile>/deps/`; the copy in `target/<profile>/`
/// is only refreshed by a build of the library itself, not of its tests).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(dir.join("librds.so").exists(), "no librds.so in {} (cargo builds it with the tests)", dir.display());
    dir
}

/// Compiles `src` (C, with `-I capi/include`, linked to librds.so with an
/// rpath) into the test's scratch directory; panics with cc's output.
pub fn cc(src: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let lib = lib_dir();
    let inc = repo().join("capi/include");
    let o = Command::new("cc")
        .args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(&out)
        .arg("-I")
        .arg(&inc)
        .arg(src)
        .arg("-L")
        .arg(&lib)
        .arg("-lrds")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(extra)
        .output()
        .expect("cc runs");
    assert!(
        o.status.success(),
        "cc {} failed:\n{}{}",
        src.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}
