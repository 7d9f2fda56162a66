//! The transport interface.
//!
//! A transport moves complete RDS messages over some kind of reliable
//! connection, one connection per path. The general layer ([`crate::Node`])
//! decides *what* is sent, on which path, with which sequence number, when
//! to connect and when a message counts as delivered; the transport only
//! does the I/O. The two halves meet through two traits:
//!
//! * [`RdsTransport`], implemented by a transport (rds-tcp, rds-ib, the
//!   [`crate::loopback`] transport): the driver calls it to open and close
//!   path connections and to tell it a path has data.
//! * [`TransportSink`], implemented by the driver that owns the `Node`
//!   (rds-sock's engine, or a simulator): the transport reports
//!   connections, received messages and acks through it, and pulls messages
//!   to transmit.
//!
//! ## Calling rules
//!
//! * Every path connection instance is identified by `(PathId, inst)`. The
//!   node bumps `inst` for every connect attempt and every accepted
//!   connection; a transport passes the `inst` it was given back with every
//!   event, and the node ignores events of older instances.
//! * A transport never calls the sink while holding a lock that its own
//!   `connect`, `shutdown` or `kick` needs: the driver may call back into
//!   the transport from inside a sink call.
//! * Messages of a path are pulled in sequence order and must go on the wire
//!   in that order. A message counts as delivered only when the transport
//!   reports an ack that covers its sequence number.
//! * When a connection ends, the transport delivers every complete message it
//!   already read from it *before* reporting [`TransportSink::path_down`].
//!   Over TCP the peer considers a message delivered once our TCP acked it,
//!   so a message read off the socket must never be dropped.
//! * Memory is bounded by flow control, not by drops: when a socket or the
//!   node holds too much, the node asks the transport to stop reading the
//!   path that delivered to it ([`RdsTransport::rx_flow`]) and to resume
//!   once the application read enough.
//!
//! ## How TCP maps onto it
//!
//! One TCP connection per path, from the smaller address to the larger
//! address's port 16385. `connect` opens it (from the larger address it is
//! the kernel's "poke": established, then dropped with
//! [`crate::DownReason::DirectionRule`], so that the peer connects).
//! Accepted connections are offered to [`TransportSink::accept`]. `pull`
//! returns messages in order; the transport writes headers and payloads
//! back to back, remembers each message's end offset in the byte stream, and
//! reports [`TransportSink::acked`] for every message whose last byte the
//! peer's TCP acknowledged (bytes written minus `SIOCOUTQ`). Congestion-map
//! updates (sequence 0) are written but never acked. The receive side
//! splits the byte stream with [`crate::wire::FrameDecoder`] and hands
//! complete messages to [`TransportSink::received`].
//!
//! ## How InfiniBand / RoCE maps onto it
//!
//! The IB transport keeps everything fragment- and credit-shaped to itself;
//! the interface stays message-shaped:
//!
//! * **Fragments with header copies.** `pull` hands over whole messages. The
//!   transport splits each into `ceil(len / 4096)` SEND work requests (one
//!   for a 0-byte message), each with two SGEs: a copy of the 48-byte header
//!   (the same sequence, length and ports in every fragment, `h_ack` and
//!   `h_credit` patched per frame, checksum recomputed) and up to 4 KiB of
//!   payload. The last fragment is SOLICITED and signaled. On receive it
//!   reassembles fragments (checking each against the first fragment's
//!   sequence, length and ports; a mismatch or bad checksum is a protocol
//!   error and ends the connection with
//!   [`crate::DownReason::ProtocolError`]) and calls `received` once per
//!   complete message.
//! * **Credits.** Send credits gate how many SENDs the transport posts; when
//!   it has none it simply stops pulling. Received credit updates make it pull
//!   again. The rule is the general layer's ([`crate::credits::Credits`],
//!   declared by [`TransportCaps::credits`]), one state per connection that
//!   the transport feeds from its completions and the header's `h_credit`;
//!   the node's message path never sees credits, so flow control on or off
//!   (negotiated in the CM private data) does not change what it does.
//! * **Piggybacked and ack-only frames.** Every frame carries `h_ack`, the
//!   last sequence number received on the path; an ack-only frame is a header
//!   with ports 0, sequence 0 and length 0. Neither is an RDS message: the
//!   transport builds them and never passes them to `received`. The `h_ack`
//!   it receives becomes [`TransportSink::acked`] with that sequence number,
//!   exactly as TCP reports acked messages. [`crate::TxMessage::ack_required`]
//!   tells it when to set ACK_REQUIRED on the wire (the core's pacing: every
//!   8 messages or 16 MiB, and whenever the sender's buffer is half full).
//! * **RDMA operations.** A message with an [`crate::RdmaOp`] reaches the
//!   transport through `pull`; it posts the RDMA READ or WRITE before the
//!   message's SENDs and reports completion through
//!   [`TransportSink::rdma_complete`], which queues the socket's notification
//!   with the kernel's status code. The node refuses RDMA on transports whose
//!   [`TransportCaps::rdma`] is false (EOPNOTSUPP) and never retransmits a
//!   message with an RDMA op (it is reported DROPPED). Memory registration
//!   (GET_MR / FREE_MR) is a service of the transport itself, called by the
//!   socket layer; the node only carries cookies.
//! * **Connection setup.** RDMA CM with private data (protocol version,
//!   `ack_seq`, initial credits) or a verbs-only side channel: both end in
//!   `path_up` / `accept`; the private data's `ack_seq` becomes an `acked`
//!   call right after `path_up`, as the kernel processes it.
//! * **Flushed work requests.** On disconnect the transport drains its
//!   completion queue (flush errors included) before `path_down`; every
//!   message it pulled but did not see acked is retransmitted by the node
//!   after reconnect, so nothing is completed twice or lost.

use std::io;
use std::net::IpAddr;

use crate::message::{RxMessage, TxMessage};
use crate::path::{DownReason, PathInfo};
use crate::types::{PathId, TransportKind};

/// Answer to an inbound transport connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accept {
    /// Serve this path with the new connection (the path is now UP).
    Path(PathInfo),
    /// Reset the new connection.
    Reject,
    /// Reset the new connection: the peer has the larger address, so we
    /// connect ourselves (a Connect output was queued).
    RejectPeerLarger,
    /// Keep the new connection without reading it and offer it again after
    /// the next `path_down` of a path to that peer, or a few milliseconds
    /// later: the slot it belongs to still holds a connection that is going
    /// away (a `Shutdown` was queued for it if needed), or which slot it
    /// belongs to shows only once the multipath handshake is done.
    /// Resetting it instead would lose what the peer already wrote on it,
    /// which our TCP acknowledged.
    Defer,
}

/// What a transport can do; the node's behaviour depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportCaps {
    pub kind: TransportKind,
    /// Multipath capable (`t_mp_capable`): TCP.
    pub mp_capable: bool,
    /// Only the smaller address connects and reconnects (TCP).
    pub smaller_connects: bool,
    /// Sends congestion-map updates to peers (not loopback).
    pub sends_cong_map: bool,
    /// Supports RDMA operations (IB).
    pub rdma: bool,
    /// Paces its sends with credit-based flow control ([`crate::credits`]):
    /// IB (negotiated per connection; the kernel's `rds_ib` flow control),
    /// not TCP (its own window) nor loopback.
    pub credits: bool,
}

impl TransportCaps {
    pub const fn tcp() -> TransportCaps {
        TransportCaps {
            kind: TransportKind::Tcp,
            mp_capable: true,
            smaller_connects: true,
            sends_cong_map: true,
            rdma: false,
            credits: false,
        }
    }

    pub const fn ib() -> TransportCaps {
        TransportCaps {
            kind: TransportKind::Ib,
            mp_capable: false,
            smaller_connects: false,
            sends_cong_map: true,
            rdma: true,
            credits: true,
        }
    }

    pub const fn loopback() -> TransportCaps {
        TransportCaps {
            kind: TransportKind::Loop,
            mp_capable: false,
            smaller_connects: false,
            sends_cong_map: false,
            rdma: false,
            credits: false,
        }
    }
}

/// Where a transport reports to; implemented by whoever owns the `Node`.
pub trait TransportSink: Send + Sync {
    /// An inbound connection from `faddr` (transport source port
    /// `peer_port`) to our `laddr`. On [`Accept::Path`] the path is UP with
    /// this connection; otherwise reset the connection.
    fn accept(&self, kind: TransportKind, laddr: IpAddr, faddr: IpAddr, peer_port: u16) -> Accept;
    /// An outgoing connection is established.
    fn path_up(&self, path: PathId, inst: u64);
    /// The connection ended (after delivering what was read from it).
    fn path_down(&self, path: PathId, inst: u64, reason: DownReason);
    /// Complete messages, in order.
    fn received(&self, path: PathId, inst: u64, msgs: &mut Vec<RxMessage>);
    /// Every message up to `seq` on the path was delivered.
    fn acked(&self, path: PathId, inst: u64, seq: u64);
    /// Up to about `budget` bytes of messages to transmit, in order. Returns
    /// whether more are queued.
    fn pull(&self, path: PathId, inst: u64, budget: usize, out: &mut Vec<TxMessage>) -> bool;
    /// An RDMA operation of the message `seq` completed with an
    /// `RDS_RDMA_*` status (IB only).
    fn rdma_complete(&self, _path: PathId, _gen: u64, _seq: u64, _status: i32) {}
}

/// One row of `RDS_INFO_TCP_SOCKETS` (or a transport's equivalent).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportConnInfo {
    pub path: Option<PathId>,
    pub local: Option<std::net::SocketAddr>,
    pub peer: Option<std::net::SocketAddr>,
    /// Header bytes still to read of the current message.
    pub hdr_rem: u64,
    /// Payload bytes still to read of the current message.
    pub data_rem: u64,
    /// Stream offset of the next byte to send, the last expected una, the last seen una.
    pub last_sent_nxt: u32,
    pub last_expected_una: u32,
    pub last_seen_una: u32,
    /// A thread is transmitting on the connection right now (`RDS_IN_XMIT`).
    pub sending: bool,
    /// Free-form transport details (IB: device, GIDs, queue sizes).
    pub detail: String,
}

/// A transport: the I/O half of RDS for one kind of connection.
pub trait RdsTransport: Send + Sync {
    fn caps(&self) -> TransportCaps;

    fn kind(&self) -> TransportKind {
        self.caps().kind
    }

    /// Whether `addr` can be a local address of this transport
    /// (`laddr_check`): the host has it, and (IB) an RDMA device serves it.
    fn laddr_check(&self, addr: IpAddr) -> io::Result<()>;

    /// Start serving `addr` (TCP: listen on its port 16385). Fails with
    /// EADDRINUSE when another process serves it.
    fn start_local(&self, addr: IpAddr) -> io::Result<()>;

    /// Stop serving `addr`.
    fn stop_local(&self, addr: IpAddr);

    /// Open the connection of a path; report `path_up` or `path_down`.
    fn connect(&self, path: PathInfo);

    /// Close this instance of the path's connection, deliver what was
    /// already read, then report `path_down(.., ShutdownDone)`.
    fn shutdown(&self, path: PathInfo);

    /// The path has messages to send: pull and transmit them.
    fn kick(&self, path: PathInfo);

    /// Receive flow control ([`crate::Output::RxFlow`]): with `paused`,
    /// stop reading the path (TCP: leave the bytes in the socket, so the
    /// window closes; IB: repost no receive buffer and hand nothing up, so
    /// a credit sender stops and a kernel sender waits in RNR retry;
    /// loopback: pull nothing from the sending path) until a call with `paused` false, whatever connection
    /// instance serves it now or later. A call whose `seq` is not above the
    /// last applied for the path is stale (outputs of different threads
    /// may arrive out of order): ignore it. What was already read is
    /// delivered; the overshoot is at most one read batch per connection.
    /// A paused path must still notice its connection ending (the peer's
    /// FIN or a reset): it then delivers what is left and reports
    /// `path_down` as usual.
    ///
    /// The default ignores it: the transport keeps delivering, and the node
    /// queues what arrives (nothing is dropped, but memory is bounded only
    /// by what the peer sends).
    fn rx_flow(&self, _path: PathInfo, _paused: bool, _seq: u64) {}

    /// Stop everything (all connections and listeners).
    fn close(&self);

    /// Introspection: one row per transport connection.
    fn conn_info(&self) -> Vec<TransportConnInfo> {
        Vec::new()
    }

    /// Transport counters under the kernel's names (`tcp_*`, `ib_*`).
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}
