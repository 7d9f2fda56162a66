//! Bounds against hostile or departed peers: one pending pong per (path,
//! port), eight per path to probe pings, the peer limit, no reconnecting to a peer with nothing queued,
//! and the idle collection of connections (with the sequence state it
//! must keep so that nothing is lost or duplicated when the peer returns).

use std::time::Duration;

use rds_core::wire::{Ext, Header, PROBE_PORT};
use rds_core::*;
use rds_testkit::net::{Net, config, ip, make_node, sa};
use std::time::Instant;

fn run_timers(net: &mut Net, for_ms: u64) {
    let end = net.now + Duration::from_millis(for_ms);
    for _ in 0..100_000 {
        let t = net.nodes.iter_mut().filter_map(|n| n.poll_timeout()).min();
        match t {
            Some(t) if t <= end => {
                net.now = net.now.max(t);
                net.advance(0);
                net.run();
            }
            _ => break,
        }
    }
    net.now = end;
    net.advance(0);
    net.run();
}

/// Probe pings get a pong each (their sender counts them to learn what we
/// read, `rds_core::lane0`), but a flood of them against a window that
/// never opens queues at most `PROBE_PONGS_QUEUED` on the path; the rest
/// are answered by those (`send_pong_coalesced`).
#[test]
fn a_probe_ping_flood_queues_at_most_eight_pongs() {
    let mut n = make_node(config(1), ip(2), TransportKind::Tcp);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    driver::outputs(&mut n);
    for seq in 1..=1000u64 {
        let mut h = Header::data(PROBE_PORT, 0, 0);
        h.sequence = seq;
        h.push_extension(Ext::Npaths(8)).unwrap();
        let ping = RxMessage::new(h, Payload::empty());
        assert_eq!(n.received(p0.id, p0.inst, ping), RecvOutcome::Ping);
    }
    let pongs = n.info_messages(Queue::Send).iter().filter(|m| (m.lport, m.fport) == (0, PROBE_PORT)).count();
    assert_eq!(pongs, mprds::PROBE_PONGS_QUEUED);
    assert_eq!(n.counters().recv_ping, 1000);
    assert_eq!(n.counters().send_pong_coalesced, 1000 - mprds::PROBE_PONGS_QUEUED as u64);
}

#[test]
fn a_ping_flood_against_a_closed_window_queues_one_pong_per_port() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let p1 = net.bound(1, 4000);
    let p2 = net.bound(1, 4008);
    // Both send before the path count is known: both keep their ports'
    // lane, 0 (`rds_core::mprds`, "Lanes"), so their pings share path 0.
    net.send(1, p1, sa(1, 5000), b"hello").unwrap();
    net.send(1, p2, sa(1, 5000), b"hello2").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(0, a), [b"hello".to_vec(), b"hello2".to_vec()]);
    // Node 0 cannot transmit on path 0 (its peer's window is closed).
    net.frozen.insert((0, 0));
    let pings = net.nodes[0].counters().recv_ping;
    for _ in 0..1000 {
        net.send(1, p1, sa(1, 0), b"").unwrap();
        net.send(1, p2, sa(1, 0), b"").unwrap();
    }
    net.run();
    let pongs: Vec<(u16, u16)> = net.nodes[0].info_messages(Queue::Send).iter().map(|m| (m.lport, m.fport)).collect();
    assert_eq!(pongs, [(0, 4000), (0, 4008)], "one pending pong per source port");
    assert_eq!(net.nodes[0].counters().recv_ping - pings, 2000);
    assert_eq!(net.nodes[0].counters().send_pong_coalesced, 1998);
    // The window opens: both pongs go out, and a later ping gets its own.
    let mark = net.wire.len();
    net.thaw(0, 0);
    net.send(1, p1, sa(1, 0), b"").unwrap();
    net.run();
    let sent: Vec<u16> =
        net.wire[mark..].iter().filter(|w| w.from == 0 && w.header.sport == 0).map(|w| w.header.dport).collect();
    assert_eq!(sent, [4000, 4008, 4000]);
}

#[test]
fn no_reconnect_to_an_unreachable_peer_with_nothing_queued() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"x".to_vec()]);
    // The peer goes away for good.
    net.refuse.insert(1);
    net.cut_all(0);
    run_timers(&mut net, 30_000);
    let attempts = net.connects.iter().filter(|c| c.0 == 0 && c.1.id.index == 0).count();
    // The connects of the cut itself (paths still up when path 0 went
    // down), then nothing: before, one every second for ever (about 40).
    assert!(attempts <= 3, "{attempts} connects of path 0 in 30 s");
    let late = net.connects.iter().filter(|c| c.2 > net.now - Duration::from_secs(25)).count();
    assert_eq!(late, 0, "nothing after the first seconds");
}

#[test]
fn the_peer_limit_refuses_new_peers_and_counts_them() {
    let mut cfgs: Vec<NodeConfig> = (0..4).map(config).collect();
    cfgs[3].max_peers = 2;
    let mut net = Net::with_configs(cfgs, TransportKind::Tcp);
    let srv = net.bound(3, 4000);
    let socks: Vec<SockId> = (0..3).map(|i| net.bound(i, 5000)).collect();
    net.send(0, socks[0], sa(4, 4000), b"from 0").unwrap();
    net.send(1, socks[1], sa(4, 4000), b"from 1").unwrap();
    net.run();
    net.send(2, socks[2], sa(4, 4000), b"from 2").unwrap();
    net.run();
    let got: Vec<Vec<u8>> = net.drain_payloads(3, srv);
    assert_eq!(got, [b"from 0".to_vec(), b"from 1".to_vec()]);
    assert_eq!(net.nodes[3].conn_count(), 2);
    assert!(net.nodes[3].counters().conn_refused_peer_limit >= 1);
    assert_eq!(net.nodes[3].counters().conn_evicted_silent, 0, "both peers spoke: none evictable");
}

/// Node 1 (the larger address) sent two messages node 0 delivered but
/// whose acks node 1 never saw; then the nodes lose each other for longer
/// than node 0's idle collection. Node 0 collects the connection; when
/// node 1 is back it retransmits both, and node 0 must drop them (it
/// remembers its receive sequence), and a third that was lost on the wire,
/// which node 0 must take (without the memory, the stale rule for a
/// path's first connection drops it: lost); node 0's own numbering keeps growing
/// (node 1 still expects numbers above what it received).
#[test]
fn a_collected_peer_returns_and_nothing_is_lost_or_duplicated() {
    let mut cfgs: Vec<NodeConfig> = (0..2).map(config).collect();
    for c in cfgs.iter_mut() {
        c.conn_idle_gc = Some(Duration::from_secs(5));
        c.handshake_exts = HandshakeExts::Full;
    }
    let mut net = Net::with_configs(cfgs, TransportKind::Tcp);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"x1").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"x1".to_vec()]);
    let tx_before = net.nodes[0].info_connections()[0].paths[0].next_tx_seq;
    net.hold_acks = true;
    net.send(1, b, sa(1, 5000), b"a").unwrap();
    net.send(1, b, sa(1, 5000), b"b").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(0, a), [b"a".to_vec(), b"b".to_vec()]);
    // A third goes on the wire and is lost there (the connection dies).
    net.frozen.insert((1, 0));
    net.send(1, b, sa(1, 5000), b"lost").unwrap();
    net.run();
    let p1 = net.path(1, 0, 0);
    let inst = net.links[&(1, p1)].inst;
    let mut out = Vec::new();
    net.nodes[1].pull(p1, inst, 1 << 20, &mut out);
    assert_eq!(out.iter().map(|m| m.payload.to_vec()).collect::<Vec<_>>(), [b"lost".to_vec()]);
    net.frozen.clear();
    net.frozen_kicks.clear();
    net.pending_acks.clear();
    net.hold_acks = false;
    // Both unreachable from each other for 20 s.
    net.refuse.insert(0);
    net.refuse.insert(1);
    net.cut_all(0);
    run_timers(&mut net, 20_000);
    assert_eq!(net.nodes[0].counters().conn_collected, 1);
    assert_eq!(net.nodes[0].conn_count(), 0);
    assert_eq!(net.nodes[1].conn_count(), 1, "node 1 still has messages for node 0");
    // Back: node 1 pokes, node 0 connects; the retransmissions are
    // recognised as such and dropped.
    net.refuse.clear();
    run_timers(&mut net, 5_000);
    net.send(1, b, sa(1, 5000), b"c").unwrap();
    net.send(0, a, sa(2, 4000), b"x2").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(0, a), [b"lost".to_vec(), b"c".to_vec()], "a and b once only, lost not lost");
    assert_eq!(net.drain_payloads(1, b), [b"x2".to_vec()]);
    assert_eq!(net.nodes[0].counters().recv_drop_old_seq, 2);
    let tx_after = net.nodes[0].info_connections()[0].paths[0].next_tx_seq;
    assert!(tx_after > tx_before, "numbering continues: {tx_before} -> {tx_after}");
}

/// At the peer limit, a new peer evicts the oldest peer that never sent a
/// message (a silent connection), which is collected once down; a peer
/// that spoke is never evicted.
#[test]
fn the_peer_limit_evicts_the_oldest_silent_peer() {
    use std::net::{IpAddr, Ipv4Addr};
    let mut cfgs: Vec<NodeConfig> = (0..4).map(config).collect();
    cfgs[3].max_peers = 3;
    let mut net = Net::with_configs(cfgs, TransportKind::Tcp);
    let srv = net.bound(3, 4000);
    let node = rds_testkit::net::ip(4);
    // A peer that speaks, then two raw connections that never send.
    let a = net.bound(0, 5000);
    net.send(0, a, sa(4, 4000), b"spoke").unwrap();
    net.run();
    let silent: Vec<PathInfo> = [1u8, 2]
        .iter()
        .map(|k| {
            match net.nodes[3].accept(
                TransportKind::Tcp,
                node,
                IpAddr::V4(Ipv4Addr::new(126, 0, 0, *k)),
                40000,
                Instant::now(),
            ) {
                Accept::Path(info) => info,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    net.run();
    assert_eq!(net.nodes[3].conn_count(), 3);
    // A new peer: the oldest silent one goes (its path is shut down).
    let b = net.bound(1, 5000);
    let mark = net.shutdowns.len();
    net.send(1, b, sa(4, 4000), b"new").unwrap();
    net.run();
    assert_eq!(net.nodes[3].counters().conn_evicted_silent, 1);
    assert_eq!(net.nodes[3].counters().conn_refused_peer_limit, 0);
    let shut: Vec<PathId> = net.shutdowns[mark..].iter().filter(|s| s.0 == 3).map(|s| s.1.id).collect();
    assert_eq!(shut, [silent[0].id]);
    let now = net.now;
    net.nodes[3].path_down(silent[0].id, silent[0].inst, DownReason::ShutdownDone, now);
    net.run();
    assert_eq!(net.nodes[3].counters().conn_collected, 1, "collected at once, not after the idle time");
    assert_eq!(net.nodes[3].conn_count(), 3);
    assert_eq!(net.drain_payloads(3, srv), [b"spoke".to_vec(), b"new".to_vec()]);
    // Full again, and only peers that spoke or the remaining silent one:
    // the next new peer evicts the second silent one, the one after that
    // is refused.
    let c = net.bound(2, 5000);
    net.send(2, c, sa(4, 4000), b"third").unwrap();
    net.run();
    assert_eq!(net.nodes[3].counters().conn_evicted_silent, 2);
    let raw =
        net.nodes[3].accept(TransportKind::Tcp, node, IpAddr::V4(Ipv4Addr::new(126, 0, 0, 3)), 40000, Instant::now());
    assert_eq!(raw, Accept::Reject);
    assert_eq!(net.nodes[3].counters().conn_refused_peer_limit, 1);
}
