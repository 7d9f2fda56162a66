//! capi/include/rds_capi.h matches the library: it compiles beside
//! <linux/rds.h> with the kernel's numbers (static asserts in
//! tests/c/layout.c), its prototypes are libc's, and it declares exactly
//! the `rds_*` functions librds.so exports.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn header_compiles_with_linux_rds_h_and_libc_prototypes() {
    let exe = common::cc(&common::repo().join("capi/tests/c/layout.c"), "layout", &[]);
    let o = Command::new(&exe).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n", "{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success());
}

fn declared() -> BTreeSet<String> {
    let h = std::fs::read_to_string(common::repo().join("capi/include/rds_capi.h")).unwrap();
    h.lines()
        .filter_map(|l| {
            let rest = ["int ", "ssize_t ", "void "].iter().find_map(|t| l.strip_prefix(t))?;
            let name = rest.split('(').next()?;
            name.starts_with("rds_").then(|| name.to_string())
        })
        .collect()
}

fn exported() -> BTreeSet<String> {
    let so = common::lib_dir().join("librds.so");
    let o = Command::new("nm").args(["-D", "--defined-only"]).arg(&so).output().expect("nm runs");
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T" && name.starts_with("rds_")).then(|| name.to_string())
        })
        .collect()
}

#[test]
fn header_declares_exactly_the_exported_functions() {
    let (d, e) = (declared(), exported());
    assert_eq!(d.len(), 20, "the contract's 20 functions are declared: {d:?}");
    assert_eq!(d, e, "declared in rds_capi.h vs exported by librds.so");
    for f in ["rds_socket", "rds_recvmsg", "rds_is_rds_fd", "rds_fork_child", "rds_dup3", "rds_poll"] {
        assert!(e.contains(f), "{f} exported");
    }
}
