//! Sockets (`struct rds_sock`, `af_rds.c`, `bind.c`): their state (binding,
//! buffer accounting, the receive and notification queues, congestion
//! monitoring, options) and the socket API with the kernel's errno rules:
//! `socket`, `bind`, `connect`, `setsockopt` / `getsockopt`, readiness,
//! `close`, and the address check `bind`, `connect` and `sendmsg` share.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};

use crate::message::{Incoming, Notification};
use crate::node::{Endpoint, Node};
use crate::types::{ConnId, Errno, RDS_TRANS_NONE, SockId, TransportKind};

/// Kernel constants for socket buffers.
pub mod bufs {
    /// `SOCK_MIN_SNDBUF` on x86_64.
    pub const SOCK_MIN_SNDBUF: u32 = 4608;
    /// `SOCK_MIN_RCVBUF` on x86_64.
    pub const SOCK_MIN_RCVBUF: u32 = 2304;
    /// Default `net.core.wmem_default` / `rmem_default` / `*_max`.
    pub const DEFAULT_BUF: u32 = 212_992;
}

/// The address check of `bind`, `connect` and `sendmsg`: true for an
/// address a socket can never bind to or send to: IPv4 any, broadcast or
/// multicast, IPv6 any or multicast, and the v4-mapped forms of the IPv4
/// ones. Each caller answers with its own errno (`rds_bind`: EINVAL,
/// `rds_sendmsg`: EINVAL, `rds_connect`: EDESTADDRREQ / EINVAL /
/// EPROTOTYPE).
pub(crate) fn not_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
            None => v6.is_unspecified() || v6.is_multicast(),
        },
    }
}

#[derive(Debug)]
pub(crate) struct Sock {
    pub bound: Option<SocketAddr>,
    /// Chosen by SO_RDS_TRANSPORT or by bind.
    pub transport: Option<TransportKind>,
    /// Default destination set by `connect`.
    pub conn_addr: Option<SocketAddr>,
    /// `sk_sndbuf` / `sk_rcvbuf` (already doubled, as getsockopt shows them).
    pub sndbuf: u32,
    pub rcvbuf: u32,
    /// Payload bytes queued for send and not yet acked.
    pub snd_bytes: u64,
    /// Payload bytes on the receive queue.
    pub rcv_bytes: u64,
    pub congested: bool,
    /// Its congestion went out to the peers, or is on its way (a map
    /// update queued or taken since it began): its end must follow
    /// (`Node::recheck_congestion`).
    pub cong_announced: bool,
    pub recv_queue: VecDeque<Incoming>,
    pub notify_queue: VecDeque<Notification>,
    pub cong_monitor: bool,
    /// Port groups a non-blocking send found congested (`rs_cong_mask`).
    pub cong_mask: u64,
    /// Port groups uncongested since, not yet reported (`rs_cong_notify`).
    pub cong_notify: u64,
    /// A send hit congestion; a map update then makes the socket readable
    /// (the kernel's "historical" POLLIN) until the next recvmsg. Never
    /// cleared: from then on the socket is one of `Congestion::watchers`.
    pub seen_congestion: bool,
    pub cong_poll_pending: bool,
    pub recverr: bool,
    pub timestamp: bool,
    pub tos: u8,
    /// A send returned EAGAIN/ENOBUFS: wake the socket when that may change.
    pub wants_write: bool,
    /// Cached connection of the last destination.
    pub last_conn: Option<(std::net::IpAddr, ConnId)>,
    /// Messages of this socket dropped because the peer restarted (FLUSH).
    pub flushed: u64,
    /// Last readiness reported in a Wake output.
    pub reported: (bool, bool),
    pub wake_queued: bool,
    /// Per connection: messages of this socket on path 0 while its lane is
    /// another path (the mprds fan-out order rule).
    pub lane0_backlog: Vec<(ConnId, u32)>,
    /// Per connection: this socket's lane, fixed by its first message
    /// either way once the path count is known (`crate::mprds`, "Lanes";
    /// counted in `Connection::lane_socks`), or [`PORT_LANE`] when it sent
    /// before that (its port's lane, counted when the count becomes known:
    /// `Node::count_port_lanes`).
    pub lanes: crate::types::FastMap<ConnId, u8>,
}

/// A socket's lane on a connection follows its port (`Sock::lanes`).
pub(crate) const PORT_LANE: u8 = u8::MAX;

impl Sock {
    pub fn new(sndbuf: u32, rcvbuf: u32) -> Sock {
        Sock {
            bound: None,
            transport: None,
            conn_addr: None,
            sndbuf,
            rcvbuf,
            snd_bytes: 0,
            rcv_bytes: 0,
            congested: false,
            cong_announced: false,
            recv_queue: VecDeque::new(),
            notify_queue: VecDeque::new(),
            cong_monitor: false,
            cong_mask: 0,
            cong_notify: 0,
            seen_congestion: false,
            cong_poll_pending: false,
            recverr: false,
            timestamp: false,
            tos: 0,
            wants_write: false,
            last_conn: None,
            flushed: 0,
            reported: (false, true),
            wake_queued: false,
            lane0_backlog: Vec::new(),
            lanes: Default::default(),
        }
    }

    /// `rds_sk_sndbuf`: half of `sk_sndbuf`.
    pub fn sndbuf_limit(&self) -> u64 {
        u64::from(self.sndbuf / 2)
    }

    /// `rds_sk_rcvbuf`: half of `sk_rcvbuf`.
    pub fn rcvbuf_limit(&self) -> u64 {
        u64::from(self.rcvbuf / 2)
    }

    pub fn readable(&self) -> bool {
        !self.recv_queue.is_empty()
            || !self.notify_queue.is_empty()
            || (self.cong_monitor && self.cong_notify != 0)
            || (!self.cong_monitor && self.cong_poll_pending)
    }

    pub fn writable(&self) -> bool {
        self.snd_bytes < self.sndbuf_limit()
    }

    pub fn lane0(&mut self, conn: ConnId) -> &mut u32 {
        if let Some(i) = self.lane0_backlog.iter().position(|(c, _)| *c == conn) {
            &mut self.lane0_backlog[i].1
        } else {
            self.lane0_backlog.push((conn, 0));
            &mut self.lane0_backlog.last_mut().unwrap().1
        }
    }

    pub fn lane0_count(&self, conn: ConnId) -> u32 {
        self.lane0_backlog.iter().find(|(c, _)| *c == conn).map_or(0, |(_, n)| *n)
    }
}

/// Socket options handled by the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockOpt {
    SndBuf(u32),
    RcvBuf(u32),
    /// SO_SNDBUFFORCE / SO_RCVBUFFORCE: not capped by wmem_max / rmem_max.
    SndBufForce(u32),
    RcvBufForce(u32),
    Transport(i32),
    CongMonitor(bool),
    RecvErr(bool),
    Timestamp(bool),
    Tos(u8),
}

pub(crate) struct SockSlot {
    pub generation: u32,
    pub sock: Option<Sock>,
}

/// Socket readiness, as the kernel's `rds_poll` computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Readiness {
    /// POLLIN: data, a notification, or a congestion update to report.
    pub readable: bool,
    /// POLLOUT: queued send bytes below the send buffer.
    pub writable: bool,
}

impl Node {
    /// `socket(AF_RDS, SOCK_SEQPACKET, 0)`.
    pub fn socket(&mut self) -> SockId {
        let sock = Sock::new(self.ep.cfg.wmem_default, self.ep.cfg.rmem_default);
        if let Some(idx) = self.ep.free_socks.pop() {
            let slot = &mut self.ep.socks[idx as usize];
            slot.generation = slot.generation.wrapping_add(1);
            slot.sock = Some(sock);
            SockId { idx, generation: slot.generation }
        } else {
            self.ep.socks.push(SockSlot { generation: 0, sock: Some(sock) });
            SockId { idx: self.ep.socks.len() as u32 - 1, generation: 0 }
        }
    }

    /// `bind`. Rules and errno as `rds_bind`: a specific unicast address
    /// (EINVAL for any/broadcast/multicast), once (EINVAL), not port 1
    /// (EINVAL), on an address this node serves (EADDRNOTAVAIL; ENOPROTOOPT
    /// when SO_RDS_TRANSPORT chose a transport that does not serve it), on a
    /// free port (EADDRINUSE); port 0 picks a free port.
    pub fn bind(&mut self, s: SockId, addr: SocketAddr) -> Result<SocketAddr, Errno> {
        let ip = addr.ip();
        if not_unicast(ip) {
            return Err(Errno::EINVAL);
        }
        let sock = self.sock(s).ok_or(Errno::EINVAL)?;
        if sock.bound.is_some() {
            return Err(Errno::EINVAL);
        }
        // rds_add_bound: port 1 is the handshake probe's source port.
        if addr.port() == crate::wire::PROBE_PORT {
            return Err(Errno::EINVAL);
        }
        let forced = sock.transport;
        let kinds = self.ep.locals.get(&ip).map(Vec::as_slice).unwrap_or_default();
        let kind = match forced {
            Some(k) if kinds.contains(&k) => k,
            // The transport set with SO_RDS_TRANSPORT fails its laddr_check.
            Some(_) => return Err(Errno::ENOPROTOOPT),
            // The preferred transport: IB where the address has an RDMA device.
            None if kinds.contains(&TransportKind::Ib) => TransportKind::Ib,
            None => *kinds.first().ok_or(Errno::EADDRNOTAVAIL)?,
        };
        let port = if addr.port() == 0 {
            let start = 1024 + self.ep.rng.below(65536 - 1024) as u32;
            (0..65535u32)
                .map(|i| ((start + i) % 65535 + 1) as u16)
                .find(|p| *p > 1 && !self.ep.bound.contains_key(&SocketAddr::new(ip, *p)))
        } else {
            (!self.ep.bound.contains_key(&addr)).then_some(addr.port())
        };
        let Some(port) = port else {
            // rds_bind forgets the transport when rds_add_bound fails, even
            // one set with SO_RDS_TRANSPORT.
            self.sock_mut(s).unwrap().transport = None;
            return Err(Errno::EADDRINUSE);
        };
        let local = SocketAddr::new(ip, port);
        self.ep.bound.insert(local, s);
        let sock = self.sock_mut(s).unwrap();
        sock.bound = Some(local);
        sock.transport = Some(kind);
        Ok(local)
    }

    /// `connect`: sets the default destination of `send` without an address.
    /// Errno as `rds_connect`: IPv4 any is EDESTADDRREQ, IPv4 broadcast or
    /// multicast EINVAL; an IPv6 address that is not unicast (any,
    /// multicast, or a v4-mapped any/broadcast/multicast) is EPROTOTYPE.
    pub fn connect(&mut self, s: SockId, dst: SocketAddr) -> Result<(), Errno> {
        if not_unicast(dst.ip()) {
            return Err(match dst.ip() {
                IpAddr::V4(v4) if v4.is_unspecified() => Errno::EDESTADDRREQ,
                IpAddr::V4(_) => Errno::EINVAL,
                IpAddr::V6(_) => Errno::EPROTOTYPE,
            });
        }
        self.sock_mut(s).ok_or(Errno::EINVAL)?.conn_addr = Some(dst);
        Ok(())
    }

    pub fn local_addr(&self, s: SockId) -> Option<SocketAddr> {
        self.sock(s)?.bound
    }

    pub fn peer_addr(&self, s: SockId) -> Option<SocketAddr> {
        self.sock(s)?.conn_addr
    }

    /// `setsockopt` for the options the core owns.
    pub fn setsockopt(&mut self, s: SockId, opt: SockOpt) -> Result<(), Errno> {
        let (wmax, rmax) = (self.ep.cfg.wmem_max, self.ep.cfg.rmem_max);
        let transport_ok = |k: TransportKind, node: &Node| node.has_transport(k);
        if let SockOpt::Transport(v) = opt {
            let sock = self.sock(s).ok_or(Errno::EINVAL)?;
            if sock.transport.is_some() {
                return Err(Errno::EOPNOTSUPP);
            }
            if !(0..crate::types::RDS_TRANS_COUNT).contains(&v) {
                return Err(Errno::EINVAL);
            }
            let kind = TransportKind::from_uapi(v).filter(|k| transport_ok(*k, self)).ok_or(Errno::ENOPROTOOPT)?;
            self.sock_mut(s).unwrap().transport = Some(kind);
            return Ok(());
        }
        let sock = self.sock_mut(s).ok_or(Errno::EINVAL)?;
        match opt {
            // sock_setsockopt: min(val, max) * 2, at least the minimum.
            SockOpt::SndBuf(v) => sock.sndbuf = v.min(wmax).saturating_mul(2).max(bufs::SOCK_MIN_SNDBUF),
            SockOpt::RcvBuf(v) => sock.rcvbuf = v.min(rmax).saturating_mul(2).max(bufs::SOCK_MIN_RCVBUF),
            // The *FORCE variants take a negative int as 0.
            SockOpt::SndBufForce(v) => {
                let v = if v > i32::MAX as u32 { 0 } else { v };
                sock.sndbuf = v.min(i32::MAX as u32 / 2).saturating_mul(2).max(bufs::SOCK_MIN_SNDBUF)
            }
            SockOpt::RcvBufForce(v) => {
                let v = if v > i32::MAX as u32 { 0 } else { v };
                sock.rcvbuf = v.min(i32::MAX as u32 / 2).saturating_mul(2).max(bufs::SOCK_MIN_RCVBUF)
            }
            // rds_cong_monitor: switching it off forgets the recorded port
            // groups and any pending notification.
            SockOpt::CongMonitor(on) => {
                sock.cong_monitor = on;
                if !on {
                    sock.cong_mask = 0;
                    sock.cong_notify = 0;
                }
            }
            SockOpt::RecvErr(on) => sock.recverr = on,
            SockOpt::Timestamp(on) => sock.timestamp = on,
            // SIOCRDSSETTOS: the transport maps the value (TCP: everything
            // to 0, IB: as is; loopback and an unbound socket without
            // SO_RDS_TRANSPORT have no map: ENOTTY); once a non-zero TOS is
            // set or the socket has a connection, EINVAL.
            SockOpt::Tos(t) => {
                let tos = match sock.transport {
                    Some(TransportKind::Tcp) => 0,
                    Some(TransportKind::Ib) => t,
                    Some(TransportKind::Loop) | None => return Err(Errno::ENOTTY),
                };
                if sock.tos != 0 || sock.last_conn.is_some() {
                    return Err(Errno::EINVAL);
                }
                sock.tos = tos
            }
            SockOpt::Transport(_) => unreachable!(),
        }
        // A larger send buffer may make a blocked sender writable, a larger
        // receive buffer may uncongest the socket (and raise its hard cap).
        self.recheck_congestion(s, false);
        self.rx_recheck();
        self.wake(s, false);
        Ok(())
    }

    /// `getsockopt` for the options the core owns; returns the value as the
    /// kernel reports it (buffers doubled, transport as its uapi number).
    pub fn getsockopt(&self, s: SockId, opt: SockOpt) -> Result<u64, Errno> {
        let sock = self.sock(s).ok_or(Errno::EINVAL)?;
        Ok(match opt {
            SockOpt::SndBuf(_) | SockOpt::SndBufForce(_) => u64::from(sock.sndbuf),
            SockOpt::RcvBuf(_) | SockOpt::RcvBufForce(_) => u64::from(sock.rcvbuf),
            SockOpt::Transport(_) => u64::from(sock.transport.map_or(RDS_TRANS_NONE, |k| k.uapi())),
            SockOpt::CongMonitor(_) => sock.cong_monitor as u64,
            SockOpt::RecvErr(_) => sock.recverr as u64,
            SockOpt::Timestamp(_) => sock.timestamp as u64,
            SockOpt::Tos(_) => u64::from(sock.tos),
        })
    }

    /// `rds_poll`.
    pub fn readiness(&self, s: SockId) -> Readiness {
        self.sock(s)
            .map_or(Readiness::default(), |sock| Readiness { readable: sock.readable(), writable: sock.writable() })
    }

    /// Messages queued on the socket for receive (0: none, or no such
    /// socket).
    pub fn recv_queued(&self, s: SockId) -> usize {
        self.sock(s).map_or(0, |k| k.recv_queue.len())
    }

    /// Messages of this socket that were dropped because the peer restarted
    /// (the kernel drops them silently; we count them per socket).
    pub fn flushed(&self, s: SockId) -> u64 {
        self.sock(s).map_or(0, |k| k.flushed)
    }

    /// Send bytes queued and not yet acked.
    pub fn snd_bytes(&self, s: SockId) -> u64 {
        self.sock(s).map_or(0, |k| k.snd_bytes)
    }

    /// Closes a socket (`rds_release`): its receive queue is freed, it is
    /// unbound, and every message it still has queued or unacked is dropped.
    /// Returns the number of messages dropped.
    pub fn close(&mut self, s: SockId) -> usize {
        let Some(sock) = self.sock(s) else { return 0 };
        let bound = sock.bound;
        let dropped = self.drop_messages(s, None);
        let held = crate::recv::sock_held(self.sock(s).unwrap());
        if let Some(b) = bound {
            // Free the receive queue through the accounting so congestion clears.
            let queued: i64 = self.sock(s).unwrap().rcv_bytes as i64;
            self.rcvbuf_delta(s, -queued);
            self.ep.bound.remove(&b);
        }
        self.ep.write_waiters.retain(|w| *w != s);
        // Its lanes are free for the sockets that fix theirs later.
        let lanes = std::mem::take(&mut self.sock_mut(s).unwrap().lanes);
        for (conn, lane) in lanes {
            let held = self.conns.get_mut(conn).and_then(|c| c.lane_socks.get_mut(usize::from(lane)));
            if let Some(n) = held {
                *n = n.saturating_sub(1);
            }
        }
        let slot = &mut self.ep.socks[s.idx as usize];
        slot.sock = None;
        self.ep.free_socks.push(s.idx);
        self.ep.rx_held = self.ep.rx_held.saturating_sub(held);
        self.rx_recheck();
        dropped
    }

    /// `rds_recv_rcvbuf_delta`: account queued receive bytes and flip the
    /// socket's congestion bit with the kernel's hysteresis.
    pub(crate) fn rcvbuf_delta(&mut self, s: SockId, delta: i64) {
        let Some(sock) = self.sock_mut(s) else { return };
        sock.rcv_bytes = (sock.rcv_bytes as i64 + delta).max(0) as u64;
        if delta > 0 {
            self.ep.counters.recv_bytes_added_to_sock += delta as u64;
        } else {
            self.ep.counters.recv_bytes_freed_fromsock += (-delta) as u64;
        }
        self.recheck_congestion(s, delta > 0);
    }

    pub(crate) fn sock(&self, s: SockId) -> Option<&Sock> {
        self.ep.sock(s)
    }

    pub(crate) fn sock_mut(&mut self, s: SockId) -> Option<&mut Sock> {
        let slot = self.ep.socks.get_mut(s.idx as usize)?;
        if slot.generation != s.generation {
            return None;
        }
        slot.sock.as_mut()
    }
}

impl Endpoint {
    /// The socket `s`, unless it was closed (its slot reused or empty).
    pub(crate) fn sock(&self, s: SockId) -> Option<&Sock> {
        let slot = self.socks.get(s.idx as usize)?;
        if slot.generation != s.generation {
            return None;
        }
        slot.sock.as_ref()
    }
}
