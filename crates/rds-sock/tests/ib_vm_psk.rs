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
//!   messages is acked.
//!
//! Run: `cargo test --release -p rds-sock --features ib --test ib_vm_psk`.
//! When the rig cannot start the test prints one line starting with
//! `SKIP:` and passes.
#![cfg(feature = "ib")]

mod common;

use common::{boot, check_rx, ctr, field, node_lines, sizes_env, SIZES};
use std::path::Path;

#[test]
fn engine_over_ib_verbs_only_with_psk() {
    let peer = Path::new(env!("CARGO_BIN_EXE_rds-ib-peer"));
    let env = [("SIZES", sizes_env())];
    let Some((stdout, out)) = boot("rds-sock over IB (verbs-only)", "ib_psk_scenario.sh", peer, &env, 300) else { return };
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
        let (tx, rx) = (ctr(&stdout, node, "A", "ib_tx_credit_updates"), ctr(&stdout, node, "A", "ib_rx_credit_updates"));
        println!("node{node} phase A: ib_tx_credit_updates {tx} ib_rx_credit_updates {rx} ib_tx_throttle {}", ctr(&stdout, node, "A", "ib_tx_throttle"));
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
    assert!(out.status.success(), "vmrig exit {:?}", out.status.code());
}
