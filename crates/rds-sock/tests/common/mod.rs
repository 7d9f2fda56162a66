//! Shared by the VM-rig tests of RDS over IB (feature `ib`): finding the
//! rig, and reading the `[nodeN] ...` lines its guests print.
#![allow(dead_code)] // each test uses a part

use std::path::{Path, PathBuf};

/// The datagram sizes the scenarios send: 0 B to 1 MiB.
pub const SIZES: [usize; 5] = [0, 1, 4096, 65536, 1 << 20];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

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

pub fn rig_ready() -> Result<(), String> {
    let cache = PathBuf::from(std::env::var("VMRIG_CACHE").unwrap_or_else(|_| "/var/cache/vmrig".into()));
    for f in ["initrd.img", "kernel", "qemu"] {
        if !cache.join(f).exists() {
            return Err(format!("the VM rig is not set up ({} missing; run `vmrig setup`)", cache.join(f).display()));
        }
    }
    Ok(())
}

/// Lines of one node, prefix stripped.
pub fn node_lines<'a>(out: &'a str, node: u8, prefix: &str) -> Vec<&'a str> {
    let tag = format!("[node{node}] {prefix}");
    out.lines().filter_map(|l| l.strip_prefix(tag.as_str())).collect()
}

pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut w = line.split_whitespace();
    while let Some(x) = w.next() {
        if x == key {
            return w.next();
        }
    }
    None
}

/// `RX k len n from A ok` lines: every size, in order, from `from`.
pub fn check_rx(lines: &[&str], from: &str, what: &str) {
    assert_eq!(lines.len(), SIZES.len(), "{what}: received {lines:?}");
    for (k, l) in lines.iter().enumerate() {
        assert_eq!(l.split_whitespace().next(), Some(k.to_string().as_str()), "{what}: order: {l}");
        assert_eq!(field(l, "len"), Some(SIZES[k].to_string().as_str()), "{what}: {l}");
        assert_eq!(field(l, "from"), Some(from), "{what}: {l}");
        assert!(l.ends_with(" ok"), "{what}: {l}");
    }
}
