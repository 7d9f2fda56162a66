//! Socket state (`struct rds_sock`): binding, buffer accounting, the receive
//! and notification queues, congestion monitoring and options.

use std::collections::VecDeque;
use std::net::SocketAddr;

use crate::message::{Incoming, Notification};
use crate::types::{ConnId, TransportKind};

/// Kernel constants for socket buffers.
pub mod bufs {
    /// `SOCK_MIN_SNDBUF` on x86_64.
    pub const SOCK_MIN_SNDBUF: u32 = 4608;
    /// `SOCK_MIN_RCVBUF` on x86_64.
    pub const SOCK_MIN_RCVBUF: u32 = 2304;
    /// Default `net.core.wmem_default` / `rmem_default` / `*_max`.
    pub const DEFAULT_BUF: u32 = 212_992;
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
    pub recv_queue: VecDeque<Incoming>,
    pub notify_queue: VecDeque<Notification>,
    pub cong_monitor: bool,
    /// Port groups a non-blocking send found congested (`rs_cong_mask`).
    pub cong_mask: u64,
    /// Port groups uncongested since, not yet reported (`rs_cong_notify`).
    pub cong_notify: u64,
    /// A send hit congestion; a map update then makes the socket readable
    /// (the kernel's "historical" POLLIN) until the next recvmsg.
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
}

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

/// Socket readiness, as the kernel's `rds_poll` computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Readiness {
    /// POLLIN: data, a notification, or a congestion update to report.
    pub readable: bool,
    /// POLLOUT: queued send bytes below the send buffer.
    pub writable: bool,
}
