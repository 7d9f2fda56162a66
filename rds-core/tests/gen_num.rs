//! Generation numbers (`rds_conn_peer_gen_update`): with
//! HandshakeExts::Full the probe and pong carry GEN_NUM, a peer restart is
//! detected, sequence spaces restart and messages the old instance may have
//! received are flushed instead of resent.

use rds_core::wire::{Ext, Kind};
use rds_core::*;
use rds_testkit::net::{Net, config, sa};

fn full(i: usize, gen_num: u32) -> NodeConfig {
    NodeConfig { handshake_exts: HandshakeExts::Full, gen_num, ..config(i) }
}

#[test]
fn full_handshake_carries_npaths_and_gen_num() {
    let mut net = Net::with_configs(vec![full(0, 0x0a0b_0c0d), full(1, 77)], TransportKind::Tcp);
    let a = net.bound(0, 5000);
    net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    let probe = net.sent_by(0).into_iter().find(|m| m.header.kind() == Kind::ProbePing).unwrap();
    assert_eq!(probe.header.exthdr, [5, 0, 8, 6, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 0, 0, 0, 0, 0]);
    let pong = net.sent_by(1).into_iter().find(|m| m.header.kind() == Kind::ProbePong).unwrap();
    assert_eq!(pong.header.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8), Ext::GenNum(77)]);
    // Data messages carry no extension headers.
    assert!(net.data_sent_by(0).iter().all(|m| m.header.exthdr == [0; 16]));
    assert_eq!(net.nodes[0].counters().peer_restart, 0);
}

/// Sets up node 0 -> node 1 with 8 paths, then leaves two messages of a
/// lane-1 socket delivered to node 1 but unacked.
fn two_unacked_on_lane_1(cfg0: NodeConfig, cfg1: NodeConfig) -> (Net, SockId, SockId) {
    let mut net = Net::with_configs(vec![cfg0, cfg1], TransportKind::Tcp);
    let a0 = net.bound(0, 5000); // lane 0
    let a = net.bound(0, 5001); // lane 1
    let b = net.bound(1, 4000);
    net.send(0, a0, sa(2, 4000), b"hello").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"hello".to_vec()]);
    net.hold_acks = true;
    net.send(0, a, sa(2, 4000), b"old-1").unwrap();
    net.send(0, a, sa(2, 4000), b"old-2").unwrap();
    net.run();
    assert!(net.lanes_of(0, 5001).iter().all(|&l| l == 1));
    assert_eq!(net.drain_payloads(1, b), [b"old-1".to_vec(), b"old-2".to_vec()]);
    assert_eq!(net.nodes[0].snd_bytes(a), 10);
    net.hold_acks = false;
    (net, a0, a)
}

#[test]
fn peer_restart_is_detected_and_old_messages_are_flushed() {
    let (mut net, a0, a) = two_unacked_on_lane_1(full(0, 100), full(1, 101));
    // Node 1 restarts as a new instance (generation 201).
    net.restart(1, full(1, 201));
    let b = net.bound(1, 4000);
    let mark = net.wire.len();
    net.advance(0);
    net.run();
    let c = net.nodes[0].counters();
    assert_eq!(c.peer_restart, 1);
    assert_eq!(c.send_drop_flushed, 2);
    assert_eq!(net.nodes[0].flushed(a), 2);
    assert_eq!(net.nodes[0].flushed(a0), 0);
    assert_eq!(net.nodes[0].snd_bytes(a), 0, "flushed messages release their bytes");
    assert_eq!(net.nodes[0].pending_messages(a), 0);
    // Nothing of the old instance's traffic reached the new one.
    assert!(!net.wire[mark..].iter().any(|m| m.header.sport == 5001));
    assert!(net.nodes[1].recv(b, false).is_err());
    // New messages are delivered. Unlike the kernel, the sequence numbers
    // of lane 1 keep growing (old-1 and old-2 had 1 and 2): acks name
    // messages by sequence, so a path's numbering never goes back.
    net.send(0, a, sa(2, 4000), b"new-1").unwrap();
    net.send(0, a, sa(2, 4000), b"new-2").unwrap();
    net.send(0, a0, sa(2, 4000), b"new-0").unwrap();
    net.run();
    let lane1: Vec<(Vec<u8>, u64)> = net.wire[mark..]
        .iter()
        .filter(|m| m.from == 0 && m.header.sport == 5001)
        .map(|m| (m.payload.to_vec(), m.header.sequence))
        .collect();
    assert_eq!(lane1, [(b"new-1".to_vec(), 3), (b"new-2".to_vec(), 4)]);
    let mut got = net.drain_payloads(1, b);
    got.sort();
    assert_eq!(got, [b"new-0".to_vec(), b"new-1".to_vec(), b"new-2".to_vec()]);
    assert_eq!(net.nodes[1].counters().recv_drop_old_seq, 0);
    // The new instance learned our generation and saw no restart.
    assert_eq!(net.nodes[1].counters().peer_restart, 0);
}

#[test]
fn reconnect_to_the_same_instance_flushes_nothing() {
    let (mut net, _a0, a) = two_unacked_on_lane_1(full(0, 100), full(1, 101));
    net.cut_all(0);
    net.advance(0);
    net.run();
    let c = net.nodes[0].counters();
    assert_eq!(c.peer_restart, 0);
    assert_eq!(c.send_drop_flushed, 0);
    assert_eq!(net.nodes[0].flushed(a), 0);
    // Both were resent with RETRANSMITTED and dropped as duplicates.
    assert_eq!(net.nodes[1].counters().recv_drop_old_seq, 2);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
}

#[test]
fn mainline_handshake_cannot_detect_a_restart() {
    // The 6.1 kernel's wire: NPATHS only. The sender cannot tell that its
    // peer restarted and resends to the new instance; the new instance
    // drops them: retransmissions that come first on the first connection
    // it ever had on the path were sent to its previous instance (a 6.1
    // kernel would deliver them).
    let (mut net, _a0, a) = two_unacked_on_lane_1(config(0), config(1));
    net.restart(1, config(1));
    let b = net.bound(1, 4000);
    net.advance(0);
    net.run();
    assert_eq!(net.nodes[0].counters().peer_restart, 0);
    assert_eq!(net.nodes[0].flushed(a), 0);
    let resent: Vec<(Vec<u8>, u8)> =
        net.data_sent_by(0).iter().rev().take(2).map(|m| (m.payload.to_vec(), m.header.flags)).collect();
    assert_eq!(
        resent,
        [(b"old-2".to_vec(), wire::flags::RETRANSMITTED), (b"old-1".to_vec(), wire::flags::RETRANSMITTED)]
    );
    assert!(net.drain_payloads(1, b).is_empty());
    assert_eq!(net.nodes[1].counters().recv_drop_stale, 2);
    assert_eq!(net.nodes[0].snd_bytes(a), 0, "the new instance's TCP acked them");
    // The new instance gets what is sent to it.
    net.send(0, a, sa(2, 4000), b"new").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"new".to_vec()]);
}
