//! Regressions found by the fault simulator (`tests/src/sim`,
//! `rds-sim --replay SEED -v` shows the original failure). Each test
//! rebuilds the failing interleaving by hand with the in-memory driver.

use std::time::Instant;

use rds_core::DownReason;
use rds_core::driver;
use rds_core::wire::{self, Ext, Header, Kind};
use rds_core::*;
use rds_testkit::net::{Net, config, ip, make_node, sa};

/// `nodes` nodes; node 0's socket at port 5001 (lane 1 of 8) has sent
/// "hello" (on path 0, before the handshake) and "m1" (on its lane) to
/// node 1's socket at port 4000, which read both: (net, sender, receiver).
fn lane_1_in_use(nodes: usize) -> (Net, SockId, SockId) {
    let mut net = Net::new(nodes);
    let a = net.bound(0, 5001);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"hello").unwrap();
    net.run();
    net.send(0, a, sa(2, 4000), b"m1").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"hello".to_vec(), b"m1".to_vec()]);
    assert_eq!(net.lanes_of(0, 5001), [0, 1]);
    (net, a, b)
}

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
    assert_eq!(net.lanes_of(0, 5001), [0, 1, 1], "hello before the handshake on path 0, then m1 and m2 on path 1");
}

/// rds-sim seed 652995: as above, but m1 was acked before every path went
/// down: nothing of the socket waited on path 1 any more, so m2 went on
/// path 0 during the renegotiation. An ack says only that the peer's TCP
/// had m1; the peer, which reads its paths in any order, read m2 on the
/// new path 0 before the old path 1's last bytes. A socket that had a lane
/// keeps it through the renegotiation.
#[test]
fn a_socket_keeps_its_lane_through_a_renegotiation_after_its_messages_were_acked() {
    let (mut net, a, b) = lane_1_in_use(2);
    // Every connection breaks with nothing of the socket unacked.
    net.cut_all(0);
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    net.advance(0);
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"m2".to_vec()]);
    assert_eq!(net.lanes_of(0, 5001), [0, 1, 1], "m2 went on path 0 while the count was unknown");
}

/// rds-sim seed 642074: the lane kept through a renegotiation (above) is
/// still held behind the socket's messages on path 0 (`rds_core::lane0`):
/// m1 went on path 0 before the count was known and was still unsent when
/// every path went down again; m2, on the lane, waits for it (held: in
/// `Net` path 1 cannot come up before path 0 sends, so the order alone
/// would not show it).
#[test]
fn a_lane_kept_through_a_renegotiation_still_waits_for_path_0() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5001); // lane 1 of 8
    let b = net.bound(1, 4000);
    // Node 0's path 0 sends nothing: m1 waits there; the peer's probe
    // tells node 0 the count, which fixes the socket's lane (1).
    net.frozen.insert((0, 0));
    net.send(0, a, sa(2, 4000), b"m1").unwrap();
    net.run();
    assert_eq!(net.nodes[0].path_info(net.path(0, 1, 0)).unwrap().npaths, 8);
    // Every connection breaks (path 1's connect too, which the peer
    // deferred until it heard our probe: reported down); m2 goes on the
    // lane, held behind m1.
    net.cut_all(0);
    assert!(net.deferred.is_empty(), "path 1's deferred connect is gone: {:?}", net.deferred);
    let held = net.nodes[0].counters().mprds_lane_hold;
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    assert_eq!(net.nodes[0].counters().mprds_lane_hold, held + 1, "m2 is not held behind m1");
    net.advance(0);
    net.run();
    assert!(net.drain_payloads(1, b).is_empty());
    net.thaw(0, 0);
    for _ in 0..10 {
        net.advance(100);
        net.run();
    }
    assert_eq!(net.drain_payloads(1, b), [b"m1".to_vec(), b"m2".to_vec()]);
    assert_eq!(net.lanes_of(0, 5001), [0, 1]);
}

/// rds-sim seed 1306339: the lane kept through a renegotiation (above)
/// must bring path 0 back. Path 1 failed first, while the others were up,
/// and waited for its reconnect; path 0 failed after it with only the
/// handshake's probe queued (a send that found the socket's buffer full
/// had asked for it), which does not make a path reconnect. The socket's
/// next message, queued on the kept lane, asked path 1 to connect, which
/// had its reconnect pending and looked no further; when that reconnect
/// came, path 1 could not connect before path 0's handshake, and nothing
/// connected path 0: the message waited for ever. A message for a path
/// above 0 connects path 0 when that is down and not reconnecting, also
/// when the lane's own reconnect is pending.
#[test]
fn a_message_on_a_kept_lane_brings_path_0_back() {
    let (mut net, a, b) = lane_1_in_use(3);
    // Nodes 2 and 3 refuse connections. The socket's buffer fills with
    // messages to node 3.
    net.refuse.extend([1, 2]);
    let big = vec![7u8; 60_000];
    while net.send(0, a, sa(3, 4000), &big).is_ok() {}
    net.run();
    // Path 1 breaks first and fails to reconnect while path 0 is up: its
    // next reconnect waits (the clock stands still from here).
    let (p0, p1) = (net.path(0, 1, 0), net.path(0, 1, 1));
    net.cut(0, p1);
    net.run();
    net.advance(0);
    net.run();
    // Then every path: path 0 fails to reconnect with nothing queued.
    net.cut_all(0);
    net.run();
    net.advance(0);
    net.run();
    assert_eq!(net.nodes[0].path_state(p0), Some(PathState::Down));
    // A send to node 2 finds the buffer full (EAGAIN) and asks for the
    // handshake's probe on path 0, whose connect fails: path 0 stays down
    // with only the probe queued.
    assert_eq!(net.send(0, a, sa(2, 4000), b"m2"), Err(Errno::EAGAIN));
    net.run();
    net.advance(0);
    net.run();
    assert_eq!(net.nodes[0].path_state(p0), Some(PathState::Down));
    assert_eq!(net.nodes[0].path_state(p1), Some(PathState::Down));
    // The messages to node 3 are cancelled (RDS_CANCEL_SENT_TO): m2 goes
    // on the kept lane, whose reconnect is still pending.
    assert!(net.nodes[0].drop_messages(a, Some(sa(3, 4000))) > 0);
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    net.refuse.clear();
    for _ in 0..50 {
        net.advance(100);
        net.run();
    }
    assert_eq!(net.drain_payloads(1, b), [b"m2".to_vec()], "m2 never went out:\n{}", net.nodes[0].dump());
    assert_eq!(net.lanes_of(0, 5001).last(), Some(&1));
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
    let seqs: Vec<u64> =
        net.data_sent_by(0).iter().filter(|m| m.payload.starts_with(b"m")).map(|m| m.header.sequence).collect();
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

fn one_path(i: usize) -> NodeConfig {
    NodeConfig { npaths: 1, ..config(i) }
}

fn probe(seq: u64, npaths: u16) -> RxMessage {
    let mut h = Header::data(wire::PROBE_PORT, 0, 0);
    h.sequence = seq;
    h.push_extension(Ext::Npaths(npaths)).unwrap();
    RxMessage::new(h, Payload::empty())
}

/// rds-sim seed 16: the peer reconnected its path while our end of the old
/// connection was still up (we had not seen it close). The new connection
/// was reset (no free slot), but the peer had already written messages on
/// it, which our TCP acked: they were lost. Now the old connection is shut
/// down and the new one waits (Accept::Defer) until it is gone.
#[test]
fn a_connection_for_a_busy_slot_waits_instead_of_being_reset() {
    let mut n = make_node(one_path(1), ip(2), TransportKind::Tcp);
    let Accept::Path(old) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    driver::outputs(&mut n);
    assert_eq!(n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()), Accept::Defer);
    let outs: Vec<Output> = driver::outputs(&mut n);
    assert_eq!(outs, [Output::Shutdown(PathInfo { taken: true, ..n.path_info(old.id).unwrap() })]);
    // Still draining: the new connection keeps waiting.
    assert_eq!(n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()), Accept::Defer);
    n.path_down(old.id, old.inst, DownReason::ShutdownDone, Instant::now());
    let Accept::Path(new) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    assert_eq!(new.id, old.id);
    assert!(new.inst > old.inst);
}

/// rds-sim seeds 6 and 14: the acceptor gave a reconnecting path the first
/// free slot, another path's: the peer's retransmissions were then checked
/// against the wrong receive sequence and delivered twice. Paths now
/// connect in order and a connection takes the lowest slot that is not up,
/// or waits while that slot is still going down.
#[test]
fn paths_connect_in_order_and_a_draining_slot_is_not_skipped() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    // After the handshake, one Connect per path, each once the previous is up.
    let order: Vec<u8> = net.connects.iter().filter(|c| c.0 == 0).map(|c| c.1.id.index).collect();
    assert_eq!(order, [0, 1, 2, 3, 4, 5, 6, 7]);
    // Node 1 shuts its slot 1 down; while it drains, node 0's path 1
    // reconnects: it must wait for slot 1, not take slot 2 or be reset.
    let mut n = make_node(config(1), ip(2), TransportKind::Tcp);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.received(p0.id, p0.inst, probe(1, 8));
    let paths: Vec<PathInfo> = (1..4)
        .map(|k| match n.accept(TransportKind::Tcp, ip(2), ip(1), 40000 + k, Instant::now()) {
            Accept::Path(p) => p,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(paths.iter().map(|p| p.id.index).collect::<Vec<_>>(), [1, 2, 3]);
    n.reset_path(paths[0].id);
    assert_eq!(n.accept(TransportKind::Tcp, ip(2), ip(1), 40009, Instant::now()), Accept::Defer);
    n.path_down(paths[0].id, paths[0].inst, DownReason::ShutdownDone, Instant::now());
    let Accept::Path(again) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40009, Instant::now()) else { panic!() };
    assert_eq!(again.id.index, 1);
}

fn full(i: usize) -> NodeConfig {
    NodeConfig { handshake_exts: HandshakeExts::Full, ..config(i) }
}

/// rds-sim seeds 19 and 33 (the open question in `peer_gen_update`): after
/// the peer restarted, what its old instance had received (and its
/// application read) but our TCP had not seen acked was retransmitted on
/// the new connection before the new instance's GEN_NUM (in its probe,
/// queued behind) arrived, and the new instance delivered it again. With
/// HandshakeExts::Full a new connection now carries only maps until the
/// peer's first message, its map, which carries its generation.
#[test]
fn retransmissions_wait_for_the_restarted_peers_generation() {
    let mut net = Net::with_configs(vec![full(0), full(1)], TransportKind::Tcp);
    let a = net.bound(0, 5000); // lane 0
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"hello").unwrap();
    net.run();
    // old-1 reaches node 1, whose application reads it; node 0 never sees the ack.
    net.hold_acks = true;
    net.send(0, a, sa(2, 4000), b"old-1").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"hello".to_vec(), b"old-1".to_vec()]);
    net.pending_acks.clear();
    net.hold_acks = false;
    // Node 1 restarts; the new instance's first messages are slow.
    net.restart(1, NodeConfig { gen_num: 999, ..full(1) });
    let b = net.bound(1, 4000);
    net.frozen.insert((1, 0));
    net.advance(0);
    net.run();
    let sent: Vec<Kind> = net.sent_by(0).iter().rev().take(1).map(|m| m.header.kind()).collect();
    assert_eq!(sent, [Kind::CongMap], "node 0 sent only its map on the new connection");
    assert!(net.drain_payloads(1, b).is_empty());
    net.thaw(1, 0);
    net.run();
    assert_eq!(net.nodes[0].counters().peer_restart, 1);
    assert_eq!(net.nodes[0].flushed(a), 1, "old-1 is reported flushed");
    assert!(net.drain_payloads(1, b).is_empty(), "and not delivered again");
    net.send(0, a, sa(2, 4000), b"new").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"new".to_vec()]);
}

/// A map of a `HandshakeExts::Full` peer: generation, path, version.
fn full_map(gen_num: u32, index: u8, version: u64, congested: &[u16]) -> RxMessage {
    let mut h = Header::cong_map();
    h.sport = u16::from(index);
    h.sequence = version;
    h.push_extension(Ext::GenNum(gen_num)).unwrap();
    let mut m = cong::CongMap::new();
    for p in congested {
        m.set(*p);
    }
    RxMessage::new(h, Payload::copy_from(m.as_bytes()))
}

/// rds-sim seed 523: the map lane moved (path 0 went down, maps went on
/// path 1, path 0 came back); a map sent on path 1 while a port was
/// congested arrived after the newer map on path 0, and the stale
/// congested bit stayed: blocked senders were never woken. Full maps now
/// carry a version and an older one is ignored.
#[test]
fn an_older_congestion_map_does_not_override_a_newer_one() {
    let mut n = make_node(config(1), ip(2), TransportKind::Tcp);
    let s = n.socket();
    n.bind(s, sa(2, 4000)).unwrap();
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    assert_eq!(n.received(p0.id, p0.inst, full_map(77, 0, 1, &[])), RecvOutcome::CongMap);
    n.received(p0.id, p0.inst, probe(1, 8));
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    // Version 3 (nothing congested) arrives on path 1 before version 2
    // (port 5000 congested) on path 0.
    n.received(p1.id, p1.inst, full_map(77, 1, 3, &[]));
    n.received(p0.id, p0.inst, full_map(77, 0, 2, &[5000]));
    let r = n.send(s, Some(sa(1, 5000)), &Payload::copy_from(b"x"), &SendOptions::default());
    assert_eq!(r, Ok(1), "the stale congested bit was not applied");
    // A newer version is applied.
    n.received(p0.id, p0.inst, full_map(77, 0, 4, &[5000]));
    let r = n.send(s, Some(sa(1, 5000)), &Payload::copy_from(b"y"), &SendOptions::default());
    assert_eq!(r, Err(Errno::ENOBUFS));
}

/// A generation heard on a connection older than the one that announced
/// the current generation is a dead instance's leftover (its maps and
/// probes can arrive late, drained from an old connection): it is neither
/// a restart nor the peer's generation.
#[test]
fn a_dead_instances_late_generation_is_not_a_restart() {
    let mut n = make_node(config(1), ip(2), TransportKind::Tcp);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.received(p0.id, p0.inst, full_map(77, 0, 1, &[]));
    n.received(p0.id, p0.inst, probe(1, 8));
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    let Accept::Path(p2) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40002, Instant::now()) else { panic!() };
    // The peer restarted; its new instance (88) speaks on the newest connection.
    n.received(p2.id, p2.inst, full_map(88, 2, 1, &[]));
    assert_eq!(n.counters().peer_restart, 1);
    // Late maps of instance 77 on older connections.
    n.received(p0.id, p0.inst, full_map(77, 0, 9, &[]));
    n.received(p1.id, p1.inst, full_map(77, 1, 10, &[]));
    assert_eq!(n.counters().peer_restart, 1);
    assert_eq!(n.info_connections()[0].peer_gen, 88);
}

/// rds-sim seed 2818: a Full node that had never heard from its peer (the
/// peer's maps were lost in a reset) accepted, before the handshake, a
/// connection that was the peer's path 1, put it in slot 0, and sent its
/// retransmissions on it at once; the peer saw the wrong path index in our
/// map and dropped the connection, but only after delivering them against
/// its path 1's receive sequence: twice. A node now holds every new
/// connection until it has heard from the peer at all; only our probe, first
/// in the queue, passes the hold (a 6.1 kernel may answer nothing else), and
/// it travels behind our map, so a Full peer drops a crossed connection
/// before the probe counts.
#[test]
fn nothing_but_maps_and_our_probe_go_to_a_peer_never_heard_from() {
    let mut n = make_node(full(1), ip(2), TransportKind::Tcp);
    let s = n.socket();
    n.bind(s, sa(2, 4000)).unwrap();
    n.send(s, Some(sa(1, 5000)), &Payload::copy_from(b"m"), &SendOptions::default()).unwrap();
    let pull = |n: &mut Node, p: &PathInfo| {
        driver::outputs(n);
        let mut out = Vec::new();
        n.pull(p.id, p.inst, 1 << 20, &mut out);
        // (A Full map's sequence field is its version; shown as 0.)
        let seq = |m: &TxMessage| if m.header.kind() == Kind::CongMap { 0 } else { m.header.sequence };
        out.iter().map(|m| (m.header.kind(), seq(m), m.header.is_retransmitted())).collect::<Vec<_>>()
    };
    let Accept::Path(p) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    // The probe was queued after "m" but is numbered first: nothing of this
    // connection object was ever on a wire.
    assert_eq!(pull(&mut n, &p), [(Kind::CongMap, 0, false), (Kind::ProbePing, 1, false)]);
    // The connection breaks before anything from the peer arrived.
    n.path_down(p.id, p.inst, DownReason::Closed, Instant::now());
    let Accept::Path(p) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    assert_eq!(
        pull(&mut n, &p),
        [(Kind::CongMap, 0, false), (Kind::ProbePing, 1, true)],
        "still holding: nothing heard from the peer; the probe is resent, \"m\" is not"
    );
    // The peer's map (with its generation and the right path) arrives.
    // (The reset of every path restarted the handshake: a new probe is
    // queued behind "m", as the kernel queues it.)
    n.received(p.id, p.inst, full_map(77, 0, 1, &[]));
    assert_eq!(pull(&mut n, &p), [(Kind::Data, 2, false), (Kind::ProbePing, 3, false)]);
}

/// rds-sim seed 5888: a message sent before the handshake (so on path 0)
/// was cancelled (RDS_CANCEL_SENT_TO) while on the wire. That released its
/// socket's hold on its own lane at once, so the socket's next message went
/// out on path 1 and was delivered before the cancelled one, which the
/// peer still received on path 0. The hold now lasts until path 0's acks
/// pass the cancelled message.
#[test]
fn a_cancelled_message_on_the_wire_still_holds_its_sockets_lane() {
    let mut n = make_node(config(0), ip(1), TransportKind::Tcp);
    let a = n.socket();
    n.bind(a, sa(1, 5001)).unwrap(); // lane 1 of 8
    let dst = sa(2, 4000);
    let send = |n: &mut Node, p: &[u8]| n.send(a, Some(dst), &Payload::copy_from(p), &SendOptions::default());
    let drain = |n: &mut Node| driver::outputs(n);
    let pull = |n: &mut Node, p: PathInfo| {
        let mut out = Vec::new();
        n.pull(p.id, p.inst, 1 << 20, &mut out);
        out.iter()
            .filter(|m| m.header.kind() == Kind::Data)
            .map(|m| (m.payload.to_vec(), m.header.sequence))
            .collect::<Vec<_>>()
    };
    send(&mut n, b"m1").unwrap();
    let Some(Output::Connect(p0)) = drain(&mut n).into_iter().find(|o| matches!(o, Output::Connect(_))) else {
        panic!()
    };
    n.path_up(p0.id, p0.inst, Instant::now());
    // The peer's map: it took the connection (we hold data until then).
    let map = || RxMessage::new(Header::cong_map(), Payload::copy_from(&[0u8; wire::CONG_MAP_BYTES]));
    n.received(p0.id, p0.inst, map());
    let sent0 = pull(&mut n, p0);
    assert_eq!(sent0.iter().map(|m| m.0.clone()).collect::<Vec<_>>(), [b"m1".to_vec()]);
    // The peer's probe: 8 paths; path 1 connects.
    n.received(p0.id, p0.inst, probe(1, 8));
    let p1 = drain(&mut n)
        .into_iter()
        .find_map(|o| match o {
            Output::Connect(p) if p.id.index == 1 => Some(p),
            _ => None,
        })
        .unwrap();
    n.path_up(p1.id, p1.inst, Instant::now());
    n.received(p0.id, p0.inst, map());
    // m1 is on the wire, unacked; it is cancelled, then m2 is sent.
    assert_eq!(n.drop_messages(a, Some(dst)), 1);
    send(&mut n, b"m2").unwrap();
    assert!(pull(&mut n, p1).is_empty(), "m2 waits while m1 may still arrive on path 0");
    // The ack says the peer's TCP has m1, not that the peer read it: path 0
    // sends a probe ping, and m2 waits for its pong (`rds_core::lane0`).
    n.acked(p0.id, p0.inst, sent0[0].1);
    assert!(pull(&mut n, p1).is_empty(), "m2 waits until the peer read m1");
    assert_eq!(n.counters().mprds_read_proof, 1);
    let mut out = Vec::new();
    n.pull(p0.id, p0.inst, 1 << 20, &mut out);
    let ping = out.iter().find(|m| m.header.kind() == Kind::ProbePing).expect("the proof's ping");
    assert!(ping.header.sequence > sent0[0].1);
    let pong = |n: &mut Node, seq: u64| {
        let mut h = Header::data(0, wire::PROBE_PORT, 0);
        h.sequence = seq;
        n.received(p0.id, p0.inst, RxMessage::new(h, Payload::empty()))
    };
    // Our handshake probe went first: its pong proves nothing about m1
    // (it asks again); the next one does.
    assert_eq!(pong(&mut n, 2), RecvOutcome::ProbePong);
    assert!(pull(&mut n, p1).is_empty());
    assert_eq!(pong(&mut n, 3), RecvOutcome::ProbePong);
    assert_eq!(pull(&mut n, p1).iter().map(|m| m.0.clone()).collect::<Vec<_>>(), [b"m2".to_vec()]);
}

/// rds-sim seed 7994 (with the stale-retransmission rule of a restarted
/// receiver): a Full node learned of its peer's restart on a new
/// connection, but kept sending on an older one, which still went to the
/// dead instance. A message first written there after the restart was
/// known (so not flushed) was lost, resent on a new connection marked
/// RETRANSMITTED, and dropped by the new instance as meant for its
/// predecessor: lost without a report. Connections older than the one that
/// announced the new generation are now closed when the restart is seen.
#[test]
fn connections_to_a_restarted_peers_old_instance_are_closed() {
    let mut n = make_node(config(1), ip(2), TransportKind::Tcp);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.received(p0.id, p0.inst, full_map(77, 0, 1, &[]));
    n.received(p0.id, p0.inst, probe(1, 8));
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    n.received(p1.id, p1.inst, full_map(77, 1, 2, &[]));
    driver::outputs(&mut n);
    // Path 0's connection died and the peer's new instance (88) connected.
    n.path_down(p0.id, p0.inst, DownReason::Closed, Instant::now());
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40002, Instant::now()) else { panic!() };
    assert_eq!(p0.id.index, 0);
    driver::outputs(&mut n);
    n.received(p0.id, p0.inst, full_map(88, 0, 1, &[]));
    assert_eq!(n.counters().peer_restart, 1);
    let outs: Vec<Output> = driver::outputs(&mut n);
    assert!(outs.contains(&Output::Shutdown(PathInfo { taken: true, ..n.path_info(p1.id).unwrap() })), "{outs:?}");
    assert_eq!(n.path_state(p1.id), Some(PathState::Disconnecting));
    assert_eq!(n.path_state(p0.id), Some(PathState::Up));
}

/// rds-sim seed 1332 (a lane hold's timing): an accept race paired our
/// slot 1 with the peer's path 0, whose map said so; the connection was
/// dropped, but the probe ping the peer sends right after its map (its
/// leading probe passes its hold) was still taken on slot 1 and moved its
/// receive sequence past 1. The peer's first message on its real path 1,
/// sequence 1, lost on a reset and retransmitted, was then dropped as a
/// duplicate: lost. The rest of a crossed connection is now ignored.
#[test]
fn the_rest_of_a_crossed_connection_is_ignored() {
    let mut n = make_node(full(1), ip(2), TransportKind::Tcp);
    let s = n.socket();
    n.bind(s, sa(2, 5000)).unwrap();
    let gen_num = 0x5eed;
    let map = |sport: u16| {
        let mut h = Header::cong_map();
        h.sport = sport;
        h.push_extension(Ext::GenNum(gen_num)).unwrap();
        RxMessage::new(h, Payload::copy_from(&[0u8; wire::CONG_MAP_BYTES]))
    };
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.received(p0.id, p0.inst, map(0));
    n.received(p0.id, p0.inst, probe(1, 8));
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    assert_eq!(p1.id.index, 1);
    driver::outputs(&mut n);
    // Slot 1's connection is the peer's path 0 (its map says so): dropped,
    // and its probe is not slot 1's.
    assert_eq!(n.received(p1.id, p1.inst, map(0)), RecvOutcome::Ignored);
    assert!(driver::outputs(&mut n).iter().any(|o| matches!(o, Output::Shutdown(p) if p.id == p1.id)));
    assert_eq!(n.received(p1.id, p1.inst, probe(1, 8)), RecvOutcome::Ignored);
    n.path_down(p1.id, p1.inst, DownReason::ShutdownDone, Instant::now());
    // The peer's path 1: its map, then its message 1 (retransmitted after a
    // reset of a first connection that carried nothing else of it).
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40002, Instant::now()) else { panic!() };
    assert_eq!(p1.id.index, 1);
    n.received(p1.id, p1.inst, map(1));
    let mut h = Header::data(4000, 5000, 2);
    h.sequence = 1;
    h.flags |= wire::flags::RETRANSMITTED;
    let m = RxMessage::new(h, Payload::copy_from(b"m1"));
    assert_eq!(n.received(p1.id, p1.inst, m), RecvOutcome::Delivered);
}

/// rds-sim seed 72441: the peer restarted, and both our paths' connections
/// were replaced, path 1's first. Its map announced the new generation;
/// path 0's connection, up after path 1's, reached the new instance too,
/// but its receive sequence was left to be forgotten at its *next*
/// connection. That came after path 0 had delivered the new instance's m1
/// (whose ack the peer missed): the reset forgot m1, and m1, resent on the
/// next connection, was delivered twice. A connection up after the one
/// that announced the generation (and having heard no other) forgets the
/// old sequence at once.
#[test]
fn a_connection_of_the_restarted_peer_keeps_what_it_delivered() {
    let mut n = make_node(full(1), ip(2), TransportKind::Tcp);
    let s = n.socket();
    n.bind(s, sa(2, 5000)).unwrap();
    let data = |seq: u64, resent: bool| {
        let mut h = Header::data(4000, 5000, 2);
        h.sequence = seq;
        if resent {
            h.flags |= wire::flags::RETRANSMITTED;
        }
        RxMessage::new(h, Payload::copy_from(b"m1"))
    };
    let now = Instant::now();
    // Instance 77: two paths; path 0 delivers up to sequence 5.
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.received(p0.id, p0.inst, full_map(77, 0, 1, &[]));
    n.received(p0.id, p0.inst, probe(1, 2));
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    n.received(p1.id, p1.inst, full_map(77, 1, 2, &[]));
    for seq in 2..6 {
        assert_eq!(n.received(p0.id, p0.inst, data(seq, false)), RecvOutcome::Delivered);
    }
    while n.recv(s, false).is_ok() {}
    driver::outputs(&mut n);
    // The peer restarts as 88: path 1's connection is replaced, then path
    // 0's; path 1's map is the first word of 88.
    n.path_down(p1.id, p1.inst, DownReason::Closed, now);
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40002, Instant::now()) else { panic!() };
    assert_eq!(p1.id.index, 1);
    n.path_down(p0.id, p0.inst, DownReason::Closed, now);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40003, Instant::now()) else { panic!() };
    assert_eq!(p0.id.index, 0);
    n.received(p1.id, p1.inst, full_map(88, 1, 1, &[]));
    assert_eq!(n.counters().peer_restart, 1);
    assert_eq!(n.path_state(p0.id), Some(PathState::Up), "path 0's connection reaches 88: kept");
    // 88's map and m1 on path 0; its ack does not reach the peer, whose
    // connection dies: m1 comes again, resent, on the next one.
    n.received(p0.id, p0.inst, full_map(88, 0, 2, &[]));
    assert_eq!(n.received(p0.id, p0.inst, data(1, false)), RecvOutcome::Delivered);
    assert!(n.recv(s, false).is_ok());
    n.path_down(p0.id, p0.inst, DownReason::Closed, now);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40004, Instant::now()) else { panic!() };
    assert_eq!(p0.id.index, 0);
    n.received(p0.id, p0.inst, full_map(88, 0, 3, &[]));
    assert_eq!(n.received(p0.id, p0.inst, data(1, true)), RecvOutcome::DupDropped);
    assert!(n.recv(s, false).is_err(), "m1 delivered twice");
}

/// rds-sim seed 146582: the peer restarted with a pong of ours to its old
/// instance's probe still queued (never sent: the connection died). It
/// went to the new instance on the next connection, which took it for the
/// answer to its own probe ping and, with the next pong, for the answer to
/// its read-proof ping: a lane-0 hold ended before we had read the held
/// message (`rds_core::lane0`), and the lane's next message was read first.
/// Pongs never sent are dropped when the peer's restart shows; the new
/// instance's probe still gets its answer.
#[test]
fn pongs_for_a_restarted_peers_old_instance_are_dropped() {
    let mut n = make_node(full(1), ip(2), TransportKind::Tcp);
    let now = Instant::now();
    let probe_of = |gen_num: u32| {
        let mut m = probe(1, 8);
        m.header.push_extension(Ext::GenNum(gen_num)).unwrap();
        m
    };
    let pongs = |out: &[TxMessage]| out.iter().filter(|m| m.header.kind() == Kind::ProbePong).count();
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.received(p0.id, p0.inst, full_map(77, 0, 1, &[]));
    assert_eq!(n.received(p0.id, p0.inst, probe_of(77)), RecvOutcome::Ping);
    driver::outputs(&mut n);
    // Our pong to 77's probe is still queued when the connection dies.
    n.path_down(p0.id, p0.inst, DownReason::Closed, now);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    assert_eq!(p0.id.index, 0);
    n.received(p0.id, p0.inst, full_map(88, 0, 1, &[]));
    assert_eq!(n.counters().peer_restart, 1);
    let mut out = Vec::new();
    while n.pull(p0.id, p0.inst, 1 << 20, &mut out) {}
    assert_eq!(pongs(&out), 0, "77's pong went to 88: {out:?}");
    // 88's probe is answered, once.
    assert_eq!(n.received(p0.id, p0.inst, probe_of(88)), RecvOutcome::Ping);
    out.clear();
    while n.pull(p0.id, p0.inst, 1 << 20, &mut out) {}
    assert_eq!(pongs(&out), 1);
}

/// A probe ping that reveals the peer's restart is answered: the pongs
/// dropped for the old instance are those queued before it.
#[test]
fn the_probe_that_reveals_a_restart_is_answered() {
    let mut n = make_node(config(1), ip(2), TransportKind::Tcp);
    let now = Instant::now();
    let probe_of = |seq: u64, gen_num: u32| {
        let mut m = probe(seq, 8);
        m.header.push_extension(Ext::GenNum(gen_num)).unwrap();
        m
    };
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.received(p0.id, p0.inst, probe_of(1, 77));
    driver::outputs(&mut n);
    n.path_down(p0.id, p0.inst, DownReason::Closed, now);
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    assert_eq!(n.received(p0.id, p0.inst, probe_of(1, 88)), RecvOutcome::Ping);
    assert_eq!(n.counters().peer_restart, 1);
    let mut out = Vec::new();
    while n.pull(p0.id, p0.inst, 1 << 20, &mut out) {}
    let pongs: Vec<_> = out.iter().filter(|m| m.header.kind() == Kind::ProbePong).collect();
    assert_eq!(pongs.len(), 1, "{out:?}");
    assert!(pongs[0].header.extensions().any(|e| e == Ext::Npaths(8)));
}
