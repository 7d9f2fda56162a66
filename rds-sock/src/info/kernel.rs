//! The kernel's `RDS_INFO_*` getsockopt answers, byte for byte.
//!
//! Layouts are Linux 6.1's `<linux/rds.h>` (all `packed`; host-endian
//! integers, big-endian addresses and ports): item sizes 40 (counter), 42
//! (connection), 26 (message), 28 (socket), 41 (TCP socket), and for the
//! IPv6 options 65, 50, 52 and 64.
//!
//! The protocol ([`getsockopt`]): with `n` items of `each` bytes, a buffer
//! shorter than `n * each` gets ENOSPC and the needed length; otherwise the
//! items are copied, the length is `n * each` and the return value is
//! `each`. Options with no provider (FLOWS, CONNECTION_STATS, IWARP, and the
//! IB ones: this build has no IB transport) get ENOPROTOOPT.
//!
//! Where we differ from 6.1 on purpose: the IPv4 SEND/RETRANS_MESSAGES rows
//! carry the real addresses (6.1 reports 0.0.0.0, a bug), and the needed
//! length of RDS_INFO_SOCKETS counts the IPv4-bound sockets it lists (6.1
//! counts every RDS socket of the host, listed or not). Counters end with
//! ours after the kernel's core and TCP counters.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use rds_core::{Errno, MsgSnapshot};

use super::Snapshot;

/// `RDS_INFO_*` option numbers.
pub mod opt {
    pub const COUNTERS: i32 = 10000;
    pub const CONNECTIONS: i32 = 10001;
    pub const FLOWS: i32 = 10002;
    pub const SEND_MESSAGES: i32 = 10003;
    pub const RETRANS_MESSAGES: i32 = 10004;
    pub const RECV_MESSAGES: i32 = 10005;
    pub const SOCKETS: i32 = 10006;
    pub const TCP_SOCKETS: i32 = 10007;
    pub const IB_CONNECTIONS: i32 = 10008;
    pub const CONNECTION_STATS: i32 = 10009;
    pub const IWARP_CONNECTIONS: i32 = 10010;
    pub const RDS6_CONNECTIONS: i32 = 10011;
    pub const RDS6_SEND_MESSAGES: i32 = 10012;
    pub const RDS6_RETRANS_MESSAGES: i32 = 10013;
    pub const RDS6_RECV_MESSAGES: i32 = 10014;
    pub const RDS6_SOCKETS: i32 = 10015;
    pub const RDS6_TCP_SOCKETS: i32 = 10016;
    pub const RDS6_IB_CONNECTIONS: i32 = 10017;
}

/// Item sizes (`sizeof` of the packed structs).
pub mod size {
    pub const COUNTER: usize = 40;
    pub const CONNECTION: usize = 42;
    pub const MESSAGE: usize = 26;
    pub const SOCKET: usize = 28;
    pub const TCP_SOCKET: usize = 41;
    pub const RDS6_CONNECTION: usize = 65;
    pub const RDS6_MESSAGE: usize = 50;
    pub const RDS6_SOCKET: usize = 52;
    pub const RDS6_TCP_SOCKET: usize = 64;
}

/// A successful answer: the return value (`each`) and the new `optlen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InfoOk {
    pub each: usize,
    pub len: usize,
}

/// A failed answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InfoError {
    /// ENOSPC: the buffer is shorter than `needed`, the new `optlen`.
    NoSpace { needed: usize },
    /// ENOPROTOOPT: no provider for this option.
    NoProvider,
}

impl InfoError {
    pub fn errno(self) -> Errno {
        match self {
            InfoError::NoSpace { .. } => Errno::ENOSPC,
            InfoError::NoProvider => Errno::ENOPROTOOPT,
        }
    }
}

/// `getsockopt(SOL_RDS, opt, buf, &optlen)` with `optlen = buf.len()`.
pub fn getsockopt(snap: &Snapshot, opt: i32, buf: &mut [u8]) -> Result<InfoOk, InfoError> {
    let (each, items) = items(snap, opt).ok_or(InfoError::NoProvider)?;
    let needed = each * items.len();
    if needed > buf.len() {
        return Err(InfoError::NoSpace { needed });
    }
    for (i, it) in items.iter().enumerate() {
        debug_assert_eq!(it.len(), each);
        buf[i * each..(i + 1) * each].copy_from_slice(it);
    }
    Ok(InfoOk { each, len: needed })
}

/// The IPv4 address of an IPv4 or IPv4-mapped address.
fn v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(a) => a.to_ipv4_mapped(),
    }
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// Builds one packed struct.
struct Item(Vec<u8>);

impl Item {
    fn new() -> Item {
        Item(Vec::with_capacity(72))
    }
    fn u8(mut self, v: u8) -> Item {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Item {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Item {
        self.0.extend_from_slice(&v.to_ne_bytes());
        self
    }
    fn be16(mut self, v: u16) -> Item {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn in4(mut self, a: Ipv4Addr) -> Item {
        self.0.extend_from_slice(&a.octets());
        self
    }
    fn in6(mut self, a: Ipv6Addr) -> Item {
        self.0.extend_from_slice(&a.octets());
        self
    }
    /// A NUL-padded string field of `n` bytes (always NUL-terminated).
    fn name(mut self, s: &str, n: usize) -> Item {
        let b = s.as_bytes();
        let k = b.len().min(n - 1);
        self.0.extend_from_slice(&b[..k]);
        self.0.resize(self.0.len() + (n - k), 0);
        self
    }
}

const TRANSPORT_NAME_MAX: usize = 16;
const COUNTER_NAME_MAX: usize = 32;

/// (item size, items) of an option; `None` when it has no provider.
fn items(snap: &Snapshot, opt: i32) -> Option<(usize, Vec<Vec<u8>>)> {
    let unspec = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let conn_flags = |c: &rds_core::ConnSnapshot| c.path0().flags;
    let tos_of_path = |p: Option<rds_core::PathId>| {
        p.and_then(|p| snap.connections.iter().find(|c| c.id == p.conn)).map_or(0, |c| c.tos)
    };
    let msgs = |list: &[MsgSnapshot], six: bool| -> Vec<Vec<u8>> {
        list.iter()
            .filter_map(|m| {
                let it = Item::new().u64(m.seq).u32(m.len);
                let it =
                    if six { it.in6(v6(m.laddr)).in6(v6(m.faddr)) } else { it.in4(v4(m.laddr)?).in4(v4(m.faddr)?) };
                Some(it.be16(m.lport).be16(m.fport).u8(0).u8(m.tos).0)
            })
            .collect()
    };
    Some(match opt {
        opt::COUNTERS => (
            size::COUNTER,
            snap.counters.iter().map(|(n, v)| Item::new().name(n, COUNTER_NAME_MAX).u64(*v).0).collect(),
        ),
        opt::CONNECTIONS | opt::RDS6_CONNECTIONS => {
            let six = opt == opt::RDS6_CONNECTIONS;
            let rows = snap
                .connections
                .iter()
                .filter_map(|c| {
                    let p0 = c.path0();
                    let it = Item::new().u64(p0.next_tx_seq).u64(p0.next_rx_seq);
                    let it =
                        if six { it.in6(v6(c.laddr)).in6(v6(c.faddr)) } else { it.in4(v4(c.laddr)?).in4(v4(c.faddr)?) };
                    let it = it.name(c.transport.name(), TRANSPORT_NAME_MAX).u8(conn_flags(c));
                    // The IPv6 struct has no tos.
                    Some(if six { it.0 } else { it.u8(c.tos).0 })
                })
                .collect();
            (if six { size::RDS6_CONNECTION } else { size::CONNECTION }, rows)
        }
        opt::SEND_MESSAGES => (size::MESSAGE, msgs(&snap.send, false)),
        opt::RETRANS_MESSAGES => (size::MESSAGE, msgs(&snap.retrans, false)),
        opt::RECV_MESSAGES => (size::MESSAGE, msgs(&snap.recv, false)),
        opt::RDS6_SEND_MESSAGES => (size::RDS6_MESSAGE, msgs(&snap.send, true)),
        opt::RDS6_RETRANS_MESSAGES => (size::RDS6_MESSAGE, msgs(&snap.retrans, true)),
        opt::RDS6_RECV_MESSAGES => (size::RDS6_MESSAGE, msgs(&snap.recv, true)),
        opt::SOCKETS => {
            // IPv4-bound sockets only.
            let rows = snap
                .sockets
                .iter()
                .filter_map(|s| {
                    let b = s.bound?;
                    let c = s.connected.unwrap_or(unspec);
                    Some(
                        Item::new()
                            .u32(s.sndbuf)
                            .in4(v4(b.ip())?)
                            .in4(v4(c.ip()).unwrap_or(Ipv4Addr::UNSPECIFIED))
                            .be16(b.port())
                            .be16(c.port())
                            .u32(s.rcvbuf)
                            .u64(s.inum)
                            .0,
                    )
                })
                .collect();
            (size::SOCKET, rows)
        }
        opt::RDS6_SOCKETS => {
            // Every socket, unbound ones too.
            let rows = snap
                .sockets
                .iter()
                .map(|s| {
                    let b = s.bound.unwrap_or(unspec);
                    let c = s.connected.unwrap_or(unspec);
                    let addr6 = |a: SocketAddr| if a == unspec { Ipv6Addr::UNSPECIFIED } else { v6(a.ip()) };
                    Item::new()
                        .u32(s.sndbuf)
                        .in6(addr6(b))
                        .in6(addr6(c))
                        .be16(b.port())
                        .be16(c.port())
                        .u32(s.rcvbuf)
                        .u64(s.inum)
                        .0
                })
                .collect();
            (size::RDS6_SOCKET, rows)
        }
        opt::TCP_SOCKETS | opt::RDS6_TCP_SOCKETS => {
            let six = opt == opt::RDS6_TCP_SOCKETS;
            let rows = snap
                .tcp
                .iter()
                .filter_map(|t| {
                    let l = t.local.unwrap_or(unspec);
                    let p = t.peer.unwrap_or(unspec);
                    let it = if six {
                        Item::new().in6(v6(l.ip())).be16(l.port()).in6(v6(p.ip())).be16(p.port())
                    } else {
                        Item::new().in4(v4(l.ip())?).be16(l.port()).in4(v4(p.ip())?).be16(p.port())
                    };
                    let it = it
                        .u64(t.hdr_rem)
                        .u64(t.data_rem)
                        .u32(t.last_sent_nxt)
                        .u32(t.last_expected_una)
                        .u32(t.last_seen_una);
                    Some(if six { it.0 } else { it.u8(tos_of_path(t.path)).0 })
                })
                .collect();
            (if six { size::RDS6_TCP_SOCKET } else { size::TCP_SOCKET }, rows)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rds_core::{
        ConnId, ConnSnapshot, PathId, PathSnapshot, PathState, SockSnapshot, TransportConnInfo, TransportKind,
    };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn snap() -> Snapshot {
        let path = |i: u8, state: PathState, flags: u8| PathSnapshot {
            index: i,
            state,
            flags,
            next_tx_seq: 100 + u64::from(i),
            next_rx_seq: 200 + u64::from(i),
            send_queue: 0,
            retrans: 0,
            queued_bytes: 0,
            connects: 1,
        };
        Snapshot {
            counters: vec![("conn_reset".into(), 3), ("tcp_data_ready_calls".into(), 0x0102_0304_0506_0708)],
            connections: vec![
                ConnSnapshot {
                    id: ConnId(0),
                    laddr: ip("10.0.0.1"),
                    faddr: ip("10.0.0.2"),
                    transport: TransportKind::Tcp,
                    tos: 0,
                    npaths: 8,
                    peer_gen: 0,
                    paths: vec![path(0, PathState::Up, 0x05), path(1, PathState::Connecting, 0x02)],
                },
                ConnSnapshot {
                    id: ConnId(1),
                    laddr: ip("fd00::1"),
                    faddr: ip("fd00::2"),
                    transport: TransportKind::Loop,
                    tos: 3,
                    npaths: 1,
                    peer_gen: 0,
                    paths: vec![path(0, PathState::Up, 0x04)],
                },
            ],
            sockets: vec![
                SockSnapshot {
                    inum: 0x1122,
                    bound: Some("10.0.0.1:4000".parse().unwrap()),
                    connected: Some("10.0.0.2:5000".parse().unwrap()),
                    sndbuf: 106496,
                    rcvbuf: 53248,
                    snd_bytes: 0,
                    rcv_bytes: 0,
                    recv_queue: 0,
                    transport: Some(TransportKind::Tcp),
                    congested: false,
                    cong_monitor: false,
                },
                SockSnapshot {
                    inum: 7,
                    bound: None,
                    connected: None,
                    sndbuf: 106496,
                    rcvbuf: 106496,
                    snd_bytes: 0,
                    rcv_bytes: 0,
                    recv_queue: 0,
                    transport: None,
                    congested: false,
                    cong_monitor: false,
                },
            ],
            send: vec![MsgSnapshot {
                seq: 9,
                len: 1000,
                laddr: ip("10.0.0.1"),
                lport: 4000,
                faddr: ip("10.0.0.2"),
                fport: 5000,
                tos: 0,
                path: Some(0),
            }],
            tcp: vec![TransportConnInfo {
                path: Some(PathId { conn: ConnId(0), index: 0 }),
                local: Some("10.0.0.1:40000".parse().unwrap()),
                peer: Some("10.0.0.2:16385".parse().unwrap()),
                hdr_rem: 48,
                data_rem: 0,
                last_sent_nxt: 1,
                last_expected_una: 2,
                last_seen_una: 3,
                ..TransportConnInfo::default()
            }],
            ..Snapshot::default()
        }
    }

    #[test]
    fn enospc_reports_the_needed_length_then_the_items_fit() {
        let s = snap();
        let mut empty = [];
        assert_eq!(getsockopt(&s, opt::COUNTERS, &mut empty), Err(InfoError::NoSpace { needed: 80 }));
        let mut short = [0xaau8; 79];
        assert_eq!(getsockopt(&s, opt::COUNTERS, &mut short), Err(InfoError::NoSpace { needed: 80 }));
        assert!(short.iter().all(|b| *b == 0xaa), "nothing copied on ENOSPC");
        let mut buf = [0xaau8; 100];
        assert_eq!(getsockopt(&s, opt::COUNTERS, &mut buf), Ok(InfoOk { each: 40, len: 80 }));
        let mut name = [0u8; 32];
        name[..10].copy_from_slice(b"conn_reset");
        assert_eq!(&buf[..32], &name);
        assert_eq!(u64::from_ne_bytes(buf[32..40].try_into().unwrap()), 3);
        assert_eq!(&buf[40..60], b"tcp_data_ready_calls");
        assert!(buf[60..72].iter().all(|b| *b == 0));
        assert_eq!(u64::from_ne_bytes(buf[72..80].try_into().unwrap()), 0x0102_0304_0506_0708);
        assert!(buf[80..].iter().all(|b| *b == 0xaa), "nothing written past optlen");
        assert_eq!(InfoError::NoSpace { needed: 1 }.errno(), Errno::ENOSPC);
    }

    #[test]
    fn options_without_provider_are_enoprotoopt() {
        let s = snap();
        let mut buf = [0u8; 4096];
        for o in [
            opt::FLOWS,
            opt::CONNECTION_STATS,
            opt::IWARP_CONNECTIONS,
            opt::IB_CONNECTIONS,
            opt::RDS6_IB_CONNECTIONS,
            9999,
            10018,
        ] {
            assert_eq!(getsockopt(&s, o, &mut buf), Err(InfoError::NoProvider), "option {o}");
        }
        assert_eq!(InfoError::NoProvider.errno(), Errno::ENOPROTOOPT);
    }

    #[test]
    fn connection_rows_are_path_0_ipv4_only_in_the_ipv4_option() {
        let s = snap();
        let mut buf = [0u8; 1024];
        let r = getsockopt(&s, opt::CONNECTIONS, &mut buf).unwrap();
        assert_eq!(r, InfoOk { each: 42, len: 42 });
        assert_eq!(u64::from_ne_bytes(buf[0..8].try_into().unwrap()), 100);
        assert_eq!(u64::from_ne_bytes(buf[8..16].try_into().unwrap()), 200);
        assert_eq!(&buf[16..20], &[10, 0, 0, 1]);
        assert_eq!(&buf[20..24], &[10, 0, 0, 2]);
        assert_eq!(&buf[24..40], b"tcp\0\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(buf[40], 0x05);
        assert_eq!(buf[41], 0);
        let r = getsockopt(&s, opt::RDS6_CONNECTIONS, &mut buf).unwrap();
        assert_eq!(r, InfoOk { each: 65, len: 130 });
        assert_eq!(&buf[16..32], &"::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap().octets());
        let second = &buf[65..130];
        assert_eq!(&second[16..32], &"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(&second[48..56], b"loopback");
        assert_eq!(second[64], 0x04);
    }

    #[test]
    fn socket_message_and_tcp_layouts() {
        let s = snap();
        let mut buf = [0u8; 1024];
        // IPv4 sockets: the unbound one is not listed.
        assert_eq!(getsockopt(&s, opt::SOCKETS, &mut buf).unwrap(), InfoOk { each: 28, len: 28 });
        assert_eq!(u32::from_ne_bytes(buf[0..4].try_into().unwrap()), 106496);
        assert_eq!(&buf[4..8], &[10, 0, 0, 1]);
        assert_eq!(&buf[8..12], &[10, 0, 0, 2]);
        assert_eq!(&buf[12..14], &4000u16.to_be_bytes());
        assert_eq!(&buf[14..16], &5000u16.to_be_bytes());
        assert_eq!(u32::from_ne_bytes(buf[16..20].try_into().unwrap()), 53248);
        assert_eq!(u64::from_ne_bytes(buf[20..28].try_into().unwrap()), 0x1122);
        // IPv6 sockets: both, the unbound one with :: and port 0.
        assert_eq!(getsockopt(&s, opt::RDS6_SOCKETS, &mut buf).unwrap(), InfoOk { each: 52, len: 104 });
        assert!(buf[52 + 4..52 + 40].iter().all(|b| *b == 0));
        assert_eq!(u64::from_ne_bytes(buf[52 + 44..52 + 52].try_into().unwrap()), 7);

        assert_eq!(getsockopt(&s, opt::SEND_MESSAGES, &mut buf).unwrap(), InfoOk { each: 26, len: 26 });
        assert_eq!(u64::from_ne_bytes(buf[0..8].try_into().unwrap()), 9);
        assert_eq!(u32::from_ne_bytes(buf[8..12].try_into().unwrap()), 1000);
        assert_eq!(&buf[12..16], &[10, 0, 0, 1]);
        assert_eq!(&buf[16..20], &[10, 0, 0, 2]);
        assert_eq!(&buf[20..22], &4000u16.to_be_bytes());
        assert_eq!(&buf[22..24], &5000u16.to_be_bytes());
        assert_eq!((buf[24], buf[25]), (0, 0));
        assert_eq!(getsockopt(&s, opt::RETRANS_MESSAGES, &mut buf).unwrap(), InfoOk { each: 26, len: 0 });
        assert_eq!(getsockopt(&s, opt::RDS6_SEND_MESSAGES, &mut buf).unwrap(), InfoOk { each: 50, len: 50 });

        assert_eq!(getsockopt(&s, opt::TCP_SOCKETS, &mut buf).unwrap(), InfoOk { each: 41, len: 41 });
        assert_eq!(&buf[0..4], &[10, 0, 0, 1]);
        assert_eq!(&buf[4..6], &40000u16.to_be_bytes());
        assert_eq!(&buf[6..10], &[10, 0, 0, 2]);
        assert_eq!(&buf[10..12], &16385u16.to_be_bytes());
        assert_eq!(u64::from_ne_bytes(buf[12..20].try_into().unwrap()), 48);
        assert_eq!(u64::from_ne_bytes(buf[20..28].try_into().unwrap()), 0);
        assert_eq!(u32::from_ne_bytes(buf[28..32].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(buf[32..36].try_into().unwrap()), 2);
        assert_eq!(u32::from_ne_bytes(buf[36..40].try_into().unwrap()), 3);
        assert_eq!(buf[40], 0);
        assert_eq!(getsockopt(&s, opt::RDS6_TCP_SOCKETS, &mut buf).unwrap(), InfoOk { each: 64, len: 64 });
    }

    #[test]
    fn zero_items_return_the_item_size_and_length_0() {
        let s = Snapshot::default();
        let mut empty = [];
        assert_eq!(getsockopt(&s, opt::RECV_MESSAGES, &mut empty), Ok(InfoOk { each: 26, len: 0 }));
        assert_eq!(getsockopt(&s, opt::TCP_SOCKETS, &mut empty), Ok(InfoOk { each: 41, len: 0 }));
    }
}
