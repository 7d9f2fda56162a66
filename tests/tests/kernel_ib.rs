//! The verbs path against the Linux kernel's `rds_rdma` over Soft-RoCE (rxe),
//! in the VM rig (`/work/shared/vmrig`: two Debian 12 guests, kernel 6.1).
//!
//! One boot runs `tests/vm/kernel_ib_scenario.sh`: node1 loads `rds_rdma`
//! and uses AF_RDS sockets (`tests/vm/kernel_side.py`), node2 runs
//! `ib-probe` (this crate's test bin, driving rds-ib's verbs path). Phase 1:
//! we connect through RDMA CM with the kernel's private data, ping and get
//! the kernel's pong, send 0 B, 1 B, 4 KiB, 64 KiB and 1 MiB to the
//! kernel's socket, which checks sender, lengths and contents in order; the
//! kernel acks them all. Phase 2: after our disconnect the kernel connects
//! to our listener and sends the same sizes, which we check.
//!
//! Run: `cargo test --release -p rds-tests --features verbs --test kernel_ib`.
//! When the rig cannot start (not found, never set up, guests not coming
//! up) the test prints one line starting with `SKIP:` and passes.
#![cfg(feature = "verbs")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use rds_testkit::rig::{field, node_lines, usable_rig, workspace_root};

const SIZES: [usize; 5] = [0, 1, 4096, 65536, 1 << 20];

#[test]
fn verbs_path_interoperates_with_kernel_rds_rdma() {
    let rig = match usable_rig() {
        Ok(r) => r,
        Err(why) => {
            println!("SKIP: rds-ib verbs against the kernel's rds_rdma not run: {why}");
            return;
        }
    };
    let root = workspace_root();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ib-probe"));
    let sizes: Vec<String> = SIZES.iter().map(|s| s.to_string()).collect();
    let mut cmd = Command::new(rig.join("vmrig"));
    cmd.current_dir(&root).args(["run", "-n", "2", "-t", "240"]);
    if !bin.starts_with(&root) {
        cmd.arg("-s").arg(bin.parent().unwrap());
    }
    cmd.arg("-e").arg(format!("IB_PROBE={}", bin.display()));
    cmd.arg("-e").arg(format!("SIZES={}", sizes.join(" ")));
    cmd.args(["--", "sh"]).arg(root.join("tests/vm/kernel_ib_scenario.sh"));
    let t0 = Instant::now();
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            println!("SKIP: rds-ib verbs against the kernel's rds_rdma not run: cannot run vmrig: {e}");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}\n{stderr}\nvmrig exit {:?} after {:.1} s", out.status.code(), t0.elapsed().as_secs_f64());
    if !stdout.contains("[node1]") && !stdout.contains("[node2]") {
        println!("SKIP: rds-ib verbs against the kernel's rds_rdma not run: the guests did not come up");
        return;
    }

    // Phase 1, our active side.
    let connected = node_lines(&stdout, 2, "CONNECTED ");
    assert_eq!(connected.len(), 1, "one connect");
    assert_eq!(field(connected[0], "version"), Some("4.1"), "the kernel accepts 4.1: {}", connected[0]);
    assert_eq!(field(connected[0], "pds"), Some("1"), "one shared PD");
    let pong = node_lines(&stdout, 2, "PONG ");
    assert_eq!(pong.len(), 1, "one pong");
    assert_eq!((field(pong[0], "sport"), field(pong[0], "dport")), (Some("0"), Some("5000")), "{}", pong[0]);
    let sent = node_lines(&stdout, 2, "SENT ");
    assert_eq!(sent.len(), SIZES.len());
    for (k, l) in sent.iter().enumerate() {
        let seq = (k + 2).to_string();
        assert_eq!(l.split_whitespace().next(), Some(k.to_string().as_str()));
        assert_eq!(field(l, "len"), Some(SIZES[k].to_string().as_str()));
        assert_eq!(field(l, "seq"), Some(seq.as_str()), "ping is seq 1, data 2..: {l}");
    }
    let acked = node_lines(&stdout, 2, "ACKED ");
    assert_eq!(acked.len(), 1);
    assert_eq!(acked[0].split_whitespace().next(), Some((SIZES.len() + 1).to_string().as_str()), "h_ack covers all");
    // What the kernel's socket received, in order, checked byte by byte there.
    let krx = node_lines(&stdout, 1, "KRX ");
    assert_eq!(krx.len(), SIZES.len(), "kernel received: {krx:?}");
    for (k, l) in krx.iter().enumerate() {
        assert_eq!(l.split_whitespace().next(), Some(k.to_string().as_str()));
        assert_eq!(field(l, "len"), Some(SIZES[k].to_string().as_str()));
        assert_eq!(field(l, "from"), Some("10.99.0.2:5000"));
        assert!(l.ends_with(" ok"), "kernel: {l}");
    }

    // Phase 2, the kernel connects to our listener and sends.
    let acc = node_lines(&stdout, 2, "P ACCEPTED ");
    assert_eq!(acc.len(), 1, "one accepted connection: {acc:?}");
    let v = field(acc[0], "version");
    assert!(v == Some("4.1") || v == Some("3.1"), "usable version: {}", acc[0]);
    assert_eq!(field(acc[0], "rejected"), Some("0"));
    let rx = node_lines(&stdout, 2, "P RX ");
    assert_eq!(rx.len(), SIZES.len(), "we received: {rx:?}");
    for (k, l) in rx.iter().enumerate() {
        assert_eq!(l.split_whitespace().next(), Some(k.to_string().as_str()));
        assert_eq!(field(l, "len"), Some(SIZES[k].to_string().as_str()));
        assert_eq!(field(l, "sport"), Some("4001"));
        assert!(l.ends_with(" ok"), "ours: {l}");
    }
    let seqs: Vec<u64> = rx.iter().map(|l| field(l, "seq").and_then(|s| s.parse().ok()).unwrap_or(0)).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "consecutive sequences: {seqs:?}");

    assert_eq!(node_lines(&stdout, 2, "RESULT ok").len(), 2, "devices and active runs ok");
    assert_eq!(node_lines(&stdout, 2, "P RESULT ok").len(), 1, "passive run ok");
    assert_eq!(node_lines(&stdout, 1, "KRESULT ok").len(), 2, "kernel recv and send ok");
    assert!(out.status.success(), "vmrig exit {:?}", out.status.code());
}
