//! Shared by the VM-rig tests of RDS over IB (feature `ib`): booting a
//! scenario of `tests/vm/` in the rig (found by `rds_testkit::rig`), and
//! reading the `[nodeN] ...` lines its guests print.
#![allow(dead_code)] // each test uses a part

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Instant;

pub use rds_testkit::rig::{field, node_lines, usable_rig, workspace_root};

/// The datagram sizes the scenarios send: 0 B to 1 MiB.
pub const SIZES: [usize; 5] = [0, 1, 4096, 65536, 1 << 20];

/// One two-guest boot at a time per test binary (the machine has 2 cores).
static BOOT: Mutex<()> = Mutex::new(());

/// Runs `tests/vm/<script>` in `vmrig run -n 2 -t <timeout_s>` with
/// `PEER_BIN=<peer_bin>` and `env` in the guests, and prints what they
/// printed. Returns their stdout and the exit status; `None` (after printing
/// `SKIP: <what> ...`) when the rig cannot start or no guest came up. A
/// guest that came up prints `[nodeN]` lines, on stdout or, for a scenario
/// that failed early, on stderr: that is a failure, not a SKIP.
pub fn boot(
    what: &str,
    script: &str,
    peer_bin: &Path,
    env: &[(&str, String)],
    timeout_s: u32,
) -> Option<(String, Output)> {
    let _one = BOOT.lock().unwrap_or_else(|p| p.into_inner());
    let rig = match usable_rig() {
        Ok(r) => r,
        Err(why) => {
            println!("SKIP: {what} in the VM rig not run: {why}");
            return None;
        }
    };
    let root = workspace_root();
    let mut cmd = Command::new(rig.join("vmrig"));
    cmd.current_dir(&root).args(["run", "-n", "2", "-t", &timeout_s.to_string()]);
    if !peer_bin.starts_with(&root) {
        cmd.arg("-s").arg(peer_bin.parent().unwrap());
    }
    cmd.arg("-e").arg(format!("PEER_BIN={}", peer_bin.display()));
    for (k, v) in env {
        cmd.arg("-e").arg(format!("{k}={v}"));
    }
    cmd.args(["--", "sh"]).arg(root.join("tests/vm").join(script));
    let t0 = Instant::now();
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            println!("SKIP: {what} in the VM rig not run: cannot run vmrig: {e}");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}\n{stderr}\nvmrig exit {:?} after {:.1} s", out.status.code(), t0.elapsed().as_secs_f64());
    if !format!("{stdout}{stderr}").contains("[node") {
        println!("SKIP: {what} in the VM rig not run: the guests did not come up");
        return None;
    }
    Some((stdout, out))
}

/// The sizes as the scenarios take them (`SIZES="0 1 ..."`).
pub fn sizes_env() -> String {
    SIZES.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(" ")
}

/// The value of counter `name` a node printed in `phase` (`<phase> CTR
/// <name> <value>`, rds-ib-peer's end of run), exactly once.
pub fn ctr(out: &str, node: u8, phase: &str, name: &str) -> u64 {
    let l = node_lines(out, node, &format!("{phase} CTR {name} "));
    assert_eq!(l.len(), 1, "node{node} phase {phase}: counter {name}: {l:?}");
    l[0].trim().parse().unwrap_or_else(|_| panic!("counter {name}: {}", l[0]))
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
