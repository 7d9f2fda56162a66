//! "A kernel-API program on our RDS": the kernel-side conformance harness
//! `tests/kernel/conform.py`, unchanged, run by python3 under the shim on the
//! host, against our `rds-conform` (tests/src/bin/rds-conform) — the same
//! pair `tests/tests/kernel_tcp.rs` runs across two VMs, here on 127.0.0.1
//! (python3, the "kernel" side) and 127.0.0.2 (rds-conform), in a private
//! network namespace.
//!
//! Both sides meet at barrier files in `/vmrig/sync` (hard-wired in both):
//! each child gets its own mount namespace with a fresh directory of this
//! test bound there, so runs never see each other's files (the empty
//! `/vmrig/sync` mount point is created on the host when missing).
//!
//! Every `RESULT <scenario> <direction> PASS|FAIL` line of both sides is
//! collected and printed as a table. The test fails on a missing result or a
//! FAIL of the scenarios in [`SCENARIOS`], except the directions listed
//! there as known (each with why: what conform.py checks there is the
//! kernel's own behaviour, or an rds-core issue that is not the shim's).
//! `PRELOAD_CONFORM_SCENARIOS` (space-separated) runs others of conform.py's
//! too, reported but not asserted (the README section "Run an existing
//! program on it" says which pass).
//! rds-conform and the tools next to it come from this workspace's target
//! directory (`cargo build --release -p rds-tests -p rds-tools` builds them;
//! scripts/test.sh does). Skips (SKIP line) only when python3 is missing.

mod common;

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Proc, preloaded, private_net, program, target_dir};

/// A scenario run by default: the directions that must PASS, those whose
/// FAIL is known and not the shim's (with why), and environment for the
/// python3 side.
struct Scenario {
    name: &'static str,
    pass: &'static [&'static str],
    known: &'static [(&'static str, &'static str)],
    py_env: &'static [(&'static str, &'static str)],
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "ping",
        pass: &["kernel->us"],
        known: &[(
            "us->kernel",
            "the kernel answers a ping to its address with no socket open; a process under the shim is an RDS node \
             only once it has a socket, and conform.py opens none before our rds-ping runs",
        )],
        py_env: &[],
    },
    Scenario {
        name: "tools",
        pass: &["us->kernel", "kernel->us"],
        known: &[],
        // With 8 paths the python3 node (the smaller address) reconnects
        // once rds-gen's process is gone and rds-sink's takes its address
        // (its lane-7 send connects path 0 first: rds-core's
        // `connect_if_down`; tests/tests/mprds_restart.rs).
        py_env: &[],
    },
    Scenario { name: "datagrams", pass: &["us->kernel", "kernel->us"], known: &[], py_env: &[] },
    // Our stream of 8 KiB messages in batched writes; one direction only.
    Scenario { name: "batches", pass: &["us->kernel"], known: &[], py_env: &[] },
    Scenario { name: "congestion", pass: &["us->kernel", "kernel->us"], known: &[], py_env: &[] },
    // rds-conform (the larger address) kills single TCP connections while
    // all 8 are up; every message exactly once.
    Scenario { name: "reconnect", pass: &["us->kernel", "kernel->us"], known: &[], py_env: &[] },
    // Both sides stream with running digests; the 1% netem loss, corruption
    // and duplication the VM adds on eth0 is absent (no eth0 here).
    Scenario { name: "selftest", pass: &["us->kernel", "kernel->us"], known: &[], py_env: &[] },
    Scenario {
        name: "mprds",
        pass: &["both", "us->kernel"],
        known: &[(
            "kernel->us",
            "conform.py picks its ports so that the kernel's lane hash (jhash of the port) spreads them over 8 \
             lanes; the python3 side is our node, whose lanes are port % 8",
        )],
        py_env: &[],
    },
];

const PY_ADDR: &str = "127.0.0.1";
const OUR_ADDR: &str = "127.0.0.2";

/// In the child before exec: a private mount namespace with `dir` bound on
/// /vmrig/sync.
fn with_sync_dir(cmd: &mut Command, dir: &Path) {
    let src = CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
    let dst = CString::new("/vmrig/sync").expect("path");
    let root = CString::new("/").expect("path");
    // SAFETY: the closure runs in the forked child before exec and makes
    // only system calls (unshare, mount) on strings prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let none = std::ptr::null();
            if libc::mount(none, root.as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(src.as_ptr(), dst.as_ptr(), none, libc::MS_BIND, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn side(cmd: &mut Command, node: &str, sc: &str, sync: &Path, bin: &Path) {
    cmd.env("VMRIG_NODE", node).env("VMRIG_NODES", "2").env("CONFORM_SC", sc).env("CONFORM_BIN", bin);
    with_sync_dir(cmd, sync);
}

/// Runs one scenario; returns (RESULT lines of both sides, the log).
fn run_scenario(
    py: &Path,
    sc: &str,
    py_env: &[(&str, &str)],
    work: &Path,
) -> (Vec<(String, String, bool, String)>, String) {
    let bin = target_dir();
    let sync = work.join(sc);
    std::fs::create_dir_all(&sync).expect("sync dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/kernel/conform.py");
    let mut k = preloaded(py);
    k.arg(&script).args([sc, "--self", PY_ADDR, "--peer", OUR_ADDR]);
    side(&mut k, "1", sc, &sync, &bin);
    k.envs(py_env.iter().copied());
    let mut o = Command::new(bin.join("rds-conform"));
    o.args([sc, "--self", OUR_ADDR, "--peer", PY_ADDR]);
    side(&mut o, "2", sc, &sync, &bin);
    let kp = Proc::spawn("conform.py", &mut k);
    let op = Proc::spawn("rds-conform", &mut o);
    let limit = Duration::from_secs(150);
    let (ocode, oout, oerr) = op.finish(limit);
    if ocode != Some(0) {
        let _ = std::fs::write(sync.join(format!("ABORT.{sc}")), b"");
    }
    let (kcode, kout, kerr) = kp.finish(Duration::from_secs(30));
    let log = format!(
        "--- {sc}: conform.py (exit {kcode:?})\n{kout}{kerr}--- {sc}: rds-conform (exit {ocode:?})\n{oout}{oerr}"
    );
    let mut results = Vec::new();
    for (who, out) in [("python", &kout), ("ours", &oout)] {
        for line in out.lines() {
            let mut f = line.splitn(5, ' ');
            if f.next() != Some("RESULT") {
                continue;
            }
            let (Some(s), Some(dir), Some(v)) = (f.next(), f.next(), f.next()) else { continue };
            if s == sc {
                results.push((who.to_string(), dir.to_string(), v == "PASS", f.next().unwrap_or("").to_string()));
            }
        }
    }
    (results, log)
}

#[test]
fn conform_py_under_the_shim_against_rds_conform() {
    let Some(py) = program("python3", "conform_py_under_the_shim_against_rds_conform") else { return };
    let bin = target_dir();
    for tool in ["rds-conform", "rds-ping", "rds-gen", "rds-sink"] {
        assert!(
            bin.join(tool).exists(),
            "{} missing: cargo build --release -p rds-tests -p rds-tools (scripts/test.sh does)",
            bin.join(tool).display()
        );
    }
    std::fs::create_dir_all("/vmrig/sync").expect("create the /vmrig/sync mount point (needs root)");
    private_net();
    let work: PathBuf = std::env::temp_dir().join(format!("rds-preload-conform-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let extra = std::env::var("PRELOAD_CONFORM_SCENARIOS").unwrap_or_default();
    let mut plan: Vec<&Scenario> = SCENARIOS.iter().collect();
    let extras: Vec<Scenario> = extra
        .split_whitespace()
        .filter(|s| !SCENARIOS.iter().any(|p| p.name == *s))
        .map(|s| Scenario { name: s.to_string().leak(), pass: &[], known: &[], py_env: &[] })
        .collect();
    plan.extend(extras.iter());
    let mut table = String::from("| scenario | direction | side | verdict | note |\n| --- | --- | --- | --- | --- |\n");
    let mut problems = Vec::new();
    let mut passed = 0;
    for sc in plan {
        let (results, log) = run_scenario(&py, sc.name, sc.py_env, &work);
        println!("{log}");
        for (who, dir, pass, note) in &results {
            let known = sc.known.iter().find(|k| k.0 == dir);
            let verdict = match (pass, known) {
                (true, _) => "PASS",
                (false, Some(_)) => "FAIL (known, not the shim's)",
                (false, None) => "FAIL",
            };
            table.push_str(&format!("| {} | {dir} | {who} | {verdict} | {note} |\n", sc.name));
            if !pass && known.is_none() {
                problems.push(format!("{} {dir} ({who}): FAIL {note}", sc.name));
            }
        }
        for d in sc.pass {
            let mine: Vec<_> = results.iter().filter(|r| &r.1 == d).collect();
            if mine.is_empty() {
                problems.push(format!("{} {d}: no RESULT", sc.name));
            } else if mine.iter().all(|r| r.2) {
                passed += 1;
            }
        }
        for (d, why) in sc.known {
            println!("KNOWN {} {d}: {why}", sc.name);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    println!("{table}");
    assert!(problems.is_empty(), "conform.py under the shim: {problems:#?}");
    let want: usize = SCENARIOS.iter().map(|s| s.pass.len()).sum();
    assert_eq!(passed, want, "scenario directions that passed on both sides");
}
