//! # rds-ib: RDS over InfiniBand / RoCE verbs (protocol pieces only)
//!
//! This crate will hold the IB transport behind [`rds_core::RdsTransport`],
//! wire-compatible with the kernel's `rds_rdma`. How each part of it maps
//! onto the transport interface is written down in `rds_core::transport`.
//!
//! ## What exists
//!
//! The host-testable, sans-IO half of the transport: pure state machines and
//! codecs that take bytes and events and return what to post, with unit
//! tests (`cargo test -p rds-ib`) and no device, verbs library or RDMA CM
//! involved:
//!
//! * [`private`]: the RDMA CM private data (`rds_ib_connect_private`, 32
//!   bytes for IPv4, 56 for IPv6) encoder and decoder, the passive side's
//!   version choice (`rds_ib_protocol_compatible`: 4.1, 4.0, 3.1 or a reject
//!   with value 1), the rule that only 4.1+ and 3.1 connections may carry
//!   traffic, and the active side's fallback to 3.1 after a reject;
//! * [`frag`]: splitting a message into 4 KiB fragments, each a checksummed
//!   copy of the 48-byte header plus payload, with the SOLICITED / SIGNALED
//!   choice per work request; the ack-only frame; and reassembly with the
//!   kernel's checks (header present, checksum, fragments matching the first
//!   one) plus a 1 MiB bound and exact fragment sizes;
//! * [`credits`]: the credit flow control state machine (send and posted
//!   credits, the credit kept back for a credit update, at most 255
//!   advertised per header, negotiation through the private data) and the
//!   ack state (piggybacked `h_ack`, explicit ack requests, one ack-only
//!   frame in flight).
//!
//! ## What does not exist yet
//!
//! * the verbs FFI (planned on `rdma-sys`): devices, protection domains,
//!   queue pairs, completion queues, memory registration, posting and polling;
//! * RDMA CM connection setup and the listener (port 18634 for IPv4, 16385
//!   for IPv6), and the verbs-only side channel alternative;
//! * RDMA READ / WRITE operations and GET_MR / FREE_MR;
//! * the `IbTransport` type itself, its counters and introspection, and
//!   tests against soft-RoCE (rxe) or a kernel peer.
//!
//! So there is no IB transport to select: the socket layer answers
//! `SO_RDS_TRANSPORT = RDS_TRANS_IB` with ENOPROTOOPT, as the kernel does
//! when `rds_rdma` is not loaded.

pub mod credits;
pub mod frag;
pub mod private;

use rds_core::TransportCaps;

/// What the IB transport will be able to do (RDMA, no multipath).
pub const CAPS: TransportCaps = TransportCaps::ib();
