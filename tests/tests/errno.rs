//! One test per errno of the socket API, with the kernel's values.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rds_sock::{RecvFlags, SendFlags, TransportKind};
use rds_tests::*;

fn errno(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    r.expect_err("expected an error").raw_os_error().expect("an errno")
}

#[test]
fn bind_eaddrinuse_for_a_taken_port() {
    let ip = addr_block(42);
    let e = engine();
    let a = e.socket().unwrap();
    let b = e.socket().unwrap();
    a.bind(sa(ip(1), 5000)).unwrap();
    assert_eq!(errno(b.bind(sa(ip(1), 5000))), libc::EADDRINUSE);
    // The same port on another address is fine.
    b.bind(sa(ip(2), 5000)).unwrap();
}

#[test]
fn bind_eaddrinuse_for_an_address_another_node_serves() {
    let ip = addr_block(42);
    let e1 = engine();
    let e2 = engine();
    e1.socket().unwrap().bind(sa(ip(1), 4001)).unwrap();
    assert_eq!(errno(e2.socket().unwrap().bind(sa(ip(1), 4002))), libc::EADDRINUSE);
}

#[test]
fn bind_einval_for_port_1_the_probe_port() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    assert_eq!(errno(s.bind(sa(ip(1), 1))), libc::EINVAL);
    s.bind(sa(ip(1), 2)).unwrap();
}

#[test]
fn bind_port_zero_picks_a_free_port() {
    let ip = addr_block(42);
    let e = engine();
    let mut ports = std::collections::HashSet::new();
    let mut keep = Vec::new();
    for _ in 0..50 {
        let s = e.socket().unwrap();
        s.bind(sa(ip(1), 0)).unwrap();
        let p = s.local_addr().unwrap().port();
        assert_ne!(p, 0);
        assert!(ports.insert(p), "port {p} handed out twice");
        keep.push(s);
    }
}

/// Threads binding to an address the engine does not serve yet, all at
/// once: each bind that finds it unserved starts serving it or waits for
/// the one that does, and none fails. (A bind that found the address
/// unserved and then saw another thread's serve finish returned its first
/// EADDRNOTAVAIL: rds-stress's task sockets failed "bind ...: Cannot assign
/// requested address" about once in a few hundred runs.)
#[test]
fn concurrent_binds_to_an_address_not_yet_served_all_succeed() {
    const THREADS: usize = 8;
    let ip = addr_block(42);
    let e = engine();
    for host in 1..=250u8 {
        let barrier = std::sync::Barrier::new(THREADS);
        let results: Vec<std::io::Result<()>> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (e, barrier) = (&e, &barrier);
                    sc.spawn(move || {
                        let s = e.socket().unwrap();
                        barrier.wait();
                        // Spread the binds over the first one's serve
                        // (tens of microseconds: two TCP sockets, a listen).
                        let until = Instant::now() + Duration::from_micros(7 * t as u64 * u64::from(host % 8));
                        while Instant::now() < until {
                            std::hint::spin_loop();
                        }
                        s.bind(sa(ip(host), 4000 + t as u16)).map(|()| drop(s))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (t, r) in results.iter().enumerate() {
            assert!(r.is_ok(), "address {} thread {t}: {r:?}", ip(host));
        }
    }
}

#[test]
fn bind_eaddrnotavail_for_an_address_the_host_lacks() {
    let e = engine();
    let s = e.socket().unwrap();
    // 192.0.2.0/24 is TEST-NET-1: never configured here.
    assert_eq!(errno(s.bind(sa(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), 4000))), libc::EADDRNOTAVAIL);
}

/// The address check binds a TCP socket without taking a port
/// (`IP_BIND_ADDRESS_NO_PORT`, set at the IP level): an IPv6 address too.
/// (The only test in this binary that serves [::1].)
#[test]
fn bind_ipv6_loopback_and_eaddrnotavail_for_an_ipv6_address_the_host_lacks() {
    let e = engine();
    e.socket().unwrap().bind(sa(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), 4000)).unwrap();
    // 2001:db8::/32 is for documentation: never configured here.
    let doc = IpAddr::V6(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
    assert_eq!(errno(e.socket().unwrap().bind(sa(doc, 4000))), libc::EADDRNOTAVAIL);
}

#[test]
fn bind_einval_for_any_address_and_second_bind() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    assert_eq!(errno(s.bind(sa(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 4000))), libc::EINVAL);
    assert_eq!(errno(s.bind(sa(IpAddr::V4(Ipv4Addr::BROADCAST), 4000))), libc::EINVAL);
    assert_eq!(errno(s.bind(sa(IpAddr::V4(Ipv4Addr::new(224, 0, 0, 1)), 4000))), libc::EINVAL);
    s.bind(sa(ip(1), 4000)).unwrap();
    assert_eq!(errno(s.bind(sa(ip(1), 4001))), libc::EINVAL);
}

#[test]
fn send_enotconn_unbound_or_without_destination() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    assert_eq!(errno(s.send_to(b"x", sa(ip(2), 4001))), libc::ENOTCONN);
    s.bind(sa(ip(1), 4001)).unwrap();
    assert_eq!(errno(s.send(b"x")), libc::ENOTCONN);
    assert_eq!(errno(s.peer_addr()), libc::ENOTCONN);
}

#[test]
fn send_emsgsize_above_1mib_and_above_the_send_buffer() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    s.bind(sa(ip(1), 4001)).unwrap();
    let dst = sa(ip(1), 4002);
    // Default SO_SNDBUF: at most half of it per message.
    let limit = s.send_buffer_size().unwrap() / 2;
    assert_eq!(errno(s.send_to(&vec![0; limit + 1], dst)), libc::EMSGSIZE);
    s.send_to(&vec![0; limit], dst).unwrap();
    s.set_send_buffer_size_force(8 << 20).unwrap();
    s.send_to(&vec![0; 1 << 20], dst).unwrap();
    assert_eq!(errno(s.send_to(&vec![0; (1 << 20) + 1], dst)), libc::EMSGSIZE);
}

#[test]
fn so_sndbuf_doubles_and_caps_like_the_kernel() {
    let e = engine();
    let s = e.socket().unwrap();
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max").unwrap().trim().parse().unwrap();
    s.set_send_buffer_size(10_000).unwrap();
    assert_eq!(s.send_buffer_size().unwrap(), 20_000);
    s.set_send_buffer_size(100).unwrap();
    assert_eq!(s.send_buffer_size().unwrap(), 4608, "SOCK_MIN_SNDBUF");
    s.set_send_buffer_size(usize::MAX >> 8).unwrap();
    assert_eq!(s.send_buffer_size().unwrap(), 2 * wmem_max);
}

#[test]
fn send_eagain_when_the_send_buffer_is_full_and_blocking_waits() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    s.bind(sa(ip(1), 4001)).unwrap();
    s.set_send_buffer_size(20_000).unwrap(); // 40000, 20000 usable
    s.set_nonblocking(true).unwrap();
    // Nobody serves ip(9): messages stay queued, unacked.
    let dst = sa(ip(9), 4001);
    let mut sent = 0;
    let err = loop {
        match s.send_to(&[7; 4000], dst) {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 100);
    };
    assert_eq!(err.raw_os_error(), Some(libc::EAGAIN));
    assert_eq!(sent, 5, "accepted while the queued bytes were below 20000");
    // Not writable for poll either.
    let mut p = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0);
    // A blocking send waits for room, up to the write timeout.
    s.set_nonblocking(false).unwrap();
    s.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let t = Instant::now();
    assert_eq!(errno(s.send_to(&[7; 4000], dst)), libc::ETIMEDOUT);
    assert!(t.elapsed() >= Duration::from_millis(190));
    // MSG_DONTWAIT overrides the blocking mode.
    let f = SendFlags { dontwait: true, ..SendFlags::default() };
    assert_eq!(errno(s.send_msg(&[7; 10], Some(dst), &f)), libc::EAGAIN);
    // Cancelling frees the buffer.
    assert_eq!(s.cancel_sent_to(dst).unwrap(), 5);
    s.send_to(&[7; 4000], dst).unwrap();
}

#[test]
fn blocking_send_completes_once_the_peer_acks() {
    let ip = addr_block(42);
    let Pair { e1: _e1, e2: _e2, a, b } = pair(ip, 4001);
    // 20000 usable bytes: five 4000-byte messages in flight at most, so the
    // sender blocks on the buffer and on the receiver's congestion in turn.
    a.set_send_buffer_size(20_000).unwrap();
    let rx = std::thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        for i in 0..200u32 {
            let (n, from) = b.recv_from(&mut buf).unwrap();
            assert_eq!(from, sa(ip(1), 4001));
            assert_eq!(&buf[..n], &i.to_le_bytes().repeat(1000)[..]);
        }
    });
    for i in 0..200u32 {
        a.send_to(&i.to_le_bytes().repeat(1000), sa(ip(2), 4001)).unwrap();
    }
    rx.join().unwrap();
    assert!(a.flush(Duration::from_secs(5)));
}

#[test]
fn blocking_send_waits_for_a_congested_port_then_delivers() {
    let ip = addr_block(42);
    let Pair { e1: _e1, e2: _e2, a, b } = pair(ip, 4001);
    b.set_recv_buffer_size(10_000).unwrap(); // congested above 10000 queued bytes
    a.set_nonblocking(true).unwrap();
    let mut sent = 0u32;
    let err = loop {
        match a.send_to(&[sent as u8; 3000], sa(ip(2), 4001)) {
            Ok(_) => sent += 1,
            Err(e) => break e,
        }
        // Let the map update arrive before deciding the port is not congested.
        std::thread::sleep(Duration::from_millis(20));
        assert!(sent < 50, "never congested");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOBUFS));
    // The fourth 3000-byte message crossed 10000 queued bytes; the fifth
    // arrived while the port was congested, which told our node.
    assert_eq!(sent, 5, "the fifth 3000-byte message announced the congestion");
    a.set_nonblocking(false).unwrap();
    let t = std::thread::spawn(move || {
        a.send_to(b"after", sa(ip(2), 4001)).unwrap();
        a
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(!t.is_finished(), "a blocking send waits while the port is congested");
    let mut buf = [0u8; 4096];
    for i in 0..sent {
        let (n, _) = b.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[i as u8; 3000][..]);
    }
    let a = t.join().unwrap();
    let (n, _) = b.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"after");
    drop(a);
}

#[test]
fn so_rds_transport_rules() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    assert_eq!(s.transport_raw().unwrap(), 0xffff_ffff, "RDS_TRANS_NONE before bind");
    assert_eq!(errno(s.set_transport_raw(3)), libc::EINVAL);
    assert_eq!(errno(s.set_transport_raw(-1)), libc::EINVAL);
    assert_eq!(errno(s.set_transport_raw(1)), libc::ENOPROTOOPT, "iWARP is gone");
    s.set_transport(TransportKind::Tcp).unwrap();
    assert_eq!(errno(s.set_transport(TransportKind::Tcp)), libc::EOPNOTSUPP, "only once");
    let t = e.socket().unwrap();
    t.bind(sa(ip(1), 4001)).unwrap();
    assert_eq!(t.transport_raw().unwrap(), 2, "RDS_TRANS_TCP after bind");
    assert_eq!(errno(t.set_transport(TransportKind::Tcp)), libc::EOPNOTSUPP, "not after bind");
}

#[test]
fn recv_eagain_nonblocking_and_etimedout_with_a_timeout() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    s.bind(sa(ip(1), 4001)).unwrap();
    let mut b = [0u8; 8];
    s.set_nonblocking(true).unwrap();
    assert_eq!(errno(s.recv_from(&mut b)), libc::EAGAIN);
    s.set_nonblocking(false).unwrap();
    assert_eq!(errno(s.recv_msg(&mut b, RecvFlags { dontwait: true, ..RecvFlags::default() })), libc::EAGAIN);
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let t = Instant::now();
    assert_eq!(errno(s.recv_from(&mut b)), libc::ETIMEDOUT);
    assert!(t.elapsed() >= Duration::from_millis(95));
}

#[test]
fn recv_truncates_and_msg_trunc_reports_the_full_length() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    s.bind(sa(ip(1), 4001)).unwrap();
    for _ in 0..3 {
        s.send_to(b"0123456789", sa(ip(1), 4001)).unwrap();
    }
    let mut b = [0u8; 4];
    let m = s.recv_msg(&mut b, RecvFlags::default()).unwrap();
    assert_eq!((m.len, m.truncated, &b), (4, true, b"0123"));
    let m = s.recv_msg(&mut b, RecvFlags { trunc: true, ..RecvFlags::default() }).unwrap();
    assert_eq!((m.len, m.truncated), (10, true));
    let mut big = [0u8; 64];
    let m = s.recv_msg(&mut big, RecvFlags { peek: true, ..RecvFlags::default() }).unwrap();
    assert_eq!((m.len, m.truncated), (10, false));
    let m = s.recv_msg(&mut big, RecvFlags::default()).unwrap();
    assert_eq!((m.len, m.from), (10, Some(sa(ip(1), 4001))));
    s.set_nonblocking(true).unwrap();
    assert_eq!(errno(s.recv_from(&mut big)), libc::EAGAIN, "peek did not consume, the truncated ones were consumed");
}

#[test]
fn fd_is_readable_exactly_when_data_is_queued() {
    let ip = addr_block(42);
    let Pair { e1: _e1, e2: _e2, a, b } = pair(ip, 4001);
    let poll = |fd: i32, timeout: i32| {
        let mut p = libc::pollfd { fd, events: libc::POLLIN | libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout) };
        (p.revents & libc::POLLIN != 0, p.revents & libc::POLLOUT != 0)
    };
    let fd = b.as_raw_fd();
    assert_eq!(poll(fd, 0), (false, true));
    a.send_to(b"hello", sa(ip(2), 4001)).unwrap();
    // Wait for it with poll itself.
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1);
    assert_eq!(poll(fd, 0), (true, true));
    let mut buf = [0u8; 16];
    assert_eq!(b.recv_from(&mut buf).unwrap().0, 5);
    assert_eq!(poll(fd, 0), (false, true));
}

#[test]
fn send_einval_for_a_bad_destination() {
    let ip = addr_block(42);
    let e = engine();
    let s = e.socket().unwrap();
    s.bind(sa(ip(1), 4001)).unwrap();
    assert_eq!(errno(s.send_to(b"x", sa(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 1))), libc::EINVAL);
    assert_eq!(errno(s.send_to(b"x", sa(IpAddr::V4(Ipv4Addr::new(239, 1, 1, 1)), 1))), libc::EINVAL);
}
