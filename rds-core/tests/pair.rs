//! Two nodes joined by an ideal in-memory link: every Connect succeeds at
//! once, pulled messages arrive in order and are acked when they arrive.
//! Checks the basic flows end to end through the sans-IO API.

use std::net::SocketAddr;

use rds_core::driver;
use rds_core::wire::{Ext, Kind};
use rds_core::*;
use rds_testkit::net::{Net, data, ip};

#[test]
fn datagrams_arrive_in_order_with_exact_content() {
    let mut net = Net::new(2);
    let a = net.nodes[0].socket();
    let b = net.nodes[1].socket();
    net.nodes[0].bind(a, SocketAddr::new(ip(1), 5000)).unwrap();
    net.nodes[1].bind(b, SocketAddr::new(ip(2), 4000)).unwrap();
    for k in 0..20u8 {
        let p = Payload::new(vec![k; usize::from(k) * 100]);
        net.nodes[0].send(a, Some(SocketAddr::new(ip(2), 4000)), &p, &SendOptions::default()).unwrap();
    }
    net.run();
    for k in 0..20u8 {
        let inc = data(net.nodes[1].recv(b, false).unwrap());
        assert_eq!(inc.from, SocketAddr::new(ip(1), 5000));
        assert_eq!(&inc.payload[..], &vec![k; usize::from(k) * 100][..]);
    }
    assert_eq!(net.nodes[1].recv(b, false).unwrap_err(), Errno::EAGAIN);
    assert_eq!(net.nodes[0].snd_bytes(a), 0, "all acked");
    assert_eq!(net.nodes[1].counters().recv_delivered, 20);
}

#[test]
fn first_connection_carries_map_then_probe_with_npaths() {
    let mut net = Net::new(2);
    let a = net.nodes[0].socket();
    net.nodes[0].bind(a, SocketAddr::new(ip(1), 5000)).unwrap();
    net.nodes[0].send(a, Some(SocketAddr::new(ip(2), 4000)), &Payload::empty(), &SendOptions::default()).unwrap();
    net.run();
    let from_a: Vec<_> = net.sent_by(0).into_iter().map(|m| m.header).collect();
    assert_eq!(from_a[0].kind(), Kind::CongMap);
    assert_eq!(from_a[1].kind(), Kind::ProbePing);
    assert_eq!(from_a[1].sequence, 1);
    assert_eq!(from_a[1].extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8)]);
    assert_eq!(from_a[2].sequence, 2);
    assert_eq!((from_a[2].sport, from_a[2].dport), (5000, 4000));
    // The peer answered the probe with a pong on path 0 carrying NPATHS.
    let pong = net.sent_by(1).into_iter().find(|m| m.header.kind() == Kind::ProbePong).unwrap().header;
    assert_eq!(pong.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8)]);
    // No socket on 4000: dropped and counted.
    assert_eq!(net.nodes[1].counters().recv_drop_no_sock, 1);
    // The smaller address opened all 8 paths.
    let conn = net.nodes[0].find_conn(ip(1), ip(2), TransportKind::Tcp).unwrap();
    for i in 0..8 {
        assert_eq!(net.nodes[0].path_state(PathId { conn, index: i }), Some(PathState::Up), "path {i}");
    }
}

#[test]
fn larger_address_gets_the_smaller_to_connect() {
    let mut net = Net::new(2);
    let b = net.nodes[1].socket();
    let a = net.nodes[0].socket();
    net.nodes[0].bind(a, SocketAddr::new(ip(1), 5000)).unwrap();
    net.nodes[1].bind(b, SocketAddr::new(ip(2), 4000)).unwrap();
    net.nodes[1]
        .send(b, Some(SocketAddr::new(ip(1), 5000)), &Payload::copy_from(b"hi"), &SendOptions::default())
        .unwrap();
    net.run();
    let inc = data(net.nodes[0].recv(a, false).unwrap());
    assert_eq!(&inc.payload[..], b"hi");
    assert_eq!(inc.from, SocketAddr::new(ip(2), 4000));
}

#[test]
fn reconnect_retransmits_unacked_and_receiver_drops_duplicates() {
    let mut net = Net::new(2);
    let a = net.nodes[0].socket();
    let b = net.nodes[1].socket();
    net.nodes[0].bind(a, SocketAddr::new(ip(1), 5000)).unwrap();
    net.nodes[1].bind(b, SocketAddr::new(ip(2), 4000)).unwrap();
    let dst = Some(SocketAddr::new(ip(2), 4000));
    net.nodes[0].send(a, dst, &Payload::copy_from(b"one"), &SendOptions::default()).unwrap();
    net.run();
    let conn = net.nodes[0].find_conn(ip(1), ip(2), TransportKind::Tcp).unwrap();
    let p0 = PathId { conn, index: 0 };
    let l = net.links[&(0, p0)];
    let (j, pj, inst_i, inst_j) = (l.peer, l.peer_path, l.inst, l.peer_inst);
    // Deliver "two" but lose the ack; then the link breaks.
    net.nodes[0].send(a, dst, &Payload::copy_from(b"two"), &SendOptions::default()).unwrap();
    let info = match net.nodes[0].poll_output() {
        Some(Output::Kick(info)) => info,
        o => panic!("{o:?}"),
    };
    let mut out = Vec::new();
    net.nodes[0].pull(info.id, inst_i, 1 << 20, &mut out);
    assert_eq!(out.len(), 1);
    net.nodes[j].received(pj, inst_j, RxMessage::new(out[0].header, out[0].payload.clone()));
    net.cut(0, p0);
    net.run();
    // Reconnect is immediate on the first attempt.
    net.advance(0);
    net.run();
    assert_eq!(net.nodes[0].path_state(p0), Some(PathState::Up));
    assert_eq!(net.nodes[1].counters().recv_drop_old_seq, 1, "retransmitted copy dropped");
    assert_eq!(&data(net.nodes[1].recv(b, false).unwrap()).payload[..], b"one");
    assert_eq!(&data(net.nodes[1].recv(b, false).unwrap()).payload[..], b"two");
    assert!(net.nodes[1].recv(b, false).is_err());
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
}

#[test]
fn ping_is_answered_with_a_pong_from_port_zero() {
    let mut net = Net::new(2);
    let a = net.nodes[0].socket();
    net.nodes[0].bind(a, SocketAddr::new(ip(1), 7000)).unwrap();
    net.nodes[0].send(a, Some(SocketAddr::new(ip(2), 0)), &Payload::empty(), &SendOptions::default()).unwrap();
    net.run();
    let inc = data(net.nodes[0].recv(a, false).unwrap());
    assert_eq!(inc.from, SocketAddr::new(ip(2), 0));
    assert!(inc.payload.is_empty());
    // The multipath probe counts as a ping too, as in the kernel.
    assert_eq!(net.nodes[1].counters().recv_ping, 2);
    assert_eq!(net.nodes[0].counters().recv_ping, 1, "node 1's probe");
    // s_send_pong counts every probe queued: node 1 sent its own probe,
    // the pong to node 0's probe and the pong to the ping; node 0 its probe
    // and the pong to node 1's probe.
    assert_eq!(net.nodes[1].counters().send_pong, 3);
    assert_eq!(net.nodes[0].counters().send_pong, 2);
}

#[test]
fn loopback_delivers_in_process() {
    let mut net = Net::new(1);
    net.nodes[0].add_local(ip(9), TransportKind::Tcp);
    let a = net.nodes[0].socket();
    let b = net.nodes[0].socket();
    net.nodes[0].bind(a, SocketAddr::new(ip(1), 100)).unwrap();
    net.nodes[0].bind(b, SocketAddr::new(ip(9), 200)).unwrap();
    let mut lo_msgs = Vec::new();
    net.nodes[0]
        .send(a, Some(SocketAddr::new(ip(9), 200)), &Payload::copy_from(b"x"), &SendOptions::default())
        .unwrap();
    net.nodes[0].send(a, Some(SocketAddr::new(ip(9), 0)), &Payload::empty(), &SendOptions::default()).unwrap();
    // Drive the loop transport by hand.
    driver::for_each(&mut net.nodes[0], |n, o| {
        if let Output::Kick(info) = o {
            assert_eq!(info.kind, TransportKind::Loop);
            let mut out = Vec::new();
            n.pull(info.id, info.inst, 1 << 20, &mut out);
            for m in out {
                lo_msgs.push(m.header);
                n.received(info.id, info.inst, RxMessage::new(m.header, m.payload));
                n.acked(info.id, info.inst, m.header.sequence);
            }
        }
    });
    assert!(lo_msgs.iter().all(|h| h.kind() != Kind::CongMap && h.kind() != Kind::ProbePing));
    assert_eq!(&data(net.nodes[0].recv(b, false).unwrap()).payload[..], b"x");
    let pong = data(net.nodes[0].recv(a, false).unwrap());
    assert_eq!(pong.from, SocketAddr::new(ip(9), 0));
}
