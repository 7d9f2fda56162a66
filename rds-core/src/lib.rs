//! # rds-core: the general layer of RDS, sans I/O
//!
//! RDS (Reliable Datagram Sockets) gives reliable, ordered datagrams between
//! sockets on different nodes over one connection per node pair. This crate
//! is the protocol itself, wire-compatible with the Linux kernel's
//! `net/rds`:
//!
//! * [`wire`]: the 48-byte header, flags, extension headers, checksum,
//!   congestion-map messages and the TCP stream framing;
//! * [`Node`]: sockets, connections and paths with the kernel's state
//!   machine, per-path sequence numbers, the send and retransmit queues,
//!   acks and retransmission after reconnect, the receiver's duplicate rule,
//!   ping/pong, the multipath (mprds) handshake and path hashing,
//!   congestion maps with the kernel's hysteresis, send-buffer accounting,
//!   and the kernel's counters;
//! * [`transport`]: the [`RdsTransport`] trait that TCP, IB and loopback
//!   implement, and the [`TransportSink`] through which they report; its
//!   docs explain how TCP and InfiniBand (fragments, credits, piggybacked
//!   acks, RDMA) map onto it;
//! * [`loopback`]: the in-process transport for addresses one node serves;
//! * [`rdma_buf`]: [`RdmaBuf`] / [`RdmaSeg`], the only memory an RDMA
//!   operation or an MR can name from safe code (every registration holds
//!   a handle until the device is done with it);
//! * [`info`]: snapshots of connections, paths, sockets, queues and
//!   counters (what the kernel's `RDS_INFO_*` options report).
//!
//! Nothing here opens a socket, spawns a thread or reads a clock: every call
//! takes the events and the current time as arguments, and the node returns
//! what to do next ([`Node::poll_output`]) and when to wake it
//! ([`Node::poll_timeout`]). A driver with real sockets and threads lives in
//! `rds-sock`; a deterministic simulator drives the same code in tests.

pub mod cong;
pub mod connection;
pub mod info;
pub mod loopback;
pub mod message;
pub mod mprds;
pub mod node;
pub mod path;
pub mod rdma_buf;
pub mod recv;
pub mod send;
pub mod sock;
pub mod stats;
pub mod transport;
pub mod types;
pub mod wire;

/// The old home of the path and connection types (now [`path`]); kept so
/// that `rds_core::conn::DownReason` and friends still resolve.
#[doc(hidden)]
pub mod conn {
    pub use crate::path::{DownReason, PathInfo, PathState};
}

pub use info::{ConnSnapshot, MsgSnapshot, PathSnapshot, Queue, SockSnapshot};
pub use message::{Incoming, Notification, RdmaOp, Received, RxMessage, TxMessage};
pub use node::{HandshakeExts, Node, NodeConfig, Output};
pub use path::{DownReason, PathInfo, PathState};
pub use rdma_buf::{RdmaBuf, RdmaSeg};
pub use recv::RecvOutcome;
pub use send::{SendOptions, Unsent};
pub use sock::{Readiness, SockOpt};
pub use stats::Counters;
pub use transport::{Accept, RdsTransport, TransportCaps, TransportConnInfo, TransportSink};
pub use types::{ConnId, Errno, PathId, Payload, SockId, TransportKind, addr_cmp};
