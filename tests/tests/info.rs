//! Introspection of live engines: the kernel's RDS_INFO_* structs built from
//! a real connection, and the info socket answering another client with the
//! same snapshot the engine gives in-process.

use std::time::{Duration, Instant};

use rds_sock::info::kernel::{self, InfoError, InfoOk, opt};
use rds_sock::info::{ipc, sections};
use rds_tests::*;

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes(b[o..o + 4].try_into().unwrap())
}

fn name(b: &[u8]) -> &str {
    std::str::from_utf8(&b[..b.iter().position(|c| *c == 0).unwrap()]).unwrap()
}

#[test]
fn rds_info_getsockopt_on_a_live_connection() {
    let ip = addr_block(45);
    let (e1, e2) = (engine(), engine());
    let s = e1.socket().unwrap();
    s.bind(sa(ip(1), 5000)).unwrap();
    s.set_send_buffer_size(50_000).unwrap();
    let r = e2.socket().unwrap();
    r.bind(sa(ip(2), 4000)).unwrap();
    for i in 0..5u8 {
        s.send_to(&[i; 300], sa(ip(2), 4000)).unwrap();
    }
    let end = Instant::now() + Duration::from_secs(20);
    // (The accepting side's transport registers a connection just after its
    // node took it.)
    while e2.messages(rds_core::Queue::Recv).len() < 5
        || e1.connections()[0].paths_up() < 8
        || e2.tcp_connections().len() < 8
    {
        assert!(Instant::now() < end, "delivery and paths");
        std::thread::sleep(Duration::from_millis(2));
    }

    // Counters: ENOSPC with the needed length, then every name and value.
    let n = e2.counters().len();
    assert_eq!(e2.rds_info_getsockopt(opt::COUNTERS, &mut []), Err(InfoError::NoSpace { needed: 40 * n }));
    let mut buf = vec![0u8; 40 * n + 7];
    assert_eq!(e2.rds_info_getsockopt(opt::COUNTERS, &mut buf), Ok(InfoOk { each: 40, len: 40 * n }));
    let rows: Vec<(&str, u64)> = buf[..40 * n].chunks(40).map(|c| (name(&c[..32]), u64_at(c, 32))).collect();
    assert_eq!(rows[0].0, "conn_reset");
    assert_eq!(rows[36].0, "tcp_data_ready_calls");
    assert!(rows.contains(&("recv_queued", 5)), "{rows:?}");
    assert!(rows.contains(&("recv_bytes_added_to_sock", 1500)), "{rows:?}");

    // Connections: one, path 0, CONNECTED, "tcp", sequence numbers as the
    // snapshot has them.
    let mut buf = vec![0u8; 4096];
    let InfoOk { each, len } = e1.rds_info_getsockopt(opt::CONNECTIONS, &mut buf).unwrap();
    assert_eq!((each, len), (42, 42));
    let c = &e1.connections()[0];
    assert_eq!(u64_at(&buf, 0), c.path0().next_tx_seq);
    assert_eq!(u64_at(&buf, 8), c.path0().next_rx_seq);
    assert_eq!(&buf[16..20], &octets(ip(1)));
    assert_eq!(&buf[20..24], &octets(ip(2)));
    assert_eq!(name(&buf[24..40]), "tcp");
    assert_eq!(buf[40] & !1, 0x04, "CONNECTED (SENDING may flicker)");

    // Sockets: the receiver's, RDS's halves of the buffers, its inode-like number.
    let InfoOk { each, len } = e2.rds_info_getsockopt(opt::SOCKETS, &mut buf).unwrap();
    assert_eq!((each, len), (28, 28));
    let k = &e2.sockets()[0];
    assert_eq!(u32_at(&buf, 0), k.sndbuf);
    assert_eq!(&buf[12..14], &4000u16.to_be_bytes());
    assert_eq!(u32_at(&buf, 16), k.rcvbuf);
    assert_eq!(u64_at(&buf, 20), rds_core::info::inum_of(r.id()));
    let InfoOk { len, .. } = e1.rds_info_getsockopt(opt::SOCKETS, &mut buf).unwrap();
    assert_eq!(len, 28);
    assert_eq!(u32_at(&buf, 0), 50_000, "SO_SNDBUF 50000 is 100000, RDS uses half");

    // Receive queue: five rows of 300 bytes from 5000 to 4000, in order.
    let InfoOk { each, len } = e2.rds_info_getsockopt(opt::RECV_MESSAGES, &mut buf).unwrap();
    assert_eq!((each, len), (26, 5 * 26));
    let seqs: Vec<u64> = buf[..len].chunks(26).map(|m| u64_at(m, 0)).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    for m in buf[..len].chunks(26) {
        assert_eq!(u32_at(m, 8), 300);
        assert_eq!(&m[20..22], &4000u16.to_be_bytes());
        assert_eq!(&m[22..24], &5000u16.to_be_bytes());
    }
    // TCP sockets: one per path on each side.
    let InfoOk { each, len } = e2.rds_info_getsockopt(opt::TCP_SOCKETS, &mut buf).unwrap();
    assert_eq!((each, len), (41, 8 * 41));
    // No IB, no IPv6 rows for IPv4 nodes.
    assert_eq!(e2.rds_info_getsockopt(opt::IB_CONNECTIONS, &mut buf), Err(InfoError::NoProvider));
    assert_eq!(e2.rds_info_getsockopt(opt::RDS6_CONNECTIONS, &mut buf).unwrap(), InfoOk { each: 65, len: 65 });
    assert_eq!(kernel::size::RDS6_TCP_SOCKET, 64);
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

fn octets(a: std::net::IpAddr) -> [u8; 4] {
    match a {
        std::net::IpAddr::V4(v) => v.octets(),
        std::net::IpAddr::V6(_) => unreachable!(),
    }
}

#[test]
fn the_info_socket_answers_with_the_engines_snapshot_and_goes_away_on_shutdown() {
    let ip = addr_block(45);
    let e = engine();
    let a = e.socket().unwrap();
    a.bind(sa(ip(1), 4000)).unwrap();
    let b = e.socket().unwrap();
    b.bind(sa(ip(2), 4001)).unwrap();
    for i in 0..3u8 {
        a.send_to(&[i; 10], sa(ip(2), 4001)).unwrap();
    }
    let path = e.info_socket_path().expect("the engine serves its snapshots");
    assert_eq!(path.parent().unwrap(), ipc::runtime_dir());
    assert_eq!(path.file_name().unwrap().to_str().unwrap(), format!("{}.{}.sock", std::process::id(), e.number()));
    let remote = ipc::query(&path, sections::ALL).unwrap();
    let local = e.snapshot();
    assert_eq!(remote.node, local.node);
    assert_eq!(remote.node.addresses, vec![ip(1), ip(2)]);
    assert_eq!(remote.node.pid, std::process::id());
    assert_eq!(remote.sockets, local.sockets);
    assert_eq!(remote.recv, local.recv);
    assert_eq!(remote.recv.len(), 3, "three datagrams queued over loopback");
    assert_eq!(remote.connections, local.connections);
    let names: Vec<&String> = remote.counters.iter().map(|(n, _)| n).collect();
    assert_eq!(names, local.counters.iter().map(|(n, _)| n).collect::<Vec<_>>());
    // Only what was asked for.
    let only = ipc::query(&path, sections::SOCKETS).unwrap();
    assert_eq!(only.sockets, local.sockets);
    assert!(only.counters.is_empty() && only.connections.is_empty() && only.node.pid == 0);
    // The directory lists it.
    assert!(ipc::list(&ipc::runtime_dir()).unwrap().iter().any(|n| n.path == path));

    e.shutdown(Duration::ZERO);
    assert!(!path.exists(), "socket removed on shutdown");
    assert!(e.info_socket_path().is_none());
}
