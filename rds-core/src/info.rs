//! Introspection: typed snapshots of a node's connections, paths, sockets,
//! message queues and counters, as the kernel's `RDS_INFO_*` getsockopt
//! options (and `rds-info`) show them.
//!
//! Everything here is a copy taken at one instant under the caller's lock;
//! nothing refers back into the node. The kernel structs are built from
//! these by `rds-sock`; rds-info prints them.

use std::net::{IpAddr, SocketAddr};

use crate::node::Node;
use crate::path::PathState;
use crate::stats::Counters;
use crate::types::{ConnId, SockId, TransportKind};

/// `RDS_INFO_CONNECTION_FLAG_*` bits of a connection row.
pub mod conn_flags {
    /// A thread is transmitting on the path (`RDS_IN_XMIT`).
    pub const SENDING: u8 = 0x01;
    /// The path is CONNECTING.
    pub const CONNECTING: u8 = 0x02;
    /// The path is UP.
    pub const CONNECTED: u8 = 0x04;
}

/// Number of core counters the kernel has (`rds_stat_names`); the node's
/// [`Counters`] list them first, in the kernel's order, then ours.
pub const KERNEL_CORE_COUNTERS: usize = 36;

/// One path of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSnapshot {
    pub index: u8,
    pub state: PathState,
    /// [`conn_flags`]: CONNECTING / CONNECTED from the state; SENDING is
    /// filled in by the driver from its transport.
    pub flags: u8,
    pub next_tx_seq: u64,
    pub next_rx_seq: u64,
    /// Messages never transmitted, and transmitted but not yet acked.
    pub send_queue: usize,
    pub retrans: usize,
    /// Payload bytes on both queues.
    pub queued_bytes: u64,
    /// Times the path came up.
    pub connects: u64,
}

/// A connection (one per local address, peer address, transport and tos).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnSnapshot {
    pub id: ConnId,
    pub laddr: IpAddr,
    pub faddr: IpAddr,
    pub transport: TransportKind,
    pub tos: u8,
    /// Negotiated path count (0 while the multipath handshake is pending).
    pub npaths: u8,
    /// The peer's generation number (0 = not announced).
    pub peer_gen: u32,
    /// Every path slot (8 over TCP, 1 otherwise), in index order.
    pub paths: Vec<PathSnapshot>,
}

impl ConnSnapshot {
    /// Path 0, which the kernel's `RDS_INFO_CONNECTIONS` reports.
    pub fn path0(&self) -> &PathSnapshot {
        &self.paths[0]
    }

    /// Paths that are UP.
    pub fn paths_up(&self) -> usize {
        self.paths.iter().filter(|p| p.state == PathState::Up).count()
    }
}

/// A socket, as `RDS_INFO_SOCKETS` shows it plus our own details.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockSnapshot {
    /// A number unique among the node's sockets, never 0 ([`inum_of`]; the
    /// kernel shows the socket's inode number).
    pub inum: u64,
    pub bound: Option<SocketAddr>,
    /// The default destination set by `connect`.
    pub connected: Option<SocketAddr>,
    /// The send and receive buffers as RDS uses them: half of SO_SNDBUF /
    /// SO_RCVBUF (`rds_sk_sndbuf`, `rds_sk_rcvbuf`).
    pub sndbuf: u32,
    pub rcvbuf: u32,
    /// Payload bytes queued for send and not yet acked.
    pub snd_bytes: u64,
    /// Payload bytes and messages on the receive queue.
    pub rcv_bytes: u64,
    pub recv_queue: usize,
    pub transport: Option<TransportKind>,
    /// The socket's port is set in its address's congestion map.
    pub congested: bool,
    pub cong_monitor: bool,
}

/// Which message queue to list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Queue {
    /// Paths' send queues: not yet transmitted (`RDS_INFO_SEND_MESSAGES`).
    Send,
    /// Paths' retransmit queues: transmitted, not yet acked
    /// (`RDS_INFO_RETRANS_MESSAGES`).
    Retrans,
    /// Sockets' receive queues (`RDS_INFO_RECV_MESSAGES`).
    Recv,
}

/// One queued message (`rds_info_message`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsgSnapshot {
    pub seq: u64,
    /// Payload length (`h_len`).
    pub len: u32,
    /// Our address and port, the peer's address and port: for sent
    /// messages the source and destination, for received ones the
    /// receiving socket and the sender.
    pub laddr: IpAddr,
    pub lport: u16,
    pub faddr: IpAddr,
    pub fport: u16,
    pub tos: u8,
    /// The path index (sent messages only).
    pub path: Option<u8>,
}

impl Node {
    /// Every connection with all its path slots, in creation order (the
    /// n-th has `ConnId(n)`).
    pub fn info_connections(&self) -> Vec<ConnSnapshot> {
        self.conns
            .iter()
            .map(|c| ConnSnapshot {
                id: c.id,
                laddr: c.laddr,
                faddr: c.faddr,
                transport: c.kind,
                tos: c.tos,
                npaths: c.npaths,
                peer_gen: c.peer_gen,
                paths: c
                    .paths
                    .iter()
                    .enumerate()
                    .map(|(i, p)| PathSnapshot {
                        index: i as u8,
                        state: p.state,
                        flags: match p.state {
                            PathState::Connecting => conn_flags::CONNECTING,
                            PathState::Up => conn_flags::CONNECTED,
                            _ => 0,
                        },
                        next_tx_seq: p.next_tx_seq,
                        next_rx_seq: p.next_rx_seq,
                        send_queue: p.send_queue.len(),
                        retrans: p.retrans.len(),
                        queued_bytes: p.queued().1 as u64,
                        connects: p.connects,
                    })
                    .collect(),
            })
            .collect()
    }

    /// Every socket (bound or not), in slot order.
    pub fn info_sockets(&self) -> Vec<SockSnapshot> {
        self.ep
            .socks
            .iter()
            .enumerate()
            .filter_map(|(idx, slot)| {
                let k = slot.sock.as_ref()?;
                let id = SockId { idx: idx as u32, generation: slot.generation };
                Some(SockSnapshot {
                    inum: inum_of(id),
                    bound: k.bound,
                    connected: k.conn_addr,
                    sndbuf: k.sndbuf_limit() as u32,
                    rcvbuf: k.rcvbuf_limit() as u32,
                    snd_bytes: k.snd_bytes,
                    rcv_bytes: k.rcv_bytes,
                    recv_queue: k.recv_queue.len(),
                    transport: k.transport,
                    congested: k.congested,
                    cong_monitor: k.cong_monitor,
                })
            })
            .collect()
    }

    /// The messages of one queue kind: send and retransmit queues path by
    /// path in connection order (probes and pongs included, as in the
    /// kernel), receive queues socket by socket; each queue in order.
    pub fn info_messages(&self, q: Queue) -> Vec<MsgSnapshot> {
        let mut out = Vec::new();
        match q {
            Queue::Send | Queue::Retrans => {
                for c in &self.conns {
                    for (i, p) in c.paths.iter().enumerate() {
                        let list = if q == Queue::Send { &p.send_queue } else { &p.retrans };
                        out.extend(list.iter().map(|m| MsgSnapshot {
                            seq: m.hdr.sequence,
                            len: m.payload.len() as u32,
                            laddr: c.laddr,
                            lport: m.hdr.sport,
                            faddr: c.faddr,
                            fport: m.hdr.dport,
                            tos: c.tos,
                            path: Some(i as u8),
                        }));
                    }
                }
            }
            Queue::Recv => {
                for slot in &self.ep.socks {
                    let Some(k) = &slot.sock else { continue };
                    out.extend(k.recv_queue.iter().map(|m| MsgSnapshot {
                        seq: m.header.sequence,
                        len: m.payload.len() as u32,
                        laddr: m.to.ip(),
                        lport: m.to.port(),
                        faddr: m.from.ip(),
                        fport: m.from.port(),
                        tos: 0,
                        path: None,
                    }));
                }
            }
        }
        out
    }
}

/// The inode-like number introspection shows for a socket:
/// [`SockId::number`] + 1, so that it is never 0.
pub fn inum_of(s: SockId) -> u64 {
    s.number() + 1
}

/// The kernel's RDS-TCP counters (`rds_tcp_stat_names`), in its order.
pub const KERNEL_TCP_COUNTERS: [&str; 5] = [
    "tcp_data_ready_calls",
    "tcp_write_space_calls",
    "tcp_sndbuf_full",
    "tcp_connect_raced",
    "tcp_listen_closed_stale",
];

/// Whether a transport counter is one the kernel has: the RDS-TCP ones,
/// and every `ib_` one (rds-ib reports only kernel counters).
pub fn is_kernel_transport_counter(name: &str) -> bool {
    KERNEL_TCP_COUNTERS.contains(&name) || name.starts_with("ib_")
}

/// Counters in the order `RDS_INFO_COUNTERS` lists them: the kernel's core
/// counters, the transports' kernel counters, then our own: the core's,
/// then the transports'. Each group keeps its order.
pub fn counters_in_kernel_order(core: &Counters, transports: &[(&str, u64)]) -> Vec<(String, u64)> {
    let all: Vec<(&str, u64)> = core.iter().collect();
    let (kernel, ours) = all.split_at(KERNEL_CORE_COUNTERS.min(all.len()));
    let t_kernel = transports.iter().filter(|(n, _)| is_kernel_transport_counter(n));
    let t_ours = transports.iter().filter(|(n, _)| !is_kernel_transport_counter(n));
    kernel.iter().chain(t_kernel).chain(ours.iter()).chain(t_ours).map(|(k, v)| (k.to_string(), *v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_counters_come_first_core_then_transports_then_ours() {
        assert_eq!(Counters::NAMES[KERNEL_CORE_COUNTERS - 1], "send_stuck_rm");
        assert_eq!(Counters::NAMES[KERNEL_CORE_COUNTERS], "recv_drop_bad_frame");
        let c = Counters { conn_reset: 1, send_stuck_rm: 2, recv_drop_bad_frame: 3, ..Counters::default() };
        let v = counters_in_kernel_order(
            &c,
            &[("tcp_data_ready_calls", 7), ("tcp_our_own", 9), ("tcp_sndbuf_full", 8), ("tcp_our_other", 10)],
        );
        assert_eq!(v.len(), Counters::NAMES.len() + 4);
        assert_eq!(v[0], ("conn_reset".to_string(), 1));
        assert_eq!(v[35], ("send_stuck_rm".to_string(), 2));
        assert_eq!(v[36], ("tcp_data_ready_calls".to_string(), 7));
        assert_eq!(v[37], ("tcp_sndbuf_full".to_string(), 8));
        assert_eq!(v[38], ("recv_drop_bad_frame".to_string(), 3));
        let n = v.len();
        assert_eq!(v[n - 3].0, *Counters::NAMES.last().unwrap());
        assert_eq!(v[n - 2], ("tcp_our_own".to_string(), 9));
        assert_eq!(v[n - 1], ("tcp_our_other".to_string(), 10));
        assert!(is_kernel_transport_counter("ib_tx_ring_full"));
        assert!(!is_kernel_transport_counter("tcp_tx_partial"));
    }
}
