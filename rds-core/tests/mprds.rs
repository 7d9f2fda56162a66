//! Multipath RDS over TCP: the probe handshake (`rds_send_probe`,
//! `rds_recv_hs_exthdrs`, `rds_start_mprds`), lane selection, the
//! pre-handshake path-0 rule with its order guarantee, and renegotiation.

use rds_core::driver;
use rds_core::wire::{self, Ext, Header, Kind, PROBE_PORT};
use rds_core::*;
use rds_testkit::net::{Net, config, ip, make_node, sa};
use std::time::Instant;

fn active(net: &Net, i: usize, peer: usize) -> Vec<(u8, PathState)> {
    (0..8).map(|k| (k, net.nodes[i].path_state(net.path(i, peer, k)).unwrap())).collect()
}

#[test]
fn eight_paths_are_negotiated_and_opened_by_the_smaller_address() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    for (i, peer) in [(0, 1), (1, 0)] {
        for k in 0..8u8 {
            let p = net.path(i, peer, k);
            assert_eq!(net.nodes[i].path_state(p), Some(PathState::Up), "node {i} path {k}");
            assert_eq!(net.nodes[i].path_info(p).unwrap().npaths, 8);
        }
    }
    // Only node 0 connected; node 1 accepted each path into the same slot.
    assert!(net.connects.iter().all(|(i, ..)| *i == 0));
    assert_eq!(net.connects.len(), 8);
    for k in 0..8u8 {
        let l = net.links[&(0, net.path(0, 1, k))];
        assert_eq!(l.peer_path.index, k);
    }
    // The probe and the pong each carried NPATHS 8 (and nothing else:
    // these tests pin the mainline wire, `rds_testkit::net::config`).
    let probe = net.sent_by(0).into_iter().find(|m| m.header.kind() == Kind::ProbePing).unwrap();
    assert_eq!(probe.header.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8)]);
    assert_eq!(probe.path.index, 0);
    let pong = net.sent_by(1).into_iter().find(|m| m.header.kind() == Kind::ProbePong).unwrap();
    assert_eq!(pong.header.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8)]);
    assert_eq!(pong.path.index, 0);
    assert_eq!(net.drain_payloads(1, b), vec![b"x".to_vec()]);
}

/// A node at 127.0.0.2 with a path 0 accepted from a hand-driven peer at
/// 127.0.0.1 (the smaller address connects). Returns the path and instance.
fn accepted_from_fake_peer(cfg: NodeConfig) -> (Node, PathId, u64) {
    let mut n = make_node(cfg, ip(2), TransportKind::Tcp);
    let info = match n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) {
        Accept::Path(info) => info,
        other => panic!("{other:?}"),
    };
    assert_eq!(info.id.index, 0);
    (n, info.id, info.inst)
}

/// Pulls everything queued on a path.
fn pull_all(n: &mut Node, p: PathId, inst: u64) -> Vec<TxMessage> {
    let mut out = Vec::new();
    while n.pull(p, inst, 1 << 20, &mut out) {}
    out
}

fn rx(h: Header) -> RxMessage {
    RxMessage::new(h, Payload::empty())
}

#[test]
fn probe_without_npaths_means_a_single_path() {
    let (mut n, p0, inst) = accepted_from_fake_peer(config(1));
    let first = pull_all(&mut n, p0, inst);
    let kinds: Vec<Kind> = first.iter().map(|m| m.header.kind()).collect();
    assert_eq!(kinds, [Kind::CongMap, Kind::ProbePing]);
    // The legacy peer's probe carries no extension header.
    let mut ping = Header::data(1, 0, 0);
    ping.sequence = 1;
    assert_eq!(n.received(p0, inst, rx(ping)), RecvOutcome::Ping);
    assert_eq!(n.path_info(p0).unwrap().npaths, 1);
    // The pong still announces our 8 paths.
    let out = pull_all(&mut n, p0, inst);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].header.kind(), Kind::ProbePong);
    assert_eq!((out[0].header.sport, out[0].header.dport), (0, 1));
    assert_eq!(out[0].header.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8)]);
    // Every socket's messages go on path 0; no other path is opened.
    let mut socks = Vec::new();
    for port in 4000..4008u16 {
        let s = n.socket();
        n.bind(s, sa(2, port)).unwrap();
        n.send(s, Some(sa(1, 5000)), &Payload::copy_from(&port.to_be_bytes()), &SendOptions::default()).unwrap();
        socks.push(s);
    }
    let mut kicked = Vec::new();
    driver::for_each(&mut n, |_, o| match o {
        Output::Kick(info) => kicked.push(info.id.index),
        Output::Connect(info) => panic!("no connect expected: {info:?}"),
        _ => {}
    });
    assert_eq!(kicked, [0]);
    let out = pull_all(&mut n, p0, inst);
    let sports: Vec<u16> = out.iter().map(|m| m.header.sport).collect();
    assert_eq!(sports, (4000..4008).collect::<Vec<_>>());
    let seqs: Vec<u64> = out.iter().map(|m| m.header.sequence).collect();
    assert_eq!(seqs, (3..11).collect::<Vec<_>>(), "after our probe (1) and pong (2)");
    let conn = p0.conn;
    for port in 4000..4008u16 {
        assert_eq!(n.lane_of(conn, port), 0);
    }
}

#[test]
fn pong_without_npaths_means_a_single_path() {
    let (mut n, p0, inst) = accepted_from_fake_peer(config(1));
    pull_all(&mut n, p0, inst);
    let mut pong = Header::data(0, 1, 0);
    pong.sequence = 1;
    assert_eq!(n.received(p0, inst, rx(pong)), RecvOutcome::ProbePong);
    assert_eq!(n.path_info(p0).unwrap().npaths, 1);
    // A pong is not answered.
    assert!(pull_all(&mut n, p0, inst).is_empty());
    // A later NPATHS 0 is also taken as 1.
    let mut ping = Header::data(1, 0, 0);
    ping.sequence = 2;
    ping.push_extension(Ext::Npaths(0)).unwrap();
    n.received(p0, inst, rx(ping));
    assert_eq!(n.path_info(p0).unwrap().npaths, 1);
    // NPATHS above 8 is capped at 8.
    let mut ping = Header::data(1, 0, 0);
    ping.sequence = 3;
    ping.push_extension(Ext::Npaths(64)).unwrap();
    n.received(p0, inst, rx(ping));
    assert_eq!(n.path_info(p0).unwrap().npaths, 8);
}

#[test]
fn peer_advertising_four_paths_gives_four() {
    let mut cfg1 = config(1);
    cfg1.npaths = 4;
    let mut net = Net::with_configs(vec![config(0), cfg1], TransportKind::Tcp);
    let b = net.bound(1, 4000);
    let socks: Vec<SockId> = (5000..5008).map(|p| net.bound(0, p)).collect();
    net.send(0, socks[0], sa(2, 4000), b"first").unwrap();
    net.run();
    let pong = net.sent_by(1).into_iter().find(|m| m.header.kind() == Kind::ProbePong).unwrap();
    assert_eq!(pong.header.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(4)]);
    let up = [PathState::Up; 4];
    let st = active(&net, 0, 1);
    assert_eq!(st.iter().map(|s| s.1).take(4).collect::<Vec<_>>(), up);
    assert!(st[4..].iter().all(|s| s.1 == PathState::Down), "{st:?}");
    assert_eq!(net.connects.len(), 4);
    assert_eq!(net.nodes[0].path_info(net.path(0, 1, 0)).unwrap().npaths, 4);
    assert_eq!(net.nodes[1].path_info(net.path(1, 0, 0)).unwrap().npaths, 4);
    // Lanes: port % 4.
    net.wire.clear();
    for (k, s) in socks.iter().enumerate() {
        net.send(0, *s, sa(2, 4000), &[k as u8]).unwrap();
    }
    net.run();
    let mut lanes: Vec<(u16, u8)> = net.data_sent_by(0).iter().map(|m| (m.header.sport, m.path.index)).collect();
    lanes.sort();
    assert_eq!(lanes, (5000..5008u16).map(|p| (p, (p % 4) as u8)).collect::<Vec<_>>());
    assert_eq!(net.drain_payloads(1, b).len(), 9);
}

#[test]
fn lanes_are_chosen_by_bound_port_and_number_per_path() {
    let mut net = Net::new(2);
    let b = net.bound(1, 4003);
    let socks: Vec<SockId> = (5000..5008).map(|p| net.bound(0, p)).collect();
    net.send(0, socks[0], sa(2, 4003), b"hs").unwrap();
    net.run();
    net.wire.clear();
    for round in 0..2u8 {
        for s in &socks {
            net.send(0, *s, sa(2, 4003), &[round]).unwrap();
        }
    }
    net.send(1, b, sa(1, 5001), b"reply").unwrap();
    net.run();
    let got: Vec<(u16, u8, u64)> =
        net.data_sent_by(0).iter().map(|m| (m.header.sport, m.path.index, m.header.sequence)).collect();
    let mut expect = Vec::new();
    for round in 0..2u64 {
        for p in 5000..5008u16 {
            let lane = (p % 8) as u8;
            // Path 0 already carried the probe, the pong and "hs".
            let seq = if lane == 0 { 4 + round } else { 1 + round };
            expect.push((p, lane, seq));
        }
    }
    got.iter().for_each(|g| assert!(expect.contains(g), "{g:?} not in {expect:?}"));
    assert_eq!(got.len(), 16);
    // Per path the order is the send order.
    for lane in 0..8u8 {
        let seqs: Vec<u64> = got.iter().filter(|g| g.1 == lane).map(|g| g.2).collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "lane {lane}: {seqs:?}");
    }
    // The reply from port 4003 went on path 0, not its port's lane (3):
    // its socket first heard from node 0 on path 0 ("hs", sent before the
    // count was known, from port 5000, whose lane is 0), which offers the
    // lane of the sender's port (rds-core's mprds docs, "Lanes"), and no
    // other socket of node 1 held a lane.
    let reply = net.data_sent_by(1);
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0].path.index, 0);
    assert_eq!(net.drain_payloads(1, b).len(), 17);
}

/// The path node `node` sent the message `what` on (sent once).
fn lane(net: &Net, node: usize, what: &[u8]) -> u8 {
    let m: Vec<u8> = net.data_sent_by(node).iter().filter(|m| &m.payload[..] == what).map(|m| m.path.index).collect();
    assert_eq!(m.len(), 1, "{what:?} sent once");
    m[0]
}

/// A socket's lane to a peer is fixed by its first message either way
/// once the path count is known, among the lanes the fewest of the node's
/// sockets hold (`rds_core` mprds docs, "Lanes"): one that first receives,
/// off path 0, answers on the lane the request came on if that is one of
/// them (and keeps it for every later message to that peer, to any port);
/// otherwise, and for one that sends first, its port's lane if that is one
/// of them, else the lowest-numbered of them; a message on path 0 offers
/// the lane of its sender's port, a socket that sent before the count was
/// known keeps its port's lane, and a closed socket's lane is free again. Every message arrives
/// once, in order.
#[test]
fn a_socket_answers_on_the_lane_it_first_heard_on_when_no_other_holds_it() {
    let mut net = Net::new(2);
    let hs = net.bound(0, 5003); // its port's lane: 3
    let a = net.bound(0, 5001); // 1
    let d = net.bound(0, 5002); // 2
    let f = net.bound(0, 5010); // 2
    let b = net.bound(1, 4003); // 3
    let c = net.bound(1, 4004); // 4
    let e = net.bound(1, 4005); // 5
    let g = net.bound(1, 4009); // 1
    let h = net.bound(1, 4010); // 2
    net.send(0, hs, sa(2, 4003), b"hs").unwrap();
    net.run();
    net.drain_payloads(1, b);
    net.wire.clear();
    let mut step = |node: usize, s: SockId, to: u16, what: &[u8]| {
        net.send(node, s, sa(2 - node as u8, to), what).unwrap();
        net.run();
    };
    step(1, c, 5003, b"c1"); // c sends first
    step(0, d, 4005, b"d1");
    step(1, e, 5002, b"e1"); // e heard d on lane 2 first
    step(1, e, 5001, b"e2");
    step(0, a, 4004, b"a1"); // a heard e on lane 2 first, which d holds
    step(1, c, 5001, b"c2"); // c heard a on lane 1, but sent first
    step(1, b, 5003, b"b1"); // b heard hs (port 5003) on path 0
    step(0, hs, 4003, b"hs2"); // hs sent before the count was known
    step(0, f, 4009, b"f1"); // f's port lane is d's
    step(1, g, 5010, b"g1"); // g heard f (port 5010) on path 0
    step(1, h, 5010, b"h1"); // h's port lane is e's
    assert_eq!(lane(&net, 1, b"c1"), 4, "c sent first: its port's lane");
    assert_eq!(lane(&net, 0, b"d1"), 2, "d sent first");
    assert_eq!(lane(&net, 1, b"e1"), 2, "e heard d on lane 2 first, which no socket of node 1 held");
    assert_eq!(lane(&net, 1, b"e2"), 2, "e keeps that lane to every port of node 0");
    assert_eq!(lane(&net, 0, b"a1"), 1, "a heard e on lane 2, which d holds: its port's lane");
    assert_eq!(lane(&net, 1, b"c2"), 4, "c keeps its port's lane after hearing a on lane 1");
    assert_eq!(lane(&net, 1, b"b1"), 3, "b heard hs on path 0: the lane of hs's port, free");
    assert_eq!(lane(&net, 0, b"hs2"), 3, "hs sent before the count was known: its port's lane");
    assert_eq!(lane(&net, 0, b"f1"), 0, "f's port's lane is d's: the lowest free one");
    assert_eq!(lane(&net, 1, b"g1"), 1, "g heard f on path 0: the lane of f's port (2) is e's: its own port's");
    assert_eq!(lane(&net, 1, b"h1"), 0, "h's port's lane is e's: the lowest free one");
    let mut got = |node, s| net.drain_payloads(node, s);
    assert_eq!(got(0, hs), vec![b"c1".to_vec(), b"b1".to_vec()]);
    assert_eq!(got(0, d), vec![b"e1".to_vec()]);
    assert_eq!(got(0, a), vec![b"e2".to_vec(), b"c2".to_vec()]);
    assert_eq!(got(0, f), vec![b"g1".to_vec(), b"h1".to_vec()]);
    assert_eq!(got(1, e), vec![b"d1".to_vec()]);
    assert_eq!(got(1, b), vec![b"hs2".to_vec()]);
    assert_eq!(got(1, c), vec![b"a1".to_vec()]);
    assert_eq!(got(1, g), vec![b"f1".to_vec()]);
    // e closes: its lane (2) is free again for the next socket of node 1
    // that fixes one; one whose port's lane is 2 takes it.
    net.nodes[1].close(e);
    let i = net.bound(1, 4018); // 2
    net.send(1, i, sa(1, 5002), b"i1").unwrap();
    net.run();
    assert_eq!(lane(&net, 1, b"i1"), 2, "i's port's lane, free again");
    assert_eq!(net.drain_payloads(0, d), vec![b"i1".to_vec()]);
}

/// A socket that sent before the path count was known holds its port's
/// lane from the moment the count is known, counted like a lane fixed
/// later: another socket whose first message arrives on that lane (here a
/// request on path 0 from a port whose lane is 0) takes its own port's
/// lane instead of sharing it (the kernel conformance's mprds scenario,
/// "us larger", once carried two sockets' messages on path 0 and nothing
/// on path 1 that way).
#[test]
fn a_socket_that_sent_before_the_count_keeps_its_lane_to_itself() {
    let mut net = Net::new(2);
    let s0 = net.bound(1, 8000); // its port's lane: 0
    let s1 = net.bound(1, 8001); // 1
    let t = net.bound(0, 7008); // 0
    net.send(1, s0, sa(1, 7008), b"before").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(0, t), vec![b"before".to_vec()]);
    net.wire.clear();
    net.send(0, t, sa(2, 8001), b"req").unwrap();
    net.run();
    net.send(1, s1, sa(1, 7008), b"answer").unwrap();
    net.send(1, s0, sa(1, 7008), b"after").unwrap();
    net.run();
    let req = net.data_sent_by(0);
    assert_eq!((req.len(), req[0].path.index), (1, 0), "t's request on path 0");
    assert_eq!(lane(&net, 1, b"after"), 0, "s0 sent before the count was known: its port's lane");
    assert_eq!(lane(&net, 1, b"answer"), 1, "s1 heard t on path 0, whose lane s0 holds: its own port's");
    assert_eq!(net.drain_payloads(1, s1), vec![b"req".to_vec()]);
    assert_eq!(net.drain_payloads(0, t), vec![b"answer".to_vec(), b"after".to_vec()]);
}

/// Eight sockets a side, each answering one of the peer's eight (as the
/// kernel conformance's mprds scenario pairs them), fix eight distinct
/// lanes whatever the order in which they first send or first hear, even
/// where the peer's lanes reach this node on other paths than its ports'
/// lanes (a kernel numbers the paths it accepts by arrival): every path
/// carries one socket's messages each way.
#[test]
fn sockets_that_answer_and_sockets_that_send_first_spread_over_every_lane() {
    for order in 0..8u16 {
        let mut net = Net::new(2);
        let ours: Vec<SockId> = (0..8).map(|k| net.bound(1, 8000 + k)).collect();
        // Node 0's lanes for its ports 7000+k are 7000+k mod 8: rotated
        // against node 1's port lanes, as a peer whose path k arrived as
        // our path j would be.
        let theirs: Vec<SockId> = (0..8).map(|k| net.bound(0, 7000 + (k + order) % 8)).collect();
        net.send(0, theirs[0], sa(2, 8000), b"hs").unwrap();
        net.run();
        net.drain_payloads(1, ours[0]);
        net.wire.clear();
        // Half of node 1's sockets send first, the other half hear first,
        // interleaved.
        for k in 0..8usize {
            if (k + usize::from(order)) % 2 == 0 {
                net.send(1, ours[k], sa(1, 7000 + (k as u16 + order) % 8), &[k as u8]).unwrap();
            } else {
                net.send(0, theirs[k], sa(2, 8000 + k as u16), &[k as u8]).unwrap();
            }
            net.run();
        }
        for (k, s) in ours.iter().enumerate() {
            net.send(1, *s, sa(1, 7000 + (k as u16 + order) % 8), &[k as u8, 1]).unwrap();
        }
        net.run();
        let mut lanes: Vec<u8> =
            net.data_sent_by(1).iter().filter(|m| m.payload.len() == 2).map(|m| m.path.index).collect();
        lanes.sort();
        assert_eq!(lanes, (0..8).collect::<Vec<u8>>(), "order {order}");
        for (k, s) in theirs.iter().enumerate() {
            let want: Vec<Vec<u8>> = if (k + usize::from(order)) % 2 == 0 {
                vec![vec![k as u8], vec![k as u8, 1]]
            } else {
                vec![vec![k as u8, 1]]
            };
            assert_eq!(net.drain_payloads(0, *s), want, "order {order}, socket {k}");
        }
    }
}

/// Node 0's data messages so far: (payload, path index).
fn sent(net: &Net) -> Vec<(Vec<u8>, u8)> {
    net.data_sent_by(0).iter().map(|m| (m.payload.to_vec(), m.path.index)).collect()
}

#[test]
fn pre_handshake_messages_stay_on_path_0_and_hold_the_lane_until_the_peer_read_them() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5001); // lane 1 once 8 paths are known
    let b = net.bound(1, 4000);
    // Path 0 of node 0 is slow: nothing is pulled from it yet.
    net.frozen.insert((0, 0));
    net.send(0, a, sa(2, 4000), b"m1").unwrap();
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    net.run();
    // The peer's own probe told node 0 the path count; node 0 opens the
    // other paths in order. The peer keeps path 1's connection waiting
    // (Accept::Defer) until it heard our probe: before that it could as
    // well be our path 0 again.
    assert_eq!(net.nodes[0].path_info(net.path(0, 1, 0)).unwrap().npaths, 8);
    assert_eq!(net.nodes[0].path_state(net.path(0, 1, 1)), Some(PathState::Connecting));
    assert_eq!(net.deferred.len(), 1);
    // m3, m4 belong to lane 1, but m1, m2 are still unacked on path 0: held.
    net.send(0, a, sa(2, 4000), b"m3").unwrap();
    net.send(0, a, sa(2, 4000), b"m4").unwrap();
    net.run();
    assert_eq!(net.nodes[0].counters().mprds_lane_hold, 2);
    assert!(net.data_sent_by(0).is_empty(), "nothing went out yet");
    assert!(net.nodes[1].recv(b, false).is_err());
    // Path 0 drains: m1, m2 arrive and are acked, but an ack says only
    // that the peer's TCP has them, and the peer, which cannot answer on
    // its path 0 yet, may read path 1 first: m3, m4 wait for the pong to
    // a probe ping sent after m1, m2.
    net.frozen.insert((1, 0));
    net.thaw(0, 0);
    net.run();
    assert_eq!(sent(&net), [(b"m1".to_vec(), 0), (b"m2".to_vec(), 0)]);
    assert_eq!(net.nodes[0].counters().mprds_read_proof, 1);
    let pings = net.wire.iter().filter(|w| w.from == 0 && w.path.index == 0 && w.header.kind() == Kind::ProbePing);
    let last = pings.map(|w| w.header.sequence).next_back().unwrap();
    let m2 = net.data_sent_by(0)[1].header.sequence;
    assert!(last > m2, "the proof's ping ({last}) went after m2 ({m2})");
    // The peer answers: m3, m4 go on path 1.
    net.thaw(1, 0);
    net.run();
    assert_eq!(sent(&net), [(b"m1".to_vec(), 0), (b"m2".to_vec(), 0), (b"m3".to_vec(), 1), (b"m4".to_vec(), 1)]);
    assert_eq!(net.drain_payloads(1, b), [b"m1".to_vec(), b"m2".to_vec(), b"m3".to_vec(), b"m4".to_vec()]);
    // From now on the lane is used directly.
    net.send(0, a, sa(2, 4000), b"m5").unwrap();
    net.run();
    assert_eq!(net.data_sent_by(0).last().unwrap().path.index, 1);
    assert_eq!(net.nodes[0].counters().mprds_lane_hold, 2);
}

/// A peer that never answers a probe ping (`ping_enable` off, or its path
/// 0 cannot send): the lane-0 hold ends at the acks after three checks of
/// path 0 without a pong (`rds_core::lane0::PROOF_CHECKS_MAX`), not never.
#[test]
fn a_lane_hold_the_peer_never_proves_ends_after_three_checks() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5001); // lane 1 once 8 paths are known
    let b = net.bound(1, 4000);
    net.frozen.insert((0, 0));
    net.send(0, a, sa(2, 4000), b"m1").unwrap();
    net.run();
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    // m1 is acked, but the peer's path 0 sends nothing from now on.
    net.frozen.insert((1, 0));
    net.thaw(0, 0);
    net.run();
    assert_eq!(sent(&net), [(b"m1".to_vec(), 0)]);
    // Checks at 0.5 s (at most: it counts from the last time a caller gave
    // the node), then 1 s and 2 s later: m2 still waits after 1.4 s ...
    for _ in 0..14 {
        net.advance(100);
        net.run();
    }
    assert_eq!(sent(&net), [(b"m1".to_vec(), 0)]);
    assert_eq!(net.nodes[0].counters().mprds_proof_unanswered, 0);
    // ... and goes on its lane by 3.6 s, each check having asked again.
    for _ in 0..22 {
        net.advance(100);
        net.run();
    }
    assert_eq!(sent(&net), [(b"m1".to_vec(), 0), (b"m2".to_vec(), 1)]);
    assert_eq!(net.nodes[0].counters().mprds_proof_unanswered, 1);
    assert!(net.nodes[0].counters().mprds_read_proof >= 3);
    assert_eq!(net.drain_payloads(1, b), [b"m1".to_vec(), b"m2".to_vec()]);
}

#[test]
fn lane_hold_waits_for_the_acks_not_just_the_transmission() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5002);
    let b = net.bound(1, 4000);
    net.hold_acks = true;
    net.send(0, a, sa(2, 4000), b"early").unwrap();
    net.run();
    net.send(0, a, sa(2, 4000), b"late").unwrap();
    net.run();
    assert_eq!(net.data_sent_by(0).len(), 1, "late is held while early is unacked");
    assert_eq!(net.drain_payloads(1, b), [b"early".to_vec()]);
    net.hold_acks = false;
    net.flush_acks();
    net.run();
    let sent = net.data_sent_by(0);
    assert_eq!(sent.len(), 2);
    assert_eq!((&sent[1].payload[..], sent[1].path.index), (&b"late"[..], 2));
    assert_eq!(net.drain_payloads(1, b), [b"late".to_vec()]);
    // Another socket on the same lane was never held.
    assert_eq!(net.nodes[0].counters().mprds_lane_hold, 1);
}

#[test]
fn npaths_is_renegotiated_after_all_paths_went_down() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5005);
    net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"one").unwrap();
    net.run();
    assert_eq!(net.nodes[0].path_info(net.path(0, 1, 5)).unwrap().npaths, 8);
    // "two" is transmitted on path 5 and never acked.
    net.hold_acks = true;
    net.send(0, a, sa(2, 4000), b"two").unwrap();
    net.run();
    assert_eq!(net.data_sent_by(0).last().unwrap().path.index, 5);
    // The peer comes back as a new instance supporting 4 paths.
    let mut cfg1 = config(1);
    cfg1.npaths = 4;
    net.hold_acks = false;
    net.restart(1, cfg1);
    let b = net.bound(1, 4000);
    assert!(active(&net, 0, 1).iter().all(|s| s.1 == PathState::Down));
    assert_eq!(net.nodes[0].path_info(net.path(0, 1, 0)).unwrap().npaths, 0, "forgotten");
    let mark = net.wire.len();
    net.advance(0);
    net.run();
    // A new probe on the new path 0, answered with NPATHS 4.
    let probes = net.wire[mark..].iter().filter(|m| m.from == 0 && m.header.kind() == Kind::ProbePing).count();
    assert_eq!(probes, 1);
    assert_eq!(net.nodes[0].counters().mprds_probe_sent, 2);
    assert_eq!(net.nodes[0].path_info(net.path(0, 1, 0)).unwrap().npaths, 4);
    let st = active(&net, 0, 1);
    assert!(st[..4].iter().all(|s| s.1 == PathState::Up), "{st:?}");
    assert!(st[4..].iter().all(|s| s.1 == PathState::Down), "{st:?}");
    // "two" sat on path 5, which is no longer used: it moved to path 0.
    let two = net.wire[mark..].iter().find(|m| &m.payload[..] == b"two").expect("two resent");
    assert_eq!(two.path.index, 0);
    assert!(!two.header.is_retransmitted(), "renumbered on path 0");
    assert_eq!(net.drain_payloads(1, b), [b"two".to_vec()]);
    // New messages use lane 5 % 4 = 1.
    net.send(0, a, sa(2, 4000), b"three").unwrap();
    net.run();
    assert_eq!(net.data_sent_by(0).last().unwrap().path.index, 1);
    assert_eq!(net.drain_payloads(1, b), [b"three".to_vec()]);
}

/// rds-sim seed 4989 (a lane hold's timing): the larger side, which
/// connects path 0 only (to poke the peer) and only with something queued,
/// saw its peer's connections close, path 0 first with nothing queued,
/// then a lane with an unacked message that went back on its queue. No
/// path was to connect again, and the message waited for good. The lane
/// now pokes through path 0.
#[test]
fn the_larger_side_pokes_through_path_0_when_only_a_lane_holds_messages() {
    let mut net = Net::new(2);
    let a = net.bound(0, 4000);
    let b = net.bound(1, 5001); // lane 1 of 8 on the larger side
    net.send(1, b, sa(1, 4000), b"one").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(0, a), [b"one".to_vec()]);
    net.send(1, b, sa(1, 4000), b"two").unwrap();
    net.run();
    assert_eq!(net.data_sent_by(1).last().unwrap().path.index, 1, "two went on the lane");
    // Path 0 closes with nothing queued; "three" goes on the lane, and the
    // smaller node dies before acking it.
    net.cut(1, net.path(1, 0, 0));
    net.hold_acks = true;
    net.send(1, b, sa(1, 4000), b"three").unwrap();
    net.run();
    assert_eq!(net.data_sent_by(1).last().unwrap().path.index, 1, "three went on the lane");
    let before = net.connects.iter().filter(|c| c.0 == 1).count();
    net.restart(0, config(0));
    net.hold_acks = false;
    let conn = net.conn(1, 0);
    assert_eq!(net.nodes[1].path_state(PathId { conn, index: 0 }), Some(PathState::Down));
    for _ in 0..50 {
        net.advance(100);
        net.run();
    }
    let after: Vec<_> = net.connects.iter().filter(|c| c.0 == 1).skip(before).map(|c| c.1.id.index).collect();
    assert_eq!(after.first(), Some(&0), "the larger side connected path 0: {after:?}");
}

/// rds-sim seed 1243463: a node whose connection the peer opened (it
/// only accepted: no path of its own came up, no timer had fired) gets a
/// lane-0 hold when the peer's TCP acks its message on path 0; the hold's
/// check (`lane0::PROOF_CHECK_AFTER`) starts from the latest time the node
/// was given, and it had none: no check was armed, and when the pong to
/// the proof's ping never came the lane waited for ever. The accept gives
/// the time.
#[test]
fn a_hold_on_an_accepted_connection_arms_its_check() {
    let t0 = Instant::now();
    let (mut n, p0, a) = accepted_from_fake_peer(config(1));
    let s = n.socket();
    n.bind(s, sa(2, 5001)).unwrap(); // lane 1 of 8
    n.send(s, Some(sa(1, 4000)), &Payload::copy_from(b"m1"), &SendOptions::default()).unwrap();
    let out = pull_all(&mut n, p0, a);
    let m1 = out.iter().find(|m| &m.payload[..] == b"m1").unwrap().header.sequence;
    // The peer's probe tells us the count: m1 holds the socket's lane.
    let mut ping = Header::data(PROBE_PORT, 0, 0);
    ping.sequence = 1;
    let _ = ping.push_extension(Ext::Npaths(8));
    assert_eq!(n.received(p0, a, rx(ping)), RecvOutcome::Ping);
    assert_eq!(n.poll_timeout(), None, "no timer before the ack");
    n.acked(p0, a, m1);
    let check = n.poll_timeout().expect("the hold's check is armed");
    assert!(check >= t0 + rds_core::lane0::PROOF_CHECK_AFTER, "{:?} after the accept", check - t0);
}

/// A probe's pong that comes on the next connection of path 0 answers a
/// ping of the connection before: it proves the peer read what came
/// before *that* ping, not before the pings sent since. The peer resends
/// an answer it could not deliver on the old connection (every message it
/// queued is retransmitted), so a pong on the new connection may be the
/// answer to an old ping. Taken for the answer to the newest ping, it
/// ended a lane-0 hold while the held message, resent on the new
/// connection and acked by the peer's TCP, was still unread there: the
/// lane's next message could be read first (faults.rs's
/// `all_to_all_100k_read_by_the_receivers_with_paths_cut`, once: ten
/// messages per flow out of order).
#[test]
fn a_pong_to_a_ping_of_the_connection_before_proves_nothing_sent_after_that_ping() {
    let (mut n, p0, a) = accepted_from_fake_peer(config(1));
    let s = n.socket();
    n.bind(s, sa(2, 5001)).unwrap(); // lane 1 of 8
    let dst = Some(sa(1, 4000));
    let send = |n: &mut Node, what: &[u8]| n.send(s, dst, &Payload::copy_from(what), &SendOptions::default()).unwrap();
    // Before the count is known: our probe, then m1 on path 0.
    send(&mut n, b"m1");
    let out = pull_all(&mut n, p0, a);
    let probe = out.iter().find(|m| m.header.kind() == Kind::ProbePing).unwrap().header.sequence;
    let m1 = out.iter().find(|m| &m.payload[..] == b"m1").unwrap().header.sequence;
    assert!(probe < m1);
    // The peer's own probe tells us the count (8); its answer to ours
    // (seq 2) never reaches us on this connection.
    let mut ping = Header::data(PROBE_PORT, 0, 0);
    ping.sequence = 1;
    let _ = ping.push_extension(Ext::Npaths(8));
    assert_eq!(n.received(p0, a, rx(ping)), RecvOutcome::Ping);
    assert_eq!(n.path_info(p0).unwrap().npaths, 8);
    // The peer opens path 1; m2 belongs to lane 1 and waits for m1.
    let p1 = match n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) {
        Accept::Path(info) => info,
        other => panic!("{other:?}"),
    };
    assert_eq!(p1.id.index, 1);
    n.path_up(p1.id, p1.inst, std::time::Instant::now());
    send(&mut n, b"m2");
    let lane = |n: &mut Node| -> Vec<Vec<u8>> {
        pull_all(n, p1.id, p1.inst).iter().filter(|m| m.header.dport == 4000).map(|m| m.payload.to_vec()).collect()
    };
    assert!(lane(&mut n).is_empty());
    // Path 0's connection dies with m1 unacked (the probe was acked: the
    // peer had it). The next connection resends m1, and the peer's TCP
    // acks it: the hold now waits for the proof, a fresh ping after m1.
    n.acked(p0, a, probe);
    n.path_down(p0, a, DownReason::Closed, std::time::Instant::now());
    let b = match n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) {
        Accept::Path(info) => info,
        other => panic!("{other:?}"),
    };
    assert_eq!(b.id, p0);
    n.path_up(p0, b.inst, std::time::Instant::now());
    let resent = pull_all(&mut n, p0, b.inst);
    assert!(resent.iter().any(|m| &m.payload[..] == b"m1" && m.header.sequence == m1), "m1 resent");
    n.acked(p0, b.inst, m1);
    let proof: Vec<u64> = pull_all(&mut n, p0, b.inst)
        .iter()
        .filter(|m| m.header.kind() == Kind::ProbePing)
        .map(|m| m.header.sequence)
        .collect();
    assert!(proof.iter().any(|&q| q > m1), "a ping after m1 asks for the proof: {proof:?}");
    assert!(lane(&mut n).is_empty());
    // The peer's answer to our first probe, resent on the new connection:
    // it read up to that probe, not m1. m2 still waits.
    let mut old_pong = Header::data(0, PROBE_PORT, 0);
    old_pong.sequence = 2;
    old_pong.flags |= wire::flags::RETRANSMITTED;
    let _ = old_pong.push_extension(Ext::Npaths(8));
    assert_eq!(n.received(p0, b.inst, rx(old_pong)), RecvOutcome::ProbePong);
    assert!(lane(&mut n).is_empty(), "m2 went on its lane on the old ping's answer");
    // The answer to the proof's ping: m1 was read, m2 goes.
    let mut pong = Header::data(0, PROBE_PORT, 0);
    pong.sequence = 3;
    assert_eq!(n.received(p0, b.inst, rx(pong)), RecvOutcome::ProbePong);
    assert_eq!(lane(&mut n), [b"m2".to_vec()]);
}
