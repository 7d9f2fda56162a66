//! A forced disconnect mid-stream over RDS-IB with nothing lost or
//! duplicated (feature `ib`), in the VM rig (`/work/shared/vmrig`: two
//! Debian 12 guests, kernel 6.1, Soft-RoCE over their link, no `rdma_ucm`).
//!
//! One boot runs `tests/vm/ib_disconnect_scenario.sh`: our engine on both
//! guests in the verbs-only setup mode (QP parameters over the TCP side
//! channel, port 18635, same pre-shared key). node2 streams `N` numbered
//! datagrams of mixed sizes (64 B .. 64 KiB; 8-byte index then a pattern)
//! to node1, paced so the stream lasts several seconds, and meanwhile
//! kills the established side channel connection `KILLS` times with
//! `ss -K` at random moments. The side channel's close is the verbs-only
//! DISCONNECTED: the QP goes to error, the flushes are drained, the core
//! sees `path_down`, reconnects and resends what was not acked marked
//! RETRANSMITTED, and the receiver's duplicate rule drops what it already
//! had. Asserted:
//!
//! * node1 got every datagram exactly once, in order, with its exact
//!   sender, length and content (`RXSTAT received N inorder N dup 0 lost 0
//!   bad 0`);
//! * node2 had every datagram acked (socket flush);
//! * the kills happened (`KILL i ... killed n` with n >= 1, at least one)
//!   and broke the path: node2's `conn_reset` and the IB transport's
//!   `ib_conn_down` grew, and node2 connected more than once;
//!
//! and printed: the counter deltas of both sides (`conn_reset`,
//! `recv_drop_old_seq` = duplicates dropped by the core, flushed work
//! requests).
//!
//! Run: `cargo test --release -p rds-sock --features ib --test
//! ib_vm_disconnect -- --nocapture`. When the rig cannot start the test
//! prints one line starting with `SKIP:` and passes.
#![cfg(feature = "ib")]

mod common;

use common::{field, find_rig, node_lines, rig_ready, workspace_root};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

const N: usize = 3000;
const GAP_US: u64 = 3000;
const KILLS: usize = 3;

fn num(line: &str, key: &str) -> u64 {
    field(line, key).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number after {key:?} in {line:?}"))
}

/// The counter delta `name` printed by `node`.
fn delta(out: &str, node: u8, name: &str) -> u64 {
    let l = node_lines(out, node, &format!("DELTA {name} "));
    assert_eq!(l.len(), 1, "node{node}: counter {name}: {l:?}");
    l[0].trim().parse().unwrap_or_else(|_| panic!("counter {name}: {}", l[0]))
}

#[test]
fn ib_side_channel_killed_mid_stream_nothing_lost_or_duplicated() {
    let rig = match find_rig().and_then(|r| rig_ready().map(|()| r)) {
        Ok(r) => r,
        Err(why) => {
            println!("SKIP: rds-sock IB forced-disconnect test in the VM rig not run: {why}");
            return;
        }
    };
    let root = workspace_root();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_rds-ib-peer"));
    let mut cmd = Command::new(rig.join("vmrig"));
    cmd.current_dir(&root).args(["run", "-n", "2", "-t", "400"]);
    if !bin.starts_with(&root) {
        cmd.arg("-s").arg(bin.parent().unwrap());
    }
    cmd.arg("-e").arg(format!("PEER_BIN={}", bin.display()));
    cmd.arg("-e").arg(format!("N={N}"));
    cmd.arg("-e").arg(format!("GAP_US={GAP_US}"));
    cmd.arg("-e").arg(format!("KILLS={KILLS}"));
    cmd.args(["--", "sh"]).arg(root.join("crates/rds-sock/tests/vm/ib_disconnect_scenario.sh"));
    let t0 = Instant::now();
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            println!("SKIP: rds-sock IB forced-disconnect test in the VM rig not run: cannot run vmrig: {e}");
            return;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}\n{stderr}\nvmrig exit {:?} after {:.1} s", out.status.code(), t0.elapsed().as_secs_f64());
    if !stdout.contains("[node1]") && !stdout.contains("[node2]") {
        println!("SKIP: rds-sock IB forced-disconnect test in the VM rig not run: the guests did not come up");
        return;
    }
    for node in [1, 2] {
        assert_eq!(node_lines(&stdout, node, "RDMA_UCM "), vec!["absent"], "node{node}: no RDMA CM in the kernel");
        let b = node_lines(&stdout, node, "BOUND ");
        assert_eq!(b.len(), 1, "node{node} bound: {b:?}");
        assert_eq!(field(b[0], "transport"), Some("0"), "IB: {}", b[0]);
    }

    // The kills happened, each aborting at least one socket.
    let kills = node_lines(&stdout, 2, "KILL ");
    println!("kills: {kills:?}");
    let done: Vec<u64> = kills.iter().filter_map(|k| field(k, "killed").and_then(|n| n.parse().ok())).collect();
    assert!(!done.is_empty(), "no kill happened during the stream: {kills:?}");
    assert!(done.iter().all(|&n| n >= 1), "a kill found no side channel socket: {kills:?}");

    // node1: every datagram exactly once, in order, exact content.
    let rx = node_lines(&stdout, 1, "RXSTAT ");
    assert_eq!(rx.len(), 1, "node1: {rx:?}");
    println!("node1: {}", rx[0]);
    assert_eq!(num(rx[0], "received"), N as u64, "received: {}", rx[0]);
    assert_eq!(num(rx[0], "inorder"), N as u64, "in order: {}", rx[0]);
    assert_eq!(num(rx[0], "dup"), 0, "duplicated: {}", rx[0]);
    assert_eq!(num(rx[0], "lost"), 0, "lost: {}", rx[0]);
    assert_eq!(num(rx[0], "bad"), 0, "bad: {}", rx[0]);
    assert!(node_lines(&stdout, 1, "ANOMALY ").is_empty(), "node1 anomalies");
    assert_eq!(node_lines(&stdout, 1, "RESULT ok").len(), 1, "node1 result");

    // node2: all sent and acked.
    let sent = node_lines(&stdout, 2, "SENT ");
    assert_eq!(sent.len(), 1, "node2: {sent:?}");
    assert_eq!(sent[0].split_whitespace().next(), Some(N.to_string().as_str()), "node2 sent: {}", sent[0]);
    assert_eq!(node_lines(&stdout, 2, &format!("ACKED {N} ")).len(), 1, "node2: not all acked");
    assert_eq!(node_lines(&stdout, 2, "RESULT ok").len(), 1, "node2 result");

    // The path really went down and came back.
    for node in [1, 2] {
        let names = ["conn_reset", "recv_drop_old_seq", "ib_connect", "ib_connect_failed", "ib_accepted", "ib_accept_refused", "ib_conn_down", "ib_tx_flushed", "ib_rx_flushed"];
        let d: Vec<String> = names.iter().map(|n| format!("{n} {}", delta(&stdout, node, n))).collect();
        println!("node{node} deltas: {}", d.join(", "));
        assert_eq!(delta(&stdout, node, "ib_side_auth_failed"), 0, "node{node}");
    }
    let resets = delta(&stdout, 2, "conn_reset");
    assert!(resets >= 1, "node2 saw no reconnect (conn_reset 0) although {} kills aborted sockets", done.len());
    assert!(delta(&stdout, 2, "ib_conn_down") >= 1, "node2: the IB connection never went down");
    // Connections set up (both sides try after a drop; the loser of a
    // race fails or is refused).
    let ups = delta(&stdout, 2, "ib_connect") - delta(&stdout, 2, "ib_connect_failed") + delta(&stdout, 2, "ib_accepted");
    assert!(ups >= 2, "node2 set up {ups} IB connections: no reconnect");
    println!("RESULT: {N} datagrams, {} kills, node2 conn_reset {resets}, {ups} IB connections", done.len());
    assert!(out.status.success(), "vmrig exit {:?}", out.status.code());
}
