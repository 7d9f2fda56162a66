//! Messages: what sits on a path's send and retransmit queues, what a
//! transport is given to transmit, and what a socket receives.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::types::{Payload, SockId};
use crate::wire::Header;

/// RDMA status codes of `struct rds_rdma_notify` (`RDS_RDMA_*`).
pub mod rdma_status {
    pub const SUCCESS: i32 = 0;
    pub const REMOTE_ERROR: i32 = 1;
    pub const CANCELED: i32 = 2;
    pub const DROPPED: i32 = 3;
    pub const OTHER_ERROR: i32 = 4;
}

/// An RDMA operation attached to a message (`RDS_CMSG_RDMA_ARGS`). The core
/// only routes it: it refuses it on transports without RDMA (EOPNOTSUPP),
/// never retransmits a message carrying one (the op is reported DROPPED), and
/// queues the completion notification the transport reports. The transport
/// (rds-ib) interprets the fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaOp {
    /// The peer's MR cookie (`rkey | offset << 32`).
    pub remote_cookie: u64,
    /// Remote address within the MR and length.
    pub remote_addr: u64,
    pub remote_len: u64,
    /// Local buffers: ranges of [`crate::RdmaBuf`]s, which the operation
    /// keeps alive (and registered) until the device is done with them. A
    /// READ writes the peer's bytes into them, a WRITE sends their bytes.
    pub local: Vec<crate::RdmaSeg>,
    /// `RDS_RDMA_*` flags (READWRITE, FENCE, USE_ONCE, NOTIFY_ME, SILENT...).
    pub flags: u32,
    pub user_token: u64,
}

/// RDMA op flags (`RDS_RDMA_*`).
pub mod rdma_flags {
    pub const READWRITE: u32 = 0x0001;
    pub const FENCE: u32 = 0x0002;
    pub const INVALIDATE: u32 = 0x0004;
    pub const USE_ONCE: u32 = 0x0008;
    pub const DONTWAIT: u32 = 0x0010;
    pub const NOTIFY_ME: u32 = 0x0020;
    pub const SILENT: u32 = 0x0040;
}

/// Per-message state bits (`RDS_MSG_*`), not all of which go on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgFlags {
    pub ack_required: bool,
    pub retransmitted: bool,
    /// The peer restarted: drop instead of resending.
    pub flush: bool,
    /// The transport reported the RDMA op's completion (its notification,
    /// if any, is queued: never a second one).
    pub rdma_notified: bool,
}

/// A message on a path's send or retransmit queue.
#[derive(Clone, Debug)]
pub(crate) struct QueuedMsg {
    pub hdr: Header,
    pub payload: Payload,
    /// The sending socket, for send-buffer accounting; `None` for pongs and probes.
    pub sock: Option<SockId>,
    pub flags: MsgFlags,
    pub rdma: Option<Arc<RdmaOp>>,
    /// The message went out on path 0 while its socket's lane is another path.
    pub lane0_of: Option<u8>,
    /// Held on a non-zero path until the socket's path-0 backlog is acked.
    pub gated: bool,
}

impl QueuedMsg {
    /// Our multipath probe ping (`rds_send_probe` to port 0 from
    /// `RDS_FLAG_PROBE_PORT`).
    pub(crate) fn is_probe(&self) -> bool {
        self.sock.is_none() && self.hdr.sport == crate::wire::PROBE_PORT && self.hdr.dport == 0
    }

    /// A pong of ours (`rds_send_pong`: from port 0 to the ping's port).
    pub(crate) fn is_pong(&self) -> bool {
        self.sock.is_none() && self.hdr.sport == 0 && self.hdr.dport != 0 && self.payload.is_empty()
    }
}

/// What a transport transmits: a complete header (sequence, flags including
/// RETRANSMITTED, extension headers) and the payload. Congestion-map updates
/// have sequence 0 and are never acked.
#[derive(Clone, Debug)]
pub struct TxMessage {
    pub header: Header,
    pub payload: Payload,
    /// The core wants an explicit ack for this one (IB puts it on the wire).
    pub ack_required: bool,
    /// An RDMA op to run before the send (IB only).
    pub rdma: Option<Arc<RdmaOp>>,
}

impl TxMessage {
    /// Congestion-map updates are not sequenced and never retransmitted.
    pub fn is_cong_map(&self) -> bool {
        self.header.kind() == crate::wire::Kind::CongMap
    }

    /// Bytes on a byte-stream transport (header and payload).
    pub fn wire_len(&self) -> usize {
        crate::wire::HEADER_LEN + self.payload.len()
    }
}

/// A complete received message as a transport hands it to the core.
#[derive(Clone, Debug)]
pub struct RxMessage {
    pub header: Header,
    pub payload: Payload,
    /// Wall-clock receive time in nanoseconds since the Unix epoch, if the
    /// transport recorded one (used for SO_TIMESTAMP, and to order a
    /// versionless peer's congestion maps across paths: `Node::map_order`):
    /// when the message's last byte arrived, or a later time (RDS-TCP: the
    /// kernel's receive time of the last segment the read took, or when
    /// the read ended).
    pub rx_time_ns: Option<u64>,
    /// `rx_time_ns` is when the message's last byte arrived, not only a
    /// time after it (RDS-TCP: a read that drained the socket ended with
    /// this message, and the kernel stamped the segment it ended in).
    pub rx_time_exact: bool,
}

impl RxMessage {
    /// A message without a receive time.
    pub fn new(header: Header, payload: Payload) -> RxMessage {
        RxMessage { header, payload, rx_time_ns: None, rx_time_exact: false }
    }
}

impl From<crate::wire::Frame> for RxMessage {
    fn from(f: crate::wire::Frame) -> RxMessage {
        RxMessage::new(f.header, Payload::new(f.payload))
    }
}

/// A message queued on a socket for `recvmsg`.
#[derive(Clone, Debug)]
pub struct Incoming {
    pub from: SocketAddr,
    /// The local address and port it was sent to.
    pub to: SocketAddr,
    pub payload: Payload,
    pub header: Header,
    /// Receive time (SO_TIMESTAMP), nanoseconds since the Unix epoch.
    pub timestamp_ns: Option<u64>,
    /// `RDS_CMSG_RDMA_DEST` cookie from an RDMA_DEST extension header.
    pub rdma_dest: Option<u64>,
}

/// What `recvmsg` returns, in the kernel's order: notifications first, then
/// congestion updates, then data.
#[derive(Clone, Debug)]
pub enum Received {
    /// `RDS_CMSG_RDMA_STATUS`: an RDMA completion (user token, status).
    RdmaStatus { user_token: u64, status: i32 },
    /// `RDS_CMSG_CONG_UPDATE`: port groups that became uncongested.
    CongUpdate { mask: u64 },
    /// A datagram.
    Data(Incoming),
}

/// A notification queued for `recvmsg` (`rs_notify_queue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notification {
    pub user_token: u64,
    pub status: i32,
}
