//! The node: one RDS stack (the kernel's whole `net/rds` state for the
//! addresses it serves), as a sans-IO state machine.
//!
//! The caller (an engine with sockets and threads, or a simulator) feeds it
//! API calls, transport events and the current time, and drains
//! [`Output`]s: connections to open or close, paths with data to transmit,
//! sockets whose readiness changed. Nothing here reads a clock, touches a
//! socket or spawns a thread.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::cong::CongMap;
use crate::message::Received;
use crate::path::{Conn, ConnMemo, ConnTable, Path, PathInfo, PathState};
use crate::sock::{Readiness, Sock, bufs};
use crate::stats::Counters;
use crate::transport::TransportCaps;
use crate::types::{ConnId, Errno, PathId, RDS_TRANS_NONE, Rng, SockId, TransportKind, addr_cmp};

/// Formerly defined here; it lives beside the transport trait now.
pub use crate::transport::Accept;

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
    /// can still be read from it, then report [`Node::path_down`].
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

/// Socket options handled by the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockOpt {
    SndBuf(u32),
    RcvBuf(u32),
    /// SO_SNDBUFFORCE / SO_RCVBUFFORCE: not capped by wmem_max / rmem_max.
    SndBufForce(u32),
    RcvBufForce(u32),
    Transport(i32),
    CongMonitor(bool),
    RecvErr(bool),
    Timestamp(bool),
    Tos(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    Reconnect(PathId),
    /// Idle collection of a connection (`Conn::gc_at`).
    Collect(ConnId),
}

pub(crate) struct SockSlot {
    pub generation: u32,
    pub sock: Option<Sock>,
}

/// One RDS stack.
pub struct Node {
    pub(crate) cfg: NodeConfig,
    pub(crate) rng: Rng,
    pub(crate) caps: [Option<TransportCaps>; 3],
    /// Addresses this node serves, with the transports serving each.
    pub(crate) locals: HashMap<IpAddr, Vec<TransportKind>>,
    pub(crate) socks: Vec<SockSlot>,
    pub(crate) free_socks: Vec<u32>,
    pub(crate) bound: HashMap<SocketAddr, SockId>,
    pub(crate) conns: ConnTable,
    pub(crate) conn_index: HashMap<(IpAddr, IpAddr, TransportKind, u8), ConnId>,
    /// Congestion maps by address: ours (maintained by our sockets) and
    /// peers' (from their updates).
    pub(crate) maps: HashMap<IpAddr, CongMap>,
    /// `HandshakeExts::Full` map versions: for our addresses (our
    /// generation, last version sent), for peers' (their generation, last
    /// version applied). See `Node::map_header`.
    pub(crate) map_versions: HashMap<IpAddr, (u32, u64)>,
    pub(crate) counters: Counters,
    pub(crate) outputs: VecDeque<Output>,
    pub(crate) timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Sockets with a blocked sender (woken on acks and map updates).
    pub(crate) write_waiters: Vec<SockId>,
    /// Bytes queued on all sockets' receive queues (payloads plus
    /// `RCV_MSG_OVERHEAD` per message), against `NodeConfig::rcv_budget`.
    pub(crate) rx_held: u64,
    /// Paths whose reading is paused, and why (`recv.rs`).
    pub(crate) rx_paused: HashMap<PathId, crate::recv::RxPause>,
    /// Sequence of `Output::RxFlow`.
    pub(crate) rx_flow_seq: u64,
    /// Sequence state of collected connections (`ConnMemo`), with their
    /// order of collection (oldest first) for the bound.
    pub(crate) memos: HashMap<(IpAddr, IpAddr, TransportKind, u8), ConnMemo>,
    pub(crate) memo_order: VecDeque<(IpAddr, IpAddr, TransportKind, u8)>,
}

impl Node {
    pub fn new(cfg: NodeConfig) -> Node {
        let rng = Rng::new(cfg.seed ^ u64::from(cfg.gen_num).rotate_left(32));
        Node {
            cfg,
            rng,
            caps: [None, None, None],
            locals: HashMap::new(),
            socks: Vec::new(),
            free_socks: Vec::new(),
            bound: HashMap::new(),
            conns: ConnTable::default(),
            conn_index: HashMap::new(),
            maps: HashMap::new(),
            map_versions: HashMap::new(),
            counters: Counters::default(),
            outputs: VecDeque::new(),
            timers: BinaryHeap::new(),
            write_waiters: Vec::new(),
            rx_held: 0,
            rx_paused: HashMap::new(),
            rx_flow_seq: 0,
            memos: HashMap::new(),
            memo_order: VecDeque::new(),
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Makes a transport available (`rds_trans_register`).
    pub fn register_transport(&mut self, caps: TransportCaps) {
        self.caps[caps.kind.slot()] = Some(caps);
    }

    pub fn has_transport(&self, kind: TransportKind) -> bool {
        self.caps[kind.slot()].is_some()
    }

    pub(crate) fn caps_of(&self, kind: TransportKind) -> TransportCaps {
        self.caps[kind.slot()].unwrap_or_else(TransportCaps::loopback)
    }

    /// The node now serves `addr` with transport `kind` (the driver has set
    /// up whatever listening that needs).
    pub fn add_local(&mut self, addr: IpAddr, kind: TransportKind) {
        let kinds = self.locals.entry(addr).or_default();
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
        self.maps.entry(addr).or_default();
    }

    pub fn is_local(&self, addr: &IpAddr) -> bool {
        self.locals.contains_key(addr)
    }

    /// Addresses served, with their transports.
    pub fn locals(&self) -> impl Iterator<Item = (&IpAddr, &Vec<TransportKind>)> {
        self.locals.iter()
    }

    // ----------------------------------------------------------------
    // Outputs and timers
    // ----------------------------------------------------------------

    /// Next thing for the driver to do.
    pub fn poll_output(&mut self) -> Option<Output> {
        let o = self.outputs.pop_front()?;
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
        while let Some(Reverse((at, t))) = self.timers.peek().copied() {
            if self.timer_live(at, t) {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    fn timer_live(&self, at: Instant, t: Timer) -> bool {
        match t {
            Timer::Reconnect(p) => self.path(p).is_some_and(|path| path.reconnect_at == Some(at)),
            Timer::Collect(c) => self.conns.get(c).is_some_and(|c| c.gc_at == Some(at)),
        }
    }

    /// Runs every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(Reverse((at, t))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            if !self.timer_live(at, t) {
                continue;
            }
            match t {
                Timer::Reconnect(p) => self.reconnect_due(p),
                Timer::Collect(c) => {
                    self.conns[c].gc_at = None;
                    self.collect_idle(c, now);
                }
            }
        }
    }

    pub(crate) fn schedule(&mut self, at: Instant, t: Timer) {
        self.timers.push(Reverse((at, t)));
    }

    pub(crate) fn kick(&mut self, p: PathId) {
        let Some(c) = self.conns.get(p.conn) else { return };
        let Some(path) = c.paths.get(usize::from(p.index)) else { return };
        let map_due =
            (c.map_queued && c.map_lane() == Some(usize::from(p.index))) || (path.hello_owed && c.peer_gen_maps);
        if path.kick_queued || path.state != PathState::Up || (path.send_queue.is_empty() && !map_due) {
            return;
        }
        let info = c.info(usize::from(p.index));
        self.path_mut(p).unwrap().kick_queued = true;
        self.outputs.push_back(Output::Kick(info));
    }

    /// Owes the peer our congestion map on this connection and kicks the
    /// path that carries maps.
    pub(crate) fn queue_map(&mut self, conn: ConnId) {
        let c = self.conn_mut(conn);
        if !c.map_queued {
            c.map_queued = true;
            self.counters.cong_update_queued += 1;
        }
        match self.conn(conn).map_lane() {
            Some(lane) => self.kick(PathId { conn, index: lane as u8 }),
            // No path up: connect (reconnects are only for something to
            // send, and the map is).
            None if self.conn(conn).kind != TransportKind::Loop => self.connect_if_down(PathId { conn, index: 0 }),
            None => {}
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
            self.outputs.push_back(Output::Wake(s));
        } else if sock.wake_queued {
            sock.reported = now;
        }
    }

    /// Wakes every socket with a blocked sender.
    pub(crate) fn wake_writers(&mut self) {
        let waiters = std::mem::take(&mut self.write_waiters);
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

    pub(crate) fn sock(&self, s: SockId) -> Option<&Sock> {
        let slot = self.socks.get(s.idx as usize)?;
        if slot.generation != s.generation {
            return None;
        }
        slot.sock.as_ref()
    }

    pub(crate) fn sock_mut(&mut self, s: SockId) -> Option<&mut Sock> {
        let slot = self.socks.get_mut(s.idx as usize)?;
        if slot.generation != s.generation {
            return None;
        }
        slot.sock.as_mut()
    }

    pub(crate) fn path(&self, p: PathId) -> Option<&Path> {
        self.conns.get(p.conn)?.paths.get(usize::from(p.index))
    }

    pub(crate) fn path_mut(&mut self, p: PathId) -> Option<&mut Path> {
        self.conns.get_mut(p.conn)?.paths.get_mut(usize::from(p.index))
    }

    pub(crate) fn conn(&self, c: ConnId) -> &Conn {
        &self.conns[c]
    }

    pub(crate) fn conn_mut(&mut self, c: ConnId) -> &mut Conn {
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
        let n = if caps.mp_capable { usize::from(self.cfg.npaths.clamp(1, 8)) } else { 1 };
        let id = self.conns.next_id();
        let paths = (0..n).map(|_| Path::new()).collect();
        self.conns.insert(Conn {
            id,
            laddr,
            faddr,
            kind,
            tos,
            paths,
            npaths: if caps.mp_capable { 0 } else { 1 },
            ping_triggered: false,
            peer_gen: 0,
            with_sport_idx: false,
            map_queued: false,
            peer_gen_maps: false,
            heard: false,
            ups: 0,
            gen_up_seq: 0,
            maps_rx: 0,
            gc_at: None,
            evicted: false,
        });
        let key = (laddr, faddr, kind, tos);
        if let Some(m) = self.memos.remove(&key) {
            self.memo_order.retain(|k| *k != key);
            if let Some(v) = m.map_version {
                self.map_versions.entry(faddr).or_insert(v);
            }
            self.conns[id].restore(&m);
        }
        if kind == TransportKind::Loop {
            // Loopback paths need no connection: they are up from the start.
            let p = &mut self.conns[id].paths[0];
            p.state = PathState::Up;
            p.inst = 1;
            p.confirmed = true;
        }
        self.conn_index.insert((laddr, faddr, kind, tos), id);
        self.maps.entry(faddr).or_default();
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

    // ----------------------------------------------------------------
    // Sockets
    // ----------------------------------------------------------------

    /// `socket(AF_RDS, SOCK_SEQPACKET, 0)`.
    pub fn socket(&mut self) -> SockId {
        let sock = Sock::new(self.cfg.wmem_default, self.cfg.rmem_default);
        if let Some(idx) = self.free_socks.pop() {
            let slot = &mut self.socks[idx as usize];
            slot.generation = slot.generation.wrapping_add(1);
            slot.sock = Some(sock);
            SockId { idx, generation: slot.generation }
        } else {
            self.socks.push(SockSlot { generation: 0, sock: Some(sock) });
            SockId { idx: self.socks.len() as u32 - 1, generation: 0 }
        }
    }

    /// `bind`. Rules and errno as `rds_bind`: a specific unicast address
    /// (EINVAL for any/broadcast/multicast), once (EINVAL), not port 1
    /// (EINVAL), on an address this node serves (EADDRNOTAVAIL; ENOPROTOOPT
    /// when SO_RDS_TRANSPORT chose a transport that does not serve it), on a
    /// free port (EADDRINUSE); port 0 picks a free port.
    pub fn bind(&mut self, s: SockId, addr: SocketAddr) -> Result<SocketAddr, Errno> {
        let ip = addr.ip();
        let bad = match ip {
            IpAddr::V4(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
                None => v6.is_unspecified() || v6.is_multicast(),
            },
        };
        if bad {
            return Err(Errno::EINVAL);
        }
        let sock = self.sock(s).ok_or(Errno::EINVAL)?;
        if sock.bound.is_some() {
            return Err(Errno::EINVAL);
        }
        // rds_add_bound: port 1 is the handshake probe's source port.
        if addr.port() == crate::wire::PROBE_PORT {
            return Err(Errno::EINVAL);
        }
        let forced = sock.transport;
        let kinds = self.locals.get(&ip).map(Vec::as_slice).unwrap_or_default();
        let kind = match forced {
            Some(k) if kinds.contains(&k) => k,
            // The transport set with SO_RDS_TRANSPORT fails its laddr_check.
            Some(_) => return Err(Errno::ENOPROTOOPT),
            // The preferred transport: IB where the address has an RDMA device.
            None if kinds.contains(&TransportKind::Ib) => TransportKind::Ib,
            None => *kinds.first().ok_or(Errno::EADDRNOTAVAIL)?,
        };
        let port = if addr.port() == 0 {
            let start = 1024 + self.rng.below(65536 - 1024) as u32;
            (0..65535u32)
                .map(|i| ((start + i) % 65535 + 1) as u16)
                .find(|p| *p > 1 && !self.bound.contains_key(&SocketAddr::new(ip, *p)))
        } else {
            (!self.bound.contains_key(&addr)).then_some(addr.port())
        };
        let Some(port) = port else {
            // rds_bind forgets the transport when rds_add_bound fails, even
            // one set with SO_RDS_TRANSPORT.
            self.sock_mut(s).unwrap().transport = None;
            return Err(Errno::EADDRINUSE);
        };
        let local = SocketAddr::new(ip, port);
        self.bound.insert(local, s);
        let sock = self.sock_mut(s).unwrap();
        sock.bound = Some(local);
        sock.transport = Some(kind);
        Ok(local)
    }

    /// `connect`: sets the default destination of `send` without an address.
    /// Errno as `rds_connect`: IPv4 any is EDESTADDRREQ, IPv4 broadcast or
    /// multicast EINVAL; an IPv6 address that is not unicast (any,
    /// multicast, or a v4-mapped any/broadcast/multicast) is EPROTOTYPE.
    pub fn connect(&mut self, s: SockId, dst: SocketAddr) -> Result<(), Errno> {
        match dst.ip() {
            IpAddr::V4(v4) if v4.is_unspecified() => return Err(Errno::EDESTADDRREQ),
            IpAddr::V4(v4) if v4.is_multicast() || v4.is_broadcast() => return Err(Errno::EINVAL),
            IpAddr::V6(v6) => {
                let bad = match v6.to_ipv4_mapped() {
                    Some(v4) => v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast(),
                    None => v6.is_unspecified() || v6.is_multicast(),
                };
                if bad {
                    return Err(Errno::EPROTOTYPE);
                }
            }
            IpAddr::V4(_) => {}
        }
        self.sock_mut(s).ok_or(Errno::EINVAL)?.conn_addr = Some(dst);
        Ok(())
    }

    pub fn local_addr(&self, s: SockId) -> Option<SocketAddr> {
        self.sock(s)?.bound
    }

    pub fn peer_addr(&self, s: SockId) -> Option<SocketAddr> {
        self.sock(s)?.conn_addr
    }

    /// `setsockopt` for the options the core owns.
    pub fn setsockopt(&mut self, s: SockId, opt: SockOpt) -> Result<(), Errno> {
        let (wmax, rmax) = (self.cfg.wmem_max, self.cfg.rmem_max);
        let transport_ok = |k: TransportKind, node: &Node| node.has_transport(k);
        if let SockOpt::Transport(v) = opt {
            let sock = self.sock(s).ok_or(Errno::EINVAL)?;
            if sock.transport.is_some() {
                return Err(Errno::EOPNOTSUPP);
            }
            if !(0..crate::types::RDS_TRANS_COUNT).contains(&v) {
                return Err(Errno::EINVAL);
            }
            let kind = TransportKind::from_uapi(v).filter(|k| transport_ok(*k, self)).ok_or(Errno::ENOPROTOOPT)?;
            self.sock_mut(s).unwrap().transport = Some(kind);
            return Ok(());
        }
        let sock = self.sock_mut(s).ok_or(Errno::EINVAL)?;
        match opt {
            // sock_setsockopt: min(val, max) * 2, at least the minimum.
            SockOpt::SndBuf(v) => sock.sndbuf = v.min(wmax).saturating_mul(2).max(bufs::SOCK_MIN_SNDBUF),
            SockOpt::RcvBuf(v) => sock.rcvbuf = v.min(rmax).saturating_mul(2).max(bufs::SOCK_MIN_RCVBUF),
            // The *FORCE variants take a negative int as 0.
            SockOpt::SndBufForce(v) => {
                let v = if v > i32::MAX as u32 { 0 } else { v };
                sock.sndbuf = v.min(i32::MAX as u32 / 2).saturating_mul(2).max(bufs::SOCK_MIN_SNDBUF)
            }
            SockOpt::RcvBufForce(v) => {
                let v = if v > i32::MAX as u32 { 0 } else { v };
                sock.rcvbuf = v.min(i32::MAX as u32 / 2).saturating_mul(2).max(bufs::SOCK_MIN_RCVBUF)
            }
            // rds_cong_monitor: switching it off forgets the recorded port
            // groups and any pending notification.
            SockOpt::CongMonitor(on) => {
                sock.cong_monitor = on;
                if !on {
                    sock.cong_mask = 0;
                    sock.cong_notify = 0;
                }
            }
            SockOpt::RecvErr(on) => sock.recverr = on,
            SockOpt::Timestamp(on) => sock.timestamp = on,
            // SIOCRDSSETTOS: the transport maps the value (TCP: everything
            // to 0, IB: as is; loopback and an unbound socket without
            // SO_RDS_TRANSPORT have no map: ENOTTY); once a non-zero TOS is
            // set or the socket has a connection, EINVAL.
            SockOpt::Tos(t) => {
                let tos = match sock.transport {
                    Some(TransportKind::Tcp) => 0,
                    Some(TransportKind::Ib) => t,
                    Some(TransportKind::Loop) | None => return Err(Errno::ENOTTY),
                };
                if sock.tos != 0 || sock.last_conn.is_some() {
                    return Err(Errno::EINVAL);
                }
                sock.tos = tos
            }
            SockOpt::Transport(_) => unreachable!(),
        }
        // A larger send buffer may make a blocked sender writable, a larger
        // receive buffer may uncongest the socket (and raise its hard cap).
        self.recheck_congestion(s);
        self.rx_recheck();
        self.wake(s, false);
        Ok(())
    }

    /// `getsockopt` for the options the core owns; returns the value as the
    /// kernel reports it (buffers doubled, transport as its uapi number).
    pub fn getsockopt(&self, s: SockId, opt: SockOpt) -> Result<u64, Errno> {
        let sock = self.sock(s).ok_or(Errno::EINVAL)?;
        Ok(match opt {
            SockOpt::SndBuf(_) | SockOpt::SndBufForce(_) => u64::from(sock.sndbuf),
            SockOpt::RcvBuf(_) | SockOpt::RcvBufForce(_) => u64::from(sock.rcvbuf),
            SockOpt::Transport(_) => u64::from(sock.transport.map_or(RDS_TRANS_NONE, |k| k.uapi())),
            SockOpt::CongMonitor(_) => sock.cong_monitor as u64,
            SockOpt::RecvErr(_) => sock.recverr as u64,
            SockOpt::Timestamp(_) => sock.timestamp as u64,
            SockOpt::Tos(_) => u64::from(sock.tos),
        })
    }

    /// `rds_poll`.
    pub fn readiness(&self, s: SockId) -> Readiness {
        self.sock(s)
            .map_or(Readiness::default(), |sock| Readiness { readable: sock.readable(), writable: sock.writable() })
    }

    /// Messages of this socket that were dropped because the peer restarted
    /// (the kernel drops them silently; we count them per socket).
    pub fn flushed(&self, s: SockId) -> u64 {
        self.sock(s).map_or(0, |k| k.flushed)
    }

    /// Send bytes queued and not yet acked.
    pub fn snd_bytes(&self, s: SockId) -> u64 {
        self.sock(s).map_or(0, |k| k.snd_bytes)
    }

    /// `recvmsg` (non-blocking; the driver waits). Notifications come first,
    /// then a congestion update, then data, as in `rds_recvmsg`. With `peek`
    /// the datagram stays queued; notifications and congestion updates are
    /// consumed even then (the kernel hands them out without looking at
    /// MSG_PEEK).
    pub fn recv(&mut self, s: SockId, peek: bool) -> Result<Received, Errno> {
        let sock = self.sock_mut(s).ok_or(Errno::EINVAL)?;
        sock.cong_poll_pending = false;
        if let Some(n) = sock.notify_queue.pop_front() {
            self.wake(s, false);
            return Ok(Received::RdmaStatus { user_token: n.user_token, status: n.status });
        }
        if sock.cong_notify != 0 {
            let mask = std::mem::take(&mut sock.cong_notify);
            self.wake(s, false);
            return Ok(Received::CongUpdate { mask });
        }
        let inc = if peek { sock.recv_queue.front().cloned() } else { sock.recv_queue.pop_front() };
        let Some(inc) = inc else {
            // Clearing the congestion-update flag may have changed readiness:
            // report it, or a later delivery would look like no change.
            self.wake(s, false);
            return Err(Errno::EAGAIN);
        };
        // s_recv_delivered counts every copy to the user, peeks included.
        self.counters.recv_delivered += 1;
        if !peek {
            self.rcvbuf_delta(s, -(inc.payload.len() as i64));
            self.rx_held = self.rx_held.saturating_sub(inc.payload.len() as u64 + crate::recv::RCV_MSG_OVERHEAD);
            self.rx_recheck();
        }
        self.wake(s, false);
        Ok(Received::Data(inc))
    }

    /// Closes a socket (`rds_release`): its receive queue is freed, it is
    /// unbound, and every message it still has queued or unacked is dropped.
    /// Returns the number of messages dropped.
    pub fn close(&mut self, s: SockId) -> usize {
        let Some(sock) = self.sock(s) else { return 0 };
        let bound = sock.bound;
        let dropped = self.drop_messages(s, None);
        let held = crate::recv::sock_held(self.sock(s).unwrap());
        if let Some(b) = bound {
            // Free the receive queue through the accounting so congestion clears.
            let queued: i64 = self.sock(s).unwrap().rcv_bytes as i64;
            self.rcvbuf_delta(s, -queued);
            self.bound.remove(&b);
        }
        self.write_waiters.retain(|w| *w != s);
        let slot = &mut self.socks[s.idx as usize];
        slot.sock = None;
        self.free_socks.push(s.idx);
        self.rx_held = self.rx_held.saturating_sub(held);
        self.rx_recheck();
        dropped
    }

    /// `rds_recv_rcvbuf_delta`: account queued receive bytes and flip the
    /// socket's congestion bit with the kernel's hysteresis.
    pub(crate) fn rcvbuf_delta(&mut self, s: SockId, delta: i64) {
        let Some(sock) = self.sock_mut(s) else { return };
        sock.rcv_bytes = (sock.rcv_bytes as i64 + delta).max(0) as u64;
        if delta > 0 {
            self.counters.recv_bytes_added_to_sock += delta as u64;
        } else {
            self.counters.recv_bytes_freed_fromsock += (-delta) as u64;
        }
        self.recheck_congestion(s);
    }

    pub(crate) fn recheck_congestion(&mut self, s: SockId) {
        let Some(sock) = self.sock_mut(s) else { return };
        let Some(bound) = sock.bound else { return };
        // Sockets of the loop transport (bound to 127/8 or ::1) are never
        // congested (rds_recv_rcvbuf_delta).
        if sock.transport == Some(TransportKind::Loop) {
            return;
        }
        let limit = sock.rcvbuf_limit();
        let change = if !sock.congested && sock.rcv_bytes > limit {
            sock.congested = true;
            Some(true)
        } else if sock.congested && sock.rcv_bytes < limit / 2 {
            sock.congested = false;
            Some(false)
        } else {
            None
        };
        if let Some(congested) = change {
            let map = self.maps.entry(bound.ip()).or_default();
            if congested {
                map.set(bound.port());
            } else {
                map.clear(bound.port());
            }
            self.cong_queue_updates(bound.ip(), !congested, bound.port());
        }
    }

    /// `rds_cong_queue_updates`: every connection from this address sends
    /// the map; local senders (loopback) see the change at once.
    pub(crate) fn cong_queue_updates(&mut self, addr: IpAddr, cleared: bool, port: u16) {
        let conns: Vec<ConnId> =
            self.conns.iter().filter(|c| c.laddr == addr && c.kind != TransportKind::Loop).map(|c| c.id).collect();
        for c in conns {
            self.queue_map(c);
        }
        let mask = if cleared { crate::cong::monitor_mask(port) } else { 0 };
        self.cong_map_updated(mask);
    }

    /// `rds_cong_map_updated`: wake blocked senders and notify monitoring
    /// sockets of the port groups that were uncongested.
    pub(crate) fn cong_map_updated(&mut self, uncongested: u64) {
        self.counters.cong_update_received += 1;
        self.wake_writers();
        let mut woken = Vec::new();
        for (idx, slot) in self.socks.iter_mut().enumerate() {
            let Some(sock) = slot.sock.as_mut() else { continue };
            if sock.cong_monitor {
                let n = sock.cong_mask & uncongested;
                if n != 0 {
                    sock.cong_notify |= n;
                    sock.cong_mask &= !n;
                    woken.push(SockId { idx: idx as u32, generation: slot.generation });
                }
            } else if sock.seen_congestion {
                sock.cong_poll_pending = true;
                woken.push(SockId { idx: idx as u32, generation: slot.generation });
            }
        }
        for s in woken {
            self.wake(s, false);
        }
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
            }
        }
        for slot in &self.socks {
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
        for (a, m) in &self.maps {
            let ports: Vec<u16> = m.congested_ports().take(20).collect();
            if !ports.is_empty() {
                let _ = writeln!(s, "map {a}: congested {ports:?}");
            }
        }
        let _ = writeln!(s, "write_waiters {:?} outputs {}", self.write_waiters.len(), self.outputs.len());
        let _ = writeln!(s, "rx_held {} rx_paused {:?}", self.rx_held, self.rx_paused);
        s
    }
}
