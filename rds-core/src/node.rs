//! The node: one RDS stack (the kernel's whole `net/rds` state for the
//! addresses it serves), as a sans-IO state machine.
//!
//! The caller (an engine with sockets and threads, or a simulator) feeds it
//! API calls, transport events and the current time, and drains
//! [`Output`]s: connections to open or close, paths with data to transmit,
//! sockets whose readiness changed. Nothing here reads a clock, touches a
//! socket or spawns a thread.
//!
//! This file holds the node-wide state ([`Node`], [`NodeConfig`]), the
//! outputs and timers with their dispatch, wake-ups and the connection
//! table's lookups; the rules live a file each (see the crate docs).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::cong::Congestion;
use crate::connection::{ConnMemo, ConnTable, Connection};
use crate::path::{Path, PathInfo, PathState};
use crate::sock::{SockSlot, bufs};
use crate::stats::Counters;
use crate::transport::TransportCaps;
use crate::types::{ConnId, FastMap, PathId, Rng, SockId, TransportKind, addr_cmp};

/// Which extension headers the multipath probe and its pong carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeExts {
    /// NPATHS only: what mainline kernels before 2026 put on the wire
    /// (their `rds_message_add_extension` refuses a second header). Between
    /// rds-rs nodes a connection that a reconnect pairs with another path
    /// of the peer is not recognised (as between 6.1 kernels).
    Mainline,
    /// NPATHS and GEN_NUM (as the 2026 kernels send them): lets the peer
    /// detect our restarts. SPORT_IDX is not sent: it would promise that our
    /// TCP source port encodes the path index, which rds-tcp does not do
    /// (it binds port 0). A peer's SPORT_IDX is honoured on accept.
    ///
    /// Between rds-rs nodes with Full, congestion maps also carry GEN_NUM
    /// and the path index (kernels ignore a map's header), every new
    /// connection starts with a map, and nothing else goes on it until the
    /// peer's map arrived: a restart is known before anything meant for
    /// the previous instance is resent, and a connection joining two
    /// different paths is dropped before use (see `Node::complete_path`).
    ///
    /// The default. Against 6.1 kernels it is harmless: they ignore a
    /// map's header and parse the probe's GEN_NUM. The hold cannot stall a
    /// kernel: a kernel's messages carry no GEN_NUM in maps, so only the
    /// first connection of a fresh connection object holds for it, and our
    /// probe, numbered first, passes that hold (`Node::probe_first`): a 6.1
    /// kernel whose map went out on another of its connections then answers
    /// it on this one.
    Full,
}

/// Node settings (the kernel's sysctls and compile-time constants).
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Paths we support per TCP connection (1..=8; `RDS_MPATH_WORKERS`).
    pub npaths: u8,
    pub handshake_exts: HandshakeExts,
    /// Our generation number (random per start; never 0).
    pub gen_num: u32,
    /// `net.rds.ping_enable`.
    pub ping_enable: bool,
    /// `reconnect_min_delay_ms` / `reconnect_max_delay_ms`.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// The smaller side's first reconnect of a path other than 0, towards a
    /// peer that cannot tell which path a connection is for (no SPORT_IDX:
    /// a 6.1 kernel gives it its lowest free slot), waits this long, so that
    /// the deaths of lower paths that went at the same time (a reset of all
    /// paths) are known first and the paths reconnect in order. The kernel
    /// reconnects at once (0, the default here; the engine uses 50 ms).
    pub reconnect_settle: Duration,
    /// How long a connection of ours may stay up without the peer's sign
    /// that it took it (`Path::confirmed`) before a probe ping goes out on
    /// it: the peer answers a ping on the connection it came on, and the
    /// answer confirms it. Then after twice as long, and twice again
    /// (`mprds_confirm_probe`); still unconfirmed 15 times this after it
    /// came up, the connection is dropped and connects again
    /// (`mprds_confirm_drop`). A 6.1 kernel's sign is the congestion map
    /// it sends when it accepts, on whichever of its connections transmits
    /// first; if that map is lost (it went out on a connection of ours
    /// that was closing), the fan-out of the paths after this one would
    /// otherwise stop until the next map. Zero: no such probe or drop.
    pub confirm_probe_after: Duration,
    /// `max_unacked_packets` / `max_unacked_bytes` (ACK_REQUIRED pacing).
    pub max_unacked_packets: u32,
    pub max_unacked_bytes: u64,
    /// `net.core.wmem_default`, `wmem_max`, `rmem_default`, `rmem_max`.
    pub wmem_default: u32,
    pub wmem_max: u32,
    pub rmem_default: u32,
    pub rmem_max: u32,
    /// A socket's receive queue may hold at most this multiple of its
    /// receive buffer, and at least [`crate::recv::RCV_HARD_FLOOR`] bytes
    /// (the peer ignores congestion): a path that delivers a message
    /// beyond it is paused ([`Output::RxFlow`]: the transport stops reading
    /// it, the TCP window closes) until the application's reads bring the
    /// queue back under three quarters of it. Nothing is dropped: the
    /// message that crossed the cap, and what the transport had read
    /// already, are queued. The kernel has no such bound.
    pub rcv_hard_factor: u32,
    /// Node-wide receive budget: bytes queued on all sockets (payloads plus
    /// [`crate::recv::RCV_MSG_OVERHEAD`] per message). A path that delivers a
    /// message beyond it is paused as for the per-socket cap, until the
    /// total is back under three quarters of it. Default 1 GiB (four
    /// sockets at the default hard cap).
    pub rcv_budget: u64,
    /// Seed of the node's PRNG (backoff jitter, port choice).
    pub seed: u64,
    /// Peers (connection objects of a transport other than loopback) the
    /// node keeps at most. An inbound connection from a new peer beyond it
    /// evicts the oldest peer that never sent a message
    /// (`conn_evicted_silent`), or is refused (`conn_refused_peer_limit`).
    /// The kernel has no bound. Sends to new destinations are not limited.
    pub max_peers: usize,
    /// A connection whose paths are all down with nothing queued is
    /// collected after this long (`conn_collected`); its sequence numbers
    /// are remembered (at most `conn_memo_max` of them) so that the peer's
    /// retransmissions are still recognised and ours keep growing when it
    /// returns. `None`: never (the kernel frees connections only with the
    /// namespace).
    pub conn_idle_gc: Option<Duration>,
    /// Collected connections whose sequence state is remembered; the oldest
    /// is forgotten beyond this.
    pub conn_memo_max: usize,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            npaths: crate::wire::MPATH_WORKERS as u8,
            handshake_exts: HandshakeExts::Full,
            gen_num: 1,
            ping_enable: true,
            reconnect_min: Duration::from_millis(1),
            reconnect_max: Duration::from_millis(1000),
            reconnect_settle: Duration::ZERO,
            confirm_probe_after: Duration::from_millis(200),
            max_unacked_packets: 8,
            max_unacked_bytes: 16 << 20,
            wmem_default: bufs::DEFAULT_BUF,
            wmem_max: bufs::DEFAULT_BUF,
            rmem_default: bufs::DEFAULT_BUF,
            rmem_max: bufs::DEFAULT_BUF,
            rcv_hard_factor: 16,
            rcv_budget: 1 << 30,
            seed: 0,
            max_peers: 4096,
            conn_idle_gc: Some(Duration::from_secs(60)),
            conn_memo_max: 65536,
        }
    }
}

/// What the node asks of its driver. Drain with [`Node::poll_output`] after
/// every call into the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Open the transport connection of this path (we are the active side,
    /// or, for TCP from the larger address, "poke" the peer).
    Connect(PathInfo),
    /// Close this instance of the path's transport connection; drain what
    /// can still be read from it, then report [`Node::path_down`]. One the
    /// peer has not taken ([`PathInfo::taken`]) is reset, not closed with
    /// a FIN, once what already arrived is read.
    Shutdown(PathInfo),
    /// The path has messages to transmit: pull them with [`Node::pull`].
    Kick(PathInfo),
    /// The socket's readiness changed, or a blocked sender should retry.
    Wake(SockId),
    /// Receive flow control ([`crate::RdsTransport::rx_flow`]): stop
    /// (`paused`) or resume reading the path, whatever connection serves it
    /// now or after a reconnect (the transport keeps the state per
    /// [`PathId`]; `path.inst` is informative). A socket over its hard cap
    /// or the node over its receive budget pauses the path that delivered
    /// to it; the application's reads resume it. Outputs of different
    /// threads may be dispatched out of order: `seq` grows with every
    /// RxFlow of the node, and a transport ignores one whose `seq` is not
    /// above the last it applied for the path.
    RxFlow { path: PathInfo, paused: bool, seq: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    Reconnect(PathId),
    /// A path of ours still unconfirmed (`Path::confirm_at`).
    Confirm(PathId),
    /// Idle collection of a connection (`Connection::gc_at`).
    Collect(ConnId),
    /// Path 0's lane-0 holds still wait for the peer's proof
    /// (`Path::proof_at`, `crate::lane0`).
    Proof(ConnId),
}

/// The node-wide state of one RDS stack (quinn-proto's `Endpoint`): what
/// every connection shares — settings, transports, local addresses,
/// sockets and bound ports, congestion maps, counters, the outputs and
/// timers queued for the driver, the receive budget. Per-peer state is in
/// the `Connection`s of `Node::conns`.
pub(crate) struct Endpoint {
    pub cfg: NodeConfig,
    pub rng: Rng,
    pub caps: [Option<TransportCaps>; 3],
    /// Addresses this node serves, with the transports serving each.
    pub locals: FastMap<IpAddr, Vec<TransportKind>>,
    pub socks: Vec<SockSlot>,
    pub free_socks: Vec<u32>,
    pub bound: FastMap<SocketAddr, SockId>,
    /// Congestion maps and their versions (`cong.rs`).
    pub cong: Congestion,
    pub counters: Counters,
    pub outputs: VecDeque<Output>,
    pub timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// The latest `now` a caller gave (a timer, a path up or down): calls
    /// without one (an ack) arm timers from it (`crate::lane0`).
    pub now_hint: Option<Instant>,
    /// Sockets with a blocked sender (woken on acks and map updates).
    pub write_waiters: Vec<SockId>,
    /// Bytes queued on all sockets' receive queues (payloads plus
    /// `RCV_MSG_OVERHEAD` per message), against `NodeConfig::rcv_budget`.
    pub rx_held: u64,
    /// Paths whose reading is paused, and why (`recv.rs`).
    pub rx_paused: FastMap<PathId, crate::recv::RxPause>,
    /// Sequence of `Output::RxFlow`.
    pub rx_flow_seq: u64,
    /// The messages one ack releases (`Node::acked`), kept empty between
    /// calls so that its capacity is reused.
    pub acked: Vec<crate::message::QueuedMsg>,
}

impl Endpoint {
    /// The capabilities of a transport (loopback's if not registered).
    pub fn caps_of(&self, kind: TransportKind) -> TransportCaps {
        self.caps[kind.slot()].unwrap_or_else(TransportCaps::loopback)
    }
}

/// One RDS stack: the node-wide state (an `Endpoint`) and the table of
/// connections, apart, so that a rule of one connection can borrow its
/// `Connection` and the parts of the endpoint it needs at the same time.
pub struct Node {
    pub(crate) ep: Endpoint,
    pub(crate) conns: ConnTable,
    pub(crate) conn_index: HashMap<(IpAddr, IpAddr, TransportKind, u8), ConnId>,
    /// Sequence state of collected connections (`ConnMemo`), with their
    /// order of collection (oldest first) for the bound.
    pub(crate) memos: HashMap<(IpAddr, IpAddr, TransportKind, u8), ConnMemo>,
    pub(crate) memo_order: VecDeque<(IpAddr, IpAddr, TransportKind, u8)>,
}

impl Node {
    pub fn new(cfg: NodeConfig) -> Node {
        let rng = Rng::new(cfg.seed ^ u64::from(cfg.gen_num).rotate_left(32));
        Node {
            ep: Endpoint {
                cfg,
                rng,
                caps: [None, None, None],
                locals: FastMap::default(),
                socks: Vec::new(),
                free_socks: Vec::new(),
                bound: FastMap::default(),
                cong: Congestion::default(),
                counters: Counters::default(),
                outputs: VecDeque::new(),
                timers: BinaryHeap::new(),
                now_hint: None,
                write_waiters: Vec::new(),
                rx_held: 0,
                rx_paused: FastMap::default(),
                rx_flow_seq: 0,
                acked: Vec::new(),
            },
            conns: ConnTable::default(),
            conn_index: HashMap::new(),
            memos: HashMap::new(),
            memo_order: VecDeque::new(),
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.ep.cfg
    }

    pub fn counters(&self) -> &Counters {
        &self.ep.counters
    }

    /// Makes a transport available (`rds_trans_register`).
    pub fn register_transport(&mut self, caps: TransportCaps) {
        self.ep.caps[caps.kind.slot()] = Some(caps);
    }

    pub fn has_transport(&self, kind: TransportKind) -> bool {
        self.ep.caps[kind.slot()].is_some()
    }

    pub(crate) fn caps_of(&self, kind: TransportKind) -> TransportCaps {
        self.ep.caps_of(kind)
    }

    /// The node now serves `addr` with transport `kind` (the driver has set
    /// up whatever listening that needs).
    pub fn add_local(&mut self, addr: IpAddr, kind: TransportKind) {
        let kinds = self.ep.locals.entry(addr).or_default();
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
        self.ep.cong.map(addr);
    }

    pub fn is_local(&self, addr: &IpAddr) -> bool {
        self.ep.locals.contains_key(addr)
    }

    /// Addresses served, with their transports.
    pub fn locals(&self) -> impl Iterator<Item = (&IpAddr, &Vec<TransportKind>)> {
        self.ep.locals.iter()
    }

    // ----------------------------------------------------------------
    // Outputs and timers
    // ----------------------------------------------------------------

    /// Next thing for the driver to do.
    pub fn poll_output(&mut self) -> Option<Output> {
        let o = self.ep.outputs.pop_front()?;
        match &o {
            Output::Kick(info) => {
                if let Some(path) = self.path_mut(info.id) {
                    path.kick_queued = false;
                }
            }
            Output::Wake(s) => {
                if let Some(sock) = self.sock_mut(*s) {
                    sock.wake_queued = false;
                }
            }
            _ => {}
        }
        Some(o)
    }

    /// When [`Node::handle_timeout`] should next be called.
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, t))) = self.ep.timers.peek().copied() {
            if self.timer_live(at, t) {
                return Some(at);
            }
            self.ep.timers.pop();
        }
        None
    }

    fn timer_live(&self, at: Instant, t: Timer) -> bool {
        match t {
            Timer::Reconnect(p) => self.path(p).is_some_and(|path| path.reconnect_at == Some(at)),
            Timer::Confirm(p) => self.path(p).is_some_and(|path| path.confirm_at == Some(at)),
            Timer::Collect(c) => self.conns.get(c).is_some_and(|c| c.gc_at == Some(at)),
            Timer::Proof(c) => self.conns.get(c).is_some_and(|c| c.paths[0].proof_at == Some(at)),
        }
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.ep.now_hint = Some(now);
        while let Some(Reverse((at, t))) = self.ep.timers.peek().copied() {
            if at > now {
                break;
            }
            self.ep.timers.pop();
            if !self.timer_live(at, t) {
                continue;
            }
            match t {
                Timer::Reconnect(p) => self.reconnect_due(p),
                Timer::Confirm(p) => self.confirm_due(p, now),
                Timer::Collect(c) => {
                    self.conns[c].gc_at = None;
                    self.collect_idle(c, now);
                }
                Timer::Proof(c) => self.proof_due(c, now),
            }
        }
    }

    pub(crate) fn schedule(&mut self, at: Instant, t: Timer) {
        self.ep.timers.push(Reverse((at, t)));
    }

    pub(crate) fn kick(&mut self, p: PathId) {
        let Some(c) = self.conns.get_mut(p.conn) else { return };
        if let Some(info) = c.kick(p.index) {
            self.ep.outputs.push_back(Output::Kick(info));
        }
    }

    /// Queues a Wake if the socket's readiness changed since last reported,
    /// or unconditionally when `force` (a blocked sender should retry).
    pub(crate) fn wake(&mut self, s: SockId, force: bool) {
        let Some(sock) = self.sock_mut(s) else { return };
        let now = (sock.readable(), sock.writable());
        if (force || now != sock.reported) && !sock.wake_queued {
            sock.wake_queued = true;
            sock.reported = now;
            self.ep.outputs.push_back(Output::Wake(s));
        } else if sock.wake_queued {
            sock.reported = now;
        }
    }

    /// Wakes every socket with a blocked sender.
    pub(crate) fn wake_writers(&mut self) {
        let waiters = std::mem::take(&mut self.ep.write_waiters);
        for s in waiters {
            if let Some(sock) = self.sock_mut(s) {
                sock.wants_write = false;
            }
            self.wake(s, true);
        }
    }

    // ----------------------------------------------------------------
    // Lookups
    // ----------------------------------------------------------------

    pub(crate) fn path(&self, p: PathId) -> Option<&Path> {
        self.conns.get(p.conn)?.paths.get(usize::from(p.index))
    }

    pub(crate) fn path_mut(&mut self, p: PathId) -> Option<&mut Path> {
        self.conns.get_mut(p.conn)?.paths.get_mut(usize::from(p.index))
    }

    pub(crate) fn conn(&self, c: ConnId) -> &Connection {
        &self.conns[c]
    }

    pub(crate) fn conn_mut(&mut self, c: ConnId) -> &mut Connection {
        &mut self.conns[c]
    }

    /// Finds or creates the connection (`rds_conn_create`). A peer address
    /// this node serves itself gets the loopback transport.
    pub(crate) fn conn_for(&mut self, laddr: IpAddr, faddr: IpAddr, kind: TransportKind, tos: u8) -> ConnId {
        let kind = if self.is_local(&faddr) { TransportKind::Loop } else { kind };
        if let Some(c) = self.conn_index.get(&(laddr, faddr, kind, tos)) {
            return *c;
        }
        let caps = self.caps_of(kind);
        let n = if caps.mp_capable { usize::from(self.ep.cfg.npaths.clamp(1, 8)) } else { 1 };
        let id = self.conns.next_id();
        let npaths = if caps.mp_capable { 0 } else { 1 };
        self.conns.insert(Connection::new(id, laddr, faddr, kind, tos, n, npaths));
        let key = (laddr, faddr, kind, tos);
        if let Some(m) = self.memos.remove(&key) {
            self.memo_order.retain(|k| *k != key);
            if let Some(v) = m.map_version {
                self.ep.cong.versions.entry(faddr).or_insert(v);
            }
            self.conns[id].restore(&m);
        }
        if kind == TransportKind::Loop {
            // Loopback paths need no connection: they are up from the start.
            let p = &mut self.conns[id].paths[0];
            p.go_up();
            p.inst = 1;
            p.confirmed = true;
        }
        self.conn_index.insert((laddr, faddr, kind, tos), id);
        self.ep.cong.map(faddr);
        id
    }

    /// Connections the node holds (all transports, loopback included).
    pub fn conn_count(&self) -> usize {
        self.conns.len()
    }

    /// The connection for (laddr, faddr, kind), if one exists.
    pub fn find_conn(&self, laddr: IpAddr, faddr: IpAddr, kind: TransportKind) -> Option<ConnId> {
        self.conn_index.get(&(laddr, faddr, kind, 0)).copied()
    }

    /// Path information for a driver.
    pub fn path_info(&self, p: PathId) -> Option<PathInfo> {
        let c = self.conns.get(p.conn)?;
        (usize::from(p.index) < c.paths.len()).then(|| c.info(usize::from(p.index)))
    }

    pub fn path_state(&self, p: PathId) -> Option<PathState> {
        self.path(p).map(|p| p.state)
    }

    /// Whether the node is the active (connecting) side towards `faddr`.
    pub fn is_smaller(laddr: &IpAddr, faddr: &IpAddr) -> bool {
        addr_cmp(laddr, faddr) == std::cmp::Ordering::Less
    }
}

impl Node {
    /// A human-readable dump of connections, paths, sockets and congestion
    /// maps, for debugging and test failure reports.
    pub fn dump(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for c in &self.conns {
            let _ = writeln!(
                s,
                "conn {} {} -> {} {:?} npaths {} ping_triggered {} map_queued {} peer_gen {}",
                c.id.0, c.laddr, c.faddr, c.kind, c.npaths, c.ping_triggered, c.map_queued, c.peer_gen
            );
            for (i, p) in c.paths.iter().enumerate() {
                if p.state == PathState::Down && p.send_queue.is_empty() && p.retrans.is_empty() && p.connects == 0 {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "  path {i} {:?} inst {} tx {} rx {} sendq {} retrans {} kick_queued {} reconnect_at {:?} connects {}",
                    p.state,
                    p.inst,
                    p.next_tx_seq,
                    p.next_rx_seq,
                    p.send_queue.len(),
                    p.retrans.len(),
                    p.kick_queued,
                    p.reconnect_at.is_some(),
                    p.connects
                );
                if !p.lane0_wire.is_empty() || !p.proof_pings.is_empty() {
                    let _ = writeln!(
                        s,
                        "  path {i} lane-0 holds {:?} pings in flight {:?} read through {}",
                        p.lane0_wire, p.proof_pings, p.read_through
                    );
                }
                if p.illegal_transitions > 0 {
                    let _ = writeln!(s, "  path {i} refused {} illegal transitions", p.illegal_transitions);
                }
            }
        }
        for slot in &self.ep.socks {
            if let Some(k) = &slot.sock {
                let _ = writeln!(
                    s,
                    "sock {:?} snd {} rcv {} congested {} wants_write {} recvq {} lane0 {:?}",
                    k.bound,
                    k.snd_bytes,
                    k.rcv_bytes,
                    k.congested,
                    k.wants_write,
                    k.recv_queue.len(),
                    k.lane0_backlog
                );
            }
        }
        for (a, m) in &self.ep.cong.maps {
            let ports: Vec<u16> = m.congested_ports().take(20).collect();
            if !ports.is_empty() {
                let _ = writeln!(s, "map {a}: congested {ports:?}");
            }
        }
        let _ = writeln!(s, "write_waiters {:?} outputs {}", self.ep.write_waiters.len(), self.ep.outputs.len());
        let _ = writeln!(s, "rx_held {} rx_paused {:?}", self.ep.rx_held, self.ep.rx_paused);
        s
    }
}
