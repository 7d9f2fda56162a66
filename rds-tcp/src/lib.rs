//! # rds-tcp: RDS over TCP, wire-compatible with the Linux kernel
//!
//! This crate is the I/O half of RDS-TCP (`net/rds/tcp*.c`): it implements
//! [`rds_core::RdsTransport`] with real TCP sockets and reports to a
//! [`rds_core::TransportSink`] (the driver that owns the sans-IO
//! [`rds_core::Node`]). The byte stream is the kernel's, so that a Linux
//! kernel's RDS-TCP can be the peer.
//!
//! ## What goes on the wire
//!
//! One TCP connection per RDS path, from the smaller address (ephemeral
//! source port) to the larger address's port [`TcpConfig::port`] (16385 by
//! default). The stream is `[48-byte header][h_len payload bytes]`
//! repeated, nothing else. Every RDS TCP socket has `TCP_NODELAY` and
//! keepalive (5 s idle, 5 s interval, 5 probes by default), and, where the
//! process may set it, a 1 MiB receive buffer with the window clamped at
//! 256 KiB, so that TCP acks what arrives before the reactor reads it
//! ([`AckHeadroom`]). There is one
//! listener per local address served ([`RdsTransport::start_local`]; the
//! kernel has one wildcard listener), with `SO_REUSEADDR` and a backlog of
//! 64.
//!
//! * [`RdsTransport::connect`] opens a non-blocking connection bound to the
//!   path's local address. Once established, if our address is the smaller
//!   one the path is reported up; otherwise it was the kernel's "poke": it is
//!   reset (`SO_LINGER` 0) and reported down with
//!   [`DownReason::DirectionRule`], so that the peer connects to us.
//! * Accepted connections are offered to [`TransportSink::accept`]; a
//!   rejected one is reset. One the core defers (its slot still holds a
//!   connection going away, or its slot shows only after the multipath
//!   handshake; every offer deferred counts in `tcp_accept_deferred`) is
//!   kept unread and offered again (at once when
//!   a path of its peer goes down, else after 5 ms doubling to 100 ms), at
//!   most [`TcpConfig::defer_per_peer`] per peer (a further one replaces
//!   the oldest: `tcp_deferred_replaced`), for at most
//!   [`TcpConfig::defer_max`], never less than the drain plus 1 s
//!   (`tcp_deferred_expired`).
//! * When `accept` fails for lack of descriptors, a descriptor held in
//!   reserve is released to accept the oldest queued connection and reset
//!   it at once (`tcp_accept_shed`), so the backlog drains; other failures
//!   back off from 10 ms to 1 s (`tcp_accept_no_resources` counts both).
//!
//! ## Threads
//!
//! A fixed number of reactor threads ([`TcpConfig::threads`]) run a mio
//! poll loop each, whatever the number of peers. Path 0 of an address pair
//! lives on the reactor the pair hashes to, its other paths on the next
//! reactors round (path `i` on reactor `(hash + i) % threads`), so the 8
//! paths of one busy peer are read by every reactor thread, not by one.
//! Each connection is read on its own, in whatever order readiness comes:
//! a socket whose messages went on path 0 before the multipath handshake
//! sends on its lane only once the peer answered a probe ping sent after
//! them (`rds_core::lane0`), so no read order is needed for theirs. Requests
//! from other threads reach a reactor through a command queue and a
//! [`mio::Waker`].
//!
//! ## Transmit
//!
//! [`RdsTransport::kick`] means "pull and send"; the calling thread transmits
//! inline, as the kernel does, one thread at a time per connection, with
//! write coalescing of one-way streams ([`TcpConfig::coalesce`]) and
//! `writev` batching: see
//! the docs of the `xmit` module (`src/xmit.rs`). A sender can make its
//! own kick under the core's lock instead ([`TcpTransport::claim_xmit`]),
//! pulling its messages in the node call of its send, and write them after
//! ([`TcpTransport::xmit_claimed`]): rds-sock's sends do.
//!
//! ## Acks
//!
//! As in the kernel, a message counts as delivered when the peer's TCP
//! acknowledged its last byte. Each sequenced message's end offset in the
//! connection's byte stream is remembered; the acked offset is the number
//! of bytes written minus `ioctl(SIOCOUTQ)`, and
//! [`TransportSink::acked`] reports the highest sequence number whose end
//! is covered. Congestion-map updates (sequence 0) are written but never
//! tracked. The kernel learns of acks in `sk_write_space`; we poll
//! `SIOCOUTQ` instead: every 32 KiB a transmitting thread writes (a sender
//! that filled its socket's send buffer finds the room its own writes'
//! acks made, mostly without waiting for the reactor), at each
//! readable or writable event of a connection with messages awaiting their
//! ack (one left with none is no longer watched until it sends again), at
//! each readable event of a lane (not path 0) of the same RDS connection (a
//! kernel's reply comes on the lane its hash gives the answering socket's
//! port, not always the request's; ours on the request's unless the
//! answering socket sent to the peer first or another socket of its node
//! holds that lane: rds-core's mprds docs, "Lanes"), by a sending thread
//! whose blocking send found its socket's send buffer full, between short naps while it waits
//! ([`TcpTransport::poll_pair_acks`]: the acks that make its room, as the
//! kernel's sender learns of them in `sk_write_space`), and on a reactor
//! timer (a `timerfd`, finer than epoll's milliseconds). Writable events come only while a write waits for room
//! in the TCP socket (the registration asks for them on demand: with them
//! on, each acknowledged segment woke the reactor). A thread that reads in
//! a blocking receive (`RxAssist`) marks the pair's paths as answered, as
//! the reactor's reads do when they bring a message that is not a
//! congestion map (a receiver's maps come on path 0, where a stream whose
//! socket hashes to path 0 waits for its acks). A connection whose transmit state a writing thread holds
//! is skipped at an event rather than waited for. The timer first fires
//! [`TcpConfig::ack_poll_min`] after a message starts the wait, or
//! [`TcpConfig::ack_poll_answered`] when the path, or a lane (not path 0)
//! of its connection while it was watched, was answered within
//! [`TcpConfig::ack_poll_max`] (`tcp_ack_timer_answered` counts those;
//! readable events poll the acks: in request/response traffic the reply
//! brings the request's ack, and the timer is only the fallback for a peer
//! that falls silent), then backs off from the minimum to the maximum
//! while nothing changes, and stays at `ack_poll_answered` while every
//! connection it watches is answered. A transmitting thread that starts
//! the wait for acks arms that timer itself rather than waking the reactor.
//! The timer is only ever moved earlier, never later (a deadline that went
//! away costs one early wake-up, not a `timerfd_settime` per message), and
//! deadlines 2 ms away or more (stall sweeps, drains, retries) use epoll's
//! own millisecond timeout instead.
//!
//! ## Introspection
//!
//! [`RdsTransport::conn_info`] gives one row per path connection like
//! `RDS_INFO_TCP_SOCKETS`: the socket addresses, the receive decoder's
//! `hdr_rem` / `data_rem`, and `last_sent_nxt` / `last_expected_una` /
//! `last_seen_una` as 32-bit offsets in the connection's byte stream (not
//! TCP sequence numbers), plus a `detail` string with the transmit state.
//! [`RdsTransport::counters`] uses the kernel's `tcp_*` names for what
//! corresponds here: `tcp_data_ready_calls` counts readable events handled,
//! `tcp_write_space_calls` the times the acked offset was seen to advance,
//! `tcp_sndbuf_full` writes that hit `EAGAIN`, `tcp_connect_raced` accepted
//! connections that replaced our own connect in progress on the same path,
//! and `tcp_listen_closed_stale` accepted connections reset because the
//! core did not take them. Two counters of our own tell where connections
//! were cut: `tcp_rx_partial_discarded` counts connections that ended with
//! a message partly received (those bytes are discarded; the sender sees
//! no ack for the message and sends it again), `tcp_tx_partial` those that
//! ended with a message partly written, `tcp_reset_untaken` those the
//! core closed before the peer evidently took them, reset rather than
//! closed with a FIN (`rds_core::PathInfo::taken`: a 6.1 kernel that
//! takes a half-closed connection out of its accept queue keeps a path
//! slot on it for good), `tcp_rx_short_reads` the read
//! passes a short read ended (see "Receive"), `tcp_tx_coalesced` the
//! sends left to the end of a write-coalescing window (of them
//! `tcp_tx_handed_off` those left to the reactor after it,
//! [`TcpConfig::stream_handoff`]), `tcp_tx_batch_full` the sends that
//! completed a batch of a stream of mid-size messages and wrote it (the
//! `coalesce` module's docs), `tcp_tx_batched` the replies left for
//! the replying program's next kick ([`TcpTransport::kick_later`]) and
//! `tcp_ack_timer_answered` the waits for acks whose timer started at
//! `ack_poll_answered` and `tcp_ack_timer_polls` the reactor's polls on
//! its ack timer, a wake-up each (see "Acks"), and `tcp_window_clamp_reasserted`
//! the window clamps of [`AckHeadroom`] set again after the kernel raised
//! them. [`TcpTransport::abort_path`] is a fault-injection
//! hook for tests.
//!
//! ## Receive
//!
//! The reactor reads with a 256 KiB buffer until the socket is drained or
//! [`TcpConfig::read_budget`] bytes, splits the stream with [`rds_core::wire::FrameDecoder`], stamps the
//! receive time and hands complete messages to
//! [`TransportSink::received`] in batches. A payload of 8 KiB or more is
//! read straight into the message's buffer, and after such a message the
//! next header and a payload of the same length are read with one
//! `readv` into a 48-byte header buffer and a pooled payload buffer
//! ([`rds_core::wire::FrameDecoder::read_guessed`]): in a stream of large
//! messages a payload is never copied in user space on its way in (qperf
//! `rds_bw` of 64 KiB under the shim: 0.97 -> 1.2-1.46 GB/s on loopback,
//! about +30% in the VM rig). A read that returns fewer bytes
//! than offered drained the socket, and ends the pass without the read
//! that would only return `EAGAIN` (`tcp_rx_short_reads` counts them):
//! readiness is edge-triggered, and a segment that arrives later raises a
//! new readable event; an event that brought the peer's FIN or an error
//! raises none, so that connection is read to its end (the `read` module
//! of the reactor says why this is safe). An `h_len` above 1 MiB resets
//! the connection and reports [`DownReason::ProtocolError`], after the
//! messages that preceded it were delivered. On end of stream or an error
//! every complete message already read is delivered before
//! [`DownReason::Closed`] is reported: a message whose bytes our TCP acked
//! is never dropped.
//!
//! An application thread about to block in a receive may read
//! connections itself ([`RxAssist`], through
//! `rds_sock::RdsSocket::recv_msg_wait`, the C ABI's blocking receive):
//! it polls the up paths of the address pair of its last message beside
//! its socket's descriptor, and reads and delivers what arrives, so a
//! message wakes one thread instead of the reactor and then the receiver.
//! While a connection has such a thread the reactor leaves its readable
//! events to it (`tcp_rx_assist_left`; its passes: `tcp_rx_assist_reads`;
//! the ack polls it left to the reactor's ack timer, fewer than
//! [`ASSIST_ACK_LAZY_BYTES`] awaiting acks: `tcp_rx_assist_acks_left`);
//! one reader at a time per connection, the paths of a pair in any order
//! (a socket's move from path 0 to its lane waits for the peer's read
//! proof, `rds_core::lane0`), and the end of the stream is the reactor's
//! (the `assist` module says how nothing is lost or reordered).
//!
//! Memory per connection is bounded by what arrived: a partial payload's
//! buffer grows with the bytes received (never to a hostile `h_len` up
//! front), and a partial message that gets no byte for
//! [`TcpConfig::rx_frame_timeout`] (30 s) resets the connection
//! (`tcp_rx_frame_stalled`). Receive flow control
//! ([`RdsTransport::rx_flow`]): a path the core paused is not read (its
//! readable events return at once, counted in `tcp_rx_paused`; the TCP
//! window closes and the peer blocks); a pause that comes with a batch stops
//! the reading after that batch; the peer's reset or an error still reads
//! it to its end and reports it down (a FIN waits behind the data the
//! window holds back); the state is per path, so a reconnected path stays
//! paused; the resume reads what waits in the socket.
//!
//! The paths of a connection are paused and read independently: no read
//! order between them is needed (see Reactors above). (Before the rule of
//! `rds_core::lane0`, a socket moved to its lane once its path-0 messages
//! were acked, and every lane was read after its path 0; an ack says our
//! TCP has the bytes, not that we read them, and bytes that came to path 0
//! and then to the lane between the look at path 0 and the read of the
//! lane still went out of order: once in about 40 runs of the all-to-all
//! test.)
//!
//! ## Closing
//!
//! [`RdsTransport::shutdown`] stops writing, sends a FIN and keeps reading
//! and delivering until the peer's FIN (at most
//! [`TcpConfig::shutdown_drain`]; zero means "what is readable now"), then
//! closes and reports [`DownReason::ShutdownDone`]. A side that reads a FIN
//! has everything the peer sent; it closes at once (its own FIN follows
//! what it had written, which the draining peer still reads) and reports
//! [`DownReason::Closed`]. Like the kernel's graceful shutdown, this keeps
//! messages that TCP acknowledged but nobody had read yet from being lost.
//! Resets (`SO_LINGER` 0) are kept for the poke, rejected connections and
//! protocol errors. Every report carries the instance of the connection it
//! is about; the core ignores reports of older instances.

// Unsafe is confined to sys.rs (FFI); every block says why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]

mod assist;
mod batch;
mod coalesce;
mod interest;
mod path_conn;
mod path_table;
mod reactor;
mod stats;
mod sys;
mod xmit;

pub use assist::{ASSIST_ACK_LAZY_BYTES, ASSIST_LINGER, ASSIST_MAX_PATHS, ASSIST_STREAM_BYTES, RxAssist};
pub use batch::REPLY_BATCH_MAX;
pub use xmit::XmitClaim;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rds_core::wire::RDS_TCP_PORT;
use rds_core::{DownReason, PathId, PathInfo, RdsTransport, TransportCaps, TransportConnInfo, TransportSink};
use socket2::{Domain, SockAddr, Socket, TcpKeepalive, Type};

use path_conn::{PathConn, UP};
use reactor::{Cmd, ReactorHandle};
use stats::Stats;

/// Settings of the TCP transport.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// Listening and destination port (the kernel's 16385).
    pub port: u16,
    /// Reactor threads; a fixed count whatever the number of peers.
    pub threads: usize,
    /// `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT`.
    pub keepalive_idle: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_count: u32,
    /// `SO_SNDBUF` / `SO_RCVBUF` of every connection (the kernel's
    /// `net.rds.tcp.rds_tcp_sndbuf` / `rds_tcp_rcvbuf`); `None` keeps the
    /// system's autotuning (for the receive buffer, unless
    /// [`TcpConfig::ack_headroom`] sizes it).
    pub sndbuf: Option<usize>,
    pub rcvbuf: Option<usize>,
    /// The receive buffer and window of every connection when `rcvbuf` is
    /// `None`, so that TCP acknowledges bytes as they arrive although the
    /// reactor reads them later; see [`AckHeadroom`]. Default
    /// [`AckHeadroom::DEFAULT`] (1 MiB, window 256 KiB); `None` keeps
    /// autotuning.
    pub ack_headroom: Option<AckHeadroom>,
    /// Bytes of messages pulled from the core per round.
    pub pull_budget: usize,
    /// Bytes an application thread transmits inline before handing the rest
    /// to the reactor.
    pub inline_limit: usize,
    /// Bytes the reactor transmits on one connection before serving others.
    pub reactor_xmit_limit: usize,
    /// Bytes read from one connection before serving others.
    pub read_budget: usize,
    /// Ack polling interval while messages await their TCP ack: starts at
    /// the minimum and doubles up to the maximum while nothing changes.
    pub ack_poll_min: Duration,
    pub ack_poll_max: Duration,
    /// The ack timer's interval while every connection it watches brought
    /// an answer (a message other than a congestion map) within
    /// `ack_poll_max`: request/response traffic, where each answer's reader
    /// polls the acks and the timer is only the fallback for a peer that
    /// falls silent (its acks are then polled this long after the last
    /// answer at most, from then on as `ack_poll_min`..`ack_poll_max`
    /// say). Each fallback poll wakes the reactor: at the 4 ms of
    /// `ack_poll_max` that was a quarter of a wake-up per round trip of
    /// qperf `rds_lat` in the VM rig, and 40 ms made its round trips 10%
    /// shorter (6 rounds alternating, 205-210 against 223-249 µs). Default
    /// 40 ms.
    pub ack_poll_answered: Duration,
    /// How long a shutdown keeps reading while waiting for the peer's FIN.
    pub shutdown_drain: Duration,
    /// An accepted connection the core deferred (its slot still holds a
    /// connection that is going away) is reset after waiting this long; at
    /// least `shutdown_drain` plus one second is used, so that the old
    /// connection's drain always ends (and frees the slot) first: what the
    /// peer wrote on the new one was acked by our TCP and must not be lost.
    pub defer_max: Duration,
    /// Deferred connections kept per peer address (the engine sets the
    /// node's path count): a further one replaces the oldest of that peer
    /// (`tcp_deferred_replaced`), as the kernel lets a new connection
    /// replace a path's old one.
    pub defer_per_peer: usize,
    /// Write coalescing of one-way streams: once 16 sends in a row came
    /// each less than a window after the one before, with nothing read by
    /// the reactor in between (a send held up for less than 8 windows
    /// neither counts nor ends the run), an application thread that finds the
    /// connection written less than a window ago leaves its message
    /// queued, and the messages of the window go out in one `writev` (by
    /// the next send after the window, or by the reactor at its end). A
    /// message sent after a pause, and request/response traffic, go out at
    /// once. The window is this long, or longer where a transmit of small
    /// messages costs more ([`TcpConfig::coalesce_max`]); a stream's
    /// messages wait at most a window. A stream of messages of 2 to 8 KiB
    /// where a transmit costs more than this window is written in batches
    /// of about 64 KiB, each by the send that completes it (the `coalesce`
    /// module's docs, `tcp_tx_batch_full`). Zero writes every message at
    /// once.
    /// Default 20 µs (`RDS_TCP_COALESCE_US` in the environment overrides
    /// it).
    pub coalesce: Duration,
    /// The longest the coalescing window grows to: where sending messages
    /// of up to 2 KiB measured slow (emulated, loaded), the window is 4
    /// times what one transmit took on the connection (its pull and
    /// `sendmsg`, sampled), between [`TcpConfig::coalesce`] and this. Zero
    /// keeps the window at [`TcpConfig::coalesce`]. Default 500 µs
    /// (`RDS_TCP_COALESCE_MAX_US` overrides it). See the `coalesce`
    /// module's docs (`src/coalesce.rs`).
    pub coalesce_max: Duration,
    /// A connection whose partly received message (header or payload) got
    /// no byte for this long is reset (counted in `tcp_rx_frame_stalled`,
    /// reported as [`DownReason::ProtocolError`]); a path the core paused
    /// is exempt. Zero disables it. Default 30 s.
    pub rx_frame_timeout: Duration,
    /// A one-way stream of small messages (see [`TcpConfig::coalesce`])
    /// leaves every write to the reactor, also after a coalescing window
    /// ended, instead of writing in the sending thread then: the sending
    /// thread only queues. Default on (`RDS_TCP_STREAM_HANDOFF=0` in the
    /// environment turns it off). See the `coalesce` module's docs.
    pub stream_handoff: bool,
    /// The longest an answer left for its program's next write waits for
    /// it: the reactor writes it then ([`TcpTransport::kick_later`], the
    /// `batch` module's docs). Zero holds no answer (every send writes at
    /// once, as the kernel's). Default [`REPLY_BATCH_MAX`], 2 ms
    /// (`RDS_TCP_REPLY_BATCH_US` in the environment overrides it).
    pub reply_batch: Duration,
}

/// A receive buffer several times the largest receive window a connection
/// advertises (`SO_RCVBUF` and `TCP_WINDOW_CLAMP`).
///
/// Linux's TCP acknowledges received data at once (every second full
/// segment) only while the window it would now advertise is no smaller
/// than the one it last advertised; bytes not yet read take room from the
/// buffer and shrink that window, and the ack then waits until the reader
/// reads (or the delayed-ack timer fires). The kernel's RDS-TCP reads in
/// the TCP receive callback, so its bytes are never unread for long; ours
/// are read by a reactor thread woken after they arrived. RDS-TCP frees a
/// sent message only when TCP acknowledged it, and a message not freed
/// counts against the sending socket's send buffer: with autotuning (which
/// grows the window with the buffer) a stream of 64 KiB messages in the VM
/// rig found the sending RDS socket full on 1,441 of 6,700 sends
/// (`send_queue_full`), 109 with a 4 MiB buffer and a 1 MiB window, and
/// went 25-35% faster (qperf `rds_bw -m 65536`, 92-107 against 118-128
/// MB/s in alternating rounds of one boot). [`AckHeadroom::DEFAULT`] is
/// smaller, for what it costs: bytes TCP acknowledged are delivered for
/// the peer, and a process that stops or dies before it reads them loses
/// them (as a kernel RDS socket's receive queue is lost with its process,
/// but that one is bounded by the socket's buffer and congestion); a
/// stopped process's connection takes what its buffer holds, about twice
/// the size asked for. 1 MiB with a 256 KiB window gave 123-126 MB/s where
/// 4 MiB with 1 MiB gave 134-136 and autotuning 99-109 (one boot).
///
/// The window clamp is the window a connection can use: 256 KiB covers a
/// link of 2.5 GB/s at an RTT of 100 µs. The buffer is set with
/// `SO_RCVBUFFORCE` when the process may (`CAP_NET_ADMIN`: the kernel's
/// RDS sets its sockets' buffers without the cap), else with `SO_RCVBUF`
/// when `net.core.rmem_max` allows it; otherwise the connection keeps
/// autotuning (a buffer held below the headroom would only lose
/// autotuning's growth). Listeners get it before they listen, so that an
/// accepted connection has it from its handshake on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckHeadroom {
    /// `SO_RCVBUF` asked for (the kernel doubles it for its bookkeeping
    /// and counts half of the doubled value as window space).
    pub rcvbuf: usize,
    /// `TCP_WINDOW_CLAMP`.
    pub window: u32,
}

impl AckHeadroom {
    /// 1 MiB (2 MiB as the kernel counts it, about 1 MiB of window space)
    /// with the window clamped at 256 KiB: about 768 KiB may wait unread
    /// with acks still immediate.
    pub const DEFAULT: AckHeadroom = AckHeadroom { rcvbuf: 1 << 20, window: 256 << 10 };
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            port: RDS_TCP_PORT,
            threads: 1,
            keepalive_idle: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(5),
            keepalive_count: 5,
            sndbuf: None,
            rcvbuf: None,
            ack_headroom: Some(AckHeadroom::DEFAULT),
            pull_budget: 512 << 10,
            inline_limit: 4 << 20,
            reactor_xmit_limit: 4 << 20,
            read_budget: 4 << 20,
            ack_poll_min: Duration::from_micros(100),
            ack_poll_max: Duration::from_millis(4),
            ack_poll_answered: Duration::from_millis(40),
            shutdown_drain: Duration::from_secs(2),
            defer_max: Duration::from_secs(5),
            defer_per_peer: 8,
            coalesce: env_micros("RDS_TCP_COALESCE_US", 20),
            coalesce_max: env_micros("RDS_TCP_COALESCE_MAX_US", 500),
            rx_frame_timeout: Duration::from_secs(30),
            stream_handoff: std::env::var("RDS_TCP_STREAM_HANDOFF").map_or(true, |v| v != "0"),
            reply_batch: env_micros("RDS_TCP_REPLY_BATCH_US", REPLY_BATCH_MAX.as_micros() as u64),
        }
    }
}

/// Microseconds from the environment variable `name` (a whole number),
/// else `default`.
fn env_micros(name: &str, default: u64) -> Duration {
    Duration::from_micros(std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default))
}

/// What the facade ([`TcpTransport`]) and the reactor threads share: the
/// configuration, the sink, the reactors' handles, the connection of every
/// path, receive flow control, listeners and counters. Its transmit path
/// (`Inner::xmit`) is in the `xmit` module.
pub(crate) struct Inner {
    pub cfg: TcpConfig,
    sink: RwLock<Option<Weak<dyn TransportSink>>>,
    pub reactors: Vec<ReactorHandle>,
    /// The current connection of every path that has one (and the same
    /// by address pair).
    pub paths: Mutex<path_table::PathTable>,
    /// Receive flow control per path, whatever connection serves it:
    /// (paused, seq of the last applied `rx_flow`).
    rx_flow: Mutex<rds_core::types::FastMap<PathId, (bool, u64)>>,
    /// Paths paused now (skips the lookup when none is).
    rx_paused_n: AtomicUsize,
    /// Addresses listened on, and the reactor serving each.
    listeners: Mutex<HashMap<IpAddr, usize>>,
    pub stats: Stats,
    next_token: AtomicUsize,
    closed: AtomicBool,
    threads: Mutex<Vec<(ThreadId, JoinHandle<()>)>>,
    /// Run by a reactor each time it looks at the lanes left lingering
    /// ([`TcpTransport::set_linger_tick`]).
    linger_tick: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Inner {
    pub fn sink(&self) -> Option<Arc<dyn TransportSink>> {
        self.sink.read().as_ref()?.upgrade()
    }

    pub fn token(&self) -> mio::Token {
        mio::Token(self.next_token.fetch_add(1, Relaxed))
    }

    /// The reactor of path `index` of an address pair: the pair's hash
    /// picks the reactor of path 0, and the other paths follow round the
    /// reactors, so that the paths of one peer are read by as many
    /// reactor threads as there are (module docs, "Threads").
    pub fn reactor_of(&self, laddr: IpAddr, faddr: IpAddr, index: u8) -> usize {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (laddr, faddr).hash(&mut h);
        let n = self.reactors.len() as u64;
        ((h.finish() % n + u64::from(index)) % n) as usize
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }

    /// The connection serving this instance of the path, while the
    /// transport is open (a kick for an older instance finds none).
    pub(crate) fn conn_of(&self, path: &PathInfo) -> Option<Arc<PathConn>> {
        if self.is_closed() {
            return None;
        }
        self.paths.lock().get(&path.id).filter(|c| c.info.inst == path.inst).cloned()
    }

    /// Whether the core paused reading this path.
    pub fn rx_paused(&self, id: PathId) -> bool {
        self.rx_paused_n.load(SeqCst) != 0 && self.rx_flow.lock().get(&id).is_some_and(|f| f.0)
    }

    /// Socket options of every RDS TCP socket (`rds_tcp_tune` and
    /// keepalive, and receive timestamps, which order a kernel peer's
    /// congestion maps: `Node::map_order`); the window clamp of
    /// [`AckHeadroom`] if it set one.
    pub fn tune(&self, s: &socket2::SockRef<'_>) -> io::Result<Option<u32>> {
        s.set_nodelay(true)?;
        // Best-effort: without stamps the maps are ordered by read time.
        let _ = sys::timestamp_ns(s.as_raw_fd());
        let ka = TcpKeepalive::new()
            .with_time(self.cfg.keepalive_idle)
            .with_interval(self.cfg.keepalive_interval)
            .with_retries(self.cfg.keepalive_count);
        s.set_tcp_keepalive(&ka)?;
        if let Some(n) = self.cfg.sndbuf {
            s.set_send_buffer_size(n)?;
        }
        if let Some(n) = self.cfg.rcvbuf {
            s.set_recv_buffer_size(n)?;
        } else if let Some(h) = self.cfg.ack_headroom {
            return Ok(ack_headroom(s, h));
        }
        Ok(None)
    }
}

/// Applies [`AckHeadroom`] to `s` where the process may set the buffer
/// (see there) and returns the window clamp it set; best-effort, as an
/// optimisation: a socket it cannot be set on keeps autotuning.
fn ack_headroom(s: &socket2::SockRef<'_>, h: AckHeadroom) -> Option<u32> {
    let fd = s.as_raw_fd();
    let set = sys::rcvbuf_force(fd, h.rcvbuf).is_ok()
        || (sys::rmem_max().is_some_and(|max| max >= h.rcvbuf) && s.set_recv_buffer_size(h.rcvbuf).is_ok());
    (set && sys::window_clamp(fd, h.window).is_ok()).then_some(h.window)
}

/// The RDS-TCP transport. Create it with [`TcpTransport::new`], give it its
/// sink with [`TcpTransport::set_sink`], then register it with the driver.
pub struct TcpTransport {
    inner: Arc<Inner>,
}

impl TcpTransport {
    /// Starts the reactor threads.
    pub fn new(cfg: TcpConfig) -> io::Result<Arc<TcpTransport>> {
        let n = cfg.threads.max(1);
        let mut polls = Vec::with_capacity(n);
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            let poll = mio::Poll::new()?;
            handles.push(ReactorHandle::new(&poll)?);
            polls.push(poll);
        }
        let inner = Arc::new(Inner {
            cfg,
            sink: RwLock::new(None),
            reactors: handles,
            paths: Mutex::new(path_table::PathTable::default()),
            rx_flow: Mutex::new(Default::default()),
            rx_paused_n: AtomicUsize::new(0),
            listeners: Mutex::new(HashMap::new()),
            stats: Stats::default(),
            next_token: AtomicUsize::new(reactor::FIRST_TOKEN),
            closed: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            linger_tick: std::sync::OnceLock::new(),
        });
        for (i, poll) in polls.into_iter().enumerate() {
            let inner2 = inner.clone();
            let spawned =
                std::thread::Builder::new().name(format!("rds-tcp-{i}")).spawn(move || reactor::run(inner2, i, poll));
            match spawned {
                Ok(h) => inner.threads.lock().push((h.thread().id(), h)),
                Err(e) => {
                    let t = TcpTransport { inner };
                    t.close();
                    return Err(e);
                }
            }
        }
        Ok(Arc::new(TcpTransport { inner }))
    }

    /// Where the transport reports (the owner of the `Node`).
    pub fn set_sink(&self, sink: Weak<dyn TransportSink>) {
        *self.inner.sink.write() = Some(sink);
    }

    pub fn config(&self) -> &TcpConfig {
        &self.inner.cfg
    }

    /// Sets what a reactor runs each time it looks at the lanes receiving
    /// threads left lingering ([`RxAssist`] module docs), on its own
    /// thread, with no lock of the transport held: while a lane lingers,
    /// at least once per [`ASSIST_LINGER`] (its end, or a renewal's), and
    /// once after the last linger ended. An [`RxAssist::finish`] that
    /// returned true is thus followed by a tick within [`ASSIST_LINGER`]
    /// (rds-sock settles the descriptors its polls left for later there).
    /// Called often while lanes linger (each wake-up of the reactor):
    /// it should return at once when it has nothing to do. Set once; a
    /// second call is ignored.
    pub fn set_linger_tick(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.inner.linger_tick.set(f);
    }

    /// Fault injection for tests and operators: shuts the path's TCP socket
    /// down in both directions, as a failing connection would, without
    /// telling the core. The transport then sees the end of the stream,
    /// delivers what it read and reports [`DownReason::Closed`]. Returns
    /// whether the path had a connection.
    pub fn abort_path(&self, path: PathId) -> bool {
        let conn = self.inner.paths.lock().get(&path).cloned();
        conn.is_some_and(|c| c.stream.shutdown(Shutdown::Both).is_ok())
    }

    /// The local and peer socket addresses of the path's current connection.
    pub fn path_sockets(&self, path: PathId) -> Option<(Option<SocketAddr>, SocketAddr)> {
        let conn = self.inner.paths.lock().get(&path).cloned()?;
        Some((conn.local, conn.peer))
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.close();
    }
}

fn sock_domain(a: &IpAddr) -> Domain {
    if a.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 }
}

impl RdsTransport for TcpTransport {
    fn caps(&self) -> TransportCaps {
        TransportCaps::tcp()
    }

    /// Whether the host has `addr`: a TCP socket binds to it (port 0, no
    /// port taken: `IP_BIND_ADDRESS_NO_PORT`, where the kernel has it, 4.2
    /// and later; its failure only means a port is taken until the socket
    /// closes). EADDRNOTAVAIL when it does not; the socket's own errors
    /// (EMFILE ...) as they are.
    fn laddr_check(&self, addr: IpAddr) -> io::Result<()> {
        let s = Socket::new(sock_domain(&addr), Type::STREAM, None)?;
        let _ = sys::bind_address_no_port(s.as_raw_fd());
        s.bind(&SockAddr::from(SocketAddr::new(addr, 0)))
    }

    fn start_local(&self, addr: IpAddr) -> io::Result<()> {
        if self.inner.is_closed() {
            return Err(io::ErrorKind::NotConnected.into());
        }
        let mut listeners = self.inner.listeners.lock();
        if listeners.contains_key(&addr) {
            return Ok(());
        }
        let s = Socket::new(sock_domain(&addr), Type::STREAM, None)?;
        s.set_reuse_address(true)?;
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        // TCP_NODELAY, keepalive and the receive buffer, which accepted
        // connections inherit (the buffer and window from the handshake on).
        self.inner.tune(&socket2::SockRef::from(&s))?;
        s.bind(&SockAddr::from(SocketAddr::new(addr, self.inner.cfg.port)))?;
        s.listen(64)?;
        s.set_nonblocking(true)?;
        let l: TcpListener = s.into();
        let r = self.inner.reactor_of(addr, addr, 0);
        listeners.insert(addr, r);
        self.inner.reactors[r].send(Cmd::Listen(addr, l));
        Ok(())
    }

    fn stop_local(&self, addr: IpAddr) {
        if let Some(r) = self.inner.listeners.lock().remove(&addr) {
            self.inner.reactors[r].send(Cmd::Unlisten(addr));
        }
    }

    fn connect(&self, path: PathInfo) {
        if self.inner.is_closed() {
            return;
        }
        let r = self.inner.reactor_of(path.laddr, path.faddr, path.id.index);
        self.inner.reactors[r].send(Cmd::Connect(path));
    }

    fn shutdown(&self, path: PathInfo) {
        if self.inner.is_closed() {
            return;
        }
        let r = self.inner.reactor_of(path.laddr, path.faddr, path.id.index);
        self.inner.reactors[r].send(Cmd::Shutdown(path));
    }

    fn kick(&self, path: PathInfo) {
        if let Some(conn) = self.inner.conn_of(&path) {
            self.inner.xmit(&conn);
        }
    }

    fn rx_flow(&self, path: PathInfo, paused: bool, seq: u64) {
        {
            let mut flow = self.inner.rx_flow.lock();
            let f = flow.entry(path.id).or_insert((false, 0));
            if seq <= f.1 {
                return;
            }
            if f.0 != paused {
                if paused {
                    self.inner.rx_paused_n.fetch_add(1, SeqCst);
                } else {
                    self.inner.rx_paused_n.fetch_sub(1, SeqCst);
                }
            }
            *f = (paused, seq);
        }
        if !paused {
            // Readiness is edge-triggered: what waits in the socket raises
            // no new event. The reactor reads it now.
            let r = self.inner.reactor_of(path.laddr, path.faddr, path.id.index);
            self.inner.reactors[r].send(Cmd::RxResume(path.id));
        }
    }

    fn close(&self) {
        if self.inner.closed.swap(true, SeqCst) {
            return;
        }
        for r in &self.inner.reactors {
            r.send(Cmd::Stop);
        }
        let me = std::thread::current().id();
        let threads = std::mem::take(&mut *self.inner.threads.lock());
        for (id, h) in threads {
            if id != me {
                let _ = h.join();
            }
        }
        self.inner.paths.lock().clear();
        self.inner.listeners.lock().clear();
    }

    fn conn_info(&self) -> Vec<TransportConnInfo> {
        let conns: Vec<Arc<PathConn>> = self.inner.paths.lock().values().cloned().collect();
        let mut rows: Vec<TransportConnInfo> = conns
            .iter()
            .map(|c| {
                let (hdr_rem, data_rem, rx_buf) = {
                    let rx = c.rx.lock();
                    let d = &rx.decoder;
                    (d.header_remaining() as u64, d.payload_remaining() as u64, d.payload_capacity())
                };
                let rx_paused = self.inner.rx_paused(c.info.id);
                let tx = c.tx.lock();
                let detail = format!(
                    "state={} in_xmit={} wait_writable={} queued={} unacked={} watched={} rx_buf={rx_buf} rx_paused={rx_paused}",
                    match c.state() {
                        path_conn::CONNECTING => "connecting",
                        UP => "up",
                        path_conn::DRAINING => "draining",
                        _ => "closed",
                    },
                    c.in_xmit.load(Relaxed),
                    c.wait_writable.load(Relaxed),
                    tx.queued_len(),
                    tx.unacked_len(),
                    tx.watched,
                );
                TransportConnInfo {
                    path: Some(c.info.id),
                    local: c.local,
                    peer: Some(c.peer),
                    hdr_rem,
                    data_rem,
                    last_sent_nxt: tx.written as u32,
                    last_expected_una: tx.expected_una as u32,
                    last_seen_una: tx.acked as u32,
                    sending: c.in_xmit.load(Relaxed),
                    detail,
                }
            })
            .collect();
        rows.sort_by_key(|r| r.path);
        rows
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.stats.counters()
    }
}

/// The down reason a connection reports when it ends on its own.
pub(crate) fn down_reason(conn: &PathConn, otherwise: DownReason) -> DownReason {
    conn.requested.lock().unwrap_or(otherwise)
}
