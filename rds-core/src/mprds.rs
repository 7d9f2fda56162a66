//! Multipath RDS over TCP (mprds, `net/rds/send.c`'s `rds_send_mprds_hash`,
//! `recv.c`'s `rds_recv_hs_exthdrs`, `connection.c`'s peer generation): the
//! handshake (probe ping and pong carrying NPATHS, GEN_NUM, SPORT_IDX), lane
//! selection (below), the in-order fan-out of the extra paths and
//! peer restarts (generation numbers); the lane-0 hold (a socket's
//! messages sent on path 0 before the handshake keep its later messages
//! on other paths waiting) is [`crate::lane0`]'s. The state lives in
//! [`crate::path`]'s connection (`npaths`, `ping_triggered`, `peer_gen`,
//! `with_sport_idx`, `lane_socks`, ...), paths (`confirmed`, `inst_gen`)
//! and sockets (`lanes`).
//!
//! # Lanes
//!
//! The kernel sends each socket's messages on one path of a connection,
//! its lane, a hash of its port; the receiver takes any message on any
//! path. Ours fixes a socket's lane on a connection at its first message
//! either way once the path count is known (`Sock::lanes`), among the
//! lanes the fewest of our sockets hold (`Connection::lane_socks`):
//! - a socket whose first message is one it receives takes the path it
//!   came on if that is one of them (path 0: see below): its answers go
//!   back on the request's TCP connection, where each side's TCP ack
//!   rides on the other's data (on the lanes of the two sockets' ports, a
//!   request and its answer took two connections, each carrying data one
//!   way and acked by a segment of its own: 2 segments each way per round
//!   trip instead of 1);
//! - otherwise, and for a socket that sends first, its port's lane
//!   (`port % npaths`, which spreads consecutive ports) if that is one of
//!   them, else the lowest-numbered of them.
//!
//! Sockets of ours then spread over distinct lanes while there are free
//! ones, whichever way each began (a kernel that accepts the paths
//! numbers them by arrival, so its lane k may come on our path j: a
//! socket that answers on j and one whose port hashes to j would
//! otherwise share it). A message heard on path 0 may have been sent
//! before its sender knew the count, which then keeps its port's lane:
//! the lane it offers is the sender's port's (`sport % npaths`: right for
//! ours; for a kernel, whose lane is a hash of its port, a guess). A
//! socket that sent before the count was known keeps its port's lane
//! (`PORT_LANE`), held as the others' are from the moment the count is
//! known (`Node::count_port_lanes`). One lane per socket and connection,
//! as the kernel's: a socket's messages to a node stay in order. A kernel
//! peer is unaffected: it accepts any lane, and its answers follow its
//! hash.

use crate::connection::Connection;
use crate::message::{MsgFlags, QueuedMsg, RxMessage};
use crate::node::{HandshakeExts, Node};
use crate::path::{Path, PathState};
use crate::sock::PORT_LANE;
use crate::types::{ConnId, PathId, Payload, SockId};
use crate::wire::{self, Ext, Header, PROBE_PORT};

/// Pongs to probe pings (`PROBE_PORT`) queued on a path and never sent, at
/// most, before one more answers for the next probe ping too.
pub const PROBE_PONGS_QUEUED: usize = 8;

impl Node {
    /// Chooses the path for a message of a socket bound to `port`:
    /// (index, sent before the handshake, held behind the path-0 backlog).
    pub(crate) fn select_path(&mut self, s: SockId, conn: ConnId, port: u16) -> (usize, bool, bool) {
        let c = self.conn(conn);
        if c.paths.len() > 1 && c.npaths == 0 {
            // Not negotiated yet: ask the peer (rds_send_mprds_hash).
            self.maybe_probe(conn);
        }
        let backlog = self.sock(s).map_or(0, |k| k.lane0_count(conn));
        // The lane it had before the count became unknown again, if any
        // (looked up only while the count is unknown).
        let unknown = self.conn(conn).npaths == 0;
        let before =
            self.sock(s).filter(|_| unknown).and_then(|k| k.lanes.get(&conn).copied()).filter(|&l| l != PORT_LANE);
        let lane = self.take_lane(s, conn, port);
        self.conn(conn).select_path(s, lane, backlog, before.map(usize::from))
    }

    /// `RDS_MPATH_HASH`: the path of a socket bound to `port` that has no
    /// lane of its own on the connection yet (see `Node::take_lane`). The
    /// kernel hashes the port with a per-socket random value; we use the
    /// port modulo the path count, which spreads consecutive ports
    /// (rds-stress tasks) over distinct paths. The choice is local: the
    /// peer never needs it.
    pub fn lane_of(&self, conn: ConnId, port: u16) -> usize {
        self.conn(conn).lane_of(port)
    }

    /// The lane of socket `s` (bound to `port`) on `conn` for a message it
    /// sends now, fixed by its first message either way (module docs,
    /// "Lanes"): a socket that sends first, once the path count is known,
    /// takes its port's lane unless another lane is held by fewer of our
    /// sockets ([`Node::fix_lane`]); one that sent before the count was
    /// known keeps its port's lane (the lane-0 hold, `crate::lane0`,
    /// counts on it).
    pub(crate) fn take_lane(&mut self, s: SockId, conn: ConnId, port: u16) -> usize {
        let c = self.conn(conn);
        if c.paths.len() == 1 {
            return 0;
        }
        let (known, by_port) = (c.npaths != 0, c.lane_of(port));
        match self.sock(s).map(|k| k.lanes.get(&conn).copied()) {
            None => by_port,
            Some(Some(lane)) => c.fixed_lane(lane, by_port),
            Some(None) if known => self.fix_lane(s, conn, None, port),
            Some(None) => {
                self.sock_mut(s).expect("looked up above").lanes.insert(conn, PORT_LANE);
                by_port
            }
        }
    }

    /// The lane socket `s` uses on `conn` now, without fixing it (see
    /// `Node::take_lane`).
    pub(crate) fn lane_now(&self, s: SockId, conn: ConnId) -> Option<usize> {
        let c = self.conn(conn);
        let sock = self.sock(s)?;
        let by_port = c.lane_of(sock.bound?.port());
        Some(sock.lanes.get(&conn).map_or(by_port, |&lane| c.fixed_lane(lane, by_port)))
    }

    /// Socket `s` received a message from `conn`'s peer, sent from port
    /// `sport`, on path `index`: once the path count is known, its first
    /// such message fixes its lane on the connection unless a message it
    /// sent did first ([`Node::fix_lane`], offered the sender's lane). That
    /// is `index`, unless it is path 0: a message sent before its sender
    /// knew the count comes on path 0 (every message does, then), and a
    /// sender that sent one keeps its port's lane, which ours take modulo
    /// the count; the lane offered is then `sport` modulo the count (for a
    /// kernel's socket, whose lane is a hash of its port, a guess: at worst
    /// an answer on another connection, as on its port's lane).
    pub(crate) fn heard_on_lane(&mut self, s: SockId, conn: ConnId, index: u8, sport: u16) {
        let c = self.conn(conn);
        if c.paths.len() == 1 || c.npaths == 0 {
            return;
        }
        let heard = if index != 0 { usize::from(index) } else { c.lane_of(sport) };
        let Some(port) = self.sock(s).filter(|k| !k.lanes.contains_key(&conn)).and_then(|k| k.bound) else {
            return;
        };
        self.fix_lane(s, conn, Some(heard), port.port());
    }

    /// Fixes the lane of socket `s` (bound to `port`, with none on `conn`
    /// yet; the path count known) and returns it: among the lanes held by
    /// the fewest of our sockets (`Connection::lane_socks`), `heard` (the
    /// path a message from the peer came on, for the socket's first
    /// message being an answer) if it is one of them, else the port's lane
    /// if it is, else the lowest-numbered of them.
    pub(crate) fn fix_lane(&mut self, s: SockId, conn: ConnId, heard: Option<usize>, port: u16) -> usize {
        if self.sock(s).is_none() {
            return self.conn(conn).lane_of(port);
        }
        let c = self.conn_mut(conn);
        let (active, by_port) = (c.active_paths(), c.lane_of(port));
        let held = &c.lane_socks[..active];
        let least = held.iter().copied().min().unwrap_or(0);
        let lane = match heard {
            Some(h) if h < active && held[h] == least => h,
            _ if held[by_port] == least => by_port,
            _ => held.iter().position(|&n| n == least).unwrap_or(by_port),
        };
        c.lane_socks[lane] += 1;
        self.sock_mut(s).expect("looked up above").lanes.insert(conn, lane as u8);
        lane
    }

    /// The path count of `conn` just became known: each socket that sent
    /// to its peer before ([`PORT_LANE`]) now holds its port's lane, and
    /// counts in `Connection::lane_socks` like a lane fixed afterwards, so
    /// that sockets fixing theirs later spread around it (uncounted, one
    /// that first heard on that lane took it too: two sockets' messages on
    /// one path and another path idle). Walks the sockets once per
    /// negotiation (the count becomes unknown again only when every path
    /// went down), not per probe.
    fn count_port_lanes(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(conn) else { return };
        if c.paths.len() == 1 || c.npaths == 0 {
            return;
        }
        for sock in self.ep.socks.iter_mut().filter_map(|slot| slot.sock.as_mut()) {
            let Some(lane) = sock.lanes.get_mut(&conn).filter(|l| **l == PORT_LANE) else { continue };
            let by_port = c.lane_of(sock.bound.map_or(0, |b| b.port()));
            *lane = by_port as u8;
            c.lane_socks[by_port] += 1;
        }
    }

    /// Sends the multipath probe ping on path 0 if the path count is unknown
    /// and none is outstanding (`rds_send_ping`).
    pub(crate) fn maybe_probe(&mut self, conn: ConnId) {
        let caps = self.caps_of(self.conn(conn).kind);
        if !self.conn_mut(conn).start_probe(caps.mp_capable) {
            return;
        }
        self.ep.counters.mprds_probe_sent += 1;
        self.send_probe(PathId { conn, index: 0 }, PROBE_PORT, 0);
    }

    /// The first connection of a fresh connection object (no path of it was
    /// ever up, so nothing queued was ever transmitted): our probe goes
    /// first, numbered before the queued messages, and is the one message
    /// that passes the hold (`pull`). A 6.1 kernel whose map went out on
    /// another of its connections stays silent on this one until a message
    /// of ours asks for an answer; an rds-rs peer with `Full` reads our map
    /// before it (a crossed connection is dropped before the probe counts)
    /// and sends its own map first. Renumbering is safe: none of these
    /// sequence numbers was on a wire yet. (Also a confirm probe's way past
    /// the sockets' messages of a path not yet confirmed, `confirm_due`.)
    pub(crate) fn probe_first(&mut self, pid: PathId) {
        if let Some(path) = self.path_mut(pid) {
            path.probe_first();
        }
    }

    /// `rds_send_probe`: a zero-length control message (probe ping, pong).
    /// Probe pings and their pongs carry the handshake extension headers.
    /// Returns whether it was queued.
    pub(crate) fn send_probe(&mut self, pid: PathId, sport: u16, dport: u16) -> bool {
        let c = self.conn(pid.conn);
        let (faddr, kind) = (c.faddr, c.kind);
        if self.ep.cong.congested(&faddr, dport) {
            return false;
        }
        // A pong never transmitted yet answers every ping from that port
        // (a ping flood against a closed window must not grow the queue).
        // Not one that was on a wire before: a restart of the peer flushes
        // those, and a handshake pong must still reach its new instance.
        // Probe pings get a pong each, up to `PROBE_PONGS_QUEUED` waiting:
        // the peer counts them to learn what we read (`crate::lane0`).
        let room = if dport == PROBE_PORT { PROBE_PONGS_QUEUED } else { 1 };
        if sport == 0 && self.path(pid).is_some_and(|p| p.pongs_queued(dport, room)) {
            self.ep.counters.send_pong_coalesced += 1;
            return false;
        }
        // s_send_pong counts every probe queued: probe pings and all pongs.
        self.ep.counters.send_pong += 1;
        let mut hdr = Header::data(sport, dport, 0);
        let hs = (sport, dport) == (PROBE_PORT, 0) || (sport, dport) == (0, PROBE_PORT);
        if hs && self.caps_of(kind).mp_capable {
            let _ = hdr.push_extension(Ext::Npaths(u16::from(self.ep.cfg.npaths)));
            if self.ep.cfg.handshake_exts == HandshakeExts::Full {
                let _ = hdr.push_extension(Ext::GenNum(self.ep.cfg.gen_num));
            }
        }
        let msg = QueuedMsg {
            hdr,
            payload: Payload::empty(),
            sock: None,
            flags: MsgFlags::default(),
            rdma: None,
            lane0_of: None,
            gated: false,
        };
        self.connect_if_down(pid);
        self.enqueue(pid, msg);
        true
    }

    /// A GEN_NUM `gen_num` heard on path `pid` (in a probe, a pong or a
    /// Full map). Returns whether the path's connection speaks for the
    /// peer's current instance. A connection instance speaks for one peer
    /// instance: the first generation heard on it. A generation first heard
    /// on a connection older than the one that announced the current
    /// generation comes from a dead instance (a later connection reached
    /// the later instance): it is ignored, not taken for a restart.
    pub(crate) fn gen_heard(&mut self, pid: PathId, gen_num: u32) -> bool {
        if gen_num == 0 {
            return true;
        }
        match self.conn_mut(pid.conn).gen_heard(pid.index, gen_num) {
            GenHeard::Known(current) => current,
            GenHeard::First => {
                self.peer_gen_update(pid.conn, gen_num, pid.index);
                true
            }
        }
    }

    /// Our peer announced generation `inst` on path `on`
    /// (`rds_conn_peer_gen_update`): if it changed, the peer restarted, and
    /// messages the old instance may have seen are flushed.
    ///
    /// Unlike the kernel, our transmit sequence numbers keep growing: acks
    /// name messages by sequence number (the kernel's TCP acks by byte
    /// offset), so numbering restarted on a live connection left 40, 41
    /// then 1, 2 on the retransmit queue, and the ack of 2 could never
    /// release 40. The new instance accepts any number. Its own numbering
    /// starts again, so we forget the old instance's: at once on the path
    /// that heard the new generation, and on the others when they next
    /// connect (until then they may still deliver what the old instance
    /// sent, which the old receive state deduplicates).
    pub(crate) fn peer_gen_update(&mut self, conn: ConnId, gen_num: u32, on: u8) {
        let Some(old) = self.conn_mut(conn).peer_gen_update(gen_num, on) else { return };
        self.ep.counters.peer_restart += 1;
        for i in old {
            self.drop_path(PathId { conn, index: i });
        }
    }

    /// After the path count was (re)negotiated: messages queued on paths
    /// that are no longer used move to path 0 with new sequence numbers.
    pub(crate) fn rehome_paths(&mut self, conn: ConnId) {
        let n = self.conn(conn).active_paths();
        for m in self.conn_mut(conn).take_unused_paths() {
            self.enqueue(PathId { conn, index: 0 }, m);
        }
        for i in 1..n {
            self.kick(PathId { conn, index: i as u8 });
        }
    }

    /// The peer evidently took the path's connection: the next path may
    /// connect (`connect_worker`).
    pub(crate) fn confirm_path(&mut self, pid: PathId) {
        let Some(c) = self.conns.get_mut(pid.conn) else { return };
        if c.confirm(pid.index) {
            self.start_mprds(pid.conn);
            self.kick(pid);
        }
    }

    /// Starts the extra paths once the count is known (`rds_start_mprds`).
    pub(crate) fn start_mprds(&mut self, conn: ConnId) {
        for i in self.conn(conn).fanout() {
            self.connect_if_down(PathId { conn, index: i });
        }
    }

    /// `rds_recv_hs_exthdrs`: NPATHS (capped at ours; 1 when absent),
    /// GEN_NUM, SPORT_IDX.
    pub(crate) fn hs_exthdrs(&mut self, conn: ConnId, index: u8, msg: &RxMessage) {
        let ours = self.ep.cfg.npaths;
        let mut npaths = None;
        let mut gen_num = 0;
        let mut sport_idx = false;
        for e in msg.header.extensions() {
            match e {
                Ext::Npaths(n) => npaths = Some(n.min(u16::from(ours)) as u8),
                Ext::GenNum(g) => gen_num = g,
                Ext::SportIdx => sport_idx = true,
                _ => {}
            }
        }
        if !self.gen_heard(PathId { conn, index }, gen_num) {
            // A dead instance's probe or pong, late.
            return;
        }
        let unknown = self.conn(conn).npaths == 0;
        if self.conn_mut(conn).apply_handshake(npaths, sport_idx) {
            self.rehome_paths(conn);
        }
        if unknown {
            self.count_port_lanes(conn);
        }
        // The count is known: holds of acked messages ask the peer's proof
        // now (or end, with one path).
        self.ask_read_proof(conn, false);
    }
}

/// What a GEN_NUM heard on a path means (`Connection::gen_heard`).
pub(crate) enum GenHeard {
    /// The path's connection already spoke for a generation: whether it is
    /// the peer's current one.
    Known(bool),
    /// The first generation heard on this connection instance, and not a
    /// dead instance's: the peer's generation is now this one
    /// (`Connection::peer_gen_update`).
    First,
}

/// The multipath rules that need nothing but the connection.
impl Connection {
    /// The path for a message of socket `s` bound to `port` (see
    /// `Node::select_path`), given the socket's messages held on path 0
    /// (`lane0_backlog`) and the lane it had fixed before, if any
    /// (`before`): (index, sent before the handshake, held behind the
    /// path-0 backlog).
    pub(crate) fn select_path(
        &self,
        s: SockId,
        lane: usize,
        lane0_backlog: u32,
        before: Option<usize>,
    ) -> (usize, bool, bool) {
        if self.paths.len() == 1 {
            return (0, false, false);
        }
        if self.npaths == 0 {
            // Not negotiated yet: path 0. Negotiated again after every path
            // went down: a socket whose earlier messages still wait on
            // another path keeps that path, or the next ones would overtake
            // them on path 0. So does one that had a lane above 0: its
            // messages there may be acked by the peer's TCP and not read
            // yet (the old connection's last bytes), and the peer reads its
            // paths in any order (rds-sim seed 652995). They wait for the
            // count and the lane's next connection, which the peer reads
            // after the old one, and, as any message on a lane, for the
            // socket's messages held on path 0 (seed 642074).
            let waiting = (1..self.paths.len()).find(|&k| {
                let p = &self.paths[k];
                p.send_queue.iter().chain(p.retrans.iter()).any(|m| m.sock == Some(s))
            });
            if let Some(k) = waiting.or(before.filter(|&k| k > 0 && k < self.paths.len())) {
                return (k, false, lane0_backlog > 0);
            }
            return (0, true, false);
        }
        if lane == 0 {
            return (0, false, false);
        }
        (lane, false, lane0_backlog > 0)
    }

    /// Whether to send the multipath probe (see `Node::maybe_probe`): the
    /// path count is unknown and none is outstanding; it now is.
    pub(crate) fn start_probe(&mut self, mp_capable: bool) -> bool {
        if !mp_capable || self.npaths != 0 || self.ping_triggered {
            return false;
        }
        self.ping_triggered = true;
        true
    }

    /// The peer evidently took path `index`'s connection (see
    /// `Node::confirm_path`); returns whether that is news.
    pub(crate) fn confirm(&mut self, index: u8) -> bool {
        let Some(path) = self.paths.get_mut(usize::from(index)) else { return false };
        if path.confirmed || path.state != PathState::Up {
            return false;
        }
        path.confirmed = true;
        path.confirm_at = None;
        true
    }

    /// The paths the smaller side connects once the count is known
    /// (`rds_start_mprds`; each only when its turn comes, see
    /// `Connection::start_connect`).
    pub(crate) fn fanout(&self) -> std::ops::Range<u8> {
        if self.npaths > 1 && Node::is_smaller(&self.laddr, &self.faddr) { 0..self.active_paths() as u8 } else { 0..0 }
    }

    /// A congestion map arrived on path `on` (`digest`: its bitmap's,
    /// `cong::map_digest`): the peer took that path's connection, and
    /// perhaps the one connection of ours it had not yet shown it took (a
    /// 6.1 kernel sends its map when it accepts a connection, on whichever
    /// of its paths transmits first). Returns the paths to confirm, and
    /// how many it withheld the confirmation from.
    ///
    /// A kernel also sends its map when one of its sockets becomes
    /// congested or uncongested (`rds_cong_queue_updates`), with nothing
    /// accepted, and one map answers any number of accepts (one
    /// `c_map_queued` bit). So a map on another path confirms a pending
    /// connection (one started before the map, up or connecting, not
    /// confirmed) only when it is the only one pending and the map's
    /// bitmap is the one the previous map carried (an update changes it);
    /// otherwise their connect counts as started after this map, and what
    /// confirms them is a frame on them, the kernel's next map or the
    /// probe of `Node::confirm_due`. A connection confirmed wrongly is one
    /// that a kernel may still reset (no free slot in its accept) after its
    /// TCP acked our messages on it: they would be lost.
    pub(crate) fn map_received(&mut self, on: u8, digest: u64) -> (Vec<u8>, u64) {
        self.maps_rx += 1;
        let unchanged = self.last_map_digest.is_none_or(|d| d == digest);
        self.last_map_digest = Some(digest);
        let maps_rx = self.maps_rx;
        let pending: Vec<u8> = (0..self.paths.len() as u8)
            .filter(|&i| {
                let p = &self.paths[usize::from(i)];
                i != on
                    && p.maps_at_connect < maps_rx
                    && !p.confirmed
                    && matches!(p.state, PathState::Connecting | PathState::Up)
            })
            .collect();
        let mut confirm = vec![on];
        if unchanged && pending.len() == 1 {
            confirm.extend(pending);
            return (confirm, 0);
        }
        for &i in &pending {
            self.paths[usize::from(i)].maps_at_connect = maps_rx;
        }
        (confirm, pending.len() as u64)
    }

    /// `RDS_MPATH_HASH` (see [`Node::lane_of`]).
    pub(crate) fn lane_of(&self, port: u16) -> usize {
        usize::from(port) % self.active_paths()
    }

    /// The path of a socket whose lane here is `lane` (`Sock::lanes`):
    /// its port's, `by_port`, for [`PORT_LANE`], else `lane` (modulo the
    /// active paths, should the count have dropped since).
    pub(crate) fn fixed_lane(&self, lane: u8, by_port: usize) -> usize {
        match lane {
            PORT_LANE => by_port,
            lane => usize::from(lane) % self.active_paths(),
        }
    }

    /// A non-zero GEN_NUM heard on path `index` (see `Node::gen_heard`).
    pub(crate) fn gen_heard(&mut self, index: u8, gen_num: u32) -> GenHeard {
        let (peer_gen, gen_up_seq) = (self.peer_gen, self.gen_up_seq);
        let path = &mut self.paths[usize::from(index)];
        if path.inst_gen != 0 {
            return GenHeard::Known(path.inst_gen == peer_gen);
        }
        path.inst_gen = gen_num;
        let up_seq = path.up_seq;
        if gen_num != peer_gen && peer_gen != 0 && up_seq < gen_up_seq {
            return GenHeard::Known(false);
        }
        self.gen_up_seq = self.gen_up_seq.max(up_seq);
        GenHeard::First
    }

    /// The peer announced generation `gen_num` on path `on` (see
    /// `Node::peer_gen_update`). If it restarted, what the old instance may
    /// have seen is marked to flush, the receive sequences are forgotten,
    /// and the paths to drop are returned: those that came up before the
    /// one that announced the new generation reach the dead instance (a
    /// message first written on one now would be lost, then resent to the
    /// new instance as a retransmission, which it must take for its
    /// predecessor's and drop); they connect again, to the new one. None:
    /// no restart.
    ///
    /// The receive sequence is forgotten at once on `on` and on the paths
    /// whose connection came up after `on`'s and heard no other generation
    /// (they reach the new instance too, and have delivered nothing of it:
    /// its first frame on a connection, its map, carries its generation);
    /// on the others when they next connect (until then they may still
    /// deliver what the old instance sent, which the old receive state
    /// deduplicates). Deferred on a connection of the new instance too, the
    /// reset came at its next connection and forgot what it had delivered
    /// meanwhile: a message acked there too late and resent on the next
    /// connection was delivered twice (rds-sim seed 72441).
    pub(crate) fn peer_gen_update(&mut self, gen_num: u32, on: u8) -> Option<Vec<u8>> {
        if gen_num == 0 {
            return None;
        }
        let restarted = self.peer_gen != 0 && self.peer_gen != gen_num;
        self.peer_gen = gen_num;
        if !restarted {
            return None;
        }
        let fresh = self.paths[usize::from(on)].up_seq;
        for (i, path) in self.paths.iter_mut().enumerate() {
            let reaches_new =
                path.state == PathState::Up && path.up_seq > fresh && (path.inst_gen == 0 || path.inst_gen == gen_num);
            if i == usize::from(on) || reaches_new {
                path.next_rx_seq = 0;
                path.rx_reset = false;
            } else {
                path.rx_reset = true;
            }
            for m in path.retrans.iter_mut() {
                m.flags.flush = true;
            }
            for m in path.send_queue.iter_mut().filter(|m| m.flags.retransmitted) {
                m.flags.flush = true;
            }
            // Pongs never sent answer the dead instance's pings: the new
            // one would count them as answers to its own, and take its
            // messages for read (a lane-0 hold ended early: `crate::lane0`,
            // rds-sim seed 146582).
            path.send_queue.retain(|m| !m.is_pong());
        }
        Some(
            (0..self.paths.len())
                .filter(|&i| {
                    i != usize::from(on) && self.paths[i].state == PathState::Up && self.paths[i].up_seq < fresh
                })
                .map(|i| i as u8)
                .collect(),
        )
    }

    /// Applies a handshake's NPATHS (already capped at ours) and SPORT_IDX;
    /// returns whether the path count changed.
    pub(crate) fn apply_handshake(&mut self, npaths: Option<u8>, sport_idx: bool) -> bool {
        let before = self.npaths;
        if let Some(n) = npaths {
            self.npaths = n;
        }
        self.npaths = self.npaths.max(1).min(self.paths.len() as u8);
        self.ping_triggered = false;
        self.with_sport_idx = sport_idx;
        before != self.npaths
    }

    /// Messages queued on paths no longer used after the count was
    /// negotiated, in sequence order, unmarked for requeueing on path 0.
    pub(crate) fn take_unused_paths(&mut self) -> Vec<QueuedMsg> {
        let n = self.active_paths();
        let mut moved = Vec::new();
        for path in &mut self.paths[n..] {
            moved.extend(path.retrans.drain(..));
            moved.extend(path.send_queue.drain(..));
        }
        moved.sort_by_key(|m| m.hdr.sequence);
        for m in &mut moved {
            m.flags.retransmitted = false;
            m.hdr.flags &= !wire::flags::RETRANSMITTED;
            m.gated = false;
        }
        moved
    }
}

/// The multipath rules that need nothing but the path.
impl Path {
    /// Whether `n` (at least 1) or more pongs to `dport` are queued that
    /// were never on a wire (see `Node::send_probe`: the last answers every
    /// ping from that port); the scan stops at the `n`-th.
    pub(crate) fn pongs_queued(&self, dport: u16, n: usize) -> bool {
        self.send_queue
            .iter()
            .filter(|m| m.is_pong() && m.hdr.dport == dport && !m.flags.retransmitted && !m.flags.flush)
            .nth(n.saturating_sub(1))
            .is_some()
    }

    /// Puts our probe first (see `Node::probe_first`).
    pub(crate) fn probe_first(&mut self) {
        let Some(at) = self.send_queue.iter().position(QueuedMsg::is_probe) else { return };
        if at == 0 || self.send_queue.iter().any(|m| m.flags.retransmitted) {
            return;
        }
        let first = self.send_queue[0].hdr.sequence;
        let probe = self.send_queue.remove(at).unwrap();
        self.send_queue.push_front(probe);
        for (i, m) in self.send_queue.iter_mut().enumerate() {
            m.hdr.sequence = first + i as u64;
        }
    }
}
