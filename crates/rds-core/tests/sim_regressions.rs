//! Regressions found by the fault simulator (`crates/tests/src/sim`,
//! `rds-sim --replay SEED -v` shows the original failure). Each test
//! rebuilds the failing interleaving by hand with the in-memory driver.

mod common;

use common::{config, sa, Net};
use rds_core::{HandshakeExts, NodeConfig, TransportKind};

/// rds-sim seed 20: a socket's message waiting on its lane (path 1) when
/// every path went down was overtaken by the socket's next message, which
/// went out on path 0 while the path count was being negotiated again.
#[test]
fn messages_keep_their_lane_while_the_path_count_is_renegotiated() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5001); // lane 1 of 8
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"hello").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"hello".to_vec()]);
    // m1 waits on path 1, which does not transmit.
    net.frozen.insert((0, 1));
    net.send(0, a, sa(2, 4000), b"m1").unwrap();
    net.run();
    // Every connection breaks: the path count is negotiated again.
    net.cut_all(0);
    net.frozen.remove(&(0, 1));
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    net.advance(0);
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"m1".to_vec(), b"m2".to_vec()]);
    let lanes: Vec<u8> = net.data_sent_by(0).iter().filter(|m| m.header.sport == 5001).map(|m| m.path.index).collect();
    assert_eq!(lanes, [0, 1, 1], "hello before the handshake on path 0, then m1 and m2 on path 1");
}

/// rds-sim seed 15: when a new generation number arrived on a live path,
/// its numbering restarted at 1 while messages sent to the new instance
/// were still unacked: the retransmit queue held 5, 6 then 1, and the
/// transport, which reports the last sequence number its peer's TCP acked
/// in stream order, reported 1, which released nothing, ever.
#[test]
fn a_peer_restart_never_renumbers_a_live_path() {
    let full = |i: usize| NodeConfig { handshake_exts: HandshakeExts::Full, ..config(i) };
    let mut net = Net::with_configs(vec![full(0), full(1)], TransportKind::Tcp);
    let a = net.bound(0, 5000); // lane 0
    net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"hello").unwrap();
    net.run();
    // Node 1 restarts; node 0 reconnects to the new instance, whose map and
    // probe (announcing the new generation) are held back for now.
    net.restart(1, NodeConfig { gen_num: 999, ..full(1) });
    let b = net.bound(1, 4000);
    net.frozen.insert((1, 0));
    net.hold_acks = true;
    net.advance(0);
    net.run();
    net.send(0, a, sa(2, 4000), b"m1").unwrap();
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    net.run();
    net.thaw(1, 0);
    net.run();
    assert_eq!(net.nodes[0].counters().peer_restart, 1);
    net.send(0, a, sa(2, 4000), b"m3").unwrap();
    net.run();
    let seqs: Vec<u64> = net.data_sent_by(0).iter().filter(|m| m.payload.starts_with(b"m")).map(|m| m.header.sequence).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "sequence numbers of m1, m2, m3 grow: {seqs:?}");
    // Node 0's transport reports only the last of its messages the peer acked.
    let last = net.pending_acks.iter().rev().find(|a| a.0 == 0).copied().unwrap();
    net.pending_acks.retain(|a| a.0 != 0);
    net.pending_acks.push(last);
    net.hold_acks = false;
    net.flush_acks();
    assert_eq!(net.nodes[0].pending_messages(a), 0);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    assert_eq!(net.drain_payloads(1, b), [b"m1".to_vec(), b"m2".to_vec(), b"m3".to_vec()]);
}
