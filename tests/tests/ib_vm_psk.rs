//! Our engine over RDS-IB in the verbs-only setup mode (feature `ib`; no
//! RDMA CM: QP number, PSN, GID and MTU over a TCP side channel
//! authenticated with a pre-shared key) in the VM rig (`/work/shared/vmrig`:
//! two Debian 12 guests, kernel 6.1, Soft-RoCE over their link; `rdma_ucm`
//! is not even loaded).
//!
//! One boot runs `tests/vm/ib_psk_scenario.sh`:
//!
//! * phase A: our engine to our engine (`rds-ib-peer`, both with
//!   `RDS_IB_PSK_FILE` naming the same key): 0 B, 1 B, 4 KiB, 64 KiB and
//!   1 MiB from node2 to node1, then the same back, each checked byte by
//!   byte, in order, all acked; each side used the RoCE v2 GID index of its
//!   address (as the rig's `rxe-gid-index` finds it); credit flow control
//!   was negotiated in the side channel's parameters and credits flowed
//!   both ways;
//! * phase B: node1 (a fresh engine with the key) is sent to by a rogue
//!   side channel client (a well-formed CLIENT_PARAMS with a MAC under a
//!   wrong key) and by an engine with the wrong key: node1 closes them,
//!   counts them (`ib_side_auth_failed`, `ib_side_bad_handshake`), creates
//!   no QP (`ib_qp_created` 0) and receives nothing; the wrong-key engine
//!   creates no QP either (it refuses node1's proof first) and none of its
//!   messages is acked;
//! * phase C (item 2 of the hardening issue: the key cannot be bypassed
//!   over TCP): node1 (the key, no `RDS_IB_PSK_TCP`) serves its address
//!   by IB alone: a raw TCP connection to its port 16385 is refused, an
//!   engine sending from a TCP socket gets nothing acked, and node1's IB
//!   socket receives exactly the keyed engine's messages, in order, and
//!   nothing else;
//! * phase D: node1 with `RDS_IB_PSK_TCP=1` serves TCP too: the TCP
//!   socket's messages reach the node (acked by TCP) but not the IB socket
//!   (each counted in `recv_drop_no_sock`); the keyed engine's arrive, and
//!   only they;
//! * phase K: a key file of mode 0644 is refused with an error naming the
//!   file and the mode, and the engine runs without IB.
//!
//! Run: `cargo test --release -p rds-tests --features ib --test ib_vm_psk`.
//! When the rig cannot start the test prints one line starting with
//! `SKIP:` and passes.
#![cfg(feature = "ib")]

mod ib_vm_common;

use ib_vm_common::{SIZES, boot, check_rx, ctr, field, node_lines, sizes_env};
use std::path::Path;

#[test]
fn engine_over_ib_verbs_only_with_psk() {
    let peer = Path::new(env!("CARGO_BIN_EXE_rds-ib-peer"));
    let env = [("SIZES", sizes_env())];
    let Some((stdout, out)) = boot("rds-sock over IB (verbs-only)", "ib_psk_scenario.sh", peer, &env, 420) else {
        return;
    };
    for node in [1, 2] {
        assert_eq!(node_lines(&stdout, node, "RDMA_UCM "), vec!["absent"], "node{node}: no RDMA CM in the kernel");
    }

    // Phase A: ours with ours, same key.
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
        assert!(ctr(&stdout, node, "A", "ib_qp_created") >= 1, "node{node}: a QP");
        assert_eq!(ctr(&stdout, node, "A", "ib_side_auth_failed"), 0, "node{node}");
        // The RoCE v2 GID of the node's address, as the rig finds it.
        let gid = node_lines(&stdout, node, "GID ");
        assert_eq!(gid.len(), 1, "node{node}: {gid:?}");
        let used = node_lines(&stdout, node, "A rds-ib: verbs-only ");
        assert!(!used.is_empty(), "node{node}: no verbs-only connection set up");
        for u in used {
            assert_eq!(field(u, "index"), Some(gid[0].trim()), "node{node}: {u}");
            assert_eq!(field(u, "roce_v2"), Some("true"), "node{node}: {u}");
        }
    }
    // Credit flow control, negotiated in the side channel's parameters:
    // both engines grant credits and get some.
    for node in [1, 2] {
        let (tx, rx) =
            (ctr(&stdout, node, "A", "ib_tx_credit_updates"), ctr(&stdout, node, "A", "ib_rx_credit_updates"));
        println!(
            "node{node} phase A: ib_tx_credit_updates {tx} ib_rx_credit_updates {rx} ib_tx_throttle {}",
            ctr(&stdout, node, "A", "ib_tx_throttle")
        );
        assert!(tx > 0 && rx > 0, "node{node}: credits flow over the verbs-only connection");
    }
    assert_eq!(ctr(&stdout, 2, "A", "ib_connect_failed"), 0);
    assert!(ctr(&stdout, 1, "A", "ib_accepted") >= 1);

    // Phase B: a rogue client and an engine with the wrong key.
    assert_eq!(node_lines(&stdout, 2, "B ROGUE "), vec!["challenged", "closed"], "the rogue client was closed");
    assert_eq!(node_lines(&stdout, 2, "B TX ").len(), SIZES.len(), "the wrong-key engine queued its messages");
    assert_eq!(node_lines(&stdout, 2, "B UNACKED").len(), 1, "none of them acked");
    assert!(node_lines(&stdout, 2, "B ACKED").is_empty());
    assert_eq!(ctr(&stdout, 2, "B", "ib_qp_created"), 0, "the wrong-key engine created no QP");
    assert!(ctr(&stdout, 2, "B", "ib_connect_failed") >= 1);
    assert_eq!(ctr(&stdout, 2, "B", "ib_tx_messages"), 0);
    assert_eq!(node_lines(&stdout, 1, "B NONE").len(), 1, "node1 received nothing");
    assert!(node_lines(&stdout, 1, "B RX ").is_empty(), "node1 received something");
    assert_eq!(ctr(&stdout, 1, "B", "ib_qp_created"), 0, "node1 created a QP for an unauthenticated peer");
    assert_eq!(ctr(&stdout, 1, "B", "ib_accepted"), 0);
    assert_eq!(ctr(&stdout, 1, "B", "ib_rx_messages"), 0);
    assert!(ctr(&stdout, 1, "B", "ib_side_auth_failed") >= 1, "the rogue's bad MAC was counted");
    assert!(ctr(&stdout, 1, "B", "ib_side_bad_handshake") >= 1, "the wrong-key engine's handshakes were counted");
    assert_eq!(node_lines(&stdout, 1, "B RESULT ok").len(), 1);

    // Phase C: no RDS-TCP on node1's IB address.
    assert_eq!(node_lines(&stdout, 2, "CP TCPCONNECT "), vec!["refused"], "raw TCP to node1:16385");
    assert!(node_lines(&stdout, 2, "CP TCPFRAME").is_empty());
    assert_eq!(node_lines(&stdout, 2, "CT TX ").len(), SIZES.len(), "the TCP socket queued its messages");
    assert_eq!(node_lines(&stdout, 2, "CT UNACKED").len(), 1, "none of the TCP socket's messages acked");
    assert!(node_lines(&stdout, 2, "CT ACKED").is_empty());
    assert_eq!(
        node_lines(&stdout, 2, "CI ACKED "),
        vec![SIZES.len().to_string().as_str()],
        "the keyed engine's messages acked"
    );
    check_rx(&node_lines(&stdout, 1, "C RX "), "10.99.0.2:5003", "phase C, node1 (only the keyed engine's messages)");
    assert_eq!(node_lines(&stdout, 1, "C NONE").len(), 1, "node1 received something after the keyed messages");
    assert_eq!(ctr(&stdout, 1, "C", "recv_drop_no_sock"), 0, "nothing reached node1 over TCP");
    assert_eq!(node_lines(&stdout, 1, "C RESULT ok").len(), 1);

    // Phase D: TCP served too (RDS_IB_PSK_TCP=1): it reaches the node, not the IB socket.
    assert_eq!(node_lines(&stdout, 2, "DT TX ").len(), SIZES.len());
    assert_eq!(
        node_lines(&stdout, 2, "DT ACKED "),
        vec![SIZES.len().to_string().as_str()],
        "TCP reached node1 (acked)"
    );
    assert_eq!(node_lines(&stdout, 2, "DI ACKED "), vec![SIZES.len().to_string().as_str()]);
    check_rx(&node_lines(&stdout, 1, "D RX "), "10.99.0.2:5005", "phase D, node1 (only the keyed engine's messages)");
    assert_eq!(node_lines(&stdout, 1, "D NONE").len(), 1);
    assert_eq!(
        ctr(&stdout, 1, "D", "recv_drop_no_sock"),
        SIZES.len() as u64,
        "each TCP message dropped at the IB socket"
    );
    assert_eq!(node_lines(&stdout, 1, "D RESULT ok").len(), 1);

    // Phase K: a key file its group and others may read.
    let k = node_lines(&stdout, 1, "K ");
    assert!(
        k.iter().any(|l| l.contains("RDS_IB_PSK_FILE=/tmp/psk644") && l.contains("mode 0644")),
        "no error naming the file and its mode: {k:?}"
    );
    assert!(
        k.iter().any(|l| l.starts_with("RESULT FAIL SO_RDS_TRANSPORT=IB")),
        "the engine ran IB with that key: {k:?}"
    );
    assert!(out.status.success(), "vmrig exit {:?}", out.status.code());
}
