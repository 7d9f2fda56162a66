//! A deterministic driver for rds-core nodes: nodes joined by an ideal
//! in-memory link. Every Connect is answered at once (accepted, refused, or
//! failed for a node marked down), pulled messages arrive in order, and are
//! acked when they arrive unless acks are held. Everything that crosses the
//! link is recorded so tests can assert on exact headers and payloads.
//!
//! Knobs for tests that need to interleave things by hand:
//! * `hold_acks`: acks are stored in `pending_acks` until `flush_acks`;
//! * `frozen`: kicks of these (node, path index) pairs are not served until
//!   `thaw` (messages stay on the send queue);
//! * `refuse`: connects to these nodes fail (`DownReason::ConnectFailed`);
//! * `pull_some`: one budgeted pull of a path, delivered at once;
//! * `link`: what happens to each message on the wire ([`crate::faults`]:
//!   the ideal link by default, or a seeded `FaultInjector` around it that
//!   drops, delays, duplicates, reorders across paths or cuts).
//!
//! The nodes' outputs are drained and routed by rds-core's driver
//! ([`rds_core::driver`]): [`Net::handle`] is the net's `Dispatch` for
//! node `i`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rds_core::DownReason;
use rds_core::driver::{self, Dispatch};
use rds_core::wire::Header;
use rds_core::*;

use crate::faults::{Ideal, Link as Wire, Verdict};

/// 127.0.0.`last`.
pub fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

pub fn sa(last: u8, port: u16) -> SocketAddr {
    SocketAddr::new(ip(last), port)
}

pub fn data(r: Received) -> Incoming {
    match r {
        Received::Data(i) => i,
        other => panic!("expected data, got {other:?}"),
    }
}

pub fn opts() -> SendOptions {
    SendOptions::default()
}

/// One message as it crossed the link.
#[derive(Clone, Debug)]
pub struct WireMsg {
    pub from: usize,
    /// The sender's path.
    pub path: PathId,
    pub header: Header,
    pub payload: Payload,
    pub ack_required: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Link {
    pub peer: usize,
    pub peer_path: PathId,
    pub inst: u64,
    pub peer_inst: u64,
}

pub struct Net {
    pub nodes: Vec<Node>,
    pub addrs: Vec<IpAddr>,
    pub kind: TransportKind,
    pub links: HashMap<(usize, PathId), Link>,
    pub now: Instant,
    pub wire: Vec<WireMsg>,
    pub hold_acks: bool,
    pub pending_acks: Vec<(usize, PathId, u64, u64)>,
    pub frozen: HashSet<(usize, u8)>,
    pub frozen_kicks: BTreeSet<(usize, PathId)>,
    pub refuse: HashSet<usize>,
    pub wakes: Vec<(usize, SockId)>,
    /// Receive flow control asked of the transport: (node, path, paused, seq).
    pub flows: Vec<(usize, PathInfo, bool, u64)>,
    pub connects: Vec<(usize, PathInfo, Instant)>,
    pub shutdowns: Vec<(usize, PathInfo)>,
    pub outcomes: Vec<(usize, RecvOutcome)>,
    /// Connects the acceptor deferred (`Accept::Defer`), offered again when
    /// the nodes are idle.
    pub deferred: Vec<(usize, PathInfo)>,
    /// What the link does with each message ([`Ideal`] unless a test
    /// wraps it in a `FaultInjector`).
    pub link: Box<dyn Wire>,
    /// Messages the link delayed, per sending (node, path), in order, with
    /// the connection they were sent on.
    pub delayed: BTreeMap<(usize, PathId), VecDeque<(Link, TxMessage)>>,
}

/// The configuration the tests start from: node `i` has generation number
/// 100 + i and PRNG seed i.
/// These tests pin the 6.1 kernel's wire byte for byte (`Mainline`: NPATHS
/// only, plain map headers); the default `Full` has its own tests
/// (`sim_regressions.rs`, `full_*`) and the simulator.
pub fn config(i: usize) -> NodeConfig {
    NodeConfig {
        gen_num: 100 + i as u32,
        seed: i as u64,
        handshake_exts: HandshakeExts::Mainline,
        ..NodeConfig::default()
    }
}

pub fn make_node(cfg: NodeConfig, addr: IpAddr, kind: TransportKind) -> Node {
    let mut node = Node::new(cfg);
    node.register_transport(match kind {
        TransportKind::Ib => TransportCaps::ib(),
        _ => TransportCaps::tcp(),
    });
    node.register_transport(TransportCaps::loopback());
    node.add_local(addr, kind);
    node
}

impl Net {
    /// `n` TCP nodes at 127.0.0.1 .. 127.0.0.n with default settings.
    pub fn new(n: usize) -> Net {
        Net::with_configs((0..n).map(config).collect(), TransportKind::Tcp)
    }

    pub fn with_configs(cfgs: Vec<NodeConfig>, kind: TransportKind) -> Net {
        let mut nodes = Vec::new();
        let mut addrs = Vec::new();
        for (i, cfg) in cfgs.into_iter().enumerate() {
            nodes.push(make_node(cfg, ip(i as u8 + 1), kind));
            addrs.push(ip(i as u8 + 1));
        }
        Net {
            nodes,
            addrs,
            kind,
            links: HashMap::new(),
            now: Instant::now(),
            wire: Vec::new(),
            hold_acks: false,
            pending_acks: Vec::new(),
            frozen: HashSet::new(),
            frozen_kicks: BTreeSet::new(),
            refuse: HashSet::new(),
            wakes: Vec::new(),
            flows: Vec::new(),
            connects: Vec::new(),
            shutdowns: Vec::new(),
            outcomes: Vec::new(),
            deferred: Vec::new(),
            link: Box::new(Ideal),
            delayed: BTreeMap::new(),
        }
    }

    pub fn node_of(&self, a: IpAddr) -> usize {
        self.addrs.iter().position(|x| *x == a).expect("known address")
    }

    /// A bound socket on node `i` (address 127.0.0.(i+1)).
    pub fn bound(&mut self, i: usize, port: u16) -> SockId {
        let s = self.nodes[i].socket();
        self.nodes[i].bind(s, SocketAddr::new(self.addrs[i], port)).unwrap();
        s
    }

    pub fn send(&mut self, i: usize, s: SockId, dst: SocketAddr, payload: &[u8]) -> Result<usize, Errno> {
        self.nodes[i].send(s, Some(dst), &Payload::copy_from(payload), &SendOptions::default())
    }

    /// Runs until nothing is left to do.
    pub fn run(&mut self) {
        for _ in 0..100_000 {
            let mut progress = false;
            for i in 0..self.nodes.len() {
                let Ok(k) = driver::drain_with(&mut At { net: self, i }, |a| Some(&mut a.net.nodes[a.i]));
                progress |= k > 0;
            }
            if !progress {
                // What the link delayed arrives (one path's messages at a
                // time, in the link's order of paths).
                if !self.delayed.is_empty() {
                    self.release_delayed();
                    continue;
                }
                // Deferred connects are offered again (they are still
                // current if the connector's path waits for them).
                let before = self.deferred.len();
                for (i, info) in std::mem::take(&mut self.deferred) {
                    if self.nodes[i].path_info(info.id).is_some_and(|p| p.inst == info.inst) {
                        self.handle(i, Output::Connect(info));
                    }
                }
                if self.deferred.len() == before || self.deferred.is_empty() && before == 0 {
                    return;
                }
            }
        }
        panic!("no quiescence");
    }

    /// Handles one output of node `i`.
    pub fn handle(&mut self, i: usize, o: Output) {
        let Ok(()) = driver::route(o, &mut At { net: self, i });
    }

    fn connect(&mut self, i: usize, info: PathInfo) {
        self.connects.push((i, info, self.now));
        let now = self.now;
        let j = self.node_of(info.faddr);
        if self.refuse.contains(&j) {
            self.nodes[i].path_down(info.id, info.inst, DownReason::ConnectFailed, now);
            return;
        }
        let port = 40000 + u16::from(info.id.index);
        match self.nodes[j].accept(info.kind, info.faddr, info.laddr, port, now) {
            Accept::Path(pinfo) => {
                self.links.insert(
                    (i, info.id),
                    Link { peer: j, peer_path: pinfo.id, inst: info.inst, peer_inst: pinfo.inst },
                );
                self.links.insert(
                    (j, pinfo.id),
                    Link { peer: i, peer_path: info.id, inst: pinfo.inst, peer_inst: info.inst },
                );
                self.nodes[i].path_up(info.id, info.inst, now);
            }
            Accept::Reject | Accept::RejectPeerLarger => {
                self.nodes[i].path_down(info.id, info.inst, DownReason::DirectionRule, now);
            }
            // Offered again when the nodes are idle (`run`).
            Accept::Defer => self.deferred.push((i, info)),
        }
    }

    fn kick(&mut self, i: usize, info: PathInfo) {
        if info.kind == TransportKind::Loop {
            self.serve_loop(i, info);
        } else if self.frozen.contains(&(i, info.id.index)) {
            self.frozen_kicks.insert((i, info.id));
        } else {
            while self.pull_some(i, info.id, 1 << 20) {}
        }
    }

    fn serve_loop(&mut self, i: usize, info: PathInfo) {
        loop {
            let mut out = Vec::new();
            let more = self.nodes[i].pull(info.id, info.inst, 1 << 20, &mut out);
            for m in out {
                self.wire.push(WireMsg {
                    from: i,
                    path: info.id,
                    header: m.header,
                    payload: m.payload.clone(),
                    ack_required: m.ack_required,
                });
                let rx = RxMessage::new(m.header, m.payload);
                let o = self.nodes[i].received(info.id, info.inst, rx);
                self.outcomes.push((i, o));
                self.nodes[i].acked(info.id, info.inst, m.header.sequence);
            }
            if !more {
                break;
            }
        }
    }

    /// One pull of at most about `budget` bytes on node `i`'s path, delivered
    /// to the peer at once. Returns whether more is queued.
    pub fn pull_some(&mut self, i: usize, p: PathId, budget: usize) -> bool {
        let Some(link) = self.links.get(&(i, p)).copied() else { return false };
        let mut out = Vec::new();
        let more = self.nodes[i].pull(p, link.inst, budget, &mut out);
        for m in out {
            self.wire.push(WireMsg {
                from: i,
                path: p,
                header: m.header,
                payload: m.payload.clone(),
                ack_required: m.ack_required,
            });
            // A path with delayed messages stays in order behind them.
            let verdict = if self.delayed.contains_key(&(i, p)) {
                Verdict::Delay
            } else {
                self.link.transmit(self.wire.last().expect("just pushed"))
            };
            match verdict {
                Verdict::Deliver => self.deliver(i, p, link, &m, true),
                Verdict::Duplicate => {
                    self.deliver(i, p, link, &m, false);
                    let mut again = m.clone();
                    again.header.flags |= wire::flags::RETRANSMITTED;
                    self.deliver(i, p, link, &again, true);
                }
                Verdict::Delay => self.delayed.entry((i, p)).or_default().push_back((link, m)),
                Verdict::Drop => {
                    self.cut(i, p);
                    return false;
                }
                Verdict::Cut => {
                    self.deliver(i, p, link, &m, false);
                    self.cut(i, p);
                    return false;
                }
            }
        }
        more
    }

    /// One message arrives at the peer of node `i`'s path; acked (or its
    /// ack held, `hold_acks`) if `ack`.
    fn deliver(&mut self, i: usize, p: PathId, link: Link, m: &TxMessage, ack: bool) {
        let rx = RxMessage::new(m.header, m.payload.clone());
        let o = self.nodes[link.peer].received(link.peer_path, link.peer_inst, rx);
        self.outcomes.push((link.peer, o));
        if ack && !m.is_cong_map() {
            if self.hold_acks {
                self.pending_acks.push((i, p, link.inst, m.header.sequence));
            } else {
                self.nodes[i].acked(p, link.inst, m.header.sequence);
            }
        }
    }

    /// The delayed messages of one path (the link picks which) arrive, in
    /// order; those of a connection that ended meanwhile are lost with it.
    pub fn release_delayed(&mut self) {
        let k = self.link.release(self.delayed.len()).min(self.delayed.len().saturating_sub(1));
        let Some(&key) = self.delayed.keys().nth(k) else { return };
        let q = self.delayed.remove(&key).unwrap_or_default();
        let (i, p) = key;
        for (link, m) in q {
            if self.links.get(&(i, p)).is_some_and(|l| l.inst == link.inst && l.peer_inst == link.peer_inst) {
                self.deliver(i, p, link, &m, true);
            }
        }
    }

    /// Delivers every held ack.
    pub fn flush_acks(&mut self) {
        for (i, p, inst, seq) in std::mem::take(&mut self.pending_acks) {
            self.nodes[i].acked(p, inst, seq);
        }
    }

    /// Serves the held kicks of a frozen path and unfreezes it.
    pub fn thaw(&mut self, i: usize, index: u8) {
        self.frozen.remove(&(i, index));
        let kicks: Vec<_> = self.frozen_kicks.iter().filter(|(n, p)| *n == i && p.index == index).copied().collect();
        for k in kicks {
            self.frozen_kicks.remove(&k);
            while self.pull_some(k.0, k.1, 1 << 20) {}
        }
    }

    /// Breaks the link of a path on both sides.
    pub fn cut(&mut self, i: usize, p: PathId) {
        if let Some(l) = self.links.remove(&(i, p)) {
            self.links.remove(&(l.peer, l.peer_path));
            let now = self.now;
            self.nodes[i].path_down(p, l.inst, DownReason::Closed, now);
            self.nodes[l.peer].path_down(l.peer_path, l.peer_inst, DownReason::Closed, now);
        }
    }

    /// Node `i` shut its path down: a link breaks ([`Net::cut`]); a connect
    /// the acceptor deferred is given up, and the path reported down as a
    /// transport does when it closes a connection still connecting (the
    /// path would otherwise wait for the end of a connection it never had).
    fn give_up(&mut self, i: usize, path: PathInfo) {
        if self.links.contains_key(&(i, path.id)) {
            self.cut(i, path.id);
            return;
        }
        self.end_deferred(DownReason::ShutdownDone, |n, d| n == i && d.id == path.id && d.inst == path.inst);
    }

    /// Ends the deferred connects `which` picks: each is reported down
    /// (`reason`) to the node that connected.
    fn end_deferred(&mut self, reason: DownReason, which: impl Fn(usize, &PathInfo) -> bool) {
        let (gone, kept): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.deferred).into_iter().partition(|(n, d)| which(*n, d));
        self.deferred = kept;
        let now = self.now;
        for (n, d) in gone {
            self.nodes[n].path_down(d.id, d.inst, reason, now);
        }
    }

    /// Breaks every connection of node `i`: its links, and the connects
    /// from it or to it that an acceptor deferred (each reported down to
    /// the node that connected, as its transport sees the connection
    /// close).
    pub fn cut_all(&mut self, i: usize) {
        let mut ps: Vec<PathId> = self.links.keys().filter(|(n, _)| *n == i).map(|(_, p)| *p).collect();
        ps.sort();
        for p in ps {
            self.cut(i, p);
        }
        let addr = self.addrs[i];
        self.end_deferred(DownReason::Closed, |n, d| n == i || d.faddr == addr);
    }

    /// Node `j` restarts as a new instance with `cfg`: its links die (the
    /// peers see the connections close), so do the connects it deferred
    /// (reported down to their nodes, as [`Net::cut_all`] does) and its own
    /// deferred connects (the old instance's: nobody is left to tell, and
    /// offered again they could pass for the new instance's paths), and it
    /// forgets everything.
    pub fn restart(&mut self, j: usize, cfg: NodeConfig) {
        let mut dead: Vec<(usize, PathId)> = self.links.iter().filter(|(_, l)| l.peer == j).map(|(k, _)| *k).collect();
        dead.sort();
        let now = self.now;
        for (i, p) in dead {
            let l = self.links.remove(&(i, p)).unwrap();
            self.links.remove(&(j, l.peer_path));
            self.nodes[i].path_down(p, l.inst, DownReason::Closed, now);
        }
        self.deferred.retain(|(n, _)| *n != j);
        let addr = self.addrs[j];
        self.end_deferred(DownReason::Closed, |_, d| d.faddr == addr);
        self.pending_acks.retain(|(n, ..)| *n != j);
        self.nodes[j] = make_node(cfg, self.addrs[j], self.kind);
    }

    pub fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        for n in &mut self.nodes {
            n.handle_timeout(self.now);
        }
    }

    /// Headers node `from` sent, in order.
    pub fn sent_by(&self, from: usize) -> Vec<WireMsg> {
        self.wire.iter().filter(|m| m.from == from).cloned().collect()
    }

    /// Data messages (not maps, probes or pongs) node `from` sent.
    pub fn data_sent_by(&self, from: usize) -> Vec<WireMsg> {
        self.wire
            .iter()
            .filter(|m| m.from == from && m.header.kind() == wire::Kind::Data && m.header.sport != 0)
            .cloned()
            .collect()
    }

    /// The path (lane) of each data message node `from` sent from port
    /// `sport`, in order.
    pub fn lanes_of(&self, from: usize, sport: u16) -> Vec<u8> {
        self.data_sent_by(from).iter().filter(|m| m.header.sport == sport).map(|m| m.path.index).collect()
    }

    pub fn conn(&self, i: usize, peer: usize) -> ConnId {
        self.nodes[i].find_conn(self.addrs[i], self.addrs[peer], self.kind).expect("connection exists")
    }

    pub fn path(&self, i: usize, peer: usize, index: u8) -> PathId {
        PathId { conn: self.conn(i, peer), index }
    }

    /// Drains every message queued on socket `s` of node `i`.
    pub fn drain(&mut self, i: usize, s: SockId) -> Vec<Received> {
        let mut v = Vec::new();
        while let Ok(r) = self.nodes[i].recv(s, false) {
            v.push(r);
        }
        v
    }

    /// Payloads of the data messages queued on socket `s` of node `i`.
    pub fn drain_payloads(&mut self, i: usize, s: SockId) -> Vec<Vec<u8>> {
        self.drain(i, s).into_iter().map(|r| data(r).payload.to_vec()).collect()
    }
}

/// The net as the dispatcher of node `i`'s outputs: an ideal link that
/// connects, transmits, cuts at once, and records.
struct At<'a> {
    net: &'a mut Net,
    i: usize,
}

impl Dispatch for At<'_> {
    type Error = Infallible;

    fn connect(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.net.connect(self.i, path);
        Ok(())
    }

    fn shutdown(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.net.shutdowns.push((self.i, path));
        self.net.give_up(self.i, path);
        Ok(())
    }

    fn kick(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.net.kick(self.i, path);
        Ok(())
    }

    fn rx_flow(&mut self, path: PathInfo, paused: bool, seq: u64) -> Result<(), Infallible> {
        self.net.flows.push((self.i, path, paused, seq));
        Ok(())
    }

    fn wake(&mut self, sock: SockId) -> Result<(), Infallible> {
        self.net.wakes.push((self.i, sock));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Node 0's path 1 connects while its path 0 sends nothing: node 1
    /// defers the connect until it hears node 0's probe on path 0.
    fn deferred_path_1() -> (Net, PathId) {
        let mut net = Net::new(2);
        let a = net.bound(0, 5001);
        net.bound(1, 4000);
        net.frozen.insert((0, 0));
        net.send(0, a, sa(2, 4000), b"m1").unwrap();
        net.run();
        let p1 = net.path(0, 1, 1);
        assert!(net.deferred.iter().any(|&(n, info)| n == 0 && info.id == p1), "{:?}", net.deferred);
        (net, p1)
    }

    #[test]
    fn cutting_every_connection_ends_a_deferred_connect() {
        let (mut net, p1) = deferred_path_1();
        net.cut_all(0);
        assert!(net.deferred.is_empty(), "{:?}", net.deferred);
        assert_ne!(net.nodes[0].path_state(p1), Some(PathState::Disconnecting));
    }

    #[test]
    fn a_restart_of_the_acceptor_ends_the_connects_it_deferred() {
        let (mut net, p1) = deferred_path_1();
        net.restart(1, config(1));
        assert!(net.deferred.is_empty(), "{:?}", net.deferred);
        assert_ne!(net.nodes[0].path_state(p1), Some(PathState::Disconnecting));
    }

    #[test]
    fn a_restart_of_the_connector_forgets_its_deferred_connects() {
        let (mut net, p1) = deferred_path_1();
        net.restart(0, config(0));
        assert!(net.deferred.is_empty(), "{:?}", net.deferred);
        // The new instance has no such path; nothing was reported to it.
        assert_eq!(net.nodes[0].path_state(p1), None);
    }

    #[test]
    fn shutting_a_deferred_connect_down_reports_it_down() {
        let (mut net, p1) = deferred_path_1();
        net.nodes[0].reset_path(p1);
        net.run();
        assert_eq!(net.shutdowns.iter().filter(|(n, info)| *n == 0 && info.id == p1).count(), 1);
        assert!(!net.deferred.iter().any(|&(n, info)| n == 0 && info.id == p1 && info.inst == 1), "{:?}", net.deferred);
        assert_ne!(net.nodes[0].path_state(p1), Some(PathState::Disconnecting));
    }
}
