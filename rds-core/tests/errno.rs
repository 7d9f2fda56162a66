//! Errno of the socket calls the core implements, as the 6.1 kernel
//! returns them (`rds_bind`, `rds_connect`, `rds_sendmsg`,
//! `rds_set_transport`, `rds_ioctl`, `rds_recvmsg`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use rds_core::types::RDS_TRANS_NONE;
use rds_core::*;
use rds_testkit::net::{Net, config, data, ip, make_node, sa};

fn v4(a: [u8; 4], port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), port)
}

fn v6(s: &str, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(s.parse::<Ipv6Addr>().unwrap()), port)
}

fn node() -> Node {
    make_node(config(0), ip(1), TransportKind::Tcp)
}

#[test]
fn bind_errors() {
    let mut n = node();
    let s = n.socket();
    for bad in [
        v4([0, 0, 0, 0], 4000),
        v4([255, 255, 255, 255], 4000),
        v4([224, 0, 0, 1], 4000),
        v4([239, 1, 2, 3], 4000),
        v6("::", 4000),
        v6("ff02::1", 4000),
        v6("::ffff:0.0.0.0", 4000),
        v6("::ffff:255.255.255.255", 4000),
        v6("::ffff:224.0.0.1", 4000),
    ] {
        assert_eq!(n.bind(s, bad), Err(Errno::EINVAL), "{bad}");
    }
    // Port 1 is the probe's source port.
    assert_eq!(n.bind(s, sa(1, 1)), Err(Errno::EINVAL));
    // An address the node does not serve.
    assert_eq!(n.bind(s, sa(99, 4000)), Err(Errno::EADDRNOTAVAIL));
    assert_eq!(n.bind(s, v6("fd00::1", 4000)), Err(Errno::EADDRNOTAVAIL));
    assert_eq!(n.local_addr(s), None, "failed binds leave it unbound");
    assert_eq!(n.bind(s, sa(1, 4000)), Ok(sa(1, 4000)));
    assert_eq!(n.getsockopt(s, SockOpt::Transport(0)), Ok(u64::from(TransportKind::Tcp.uapi())));
    // A second bind, to any port, is EINVAL.
    assert_eq!(n.bind(s, sa(1, 4001)), Err(Errno::EINVAL));
    assert_eq!(n.bind(s, sa(1, 4000)), Err(Errno::EINVAL));
    assert_eq!(n.bind(s, sa(99, 4000)), Err(Errno::EINVAL), "already bound comes before the address check");
    // A taken port.
    let t = n.socket();
    assert_eq!(n.bind(t, sa(1, 4000)), Err(Errno::EADDRINUSE));
    assert_eq!(n.local_addr(t), None);
    // The same port on another address is fine.
    n.add_local(ip(7), TransportKind::Tcp);
    assert_eq!(n.bind(t, sa(7, 4000)), Ok(sa(7, 4000)));
}

#[test]
fn bind_port_0_picks_free_ports() {
    let mut n = node();
    let taken = n.socket();
    n.bind(taken, sa(1, 4000)).unwrap();
    let mut seen = std::collections::HashSet::new();
    seen.insert(4000u16);
    for _ in 0..300 {
        let s = n.socket();
        let got = n.bind(s, sa(1, 0)).unwrap();
        assert_eq!(got.ip(), ip(1));
        assert!(got.port() > 1, "never 0 or the probe port: {got}");
        assert!(seen.insert(got.port()), "port {} picked twice", got.port());
        assert_eq!(n.local_addr(s), Some(got));
    }
}

#[test]
fn bind_with_so_rds_transport() {
    let mut n = node();
    n.register_transport(TransportCaps::ib());
    // The address is served by TCP only: a socket set to IB cannot bind it.
    let s = n.socket();
    n.setsockopt(s, SockOpt::Transport(0)).unwrap();
    assert_eq!(n.bind(s, sa(1, 4000)), Err(Errno::ENOPROTOOPT));
    assert_eq!(n.bind(s, sa(99, 4000)), Err(Errno::ENOPROTOOPT), "also for an address nobody serves");
    // Set to TCP it binds, and keeps TCP.
    let t = n.socket();
    n.setsockopt(t, SockOpt::Transport(2)).unwrap();
    n.bind(t, sa(1, 4000)).unwrap();
    assert_eq!(n.getsockopt(t, SockOpt::Transport(0)), Ok(2));
    // EADDRINUSE forgets the transport (it can be set again).
    let u = n.socket();
    n.setsockopt(u, SockOpt::Transport(2)).unwrap();
    assert_eq!(n.bind(u, sa(1, 4000)), Err(Errno::EADDRINUSE));
    assert_eq!(n.getsockopt(u, SockOpt::Transport(0)), Ok(u64::from(RDS_TRANS_NONE)));
    assert_eq!(n.setsockopt(u, SockOpt::Transport(2)), Ok(()));
    // Without SO_RDS_TRANSPORT, IB is preferred where it serves the address.
    n.add_local(ip(5), TransportKind::Tcp);
    n.add_local(ip(5), TransportKind::Ib);
    let w = n.socket();
    n.bind(w, sa(5, 4000)).unwrap();
    assert_eq!(n.getsockopt(w, SockOpt::Transport(0)), Ok(0));
}

#[test]
fn so_rds_transport_errors() {
    let mut n = node();
    let s = n.socket();
    assert_eq!(n.getsockopt(s, SockOpt::Transport(0)), Ok(0xffff_ffff), "RDS_TRANS_NONE when unset");
    for bad in [-1, 3, 5, i32::MIN, i32::MAX] {
        assert_eq!(n.setsockopt(s, SockOpt::Transport(bad)), Err(Errno::EINVAL), "{bad}");
    }
    // IB is not registered on this node; 1 (iWARP/GAP) has no transport.
    assert_eq!(n.setsockopt(s, SockOpt::Transport(0)), Err(Errno::ENOPROTOOPT));
    assert_eq!(n.setsockopt(s, SockOpt::Transport(1)), Err(Errno::ENOPROTOOPT));
    assert_eq!(n.setsockopt(s, SockOpt::Transport(2)), Ok(()));
    assert_eq!(n.getsockopt(s, SockOpt::Transport(0)), Ok(2));
    // Once set, any further set is EOPNOTSUPP, even an invalid value.
    assert_eq!(n.setsockopt(s, SockOpt::Transport(2)), Err(Errno::EOPNOTSUPP));
    assert_eq!(n.setsockopt(s, SockOpt::Transport(-1)), Err(Errno::EOPNOTSUPP));
    // After bind (which chose a transport): EOPNOTSUPP.
    let t = n.socket();
    n.bind(t, sa(1, 4000)).unwrap();
    assert_eq!(n.setsockopt(t, SockOpt::Transport(2)), Err(Errno::EOPNOTSUPP));
}

#[test]
fn send_errors() {
    let mut net = Net::new(2);
    let p = Payload::copy_from(b"x");
    let o = SendOptions::default();
    let n = &mut net.nodes[0];
    let unbound = n.socket();
    assert_eq!(n.send(unbound, Some(sa(2, 4000)), &p, &o), Err(Errno::ENOTCONN));
    assert_eq!(n.send(unbound, None, &p, &o), Err(Errno::ENOTCONN));
    // A bad destination is EINVAL before anything else.
    for bad in [
        v4([0, 0, 0, 0], 4000),
        v4([255, 255, 255, 255], 4000),
        v4([224, 0, 0, 1], 4000),
        v6("ff02::1", 4000),
        v6("::", 4000),
        v6("::ffff:0.0.0.0", 4000),
    ] {
        assert_eq!(n.send(unbound, Some(bad), &p, &o), Err(Errno::EINVAL), "{bad}");
    }
    let s = n.socket();
    n.bind(s, sa(1, 5000)).unwrap();
    assert_eq!(n.send(s, None, &p, &o), Err(Errno::ENOTCONN), "bound, no destination");
    assert_eq!(n.send(s, Some(v4([0, 0, 0, 0], 4000)), &p, &o), Err(Errno::EINVAL));
    assert_eq!(n.send(s, Some(v6("fd00::2", 4000)), &p, &o), Err(Errno::EOPNOTSUPP), "IPv4 source, IPv6 dest");
    // connect gives the default destination.
    assert_eq!(n.connect(s, v4([0, 0, 0, 0], 4000)), Err(Errno::EDESTADDRREQ));
    assert_eq!(n.connect(s, v4([255, 255, 255, 255], 4000)), Err(Errno::EINVAL));
    assert_eq!(n.connect(s, v4([224, 0, 0, 1], 4000)), Err(Errno::EINVAL));
    assert_eq!(n.connect(s, v6("::", 4000)), Err(Errno::EPROTOTYPE));
    assert_eq!(n.connect(s, v6("ff02::1", 4000)), Err(Errno::EPROTOTYPE));
    assert_eq!(n.connect(s, v6("::ffff:255.255.255.255", 4000)), Err(Errno::EPROTOTYPE));
    assert_eq!(n.peer_addr(s), None);
    n.connect(s, sa(2, 4000)).unwrap();
    assert_eq!(n.peer_addr(s), Some(sa(2, 4000)));
    assert_eq!(n.send(s, None, &p, &o), Ok(1));
    // Connected but unbound: still ENOTCONN.
    let c = n.socket();
    n.connect(c, sa(2, 4000)).unwrap();
    assert_eq!(n.send(c, None, &p, &o), Err(Errno::ENOTCONN));
    // RDMA on a transport without it.
    let op = message::RdmaOp {
        remote_cookie: 1,
        remote_addr: 0,
        remote_len: 8,
        local: vec![rds_core::RdmaBuf::new(8).all()],
        flags: 0,
        user_token: 1,
    };
    let ro = SendOptions { rdma: Some(op), ..SendOptions::default() };
    assert_eq!(n.send(s, None, &p, &ro), Err(Errno::EOPNOTSUPP));
    let b = net.bound(1, 4000);
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"x".to_vec()]);
}

#[test]
fn tos_rules() {
    let mut n = node();
    n.register_transport(TransportCaps::ib());
    n.add_local(ip(5), TransportKind::Ib);
    // No transport yet: no TOS map (ENOTTY).
    let s = n.socket();
    assert_eq!(n.setsockopt(s, SockOpt::Tos(3)), Err(Errno::ENOTTY));
    // TCP maps every TOS to 0, so it can be set again.
    n.setsockopt(s, SockOpt::Transport(2)).unwrap();
    assert_eq!(n.setsockopt(s, SockOpt::Tos(3)), Ok(()));
    assert_eq!(n.getsockopt(s, SockOpt::Tos(0)), Ok(0));
    assert_eq!(n.setsockopt(s, SockOpt::Tos(3)), Ok(()));
    // IB keeps the value; a second set is EINVAL.
    let t = n.socket();
    n.bind(t, sa(5, 4000)).unwrap();
    assert_eq!(n.setsockopt(t, SockOpt::Tos(3)), Ok(()));
    assert_eq!(n.getsockopt(t, SockOpt::Tos(0)), Ok(3));
    assert_eq!(n.setsockopt(t, SockOpt::Tos(4)), Err(Errno::EINVAL));
    // Once the socket has a connection: EINVAL.
    let u = n.socket();
    n.bind(u, sa(5, 4001)).unwrap();
    n.send(u, Some(sa(9, 4000)), &Payload::empty(), &SendOptions::default()).unwrap();
    assert_eq!(n.setsockopt(u, SockOpt::Tos(1)), Err(Errno::EINVAL));
    // Same on TCP (mapped to 0 first, then refused for the connection).
    let w = n.socket();
    n.bind(w, sa(1, 4002)).unwrap();
    n.send(w, Some(sa(9, 4000)), &Payload::empty(), &SendOptions::default()).unwrap();
    assert_eq!(n.setsockopt(w, SockOpt::Tos(1)), Err(Errno::EINVAL));
}

#[test]
fn tcp_tos_does_not_split_the_connection() {
    let mut net = Net::new(2);
    let a = net.nodes[0].socket();
    net.nodes[0].setsockopt(a, SockOpt::Transport(2)).unwrap();
    net.nodes[0].setsockopt(a, SockOpt::Tos(7)).unwrap();
    net.nodes[0].bind(a, sa(1, 5000)).unwrap();
    let a2 = net.bound(0, 5008);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"tos").unwrap();
    net.send(0, a2, sa(2, 4000), b"plain").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"tos".to_vec(), b"plain".to_vec()]);
    // One connection: every path Connect had TOS 0, one per path index.
    assert!(net.connects.iter().all(|c| c.1.tos == 0));
    assert_eq!(net.connects.len(), 8);
}

#[test]
fn recv_eagain_and_peek() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    assert_eq!(net.nodes[1].recv(b, false).unwrap_err(), Errno::EAGAIN);
    assert_eq!(net.nodes[1].recv(b, true).unwrap_err(), Errno::EAGAIN);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap(); // limit 2000
    net.send(0, a, sa(2, 4000), &[1; 1500]).unwrap();
    net.send(0, a, sa(2, 4000), &[2; 600]).unwrap();
    net.run();
    // 2100 > 2000: congested.
    assert_eq!(net.send(0, a, sa(2, 4000), &[3; 1]), Err(Errno::ENOBUFS));
    // Peeking leaves the message queued (and the socket congested).
    for _ in 0..3 {
        let i = data(net.nodes[1].recv(b, true).unwrap());
        assert_eq!(i.payload.len(), 1500);
        assert_eq!(i.from, sa(1, 5000));
        assert_eq!(i.to, sa(2, 4000));
    }
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4000), &[3; 1]), Err(Errno::ENOBUFS));
    assert!(net.nodes[1].readiness(b).readable);
    assert_eq!(data(net.nodes[1].recv(b, false).unwrap()).payload.len(), 1500);
    assert_eq!(data(net.nodes[1].recv(b, true).unwrap()).payload.len(), 600);
    assert_eq!(data(net.nodes[1].recv(b, false).unwrap()).payload.len(), 600);
    assert_eq!(net.nodes[1].recv(b, false).unwrap_err(), Errno::EAGAIN);
    assert!(!net.nodes[1].readiness(b).readable);
    // Every copy to the user counts, peeks included (s_recv_delivered).
    assert_eq!(net.nodes[1].counters().recv_delivered, 6);
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4000), &[3; 1]), Ok(1));
}

#[test]
fn peek_consumes_congestion_notifications() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.nodes[0].setsockopt(a, SockOpt::CongMonitor(true)).unwrap();
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    net.send(0, a, sa(2, 4000), &[0; 2001]).unwrap();
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4000), b"x"), Err(Errno::ENOBUFS));
    net.send(1, b, sa(1, 5000), b"data").unwrap();
    net.drain(1, b);
    net.run();
    // The notification is handed out once, peek or not; then the data.
    assert!(matches!(net.nodes[0].recv(a, true), Ok(Received::CongUpdate { mask }) if mask == 1 << (4000 % 64)));
    assert_eq!(&data(net.nodes[0].recv(a, true).unwrap()).payload[..], b"data");
    assert_eq!(&data(net.nodes[0].recv(a, false).unwrap()).payload[..], b"data");
    assert_eq!(net.nodes[0].recv(a, true).unwrap_err(), Errno::EAGAIN);
}
