//! # rds-ib: RDS over InfiniBand / RoCE verbs
//!
//! The IB transport behind [`rds_core::RdsTransport`]
//! (`transport::IbTransport`, feature `verbs`), wire-compatible with the
//! kernel's `rds_rdma`. How each part of it maps onto the transport
//! interface is written down in `rds_core::transport`.
//!
//! ## Layout
//!
//! | module | what | I/O |
//! | --- | --- | --- |
//! | [`proto`] (`src/proto/`) | the sans-IO half: [`proto::private`], [`proto::frag`], [`proto::credits`], [`proto::sidechannel`] | none |
//! | [`secrets`] | nonces and PSNs from `getrandom(2)`, the pre-shared key file | OS |
//! | `verbs` (`src/verbs.rs`, `src/verbs/`) | devices and PDs, RDMA CM channel and connect, listener, queue pair, rings, MRs, RDMA operations, verbs-only setup | verbs, RDMA CM |
//! | `transport` (`src/transport.rs`, `src/transport/`) | `IbTransport` and its config; its event thread (`event_loop.rs`: epoll, the core's [`rds_core::TransportSink`]) and listener threads (`listen.rs`) | all |
//! | `rdma_api` | the RDMA services of `IbTransport` the socket layer calls | via `verbs` |
//!
//! [`credits`], [`frag`], [`private`] and [`sidechannel`] are the paths the
//! tests, the fuzz targets and the peers import (re-exports of `proto`'s;
//! `sidechannel` adds the randomness of `secrets`).
//!
//! ## The sans-IO half
//!
//! Pure state machines and codecs that take bytes and events and return
//! what to post, with unit tests (`cargo test -p rds-ib`) and no device,
//! verbs library or RDMA CM involved:
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
//! * [`credits`]: credit flow control is the general layer's rule
//!   ([`rds_core::credits`]: send and posted credits, the credit kept back
//!   for a credit update, at most 255 advertised per header, the
//!   negotiation), which the IB transport declares it uses
//!   ([`CAPS`]`.credits`); this module is the IB glue: credits granted in
//!   `h_credit`, the ack state (piggybacked `h_ack`, explicit ack requests,
//!   one ack-only frame in flight), the `ib_*` counters and the receive
//!   ring's flow control gate;
//! * [`sidechannel`]: the verbs-only setup's side channel: fixed-size,
//!   versioned frames carrying QPN, PSN, GID, LID, MTU and the RDS
//!   connection identity, and a challenge-response handshake with
//!   HMAC-SHA256 over a pre-shared key (random nonces from both sides, each
//!   side's MAC over both nonces and what it sends, constant-time compare);
//!   nonces and 24-bit PSNs from `getrandom(2)` ([`secrets`]).
//!
//! ## The verbs path (feature `verbs`)
//!
//! Off by default, so the workspace builds without the RDMA libraries.
//! Building it needs `libibverbs-dev`, `librdmacm-dev`, `libclang-dev` and
//! `pkg-config` (`rdma-sys` runs bindgen over the system headers;
//! `scripts/setup.sh` installs them):
//!
//! ```text
//! cargo build --release -p rds-ib --features verbs
//! cargo test --release -p rds-tests --features verbs --test kernel_ib
//! ```
//!
//! [`verbs`]: device discovery, one PD per device context
//! shared by all connections, RDMA CM connect ([`verbs::IbConnection::connect`], to
//! port 18634 for IPv4 and 16385 for IPv6 as the kernel's two listeners,
//! with the 32- or 56-byte private data, proposing 4.1 with the kernel's private data, falling back to
//! 3.1 on a reject) and accept ([`verbs::Listener`]), an RC QP per
//! connection with its CQs, a ring of 512 two-SGE receives (header + 4 KiB)
//! and two-SGE sends (header copy + fragment), reassembly and acks from the
//! sans-IO modules. The `ib-probe` test bin (rds-tests) drives it;
//! rds-tests' `tests/kernel_ib.rs` runs it in the VM rig against the 6.1
//! kernel's `rds_rdma` over Soft-RoCE (ping/pong, 0 B to 1 MiB both ways,
//! the kernel connecting to our listener), and prints `SKIP:` when the rig
//! is not there.
//!
//! [`transport::IbTransport`] puts it behind [`rds_core::RdsTransport`]: an
//! event thread per transport waiting in epoll on the CQ completion channels
//! and RDMA CM event channels of its connections (no polling loop), a thread
//! per outgoing connect, a listener thread per served address asking the core
//! before accepting; reassembled messages go to `received`, the peer's
//! `h_ack` becomes `acked`, CM events and failed completions end the
//! connection (drained, flushed work requests only free their slots) with
//! `path_down`. rds-sock registers it with its feature `ib`.
//!
//! Two setup modes ([`transport::SetupMode`] in [`transport::IbConfig`]):
//!
//! * `Cm` (default): RDMA CM as above, interoperable with the kernel;
//! * `VerbsOnly { key, port }`: no RDMA CM at all (`rdma_ucm` need not be
//!   loaded). A TCP side channel (port 18635 by default) carries the
//!   [`sidechannel`] handshake; the accepting side creates no QP before the
//!   peer proved the key (refusals counted as `ib_side_auth_failed` /
//!   `ib_side_bad_handshake`; `ib_qp_created` counts QPs); then QPN, PSN
//!   (random), GID (the RoCE v2 GID of the node's IPv4 address) and MTU are
//!   exchanged and each side moves its QP INIT -> RTR -> RTS itself
//!   (`verbs/side.rs`). Every accepted connection runs on a thread of its
//!   own; the listener's thread only accepts, counts and asks the core, so
//!   no peer (slow in the handshake or in the QP setup after it) holds it
//!   up. At most 64 unauthenticated handshakes run at once and at most 2
//!   from one source address, each with one 5 s deadline for all of
//!   HELLO .. CLIENT_PARAMS (connections beyond either bound are closed at
//!   once), so a source that opens idle connections over and over keeps
//!   no other peer out. Only our own nodes speak it. rds-sock's engine
//!   picks it when `RDS_IB_PSK_FILE` names a key file (at least 16 bytes,
//!   surrounding whitespace trimmed, accessible to its owner only: a file
//!   its group or others may access is refused as ssh refuses such a
//!   private key; a bad file leaves the engine without IB) and takes the
//!   port from `RDS_IB_SIDE_PORT`. An address IB serves in this setup is
//!   not served by RDS-TCP (which carries no key) unless the engine is
//!   told so (`RDS_IB_PSK_TCP=1`, `EngineConfig::ib_psk_tcp`), and a
//!   socket receives only over its own transport. VM test:
//!   `cargo test --release -p rds-tests --features ib --test ib_vm_psk`.
//!
//! Connection loss: RC QPs retry a lost packet [`verbs::RETRY_COUNT`]
//! times (the kernel's `rds_ib_retry_count`, 1; Soft-RoCE would take the
//! IB maximum 7 as "forever"), so a peer that went silent ends the
//! connection (IBV_WC_RETRY_EXC_ERR, then the CM disconnect or the side
//! channel's close); the core resends what was not acked and the receiver
//! drops what it already had; over RDMA CM the larger address holds back
//! its connect request a moment, so that both sides reconnecting at once
//! do not make the kernel drop the new connection again and again (its
//! stale-connection rule; see [`transport`]). VM test `cargo test
//! --release -p rds-tests --features ib --test ib_vm_disconnect`: a stream
//! broken mid-way, verbs-only (side channel killed) and RDMA CM (incoming
//! RoCE v2 dropped for seconds; ours with ours and with the 6.1 kernel's
//! rds_rdma both ways), every datagram exactly once.
//!
//! RDMA operations (RDMA CM mode): [`verbs::mr`] registers user memory
//! on the shared PD for `RDS_GET_MR` / `RDMA_MAP` (cookie `rkey | in-page
//! offset << 32` as the kernel forms it; registered with iova = in-page
//! offset, so a peer's `remote_addr` k plus the cookie offset is the
//! buffer's byte k, as with the kernel's zero-based FRWR MRs); the
//! transport posts a message's RDMA READ or WRITE right before its SENDs
//! (local buffers registered for the op's duration, FENCE on the first
//! SEND, the RDMA extension header with the rkey on the message) and
//! reports the completion with the kernel's `RDS_RDMA_*` status. The
//! memory is always a range of an `rds_core::RdmaBuf` ([`rds_core::RdmaSeg`]),
//! never a raw address: each registration (a user MR, an op's local MR)
//! holds a handle to the buffer and deregisters before dropping it, so the
//! device never reaches memory that was freed. rds-sock
//! exposes `get_mr`, `get_mr_for_dest`, `free_mr`, `send_rdma_map` and the
//! RDMA_ARGS / RDMA_DEST / RDMA_STATUS ancillary data; VM test
//! `cargo test --release -p rds-tests --features ib --test ib_vm_rdma`
//! (ours with ours and with the 6.1 kernel's rds_rdma, both directions).
//!
//! ## What does not exist yet
//!
//! * reconnect after a device goes away and comes back (the PD cache keeps the
//!   old device context), conn_info rows, most of the kernel's `ib_*`
//!   counters (those of credits, acks, flushes and RDMA exist);
//! * IPv6 in the verbs-only setup mode (RDMA CM connections speak both
//!   families);
//! * verbs-only over InfiniBand link layers (the port is found by the IPv4
//!   address in its GID table: RoCE only);
//! * RDMA in the verbs-only setup mode (GET_MR is EOPNOTSUPP there, and
//!   its QPs grant no remote access), atomics (`RDS_CMSG_ATOMIC_*`), more
//!   than [`verbs::MAX_RDMA_SGES`] local buffers per op (the kernel takes
//!   1024), and `INVALIDATE` / `FREE_MR` cookie 0 (no MR cache to flush).
//!
//! Without rds-sock's `ib` feature (or without an RDMA device) the socket
//! layer answers `SO_RDS_TRANSPORT = RDS_TRANS_IB` with ENOPROTOOPT, as the
//! kernel does when `rds_rdma` is not loaded.

// The crate docs name the `verbs` and `transport` modules, which only a
// build with the feature has; that build (`cargo doc --features verbs`)
// checks those links.
#![cfg_attr(not(feature = "verbs"), allow(rustdoc::broken_intra_doc_links))]

pub mod proto;
pub mod secrets;

pub use proto::{credits, frag, private};

/// The verbs-only setup's side channel: the codec and handshake of
/// [`proto::sidechannel`] with the OS services of [`secrets`] (nonces,
/// PSNs, the key file), under the one path its users import.
pub mod sidechannel {
    pub use crate::proto::sidechannel::*;
    pub use crate::secrets::{random_bytes, random_nonce, random_psn};
}

use rds_core::TransportCaps;

/// What the IB transport does: RDMA, credit flow control (offered on every
/// new connection, `verbs::Verbs::set_flow_control`), no multipath.
pub const CAPS: TransportCaps = TransportCaps::ib();

#[cfg(feature = "verbs")]
mod rdma_api;
#[cfg(feature = "verbs")]
pub mod transport;
#[cfg(feature = "verbs")]
pub mod verbs;

#[cfg(feature = "verbs")]
pub use transport::{IbConfig, IbTransport, SetupMode};
