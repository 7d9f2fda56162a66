//! Conformance against the Linux kernel's RDS over TCP, in the VM rig
//! (`/work/shared/vmrig`: two Debian 12 guests, kernel 6.1, under qemu).
//!
//! Two boots, one per address order: the kernel's RDS on node2
//! (10.99.0.2, our node the smaller address and the connecting side) and on
//! node1 (our node the larger address). In each boot `kernel/run.sh` runs
//! every scenario: `kernel/conform.py` on the kernel's guest,
//! `rds-conform` (src/bin) on ours. Both sides print `RESULT <scenario>
//! <direction> PASS|FAIL <note>` lines; this test collects them, prints the
//! table of what interoperates (docs/interop.md is filled from it; it is
//! also written to `$CARGO_TARGET_TMPDIR/kernel-interop.md`) and fails on
//! any FAIL or missing result.
//!
//! `reconnect` kills single TCP connections (the side with the larger address
//! kills, one at a time, only while all 8 are up, and must kill at least one),
//! while the kernel's receiving sockets, with a 4 KiB buffer, keep becoming
//! congested and uncongested (a congestion map from the kernel at each
//! change), and demands every message exactly once. `resetall` resets every path at
//! once; a 6.1 kernel gives a reconnecting path its lowest free slot, so paths
//! can swap sequence spaces and the kernel itself then loses and duplicates
//! messages: there losses and duplicates are counted, not failed, and a third
//! boot with the kernel's RDS on both guests (`kernel/baseline.sh`) measures
//! the kernel's own figures in the same run (`KERNEL_TCP_BASELINE=0` skips it).
//!
//! When the rig cannot start (not found, never set up, qemu missing, the
//! guests do not come up) the test prints one line starting with `SKIP:`
//! and passes. `VMRIG_DIR` points at the rig; `KERNEL_TCP_SCENARIOS`
//! (space-separated) runs a subset; `KERNEL_TCP_ORDERS` = `smaller`,
//! `larger` or both (default).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use rds_testkit::rig::{usable_rig, workspace_root};

const SCENARIOS: &str = "ping tools datagrams batches congestion mprds reconnect resetall restart selftest";

/// Scenarios that count lost and duplicated messages (GAPS lines) and have
/// a kernel-to-kernel baseline.
const GAP_SCENARIOS: &[&str] = &["reconnect", "resetall"];

/// (scenario, direction) pairs every boot must report.
const EXPECTED: &[(&str, &str)] = &[
    ("ping", "us->kernel"),
    ("ping", "kernel->us"),
    ("tools", "us->kernel"),
    ("tools", "kernel->us"),
    ("datagrams", "us->kernel"),
    ("datagrams", "kernel->us"),
    ("batches", "us->kernel"),
    ("congestion", "us->kernel"),
    ("congestion", "kernel->us"),
    ("mprds", "both"),
    ("mprds", "us->kernel"),
    ("mprds", "kernel->us"),
    ("reconnect", "us->kernel"),
    ("reconnect", "kernel->us"),
    ("resetall", "us->kernel"),
    ("resetall", "kernel->us"),
    ("restart", "stale"),
    ("restart", "us->kernel"),
    ("restart", "kernel->us"),
    ("selftest", "us->kernel"),
    ("selftest", "kernel->us"),
];

#[derive(Default)]
struct Cell {
    reports: Vec<(String, bool, String)>,
}

impl Cell {
    fn ok(&self) -> bool {
        !self.reports.is_empty() && self.reports.iter().all(|r| r.1)
    }
}

struct Boot {
    order: &'static str,
    cells: BTreeMap<(String, String), Cell>,
    /// (scenario, sent|recv, direction, count, sha256) from HASH lines.
    hashes: Vec<(String, String, String, String, String)>,
    /// (scenario, receiving direction, lost, duplicated) from GAPS lines.
    gaps: Vec<(String, String, u64, u64)>,
    secs: f64,
    log: String,
}

/// `vmrig run -n 2 -t SECS` from the workspace root, with the binaries'
/// directory shared into the guests (when it is outside the root) and named
/// in CONFORM_BIN.
fn vmrig_cmd(rig: &Path, bin: &Path, secs: u32) -> Command {
    let root = workspace_root();
    let mut cmd = Command::new(rig.join("vmrig"));
    cmd.current_dir(&root).args(["run", "-n", "2", "-t", &secs.to_string()]);
    if !bin.starts_with(&root) {
        cmd.arg("-s").arg(bin);
    }
    cmd.arg("-e").arg(format!("CONFORM_BIN={}", bin.display()));
    cmd
}

fn run_boot(rig: &Path, bin: &Path, knode: u8, order: &'static str, scenarios: &str) -> Result<Boot, String> {
    let root = workspace_root();
    let mut cmd = vmrig_cmd(rig, bin, 720);
    cmd.arg("-e").arg(format!("CONFORM_KNODE={knode}"));
    cmd.arg("-e").arg(format!("CONFORM_SCENARIOS={scenarios}"));
    cmd.args(["--", "bash"]).arg(root.join("tests/kernel/run.sh"));
    let t0 = Instant::now();
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", rig.join("vmrig").display()))?;
    let secs = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !stdout.contains("INFO setup") {
        let tail: Vec<&str> = stderr.lines().rev().take(6).collect();
        return Err(format!(
            "the guests did not come up (vmrig exit {:?}): {}",
            out.status.code(),
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let mut boot = Boot {
        order,
        cells: BTreeMap::new(),
        hashes: Vec::new(),
        gaps: Vec::new(),
        secs,
        log: format!("{stdout}\n{stderr}"),
    };
    for line in stdout.lines() {
        // "[nodeN] RESULT scenario direction PASS|FAIL note"
        let (node, rest) = match line.strip_prefix("[node") {
            Some(r) => (r.chars().next().unwrap_or('?'), r.get(3..).unwrap_or("")),
            None => ('?', line),
        };
        let side = if u8::try_from(node.to_digit(10).unwrap_or(0)).unwrap_or(0) == knode { "kernel" } else { "ours" };
        let mut f = rest.splitn(5, ' ');
        match f.next() {
            Some("RESULT") => {
                let (Some(sc), Some(dir), Some(verdict)) = (f.next(), f.next(), f.next()) else { continue };
                let note = f.next().unwrap_or("").to_string();
                boot.cells.entry((sc.to_string(), dir.to_string())).or_default().reports.push((
                    side.to_string(),
                    verdict == "PASS",
                    note,
                ));
            }
            Some("GAPS") => {
                // GAPS <scenario> <direction> <lost> <duplicated>
                let parts: Vec<&str> = rest.split(' ').collect();
                if let [_, sc, dir, lost, dup] = parts[..] {
                    if let (Ok(l), Ok(d)) = (lost.parse(), dup.parse()) {
                        boot.gaps.push((sc.into(), dir.into(), l, d));
                    }
                }
            }
            Some("HASH") => {
                let parts: Vec<&str> = rest.split(' ').collect();
                // HASH <scenario> sent|recv <dir> <count> <hex>
                if let [_, sc, kind, dir, count, hex] = parts[..] {
                    boot.hashes.push((sc.into(), kind.into(), dir.into(), count.into(), hex.into()));
                }
            }
            _ => {}
        }
    }
    // The selftest's (and the tools') criterion across the two guests: what
    // one side sent hashes like what the other received. A cell with one
    // side's hash but not the other's fails.
    let scs: std::collections::BTreeSet<String> = boot.hashes.iter().map(|h| h.0.clone()).collect();
    for sc in scs {
        for dir in ["us->kernel", "kernel->us"] {
            let sent = boot.hashes.iter().find(|h| h.0 == sc && h.1 == "sent" && h.2 == dir);
            let recv = boot.hashes.iter().find(|h| h.0 == sc && h.1 == "recv" && h.2 == dir);
            let (same, note) = match (sent, recv) {
                (Some(s), Some(r)) => {
                    let same = s.3 == r.3 && s.4 == r.4;
                    (
                        same,
                        format!(
                            "sender's sha256 {} receiver's ({} / {} messages)",
                            if same { "==" } else { "!=" },
                            s.3,
                            r.3
                        ),
                    )
                }
                (None, None) => continue,
                _ => (false, "only one side reported a hash".to_string()),
            };
            boot.cells.entry((sc.clone(), dir.into())).or_default().reports.push(("harness".into(), same, note));
        }
    }
    Ok(boot)
}

/// Lost and duplicated messages per scenario, both directions summed.
type Gaps = BTreeMap<String, (u64, u64)>;

/// The kernel's RDS on both guests (`kernel/baseline.sh`): its own gaps,
/// and how long the boot took.
fn run_baseline(rig: &Path, bin: &Path, scenarios: &[&str]) -> Result<(Gaps, f64), String> {
    let root = workspace_root();
    let mut cmd = vmrig_cmd(rig, bin, 600);
    cmd.arg("-e").arg(format!("BASELINE_SCENARIOS={}", scenarios.join(" ")));
    cmd.args(["--", "bash"]).arg(root.join("tests/kernel/baseline.sh"));
    let t0 = Instant::now();
    let out = cmd.output().map_err(|e| format!("cannot run {}: {e}", rig.join("vmrig").display()))?;
    let mut gaps = Gaps::new();
    let mut seen = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(i) = line.find("GAPS ") else { continue };
        let parts: Vec<&str> = line[i..].split(' ').collect();
        if let [_, sc, _, lost, dup] = parts[..] {
            if let (Ok(l), Ok(d)) = (lost.parse::<u64>(), dup.parse::<u64>()) {
                let e = gaps.entry(sc.to_string()).or_default();
                e.0 += l;
                e.1 += d;
                *seen.entry(sc.to_string()).or_insert(0) += 1;
            }
        }
    }
    // Both receivers must have reported.
    gaps.retain(|sc, _| seen.get(sc) == Some(&2));
    if gaps.is_empty() {
        return Err(format!("no figures (vmrig exit {:?})", out.status.code()));
    }
    Ok((gaps, t0.elapsed().as_secs_f64()))
}

fn build_tools(bin: &Path) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root()).args([
        "build",
        "-q",
        "-p",
        "rds-tools",
        "--bin",
        "rds-ping",
        "--bin",
        "rds-gen",
        "--bin",
        "rds-sink",
    ]);
    // The profile of this test's own binaries (target/<profile>/).
    match bin.file_name().and_then(|n| n.to_str()) {
        Some("release") => {
            cmd.arg("--release");
        }
        Some("debug") | None => {}
        Some(p) => {
            cmd.args(["--profile", p]);
        }
    }
    let st = cmd.status().map_err(|e| format!("cargo: {e}"))?;
    if !st.success() || ["rds-ping", "rds-gen", "rds-sink"].iter().any(|b| !bin.join(b).is_file()) {
        return Err(format!("building rds-ping, rds-gen, rds-sink failed ({st})"));
    }
    Ok(())
}

fn table(boots: &[Boot]) -> String {
    let mut s = String::new();
    s.push_str("| scenario | direction | address order | result | notes |\n|---|---|---|---|---|\n");
    for (sc, dir) in EXPECTED {
        for b in boots {
            let key = (sc.to_string(), dir.to_string());
            let (res, notes) = match b.cells.get(&key) {
                Some(c) => (
                    if c.ok() { "pass" } else { "**FAIL**" },
                    c.reports
                        .iter()
                        .map(|r| format!("{}: {}", r.0, r.2.replace('|', "/")))
                        .collect::<Vec<_>>()
                        .join("<br>"),
                ),
                None => ("**missing**", String::new()),
            };
            s.push_str(&format!("| {sc} | {dir} | {} | {res} | {notes} |\n", b.order));
        }
    }
    s
}

#[test]
fn kernel_tcp_conformance() {
    let rig = match usable_rig() {
        Ok(r) => r,
        Err(why) => {
            println!("SKIP: kernel conformance over TCP not run: {why}");
            return;
        }
    };
    let bin = Path::new(env!("CARGO_BIN_EXE_rds-conform")).parent().unwrap().to_path_buf();
    build_tools(&bin).expect("rds-ping, rds-gen, rds-sink");
    let scenarios = std::env::var("KERNEL_TCP_SCENARIOS").unwrap_or_else(|_| SCENARIOS.into());
    let orders = std::env::var("KERNEL_TCP_ORDERS").unwrap_or_else(|_| "smaller larger".into());
    let t0 = Instant::now();
    let mut boots = Vec::new();
    for (knode, order) in [(2u8, "us smaller"), (1u8, "us larger")] {
        if !orders.contains(order.trim_start_matches("us ")) {
            continue;
        }
        match run_boot(&rig, &bin, knode, order, &scenarios) {
            Ok(b) => {
                println!("{}: {} results in {:.0} s", order, b.cells.len(), b.secs);
                boots.push(b);
            }
            Err(why) if boots.is_empty() => {
                println!("SKIP: kernel conformance over TCP not run: {why}");
                return;
            }
            Err(why) => panic!("the second boot failed: {why}"),
        }
    }
    let mut t = table(&boots);
    // Lost and duplicated messages: ours against the kernel's own.
    let gap_wanted: Vec<&str> =
        GAP_SCENARIOS.iter().copied().filter(|sc| scenarios.split_whitespace().any(|w| w == *sc)).collect();
    if !gap_wanted.is_empty() {
        t.push_str("\n| scenario | peers | lost | duplicated |\n|---|---|---|---|\n");
        for sc in &gap_wanted {
            for b in &boots {
                let (l, d) = b.gaps.iter().filter(|g| g.0 == *sc).fold((0, 0), |a, g| (a.0 + g.2, a.1 + g.3));
                let n = b.gaps.iter().filter(|g| g.0 == *sc).count();
                t.push_str(&format!("| {sc} | ours and kernel, {} ({n} receivers) | {l} | {d} |\n", b.order));
            }
        }
        if std::env::var("KERNEL_TCP_BASELINE").as_deref() != Ok("0") {
            match run_baseline(&rig, &bin, &gap_wanted) {
                Ok((g, secs)) => {
                    for (sc, (l, d)) in g {
                        t.push_str(&format!(
                            "| {sc} | kernel and kernel (2 receivers, {secs:.0} s boot) | {l} | {d} |\n"
                        ));
                    }
                }
                Err(why) => t.push_str(&format!("\nkernel-to-kernel baseline not measured: {why}\n")),
            }
        }
    }
    println!("\n{t}\nkernel conformance: {:.0} s for {} boots", t0.elapsed().as_secs_f64(), boots.len());
    let _ = std::fs::write(Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-interop.md"), &t);
    let wanted: Vec<&str> = scenarios.split_whitespace().collect();
    let mut failed = Vec::new();
    for b in &boots {
        for (sc, dir) in EXPECTED.iter().filter(|(sc, _)| wanted.contains(sc)) {
            match b.cells.get(&(sc.to_string(), dir.to_string())) {
                Some(c) if c.ok() => {}
                Some(c) => failed.push(format!("{} {sc} {dir}: {:?}", b.order, c.reports)),
                None => failed.push(format!("{} {sc} {dir}: no result", b.order)),
            }
        }
        // Anything reported beyond the table is a failure too.
        for ((sc, dir), c) in &b.cells {
            if !c.ok() && !EXPECTED.contains(&(sc.as_str(), dir.as_str())) {
                failed.push(format!("{} {sc} {dir}: {:?}", b.order, c.reports));
            }
        }
    }
    if !failed.is_empty() {
        for b in &boots {
            let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kernel-{}.log", b.order.replace(' ', "-")));
            let _ = std::fs::write(&path, &b.log);
            println!("log of the {} boot: {}", b.order, path.display());
        }
        // The INFO lines of the failed scenarios (what either side saw) and
        // the state run.sh dumped when one was about to time out (DUMP), in
        // the message: a CI log shows it, not the log files.
        let mut infos = Vec::new();
        for b in &boots {
            for sc in wanted.iter().filter(|sc| failed.iter().any(|f| f.starts_with(&format!("{} {sc} ", b.order)))) {
                let (info, dump) = (format!("INFO {sc} "), format!("DUMP {sc} "));
                infos.extend(
                    b.log
                        .lines()
                        .filter(|l| l.contains(&info) || l.contains(&dump))
                        .map(|l| format!("{}: {l}", b.order)),
                );
            }
        }
        panic!("kernel conformance failures:\n{}\n{}", failed.join("\n"), infos.join("\n"));
    }
}
