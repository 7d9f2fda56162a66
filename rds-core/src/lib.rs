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
//!   and the kernel's counters; its rules live a file each (the table
//!   below);
//! * [`transport`]: the [`RdsTransport`] trait that TCP, IB and loopback
//!   implement, and the [`TransportSink`] through which they report; its
//!   docs explain how TCP and InfiniBand (fragments, credits, piggybacked
//!   acks, RDMA) map onto it;
//! * [`credits`]: credit-based flow control ([`Credits`]), for the
//!   transports whose [`TransportCaps::credits`] says they use it (IB);
//! * [`driver`]: driving a node: [`driver::Dispatch`] and [`driver::drain`]
//!   route its outputs, [`driver::NodeHost`] turns transport events into
//!   node calls (every `NodeHost` is a [`TransportSink`]);
//! * [`loopback`]: the in-process transport for addresses one node serves;
//! * [`rdma_buf`]: [`RdmaBuf`] / [`RdmaSeg`] (from the `rds-rdmabuf`
//!   crate, which keeps this one free of `unsafe`), the only memory an RDMA
//!   operation or an MR can name from safe code (every registration holds
//!   a handle until the device is done with it);
//! * [`payload`]: [`Payload`], a message's bytes shared without copying,
//!   and [`PayloadPool`], which takes a payload's buffer back when its last
//!   reference drops, so that neither a send (`Payload::copy_from`) nor a
//!   message read by the TCP framing allocates in the steady state;
//! * [`info`]: snapshots of connections, paths, sockets, queues and
//!   counters (what the kernel's `RDS_INFO_*` options report).
//!
//! Nothing here opens a socket, spawns a thread or reads a clock: every call
//! takes the events and the current time as arguments, and the node returns
//! what to do next ([`Node::poll_output`]) and when to wake it
//! ([`Node::poll_timeout`]). A driver with real sockets and threads lives in
//! `rds-sock`; a deterministic simulator drives the same code in tests.
//!
//! ## Where each rule lives
//!
//! Each protocol rule is written once, in one file, as methods beside the
//! state type that owns what the rule changes. [`Node`] holds an
//! `Endpoint` (the node-wide state: settings, transports, sockets and bound
//! ports, congestion, counters, outputs, timers, the receive budget) and the
//! table of connections; a `Connection` ([`connection`]) holds its paths
//! (`Path`, [`path`]) with their queues and sequence numbers; sockets are
//! `Sock`s ([`sock`]).
//!
//! | rule | file | state owned by |
//! |------|------|----------------|
//! | `sendmsg`, enqueue with sequence numbers, send-buffer accounting | [`send`] | `Path` (`send_queue`, `next_tx_seq`), `Sock` (`snd_bytes`) |
//! | transmit (`pull`), ACK_REQUIRED pacing, acks, retransmit after reconnect (`send_path_reset`) | [`send`] | `Path` (`retrans`, `unacked_*`) |
//! | cancel (`drop_messages`), RDMA completion, `unsent` | [`send`] | `Path`, `Sock` (`notify_queue`) |
//! | receive (`received`), the duplicate and stale rules, delivery, `Node::recv` | [`recv`] | `Path` (`next_rx_seq`, `rx_any`, `rx_conns`), `Sock` (`recv_queue`) |
//! | receive flow control (hard cap, node budget, pause/resume) | [`recv`] | `Endpoint` (`rx_held`, `rx_paused`) |
//! | ping/pong (answering pings; probes and pongs are queued by `send_probe`) | [`recv`], [`mprds`] | `Connection` (`ping_triggered`) |
//! | path state machine (`Path::set_state`, the kernel's table) | [`path`] | `Path` (`state`) |
//! | connect, accept, up, down, drop, reset; a path above 0 that may not connect yet connects path 0 (`connect_if_down`) | [`path`] | `Path` (`inst`, `hold`, `confirmed`, ...) |
//! | reconnect backoff (`queue_reconnect`, the reconnect timer) | [`path`] | `Path` (`reconnect_delay`, `reconnect_at`) |
//! | idle collection, sequence memos of collected connections, peer limit and eviction | [`connection`] | `Connection` (`gc_at`, `evicted`), `ConnMemo`; `Node` (`memos`) |
//! | connection table and lookups (`conn_for`, `find_conn`, `path_info`) | [`node`], [`connection`] | `Node` (`conns`: a `ConnTable`, `conn_index`) |
//! | mprds: handshake (NPATHS, GEN_NUM, SPORT_IDX), lanes (a socket's first message either way fixes its lane to a peer, among those its node's sockets hold least), fan-out, peer generation and restarts | [`mprds`] | `Connection` (`npaths`, `peer_gen`, `with_sport_idx`, `gen_up_seq`, `lane_socks`), `Path` (`inst_gen`), `Sock` (`lanes`) |
//! | lane-0 holds: a socket's pre-handshake messages on path 0 hold its lane until a pong proves the peer read them | [`lane0`] | `Path` (`lane0_wire`, `proof_pings`, `read_through`), `Sock` (`lane0_backlog`) |
//! | congestion maps: our ports' hysteresis, when the peers hear of a change (a congestion once it holds a message back), updates owed and sent, map header and versions, receiving a map, monitor notifications | [`cong`] | `Congestion` (`maps`, `versions`, `unannounced`, `watchers`; the endpoint's `cong`), `Connection` (`map_queued`), `Sock` (`congested`, `cong_announced`, `cong_mask`, `cong_notify`) |
//! | socket API: `socket`, `bind`, `connect`, options, `close`, readiness, errno rules, the address check | [`sock`] | `Sock`, `Endpoint` (`socks`, `bound`) |
//! | outputs, wake-ups, timers and their dispatch | [`node`] | `Endpoint` (`outputs`, `timers`, `write_waiters`) |
//! | loopback (a path up from the start; what goes a -> b arrives on b -> a) | [`loopback`], [`node`] (`conn_for`), [`recv`] | `LoopTransport` |
//! | wire format: header and checksum (`wire/mod.rs`), extension headers (`wire/ext.rs`), TCP framing (`wire/frame.rs`) | [`wire`] | (values) |
//! | messages on queues, received, notifications | [`message`] | `QueuedMsg` |
//! | payload buffers and their reuse (size classes, bounds, thread caches) | [`payload`] | `PayloadPool` |
//! | the kernel's counters | [`stats`] | `Counters` |
//! | info snapshots (`RDS_INFO_*`) | [`info`] | (read-only) |
//! | credit-based flow control (grab keeping the last credit back, add, advertise, the 16-bit bounds), for transports whose `TransportCaps::credits` says so (IB) | [`credits`] | `Credits` |
//! | the transport trait, capabilities, `Accept` | [`transport`] | `TransportCaps` |
//! | driving a node: draining and routing its outputs, transport events into node calls | [`driver`] | (none: `Dispatch`, `NodeHost`) |

#![forbid(unsafe_code)]

pub mod cong;
pub mod connection;
pub mod credits;
pub mod driver;
pub mod info;
pub mod lane0;
pub mod loopback;
pub mod message;
pub mod mprds;
pub mod node;
pub mod path;
pub mod payload;
pub mod rdma_buf;
pub mod recv;
pub mod send;
pub mod sock;
pub mod stats;
pub mod transport;
pub mod types;
pub mod wire;

pub use credits::{CreditGrant, Credits};
pub use info::{ConnSnapshot, MsgSnapshot, PathSnapshot, Queue, SockSnapshot};
pub use message::{Incoming, Notification, RdmaOp, Received, RxMessage, TxMessage};
pub use node::{HandshakeExts, Node, NodeConfig, Output};
pub use path::{DownReason, PathInfo, PathState};
pub use payload::{PayloadPool, PoolStats};
pub use rdma_buf::{RdmaBuf, RdmaSeg};
pub use recv::RecvOutcome;
pub use send::{SendOptions, Unsent};
pub use sock::{Readiness, SockOpt};
pub use stats::Counters;
pub use transport::{Accept, RdsTransport, TransportCaps, TransportConnInfo, TransportSink};
pub use types::{ConnId, Errno, PathId, Payload, SockId, TransportKind, addr_cmp};
