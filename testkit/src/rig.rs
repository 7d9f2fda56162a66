//! The VM rig (`vmrig`, the Linux kernel's RDS in qemu): where it is, whether
//! it is set up, and reading what its guests print. A test that cannot start
//! it prints one line starting with `SKIP:` and passes.

use std::path::{Path, PathBuf};

/// The repository's root (the directory of the workspace's Cargo.toml).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace root exists")
}

/// The rig: `$VMRIG_DIR`, `../shared/vmrig` next to the repository, or
/// `/work/shared/vmrig`; the error names every place tried.
pub fn find_rig() -> Result<PathBuf, String> {
    let mut cands = Vec::new();
    if let Ok(d) = std::env::var("VMRIG_DIR") {
        cands.push(PathBuf::from(d));
    }
    cands.push(workspace_root().join("../shared/vmrig"));
    cands.push(PathBuf::from("/work/shared/vmrig"));
    let tried: Vec<String> = cands.iter().map(|d| d.display().to_string()).collect();
    cands
        .into_iter()
        .find(|d| d.join("vmrig").is_file())
        .ok_or_else(|| format!("no VM rig found (tried {}; set VMRIG_DIR)", tried.join(", ")))
}

/// Whether `vmrig setup` has run (its cache holds a kernel, an initrd and
/// qemu): the reason it cannot boot if not.
pub fn rig_ready() -> Result<(), String> {
    let cache = PathBuf::from(std::env::var("VMRIG_CACHE").unwrap_or_else(|_| "/var/cache/vmrig".into()));
    for f in ["initrd.img", "kernel", "qemu"] {
        if !cache.join(f).exists() {
            return Err(format!(
                "the VM rig is not set up ({} missing; run `vmrig setup` or scripts/setup.sh)",
                cache.join(f).display()
            ));
        }
    }
    Ok(())
}

/// The rig, if it is there and set up; the reason otherwise.
pub fn usable_rig() -> Result<PathBuf, String> {
    let rig = find_rig()?;
    rig_ready()?;
    Ok(rig)
}

/// The lines guest `node` printed that start with `prefix`, both stripped
/// (the rig prefixes every guest line with `[nodeN] `).
pub fn node_lines<'a>(out: &'a str, node: u8, prefix: &str) -> Vec<&'a str> {
    let tag = format!("[node{node}] {prefix}");
    out.lines().filter_map(|l| l.strip_prefix(tag.as_str())).collect()
}

/// The value after `key` in a line of space-separated words.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut w = line.split_whitespace();
    while let Some(x) = w.next() {
        if x == key {
            return w.next();
        }
    }
    None
}
