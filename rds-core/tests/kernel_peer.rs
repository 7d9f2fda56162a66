//! Behaviour against a Linux 6.1 peer, found by the conformance tests
//! (tests/tests/kernel_tcp.rs) and reproduced here without the VM.
//!
//! * A 6.1 kernel accepts a connection into its lowest free path slot, in
//!   accept order, whenever its worker gets to it. We are the smaller
//!   address and connect: path i+1 only once the kernel evidently took path
//!   i (something arrived on it, or a congestion map arrived on any path:
//!   the kernel sends its map whenever it accepts), and a path that goes
//!   down closes our later paths the kernel has not taken yet. (In the VM,
//!   after a reset of all paths, our paths 0..7 landed in the kernel's slots
//!   3, 2, 0, 4, 5, 6, 1, 7: retransmissions were delivered twice and ours
//!   dropped by the kernel.)
//! * A 6.1 kernel cannot tell that we restarted: after a kill -9 it sends
//!   the messages it had sent to our previous process, unacked, again, with
//!   RETRANSMITTED. They come first on our first connection of the path and
//!   are dropped (`recv_drop_stale`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rds_core::driver;
use rds_core::wire::{self, Ext, Header};
use rds_core::*;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

fn node(addr: IpAddr) -> Node {
    node_with(addr, Duration::ZERO)
}

fn node_with(addr: IpAddr, settle: Duration) -> Node {
    let mut n = Node::new(NodeConfig { gen_num: 7, seed: 1, reconnect_settle: settle, ..NodeConfig::default() });
    n.register_transport(TransportCaps::tcp());
    n.register_transport(TransportCaps::loopback());
    n.add_local(addr, TransportKind::Tcp);
    n
}

/// Drains the outputs: (connects, shutdowns) as path indexes.
fn outputs(n: &mut Node) -> (Vec<PathInfo>, Vec<PathInfo>) {
    let (mut c, mut s) = (Vec::new(), Vec::new());
    driver::for_each(n, |_, o| match o {
        Output::Connect(i) => c.push(i),
        Output::Shutdown(i) => s.push(i),
        _ => {}
    });
    (c, s)
}

fn indexes(v: &[PathInfo]) -> Vec<u8> {
    v.iter().map(|i| i.id.index).collect()
}

fn pong(seq: u64) -> RxMessage {
    let mut h = Header::data(0, wire::PROBE_PORT, 0);
    h.sequence = seq;
    h.push_extension(Ext::Npaths(8)).unwrap();
    RxMessage::new(h, Payload::empty())
}

fn map() -> RxMessage {
    RxMessage::new(Header::cong_map(), Payload::copy_from(&[0u8; wire::CONG_MAP_BYTES]))
}

fn data(sport: u16, dport: u16, seq: u64, flags: u8, body: &[u8]) -> RxMessage {
    let mut h = Header::data(sport, dport, body.len() as u32);
    h.sequence = seq;
    h.flags = flags;
    RxMessage::new(h, Payload::copy_from(body))
}

/// Node at 127.0.0.1 (the smaller address) with path 0 up and the
/// handshake answered (8 paths); returns the node, the path infos so far
/// and the connects it asked for after the pong.
fn handshaken() -> (Node, Vec<PathInfo>, Vec<PathInfo>) {
    handshaken_with(Duration::ZERO)
}

fn handshaken_with(settle: Duration) -> (Node, Vec<PathInfo>, Vec<PathInfo>) {
    let (n, _, paths, c) = handshaken_socket(settle);
    (n, paths, c)
}

/// `handshaken_with`, and the socket (bound to port 5000, lane 0) that sent
/// "x" before the handshake.
fn handshaken_socket(settle: Duration) -> (Node, SockId, Vec<PathInfo>, Vec<PathInfo>) {
    let mut n = node_with(ip(1), settle);
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(1), 5000)).unwrap();
    n.send(s, Some(SocketAddr::new(ip(2), 4000)), &Payload::copy_from(b"x"), &SendOptions::default()).unwrap();
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [0]);
    let p0 = c[0];
    n.path_up(p0.id, p0.inst, Instant::now());
    outputs(&mut n);
    assert_eq!(n.received(p0.id, p0.inst, pong(1)), RecvOutcome::ProbePong);
    let (c, _) = outputs(&mut n);
    (n, s, vec![p0], c)
}

#[test]
fn paths_connect_one_at_a_time_once_the_kernel_took_the_previous() {
    let (mut n, mut paths, c) = handshaken();
    // The pong arrived on path 0: the kernel took it; path 1, and only it.
    assert_eq!(indexes(&c), [1]);
    let mut next = c[0];
    for i in 1..8u8 {
        assert_eq!(next.id.index, i);
        n.path_up(next.id, next.inst, Instant::now());
        paths.push(next);
        // Established on our side is not enough: the kernel may not have
        // accepted it yet.
        let (c, _) = outputs(&mut n);
        assert!(c.is_empty(), "path {i} up but not confirmed: no connect, got {:?}", indexes(&c));
        if i == 7 {
            break;
        }
        // The kernel's map when it accepts: on the new path, or (as here for
        // odd paths) on another one.
        let on = if i % 2 == 0 { next } else { paths[0] };
        assert_eq!(n.received(on.id, on.inst, map()), RecvOutcome::CongMap);
        let (c, _) = outputs(&mut n);
        assert_eq!(indexes(&c), [i + 1], "after the kernel took path {i}");
        next = c[0];
    }
    let conn = paths[0].id.conn;
    for i in 0..8u8 {
        assert_eq!(n.path_state(PathId { conn, index: i }), Some(PathState::Up));
    }
}

/// What `pull` sends on path `p` now: (kind, sport, dport) of each frame.
fn sent(n: &mut Node, p: &PathInfo) -> Vec<(wire::Kind, u16, u16)> {
    driver::outputs(n);
    let mut out = Vec::new();
    n.pull(p.id, p.inst, 1 << 20, &mut out);
    out.iter().map(|m| (m.header.kind(), m.header.sport, m.header.dport)).collect()
}

/// The kernel's map that shows it took a connection can be lost (it goes
/// out on whichever of its connections transmits first, and one of ours
/// may be closing). The fan-out must not stop there: a path still
/// unconfirmed after `confirm_probe_after` gets a probe ping, which the
/// kernel answers on the same connection, and the answer confirms it.
#[test]
fn a_path_whose_confirming_map_was_lost_is_confirmed_by_a_probe() {
    let (mut n, _, c) = handshaken();
    let p1 = c[0];
    // A socket on lane 1 (port 5001) has a message waiting for path 1.
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(1), 5001)).unwrap();
    n.send(s, Some(SocketAddr::new(ip(2), 4000)), &Payload::copy_from(b"lane 1"), &SendOptions::default()).unwrap();
    let t0 = Instant::now();
    n.path_up(p1.id, p1.inst, t0);
    assert!(outputs(&mut n).0.is_empty(), "path 1 up, not confirmed: no connect");
    let after = NodeConfig::default().confirm_probe_after;
    assert_eq!(n.poll_timeout(), Some(t0 + after));
    // No map comes. Before the delay nothing goes out on path 1 but our map.
    n.handle_timeout(t0 + after - Duration::from_millis(1));
    assert!(sent(&mut n, &p1).iter().all(|f| f.0 == wire::Kind::CongMap));
    // Then a probe ping (sport 1, dport 0), ahead of the socket's message,
    // which still waits; and again after twice the delay.
    let probes = |n: &mut Node| n.counters().mprds_confirm_probe;
    n.handle_timeout(t0 + after);
    assert_eq!(sent(&mut n, &p1), [(wire::Kind::ProbePing, wire::PROBE_PORT, 0)]);
    assert_eq!(probes(&mut n), 1);
    assert_eq!(n.poll_timeout(), Some(t0 + 3 * after));
    n.handle_timeout(t0 + 3 * after);
    assert_eq!(sent(&mut n, &p1), [(wire::Kind::ProbePing, wire::PROBE_PORT, 0)]);
    assert_eq!(probes(&mut n), 2);
    assert!(outputs(&mut n).0.is_empty(), "still unconfirmed: no connect");
    // The kernel's pong on path 1: path 2 connects, the socket's message
    // goes, and path 1 gets no more probes.
    n.received(p1.id, p1.inst, pong(2));
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [2]);
    assert_eq!(sent(&mut n, &p1), [(wire::Kind::Data, 5001, 4000)]);
    let p2 = c[0];
    // Path 2's map comes in time: no probe for it, none for path 1 either.
    let t1 = t0 + 4 * after;
    n.path_up(p2.id, p2.inst, t1);
    n.received(p1.id, p1.inst, map());
    assert_eq!(indexes(&outputs(&mut n).0), [3]);
    n.handle_timeout(t1 + 100 * after);
    assert!(sent(&mut n, &p1).is_empty() && sent(&mut n, &p2).iter().all(|f| f.0 == wire::Kind::CongMap));
    assert_eq!(probes(&mut n), 2);
}

/// A 6.1 kernel sends its map when it accepts a connection, and also
/// when one of its sockets becomes congested or uncongested. An update
/// that comes on another path while a connection of ours waits for the
/// kernel's sign is no sign: that connection may still sit in its accept
/// queue, to be reset there (no free slot) after its TCP acked what we
/// sent. A map on another path that repeats the previous one's bitmap
/// (the accept's) confirms it; a map on the path itself always does.
#[test]
fn a_congestion_update_on_another_path_is_no_sign_that_the_kernel_took_a_connection() {
    let (mut n, paths, c) = handshaken();
    let p0 = paths[0];
    let p1 = c[0];
    // A socket on lane 2 (port 5002) has a message waiting for path 2.
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(1), 5002)).unwrap();
    n.send(s, Some(SocketAddr::new(ip(2), 4000)), &Payload::copy_from(b"lane 2"), &SendOptions::default()).unwrap();
    n.path_up(p1.id, p1.inst, Instant::now());
    n.received(p1.id, p1.inst, map_at(&[], 0));
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [2]);
    let p2 = c[0];
    n.path_up(p2.id, p2.inst, Instant::now());
    assert!(outputs(&mut n).0.is_empty());
    // The kernel's port 4001 becomes congested: its update comes on path 0.
    n.received(p0.id, p0.inst, map_at(&[4001], 100));
    assert!(outputs(&mut n).0.is_empty(), "an update confirmed path 2");
    assert!(sent(&mut n, &p2).iter().all(|f| f.0 == wire::Kind::CongMap), "path 2 carried a socket's message");
    assert_eq!(n.counters().mprds_confirm_withheld, 1);
    // The map of its accept (the same bitmap), on path 1: path 2 is
    // confirmed, its message goes and path 3 connects.
    n.received(p1.id, p1.inst, map_at(&[4001], 200));
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [3]);
    assert_eq!(sent(&mut n, &p2), [(wire::Kind::Data, 5002, 4000)]);
    assert_eq!(n.counters().mprds_confirm_withheld, 1);
    // An update that comes on the waiting path itself confirms it.
    let p3 = c[0];
    n.path_up(p3.id, p3.inst, Instant::now());
    assert!(outputs(&mut n).0.is_empty());
    n.received(p3.id, p3.inst, map_at(&[], 300));
    assert_eq!(indexes(&outputs(&mut n).0), [4]);
    assert_eq!(n.counters().mprds_confirm_withheld, 1);
}

/// `confirm_probe_after` zero turns the probe off (no timer that would
/// come due again at once).
#[test]
fn a_zero_confirm_delay_sends_no_probe() {
    let mut n =
        Node::new(NodeConfig { gen_num: 7, seed: 1, confirm_probe_after: Duration::ZERO, ..NodeConfig::default() });
    n.register_transport(TransportCaps::tcp());
    n.add_local(ip(1), TransportKind::Tcp);
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(1), 5000)).unwrap();
    n.send(s, Some(SocketAddr::new(ip(2), 4000)), &Payload::copy_from(b"x"), &SendOptions::default()).unwrap();
    let (c, _) = outputs(&mut n);
    let t0 = Instant::now();
    n.path_up(c[0].id, c[0].inst, t0);
    assert_eq!(n.poll_timeout(), None);
    n.handle_timeout(t0 + Duration::from_secs(60));
    assert_eq!(n.counters().mprds_confirm_probe, 0);
}

/// A peer that takes the connection but never reads: the confirm probes
/// that cannot leave do not pile up, one waits for all, until the fourth
/// check drops the connection.
#[test]
fn unsent_confirm_probes_do_not_pile_up() {
    let (mut n, _, c) = handshaken();
    let p1 = c[0];
    let t0 = Instant::now();
    n.path_up(p1.id, p1.inst, t0);
    outputs(&mut n);
    let after = NodeConfig::default().confirm_probe_after;
    for k in [1, 3, 7] {
        let t = n.poll_timeout().expect("the confirm check stays armed");
        assert_eq!(t, t0 + k * after, "the checks back off");
        n.handle_timeout(t);
        assert!(outputs(&mut n).1.is_empty(), "not dropped before the fourth check");
    }
    assert_eq!(n.counters().mprds_confirm_probe, 1, "one probe queued, never sent");
    let probes = sent(&mut n, &p1).iter().filter(|f| f.0 == wire::Kind::ProbePing).count();
    assert_eq!(probes, 1);
    let t = n.poll_timeout().unwrap();
    assert_eq!(t, t0 + 15 * after);
    n.handle_timeout(t);
    assert_eq!(indexes(&outputs(&mut n).1), [1], "dropped at the fourth check");
    assert_eq!(n.counters().mprds_confirm_drop, 1);
}

#[test]
fn a_path_going_down_closes_later_paths_the_kernel_has_not_taken() {
    let (mut n, mut paths, c) = handshaken();
    let mut next = c[0];
    // Paths 1..3 up and confirmed, path 4 up unconfirmed, path 5 not yet asked for.
    for _ in 1..=4 {
        n.path_up(next.id, next.inst, Instant::now());
        paths.push(next);
        outputs(&mut n);
        if paths.len() == 5 {
            break;
        }
        n.received(next.id, next.inst, map());
        let (c, _) = outputs(&mut n);
        next = c[0];
    }
    let conn = paths[0].id.conn;
    let p = |i: u8| PathId { conn, index: i };
    // Path 2 breaks. Path 3 (taken by the kernel) stays; path 4 may sit in
    // the kernel's accept queue and would get slot 2 there: closed.
    let now = Instant::now();
    n.path_down(paths[2].id, paths[2].inst, DownReason::Closed, now);
    n.handle_timeout(now);
    let (c, s) = outputs(&mut n);
    assert_eq!(indexes(&s), [4]);
    assert_eq!(indexes(&c), [2], "path 2 reconnects at once");
    assert_eq!(n.path_state(p(3)), Some(PathState::Up));
    let p4 = s[0];
    n.path_down(p4.id, p4.inst, DownReason::ShutdownDone, Instant::now());
    n.handle_timeout(Instant::now());
    let (c4, _) = outputs(&mut n);
    assert!(c4.is_empty(), "path 4 waits for path 2: {:?}", indexes(&c4));
    // Path 2 is up again, then confirmed: path 4 follows (3 is still up).
    let p2 = c[0];
    n.path_up(p2.id, p2.inst, Instant::now());
    assert!(outputs(&mut n).0.is_empty());
    n.received(p2.id, p2.inst, map());
    n.handle_timeout(Instant::now());
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [4]);
    // A connect in progress is closed as well.
    let p4 = c[0];
    n.path_down(paths[1].id, paths[1].inst, DownReason::Closed, Instant::now());
    let (_, s) = outputs(&mut n);
    assert_eq!(indexes(&s), [4], "the connecting path 4; paths 2 and 3 were taken");
    assert_eq!(s[0].inst, p4.inst);
}

#[test]
fn a_restarted_node_drops_retransmissions_meant_for_its_previous_instance() {
    // We are 127.0.0.2 (the larger address): the kernel connects to us.
    let mut n = node(ip(2));
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(2), 7100)).unwrap();
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    let r = wire::flags::RETRANSMITTED;
    // What the kernel had sent to our previous process, unacked, comes first.
    assert_eq!(n.received(p0.id, p0.inst, map()), RecvOutcome::CongMap);
    assert_eq!(n.received(p0.id, p0.inst, data(7200, 7100, 41, r, b"old-41")), RecvOutcome::Stale);
    assert_eq!(n.received(p0.id, p0.inst, data(7200, 7100, 42, r, b"old-42")), RecvOutcome::Stale);
    assert_eq!(n.counters().recv_drop_stale, 2);
    assert_eq!(n.counters().recv_drop_old_seq, 0);
    // Then what it sends to us.
    assert_eq!(n.received(p0.id, p0.inst, data(7200, 7100, 43, 0, b"new-43")), RecvOutcome::Delivered);
    // The connection breaks before 44 arrived; on the next connection the
    // kernel resends 43 (delivered: dropped as usual) and 44 (ours).
    n.path_down(p0.id, p0.inst, DownReason::Closed, Instant::now());
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    assert_eq!(p0.id.index, 0);
    assert_eq!(n.received(p0.id, p0.inst, data(7200, 7100, 43, r, b"new-43")), RecvOutcome::DupDropped);
    assert_eq!(n.received(p0.id, p0.inst, data(7200, 7100, 44, r, b"new-44")), RecvOutcome::Delivered);
    assert_eq!(n.counters().recv_drop_stale, 2);
    assert_eq!(n.counters().recv_drop_old_seq, 1);
    let mut got = Vec::new();
    while let Ok(Received::Data(i)) = n.recv(s, false) {
        got.push(i.payload.to_vec());
    }
    assert_eq!(got, [b"new-43".to_vec(), b"new-44".to_vec()]);
}

#[test]
fn a_retransmission_on_a_later_connection_is_delivered_even_if_nothing_came_before() {
    // The kernel sent 5 to us on our first connection, which broke before
    // anything arrived: the retransmission on the second one is ours.
    let mut n = node(ip(2));
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(2), 7100)).unwrap();
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    n.path_down(p0.id, p0.inst, DownReason::Closed, Instant::now());
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    let r = wire::flags::RETRANSMITTED;
    assert_eq!(n.received(p0.id, p0.inst, data(7200, 7100, 5, r, b"five")), RecvOutcome::Delivered);
    assert_eq!(n.counters().recv_drop_stale, 0);
    let Ok(Received::Data(i)) = n.recv(s, false) else { panic!() };
    assert_eq!(&i.payload[..], b"five");
}

#[test]
fn after_a_reset_of_all_paths_they_reconnect_in_order_whatever_order_their_deaths_are_seen() {
    let settle = Duration::from_millis(50);
    let (mut n, mut paths, c) = handshaken_with(settle);
    let mut next = c[0];
    for i in 1..8u8 {
        n.path_up(next.id, next.inst, Instant::now());
        paths.push(next);
        n.received(next.id, next.inst, map());
        let (c, _) = outputs(&mut n);
        if i < 7 {
            next = c[0];
        }
    }
    // The kernel reset every path; we see path 5's end first, path 2's 10
    // ms later. Reconnecting path 5 at once would give it the kernel's slot
    // 2 (its lowest free one).
    let t = Instant::now();
    n.path_down(paths[5].id, paths[5].inst, DownReason::Closed, t);
    n.handle_timeout(t);
    assert!(outputs(&mut n).0.is_empty(), "path 5 waits {settle:?}");
    let t2 = t + Duration::from_millis(10);
    n.path_down(paths[2].id, paths[2].inst, DownReason::Closed, t2);
    n.handle_timeout(t2);
    assert!(outputs(&mut n).0.is_empty());
    n.handle_timeout(t2 + settle);
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [2], "path 2 first; path 5 waits for it");
    let p2 = c[0];
    n.path_up(p2.id, p2.inst, Instant::now());
    assert!(outputs(&mut n).0.is_empty());
    n.received(p2.id, p2.inst, map());
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [5]);
    // Path 0 never waits: nothing below it can take its slot.
    n.path_down(paths[0].id, paths[0].inst, DownReason::Closed, t2 + settle);
    n.handle_timeout(t2 + settle);
    let (c, s) = outputs(&mut n);
    assert_eq!(indexes(&c), [0]);
    assert_eq!(indexes(&s), [5], "path 5 was connecting: closed, it follows path 0 again");
}

/// In the VM our first connection was reset by the kernel's accept (its
/// slot was busy with its own connect): the two datagrams we had already
/// written on it were acked by its TCP and lost. Until the kernel shows it
/// took a connection, only maps and our probe go out on it.
#[test]
fn nothing_of_a_socket_goes_out_before_the_kernel_took_the_connection() {
    let mut n = node(ip(1));
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(1), 5000)).unwrap();
    let dst = SocketAddr::new(ip(2), 4000);
    for m in [b"m1", b"m2"] {
        n.send(s, Some(dst), &Payload::copy_from(m), &SendOptions::default()).unwrap();
    }
    let pull = |n: &mut Node, p: &PathInfo| {
        driver::outputs(n);
        let mut out = Vec::new();
        n.pull(p.id, p.inst, 1 << 20, &mut out);
        out.iter().map(|m| (m.header.kind(), m.payload.to_vec())).collect::<Vec<_>>()
    };
    let (c, _) = outputs(&mut n);
    let p0 = c[0];
    n.path_up(p0.id, p0.inst, Instant::now());
    let sent = pull(&mut n, &p0);
    let kinds: Vec<wire::Kind> = sent.iter().map(|m| m.0).collect();
    assert_eq!(kinds, [wire::Kind::CongMap, wire::Kind::ProbePing], "no datagram yet");
    // The kernel resets it (no free slot): nothing of ours is lost.
    let t = Instant::now();
    n.path_down(p0.id, p0.inst, DownReason::Closed, t);
    n.handle_timeout(t);
    let (c, _) = outputs(&mut n);
    let p0 = c[0];
    n.path_up(p0.id, p0.inst, Instant::now());
    assert!(pull(&mut n, &p0).iter().all(|m| m.0 != wire::Kind::Data));
    // Its map: it took this one.
    n.received(p0.id, p0.inst, map());
    let data: Vec<Vec<u8>> = pull(&mut n, &p0).into_iter().filter(|m| m.0 == wire::Kind::Data).map(|m| m.1).collect();
    assert_eq!(data, [b"m1".to_vec(), b"m2".to_vec()]);
}

/// A kernel's congestion map at read time `at_ms`, with `ports` congested.
fn map_at(ports: &[u16], at_ms: u64) -> RxMessage {
    let mut map = rds_core::cong::CongMap::new();
    for &p in ports {
        map.set(p);
    }
    RxMessage {
        rx_time_ns: Some(at_ms * 1_000_000),
        ..RxMessage::new(Header::cong_map(), Payload::copy_from(map.as_bytes()))
    }
}

/// A node whose socket (port 5000) sent to the kernel at ip(2), with two
/// paths up after the multipath handshake.
fn two_paths_up() -> (Node, SockId, PathInfo, PathInfo) {
    let mut n = node(ip(1));
    let s = n.socket();
    n.bind(s, SocketAddr::new(ip(1), 5000)).unwrap();
    n.send(s, Some(SocketAddr::new(ip(2), 4000)), &Payload::copy_from(b"x"), &SendOptions::default()).unwrap();
    let (c, _) = outputs(&mut n);
    let p0 = c[0];
    n.path_up(p0.id, p0.inst, Instant::now());
    outputs(&mut n);
    n.received(p0.id, p0.inst, pong(1));
    let (c, _) = outputs(&mut n);
    let p1 = c[0];
    assert_eq!(p1.id.index, 1);
    n.path_up(p1.id, p1.inst, Instant::now());
    outputs(&mut n);
    (n, s, p0, p1)
}

/// A 6.1 kernel sends each map update on whichever path transmits first:
/// in the VM rig its "port congested" map and its "uncongested" one 0.5 ms
/// later came on two TCP connections and were read in the other order,
/// which left the port congested for good. Two maps on different paths
/// read within 5 ms of each other, whose times are only bounds on their
/// arrival (read times here), keep a port congested only if both say so;
/// anything else applies as it comes.
#[test]
fn kernel_maps_on_two_paths_close_together_keep_only_what_both_congest() {
    let (mut n, s, p0, p1) = two_paths_up();
    let send = |n: &mut Node, port| {
        n.send(s, Some(SocketAddr::new(ip(2), port)), &Payload::copy_from(b"x"), &SendOptions::default())
    };
    let reordered = |n: &Node| n.counters().cong_update_reordered;

    // In order on one path: congested, then not, 1 ms apart.
    assert_eq!(n.received(p1.id, p1.inst, map_at(&[4000], 1000)), RecvOutcome::CongMap);
    assert_eq!(send(&mut n, 4000), Err(Errno::ENOBUFS));
    n.received(p1.id, p1.inst, map_at(&[], 1001));
    send(&mut n, 4000).unwrap();
    n.received(p1.id, p1.inst, map_at(&[4000], 1002));
    assert_eq!(send(&mut n, 4000), Err(Errno::ENOBUFS), "same path: order known");
    assert_eq!(reordered(&n), 0);

    // The kernel's "uncongested" (path 0) read before its earlier
    // "congested" (path 1), 0.5 ms apart: the port is free. 4001, congested
    // in both, stays congested.
    n.received(p0.id, p0.inst, map_at(&[4001], 2000));
    n.received(p1.id, p1.inst, RxMessage { rx_time_ns: Some(2_000_500_000), ..map_at(&[4000, 4001], 0) });
    assert_eq!(reordered(&n), 1);
    send(&mut n, 4000).unwrap();
    assert_eq!(send(&mut n, 4001), Err(Errno::ENOBUFS));

    // Far enough apart, another path's map applies as it comes.
    n.received(p0.id, p0.inst, map_at(&[4000], 2100));
    assert_eq!(send(&mut n, 4000), Err(Errno::ENOBUFS));
    send(&mut n, 4001).unwrap();
    assert_eq!(reordered(&n), 1);

    // A map without a read time (another transport) applies as it comes.
    n.received(p1.id, p1.inst, map());
    send(&mut n, 4000).unwrap();
    n.received(p0.id, p0.inst, RxMessage { rx_time_ns: None, ..map_at(&[4002], 0) });
    assert_eq!(send(&mut n, 4002), Err(Errno::ENOBUFS));
    assert_eq!(reordered(&n), 1);
}

/// With arrival times (rds-tcp: the kernel's receive stamp of a read that
/// drained the socket and ended with the map), maps apply in the order
/// they arrived, as a kernel receiver applies them, however close: the
/// kernel conformance's "congestion us->kernel" (us larger) lost the
/// port's congestion for good when the kernel's paths came up, its maps on
/// three paths within 2.7 ms, the last (0.9 ms after the one before) the
/// only one with the port congested.
#[test]
fn kernel_maps_apply_in_the_order_they_arrived() {
    let (mut n, s, p0, p1) = two_paths_up();
    let send = |n: &mut Node, port| {
        n.send(s, Some(SocketAddr::new(ip(2), port)), &Payload::copy_from(b"x"), &SendOptions::default())
    };
    let arrived = |ports: &[u16], at_us: u64| RxMessage {
        rx_time_ns: Some(at_us * 1000),
        rx_time_exact: true,
        ..map_at(ports, 0)
    };
    let read_by = |ports: &[u16], at_us: u64| RxMessage { rx_time_ns: Some(at_us * 1000), ..map_at(ports, 0) };
    let counts = |n: &Node| (n.counters().cong_update_reordered, n.counters().cong_update_stale);

    // The paths coming up: "uncongested", then "congested" 0.9 ms later
    // on the other path, arrival times known: congested.
    n.received(p0.id, p0.inst, arrived(&[], 73_700));
    n.received(p1.id, p1.inst, arrived(&[4000], 74_600));
    assert_eq!(send(&mut n, 4000), Err(Errno::ENOBUFS), "the later map holds");
    assert_eq!(counts(&n), (0, 0));

    // "Uncongested" (path 0) arrived at 80.6 ms, read first; "congested"
    // (path 1) read after it, with bytes after it (its time only a bound),
    // yet before 80.6 ms: it arrived first, stale.
    n.received(p0.id, p0.inst, arrived(&[], 80_600));
    send(&mut n, 4000).unwrap();
    n.received(p1.id, p1.inst, read_by(&[4000], 80_000));
    assert_eq!(counts(&n), (0, 1), "stale: arrived before the map applied");
    send(&mut n, 4000).unwrap();

    // A map whose time is only a bound, then one that arrived after that
    // bound, 0.2 ms later: it holds.
    n.received(p1.id, p1.inst, read_by(&[4001], 90_000));
    assert_eq!(send(&mut n, 4001), Err(Errno::ENOBUFS));
    n.received(p0.id, p0.inst, arrived(&[], 90_200));
    send(&mut n, 4001).unwrap();
    assert_eq!(counts(&n), (0, 1));

    // Two bounds close together: unknown, a port stays congested only if
    // both say so.
    n.received(p0.id, p0.inst, read_by(&[4001, 4002], 100_000));
    n.received(p1.id, p1.inst, read_by(&[4002], 100_300));
    send(&mut n, 4001).unwrap();
    assert_eq!(send(&mut n, 4002), Err(Errno::ENOBUFS));
    assert_eq!(counts(&n), (1, 1));

    // An arrival before the previous map's bound: the order is unknown.
    n.received(p0.id, p0.inst, arrived(&[4003], 100_200));
    assert_eq!(counts(&n), (2, 1));
    send(&mut n, 4002).unwrap();
    send(&mut n, 4003).unwrap();

    // On one path, the stream's order holds whatever the times.
    n.received(p0.id, p0.inst, arrived(&[4004], 100_100));
    assert_eq!(send(&mut n, 4004), Err(Errno::ENOBUFS));
    assert_eq!(counts(&n), (2, 1));
}

/// CI, resetall against a 6.1 kernel (us smaller): after a reset of every
/// path our path 0 came back and stayed alone for 43 s, the kernel sending
/// nothing on it, not even the map that shows it took it, and our side
/// nothing but its own map. Path 0's queue starts with retransmissions,
/// which keep their sequence numbers: the confirm probe cannot go ahead of
/// them (the kernel would then drop them as old), and they wait for the
/// confirmation. A path still unconfirmed after four checks (15 times
/// `confirm_probe_after`) is dropped and connects again; nothing of a
/// socket was on it, so nothing is lost.
#[test]
fn a_path_the_kernel_never_confirms_is_dropped_and_connects_again() {
    // The socket that sent "x" before the handshake keeps lane 0 (a new
    // one would take a free lane: `rds_core::mprds`, "Lanes").
    let (mut n, s, paths, c) = handshaken_socket(Duration::ZERO);
    let p0 = paths[0];
    let dst = SocketAddr::new(ip(2), 4000);
    for m in [&b"r1"[..], b"r2", b"r3"] {
        n.send(s, Some(dst), &Payload::copy_from(m), &SendOptions::default()).unwrap();
    }
    let on_wire: Vec<(wire::Kind, u16, u16)> =
        sent(&mut n, &p0).into_iter().filter(|f| f.0 == wire::Kind::Data).collect();
    assert_eq!(on_wire.len(), 4, "x before the handshake and r1..r3 on lane 0: {on_wire:?}");
    // Every path is reset (path 1 was connecting).
    let t = Instant::now();
    n.path_down(p0.id, p0.inst, DownReason::Closed, t);
    let (_, s1) = outputs(&mut n);
    assert_eq!(indexes(&s1), [1]);
    n.path_down(c[0].id, c[0].inst, DownReason::ShutdownDone, t);
    n.handle_timeout(t);
    let (c, _) = outputs(&mut n);
    assert_eq!(indexes(&c), [0]);
    let p0 = c[0];
    let t0 = t + Duration::from_millis(1);
    n.path_up(p0.id, p0.inst, t0);
    // No map comes: ours goes out (and our first probe again, unacked:
    // sent with RETRANSMITTED, which the kernel drops as old without an
    // answer); the socket's retransmissions wait.
    let first = sent(&mut n, &p0);
    assert_eq!(first[0], (wire::Kind::CongMap, 0, 0));
    assert!(first.iter().all(|f| f.0 != wire::Kind::Data), "{first:?}");
    // Twice: the kernel sends nothing on the second connection either.
    let after = NodeConfig::default().confirm_probe_after;
    let (mut p0, mut t0) = (p0, t0);
    for round in 1..=2u64 {
        let mut dropped = None;
        for _ in 0..8 {
            let Some(at) = n.poll_timeout() else { break };
            n.handle_timeout(at);
            let (_, s) = outputs(&mut n);
            if !s.is_empty() {
                assert_eq!(indexes(&s), [0]);
                dropped = Some(at);
                break;
            }
            let frames = sent(&mut n, &p0);
            assert!(frames.iter().all(|f| f.0 != wire::Kind::Data), "nothing of a socket before the kernel took it");
        }
        let at = dropped.expect("the unconfirmed path 0 is dropped");
        assert_eq!(at, t0 + 15 * after, "after four checks");
        assert_eq!(n.counters().mprds_confirm_drop, round);
        // It connects again at once.
        n.path_down(p0.id, p0.inst, DownReason::ShutdownDone, at);
        n.handle_timeout(at);
        let (c, _) = outputs(&mut n);
        assert_eq!(indexes(&c), [0]);
        p0 = c[0];
        t0 = at;
        n.path_up(p0.id, p0.inst, t0);
    }
    // This time the kernel's map comes: the retransmissions go out in
    // order, marked RETRANSMITTED, then the probes that ask for the path
    // count, one per connection of path 0 (three).
    n.received(p0.id, p0.inst, map());
    driver::outputs(&mut n);
    let mut out = Vec::new();
    n.pull(p0.id, p0.inst, 1 << 20, &mut out);
    let data: Vec<(Vec<u8>, bool)> = out
        .iter()
        .filter(|m| m.header.kind() == wire::Kind::Data)
        .map(|m| (m.payload.to_vec(), m.header.flags & wire::flags::RETRANSMITTED != 0))
        .collect();
    let want: Vec<(Vec<u8>, bool)> = [&b"x"[..], b"r1", b"r2", b"r3"].iter().map(|m| (m.to_vec(), true)).collect();
    assert_eq!(data, want);
    let new_probes = out
        .iter()
        .filter(|m| m.header.kind() == wire::Kind::ProbePing && m.header.flags & wire::flags::RETRANSMITTED == 0)
        .count();
    assert_eq!(new_probes, 3);
}
