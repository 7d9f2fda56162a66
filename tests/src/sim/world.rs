//! The simulated world: nodes, their applications, and a TCP-like network
//! between them, driven by one event queue in simulated time. See the docs
//! of [`crate::sim`] for the model and the invariants.
//!
//! This file holds the world itself (parameters, nodes, the event queue,
//! the run) and drives the nodes through rds-core's driver; the network
//! model is in `net.rs`, the faults in `faults.rs`, the applications in
//! `workload.rs`, the invariant checks in `checks.rs` (with `oracle.rs`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rds_core::driver::{self, Dispatch};
use rds_core::types::Rng;
use rds_core::{
    DownReason, HandshakeExts, Node, NodeConfig, PathId, PathInfo, SockId, SockOpt, TransportCaps, TransportKind,
};

use super::net::Conn;
use super::oracle::{Oracle, Summary};
use super::workload::{AppSock, SockSpec};

pub(super) const US: u64 = 1_000;
pub(super) const MS: u64 = 1_000_000;

/// Largest payload the workload sends.
pub const MAX_LEN: usize = 16 << 10;
/// Events allowed per run (a livelock guard).
pub(super) const EVENT_LIMIT: u64 = 3_000_000;

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
    /// A node whose applications only read (1 seed in 3): it never sends,
    /// so after a restart it never pokes or connects to a peer, which must
    /// then reconnect by itself for what it queued (rds-sink's role; a
    /// smaller address with 8 paths once waited for ever on a lane above
    /// 0, `tests/tests/mprds_restart.rs`).
    pub sink: Option<usize>,
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
        // From a stream of its own: the other parameters stay those the
        // seed always had.
        let mut r2 = Rng::new(seed ^ 0x5111_c0de_0000_0000);
        let sink = (r2.below(3) == 0).then(|| r2.below(nodes as u64) as usize);
        Params { seed, nodes, addrs, socks, handshake, work, send_gap, fault_gap, restarts, sink }
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

pub(super) struct SimNode {
    pub(super) node: Option<Node>,
    pub(super) inc: u32,
    pub(super) gen_num: u32,
    pub(super) addrs: Vec<IpAddr>,
    pub(super) specs: Vec<SockSpec>,
    pub(super) socks: Vec<AppSock>,
    pub(super) timer_at: Option<u64>,
    pub(super) reactor_stall: u64,
    /// Connection ends with something to read, by path index.
    pub(super) ready: std::collections::BTreeSet<(u8, u64, usize)>,
    pub(super) pass_sched: bool,
    pub(super) ends: BTreeMap<(PathId, u64), (u64, usize)>,
    /// Accepted connections the node deferred (`Accept::Defer`).
    pub(super) deferred: Vec<u64>,
    pub(super) deaths: u32,
    pub(super) peer_restart_seen: u64,
    /// Times this node detected a peer restart.
    pub(super) detections: Vec<u64>,
    pub(super) npaths: u8,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Ev {
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
pub(super) enum Phase {
    Work,
    Drain,
    Done,
}

pub struct Sim {
    pub(super) p: Params,
    pub(super) rng: Rng,
    pub(super) base: Instant,
    pub(super) now: u64,
    pub(super) seq: u64,
    pub(super) events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    pub(super) evs: Vec<Option<Ev>>,
    pub(super) free_evs: Vec<usize>,
    pub(super) nodes: Vec<SimNode>,
    pub(super) owner: BTreeMap<IpAddr, usize>,
    pub(super) conns: BTreeMap<u64, Conn>,
    pub(super) next_conn: u64,
    pub(super) next_uid: u32,
    pub(super) dead_uids: Vec<u32>,
    pub(super) dsts: Vec<SocketAddr>,
    pub(super) oracle: Oracle,
    pub(super) phase: Phase,
    pub(super) verbose: bool,
    pub(super) report: Report,
    pub(super) rcv_bound_extra: u64,
    pub(super) max_window: u64,
    pub(super) quiet_checks: u32,
}

pub(super) type Res<T = ()> = Result<T, String>;

/// Shuffles `v` in place (Fisher-Yates), drawing from `rng`.
pub(super) fn shuffle<T>(rng: &mut Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

pub(super) fn ip_of(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1))
}

impl Sim {
    pub fn new(p: Params, verbose: bool) -> Sim {
        let mut rng = Rng::new(p.seed.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ 0xabcd);
        // Addresses interleave between nodes so that every node is the
        // smaller side towards some peers and the larger towards others.
        let total: usize = p.addrs.iter().sum();
        let mut pool: Vec<usize> = (0..total).collect();
        shuffle(&mut rng, &mut pool);
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

    pub(super) fn trace_line(&mut self, line: String) {
        let t = self.now;
        let s = format!("[{:>4}.{:06}ms] {line}", t / MS, t % MS);
        eprintln!("{s}");
    }

    pub(super) fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    pub(super) fn sched(&mut self, t: u64, ev: Ev) {
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

    pub(super) fn rand(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.rng.below(hi - lo + 1)
    }

    pub(super) fn chance(&mut self, pct: u64) -> bool {
        self.rng.below(100) < pct
    }

    /// An exponential-ish delay with the given mean.
    pub(super) fn gap(&mut self, mean: u64) -> u64 {
        // -ln(u) approximated by a few uniform draws: good enough spread.
        let u = (self.rng.below(1 << 20) + 1) as f64 / (1u64 << 20) as f64;
        ((-u.ln()) * mean as f64) as u64 + 1
    }

    pub(super) fn start_node(&mut self, n: usize) {
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
                self.nodes[n].socks[s].finals = if self.p.sink == Some(n) { Vec::new() } else { self.dsts.clone() };
                self.nodes[n].socks[s].send_sched = true;
                self.sched(self.now, Ev::AppSend { n, inc, s });
            }
        }
    }

    pub(super) fn node(&mut self, n: usize) -> &mut Node {
        self.nodes[n].node.as_mut().expect("live node")
    }

    pub(super) fn alive(&self, n: usize, inc: u32) -> bool {
        self.nodes[n].node.is_some() && self.nodes[n].inc == inc
    }

    /// Drains the outputs of every node and re-arms their timers.
    pub(super) fn pump(&mut self) -> Res {
        loop {
            let mut any = false;
            for n in 0..self.nodes.len() {
                any |= driver::drain_with(&mut At { sim: self, n }, |a| a.sim.nodes[a.n].node.as_mut())? > 0;
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

    pub(super) fn event(&mut self, ev: Ev) -> Res {
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
                    let now = self.at(self.now);
                    self.node(n).path_up(path, inst, now);
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

    pub(super) fn run_inner(&mut self) -> Res {
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

/// The world as the dispatcher of node `n`'s outputs (rds-core's driver
/// drains the node into it, one output at a time): connections go to the
/// network model, loopback paths are served on the node itself, wakes go
/// to the node's applications.
struct At<'a> {
    sim: &'a mut Sim,
    n: usize,
}

impl Dispatch for At<'_> {
    type Error = String;

    fn connect(&mut self, info: PathInfo) -> Res {
        let (sim, n) = (&mut *self.sim, self.n);
        let inc = sim.nodes[n].inc;
        tr!(sim, "n{n} Connect {} -> {} path {} inst {}", info.laddr, info.faddr, info.id.index, info.inst);
        if info.kind == TransportKind::Loop {
            sim.sched(sim.now, Ev::Up { n, inc, path: info.id, inst: info.inst });
        } else {
            sim.connect(n, info);
        }
        Ok(())
    }

    fn kick(&mut self, info: PathInfo) -> Res {
        let (sim, n) = (&mut *self.sim, self.n);
        let inc = sim.nodes[n].inc;
        if info.kind == TransportKind::Loop {
            let d = sim.rand(0, 5 * US);
            sim.sched(sim.now + d, Ev::LoopServe { n, inc, path: info.id, inst: info.inst });
        } else if let Some(&(c, e)) = sim.nodes[n].ends.get(&(info.id, info.inst)) {
            sim.want_xmit(c, e);
        }
        Ok(())
    }

    fn shutdown(&mut self, info: PathInfo) -> Res {
        let (sim, n) = (&mut *self.sim, self.n);
        let inc = sim.nodes[n].inc;
        tr!(sim, "n{n} Shutdown path {}->{}/{} inst {}", info.laddr, info.faddr, info.id.index, info.inst);
        match sim.nodes[n].ends.get(&(info.id, info.inst)).copied() {
            _ if info.kind == TransportKind::Loop => {
                sim.sched(sim.now, Ev::Down { n, inc, path: info.id, inst: info.inst, why: DownReason::ShutdownDone })
            }
            None => {
                sim.sched(sim.now, Ev::Down { n, inc, path: info.id, inst: info.inst, why: DownReason::ShutdownDone })
            }
            Some((c, e)) => sim.shutdown(c, e)?,
        }
        Ok(())
    }

    // The simulated transport keeps delivering (the node never drops
    // for memory; the simulated sockets read everything).
    fn rx_flow(&mut self, _: PathInfo, _: bool, _: u64) -> Res {
        Ok(())
    }

    fn wake(&mut self, s: SockId) -> Res {
        let (sim, n) = (&mut *self.sim, self.n);
        let inc = sim.nodes[n].inc;
        let Some(i) = sim.nodes[n].socks.iter().position(|k| k.id == s) else { return Ok(()) };
        let r = sim.node(n).readiness(s);
        let k = &mut sim.nodes[n].socks[i];
        if k.waiting {
            k.waiting = false;
            if !k.send_sched {
                k.send_sched = true;
                sim.sched(sim.now, Ev::AppSend { n, inc, s: i });
            }
        }
        let k = &mut sim.nodes[n].socks[i];
        if r.readable && !k.recv_sched && k.stall_until <= sim.now {
            k.recv_sched = true;
            let d = sim.rand(0, 50 * US);
            sim.sched(sim.now + d, Ev::AppRecv { n, inc, s: i });
        }
        Ok(())
    }
}

/// Runs one seed.
pub fn run_seed(seed: u64, verbose: bool) -> Result<Report, String> {
    Sim::new(Params::from_seed(seed), verbose).run()
}
