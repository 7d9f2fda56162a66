//! Congestion: the receiver's hysteresis (`rds_recv_rcvbuf_delta`), map
//! updates on the wire (`rds_cong_queue_updates`, `rds_cong_update_alloc`),
//! the sender's ENOBUFS (`rds_cong_wait`), RDS_CONG_MONITOR notifications,
//! and the order of what `recvmsg` returns.

use rds_core::message::{RdmaOp, rdma_flags};
use rds_core::wire::{CONG_MAP_BYTES, Header, Kind};
use rds_core::*;
use rds_testkit::net::{Net, WireMsg, config, data, ip, sa};

/// Congestion-map messages node `from` sent to node `to`, in order.
fn maps(net: &Net, from: usize, to: usize) -> Vec<WireMsg> {
    let faddr = net.addrs[to];
    net.wire
        .iter()
        .filter(|m| m.from == from && m.header.kind() == Kind::CongMap)
        .filter(|m| net.nodes[from].path_info(m.path).unwrap().faddr == faddr)
        .cloned()
        .collect()
}

/// The congested ports in a map message, checking the header exactly.
fn map_ports(m: &WireMsg) -> Vec<u16> {
    assert_eq!(m.header.to_bytes(), Header::cong_map().to_bytes(), "seq 0, ports 0, flags 0x01, len 8192");
    assert_eq!(m.payload.len(), CONG_MAP_BYTES);
    let mut v = Vec::new();
    for (i, b) in m.payload.iter().enumerate() {
        for bit in 0..8 {
            if b & (1 << bit) != 0 {
                v.push((i * 8 + bit) as u16);
            }
        }
    }
    v
}

#[test]
fn hysteresis_congested_above_half_rcvbuf_uncongested_below_a_quarter() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    // sk_rcvbuf 20000: congested above 10000, uncongested below 5000.
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(10_000)).unwrap();
    assert_eq!(net.nodes[1].getsockopt(b, SockOpt::RcvBuf(0)).unwrap(), 20_000);
    net.send(0, a, sa(2, 4000), &[1; 5001]).unwrap();
    net.run();
    net.send(0, a, sa(2, 4000), &[2; 4999]).unwrap();
    net.run();
    // 10000 is not above 10000. (The connection start sent maps: one per
    // batch of paths coming up, as c_map_queued is per connection.)
    let start = maps(&net, 1, 0);
    assert!(!start.is_empty());
    assert!(start.iter().all(|m| map_ports(m).is_empty()));
    assert_eq!(net.send(0, a, sa(2, 4000), &[3; 1]), Ok(1));
    net.run();
    // 10001 > 10000: congested, but the peers hear of it only once it
    // holds a message back: no map yet, and node 0 may still send.
    assert_eq!(maps(&net, 1, 0).len(), start.len());
    assert_eq!(net.send(0, a, sa(2, 4000), &[4; 1]), Ok(1));
    net.run();
    // That message arrived while congested: one map goes out with bit
    // 4000 set (byte 500, bit 0).
    let m = maps(&net, 1, 0);
    assert_eq!(m.len(), start.len() + 1);
    assert_eq!(map_ports(&m[start.len()]), vec![4000]);
    assert_eq!(m[start.len()].payload[500], 0x01);
    assert_eq!(net.send(0, a, sa(2, 4000), &[4; 1]), Err(Errno::ENOBUFS));
    assert_eq!(net.nodes[0].counters().cong_send_error, 1);
    // Another port of the same peer is fine.
    net.bound(1, 4001);
    assert_eq!(net.send(0, a, sa(2, 4001), &[4; 1]), Ok(1));
    net.run();
    // 10002 - 5001 = 5001 is not below 5000: still congested.
    assert_eq!(data(net.nodes[1].recv(b, false).unwrap()).payload.len(), 5001);
    net.run();
    assert_eq!(maps(&net, 1, 0).len(), start.len() + 1);
    assert_eq!(net.send(0, a, sa(2, 4000), &[4; 1]), Err(Errno::ENOBUFS));
    // 5001 - 4999 = 2: uncongested, an all-clear map goes out.
    assert_eq!(data(net.nodes[1].recv(b, false).unwrap()).payload.len(), 4999);
    net.run();
    let m = maps(&net, 1, 0);
    assert_eq!(m.len(), start.len() + 2);
    assert_eq!(map_ports(&m[start.len() + 1]), Vec::<u16>::new());
    assert_eq!(net.send(0, a, sa(2, 4000), &[5; 1]), Ok(1));
    net.run();
    let c = net.nodes[1].counters();
    // To 4000: 5001, 4999, 1, the held-back 1 and the last 1; to 4001: 1.
    assert_eq!(c.recv_bytes_added_to_sock, 5001 + 4999 + 1 + 1 + 1 + 1);
    assert_eq!(c.recv_bytes_freed_fromsock, 5001 + 4999);
    // Two changes queued an update each, plus those of the connection
    // start; node 0 received each of them.
    assert_eq!(c.cong_update_queued, start.len() as u64 + 2);
    assert_eq!(net.nodes[0].counters().cong_update_received, start.len() as u64 + 2);
    assert_eq!(c.cong_update_spared, 0);
}

#[test]
fn raising_rcvbuf_uncongests() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap(); // limit 2000
    net.send(0, a, sa(2, 4000), &[0; 2001]).unwrap();
    net.run();
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), vec![4000]);
    // limit 8000: 2001 is below 4000.
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(8000)).unwrap();
    net.run();
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), Vec::<u16>::new());
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 1]), Ok(1));
}

#[test]
fn map_update_goes_to_every_connection_of_the_address_and_after_reconnect() {
    let mut net = Net::new(3);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4003);
    let c = net.bound(2, 6000);
    // Node 1 talks to both others.
    net.send(1, b, sa(3, 6000), b"hello").unwrap();
    net.send(0, a, sa(2, 4003), b"hi").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(2, c), vec![b"hello".to_vec()]);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    net.send(0, a, sa(2, 4003), &[7; 2000]).unwrap();
    // The message congestion holds back: its arrival announces it.
    net.send(0, a, sa(2, 4003), &[7; 1]).unwrap();
    net.run();
    // The update with port 4003 (byte 500 = 0x08) went to node 0 and node 2.
    for peer in [0, 2] {
        let m = maps(&net, 1, peer);
        let last = m.last().unwrap();
        assert_eq!(map_ports(last), vec![4003], "to node {peer}");
        assert_eq!(last.payload[500], 0x08);
    }
    // Node 2 learned it too: its sends to 4003 fail.
    assert_eq!(net.send(2, c, sa(2, 4003), b"x"), Err(Errno::ENOBUFS));
    let before = maps(&net, 1, 2).len();
    let to_node0 = maps(&net, 1, 0).len();
    // The connection to node 2 breaks; node 1 (the smaller address)
    // reconnects and the new connection starts with the current map.
    let p = net.path(1, 2, 0);
    net.cut(1, p);
    let mark = net.wire.len();
    net.advance(0);
    net.run();
    assert_eq!(net.nodes[1].path_state(p), Some(PathState::Up));
    assert_eq!(maps(&net, 1, 2).len(), before + 1);
    let first = net.wire[mark..].iter().find(|w| w.from == 1 && w.path == p).unwrap();
    assert_eq!(map_ports(first), vec![4003]);
    // Node 0's connection was not touched and got nothing new.
    assert_eq!(maps(&net, 1, 0).len(), to_node0);
}

#[test]
fn cong_monitor_notifies_exactly_the_blocked_port_group_when_it_clears() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let plain = net.bound(0, 5008);
    let b1 = net.bound(1, 4003); // group 4003 % 64 = 35
    let b2 = net.bound(1, 4070); // group 4070 % 64 = 38
    for s in [b1, b2] {
        net.nodes[1].setsockopt(s, SockOpt::RcvBuf(2000)).unwrap();
    }
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(true)).unwrap();
    net.send(0, plain, sa(2, 4003), &[0; 2001]).unwrap();
    net.send(0, plain, sa(2, 4070), &[0; 2001]).unwrap();
    net.run();
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), vec![4003, 4070]);
    // Non-blocking send to a congested port: ENOBUFS.
    assert_eq!(net.send(0, a, sa(2, 4003), b"x"), Err(Errno::ENOBUFS));
    assert_eq!(net.send(0, plain, sa(2, 4070), b"x"), Err(Errno::ENOBUFS));
    assert_eq!(net.nodes[0].counters().cong_send_error, 2);
    assert_eq!(net.nodes[0].recv(a, false).unwrap_err(), Errno::EAGAIN);
    assert!(!net.nodes[0].readiness(a).readable);
    // Port 4070 clears: a never tried it, so nothing for a.
    net.drain(1, b2);
    net.run();
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), vec![4003]);
    assert!(!net.nodes[0].readiness(a).readable);
    assert_eq!(net.nodes[0].recv(a, false).unwrap_err(), Errno::EAGAIN);
    // Port 4003 clears: a gets one notification with bit 35 only.
    net.wakes.clear();
    net.drain(1, b1);
    net.run();
    assert!(net.wakes.contains(&(0, a)));
    assert!(net.nodes[0].readiness(a).readable);
    match net.nodes[0].recv(a, false).unwrap() {
        Received::CongUpdate { mask } => assert_eq!(mask, 1u64 << 35),
        other => panic!("{other:?}"),
    }
    assert_eq!(net.nodes[0].recv(a, false).unwrap_err(), Errno::EAGAIN);
    assert!(!net.nodes[0].readiness(a).readable);
    // The socket without CONG_MONITOR never gets a notification.
    assert!(net.drain(0, plain).is_empty());
    assert_eq!(net.send(0, a, sa(2, 4003), b"x"), Ok(1));
}

#[test]
fn switching_cong_monitor_off_forgets_masks_and_notifications() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4003);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(true)).unwrap();
    net.send(0, a, sa(2, 4003), &[0; 2001]).unwrap();
    net.send(0, a, sa(2, 4003), &[0; 1]).unwrap();
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4003), b"x"), Err(Errno::ENOBUFS));
    net.drain(1, b);
    net.run();
    // A notification is pending; switching the option off drops it.
    assert!(net.nodes[0].readiness(a).readable);
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(false)).unwrap();
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(true)).unwrap();
    assert_eq!(net.nodes[0].recv(a, false).unwrap_err(), Errno::EAGAIN);
    // The recorded group is gone too: the next update notifies nothing.
    net.send(0, a, sa(2, 4003), &[0; 2001]).unwrap();
    net.send(0, a, sa(2, 4003), &[0; 1]).unwrap();
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4003), b"x"), Err(Errno::ENOBUFS));
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(false)).unwrap();
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(true)).unwrap();
    net.drain(1, b);
    net.run();
    assert_eq!(net.nodes[0].recv(a, false).unwrap_err(), Errno::EAGAIN);
}

#[test]
fn blocking_sender_is_counted_and_woken_by_the_update() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    net.send(0, a, sa(2, 4000), &[0; 2001]).unwrap();
    net.run();
    let blocking = SendOptions { blocking: true, ..SendOptions::default() };
    let p = Payload::copy_from(b"wait");
    assert_eq!(net.nodes[0].send(a, Some(sa(2, 4000)), &p, &blocking), Err(Errno::ENOBUFS));
    assert_eq!(net.nodes[0].counters().cong_send_blocked, 1);
    assert_eq!(net.nodes[0].counters().cong_send_error, 0);
    net.run();
    net.wakes.clear();
    net.drain(1, b);
    net.run();
    assert!(net.wakes.contains(&(0, a)), "the blocked sender retries");
    assert_eq!(net.nodes[0].send(a, Some(sa(2, 4000)), &p, &blocking), Ok(4));
}

#[test]
fn local_congestion_is_seen_at_once_by_local_senders() {
    let mut net = Net::new(1);
    net.nodes[0].add_local(ip(9), TransportKind::Tcp);
    let a = net.bound(0, 100);
    let b = net.nodes[0].socket();
    net.nodes[0].bind(b, sa(9, 200)).unwrap();
    net.nodes[0].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    net.send(0, a, sa(9, 200), &[0; 2001]).unwrap();
    net.run();
    assert_eq!(net.send(0, a, sa(9, 200), &[0; 1]), Err(Errno::ENOBUFS));
    // Loopback connections never carry maps.
    assert!(net.wire.iter().all(|m| m.header.kind() != Kind::CongMap));
    net.drain(0, b);
    net.run();
    assert_eq!(net.send(0, a, sa(9, 200), &[0; 1]), Ok(1));
}

#[test]
fn loop_transport_sockets_are_never_congested() {
    // Like a socket bound to 127.0.0.1 in the kernel: its transport is the
    // loop transport, and its receive queue has no congestion limit.
    let mut net = Net::new(1);
    net.nodes[0].add_local(ip(50), TransportKind::Loop);
    let a = net.bound(0, 5000);
    let b = net.nodes[0].socket();
    net.nodes[0].bind(b, sa(50, 4000)).unwrap();
    assert_eq!(net.nodes[0].getsockopt(b, SockOpt::Transport(0)), Ok(3));
    net.nodes[0].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    for _ in 0..5 {
        assert_eq!(net.send(0, a, sa(50, 4000), &[0; 3000]), Ok(3000));
        net.run();
    }
    assert_eq!(net.drain(0, b).len(), 5);
    assert_eq!(net.nodes[0].counters().cong_update_queued, 0);
    assert_eq!(net.nodes[0].counters().recv_bytes_added_to_sock, 15_000);
}

#[test]
fn recv_order_is_notifications_then_cong_update_then_data() {
    // IB: the transport that runs RDMA ops (and so completion notifications).
    let mut net = Net::with_configs(vec![config(0), config(1)], TransportKind::Ib);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000); // group 4000 % 64 = 32
    let c = net.bound(1, 4001);
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(true)).unwrap();
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    // Data for a first: it is queued before everything else.
    net.send(1, c, sa(1, 5000), b"data-1").unwrap();
    net.run();
    // b becomes congested; a's next send to it fails and is monitored.
    net.send(0, a, sa(2, 4000), &[0; 2001]).unwrap();
    net.send(0, a, sa(2, 4000), &[0; 1]).unwrap();
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4000), b"x"), Err(Errno::ENOBUFS));
    // An RDMA op with NOTIFY_ME completes when its message is acked.
    let op = RdmaOp {
        remote_cookie: 0x55,
        remote_addr: 0,
        remote_len: 4096,
        local: vec![rds_core::RdmaBuf::new(4096).all()],
        flags: rdma_flags::NOTIFY_ME,
        user_token: 0xfeed,
    };
    let o = SendOptions { rdma: Some(op), ..SendOptions::default() };
    net.nodes[0].send(a, Some(sa(2, 4001)), &Payload::copy_from(b"rdma"), &o).unwrap();
    net.run();
    net.send(1, c, sa(1, 5000), b"data-2").unwrap();
    // b drains: the update reaches node 0.
    net.drain(1, b);
    net.run();
    let got: Vec<String> = net
        .drain(0, a)
        .into_iter()
        .map(|r| match r {
            Received::RdmaStatus { user_token, status } => format!("rdma {user_token:#x} {status}"),
            Received::CongUpdate { mask } => format!("cong {mask:#x}"),
            Received::Data(i) => format!("data {}", String::from_utf8_lossy(&i.payload)),
        })
        .collect();
    assert_eq!(got, ["rdma 0xfeed 0", "cong 0x100000000", "data data-1", "data data-2"]);
}

/// Regression: congestion maps carry no sequence number, so they must all
/// travel on one TCP stream (the map lane: the lowest path that is up). Maps
/// sent on two paths can be applied by the peer in the wrong order, leaving
/// a stale "congested" bit and a sender blocked forever (seen in rds-bench).
#[test]
fn maps_travel_only_on_the_map_lane() {
    let mut net = Net::new(2);
    let a = net.bound(0, 4000);
    let b = net.bound(1, 4000);
    let s3 = net.bound(1, 4003); // node 1's lane 3
    net.send(0, a, sa(2, 4000), b"warm").unwrap();
    net.run();
    net.drain(1, b);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(3000)).unwrap();
    let path3 = net.path(1, 0, 3);
    let mark = net.wire.len();
    for round in 0..20u8 {
        // Congest b (3000 of 4500 bytes), and a fourth message arrives
        // while it is: a map with its bit goes out...
        for _ in 0..4 {
            let _ = net.send(0, a, sa(2, 4000), &[round; 1500]);
            net.run();
        }
        // ... then drain it without running node 1's outputs, so the
        // clearing map is pending while path 3 transmits.
        while net.nodes[1].recv(b, false).is_ok() {}
        net.send(1, s3, sa(1, 4000), &[round]).unwrap();
        net.pull_some(1, path3, 1 << 20);
        net.run();
        net.drain(0, a);
    }
    let lane = net.path(1, 0, 0);
    let sent: Vec<_> = net.wire[mark..].iter().filter(|m| m.from == 1 && m.header.kind() == Kind::CongMap).collect();
    assert!(sent.len() >= 20, "congestion toggled: {} maps", sent.len());
    assert!(sent.iter().all(|m| m.path == lane), "a map left on another path than the lane");
    // Node 0's view ends uncongested, like node 1's own map.
    assert_eq!(net.send(0, a, sa(2, 4000), b"end"), Ok(3));
    assert!(net.wire[mark..].iter().any(|m| m.from == 1 && m.path == path3), "path 3 transmitted");
    // With path 0 gone, the next path up carries the maps.
    net.cut(1, lane);
    let a1 = net.bound(0, 4001); // lane 1: still connected
    let mark = net.wire.len();
    for _ in 0..4 {
        let _ = net.send(0, a1, sa(2, 4000), &[9; 1500]);
        net.run();
    }
    let after: Vec<_> = net.wire[mark..].iter().filter(|m| m.from == 1 && m.header.kind() == Kind::CongMap).collect();
    assert!(!after.is_empty());
    assert!(after.iter().all(|m| m.path.index == 1), "{:?}", after.iter().map(|m| m.path.index).collect::<Vec<_>>());
}

/// A congestion that the reader ends before another message arrives held
/// nothing back: the peers never hear of it, neither its start nor its
/// end (`cong_update_spared`); one that does hold a message back is
/// announced as before.
#[test]
fn a_congestion_drained_before_the_next_message_is_never_announced() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"warm").unwrap();
    net.run();
    net.drain(1, b);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(1000)).unwrap(); // limit 2000
    let start = maps(&net, 1, 0).len();
    let (queued, seen) = (net.nodes[1].counters().cong_update_queued, net.nodes[1].counters().cong_update_received);
    for round in 0..3u8 {
        net.send(0, a, sa(2, 4000), &[round; 2001]).unwrap();
        net.run();
        assert_eq!(net.drain_payloads(1, b), vec![vec![round; 2001]]);
        net.run();
    }
    assert_eq!(maps(&net, 1, 0).len(), start, "no map for a congestion that held nothing back");
    let c = net.nodes[1].counters();
    assert_eq!(c.cong_update_spared, 3);
    assert_eq!(c.cong_update_queued, queued);
    // Node 1's own map saw every change (local senders test it).
    assert_eq!(c.cong_update_received - seen, 6);
    // Held back once: announced, then its end.
    net.send(0, a, sa(2, 4000), &[7; 2001]).unwrap();
    net.send(0, a, sa(2, 4000), &[8; 1]).unwrap();
    net.run();
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), vec![4000]);
    assert_eq!(net.send(0, a, sa(2, 4000), b"x"), Err(Errno::ENOBUFS));
    assert_eq!(net.drain_payloads(1, b), vec![vec![7; 2001], vec![8; 1]]);
    net.run();
    assert_eq!(maps(&net, 1, 0).len(), start + 2);
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), Vec::<u16>::new());
    assert_eq!(net.send(0, a, sa(2, 4000), b"x"), Ok(1));
    assert_eq!(net.nodes[1].counters().cong_update_spared, 3);
}

/// A map that leaves for another port's congestion carries every bit of
/// the address: a socket congested meanwhile is then announced, and its
/// end must follow, or the peer would keep its port congested for good.
#[test]
fn a_congestion_carried_by_another_ports_map_has_its_end_sent() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let warm = net.bound(1, 4002);
    let b1 = net.bound(1, 4000);
    let b2 = net.bound(1, 4001);
    net.send(0, a, sa(2, 4002), b"warm").unwrap();
    net.run();
    net.drain(1, warm);
    for s in [b1, b2] {
        net.nodes[1].setsockopt(s, SockOpt::RcvBuf(1000)).unwrap(); // limit 2000
    }
    let start = maps(&net, 1, 0).len();
    // b1 goes over its limit: held, not announced.
    net.send(0, a, sa(2, 4000), &[1; 2001]).unwrap();
    net.run();
    assert_eq!(maps(&net, 1, 0).len(), start);
    // b2 goes over and holds a message back: its map carries b1's bit too.
    net.send(0, a, sa(2, 4001), &[2; 2001]).unwrap();
    net.send(0, a, sa(2, 4001), &[2; 1]).unwrap();
    net.run();
    assert_eq!(maps(&net, 1, 0).len(), start + 1);
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), vec![4000, 4001]);
    assert_eq!(net.send(0, a, sa(2, 4000), b"x"), Err(Errno::ENOBUFS));
    // b1 drains: its end goes out, though no message of its own announced it.
    net.drain(1, b1);
    net.run();
    assert_eq!(maps(&net, 1, 0).len(), start + 2);
    assert_eq!(map_ports(maps(&net, 1, 0).last().unwrap()), vec![4001]);
    assert_eq!(net.send(0, a, sa(2, 4000), b"x"), Ok(1));
    assert_eq!(net.send(0, a, sa(2, 4001), b"x"), Err(Errno::ENOBUFS));
    assert_eq!(net.nodes[1].counters().cong_update_spared, 0);
}
