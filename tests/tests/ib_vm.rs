//! Our engine over RDS-IB (feature `ib`) in the VM rig (`/work/shared/vmrig`:
//! two Debian 12 guests, kernel 6.1, Soft-RoCE over their link).
//!
//! One boot runs `tests/vm/ib_scenario.sh`:
//!
//! * phase A: our engine to our engine (`rds-ib-peer`, SO_RDS_TRANSPORT =
//!   RDS_TRANS_IB): 0 B, 1 B, 4 KiB, 64 KiB and 1 MiB from node2 to node1,
//!   then the same back, each checked byte by byte, in order, all acked;
//! * phase B: our engine (node2) to the kernel's `rds_rdma` (node1, AF_RDS
//!   sockets through `tests/vm/kernel_side.py`): the same sizes to
//!   the kernel, then from the kernel;
//! * phases C and D: the same over IPv6 (the rig's fd99::1 and fd99::2;
//!   RDMA CM port 16385 and the 56-byte private data, as the kernel's
//!   second listener expects);
//! * credit flow control: on between our engines (both grant and receive
//!   credit updates), off with the kernel (it advertises 0 credits);
//! * phase G: a connect request that never completes (no QP behind it)
//!   does not hold up an honest peer's connection to the same listener,
//!   and expires after 5 s (`ib_accept_establish_failed`);
//! * phases E and F, receive flow control (`RdsTransport::rx_flow` over
//!   IB): a receiver with a 1 MiB node budget reads nothing for 4 s while
//!   1,500 datagrams (about 25 MB) are streamed at it without a gap, by
//!   our engine (E, credit flow control: the sender runs out of credits)
//!   and by the kernel (F, no credit flow control: RNR, retried without
//!   end). Meanwhile the path is paused, the connection holds at most one
//!   receive ring (`ib_rx_held_peak`), stays up, and the receiver has taken
//!   far fewer than all; then every datagram is read exactly once, in
//!   order, byte for byte.
//!
//! Run: `cargo test --release -p rds-tests --features ib --test ib_vm`.
//! When the rig cannot start the test prints one line starting with
//! `SKIP:` and passes.
#![cfg(feature = "ib")]

mod ib_vm_common;

use ib_vm_common::{SIZES, boot, check_rx, ctr, field, node_lines, sizes_env, workspace_root};
use std::path::Path;

#[test]
fn engine_over_ib_with_itself_and_with_kernel_rds_rdma() {
    let root = workspace_root();
    let env = [
        ("KSIDE", root.join("tests/vm/kernel_side.py").display().to_string()),
        ("KPEER", env!("CARGO_BIN_EXE_rds-kernel-peer").to_string()),
        ("SIZES", sizes_env()),
    ];
    let peer = Path::new(env!("CARGO_BIN_EXE_rds-ib-peer"));
    let Some((stdout, out)) = boot("rds-sock over IB", "ib_scenario.sh", peer, &env, 480) else { return };

    // Phase A: ours with ours; SO_RDS_TRANSPORT reads back IB (0).
    for node in [1, 2] {
        let b = node_lines(&stdout, node, "A BOUND ");
        assert_eq!(b.len(), 1, "node{node} bound: {b:?}");
        assert_eq!(field(b[0], "transport"), Some("0"), "IB: {}", b[0]);
    }
    check_rx(&node_lines(&stdout, 1, "A RX "), "10.99.0.2:5000", "phase A, node1");
    check_rx(&node_lines(&stdout, 2, "A RX "), "10.99.0.1:4000", "phase A, node2");
    for node in [1, 2] {
        assert_eq!(node_lines(&stdout, node, "A TX ").len(), SIZES.len(), "node{node} sent");
        assert_eq!(node_lines(&stdout, node, "A ACKED ").len(), 1, "node{node}: all acked");
        assert_eq!(node_lines(&stdout, node, "A RESULT ok").len(), 1, "node{node} phase A");
    }

    // Phase C: ours with ours over IPv6 (RDMA CM port 16385, 56-byte
    // private data).
    for node in [1, 2] {
        let b = node_lines(&stdout, node, "C BOUND ");
        assert_eq!(b.len(), 1, "node{node} bound over IPv6: {b:?}");
        assert_eq!(field(b[0], "transport"), Some("0"), "IB: {}", b[0]);
    }
    check_rx(&node_lines(&stdout, 1, "C RX "), "[fd99::2]:5100", "phase C, node1");
    check_rx(&node_lines(&stdout, 2, "C RX "), "[fd99::1]:4100", "phase C, node2");
    for node in [1, 2] {
        assert_eq!(node_lines(&stdout, node, "C ACKED ").len(), 1, "node{node}: all acked over IPv6");
        assert_eq!(node_lines(&stdout, node, "C RESULT ok").len(), 1, "node{node} phase C");
    }

    // Phase B: ours with the kernel's rds_rdma.
    let krx = node_lines(&stdout, 1, "B KRX ");
    check_rx(&krx, "10.99.0.2:5001", "phase B, kernel");
    check_rx(&node_lines(&stdout, 2, "B RX "), "10.99.0.1:4000", "phase B, ours");
    assert_eq!(node_lines(&stdout, 2, "B ACKED ").len(), 1, "the kernel acked all");
    assert_eq!(node_lines(&stdout, 2, "B RESULT ok").len(), 1, "phase B, ours");
    assert_eq!(node_lines(&stdout, 1, "B KRESULT ok").len(), 2, "phase B, kernel recv and send");

    // Phase D: ours with the kernel's rds_rdma over IPv6.
    check_rx(&node_lines(&stdout, 1, "D KRX "), "[fd99::2]:5101", "phase D, kernel");
    check_rx(&node_lines(&stdout, 2, "D RX "), "[fd99::1]:4100", "phase D, ours");
    assert_eq!(node_lines(&stdout, 2, "D ACKED ").len(), 1, "the kernel acked all over IPv6");
    assert_eq!(node_lines(&stdout, 2, "D RESULT ok").len(), 1, "phase D, ours");
    assert_eq!(node_lines(&stdout, 1, "D KRESULT ok").len(), 2, "phase D, kernel recv and send");

    // Credit flow control (on by default): our engines grant each other
    // credits and spend them; the kernel advertises 0, so with it ours is
    // off and nothing is granted to us.
    for node in [1, 2] {
        let (tx, rx) =
            (ctr(&stdout, node, "A", "ib_tx_credit_updates"), ctr(&stdout, node, "A", "ib_rx_credit_updates"));
        println!(
            "node{node} phase A: ib_tx_credit_updates {tx} ib_rx_credit_updates {rx} ib_tx_throttle {}",
            ctr(&stdout, node, "A", "ib_tx_throttle")
        );
        assert!(tx > 0 && rx > 0, "node{node}: credits flow between our engines");
    }
    assert_eq!(ctr(&stdout, 2, "B", "ib_rx_credit_updates"), 0, "the kernel grants no credits");
    // Phase G: a connect request that never completes does not hold up
    // an honest peer's connection (the listener used to wait up to 5 s
    // for ESTABLISHED, serving nobody else meanwhile).
    assert_eq!(node_lines(&stdout, 2, "G STALL "), vec!["accepted", "released"], "phase G: the stalled request");
    check_rx(&node_lines(&stdout, 1, "G RX "), "10.99.0.2:5400", "phase G, node1");
    check_rx(&node_lines(&stdout, 2, "G RX "), "10.99.0.1:4400", "phase G, node2");
    let t = node_lines(&stdout, 2, "G ACKTIME ");
    assert_eq!(t.len(), 1, "phase G: {t:?}");
    let secs: f64 = t[0].trim_end_matches(" s").trim().parse().unwrap();
    let failed = ctr(&stdout, 1, "G", "ib_accept_establish_failed");
    println!("phase G: honest peer all acked {secs:.2} s after its first send; ib_accept_establish_failed {failed}");
    assert!(secs < 3.0, "phase G: the honest peer waited {secs} s behind the stalled request");
    assert!(failed >= 1, "phase G: the stalled request expired");
    for node in [1, 2] {
        assert_eq!(node_lines(&stdout, node, "G RESULT ok").len(), if node == 2 { 2 } else { 1 }, "node{node} phase G");
    }

    // Phases E and F: receive flow control over IB.
    for (phase, node) in [("E", 1u8), ("F", 2u8)] {
        let num = |tag: &str, name: &str| -> u64 {
            let l = node_lines(&stdout, node, &format!("{phase} {tag} {name} "));
            assert_eq!(l.len(), 1, "node{node} phase {phase}: {tag} {name}: {l:?}");
            l[0].trim().parse().unwrap()
        };
        let (pause, paused, peak, down) = (
            num("HOLD", "recv_pause"),
            num("HOLD", "ib_rx_paused"),
            num("HOLD", "ib_rx_held_peak"),
            num("HOLD", "ib_conn_down"),
        );
        let (rx_hold, rx_end) = (num("HOLD", "ib_rx_messages"), num("DELTA", "ib_rx_messages"));
        println!(
            "phase {phase}: while not reading: recv_pause {pause} ib_rx_paused {paused} ib_rx_held_peak {peak} B, \
             {rx_hold} of {rx_end} messages handed up; at the end ib_rx_resumed {}",
            num("DELTA", "ib_rx_resumed")
        );
        assert!(pause >= 1 && paused >= 1, "phase {phase}: the path paused");
        // One receive ring (512 fragments of 4 KiB, 48-byte headers) plus
        // the fragments of a message begun before the pause (64 KiB).
        let ring = 512 * (4096 + 48) + 16 * (4096 + 48);
        assert!(peak > 0 && peak <= ring, "phase {phase}: held {peak} B (at most {ring})");
        assert_eq!(down, 0, "phase {phase}: the paused connection stays up");
        assert!(rx_hold < 1500 / 2, "phase {phase}: {rx_hold} messages went up while paused");
        assert!(num("DELTA", "ib_rx_resumed") >= 1, "phase {phase}: resumed");
        let st = node_lines(&stdout, node, &format!("{phase} RXSTAT "));
        assert_eq!(st, vec!["received 1500 inorder 1500 dup 0 lost 0 bad 0"], "phase {phase}");
        assert_eq!(node_lines(&stdout, node, &format!("{phase} RESULT ok")).len(), 1, "phase {phase}");
    }
    assert_eq!(node_lines(&stdout, 2, "E RESULT ok").len(), 1, "phase E sender: all acked");
    assert_eq!(node_lines(&stdout, 1, "F KSENT 1500 ").len(), 1, "phase F: the kernel sent all");
    assert!(out.status.success(), "vmrig exit {:?}", out.status.code());
}
