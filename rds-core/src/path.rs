//! Paths (`struct rds_conn_path`) and their lifecycle: connect, accept,
//! up, down, drop, reset and the reconnect backoff (`net/rds/threads.c`,
//! `connection.c`, `tcp_listen.c`'s accept).
//!
//! Every state change goes through `Path::set_state`, which allows only
//! the kernel's transitions ([`PathState::can_go`]):
//!
//! | from                     | to            | kernel                                                        |
//! |--------------------------|---------------|---------------------------------------------------------------|
//! | any                      | ERROR         | `rds_conn_path_drop`                                          |
//! | UP, ERROR                | DISCONNECTING | `rds_conn_shutdown`                                           |
//! | DISCONNECTING            | DOWN          | `rds_conn_shutdown`                                           |
//! | DOWN                     | CONNECTING    | `rds_connect_worker`, `rds_tcp_accept_one`                    |
//! | CONNECTING, RESETTING    | UP            | `rds_connect_path_complete`                                   |
//!
//! How our events map onto it, through the kernel's intermediate states
//! (all within one call, so nothing outside sees them):
//!
//! * a connect attempt: DOWN -> CONNECTING (`connect_worker`); it
//!   completes CONNECTING -> UP (`path_up`);
//! * an accepted connection: DOWN -> CONNECTING -> UP (the kernel's accept
//!   takes the path DOWN -> CONNECTING, then completes it), or CONNECTING
//!   -> UP when our own attempt was under way;
//! * the core drops a path (`drop_path`: protocol error, peer restart,
//!   reset, eviction): -> ERROR -> DISCONNECTING (`rds_conn_path_drop`,
//!   then the shutdown worker), and the transport is told to close;
//! * the transport reports the connection gone (`path_down`): from
//!   DISCONNECTING -> DOWN; from UP or CONNECTING -> ERROR -> DISCONNECTING
//!   -> DOWN. A connect that fails is reported asynchronously (the
//!   transport's connect does not block), which in the kernel is the TCP
//!   state change to CLOSE: `rds_conn_path_drop` then the shutdown, not
//!   `rds_connect_worker`'s synchronous CONNECTING -> DOWN;
//! * a loopback path is up from the start: DOWN -> CONNECTING -> UP
//!   (`rds_loop_conn_path_connect` completes at once).
//!
//! RESETTING (the kernel's duelling-SYN accept) is never entered. A
//! transition outside the table is refused, counted on the path
//! (`Path::illegal_transitions`, shown by `Node::dump`) and, in debug
//! builds, a panic.
//!
//! Sequence numbers and retransmit queues survive transport reconnects.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::connection::Connection;
use crate::message::QueuedMsg;
use crate::node::{HandshakeExts, Node, Output, Timer};
use crate::transport::{Accept, TransportCaps};
use crate::types::{ConnId, PathId, SockId, TransportKind};

/// Path states, numbered as the kernel numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathState {
    Down = 0,
    Connecting = 1,
    Disconnecting = 2,
    Up = 3,
    Resetting = 4,
    Error = 5,
}

impl PathState {
    /// Whether the kernel allows `self -> to`.
    pub fn can_go(self, to: PathState) -> bool {
        use PathState::*;
        matches!(
            (self, to),
            (_, Error)
                | (Up, Disconnecting)
                | (Error, Disconnecting)
                | (Disconnecting, Down)
                | (Down, Connecting)
                | (Connecting, Up)
                | (Resetting, Up)
        )
    }
}

/// What a transport needs to know to open or serve a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathInfo {
    pub id: PathId,
    /// Connection instance: bumped for every connect attempt or accept;
    /// transport events carrying an older instance are ignored.
    pub inst: u64,
    pub laddr: IpAddr,
    pub faddr: IpAddr,
    pub kind: TransportKind,
    pub tos: u8,
    /// Paths negotiated for the connection so far (0 = not yet known).
    pub npaths: u8,
    /// The peer evidently took this connection: it is up and confirmed
    /// (`Path::confirmed`; always, where no confirmation is needed). The
    /// TCP transport closes one not taken with a reset, not a FIN: a 6.1
    /// kernel that takes a half-closed connection out of its accept queue
    /// later keeps a path slot on it for good (the FIN came before its
    /// callbacks, which never see it), and then resets every new
    /// connection meant for that slot; a reset one fails its first
    /// transmit there and frees the slot. Nothing of our sockets went out
    /// on such a connection, and what already arrived from the peer is
    /// read before the reset: nothing is lost by it.
    pub taken: bool,
}

/// Why a transport connection went away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownReason {
    /// Connect attempt failed (refused, unreachable, timed out).
    ConnectFailed,
    /// The peer closed or reset the connection, or an I/O error occurred.
    Closed,
    /// The peer broke the protocol (bad length, bad frame): counted.
    ProtocolError,
    /// The transport finished a shutdown the core asked for.
    ShutdownDone,
    /// TCP: an outgoing connection from the larger address was dropped to make
    /// the smaller address connect (the kernel's "poke").
    DirectionRule,
}

#[derive(Debug)]
pub(crate) struct Path {
    pub state: PathState,
    pub inst: u64,
    pub next_tx_seq: u64,
    pub next_rx_seq: u64,
    pub send_queue: VecDeque<QueuedMsg>,
    pub retrans: VecDeque<QueuedMsg>,
    /// Current reconnect bound (`cp_reconnect_jiffies`); zero after success.
    pub reconnect_delay: Duration,
    /// A (re)connect is scheduled at this time.
    pub reconnect_at: Option<Instant>,
    pub unacked_packets: u32,
    pub unacked_bytes: u64,
    /// A Kick output is outstanding (deduplication).
    pub kick_queued: bool,
    /// Times the path came up.
    pub connects: u64,
    /// The peer restarted: forget the receive sequence when the path next
    /// connects (to the new instance).
    pub rx_reset: bool,
    /// Nothing but congestion maps goes out until the peer's first message
    /// on this connection arrived (`HandshakeExts::Full`, see `complete_path`).
    pub hold: bool,
    /// This connection turned out to be another of the peer's paths (its
    /// map named that path, `Node::cong_recv`): it is being dropped, and
    /// what else arrives on it belongs to that path's sequence space, not
    /// this one's (a peer's leading probe passes its hold).
    pub crossed: bool,
    /// Our first map on this connection is still to be sent.
    pub hello_owed: bool,
    /// The peer generation this connection instance speaks for: the first
    /// GEN_NUM heard on it (0 = none yet).
    pub inst_gen: u32,
    /// When this instance came up, in the connection's order of path ups.
    pub up_seq: u64,
    /// Path 0: messages that held their sockets' lanes (pre-handshake
    /// messages, see `QueuedMsg::lane0_of`) and left the queues on the wire
    /// (acked, or cancelled after they were sent), per socket: (highest
    /// sequence, socket, messages). The hold lasts until the peer shows it
    /// read them (`read_through` passes them, see [`crate::lane0`]).
    pub lane0_wire: Vec<(u64, SockId, u32)>,
    /// Sequence numbers of the probe pings transmitted on this path and
    /// not answered yet, oldest first, whatever connection instance they
    /// first went out on (a ping is answered once, and the peer resends an
    /// answer its connection could not deliver: [`crate::lane0`]). At most
    /// [`crate::lane0::PROOF_PINGS_MAX`] of them are ours to ask.
    pub proof_pings: VecDeque<u64>,
    /// The peer read every message numbered below this: a pong answered a
    /// probe ping with this number (pongs come in the order of pings).
    pub read_through: u64,
    /// Path 0 with lane-0 holds: when to check that the peer's proof came
    /// ([`crate::lane0`]), the checks in a row that found no pong since the
    /// previous one, and whether a probe pong came since the last check.
    pub proof_at: Option<Instant>,
    pub proof_checks: u8,
    pub pong_since_check: bool,
    /// The peer evidently took this connection: a frame arrived on it, or
    /// a congestion map arrived on another path after we started connecting
    /// it, while no other connection of ours waited for the peer's sign
    /// (a 6.1 kernel sends its map whenever it accepts a connection, and
    /// when its congestion changes: `Connection::map_received`). The
    /// smaller side connects path i+1 only after path i is confirmed
    /// (`connect_worker`). One that stays unconfirmed gets a probe ping
    /// after a while, which the peer answers on it (`Node::confirm_due`).
    pub confirmed: bool,
    /// `Connection::maps_rx` when this connection attempt started.
    pub maps_at_connect: u64,
    /// While up and unconfirmed: when a probe asks the peer to answer on
    /// it (`NodeConfig::confirm_probe_after`), and the delay after that.
    pub confirm_at: Option<Instant>,
    pub confirm_delay: Duration,
    /// A sequenced message was accepted on this path (any connection).
    pub rx_any: bool,
    /// Connections of this path that the peer may have sent on: accepted
    /// ones, and our own attempts unless they were the larger address's
    /// poke (the peer never sends on those).
    pub rx_conns: u64,
    /// Transitions outside the kernel's table that `set_state` refused
    /// (a bug if ever non-zero).
    pub illegal_transitions: u32,
}

impl Path {
    /// A new path. Its ACK_REQUIRED pacing counters start at 0 (the kernel
    /// allocates the connection zeroed), so the first message it transmits
    /// asks for an ack; a path reset sets them to the maxima.
    pub fn new() -> Path {
        Path {
            state: PathState::Down,
            inst: 0,
            next_tx_seq: 1,
            next_rx_seq: 0,
            send_queue: VecDeque::new(),
            retrans: VecDeque::new(),
            reconnect_delay: Duration::ZERO,
            reconnect_at: None,
            unacked_packets: 0,
            unacked_bytes: 0,
            kick_queued: false,
            connects: 0,
            rx_reset: false,
            hold: false,
            crossed: false,
            hello_owed: false,
            inst_gen: 0,
            up_seq: 0,
            lane0_wire: Vec::new(),
            proof_pings: VecDeque::new(),
            read_through: 0,
            proof_at: None,
            proof_checks: 0,
            pong_since_check: false,
            confirmed: false,
            maps_at_connect: 0,
            confirm_at: None,
            confirm_delay: Duration::ZERO,
            rx_any: false,
            rx_conns: 0,
            illegal_transitions: 0,
        }
    }

    /// The one way a path changes state: `to` if the kernel's table allows
    /// it from the current state ([`PathState::can_go`]). Otherwise the
    /// state stays, the refusal is counted (`illegal_transitions`) and a
    /// debug build panics. Returns whether the path is now in `to`.
    pub fn set_state(&mut self, to: PathState) -> bool {
        if self.state.can_go(to) {
            self.state = to;
            return true;
        }
        debug_assert!(false, "illegal path transition {:?} -> {to:?}", self.state);
        self.illegal_transitions += 1;
        false
    }

    /// Through the kernel's states to each of `route` in turn.
    fn go(&mut self, route: &[PathState]) {
        for &to in route {
            self.set_state(to);
        }
    }

    /// A connection comes up on the path: from DOWN through CONNECTING (an
    /// accept, a loopback path), from CONNECTING directly.
    pub fn go_up(&mut self) {
        use PathState::*;
        match self.state {
            Down => self.go(&[Connecting, Up]),
            _ => self.go(&[Up]),
        }
    }

    /// The core drops the path (`rds_conn_path_drop`, then the shutdown
    /// worker's first step): -> ERROR -> DISCONNECTING.
    pub fn go_disconnecting(&mut self) {
        self.go(&[PathState::Error, PathState::Disconnecting]);
    }

    /// The transport connection is gone (`rds_conn_shutdown`): DOWN, from
    /// wherever the path was, through ERROR and DISCONNECTING as needed.
    pub fn go_down(&mut self) {
        use PathState::*;
        match self.state {
            Down => {}
            Disconnecting => self.go(&[Down]),
            Error => self.go(&[Disconnecting, Down]),
            _ => self.go(&[Error, Disconnecting, Down]),
        }
    }

    /// Messages and bytes on the send and retransmit queues.
    pub fn queued(&self) -> (usize, usize) {
        let n = self.send_queue.len() + self.retrans.len();
        let b = self.send_queue.iter().chain(self.retrans.iter()).map(|m| m.payload.len()).sum();
        (n, b)
    }
}

impl Node {
    /// `rds_conn_path_connect_if_down`. A path above 0 connects only after
    /// path 0 (`connect_worker`; the smaller address's fan-out, the larger
    /// one's poke): while it cannot, its wish to connect goes to path 0,
    /// so that whatever waits on any lane makes the connection come back.
    pub(crate) fn connect_if_down(&mut self, pid: PathId) {
        let Some(path) = self.path(pid) else { return };
        if path.state != PathState::Down {
            return;
        }
        let waits = path.reconnect_at.is_some();
        // Also when the path's own reconnect is pending: path 0 must come
        // first, and may have nothing that reconnects it (rds-sim seed
        // 1306339: down with only the handshake's probe queued).
        let first = PathId { conn: pid.conn, index: 0 };
        if pid.index > 0 && self.path(first).is_some_and(|p| p.state == PathState::Down && p.reconnect_at.is_none()) {
            self.connect_worker(first);
            return;
        }
        if !waits {
            self.connect_worker(pid);
        }
    }

    /// `rds_connect_worker`: DOWN -> CONNECTING and ask the driver to connect.
    /// Paths other than 0 are only ever opened by the smaller address, and
    /// in order: path i once paths 0..i are up and the peer evidently took
    /// them (`Path::confirmed`), so that a peer that cannot tell which path
    /// a connection is for (no SPORT_IDX) gives it its lowest free slot, the
    /// right one (the kernel connects all at once and its peer takes them in
    /// arrival order, which crosses sequence spaces). A 6.1 kernel accepts
    /// in its own time: a connection established on our side may still
    /// wait in its accept queue, so "up" alone is not enough.
    pub(crate) fn connect_worker(&mut self, pid: PathId) {
        let caps = self.caps_of(self.conn(pid.conn).kind);
        if let Some(info) = self.conn_mut(pid.conn).start_connect(pid.index, caps) {
            self.ep.outputs.push_back(Output::Connect(info));
        }
    }

    /// `rds_queue_reconnect`: first attempt at once, then after a random
    /// delay below a bound that doubles up to `reconnect_max`. Over TCP only
    /// the smaller address reconnects; the larger one re-pokes path 0 (with
    /// the same backoff) while it has messages queued on any path.
    pub(crate) fn queue_reconnect(&mut self, pid: PathId, now: Instant) {
        let c = self.conn(pid.conn);
        let caps = self.caps_of(c.kind);
        if caps.smaller_connects && !Node::is_smaller(&c.laddr, &c.faddr) && (pid.index != 0 || !c.has_queued()) {
            // The larger side connects only path 0, to poke the peer, when
            // something is queued. A lane that went down last, with its
            // messages back on its queue, pokes through path 0 (down
            // earlier with nothing queued, it was not scheduled).
            let p0 = &c.paths[0];
            if pid.index != 0 && c.has_queued() && p0.state == PathState::Down && p0.reconnect_at.is_none() {
                self.queue_reconnect(PathId { conn: pid.conn, index: 0 }, now);
            }
            return;
        }
        if pid.index > 0 && usize::from(pid.index) >= c.active_paths() {
            return;
        }
        let settle = if pid.index > 0 && caps.mp_capable && Node::is_smaller(&c.laddr, &c.faddr) && !c.with_sport_idx {
            self.ep.cfg.reconnect_settle
        } else {
            Duration::ZERO
        };
        let (min, max) = (self.ep.cfg.reconnect_min, self.ep.cfg.reconnect_max);
        let jitter = self.ep.rng.next_u64();
        let at = self.path_mut(pid).unwrap().backoff(now, settle, min, max, jitter);
        self.schedule(at, Timer::Reconnect(pid));
    }

    /// The reconnect timer of a path fired (`rds_connect_worker` queued by
    /// `rds_queue_reconnect`).
    pub(crate) fn reconnect_due(&mut self, pid: PathId) {
        if let Some(path) = self.path_mut(pid) {
            path.reconnect_at = None;
        }
        self.connect_worker(pid);
    }

    /// A transport connection of the path is established (active side)
    /// at `now` (`rds_connect_path_complete`). If the peer has not
    /// evidently taken it yet, a probe asks it to answer on it after
    /// [`crate::NodeConfig::confirm_probe_after`] (`Node::confirm_due`).
    pub fn path_up(&mut self, pid: PathId, inst: u64, now: Instant) {
        self.ep.now_hint = Some(now);
        let Some(path) = self.path_mut(pid) else { return };
        if path.inst != inst || path.state != PathState::Connecting {
            return;
        }
        self.complete_path(pid);
        let after = self.ep.cfg.confirm_probe_after;
        if after.is_zero() {
            return;
        }
        if let Some(path) = self.path_mut(pid).filter(|p| p.state == PathState::Up && !p.confirmed) {
            let at = path.arm_confirm(now, after);
            self.schedule(at, Timer::Confirm(pid));
        }
    }

    /// A path of ours is still up and unconfirmed after its delay: a probe
    /// ping goes out on it, ahead of the sockets' messages that wait for
    /// the confirmation (the peer answers on the same connection, and
    /// anything arriving on it confirms it), and the next check comes
    /// after twice the delay.
    ///
    /// The fourth check (15 times `confirm_probe_after` after the path
    /// came up) drops it instead, and it connects again
    /// (`mprds_confirm_drop`). The probe cannot always help: after a
    /// reset the queue starts with retransmissions, which keep their
    /// sequence numbers, and a probe numbered after them would make a
    /// kernel drop them as old. If the kernel's map was lost as well (in
    /// CI a 6.1 kernel sent nothing at all on such a connection for 43 s),
    /// nothing else would ever move the path. A new connection makes the
    /// kernel accept again and send its map; nothing of a socket was on
    /// the dropped one.
    pub(crate) fn confirm_due(&mut self, pid: PathId, now: Instant) {
        let after = self.ep.cfg.confirm_probe_after;
        let Some(path) = self.path_mut(pid) else { return };
        path.confirm_at = None;
        if path.state != PathState::Up || path.confirmed {
            return;
        }
        if path.confirm_delay >= after.saturating_mul(CONFIRM_CHECKS_DELAY_FACTOR) {
            self.ep.counters.mprds_confirm_drop += 1;
            self.drop_path(pid);
            return;
        }
        let at = path.arm_confirm(now, path.confirm_delay.saturating_mul(2));
        // One still unsent answers for this one: a peer that never reads
        // must not grow the queue by a probe per check.
        let unsent = path.send_queue.iter().any(crate::message::QueuedMsg::is_probe);
        self.schedule(at, Timer::Confirm(pid));
        if !unsent && self.send_probe(pid, crate::wire::PROBE_PORT, 0) {
            self.ep.counters.mprds_confirm_probe += 1;
            self.ep.counters.mprds_probe_sent += 1;
            // Sockets' messages waiting for the confirmation would keep it
            // queued behind them: it goes first when none of them was ever
            // on a wire (they are renumbered after it, `Path::probe_first`).
            self.probe_first(pid);
        }
    }

    pub(crate) fn complete_path(&mut self, pid: PathId) {
        // With HandshakeExts::Full a new connection carries only our map
        // until the peer's first message on it arrived, if the peer is an
        // rds-rs node with Full (its maps carry GEN_NUM), or if we never
        // heard from the peer: a map is then what the peer sends first. That map tells whether the peer restarted before anything
        // meant for its previous instance goes out (so nothing is delivered
        // twice), and whether the connection is the peer's same path (an
        // accept race can pair different paths; such a connection is
        // dropped, `cong_recv`). A peer that resets the connection instead
        // of taking it got nothing it would have acked and then lost.
        let full = self.ep.cfg.handshake_exts == HandshakeExts::Full;
        let caps = self.caps_of(self.conn(pid.conn).kind);
        let (fresh, hold) = self.conn_mut(pid.conn).path_came_up(pid.index, full, caps);
        // Every path that comes up makes us send our map (on the map lane).
        if self.caps_of(self.conn(pid.conn).kind).sends_cong_map {
            self.queue_map(pid.conn);
        }
        if pid.index == 0 {
            self.maybe_probe(pid.conn);
            if hold && fresh {
                self.probe_first(pid);
            }
            self.ask_read_proof(pid.conn, false);
        }
        // The next path of the fan-out (`connect_worker`).
        self.start_mprds(pid.conn);
        self.kick(pid);
    }

    /// An inbound transport connection from `faddr` to our `laddr`
    /// (`rds_tcp_accept_one`) at `now`. `peer_port` is the peer's transport
    /// source port (used when the peer encodes the path index in it). As
    /// every path event it gives the node the time: the rules that start a
    /// timer on an event without one (an ack: `lane0`'s check of its holds)
    /// start it from the latest time given, and a node that only accepted
    /// had none (rds-sim seed 1243463: a hold's check never armed, the hold
    /// waited for ever for a pong that did not come).
    pub fn accept(
        &mut self,
        kind: TransportKind,
        laddr: IpAddr,
        faddr: IpAddr,
        peer_port: u16,
        now: Instant,
    ) -> Accept {
        self.ep.now_hint = Some(now);
        if !self.is_local(&laddr) || self.is_local(&faddr) {
            return Accept::Reject;
        }
        // A new peer, or one evicted meanwhile, needs room.
        let known = self.find_conn(laddr, faddr, kind);
        let evicted = known.is_some_and(|c| self.conn(c).evicted);
        if (known.is_none() || evicted) && !self.make_room() {
            self.ep.counters.conn_refused_peer_limit += 1;
            return Accept::Reject;
        }
        let conn = self.conn_for(laddr, faddr, kind, 0);
        self.conn_mut(conn).evicted = false;
        let c = self.conn(conn);
        let caps = self.caps_of(c.kind);
        if caps.smaller_connects && Node::is_smaller(&laddr, &faddr) {
            // The poke: the larger peer has something for us on some path.
            // Path 0 connects, and the others too once their count is known.
            self.connect_if_down(PathId { conn, index: 0 });
            self.start_mprds(conn);
            return Accept::RejectPeerLarger;
        }
        // The slot: the one the peer's source port names when it encodes
        // the path index (SPORT_IDX); otherwise the lowest that is not up,
        // the next path of a peer that connects its paths in order (as we
        // do). A connection that cannot be placed yet waits (Defer) rather
        // than being reset, which would lose what the peer already wrote.
        let Some(i) = c.accept_slot(peer_port) else { return Accept::Defer };
        let pid = PathId { conn, index: i as u8 };
        match self.path(pid).unwrap().state {
            PathState::Down | PathState::Connecting => {}
            // The peer only connects a path it has no connection for: ours
            // is dead. The new one waits until ours delivered what it read.
            PathState::Up => {
                self.drop_path(pid);
                return Accept::Defer;
            }
            _ => return Accept::Defer,
        }
        let path = self.path_mut(pid).unwrap();
        path.inst += 1;
        path.rx_conns += 1;
        self.complete_path(pid);
        Accept::Path(self.conn(conn).info(i))
    }

    /// The transport connection of a path is gone (or a connect failed, or a
    /// shutdown the core asked for finished). The path is reset: unacked
    /// messages go back to the front of the send queue marked RETRANSMITTED,
    /// and a reconnect is queued (`rds_conn_shutdown`).
    pub fn path_down(&mut self, pid: PathId, inst: u64, reason: DownReason, now: Instant) {
        self.ep.now_hint = Some(now);
        let Some(path) = self.path_mut(pid) else { return };
        if path.inst != inst || path.state == PathState::Down {
            return;
        }
        let was_up = matches!(path.state, PathState::Up | PathState::Disconnecting);
        if reason == DownReason::ProtocolError {
            self.ep.counters.recv_drop_bad_frame += 1;
        }
        if was_up {
            self.ep.counters.conn_reset += 1;
        }
        self.send_path_reset(pid);
        let conn = pid.conn;
        let caps = self.caps_of(self.conn(conn).kind);
        let c = self.conn_mut(conn);
        c.path_went_down(pid.index, was_up);
        for k in c.unconfirmed_after(pid.index, caps) {
            self.drop_path(PathId { conn, index: k });
        }
        if self.conn(conn).reconnects_after_down(pid.index, reason) {
            self.queue_reconnect(pid, now);
        }
        if self.conn(conn).all_down() {
            self.conn_all_down(conn, now);
        }
        // Senders blocked on this path may need to see the change.
        self.wake_writers();
    }

    /// The core drops a path itself (protocol error, peer restart). The
    /// driver closes the connection and then reports `path_down`.
    pub(crate) fn drop_path(&mut self, pid: PathId) {
        let Some(c) = self.conns.get_mut(pid.conn) else { return };
        if let Some(info) = c.drop_path(pid.index) {
            self.ep.outputs.push_back(Output::Shutdown(info));
        }
    }

    /// Resets the path's transport connection as if it had failed (like the
    /// kernel's RDS_CONN_RESET option); messages are retransmitted.
    pub fn reset_path(&mut self, pid: PathId) {
        self.drop_path(pid);
    }

    /// Information about a path (for drivers that lost track).
    pub fn path_info_of(&self, conn: ConnId, index: u8) -> Option<PathInfo> {
        self.path_info(PathId { conn, index })
    }
}

/// The lifecycle rules that need nothing but the connection (and the
/// transport's capabilities): each returns what the node must then do.
impl Connection {
    /// `rds_connect_worker`'s part on the connection (see
    /// `Node::connect_worker`): DOWN -> CONNECTING with a new instance, if
    /// the path may connect now; returns the path to connect.
    pub(crate) fn start_connect(&mut self, index: u8, caps: TransportCaps) -> Option<PathInfo> {
        let smaller = Node::is_smaller(&self.laddr, &self.faddr);
        let i = usize::from(index);
        if i > 0
            && (!smaller
                || i >= self.active_paths()
                || self.paths[..i].iter().any(|p| p.state != PathState::Up || !p.confirmed))
        {
            return None;
        }
        let maps = self.maps_rx;
        let path = &mut self.paths[i];
        if path.state != PathState::Down {
            return None;
        }
        path.set_state(PathState::Connecting);
        path.inst += 1;
        if smaller || !caps.smaller_connects {
            path.rx_conns += 1;
        }
        path.maps_at_connect = maps;
        Some(self.info(i))
    }

    /// The path's connection is up (see `Node::complete_path`): the path
    /// holds, owes its hello, is confirmed or not, and its backoff ends.
    /// Returns (no path of the connection was up before, the path holds).
    pub(crate) fn path_came_up(&mut self, index: u8, full: bool, caps: TransportCaps) -> (bool, bool) {
        let sends_map = caps.sends_cong_map;
        let i = usize::from(index);
        // Only our own connections of a multipath connection need the
        // peer's confirmation (`connect_worker`); a map may have come already.
        let confirmed = !caps.mp_capable
            || !Node::is_smaller(&self.laddr, &self.faddr)
            || self.maps_rx > self.paths[i].maps_at_connect;
        let fresh = self.ups == 0;
        let hold = full && sends_map && (self.peer_gen_maps || !self.heard);
        self.ups += 1;
        let up_seq = self.ups;
        let path = &mut self.paths[i];
        path.hold = hold;
        path.crossed = false;
        path.hello_owed = full && sends_map;
        path.inst_gen = 0;
        path.up_seq = up_seq;
        path.confirmed = confirmed;
        path.go_up();
        path.reconnect_delay = Duration::ZERO;
        path.reconnect_at = None;
        path.confirm_at = None;
        path.connects += 1;
        if std::mem::take(&mut path.rx_reset) {
            path.next_rx_seq = 0;
        }
        (fresh, hold)
    }

    /// The slot of an inbound connection (see `Node::accept`): the one the
    /// peer's source port names when it encodes the path index
    /// (SPORT_IDX); otherwise the lowest that is not up. None: it cannot be
    /// placed yet (Defer).
    pub(crate) fn accept_slot(&self, peer_port: u16) -> Option<usize> {
        if self.with_sport_idx {
            return Some(usize::from(peer_port) % self.active_paths());
        }
        let n = if self.npaths == 0 { self.paths.len() } else { self.active_paths() };
        match (0..n).find(|&i| self.paths[i].state != PathState::Up) {
            // Before the handshake with path 0 up, this is either the
            // peer's path 0 again (ours is dead) or its path 1 (it
            // heard our probe): known once either happens.
            Some(i) if i > 0 && self.npaths == 0 => None,
            Some(i) => Some(i),
            None if n == 1 => Some(0),
            // Every path is up: one is dead, which one shows later.
            None => None,
        }
    }

    /// The path's transport connection is gone (see `Node::path_down`):
    /// DOWN with a new instance. If it was up and no path is up any more,
    /// the peer may come back as a new instance with other settings: the
    /// path count is negotiated again on the next connection. That holds
    /// while path 0's reconnect is already under way (a dead peer's paths
    /// are reported one by one, path 0's first attempt starts at once):
    /// kept, the old count sent the next message to a lane above 0 that
    /// waits for path 0, and no probe asked the new instance. (Not after a
    /// failed connect: every send to an unreachable peer would queue one
    /// more probe.)
    pub(crate) fn path_went_down(&mut self, index: u8, was_up: bool) {
        let path = &mut self.paths[usize::from(index)];
        path.go_down();
        path.inst += 1;
        if was_up && self.paths.len() > 1 && !self.paths.iter().any(|p| p.state == PathState::Up) {
            self.npaths = 0;
            self.ping_triggered = false;
        }
    }

    /// After path `index` went down, our later paths that the peer has not
    /// evidently taken yet, to drop: they may sit in its accept queue, and
    /// a 6.1 kernel would give them the slot this path just freed (its
    /// lowest free one), crossing sequence spaces. They connect again in
    /// order after this one.
    pub(crate) fn unconfirmed_after(&self, index: u8, caps: TransportCaps) -> Vec<u8> {
        if !caps.mp_capable || !Node::is_smaller(&self.laddr, &self.faddr) || self.with_sport_idx {
            return Vec::new();
        }
        (usize::from(index) + 1..self.paths.len())
            .filter(|&k| match self.paths[k].state {
                PathState::Connecting => true,
                PathState::Up => !self.paths[k].confirmed,
                _ => false,
            })
            .map(|k| k as u8)
            .collect()
    }

    /// Whether path `index`, gone for `reason`, reconnects. A failed
    /// connect is tried again only for something to send (a socket's
    /// messages, a map owed) or while another path of the peer is up: a
    /// peer that vanished is not retried for ever (the kernel does), and
    /// one that comes back connects, or pokes us, when it has something. A
    /// connection that closed reconnects as in the kernel (once, if the
    /// peer is gone). An evicted peer's connection stays down
    /// (`Node::make_room`).
    pub(crate) fn reconnects_after_down(&self, index: u8, reason: DownReason) -> bool {
        let others_up = self.paths.iter().any(|p| p.state == PathState::Up);
        let retry = reason != DownReason::ConnectFailed || self.has_queued() || others_up || self.map_queued;
        let poke_only = reason == DownReason::DirectionRule && self.paths[usize::from(index)].send_queue.is_empty();
        retry && !poke_only && !self.evicted
    }

    /// The core drops the path (see `Node::drop_path`): UP or CONNECTING ->
    /// DISCONNECTING; returns the path whose transport connection to close.
    pub(crate) fn drop_path(&mut self, index: u8) -> Option<PathInfo> {
        let path = self.paths.get_mut(usize::from(index))?;
        if !matches!(path.state, PathState::Up | PathState::Connecting) {
            return None;
        }
        let taken = path.taken();
        path.go_disconnecting();
        Some(PathInfo { taken, ..self.info(usize::from(index)) })
    }

    /// Whether the path has something to transmit and no Kick outstanding;
    /// if so the Kick is now outstanding and the path is returned.
    pub(crate) fn kick(&mut self, index: u8) -> Option<PathInfo> {
        let i = usize::from(index);
        let map_due = self.map_queued && self.map_lane() == Some(i);
        let peer_gen_maps = self.peer_gen_maps;
        let path = self.paths.get_mut(i)?;
        let map_due = map_due || (path.hello_owed && peer_gen_maps);
        if path.kick_queued || path.state != PathState::Up || (path.send_queue.is_empty() && !map_due) {
            return None;
        }
        path.kick_queued = true;
        Some(self.info(i))
    }
}

/// The delay before the last confirm check, as a multiple of
/// `confirm_probe_after` (the checks come after 1, 2, 4 and 8 times it):
/// a path still unconfirmed then is dropped (`Node::confirm_due`).
const CONFIRM_CHECKS_DELAY_FACTOR: u32 = 8;

impl Path {
    /// The peer evidently took this path's connection: up and confirmed
    /// ([`PathInfo::taken`]).
    pub(crate) fn taken(&self) -> bool {
        self.state == PathState::Up && self.confirmed
    }

    /// The next confirm check ([`Node::confirm_due`]) `delay` after `now`;
    /// returns when (also kept in `confirm_at`).
    pub(crate) fn arm_confirm(&mut self, now: Instant, delay: Duration) -> Instant {
        let at = crate::types::later(now, delay);
        self.confirm_delay = delay;
        self.confirm_at = Some(at);
        at
    }

    /// `rds_queue_reconnect`'s delay: the first attempt after `settle`,
    /// then a random delay (from `jitter`) below a bound that doubles from
    /// `min` up to `max`. Returns when to connect (also kept in
    /// `reconnect_at`).
    pub(crate) fn backoff(
        &mut self,
        now: Instant,
        settle: Duration,
        min: Duration,
        max: Duration,
        jitter: u64,
    ) -> Instant {
        let at = if self.reconnect_delay.is_zero() {
            self.reconnect_delay = min;
            crate::types::later(now, settle)
        } else {
            let bound = self.reconnect_delay.as_nanos().max(1) as u64;
            let d = Duration::from_nanos(jitter % bound);
            self.reconnect_delay = self.reconnect_delay.saturating_mul(2).min(max);
            crate::types::later(now, d)
        };
        self.reconnect_at = Some(at);
        at
    }
}

#[cfg(test)]
mod tests;
