//! Introspection of running nodes (what `rds-info` shows).
//!
//! * [`Snapshot`]: everything one engine can report, taken at one instant
//!   ([`crate::Engine::snapshot`]): the node's identity, counters in the
//!   kernel's order, connections with every path, sockets, the send,
//!   retransmit and receive queues, and the TCP transport's sockets.
//! * [`kernel`]: the kernel's packed `RDS_INFO_*` structs built from a
//!   snapshot, with the getsockopt protocol (ENOSPC and the needed length),
//!   for a C ABI's `getsockopt(SOL_RDS, RDS_INFO_*)`.
//! * [`ipc`]: every engine serves its snapshots on a Unix-domain socket in a
//!   per-user runtime directory; [`ipc::query_all`] asks every node of this
//!   user on this host. The request/response format is ours and versioned
//!   ([`codec`]).

pub mod codec;
pub mod ipc;
pub mod kernel;

use std::net::IpAddr;

use rds_core::{ConnSnapshot, MsgSnapshot, SockSnapshot, TransportConnInfo};

/// Who a snapshot is from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeIdent {
    /// The process and the engine's number in it (0 for the first engine).
    pub pid: u32,
    pub engine: u32,
    /// The process's effective uid.
    pub uid: u32,
    /// The process's command name (`/proc/self/comm`).
    pub command: String,
    /// Addresses the node serves, sorted.
    pub addresses: Vec<IpAddr>,
    /// Our generation number, configured path count and RDS-TCP port.
    pub gen_num: u32,
    pub npaths: u8,
    pub tcp_port: u16,
}

/// Everything one node reports, taken at one instant (the node's part under
/// its lock; the TCP rows right after).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub node: NodeIdent,
    /// Kernel core counters, transport counters, then ours.
    pub counters: Vec<(String, u64)>,
    /// Connections in creation order, every path slot; SENDING set from the
    /// transport.
    pub connections: Vec<ConnSnapshot>,
    pub sockets: Vec<SockSnapshot>,
    pub send: Vec<MsgSnapshot>,
    pub retrans: Vec<MsgSnapshot>,
    pub recv: Vec<MsgSnapshot>,
    /// The TCP transport's sockets (`RDS_INFO_TCP_SOCKETS`), by path.
    pub tcp: Vec<TransportConnInfo>,
}

impl Snapshot {
    /// A counter by name.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }

    /// The connection from `laddr` to `faddr` (any transport, tos 0 first).
    pub fn connection(&self, laddr: IpAddr, faddr: IpAddr) -> Option<&ConnSnapshot> {
        self.connections.iter().find(|c| c.laddr == laddr && c.faddr == faddr)
    }
}

/// Sections of a snapshot, for asking only for some.
pub mod sections {
    pub const NODE: u32 = 1 << 0;
    pub const COUNTERS: u32 = 1 << 1;
    pub const CONNECTIONS: u32 = 1 << 2;
    pub const SOCKETS: u32 = 1 << 3;
    pub const SEND: u32 = 1 << 4;
    pub const RETRANS: u32 = 1 << 5;
    pub const RECV: u32 = 1 << 6;
    pub const TCP: u32 = 1 << 7;
    pub const ALL: u32 = (1 << 8) - 1;
}
