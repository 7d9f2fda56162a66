//! The same unmodified qperf under the shim in the VM rig, against the
//! kernel's qperf on the kernel's RDS-TCP (Debian 12, kernel 6.1): both
//! directions (the kernel's qperf serves and ours is the client, then the
//! reverse) and both address orders (two boots: ours on 10.99.0.1, the
//! smaller address and the connecting side, then on 10.99.0.2). Every
//! `rds_bw` and `rds_lat` run (2 s; the kernel's `rds_bw` against our
//! server 5 s: `vm/qperf.sh` says why) is parsed and checked: bandwidth
//! above 1 MB/s, latency below 50 ms (the guests run under qemu's TCG on a shared
//! machine: runs measured 0.9-5.5 ms, so the host's 10 ms bound could fail
//! on load alone; the figures are printed as a table). The guest script is
//! `vm/qperf.sh`. A boot with a problem adds its DIAG lines to the report:
//! the kernel's RDS TCP sockets during its `rds_lat` runs and our serving
//! engine's last snapshots (`rds-info`, when built). When the rig cannot
//! start the test prints one line starting with `SKIP:` and passes.

mod common;

use std::path::Path;
use std::process::Command;

use rds_testkit::rig::{usable_rig, workspace_root};

/// (client, test) of every run, per boot.
const RUNS: &[(&str, &str)] = &[("ours", "rds_bw"), ("ours", "rds_lat"), ("kernel", "rds_bw"), ("kernel", "rds_lat")];

fn scale(unit: &str) -> Option<f64> {
    Some(match unit {
        "bytes/sec" | "sec" => 1.0,
        "KB/sec" => 1e3,
        "MB/sec" => 1e6,
        "GB/sec" => 1e9,
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        _ => return None,
    })
}

/// One boot; returns the problems found and the table rows.
fn boot(rig: &Path, shim: &Path, knode: u8, order: &str) -> (Vec<String>, Vec<String>) {
    let root = workspace_root();
    let mut cmd = Command::new(rig.join("vmrig"));
    cmd.current_dir(&root).args(["run", "-n", "2", "-t", "400"]);
    if !shim.starts_with(&root) {
        cmd.arg("-s").arg(shim.parent().expect("dir"));
    }
    cmd.arg("-e").arg(format!("QPERF_KNODE={knode}"));
    cmd.arg("-e").arg(format!("QPERF_SHIM={}", shim.display()));
    // For the DIAG lines of a failure: our engine's state while it serves.
    let info = common::target_dir().join("rds-info");
    if info.exists() {
        cmd.arg("-e").arg(format!("QPERF_INFO={}", info.display()));
    }
    cmd.args(["--", "bash"]).arg(root.join("preload/tests/vm/qperf.sh"));
    let out = cmd.output().expect("run vmrig");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    println!("--- boot: ours {order}\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let mut problems = Vec::new();
    let mut rows = Vec::new();
    for (client, test) in RUNS {
        let line = stdout.lines().filter_map(|l| l.split_once("] ").map(|x| x.1).or(Some(l))).find(|l| {
            let mut f = l.split_whitespace();
            f.next() == Some("QPERF") && f.next() == Some(client) && f.next() == Some(test)
        });
        let fig = line.and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(f.get(3)?.parse::<f64>().ok()? * scale(f.get(4)?)?)
        });
        let server = if *client == "ours" { "kernel" } else { "ours" };
        match fig {
            None => problems.push(format!("ours {order}, {client} client to {server} server, {test}: no figure")),
            Some(v) if *test == "rds_bw" && v <= 1e6 => {
                problems.push(format!("ours {order}, {client} client, rds_bw {v} B/s, want above 1 MB/s"))
            }
            Some(v) if *test == "rds_lat" && !(v > 0.0 && v < 50e-3) => {
                problems.push(format!("ours {order}, {client} client, rds_lat {v} s, want below 50 ms"))
            }
            Some(v) => rows.push(format!(
                "| ours {order} | {client} -> {server} | {test} | {} |",
                if *test == "rds_bw" { format!("{:.1} MB/s", v / 1e6) } else { format!("{:.0} us", v * 1e6) }
            )),
        }
    }
    if !problems.is_empty() {
        // What both sides' RDS looked like (vm/qperf.sh): at the end of the
        // report, where a cut-off log still shows it.
        let diag: Vec<&str> = stdout.lines().filter(|l| l.contains("DIAG ")).collect();
        problems.push(format!("ours {order}: the DIAG lines of this boot:\n{}", diag.join("\n")));
    }
    (problems, rows)
}

#[test]
fn qperf_under_the_shim_against_the_kernels_qperf() {
    let rig = match usable_rig() {
        Ok(r) => r,
        Err(why) => {
            println!("SKIP: qperf against the kernel's RDS-TCP not run: {why}");
            return;
        }
    };
    let shim = common::shim();
    let mut problems = Vec::new();
    let mut table =
        vec!["| address order | client -> server | test | figure |".to_string(), "| --- | --- | --- | --- |".into()];
    for (knode, order) in [(2, "smaller"), (1, "larger")] {
        let (p, rows) = boot(&rig, &shim, knode, order);
        problems.extend(p);
        table.extend(rows);
    }
    println!("{}", table.join("\n"));
    assert!(problems.is_empty(), "qperf under the shim against the kernel:\n{}", problems.join("\n"));
}
