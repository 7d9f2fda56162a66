//! The simulated world: nodes, their applications, and a TCP-like network
//! between them, driven by one event queue in simulated time. See the docs
//! of [`crate::sim`] for the model and the invariants.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rds_core::types::Rng;
use rds_core::wire::{FrameDecoder, HEADER_LEN, Kind};
use rds_core::{
    Accept, DownReason, Errno, HandshakeExts, Node, NodeConfig, Output, PathId, PathInfo, Payload, Received,
    RecvOutcome, RxMessage, SendOptions, SockId, SockOpt, TransportCaps, TransportKind, TxMessage, addr_cmp,
};

use super::oracle::{self, Excuse, Msg, Oracle, Summary};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// Largest payload the workload sends.
pub const MAX_LEN: usize = 16 << 10;
/// How long a shutdown waits for the peer's FIN (rds-tcp's default).
const SHUTDOWN_DRAIN: u64 = 2_000 * MS;
/// Simulated time allowed for the run to quiesce once faults stop.
const QUIESCE_LIMIT: u64 = 120_000 * MS;
/// Events allowed per run (a livelock guard).
const EVENT_LIMIT: u64 = 3_000_000;

/// Everything a seed decides about a run.
#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub nodes: usize,
    pub addrs: Vec<usize>,
    pub socks: Vec<usize>,
    pub handshake: HandshakeExts,
    /// Workload and fault phase length.
    pub work: u64,
    /// Mean time between sends of one socket.
    pub send_gap: u64,
    /// Mean time between faults.
    pub fault_gap: u64,
    /// Peer restarts allowed in the run.
    pub restarts: u32,
}

impl Params {
    /// The parameters seed `seed` uses (what `--seeds` runs).
    pub fn from_seed(seed: u64) -> Params {
        let mut r = Rng::new(seed ^ 0x5eed_5eed_0000_0000);
        let nodes = 3 + r.below(3) as usize;
        let addrs = (0..nodes).map(|_| 1 + r.below(3) as usize).collect();
        let socks = (0..nodes).map(|_| 2 + r.below(3) as usize).collect();
        let handshake = if r.below(5) == 0 { HandshakeExts::Mainline } else { HandshakeExts::Full };
        let work = (20 + r.below(60)) * MS;
        let send_gap = (100 + r.below(1500)) * US;
        let fault_gap = (1 + r.below(10)) * MS;
        let restarts = [0, 1, 1, 2, 3][r.below(5) as usize];
        Params { seed, nodes, addrs, socks, handshake, work, send_gap, fault_gap, restarts }
    }
}

/// Result of a run that held every invariant.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub summary: Summary,
    pub accepted: u64,
    pub events: u64,
    pub sim_time: u64,
    pub resets: u64,
    pub restarts: u64,
    pub cancels: u64,
    pub stalls: u64,
    pub peer_restarts_detected: u64,
    pub send_eagain: u64,
    pub send_enobufs: u64,
    pub connects: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Connecting,
    Open,
    /// We asked for the shutdown: FIN sent, reading until the peer's FIN.
    Draining,
    Gone,
}

struct End {
    node: usize,
    inc: u32,
    /// The node's path and instance this end serves (the acceptor gets it
    /// from `accept`).
    path: Option<(PathId, u64)>,
    laddr: IpAddr,
    state: St,
    xmit_sched: bool,
    want_room: bool,
    /// The connection was reset: the reactor's next pass drains what
    /// arrived and reports it down (in path order, like any event).
    closing: bool,
}

/// One direction of a connection: bytes written by one end, read by the other.
struct Stream {
    /// Bytes from `buf[off]` (stream offset `base`, consumed by the reader's
    /// transport) to `written`.
    buf: Vec<u8>,
    off: usize,
    base: u64,
    written: u64,
    /// Bytes that reached the reader's kernel (and were acked by it).
    arrived: u64,
    /// The connection broke: bytes beyond this never arrive.
    cut: Option<u64>,
    /// FIN after this many bytes.
    fin: Option<u64>,
    /// (end offset, sequence) of sequenced messages, for acks.
    seqs: VecDeque<(u64, u64)>,
    /// (end offset, message id) of our data messages, for the oracle.
    recs: VecDeque<(u64, u64)>,
    last_arrival: u64,
    last_ack: u64,
    decoder: FrameDecoder,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            buf: Vec::new(),
            off: 0,
            base: 0,
            written: 0,
            arrived: 0,
            cut: None,
            fin: None,
            seqs: VecDeque::new(),
            recs: VecDeque::new(),
            last_arrival: 0,
            last_ack: 0,
            decoder: FrameDecoder::default(),
        }
    }
}

struct Conn {
    ends: [End; 2],
    /// `s[d]` is written by end `d`.
    s: [Stream; 2],
    /// Bytes a writer may have unread by the peer (TCP window + buffers).
    window: u64,
    lat: u64,
    reset: bool,
    /// The connector's ephemeral source port.
    port: u16,
    /// A deferred accept is offered again by a timer.
    retry_sched: bool,
}

#[derive(Clone, Debug)]
struct SockSpec {
    addr: SocketAddr,
    sndbuf: u32,
    rcvbuf: u32,
    blocking: bool,
}

struct AppSock {
    id: SockId,
    uid: u32,
    spec: SockSpec,
    snd_limit: u64,
    rcv_limit: u64,
    stall_until: u64,
    /// A blocking send is waiting for a Wake.
    waiting: bool,
    send_sched: bool,
    recv_sched: bool,
    /// Payload bytes on the socket's receive queue (tracked from outcomes).
    queued: u64,
    /// Final round: destinations still to send one message to.
    finals: Vec<SocketAddr>,
}

struct SimNode {
    node: Option<Node>,
    inc: u32,
    gen_num: u32,
    addrs: Vec<IpAddr>,
    specs: Vec<SockSpec>,
    socks: Vec<AppSock>,
    timer_at: Option<u64>,
    reactor_stall: u64,
    /// Connection ends with something to read, by path index.
    ready: std::collections::BTreeSet<(u8, u64, usize)>,
    pass_sched: bool,
    ends: BTreeMap<(PathId, u64), (u64, usize)>,
    /// Accepted connections the node deferred (`Accept::Defer`).
    deferred: Vec<u64>,
    deaths: u32,
    peer_restart_seen: u64,
    /// Times this node detected a peer restart.
    detections: Vec<u64>,
    npaths: u8,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Timer { n: usize, inc: u32, at: u64 },
    Xmit { c: u64, e: usize },
    Arrive { c: u64, d: usize, upto: u64 },
    ReactorPass { n: usize, inc: u32 },
    Ack { c: u64, d: usize, upto: u64 },
    Established { c: u64 },
    AcceptArrive { c: u64 },
    Reoffer { c: u64 },
    SeeClose { c: u64, e: usize },
    DrainTimeout { c: u64, e: usize },
    Down { n: usize, inc: u32, path: PathId, inst: u64, why: DownReason },
    Up { n: usize, inc: u32, path: PathId, inst: u64 },
    LoopServe { n: usize, inc: u32, path: PathId, inst: u64 },
    AppSend { n: usize, inc: u32, s: usize },
    AppRecv { n: usize, inc: u32, s: usize },
    Fault,
    Restart { n: usize },
    EndWork,
    Check,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Work,
    Drain,
    Done,
}

pub struct Sim {
    p: Params,
    rng: Rng,
    base: Instant,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    evs: Vec<Option<Ev>>,
    free_evs: Vec<usize>,
    nodes: Vec<SimNode>,
    owner: BTreeMap<IpAddr, usize>,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    next_uid: u32,
    dead_uids: Vec<u32>,
    dsts: Vec<SocketAddr>,
    oracle: Oracle,
    phase: Phase,
    verbose: bool,
    report: Report,
    rcv_bound_extra: u64,
    max_window: u64,
    quiet_checks: u32,
}

type Res<T = ()> = Result<T, String>;

macro_rules! tr {
    ($sim:expr, $($a:tt)*) => {
        if $sim.verbose {
            let line = format!($($a)*);
            $sim.trace_line(line);
        }
    };
}

fn ip_of(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1))
}

impl Sim {
    pub fn new(p: Params, verbose: bool) -> Sim {
        let mut rng = Rng::new(p.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xabcd);
        // Addresses interleave between nodes so that every node is the
        // smaller side towards some peers and the larger towards others.
        let total: usize = p.addrs.iter().sum();
        let mut pool: Vec<usize> = (0..total).collect();
        for i in (1..pool.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            pool.swap(i, j);
        }
        let mut nodes = Vec::new();
        let mut owner = BTreeMap::new();
        let mut dsts = Vec::new();
        let mut k = 0;
        for n in 0..p.nodes {
            let addrs: Vec<IpAddr> = (0..p.addrs[n])
                .map(|_| {
                    k += 1;
                    ip_of(pool[k - 1])
                })
                .collect();
            for a in &addrs {
                owner.insert(*a, n);
            }
            let mut specs = Vec::new();
            for i in 0..p.socks[n] {
                let addr = SocketAddr::new(
                    addrs[rng.below(addrs.len() as u64) as usize],
                    4000 + i as u16 * 3 + rng.below(3) as u16,
                );
                let bufs = [2304u32, 4096, 8192, 32768, 106_496];
                specs.push(SockSpec {
                    addr,
                    sndbuf: bufs[rng.below(5) as usize],
                    rcvbuf: bufs[rng.below(5) as usize],
                    blocking: rng.below(2) == 0,
                });
                dsts.push(addr);
            }
            // Mainline (the 6.1 wire) cannot tell which path an accepted
            // connection belongs to: one path (see the module docs).
            let npaths = [1u8, 2, 3, 4, 8, 8, 8][rng.below(7) as usize];
            let npaths = if p.handshake == HandshakeExts::Mainline { 1 } else { npaths };
            nodes.push(SimNode {
                node: None,
                inc: 0,
                gen_num: 0,
                addrs,
                specs,
                socks: Vec::new(),
                timer_at: None,
                reactor_stall: 0,
                ready: Default::default(),
                pass_sched: false,
                ends: BTreeMap::new(),
                deferred: Vec::new(),
                deaths: 0,
                peer_restart_seen: 0,
                detections: Vec::new(),
                npaths,
            });
        }
        let mainline = p.handshake == HandshakeExts::Mainline;
        let mut sim = Sim {
            p,
            rng,
            base: Instant::now(),
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            evs: Vec::new(),
            free_evs: Vec::new(),
            nodes,
            owner,
            conns: BTreeMap::new(),
            next_conn: 1,
            next_uid: 0,
            dead_uids: Vec::new(),
            dsts,
            oracle: Oracle::new(mainline),
            phase: Phase::Work,
            verbose,
            report: Report::default(),
            rcv_bound_extra: 0,
            max_window: 256 << 10,
            quiet_checks: 0,
        };
        // Receive-queue bound: a socket's own limit, plus what every sender
        // can have queued or in flight before it learns of the congestion.
        let snd_total: u64 = sim
            .nodes
            .iter()
            .flat_map(|n| n.specs.iter())
            .map(|s| u64::from(s.sndbuf.min(NodeConfig::default().wmem_max)) + MAX_LEN as u64)
            .sum();
        let paths: u64 = sim.nodes.iter().map(|n| n.addrs.len() as u64).sum::<u64>().pow(2) * 8;
        sim.rcv_bound_extra = 2 * snd_total + paths * sim.max_window;
        for n in 0..sim.nodes.len() {
            sim.start_node(n);
        }
        sim
    }

    fn trace_line(&mut self, line: String) {
        let t = self.now;
        let s = format!("[{:>4}.{:06}ms] {line}", t / MS, t % MS);
        eprintln!("{s}");
    }

    fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    fn sched(&mut self, t: u64, ev: Ev) {
        let t = t.max(self.now);
        let slot = match self.free_evs.pop() {
            Some(i) => {
                self.evs[i] = Some(ev);
                i
            }
            None => {
                self.evs.push(Some(ev));
                self.evs.len() - 1
            }
        };
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, slot)));
    }

    fn rand(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.rng.below(hi - lo + 1)
    }

    fn chance(&mut self, pct: u64) -> bool {
        self.rng.below(100) < pct
    }

    /// An exponential-ish delay with the given mean.
    fn gap(&mut self, mean: u64) -> u64 {
        // -ln(u) approximated by a few uniform draws: good enough spread.
        let u = (self.rng.below(1 << 20) + 1) as f64 / (1u64 << 20) as f64;
        ((-u.ln()) * mean as f64) as u64 + 1
    }

    // ------------------------------------------------------------------
    // Nodes
    // ------------------------------------------------------------------

    fn start_node(&mut self, n: usize) {
        let mut gen_num = (self.rng.next_u64() as u32).max(1);
        while gen_num == self.nodes[n].gen_num {
            gen_num = (self.rng.next_u64() as u32).max(1);
        }
        let cfg = NodeConfig {
            npaths: self.nodes[n].npaths,
            handshake_exts: self.p.handshake,
            gen_num,
            seed: self.rng.next_u64(),
            reconnect_min: Duration::from_millis(1),
            reconnect_max: Duration::from_millis(1000),
            ..NodeConfig::default()
        };
        let mut node = Node::new(cfg);
        node.register_transport(TransportCaps::tcp());
        node.register_transport(TransportCaps::loopback());
        for a in &self.nodes[n].addrs {
            node.add_local(*a, TransportKind::Tcp);
        }
        let specs = self.nodes[n].specs.clone();
        let mut socks = Vec::new();
        for spec in specs {
            let id = node.socket();
            node.setsockopt(id, SockOpt::SndBuf(spec.sndbuf)).unwrap();
            node.setsockopt(id, SockOpt::RcvBuf(spec.rcvbuf)).unwrap();
            node.bind(id, spec.addr).expect("bind");
            let snd_limit = node.getsockopt(id, SockOpt::SndBuf(0)).unwrap() / 2;
            let rcv_limit = node.getsockopt(id, SockOpt::RcvBuf(0)).unwrap() / 2;
            self.next_uid += 1;
            socks.push(AppSock {
                id,
                uid: self.next_uid,
                spec,
                snd_limit,
                rcv_limit,
                stall_until: 0,
                waiting: false,
                send_sched: false,
                recv_sched: false,
                queued: 0,
                finals: Vec::new(),
            });
        }
        let sn = &mut self.nodes[n];
        sn.node = Some(node);
        sn.inc += 1;
        sn.gen_num = gen_num;
        sn.socks = socks;
        sn.timer_at = None;
        sn.peer_restart_seen = 0;
        sn.ends.clear();
        sn.deferred.clear();
        sn.ready.clear();
        sn.pass_sched = false;
        let inc = sn.inc;
        tr!(self, "n{n} starts: instance {inc} gen_num {gen_num:#x} addrs {:?}", self.nodes[n].addrs);
        for s in 0..self.nodes[n].socks.len() {
            if self.phase == Phase::Work {
                let d = self.gap(self.p.send_gap);
                self.nodes[n].socks[s].send_sched = true;
                self.sched(self.now + d, Ev::AppSend { n, inc, s });
            } else if self.phase == Phase::Drain {
                self.nodes[n].socks[s].finals = self.dsts.clone();
                self.nodes[n].socks[s].send_sched = true;
                self.sched(self.now, Ev::AppSend { n, inc, s });
            }
        }
    }

    fn node(&mut self, n: usize) -> &mut Node {
        self.nodes[n].node.as_mut().expect("live node")
    }

    fn alive(&self, n: usize, inc: u32) -> bool {
        self.nodes[n].node.is_some() && self.nodes[n].inc == inc
    }

    /// Drains the outputs of every node and re-arms their timers.
    fn pump(&mut self) -> Res {
        loop {
            let mut any = false;
            for n in 0..self.nodes.len() {
                while let Some(o) = self.nodes[n].node.as_mut().and_then(|x| x.poll_output()) {
                    any = true;
                    self.output(n, o)?;
                }
            }
            if !any {
                break;
            }
        }
        for n in 0..self.nodes.len() {
            let Some(node) = self.nodes[n].node.as_mut() else { continue };
            let next = node.poll_timeout().map(|at| at.saturating_duration_since(self.base).as_nanos() as u64);
            let c = node.counters().peer_restart;
            if c != self.nodes[n].peer_restart_seen {
                self.nodes[n].peer_restart_seen = c;
                self.nodes[n].detections.push(self.now);
                self.report.peer_restarts_detected += 1;
                tr!(self, "n{n} detected a peer restart");
            }
            if let Some(at) = next {
                if self.nodes[n].timer_at != Some(at) {
                    self.nodes[n].timer_at = Some(at);
                    let inc = self.nodes[n].inc;
                    self.sched(at, Ev::Timer { n, inc, at });
                }
            }
        }
        Ok(())
    }

    fn output(&mut self, n: usize, o: Output) -> Res {
        let inc = self.nodes[n].inc;
        match o {
            Output::Connect(info) => {
                tr!(self, "n{n} Connect {} -> {} path {} inst {}", info.laddr, info.faddr, info.id.index, info.inst);
                if info.kind == TransportKind::Loop {
                    self.sched(self.now, Ev::Up { n, inc, path: info.id, inst: info.inst });
                } else {
                    self.connect(n, info);
                }
            }
            Output::Kick(info) => {
                if info.kind == TransportKind::Loop {
                    let d = self.rand(0, 5 * US);
                    self.sched(self.now + d, Ev::LoopServe { n, inc, path: info.id, inst: info.inst });
                } else if let Some(&(c, e)) = self.nodes[n].ends.get(&(info.id, info.inst)) {
                    self.want_xmit(c, e);
                }
            }
            Output::Shutdown(info) => {
                tr!(self, "n{n} Shutdown path {}->{}/{} inst {}", info.laddr, info.faddr, info.id.index, info.inst);
                match self.nodes[n].ends.get(&(info.id, info.inst)).copied() {
                    _ if info.kind == TransportKind::Loop => self.sched(
                        self.now,
                        Ev::Down { n, inc, path: info.id, inst: info.inst, why: DownReason::ShutdownDone },
                    ),
                    None => self.sched(
                        self.now,
                        Ev::Down { n, inc, path: info.id, inst: info.inst, why: DownReason::ShutdownDone },
                    ),
                    Some((c, e)) => self.shutdown(c, e)?,
                }
            }
            // The simulated transport keeps delivering (the node never drops
            // for memory; the simulated sockets read everything).
            Output::RxFlow { .. } => {}
            Output::Wake(s) => {
                let Some(i) = self.nodes[n].socks.iter().position(|k| k.id == s) else { return Ok(()) };
                let r = self.node(n).readiness(s);
                let k = &mut self.nodes[n].socks[i];
                if k.waiting {
                    k.waiting = false;
                    if !k.send_sched {
                        k.send_sched = true;
                        self.sched(self.now, Ev::AppSend { n, inc, s: i });
                    }
                }
                let k = &mut self.nodes[n].socks[i];
                if r.readable && !k.recv_sched && k.stall_until <= self.now {
                    k.recv_sched = true;
                    let d = self.rand(0, 50 * US);
                    self.sched(self.now + d, Ev::AppRecv { n, inc, s: i });
                }
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // Connections
    // ------------------------------------------------------------------

    fn connect(&mut self, n: usize, info: PathInfo) {
        self.report.connects += 1;
        let j = self.owner[&info.faddr];
        let c = self.next_conn;
        self.next_conn += 1;
        let lat = match self.rng.below(4) {
            0 => self.rand(5 * US, 50 * US),
            1 | 2 => self.rand(50 * US, 500 * US),
            _ => self.rand(500 * US, 3 * MS),
        };
        let window = [4u64 << 10, 16 << 10, 64 << 10, 256 << 10][self.rng.below(4) as usize];
        let inc = self.nodes[n].inc;
        let jinc = self.nodes[j].inc;
        let end = |node, inc, path, laddr| End {
            node,
            inc,
            path,
            laddr,
            state: St::Connecting,
            xmit_sched: false,
            want_room: false,
            closing: false,
        };
        let mut conn = Conn {
            ends: [end(n, inc, Some((info.id, info.inst)), info.laddr), end(j, jinc, None, info.faddr)],
            s: [Stream::new(), Stream::new()],
            window,
            lat,
            reset: false,
            port: 32768 + self.rng.below(28000) as u16,
            retry_sched: false,
        };
        self.nodes[n].ends.insert((info.id, info.inst), (c, 0));
        let syn = self.now + lat;
        if self.nodes[j].node.is_none() {
            conn.reset = true;
            conn.ends[1].state = St::Gone;
        } else {
            let d = self.rand(0, 300 * US);
            self.sched(syn + d, Ev::AcceptArrive { c });
        }
        self.conns.insert(c, conn);
        self.sched(syn + lat, Ev::Established { c });
    }

    fn end_info(&self, c: u64, e: usize) -> Option<(usize, u32, PathId, u64)> {
        let end = &self.conns.get(&c)?.ends[e];
        let (p, i) = end.path?;
        Some((end.node, end.inc, p, i))
    }

    /// An end reports its connection down (once) and stops.
    fn report_down(&mut self, c: u64, e: usize, why: DownReason) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let end = &mut conn.ends[e];
        if end.state == St::Gone {
            return;
        }
        end.state = St::Gone;
        let (n, inc, path) = (end.node, end.inc, end.path);
        let other_gone = conn.ends[1 - e].state == St::Gone;
        if let Some((p, i)) = path {
            if self.alive(n, inc) {
                self.nodes[n].ends.remove(&(p, i));
                tr!(
                    self,
                    "n{n} path_down {}->{}/{} inst {i} {why:?} (conn {c})",
                    self.conns[&c].ends[e].laddr,
                    self.conns[&c].ends[1 - e].laddr,
                    p.index
                );
                let now = self.at(self.now);
                self.node(n).path_down(p, i, why, now);
                self.reoffer(n);
            }
        }
        if other_gone {
            self.conns.remove(&c);
        }
    }

    fn reset_conn(&mut self, c: u64) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        if conn.reset {
            return;
        }
        conn.reset = true;
        for s in conn.s.iter_mut() {
            s.cut = Some(s.arrived);
        }
        for e in 0..2 {
            if self.conns[&c].ends[e].state != St::Gone {
                let d = self.rand(0, 2 * MS);
                self.sched(self.now + d, Ev::SeeClose { c, e });
            }
        }
    }

    fn want_xmit(&mut self, c: u64, e: usize) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let end = &mut conn.ends[e];
        if end.state != St::Open || end.xmit_sched {
            return;
        }
        end.xmit_sched = true;
        let d = if self.rng.below(3) == 0 { 0 } else { self.rand(0, 30 * US) };
        self.sched(self.now + d, Ev::Xmit { c, e });
    }

    /// End `e` has bytes or a FIN to read: its node's reactor will pass.
    fn want_read(&mut self, c: u64, e: usize) {
        let Some(conn) = self.conns.get(&c) else { return };
        let end = &conn.ends[e];
        if !matches!(end.state, St::Open | St::Draining) {
            return;
        }
        let (n, index) = (end.node, end.path.map_or(0, |p| p.0.index));
        self.nodes[n].ready.insert((index, c, e));
        if !self.nodes[n].pass_sched {
            self.nodes[n].pass_sched = true;
            let t = (self.now + self.rand(0, 200 * US)).max(self.nodes[n].reactor_stall);
            let inc = self.nodes[n].inc;
            self.sched(t, Ev::ReactorPass { n, inc });
        }
    }

    /// One pass of node `n`'s reactor: reads every connection with
    /// something to read, lower path indexes first (as rds-tcp does in a
    /// poll batch: what lane-0 gating relies on, see `Node::pull`).
    fn reactor_pass(&mut self, n: usize) -> Res {
        self.nodes[n].pass_sched = false;
        if self.nodes[n].reactor_stall > self.now {
            self.nodes[n].pass_sched = true;
            let (t, inc) = (self.nodes[n].reactor_stall, self.nodes[n].inc);
            self.sched(t, Ev::ReactorPass { n, inc });
            return Ok(());
        }
        for (_, c, e) in std::mem::take(&mut self.nodes[n].ready) {
            self.read(c, e)?;
        }
        Ok(())
    }

    fn xmit(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get_mut(&c) else { return Ok(()) };
        conn.ends[e].xmit_sched = false;
        if conn.ends[e].state != St::Open {
            return Ok(());
        }
        let Some((n, inc, p, inst)) = self.end_info(c, e) else { return Ok(()) };
        if !self.alive(n, inc) {
            return Ok(());
        }
        let start = self.conns[&c].s[e].written;
        let mut out: Vec<TxMessage> = Vec::new();
        for _ in 0..64 {
            let conn = &self.conns[&c];
            let s = &conn.s[e];
            let unread = s.written - s.base;
            if unread >= conn.window {
                self.conns.get_mut(&c).unwrap().ends[e].want_room = true;
                break;
            }
            let room = (conn.window - unread) as usize;
            let budget = room.min([1usize << 10, 8 << 10, 64 << 10, 512 << 10][self.rng.below(4) as usize]);
            out.clear();
            let more = self.node(n).pull(p, inst, budget, &mut out);
            for m in &out {
                self.write_msg(c, e, m);
            }
            if !more {
                break;
            }
        }
        let end = self.conns[&c].s[e].written;
        if end > start {
            tr!(
                self,
                "n{n} xmit {}->{}/{} conn {c}: {} bytes",
                self.conns[&c].ends[e].laddr,
                self.conns[&c].ends[1 - e].laddr,
                p.index,
                end - start
            );
            self.segments(c, e, start, end);
        }
        Ok(())
    }

    fn write_msg(&mut self, c: u64, e: usize, m: &TxMessage) {
        let s = &mut self.conns.get_mut(&c).unwrap().s[e];
        s.buf.extend_from_slice(&m.header.to_bytes());
        s.buf.extend_from_slice(&m.payload);
        s.written += (HEADER_LEN + m.payload.len()) as u64;
        if !m.is_cong_map() {
            s.seqs.push_back((s.written, m.header.sequence));
        }
        if m.header.kind() == Kind::Data {
            if let Some(id) = oracle::id_of(&m.payload) {
                s.recs.push_back((s.written, id));
            }
        }
    }

    /// Schedules the arrival of bytes `[from, to)` in 1..=3 segments.
    fn segments(&mut self, c: u64, d: usize, from: u64, to: u64) {
        let k = 1 + self.rng.below(3);
        let mut cuts: Vec<u64> = (1..k).map(|_| from + self.rng.below(to - from)).collect();
        cuts.push(to);
        cuts.sort_unstable();
        cuts.dedup();
        for upto in cuts {
            let conn = &self.conns[&c];
            let jitter = self.rng.below(conn.lat / 2 + 1);
            let t = (self.now + conn.lat + jitter).max(conn.s[d].last_arrival);
            self.conns.get_mut(&c).unwrap().s[d].last_arrival = t;
            self.sched(t, Ev::Arrive { c, d, upto });
        }
    }

    fn arrive(&mut self, c: u64, d: usize, upto: u64) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let r = 1 - d;
        let rnode = conn.ends[r].node;
        let rinc = conn.ends[r].inc;
        let receiver_up = conn.ends[r].state != St::Gone;
        let s = &mut conn.s[d];
        let new = upto.min(s.cut.unwrap_or(u64::MAX)).min(s.written);
        if new > s.arrived && receiver_up && self.nodes[rnode].node.is_some() && self.nodes[rnode].inc == rinc {
            s.arrived = new;
            let lat = conn.lat;
            let jitter = self.rng.below(lat / 2 + 1);
            let t = (self.now + lat + jitter).max(s.last_ack);
            s.last_ack = t;
            self.sched(t, Ev::Ack { c, d, upto: new });
        }
        self.want_read(c, r);
    }

    fn ack(&mut self, c: u64, d: usize, upto: u64) {
        let Some(conn) = self.conns.get_mut(&c) else { return };
        let end = &conn.ends[d];
        if end.state == St::Gone {
            return;
        }
        let n = end.node;
        if self.nodes[n].reactor_stall > self.now {
            // rds-tcp learns of acks in its reactor.
            let t = self.nodes[n].reactor_stall;
            self.sched(t, Ev::Ack { c, d, upto });
            return;
        }
        let mut last = None;
        let s = &mut conn.s[d];
        while s.seqs.front().is_some_and(|(off, _)| *off <= upto) {
            last = Some(s.seqs.pop_front().unwrap().1);
        }
        if let (Some(seq), Some((n, inc, p, i))) = (last, self.end_info(c, d)) {
            if self.alive(n, inc) {
                self.node(n).acked(p, i, seq);
            }
        }
    }

    fn established(&mut self, c: u64) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        if conn.ends[0].state != St::Connecting {
            return Ok(());
        }
        let (n, inc) = (conn.ends[0].node, conn.ends[0].inc);
        if !self.alive(n, inc) {
            return Ok(());
        }
        if conn.reset {
            self.report_down(c, 0, DownReason::ConnectFailed);
            return Ok(());
        }
        let (l, f) = (conn.ends[0].laddr, conn.ends[1].laddr);
        if addr_cmp(&l, &f) != std::cmp::Ordering::Less {
            // The poke: the larger address never keeps a connection.
            self.reset_conn(c);
            self.report_down(c, 0, DownReason::DirectionRule);
            return Ok(());
        }
        let (p, i) = conn.ends[0].path.unwrap();
        self.conns.get_mut(&c).unwrap().ends[0].state = St::Open;
        tr!(self, "n{n} path_up {l}->{f}/{} inst {i} (conn {c})", p.index);
        self.node(n).path_up(p, i);
        self.want_read(c, 0);
        self.want_xmit(c, 0);
        Ok(())
    }

    fn accept_arrive(&mut self, c: u64) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        let (j, jinc) = (conn.ends[1].node, conn.ends[1].inc);
        if conn.ends[1].state != St::Connecting {
            return Ok(());
        }
        if !self.alive(j, jinc) {
            // The listener of a dead instance: the connection is reset.
            self.conns.get_mut(&c).unwrap().ends[1].state = St::Gone;
            self.reset_conn(c);
            return Ok(());
        }
        // A connection reset while it waited in the accept queue (or
        // deferred) is still offered: what arrived before is readable.
        let was_reset = conn.reset;
        let (l, f) = (conn.ends[1].laddr, conn.ends[0].laddr);
        let port = conn.port;
        let a = self.node(j).accept(TransportKind::Tcp, l, f, port);
        tr!(self, "n{j} accept from {f} to {l}: {a:?} (conn {c})");
        match a {
            Accept::Path(info) => {
                if addr_cmp(&f, &l) != std::cmp::Ordering::Less {
                    return Err(format!("n{j} accepted a connection from the larger address {f} to {l}"));
                }
                let conn = self.conns.get_mut(&c).unwrap();
                conn.ends[1].path = Some((info.id, info.inst));
                conn.ends[1].state = St::Open;
                self.nodes[j].ends.insert((info.id, info.inst), (c, 1));
                self.want_read(c, 1);
                self.want_xmit(c, 1);
                if was_reset {
                    self.sched(self.now, Ev::SeeClose { c, e: 1 });
                }
            }
            Accept::Reject | Accept::RejectPeerLarger => {
                self.conns.get_mut(&c).unwrap().ends[1].state = St::Gone;
                self.reset_conn(c);
            }
            Accept::Defer => {
                // Kept unread (what arrives is still acked by the kernel)
                // and offered again after the node's next path_down, or
                // in a millisecond.
                if !self.nodes[j].deferred.contains(&c) {
                    self.nodes[j].deferred.push(c);
                }
                let conn = self.conns.get_mut(&c).unwrap();
                if !conn.retry_sched {
                    conn.retry_sched = true;
                    self.sched(self.now + MS, Ev::Reoffer { c });
                }
            }
        }
        Ok(())
    }

    /// Offers node `n`'s deferred connections again.
    fn reoffer(&mut self, n: usize) {
        for c in std::mem::take(&mut self.nodes[n].deferred) {
            self.sched(self.now, Ev::AcceptArrive { c });
        }
    }

    fn shutdown(&mut self, c: u64, e: usize) -> Res {
        let conn = self.conns.get_mut(&c).unwrap();
        match conn.ends[e].state {
            St::Connecting => {
                self.reset_conn(c);
                self.report_down(c, e, DownReason::ShutdownDone);
            }
            St::Open => {
                conn.ends[e].state = St::Draining;
                self.send_fin(c, e);
                self.sched(self.now + SHUTDOWN_DRAIN, Ev::DrainTimeout { c, e });
                self.want_read(c, e);
            }
            St::Draining | St::Gone => {}
        }
        Ok(())
    }

    fn send_fin(&mut self, c: u64, e: usize) {
        let conn = self.conns.get_mut(&c).unwrap();
        let s = &mut conn.s[e];
        if s.fin.is_some() {
            return;
        }
        s.fin = Some(s.written);
        let t = (self.now + conn.lat).max(s.last_arrival);
        s.last_arrival = t;
        let upto = s.written;
        self.sched(t, Ev::Arrive { c, d: e, upto });
    }

    /// The transport of end `e` reads what arrived and hands complete
    /// messages to its node; handles the peer's FIN.
    fn read(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        let (n, inc) = (conn.ends[e].node, conn.ends[e].inc);
        if !matches!(conn.ends[e].state, St::Open | St::Draining) || !self.alive(n, inc) {
            return Ok(());
        }
        let conn = self.conns.get_mut(&c).unwrap();
        let (p, inst) = conn.ends[e].path.unwrap();
        let s = &mut conn.s[1 - e];
        let avail = (s.arrived - s.base) as usize;
        let mut frames = Vec::new();
        let r = s.decoder.feed(&s.buf[s.off..s.off + avail], &mut |f| frames.push(f));
        s.off += avail;
        if s.off > 1 << 16 && s.off * 2 > s.buf.len() {
            s.buf.drain(..s.off);
            s.off = 0;
        }
        s.base = s.arrived;
        let base = s.base;
        while s.recs.front().is_some_and(|(off, _)| *off <= base) {
            s.recs.pop_front();
        }
        let fin_read = s.fin.is_some_and(|f| base >= f);
        if let Err(err) = r {
            return Err(format!("n{n} conn {c}: undecodable stream: {err}"));
        }
        for f in frames {
            let rx = RxMessage::from(f);
            let id = if rx.header.kind() == Kind::Data { oracle::id_of(&rx.payload) } else { None };
            let len = rx.payload.len() as u64;
            let detail = if self.verbose && rx.header.kind() == Kind::CongMap {
                let ports: Vec<u16> = rds_core::cong::CongMap::from_wire(&rx.payload)
                    .map(|m| m.congested_ports().take(8).collect())
                    .unwrap_or_default();
                format!(" sport {} dport {} congested {ports:?}", rx.header.sport, rx.header.dport)
            } else {
                String::new()
            };
            let o = self.node(n).received(p, inst, rx);
            tr!(
                self,
                "n{n} received on {}<-{}/{} inst {inst}: {o:?} {:?}{detail}",
                self.conns[&c].ends[e].laddr,
                self.conns[&c].ends[1 - e].laddr,
                p.index,
                id
            );
            self.outcome(n, id, len, o)?;
        }
        if fin_read {
            let state = self.conns[&c].ends[e].state;
            if state == St::Draining {
                self.report_down(c, e, DownReason::ShutdownDone);
            } else if state == St::Open {
                // The peer closed: we have everything it sent; close at once
                // (our FIN follows what we wrote, which the peer still reads).
                self.send_fin(c, e);
                self.report_down(c, e, DownReason::Closed);
            }
        }
        if self.conns.get(&c).is_some_and(|k| k.ends[e].closing && k.ends[e].state != St::Gone) {
            // Delivered what was read before the connection ended.
            let why = if self.conns[&c].ends[e].state == St::Draining {
                DownReason::ShutdownDone
            } else {
                DownReason::Closed
            };
            self.report_down(c, e, why);
        }
        // The writer of that stream may have room again.
        if let Some(conn) = self.conns.get_mut(&c) {
            if conn.ends[1 - e].want_room {
                conn.ends[1 - e].want_room = false;
                self.want_xmit(c, 1 - e);
            }
        }
        Ok(())
    }

    fn outcome(&mut self, n: usize, id: Option<u64>, len: u64, o: RecvOutcome) -> Res {
        match o {
            RecvOutcome::Delivered => {
                let Some(id) = id else { return Ok(()) };
                let dst = self.oracle.msgs[id as usize].dst;
                let inc = self.nodes[n].inc;
                let Some(i) = self.nodes[n].socks.iter().position(|k| k.spec.addr == dst) else {
                    return Err(format!("n{n} queued message {id} for {dst}, which it does not serve"));
                };
                let k = &mut self.nodes[n].socks[i];
                k.queued += len;
                let bound = k.rcv_limit + self.rcv_bound_extra;
                if k.queued > bound {
                    return Err(format!("n{n} {dst}: receive queue {} bytes exceeds the bound {bound}", k.queued));
                }
                let _ = inc;
                Ok(())
            }
            RecvOutcome::DupDropped => {
                // Mainline: a restarted sender's retransmission dropped by
                // a receiver still holding the old instance's sequence.
                if let Some(id) = id {
                    let src = self.oracle.msgs[id as usize].src_node;
                    if self.p.handshake == HandshakeExts::Mainline && self.nodes[src].deaths > 0 {
                        self.oracle.excuse(id, Excuse::StaleSequence);
                    }
                }
                Ok(())
            }
            RecvOutcome::Stale => {
                // A restarted receiver drops what was resent to it but had
                // been sent to its previous instance. A Full survivor learns
                // the new generation before it resends anything and flushes
                // (reports) such messages: there a stale drop is a loss
                // nobody reports.
                match id {
                    Some(id) if self.nodes[n].deaths > 0 && self.p.handshake == HandshakeExts::Mainline => {
                        self.oracle.excuse(id, Excuse::StaleReceiver);
                        Ok(())
                    }
                    Some(id) if self.nodes[n].deaths > 0 => Err(format!(
                        "n{n} dropped message {id} as stale: a Full peer resent it before learning of the restart"
                    )),
                    _ => Err(format!("n{n} (never restarted) dropped message {id:?} as stale")),
                }
            }
            RecvOutcome::NoSocket => Err(format!("n{n}: message {id:?} for a port nobody bound")),
            RecvOutcome::ProtocolError => Err(format!("n{n}: protocol error on message {id:?}")),
            _ => Ok(()),
        }
    }

    /// End `e` notices the reset: its reactor's next pass drains what
    /// arrived and reports the connection down.
    fn see_close(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        let (n, inc, state) = (conn.ends[e].node, conn.ends[e].inc, conn.ends[e].state);
        if state == St::Gone || !self.alive(n, inc) {
            return Ok(());
        }
        if state == St::Connecting {
            // Established will report the failure.
            return Ok(());
        }
        self.conns.get_mut(&c).unwrap().ends[e].closing = true;
        self.want_read(c, e);
        Ok(())
    }

    fn drain_timeout(&mut self, c: u64, e: usize) -> Res {
        let Some(conn) = self.conns.get(&c) else { return Ok(()) };
        if conn.ends[e].state != St::Draining {
            return Ok(());
        }
        self.read(c, e)?;
        if self.conns.get(&c).is_some_and(|k| k.ends[e].state == St::Draining) {
            self.reset_conn(c);
            self.report_down(c, e, DownReason::ShutdownDone);
        }
        Ok(())
    }

    fn loop_serve(&mut self, n: usize, p: PathId, inst: u64) -> Res {
        let mut out = Vec::new();
        for _ in 0..1000 {
            out.clear();
            let more = self.node(n).pull(p, inst, 1 << 20, &mut out);
            let mut last = None;
            for m in out.drain(..) {
                if !m.is_cong_map() {
                    last = Some(m.header.sequence);
                }
                let id = if m.header.kind() == Kind::Data { oracle::id_of(&m.payload) } else { None };
                let len = m.payload.len() as u64;
                let rx = RxMessage { header: m.header, payload: m.payload, rx_time_ns: None };
                let o = self.node(n).received(p, inst, rx);
                self.outcome(n, id, len, o)?;
            }
            if let Some(seq) = last {
                self.node(n).acked(p, inst, seq);
            }
            if !more {
                return Ok(());
            }
        }
        Err(format!("n{n}: loopback path keeps producing messages"))
    }

    // ------------------------------------------------------------------
    // Applications
    // ------------------------------------------------------------------

    fn app_send(&mut self, n: usize, inc: u32, i: usize) -> Res {
        self.nodes[n].socks[i].send_sched = false;
        let dst = match self.phase {
            Phase::Work => self.dsts[self.rng.below(self.dsts.len() as u64) as usize],
            Phase::Drain => match self.nodes[n].socks[i].finals.last() {
                Some(d) => *d,
                None => return Ok(()),
            },
            Phase::Done => return Ok(()),
        };
        let k = &self.nodes[n].socks[i];
        let (s, uid, src, blocking, limit) =
            (k.id, k.uid, k.spec.addr, k.spec.blocking || self.phase == Phase::Drain, k.snd_limit);
        let len = match self.rng.below(100) {
            0..=79 => self.rand(oracle::MIN_LEN as u64, 1500),
            80..=97 => self.rand(1500, 8192),
            _ => self.rand(8192, MAX_LEN as u64),
        }
        .min(limit) as usize;
        let len = len.max(oracle::MIN_LEN);
        let id = self.oracle.next_id();
        let payload = Payload::copy_from(&oracle::payload(id, len));
        let opts = SendOptions { blocking, ..SendOptions::default() };
        let r = self.node(n).send(s, Some(dst), &payload, &opts);
        tr!(self, "n{n} send {src} -> {dst} id {id} len {len}: {r:?}");
        match r {
            Ok(_) => {
                self.oracle.accepted(id, uid, n, src, dst, len, self.now);
                self.report.accepted += 1;
                let snd = self.node(n).snd_bytes(s);
                if snd > limit + MAX_LEN as u64 {
                    return Err(format!("n{n} {src}: send buffer holds {snd} bytes, limit {limit}"));
                }
                if self.phase == Phase::Drain {
                    self.nodes[n].socks[i].finals.pop();
                }
                let d = if self.phase == Phase::Drain { 0 } else { self.gap(self.p.send_gap) };
                self.nodes[n].socks[i].send_sched = true;
                self.sched(self.now + d, Ev::AppSend { n, inc, s: i });
            }
            Err(e) if e == Errno::EAGAIN || e == Errno::ENOBUFS => {
                if e == Errno::EAGAIN {
                    self.report.send_eagain += 1;
                } else {
                    self.report.send_enobufs += 1;
                }
                if blocking {
                    // Wait for the node's Wake of this socket.
                    self.nodes[n].socks[i].waiting = true;
                } else {
                    let d = self.gap(self.p.send_gap);
                    self.nodes[n].socks[i].send_sched = true;
                    self.sched(self.now + d, Ev::AppSend { n, inc, s: i });
                }
            }
            Err(e) => return Err(format!("n{n} {src}: send to {dst} failed with {e}")),
        }
        Ok(())
    }

    fn app_recv(&mut self, n: usize, inc: u32, i: usize) -> Res {
        self.nodes[n].socks[i].recv_sched = false;
        if self.nodes[n].socks[i].stall_until > self.now {
            return Ok(());
        }
        let s = self.nodes[n].socks[i].id;
        let budget = 1 + self.rng.below(32);
        for _ in 0..budget {
            match self.node(n).recv(s, false) {
                Ok(Received::Data(m)) => {
                    let len = m.payload.len() as u64;
                    let k = &mut self.nodes[n].socks[i];
                    k.queued = k.queued.checked_sub(len).ok_or_else(|| format!("n{n}: read more than was queued"))?;
                    let id = oracle::id_of(&m.payload);
                    tr!(self, "n{n} app {} reads {:?} from {}", m.to, id, m.from);
                    self.oracle.delivered(inc, m.from, m.to, &m.payload)?;
                }
                Ok(Received::CongUpdate { .. }) => {}
                Ok(other) => return Err(format!("n{n}: unexpected {other:?}")),
                Err(e) if e == Errno::EAGAIN => break,
                Err(e) => return Err(format!("n{n}: recv failed with {e}")),
            }
        }
        if self.node(n).readiness(s).readable && !self.nodes[n].socks[i].recv_sched {
            self.nodes[n].socks[i].recv_sched = true;
            let d = self.rand(0, 50 * US);
            self.sched(self.now + d, Ev::AppRecv { n, inc, s: i });
        }
        Ok(())
    }

    // ------------------------------------------------------------------
    // Faults
    // ------------------------------------------------------------------

    fn fault(&mut self) -> Res {
        if self.phase != Phase::Work {
            return Ok(());
        }
        let d = self.gap(self.p.fault_gap);
        self.sched(self.now + d, Ev::Fault);
        match self.rng.below(100) {
            0..=29 => {
                // A connection reset at whatever byte it is at.
                let live: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, k)| !k.reset && k.ends.iter().any(|e| e.state == St::Open))
                    .map(|(c, _)| *c)
                    .collect();
                if !live.is_empty() {
                    let c = live[self.rng.below(live.len() as u64) as usize];
                    tr!(self, "FAULT reset conn {c}");
                    self.report.resets += 1;
                    self.reset_conn(c);
                }
            }
            30..=39 => {
                // RDS_CONN_RESET-like: the core shuts a path down itself.
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                let ends: Vec<PathId> = self.nodes[n].ends.keys().map(|(p, _)| *p).collect();
                if self.nodes[n].node.is_some() && !ends.is_empty() {
                    let p = ends[self.rng.below(ends.len() as u64) as usize];
                    tr!(self, "FAULT n{n} resets path {}/{}", p.conn.0, p.index);
                    self.report.resets += 1;
                    self.node(n).reset_path(p);
                }
            }
            40..=47 => {
                if self.report.restarts < u64::from(self.p.restarts) {
                    let n = self.rng.below(self.nodes.len() as u64) as usize;
                    if self.nodes[n].node.is_some() {
                        self.kill(n);
                    }
                }
            }
            48..=69 => {
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                let i = self.rng.below(self.nodes[n].socks.len() as u64) as usize;
                let long = self.chance(30);
                let d = if long { self.rand(5 * MS, 40 * MS) } else { self.rand(100 * US, 3 * MS) };
                tr!(self, "FAULT n{n} app of {} stalls for {}us", self.nodes[n].specs[i].addr, d / US);
                self.report.stalls += 1;
                let k = &mut self.nodes[n].socks[i];
                k.stall_until = k.stall_until.max(self.now + d);
                let inc = self.nodes[n].inc;
                let t = self.nodes[n].socks[i].stall_until;
                self.sched(t, Ev::AppRecv { n, inc, s: i });
            }
            70..=79 => {
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                let d = self.rand(100 * US, 15 * MS);
                tr!(self, "FAULT n{n} reactor stalls for {}us", d / US);
                self.report.stalls += 1;
                self.nodes[n].reactor_stall = self.nodes[n].reactor_stall.max(self.now + d);
            }
            _ => {
                // RDS_CANCEL_SENT_TO of a random destination.
                let n = self.rng.below(self.nodes.len() as u64) as usize;
                if self.nodes[n].node.is_none() {
                    return Ok(());
                }
                let i = self.rng.below(self.nodes[n].socks.len() as u64) as usize;
                let dst = self.dsts[self.rng.below(self.dsts.len() as u64) as usize];
                let (s, uid) = (self.nodes[n].socks[i].id, self.nodes[n].socks[i].uid);
                let k = self.node(n).drop_messages(s, Some(dst));
                tr!(self, "FAULT n{n} cancels {} -> {dst}: {k} dropped", self.nodes[n].specs[i].addr);
                self.report.cancels += 1;
                self.oracle.cancelled(uid, dst, k);
            }
        }
        Ok(())
    }

    /// Node `n` dies abruptly: its sockets, queues and transport buffers
    /// are gone; a new instance starts a little later.
    fn kill(&mut self, n: usize) {
        tr!(self, "FAULT n{n} dies");
        self.report.restarts += 1;
        // Received but never read: on its sockets' queues...
        let ids: Vec<SockId> = self.nodes[n].socks.iter().map(|k| k.id).collect();
        for s in ids {
            while let Ok(r) = self.node(n).recv(s, false) {
                if let Received::Data(m) = r {
                    if let Some(id) = oracle::id_of(&m.payload) {
                        self.oracle.excuse(id, Excuse::ReceiverDied);
                    }
                }
            }
        }
        // ... and acked by its TCP but not yet read by its transport.
        let ends: Vec<(u64, usize)> = self.nodes[n].ends.values().copied().collect();
        let mut all: Vec<(u64, usize)> = self
            .conns
            .iter()
            .flat_map(|(c, k)| {
                (0..2).filter(move |e| k.ends[*e].node == n && k.ends[*e].state != St::Gone).map(move |e| (*c, e))
            })
            .collect();
        all.extend(ends);
        all.sort_unstable();
        all.dedup();
        for (c, e) in all {
            let Some(conn) = self.conns.get_mut(&c) else { continue };
            if conn.ends[e].inc != self.nodes[n].inc {
                continue;
            }
            let s = &mut conn.s[1 - e];
            let arrived = s.arrived;
            let lost: Vec<u64> = s.recs.iter().filter(|(off, _)| *off <= arrived).map(|(_, id)| *id).collect();
            s.cut = Some(arrived);
            conn.reset = true;
            conn.ends[e].state = St::Gone;
            let other = 1 - e;
            let other_state = conn.ends[other].state;
            for id in lost {
                self.oracle.excuse(id, Excuse::ReceiverDied);
            }
            if other_state != St::Gone {
                // The survivor sees the reset after the dead side's last bytes.
                let d = self.rand(0, 3 * MS);
                self.sched(self.now + d, Ev::SeeClose { c, e: other });
            } else {
                self.conns.remove(&c);
            }
        }
        for k in &self.nodes[n].socks {
            self.dead_uids.push(k.uid);
        }
        self.nodes[n].node = None;
        self.nodes[n].ends.clear();
        self.nodes[n].deaths += 1;
        let d = self.rand(0, 20 * MS);
        self.sched(self.now + d, Ev::Restart { n });
    }

    // ------------------------------------------------------------------
    // Running
    // ------------------------------------------------------------------

    fn end_work(&mut self) {
        tr!(self, "faults stop; draining");
        self.phase = Phase::Drain;
        for n in 0..self.nodes.len() {
            self.nodes[n].reactor_stall = 0;
            let inc = self.nodes[n].inc;
            let alive = self.nodes[n].node.is_some();
            for i in 0..self.nodes[n].socks.len() {
                let k = &mut self.nodes[n].socks[i];
                k.stall_until = 0;
                k.finals = self.dsts.clone();
                if alive {
                    if !k.recv_sched {
                        k.recv_sched = true;
                        self.sched(self.now, Ev::AppRecv { n, inc, s: i });
                    }
                    let k = &mut self.nodes[n].socks[i];
                    if !k.send_sched && !k.waiting {
                        k.send_sched = true;
                        self.sched(self.now, Ev::AppSend { n, inc, s: i });
                    }
                }
            }
        }
        self.sched(self.now + 5 * MS, Ev::Check);
    }

    /// Whether everything drained: all alive, nothing queued, in flight,
    /// unread or waiting.
    fn quiet(&mut self) -> bool {
        for n in 0..self.nodes.len() {
            let Some(node) = self.nodes[n].node.as_ref() else { return false };
            if !node.unsent().is_empty() {
                return false;
            }
            for k in &self.nodes[n].socks {
                if k.queued > 0 || k.waiting || !k.finals.is_empty() || node.readiness(k.id).readable {
                    return false;
                }
            }
        }
        for conn in self.conns.values() {
            for e in 0..2 {
                if conn.ends[e].state != St::Gone && !conn.reset {
                    let s = &conn.s[e];
                    if s.written != s.base {
                        return false;
                    }
                }
            }
        }
        true
    }

    fn check(&mut self) -> Res {
        if self.quiet() {
            self.quiet_checks += 1;
            if self.quiet_checks >= 2 {
                self.phase = Phase::Done;
                return Ok(());
            }
        } else {
            self.quiet_checks = 0;
        }
        if self.now > self.p.work + QUIESCE_LIMIT {
            return Err(format!(
                "no quiescence {}s after the faults stopped\n{}",
                QUIESCE_LIMIT / 1_000 / MS,
                self.dump()
            ));
        }
        self.sched(self.now + 5 * MS, Ev::Check);
        Ok(())
    }

    fn event(&mut self, ev: Ev) -> Res {
        match ev {
            Ev::Timer { n, inc, at } => {
                if self.alive(n, inc) && self.nodes[n].timer_at == Some(at) {
                    self.nodes[n].timer_at = None;
                    let now = self.at(self.now);
                    self.node(n).handle_timeout(now);
                }
            }
            Ev::Xmit { c, e } => self.xmit(c, e)?,
            Ev::Arrive { c, d, upto } => self.arrive(c, d, upto),
            Ev::ReactorPass { n, inc } => {
                if self.alive(n, inc) {
                    self.reactor_pass(n)?;
                }
            }
            Ev::Ack { c, d, upto } => self.ack(c, d, upto),
            Ev::Established { c } => self.established(c)?,
            Ev::AcceptArrive { c } => self.accept_arrive(c)?,
            Ev::Reoffer { c } => {
                if let Some(conn) = self.conns.get_mut(&c) {
                    conn.retry_sched = false;
                    self.accept_arrive(c)?;
                }
            }
            Ev::SeeClose { c, e } => self.see_close(c, e)?,
            Ev::DrainTimeout { c, e } => self.drain_timeout(c, e)?,
            Ev::Down { n, inc, path, inst, why } => {
                if self.alive(n, inc) {
                    let now = self.at(self.now);
                    self.node(n).path_down(path, inst, why, now);
                    self.reoffer(n);
                }
            }
            Ev::Up { n, inc, path, inst } => {
                if self.alive(n, inc) {
                    self.node(n).path_up(path, inst);
                }
            }
            Ev::LoopServe { n, inc, path, inst } => {
                if self.alive(n, inc) {
                    self.loop_serve(n, path, inst)?;
                }
            }
            Ev::AppSend { n, inc, s } => {
                if self.alive(n, inc) {
                    self.app_send(n, inc, s)?;
                }
            }
            Ev::AppRecv { n, inc, s } => {
                if self.alive(n, inc) {
                    self.app_recv(n, inc, s)?;
                }
            }
            Ev::Fault => self.fault()?,
            Ev::Restart { n } => self.start_node(n),
            Ev::EndWork => self.end_work(),
            Ev::Check => self.check()?,
        }
        Ok(())
    }

    /// Runs the seed to the end and checks every invariant.
    pub fn run(mut self) -> Result<Report, String> {
        let r = self.run_inner();
        match r {
            Ok(()) => Ok(self.report),
            Err(e) => Err(format!(
                "{e}\n(at {}.{:06} ms simulated, event {})",
                self.now / MS,
                self.now % MS,
                self.report.events
            )),
        }
    }

    fn run_inner(&mut self) -> Res {
        tr!(self, "params {:?}", self.p);
        let d = self.gap(self.p.fault_gap);
        self.sched(d, Ev::Fault);
        self.sched(self.p.work, Ev::EndWork);
        self.pump()?;
        while let Some(Reverse((t, _, slot))) = self.events.pop() {
            let ev = self.evs[slot].take().unwrap();
            self.free_evs.push(slot);
            self.now = t;
            self.report.events += 1;
            if self.report.events > EVENT_LIMIT {
                return Err(format!("more than {EVENT_LIMIT} events\n{}", self.dump()));
            }
            self.event(ev)?;
            self.pump()?;
            if self.phase == Phase::Done {
                break;
            }
        }
        if self.phase != Phase::Done {
            return Err(format!("ran out of events before quiescence\n{}", self.dump()));
        }
        self.report.sim_time = self.now;
        self.final_checks()
    }

    fn final_checks(&mut self) -> Res {
        let mut flushed_by_uid = BTreeMap::new();
        for n in 0..self.nodes.len() {
            let node = self.nodes[n].node.as_ref().unwrap();
            let c = node.counters();
            for (name, v) in [
                ("recv_drop_no_sock", c.recv_drop_no_sock),
                ("recv_drop_over_limit", c.recv_drop_over_limit),
                ("recv_drop_bad_frame", c.recv_drop_bad_frame),
            ] {
                if v != 0 {
                    return Err(format!("n{n}: counter {name} = {v}"));
                }
            }
            let mut sum = 0;
            for k in &self.nodes[n].socks {
                let f = node.flushed(k.id);
                sum += f;
                flushed_by_uid.insert(k.uid, f);
                if node.snd_bytes(k.id) != 0 || node.pending_messages(k.id) != 0 {
                    return Err(format!("n{n} {}: messages still pending after quiescence", k.spec.addr));
                }
            }
            // The counter also counts flushed probes and pongs (no socket).
            if sum > c.send_drop_flushed {
                return Err(format!("n{n}: send_drop_flushed {} but sockets report {sum}", c.send_drop_flushed));
            }
            if self.p.handshake == HandshakeExts::Mainline && (c.send_drop_flushed != 0 || c.peer_restart != 0) {
                return Err(format!("n{n}: a Mainline node detected a restart"));
            }
        }
        for uid in self.dead_uids.clone() {
            let ids: Vec<u64> =
                self.oracle.msgs.iter().enumerate().filter(|(_, m)| m.src_uid == uid).map(|(i, _)| i as u64).collect();
            for id in ids {
                self.oracle.excuse(id, Excuse::SenderDied);
            }
        }
        let nodes = &self.nodes;
        let flushed = |uid: u32| flushed_by_uid.get(&uid).copied();
        let flushable = |m: &Msg| {
            let dn = nodes.iter().position(|x| x.addrs.contains(&m.dst.ip())).unwrap();
            nodes[dn].deaths > 0 && nodes[m.src_node].detections.iter().any(|t| *t >= m.accepted_at)
        };
        self.report.summary = self.oracle.check_complete(&flushed, &flushable)?;
        Ok(())
    }

    pub fn dump(&self) -> String {
        let mut s = String::new();
        for (n, sn) in self.nodes.iter().enumerate() {
            let _ = writeln!(s, "== n{n} instance {} addrs {:?}", sn.inc, sn.addrs);
            match &sn.node {
                Some(node) => {
                    let _ = write!(s, "{}", node.dump());
                    for k in &sn.socks {
                        let _ = writeln!(
                            s,
                            "  app {} queued {} waiting {} finals {} stall {}",
                            k.spec.addr,
                            k.queued,
                            k.waiting,
                            k.finals.len(),
                            k.stall_until
                        );
                    }
                }
                None => {
                    let _ = writeln!(s, "  (dead)");
                }
            }
        }
        for (c, k) in &self.conns {
            let _ = writeln!(
                s,
                "conn {c}: {} ({:?}) -> {} ({:?}) reset {} s0 {}/{}/{} s1 {}/{}/{}",
                k.ends[0].laddr,
                k.ends[0].state,
                k.ends[1].laddr,
                k.ends[1].state,
                k.reset,
                k.s[0].base,
                k.s[0].arrived,
                k.s[0].written,
                k.s[1].base,
                k.s[1].arrived,
                k.s[1].written
            );
        }
        s
    }
}

/// Runs one seed.
pub fn run_seed(seed: u64, verbose: bool) -> Result<Report, String> {
    Sim::new(Params::from_seed(seed), verbose).run()
}
