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
//! The second test does the same in the RDMA CM setup mode (port 18634,
//! what the kernel's `rds_rdma` speaks; `MODE=cm` of the same scenario),
//! where there is no side channel to kill: the sending guest drops every
//! incoming RoCE v2 packet (UDP 4791, a `tc` ingress filter) mid-stream for
//! at least `CUT_S` seconds and on until one of its RC QPs that were up
//! when the cut began has left RTS (at most 30 s; a cut of a fixed length
//! once broke nothing in CI: the sending QP carried next to no traffic
//! during it). Its RC QP gets no acks and exhausts its retries
//! (IBV_WC_RETRY_EXC_ERR; our QPs use the kernel's retry count, 1, see
//! `rds_ib::verbs::RETRY_COUNT`), its connection goes down, its DREQ
//! (outgoing traffic still passes) takes the receiver's down, and the
//! reconnects fail until the filter is removed. Three phases in one boot,
//! `NC` datagrams each: A our engine to our engine, B our engine to the
//! kernel's rds_rdma (kernel_side.py stream-recv checks every datagram),
//! C the kernel (kernel_side.py stream-send) to our engine. Asserted per
//! phase: every datagram exactly once, in order, exact; our sender had all
//! acked (A, B); the filter dropped packets and a QP left RTS during the
//! cut (`CUTEND ... broke QPN`); our side's `conn_reset` and
//! `ib_conn_down` grew and it had more than one IB connection; and the
//! kernel logged a failed completion ("disconnecting and reconnecting")
//! and connected more than once. The counter deltas are printed.
//!
//! Run: `cargo test --release -p rds-tests --features ib --test
//! ib_vm_disconnect -- --nocapture` (the two tests boot one after the
//! other). When the rig cannot start a test prints one line starting with
//! `SKIP:` and passes.
#![cfg(feature = "ib")]

mod ib_vm_common;

use ib_vm_common::{field, node_lines};
use std::path::Path;
use std::process::Output;

const N: usize = 3000;
const GAP_US: u64 = 3000;
/// The RDMA CM test's pacing: 600 datagrams take at least 4.8 s, the cut
/// starts 1..2 s in (or once a connection is up, if none was by then).
const GAP_US_CM: u64 = 8000;
const KILLS: usize = 3;
/// Datagrams per phase of the RDMA CM test, and how long incoming RoCE v2
/// is dropped.
const NC: usize = 600;
const CUT_S: u64 = 4;
/// The counters whose deltas show that a connection really went down and
/// came back (printed per node and phase).
const DOWN_AND_BACK: [&str; 9] = [
    "conn_reset",
    "recv_drop_old_seq",
    "ib_connect",
    "ib_connect_failed",
    "ib_accepted",
    "ib_accept_refused",
    "ib_conn_down",
    "ib_tx_flushed",
    "ib_rx_flushed",
];

/// Runs the scenario with `env`; `None` (after printing `SKIP: ...`) when
/// the rig cannot start.
fn boot(what: &str, env: &[(&str, String)], timeout_s: u32) -> Option<(String, Output)> {
    let peer = Path::new(env!("CARGO_BIN_EXE_rds-ib-peer"));
    ib_vm_common::boot(what, "ib_disconnect_scenario.sh", peer, env, timeout_s)
}

fn num(line: &str, key: &str) -> u64 {
    field(line, key).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number after {key:?} in {line:?}"))
}

/// The counter delta `name` printed by `node`.
fn delta(out: &str, node: u8, name: &str) -> u64 {
    delta_in(out, node, "", name)
}

/// The counter delta `name` printed by `node` on a line starting with
/// `prefix` (a phase, "A " ...).
fn delta_in(out: &str, node: u8, prefix: &str, name: &str) -> u64 {
    let l = node_lines(out, node, &format!("{prefix}DELTA {name} "));
    assert_eq!(l.len(), 1, "node{node}: {prefix}counter {name}: {l:?}");
    l[0].trim().parse().unwrap_or_else(|_| panic!("counter {name}: {}", l[0]))
}

/// The `RXSTAT` / `KRXSTAT` line of a receiver: all `NC` exactly once.
fn check_rxstat(line: &str, what: &str) {
    println!("{what}: {line}");
    assert_eq!(num(line, "received"), NC as u64, "{what} received: {line}");
    assert_eq!(num(line, "inorder"), NC as u64, "{what} in order: {line}");
    assert_eq!(num(line, "dup"), 0, "{what} duplicated: {line}");
    assert_eq!(num(line, "lost"), 0, "{what} lost: {line}");
    assert_eq!(num(line, "bad"), 0, "{what} bad: {line}");
}

#[test]
fn ib_side_channel_killed_mid_stream_nothing_lost_or_duplicated() {
    let env = [("N", N.to_string()), ("GAP_US", GAP_US.to_string()), ("KILLS", KILLS.to_string())];
    let Some((stdout, out)) = boot("rds-sock IB forced-disconnect test", &env, 400) else { return };
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
        let d: Vec<String> = DOWN_AND_BACK.iter().map(|n| format!("{n} {}", delta(&stdout, node, n))).collect();
        println!("node{node} deltas: {}", d.join(", "));
        assert_eq!(delta(&stdout, node, "ib_side_auth_failed"), 0, "node{node}");
    }
    let resets = delta(&stdout, 2, "conn_reset");
    assert!(resets >= 1, "node2 saw no reconnect (conn_reset 0) although {} kills aborted sockets", done.len());
    assert!(delta(&stdout, 2, "ib_conn_down") >= 1, "node2: the IB connection never went down");
    // Connections set up (both sides try after a drop; the loser of a
    // race fails or is refused).
    let ups =
        delta(&stdout, 2, "ib_connect") - delta(&stdout, 2, "ib_connect_failed") + delta(&stdout, 2, "ib_accepted");
    assert!(ups >= 2, "node2 set up {ups} IB connections: no reconnect");
    println!("RESULT: {N} datagrams, {} kills, node2 conn_reset {resets}, {ups} IB connections", done.len());
    assert!(out.status.success(), "vmrig exit {:?}", out.status.code());
}

#[test]
fn ib_cm_roce_cut_mid_stream_nothing_lost_or_duplicated() {
    let env = [
        ("MODE", "cm".to_string()),
        ("N", NC.to_string()),
        ("GAP_US", GAP_US_CM.to_string()),
        ("CUT_S", CUT_S.to_string()),
    ];
    let Some((stdout, out)) = boot("rds-sock IB (RDMA CM) forced-disconnect test", &env, 300) else { return };
    let one = |node: u8, prefix: &str| -> String {
        let l = node_lines(&stdout, node, prefix);
        assert_eq!(l.len(), 1, "node{node} {prefix:?}: {l:?}");
        l[0].to_string()
    };
    for (ph, node) in [("A", 1), ("A", 2), ("B", 2), ("C", 2)] {
        assert_eq!(field(&one(node, &format!("{ph} BOUND ")), "transport"), Some("0"), "node{node} phase {ph}: IB");
    }
    for (ph, node) in [("B", 1), ("C", 1)] {
        assert_eq!(field(&one(node, &format!("{ph} KBOUND ")), "transport"), Some("0"), "node1 phase {ph}: kernel IB");
    }
    for node in [1, 2] {
        assert!(node_lines(&stdout, node, "").iter().all(|l| !l.contains(" EXIT ")), "node{node}: a program failed");
        for ph in ["A", "B", "C"] {
            assert!(node_lines(&stdout, node, &format!("{ph} ANOMALY ")).is_empty(), "node{node} phase {ph} anomalies");
            assert!(
                node_lines(&stdout, node, &format!("{ph} KANOMALY ")).is_empty(),
                "node{node} phase {ph} anomalies"
            );
        }
    }

    // The cuts happened during the streams and dropped RoCE v2 packets:
    // on the sender's guest (node2 in A and B, the kernel's node1 in C).
    for (ph, node) in [("A", 2), ("B", 2), ("C", 1)] {
        println!("phase {ph}: {}", one(node, &format!("{ph} CUT ")));
        let end = one(node, &format!("{ph} CUTEND "));
        println!("phase {ph}: {end}");
        assert!(num(&end, "dropped") > 0, "phase {ph}: the filter dropped nothing: {end}");
        let broke = field(&end, "broke").unwrap_or("none");
        assert!(broke.parse::<u32>().is_ok(), "phase {ph}: no RC QP left RTS during the cut: {end}");
    }

    // Every datagram exactly once, in order, exact; senders done.
    check_rxstat(&one(1, "A RXSTAT "), "phase A, our receiver");
    check_rxstat(&one(1, "B KRXSTAT "), "phase B, the kernel's receiver");
    check_rxstat(&one(2, "C RXSTAT "), "phase C, our receiver");
    for ph in ["A", "B"] {
        assert_eq!(node_lines(&stdout, 2, &format!("{ph} ACKED {NC} ")).len(), 1, "phase {ph}: node2 not all acked");
        assert_eq!(node_lines(&stdout, 2, &format!("{ph} RESULT ok")).len(), 1, "phase {ph}: node2 result");
    }
    assert_eq!(node_lines(&stdout, 1, "A RESULT ok").len(), 1, "phase A: node1 result");
    assert_eq!(node_lines(&stdout, 2, "C RESULT ok").len(), 1, "phase C: node2 result");
    assert_eq!(num(&format!("n {}", one(1, "C KSENT ")), "n"), NC as u64, "phase C: the kernel sent all");
    for ph in ["B", "C"] {
        assert_eq!(node_lines(&stdout, 1, &format!("{ph} KRESULT ok")).len(), 1, "phase {ph}: kernel side result");
    }

    // The connections really went down and came back.
    let mut summary = Vec::new();
    for (ph, nodes) in [("A", &[1u8, 2][..]), ("B", &[2][..]), ("C", &[2][..])] {
        for &node in nodes {
            let p = format!("{ph} ");
            let d: Vec<String> =
                DOWN_AND_BACK.iter().map(|n| format!("{n} {}", delta_in(&stdout, node, &p, n))).collect();
            println!("phase {ph} node{node} deltas: {}", d.join(", "));
            let resets = delta_in(&stdout, node, &p, "conn_reset");
            assert!(resets >= 1, "phase {ph} node{node}: no reconnect (conn_reset 0)");
            assert!(
                delta_in(&stdout, node, &p, "ib_conn_down") >= 1,
                "phase {ph} node{node}: the IB connection never went down"
            );
            let ups = delta_in(&stdout, node, &p, "ib_connect") - delta_in(&stdout, node, &p, "ib_connect_failed")
                + delta_in(&stdout, node, &p, "ib_accepted");
            assert!(ups >= 2, "phase {ph} node{node}: {ups} IB connections, no reconnect");
            summary.push(format!("{ph}/node{node} conn_reset {resets} connections {ups}"));
        }
    }
    // The kernel saw its connection fail (phase C: its sends exhausted
    // their retries) and connected again.
    let klog = node_lines(&stdout, 1, "KLOG ");
    let failed: Vec<&&str> = klog.iter().filter(|l| l.contains("disconnecting and reconnecting")).collect();
    let connected = klog.iter().filter(|l| l.contains("conn connected")).count();
    println!("kernel: {} failed completions logged, {connected} connections: {failed:?}", failed.len());
    assert!(!failed.is_empty(), "the kernel logged no failed completion");
    assert!(connected >= 3, "the kernel connected {connected} times");
    println!(
        "RESULT: 3 x {NC} datagrams across RoCE v2 cuts (at least {CUT_S} s, each until a QP gave up), exactly once; {}",
        summary.join("; ")
    );
    assert!(out.status.success(), "vmrig exit {:?}", out.status.code());
}
