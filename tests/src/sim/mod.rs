//! # A deterministic fault simulator for rds-core
//!
//! RDS promises that a datagram accepted by `sendmsg` is delivered exactly
//! once and in order per (source socket, destination socket), across
//! connection failures, or reported as failed. This module drives real
//! [`rds_core::Node`]s over a simulated network, injects faults, and checks
//! that promise on every run. Everything is decided by one seed: the same
//! seed replays the same run event for event.
//!
//! The files: `world.rs` (the world, its event queue and the run; it
//! drives the nodes through rds-core's `driver`), `net.rs` (the network
//! model below), `faults.rs` (the faults below, by the seed's schedule),
//! `workload.rs` (the applications), `checks.rs` and `oracle.rs` (the
//! invariant below).
//!
//! `cargo run --release -p rds-tests --bin rds-sim -- --seeds 10000` runs
//! seeds 0..10000; a failure prints its seed and the command that replays
//! it with a trace of every event (`--replay SEED -v`). The test suite
//! (`tests/tests/sim.rs`) runs those and 5,000 more from a window the
//! commit's hash chooses, other seeds at every commit.
//!
//! ## The model
//!
//! * **Nodes.** 3 to 5 `Node`s, each serving 1 to 3 IPv4 addresses
//!   (interleaved, so every node is the smaller side towards some peers and
//!   the larger towards others; traffic between addresses of one node uses
//!   the loopback transport, served as `rds_core::loopback` does), each with
//!   2 to 4 bound sockets with send and receive buffers from 2304 bytes to
//!   the default, blocking or non-blocking. Per node a path count of 1 to 8
//!   with `HandshakeExts::Full` (4 seeds in 5), 1 with `Mainline` (below).
//!   Timers run on simulated time (`poll_timeout` / `handle_timeout`).
//!   In 1 seed in 3 one node only reads (`Params::sink`, rds-sink's role):
//!   it never sends, not even in the final round, so after its restart
//!   nothing of its pokes its peers, which must reconnect to it by
//!   themselves for what they queued (with all traffic two-way, the
//!   restarted node's own sends made every peer reconnect, and a peer
//!   that never would have went unseen).
//! * **Connections.** A path's connection is a pair of byte streams carrying
//!   the real wire encoding (48-byte headers and payloads; the reader splits
//!   them with [`rds_core::wire::FrameDecoder`]). Writes are cut into 1 to 3
//!   segments with their own latency (5 µs to 4.5 ms per connection) and
//!   arrive in order. A writer may have at most a window (4 to 256 KiB) of
//!   bytes not yet read by the peer's transport: TCP flow control and
//!   socket buffers. The connector's connect completes one round trip after
//!   it started; the acceptor's node sees `accept` at a random moment
//!   around that, so either side may act first; bytes the connector writes
//!   meanwhile are acked by the acceptor's kernel. The direction rule is
//!   rds-tcp's: a connection from the larger address is the "poke", closed
//!   by its connector with `DirectionRule`; the acceptor must refuse it. A
//!   connection the node defers (`Accept::Defer`) stays unread, its bytes
//!   acked, and is offered again after the node's next `path_down` or 1 ms
//!   later (rds-tcp's stash); one reset meanwhile is still offered, and
//!   what arrived before the reset is read.
//! * **Acks like TCP's.** Bytes that reach the peer are acked by its kernel
//!   after a delay; a message counts as delivered (`Node::acked`) once its
//!   last byte arrived, before the peer's transport read it and long before
//!   its application did. The transport learns of acks in its reactor.
//! * **Transport readers.** Each node's reactor passes 0 to 200 µs after
//!   something arrived (or when a stall ends) and reads every connection
//!   with bytes, a FIN or a reset to handle: half the passes lower path
//!   index first, as one rds-tcp reactor sorts a poll batch, the others in
//!   a random order, as rds-tcp's reactor threads and receiving threads
//!   read the paths of a pair. Complete messages go to `Node::received`
//!   in stream order. No order between paths is relied on: a socket's
//!   move from path 0 to its own lane after the handshake waits for the
//!   peer's answer to a probe ping sent after its path-0 messages
//!   (`rds_core::lane0`). (With the earlier rule, a move once those were
//!   acked, the random order lost the order of about one seed in a
//!   thousand.)
//! * **Closing.** A shutdown the core asks for (`Output::Shutdown`) sends a
//!   FIN and keeps reading until the peer's FIN (at most 2 s); a side that
//!   reads a FIN delivers everything before it, reports `Closed` and sends
//!   its own FIN after what it wrote. That is rds-tcp's drain-before-close:
//!   what a peer had received is delivered, never dropped.
//!
//! ## Faults
//!
//! * connection resets at any byte: bytes in flight are lost, each side
//!   notices after its own delay (0 to 2 ms), delivers what had already
//!   arrived (in its reactor's next pass), and reports `Closed`;
//! * core-requested path resets (`Node::reset_path`, the kernel's
//!   RDS_CONN_RESET), which go through the graceful shutdown;
//! * abrupt node death and restart: the process dies with its sockets, its
//!   queues and whatever its transport had received but not yet handed to
//!   the node (acked by its TCP nonetheless); bytes it had already sent keep
//!   arriving until the survivor notices the reset; connects to it fail
//!   until a new instance (new `Node`, same addresses, new generation
//!   number) starts 0 to 20 ms later and binds the same ports again;
//! * applications that stop reading for 0.1 to 40 ms (receive queues fill,
//!   the port becomes congested, senders get ENOBUFS, send buffers fill and
//!   senders get EAGAIN), and reactors that stop reading for up to 15 ms
//!   (TCP windows fill);
//! * RDS_CANCEL_SENT_TO (`Node::drop_messages`) of a random destination.
//!
//! After the fault phase (20 to 80 ms) stalls end and every socket sends one
//! last message to every destination as a blocking sender (it retries only
//! when the node wakes it), and the run must quiesce: all messages acked,
//! all queues empty, no sender left waiting.
//!
//! Not modelled: packet loss that TCP itself would repair (invisible to
//! RDS), half-open connections that never see a reset (keepalive's job),
//! a receive queue purged by an RST (Linux keeps what arrived readable),
//! socket close, IPv6, IB, RDMA, peers with `ping_enable` off, kernel peers
//! (every node is rds-core), peers that restart with other settings (path
//! count, handshake), `read_budget`, and the rds-tcp/rds-sock code itself
//! (threads, locks, coalescing): this checks the core's protocol logic
//! against a model of what the transport promises in `rds_core::transport`
//! and what rds-tcp documents.
//!
//! ## The invariant, exactly
//!
//! Call a *flow* the messages one socket instance sent to one destination
//! address and port, in the order `send` accepted them. After every run:
//!
//! 1. **Integrity.** Every datagram an application reads is one that was
//!    accepted, with the same bytes, source and destination.
//! 2. **No duplicates.** With `HandshakeExts::Full`, no message is read
//!    twice, by any instance of the destination. With `Mainline` a message
//!    may be read once by each *instance* of the destination node (see
//!    below), never twice by one instance.
//! 3. **Order.** Within a flow, reads happen in accept order (Full: across
//!    instances of the destination; Mainline: per instance). Messages may
//!    be missing only as point 4 allows; no message is read after a later
//!    one of its flow.
//! 4. **Completeness.** Every accepted message is read exactly once, except:
//!    * *the sender died*: messages of a socket whose node instance died
//!      (they may be read at most once, in order);
//!    * *the receiver died*: messages that reached an instance of the
//!      destination that then died before its application read them (on a
//!      socket receive queue, or acked by its TCP and still in its
//!      transport's buffers);
//!    * *cancelled*: messages of a flow accepted before an
//!      RDS_CANCEL_SENT_TO of that flow, at most as many as the cancels
//!      reported dropping (they may still be read, at most once);
//!    * *flushed* (Full only): messages the survivor's node reports with
//!      `Node::flushed` because the destination restarted: per sending
//!      socket, the unexplained missing messages must number at most its
//!      `flushed` count, and each must be to a node that restarted and have
//!      been accepted before the sender detected a restart. The sum over
//!      sockets is at most `counters.send_drop_flushed` (which also counts
//!      flushed probes and pongs);
//!    * *stale sequence* (Mainline only, see below): messages of a
//!      restarted sender instance that the receiver dropped as old
//!      retransmissions and never delivered;
//!    * *stale receiver* (Mainline only): messages sent to an instance of the destination
//!      that died before acking them, resent by the survivor and dropped by
//!      the new instance as meant for its predecessor (`RecvOutcome::Stale`:
//!      a retransmission that comes first on the first connection the new
//!      instance has on the path).
//! 5. **Bounds.** A socket's queued send bytes never exceed its limit plus
//!    one message (`rds_send_queue_rm` admits while below the limit); a
//!    receive queue never exceeds its limit plus what every sender can have
//!    queued or in flight before it learns of the congestion (twice the sum
//!    of all send buffers plus one window per possible path); nothing is
//!    ever dropped for a missing socket, a bad frame or memory (the node
//!    pauses paths instead; the simulated transport keeps delivering).
//! 6. **Liveness.** Once faults stop, everything drains within 120 s of
//!    simulated time: no message queued or unacked, no receive queue
//!    non-empty, no blocked sender left without a wake-up.
//!
//! ### Restarts: what each handshake can promise
//!
//! The kernel's answer to a peer restart is `rds_conn_peer_gen_update`
//! (docs/kernel-facts.md §7): when the GEN_NUM a peer announces in the
//! multipath handshake changes, every path's sequence numbers restart and
//! the messages sent to the old instance and not acked are flushed
//! (RDS_MSG_FLUSH: dropped, never resent), because the old instance may
//! have delivered them. They are reported through `Node::flushed`.
//!
//! rds-core keeps its own transmit numbering going (acks name messages by
//! sequence number; see `peer_gen_update`), which a new instance accepts.
//!
//! * With `Full` (GEN_NUM sent, and rds-rs maps carrying GEN_NUM, the path
//!   index and a version) the survivor learns the new generation from the
//!   new instance's first message on a new connection, its map, before it
//!   sends anything else there: nothing meant for the old instance reaches
//!   the new one, so there are no duplicates, and the messages in doubt
//!   are reported flushed. A connection that joins two different paths is
//!   dropped before it carries anything but maps.
//! * With `Mainline` (the 6.1 kernels' wire, byte for byte: NPATHS only,
//!   plain maps) a restart cannot be detected. (a) The survivor resends its
//!   unacked messages to the new instance, which drops them as stale (they
//!   come first, marked RETRANSMITTED, on its first connection of the
//!   path), so a message the old instance had received (and perhaps read)
//!   before its TCP ack reached the survivor is not read again. (b) The
//!   survivor still holds the old instance's receive sequence, so the new
//!   instance's first retransmissions can be dropped as duplicates
//!   ("stale sequence": counted, excused only for messages of a restarted
//!   sender instance that were dropped that way and never read). (c) An
//!   accepted connection cannot be checked against the peer's path index,
//!   so reconnect races can cross two paths' sequence spaces: Mainline
//!   seeds run one path per node. These are the relaxations of points 2-4
//!   for Mainline; nothing is ever flushed.

/// A trace line (`-v`), formatted only when tracing.
macro_rules! tr {
    ($sim:expr, $($a:tt)*) => {
        if $sim.verbose {
            let line = format!($($a)*);
            $sim.trace_line(line);
        }
    };
}

mod checks;
mod faults;
mod net;
pub mod oracle;
mod workload;
mod world;

pub use world::{MAX_LEN, Params, Report, Sim, run_seed};

/// Outcome of running a range of seeds.
#[derive(Debug, Default)]
pub struct Batch {
    pub seeds: u64,
    pub failures: Vec<(u64, String)>,
    pub accepted: u64,
    pub delivered: u64,
    pub events: u64,
    pub restarts: u64,
    pub resets: u64,
    pub flushed: u64,
}

/// The command that replays a seed with a trace.
pub fn replay_command(seed: u64) -> String {
    format!("cargo run --release -p rds-tests --bin rds-sim -- --replay {seed} -v")
}

/// Runs seeds `from..to` on `threads` threads; stops collecting after
/// `max_failures` failures.
pub fn run_range(from: u64, to: u64, threads: usize, max_failures: usize) -> Batch {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    let next = AtomicU64::new(from);
    let out = Mutex::new(Batch::default());
    std::thread::scope(|sc| {
        for _ in 0..threads.max(1) {
            sc.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= to {
                        return;
                    }
                    let r = run_seed(seed, false);
                    let mut b = out.lock().unwrap();
                    b.seeds += 1;
                    match r {
                        Ok(rep) => {
                            b.accepted += rep.accepted;
                            b.delivered += rep.summary.delivered;
                            b.events += rep.events;
                            b.restarts += rep.restarts;
                            b.resets += rep.resets;
                            b.flushed += rep.summary.flushed;
                        }
                        Err(e) => {
                            b.failures.push((seed, e));
                            if b.failures.len() >= max_failures {
                                next.store(to, Ordering::Relaxed);
                            }
                        }
                    }
                }
            });
        }
    });
    let mut b = out.into_inner().unwrap();
    b.failures.sort_by_key(|f| f.0);
    b
}
