//! Reconnect and retransmission: `rds_queue_reconnect` backoff, who
//! reconnects, `rds_send_path_reset` (RETRANSMITTED), and the receiver's
//! duplicate rule in `rds_recv_incoming`.

use std::time::Duration;

use rds_core::wire::{Header, flags};
use rds_core::*;
use rds_testkit::net::{Net, config, ip, make_node, sa};
use std::time::Instant;

#[test]
fn first_reconnect_is_immediate_then_random_below_a_doubling_bound() {
    let mut net = Net::new(2);
    net.refuse.insert(1);
    let a = net.bound(0, 5000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    // The first connect failed; the first reconnect is due right away.
    assert_eq!(net.connects.len(), 1);
    assert_eq!(net.nodes[0].poll_timeout(), Some(net.now));
    net.advance(0);
    net.run();
    assert_eq!(net.connects.len(), 2);
    let ms = Duration::from_millis;
    let bounds = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000, 1000, 1000];
    let mut delays = Vec::new();
    for (k, bound) in bounds.iter().enumerate() {
        let at = net.nodes[0].poll_timeout().expect("a reconnect is scheduled");
        let d = at - net.now;
        assert!(d < ms(*bound), "attempt {k}: {d:?} not below {bound} ms");
        delays.push(d);
        // Nothing happens before the time.
        if !d.is_zero() {
            let before = net.now;
            net.nodes[0].handle_timeout(at - Duration::from_nanos(1));
            net.run();
            assert_eq!(net.connects.len(), k + 2, "no connect before the delay");
            assert_eq!(net.now, before);
        }
        net.now = at;
        net.nodes[0].handle_timeout(at);
        net.run();
        assert_eq!(net.connects.len(), k + 3, "one connect per attempt");
    }
    // Random, not constant: the larger bounds produced different delays.
    let big: Vec<_> = delays[5..].to_vec();
    assert!(big.iter().any(|d| *d != big[0]), "{delays:?}");
    assert!(delays.iter().any(|d| *d >= ms(100)), "{delays:?}");
    // Once connected the bound starts over: the next failure reconnects at once.
    net.refuse.clear();
    let at = net.nodes[0].poll_timeout().unwrap();
    net.now = at;
    net.nodes[0].handle_timeout(at);
    net.run();
    let p0 = net.path(0, 1, 0);
    assert_eq!(net.nodes[0].path_state(p0), Some(PathState::Up));
    net.cut(0, p0);
    assert_eq!(net.nodes[0].poll_timeout(), Some(net.now));
    net.advance(0);
    net.run();
    assert_eq!(net.nodes[0].path_state(p0), Some(PathState::Up));
    assert_eq!(net.nodes[0].counters().conn_reset, 1, "only an UP path going down counts");
}

#[test]
fn reconnect_max_comes_from_the_config() {
    let mut cfg = config(0);
    cfg.reconnect_min = Duration::from_millis(10);
    cfg.reconnect_max = Duration::from_millis(40);
    let mut net = Net::with_configs(vec![cfg, config(1)], TransportKind::Tcp);
    net.refuse.insert(1);
    let a = net.bound(0, 5000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    net.advance(0);
    net.run();
    for bound in [10u64, 20, 40, 40, 40, 40] {
        let at = net.nodes[0].poll_timeout().unwrap();
        assert!(at - net.now < Duration::from_millis(bound));
        net.now = at;
        net.nodes[0].handle_timeout(at);
        net.run();
    }
}

#[test]
fn only_the_smaller_address_reconnects() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4003); // lane 3
    net.send(0, a, sa(2, 4003), b"x").unwrap();
    net.run();
    // Path 3 breaks. Node 1 (larger) has something to send on it.
    let p3_0 = net.path(0, 1, 3);
    let p3_1 = net.path(1, 0, 3);
    net.cut(0, p3_0);
    net.send(1, b, sa(1, 5000), b"reply").unwrap();
    let mark = net.connects.len();
    net.run();
    assert_eq!(net.nodes[1].poll_timeout(), None, "the larger address schedules nothing");
    assert!(net.connects[mark..].is_empty(), "and connects nothing");
    assert_eq!(net.nodes[1].path_state(p3_1), Some(PathState::Down));
    // Node 0 reconnects path 3; node 1 accepts it into slot 3 and sends.
    net.advance(0);
    net.run();
    assert_eq!(net.connects[mark..].iter().map(|c| (c.0, c.1.id.index)).collect::<Vec<_>>(), [(0, 3)]);
    assert_eq!(net.nodes[1].path_state(p3_1), Some(PathState::Up));
    assert_eq!(net.drain_payloads(0, a), [b"reply".to_vec()]);

    // All paths break: node 1 schedules nothing, node 0 reconnects path 0
    // only and, after the new handshake, the others.
    let mark = net.connects.len();
    net.cut_all(0);
    // (Only the idle collection, a minute away.)
    let soon = net.now + Duration::from_secs(1);
    assert!(net.nodes[1].poll_timeout().is_none_or(|t| t > soon));
    net.advance(0);
    net.run();
    let again: Vec<(usize, u8)> = net.connects[mark..].iter().map(|c| (c.0, c.1.id.index)).collect();
    assert_eq!(again[0], (0, 0));
    assert!(again.iter().all(|c| c.0 == 0), "{again:?}");
    let mut idx: Vec<u8> = again.iter().map(|c| c.1).collect();
    idx.sort();
    assert_eq!(idx, (0..8).collect::<Vec<_>>());
}

#[test]
fn larger_address_pokes_path_0_when_it_has_messages_for_it() {
    // Our addition to the kernel's rule: the larger address makes one
    // connect attempt on path 0 when it has messages queued there (the
    // smaller address then connects), with the same backoff.
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000); // lane 0
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    net.cut_all(0);
    net.refuse.insert(0);
    net.send(1, b, sa(1, 5000), b"queued").unwrap();
    net.run();
    assert!(net.nodes[1].poll_timeout().is_some());
    assert!(net.connects.iter().filter(|c| c.0 == 1).all(|c| c.1.id.index == 0));
    net.refuse.clear();
    for _ in 0..20 {
        let t = [net.nodes[0].poll_timeout(), net.nodes[1].poll_timeout()].into_iter().flatten().min();
        let Some(t) = t else { break };
        net.now = net.now.max(t);
        net.advance(0);
        net.run();
    }
    assert_eq!(net.drain_payloads(0, a), [b"queued".to_vec()]);
}

#[test]
fn unacked_messages_are_retransmitted_flagged_and_duplicates_dropped() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000); // lane 0
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"m0").unwrap();
    net.run();
    net.hold_acks = true;
    for m in [&b"m1"[..], b"m2", b"m3"] {
        net.send(0, a, sa(2, 4000), m).unwrap();
    }
    net.run();
    net.frozen.insert((0, 0));
    for m in [&b"m4"[..], b"m5"] {
        net.send(0, a, sa(2, 4000), m).unwrap();
    }
    net.run();
    let first: Vec<(Vec<u8>, u64)> =
        net.data_sent_by(0).iter().map(|m| (m.payload.to_vec(), m.header.sequence)).collect();
    assert_eq!(first.len(), 4);
    let seq = |name: &[u8]| first.iter().find(|m| m.0 == name).unwrap().1;
    // m1's ack arrives; m2, m3's are lost with the connection.
    let pending = std::mem::take(&mut net.pending_acks);
    for (i, p, inst, s) in &pending {
        if *i == 0 && *s == seq(b"m1") {
            net.nodes[*i].acked(*p, *inst, *s);
        }
    }
    let p0 = net.path(0, 1, 0);
    net.cut(0, p0);
    // Acks of the old connection instance are ignored.
    for (i, p, inst, s) in pending {
        net.nodes[i].acked(p, inst, s);
    }
    assert_eq!(net.nodes[0].snd_bytes(a), 8, "m2..m5 still held");
    let mark = net.wire.len();
    net.hold_acks = false;
    net.advance(0);
    net.run();
    net.thaw(0, 0);
    net.run();
    let resent: Vec<(Vec<u8>, u64, u8, bool)> = net.wire[mark..]
        .iter()
        .filter(|m| m.from == 0 && m.header.sport == 5000)
        .map(|m| (m.payload.to_vec(), m.header.sequence, m.header.flags, m.ack_required))
        .collect();
    assert_eq!(
        resent,
        [
            (b"m2".to_vec(), seq(b"m2"), flags::RETRANSMITTED, true),
            (b"m3".to_vec(), seq(b"m3"), flags::RETRANSMITTED, true),
            (b"m4".to_vec(), seq(b"m3") + 1, 0, false),
            (b"m5".to_vec(), seq(b"m3") + 2, 0, false),
        ]
    );
    assert_eq!(net.nodes[1].counters().recv_drop_old_seq, 2);
    let got = net.drain_payloads(1, b);
    assert_eq!(got, [b"m0".to_vec(), b"m1".to_vec(), b"m2".to_vec(), b"m3".to_vec(), b"m4".to_vec(), b"m5".to_vec()]);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    assert_eq!(net.nodes[0].counters().conn_reset, 1);
}

fn rx(seq: u64, fl: u8) -> RxMessage {
    let mut h = Header::data(5000, 4000, 1);
    h.sequence = seq;
    h.flags = fl;
    RxMessage::new(h, Payload::copy_from(&[seq as u8]))
}

#[test]
fn receiver_drops_only_older_sequence_numbers_marked_retransmitted() {
    let mut n = make_node(config(1), ip(2), TransportKind::Tcp);
    let b = n.socket();
    n.bind(b, sa(2, 4000)).unwrap();
    let Accept::Path(p0) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else { panic!() };
    // The peer's probe (sequence 1 on path 0) announces 8 paths; before
    // that a second connection could still be path 0 again.
    let mut probe = Header::data(wire::PROBE_PORT, 0, 0);
    probe.sequence = 1;
    probe.push_extension(wire::Ext::Npaths(8)).unwrap();
    let probe = RxMessage::new(probe, Payload::empty());
    assert_eq!(n.received(p0.id, p0.inst, probe), RecvOutcome::Ping);
    let Accept::Path(p1) = n.accept(TransportKind::Tcp, ip(2), ip(1), 40001, Instant::now()) else { panic!() };
    assert_eq!((p0.id.index, p1.id.index), (0, 1));
    let r = flags::RETRANSMITTED;
    let cases: [(PathInfo, u64, u8, RecvOutcome); 11] = [
        (p0, 5, 0, RecvOutcome::Delivered),
        // Lower without the flag: accepted (a restarted peer), next is 4.
        (p0, 3, 0, RecvOutcome::Delivered),
        (p0, 3, r, RecvOutcome::DupDropped),
        (p0, 4, r, RecvOutcome::Delivered),
        // Skips forward (cancelled messages) are fine.
        (p0, 10, 0, RecvOutcome::Delivered),
        (p0, 9, r, RecvOutcome::DupDropped),
        (p0, 11, r, RecvOutcome::Delivered),
        (p0, 11, r, RecvOutcome::DupDropped),
        // Each path has its own sequence space.
        (p1, 1, 0, RecvOutcome::Delivered),
        (p1, 2, r, RecvOutcome::Delivered),
        (p1, 1, r, RecvOutcome::DupDropped),
    ];
    for (k, (p, seq, fl, want)) in cases.iter().enumerate() {
        assert_eq!(n.received(p.id, p.inst, rx(*seq, *fl)), *want, "case {k}");
    }
    assert_eq!(n.counters().recv_drop_old_seq, 4);
    let mut got = Vec::new();
    while let Ok(Received::Data(i)) = n.recv(b, false) {
        got.push(i.payload[0]);
    }
    assert_eq!(got, [5, 3, 4, 10, 11, 1, 2]);
    // Sequence numbers at the top of the range neither panic nor wrap
    // into dropping: u64::MAX is accepted, and the next one (0) too.
    assert_eq!(n.received(p0.id, p0.inst, rx(u64::MAX, 0)), RecvOutcome::Delivered);
    assert_eq!(n.received(p0.id, p0.inst, rx(0, r)), RecvOutcome::Delivered);
    // Messages of an older connection instance are ignored.
    assert_eq!(n.received(p0.id, p0.inst - 1, rx(100, 0)), RecvOutcome::Ignored);
}
