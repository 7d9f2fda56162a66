//! A connection (`struct rds_connection`): the per-peer state of one
//! (local address, peer address, transport, TOS): its paths with their
//! queues and sequence numbers, the multipath handshake's results, and the
//! map owed; the node's table of them; and idle collection, which removes a
//! connection that stays down with nothing queued after
//! `NodeConfig::conn_idle_gc`, leaving its sequence state behind
//! (`ConnMemo`), and eviction at the peer limit (`make_room`).
//!
//! ## Endpoint and connection
//!
//! As quinn-proto splits `Endpoint` from `Connection`, the node keeps its
//! node-wide state (settings, transports, sockets and bound ports,
//! congestion maps, counters, outputs, timers, the receive budget) in an
//! `Endpoint` apart from its `ConnTable`, and a rule that concerns one
//! connection is a method of `Connection` or `Path` that takes what it
//! needs of the endpoint as arguments and returns what the endpoint must
//! do. Those that run on the connection (or path) alone:
//!
//! * send: `Path::enqueue`, `Path::transmit` / `more_to_send` (the
//!   transmit loop; a lane-hold test is passed in), `Path::take_acked`,
//!   `Path::rdma_done`, `Path::reset_for_retransmit`, `Connection::cancel`,
//!   `Connection::unsent`, `take_map_due`, `probe_passes_hold`;
//! * receive: `Path::rx_sequence` (the duplicate and stale rules);
//! * lifecycle: `Connection::start_connect`, `path_came_up`, `drop_path`,
//!   `path_went_down`, `unconfirmed_after`, `reconnects_after_down`,
//!   `accept_slot`, `kick`, `Path::backoff`, `Path::set_state`;
//! * mprds: `Connection::select_path`, `lane_of`, `start_probe`,
//!   `Path::pongs_queued`, `confirm`, `fanout`,
//!   `map_received`, `gen_heard`, `peer_gen_update`, `apply_handshake`,
//!   `take_unused_paths`, `Path::probe_first`;
//! * collection: `Connection::idle`, `has_queued`, `memo`, `restore`.
//!
//! The `Node` methods around them still need the whole node for what is
//! node-wide: outputs and timers, counters, sockets (send-buffer bytes,
//! notifications, lane-0 backlogs, wake-ups), congestion maps, the
//! connection table (loopback delivers on the reverse connection) and the
//! receive budget.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::node::{Node, Timer};
use crate::path::{Path, PathInfo, PathState};
use crate::types::{ConnId, PathId, TransportKind};
use crate::wire;

#[derive(Debug)]
pub(crate) struct Connection {
    pub id: ConnId,
    pub laddr: IpAddr,
    pub faddr: IpAddr,
    pub kind: TransportKind,
    pub tos: u8,
    pub paths: Vec<Path>,
    /// Negotiated path count; 0 until the handshake answered (mprds only).
    pub npaths: u8,
    /// A probe ping is outstanding (`c_ping_triggered`).
    pub ping_triggered: bool,
    /// The peer's last announced generation number (0 = none yet).
    pub peer_gen: u32,
    /// The peer encodes the path index in its TCP source port.
    pub with_sport_idx: bool,
    /// A congestion-map update is due (`c_map_queued`).
    pub map_queued: bool,
    /// The peer's congestion maps carry GEN_NUM and name the path they
    /// travel on: an rds-rs node with `HandshakeExts::Full`.
    pub peer_gen_maps: bool,
    /// A message from the peer arrived on some path of this connection.
    pub heard: bool,
    /// Paths that came up so far (numbers `Path::up_seq`).
    pub ups: u64,
    /// The latest `up_seq` of a path instance that announced `peer_gen`:
    /// a different generation heard on an older instance is a dead peer
    /// instance's leftover, not a restart.
    pub gen_up_seq: u64,
    /// Congestion maps received from the peer (`Path::confirmed`).
    pub maps_rx: u64,
    /// A digest of the bitmap of the peer's last map
    /// (`Connection::map_received`).
    pub last_map_digest: Option<u64>,
    /// The path a versionless peer's last map applied came on, its
    /// receive time and whether that time is its arrival
    /// (`RxMessage::rx_time_ns`, `rx_time_exact`); see `Node::map_order`.
    pub last_map: Option<(u8, u64, bool)>,
    /// When the idle collection looks at this connection next
    /// (`Node::collect_idle`); set when every path went down.
    pub gc_at: Option<Instant>,
    /// Evicted to make room for another peer (`NodeConfig::max_peers`): no
    /// longer counted, collected as soon as it is idle.
    pub evicted: bool,
    /// Per lane (path index): how many of our sockets have it as their
    /// lane on this connection (`Sock::lanes`, `Node::take_lane`).
    pub lane_socks: [u32; wire::MPATH_WORKERS],
}

impl Connection {
    /// A connection as `rds_conn_create` makes it: `slots` paths, none up,
    /// and the negotiated path count `npaths` (0 while the handshake is
    /// still to answer, on multipath transports; else 1).
    pub(crate) fn new(
        id: ConnId,
        laddr: IpAddr,
        faddr: IpAddr,
        kind: TransportKind,
        tos: u8,
        slots: usize,
        npaths: u8,
    ) -> Connection {
        Connection {
            id,
            laddr,
            faddr,
            kind,
            tos,
            paths: (0..slots).map(|_| Path::new()).collect(),
            npaths,
            ping_triggered: false,
            peer_gen: 0,
            with_sport_idx: false,
            map_queued: false,
            last_map: None,
            peer_gen_maps: false,
            heard: false,
            ups: 0,
            gen_up_seq: 0,
            maps_rx: 0,
            last_map_digest: None,
            gc_at: None,
            evicted: false,
            lane_socks: [0; wire::MPATH_WORKERS],
        }
    }

    pub fn path_id(&self, index: usize) -> PathId {
        PathId { conn: self.id, index: index as u8 }
    }

    pub fn info(&self, index: usize) -> PathInfo {
        PathInfo {
            id: self.path_id(index),
            inst: self.paths[index].inst,
            laddr: self.laddr,
            faddr: self.faddr,
            kind: self.kind,
            tos: self.tos,
            npaths: self.npaths,
            taken: self.paths[index].taken(),
        }
    }

    /// Paths usable for data right now: the negotiated count, or 1.
    pub fn active_paths(&self) -> usize {
        usize::from(self.npaths.max(1)).min(self.paths.len())
    }

    /// The path that carries congestion-map updates: the lowest-numbered
    /// path that is up. Map messages carry no sequence number, so they must
    /// all travel on one TCP stream: maps sent on two paths can be applied
    /// by the peer in the wrong order, leaving a stale "congested" bit.
    pub fn map_lane(&self) -> Option<usize> {
        self.paths.iter().position(|p| p.state == PathState::Up)
    }

    pub fn all_down(&self) -> bool {
        self.paths.iter().all(|p| p.state == PathState::Down)
    }
}

/// The node's connections by id. Ids grow and are never reused, so a
/// stale id (a socket's cached connection, a transport event, a timer) of
/// a collected connection finds nothing instead of another peer's; ids
/// iterate in creation order. Two vectors sorted by id (the ids apart, so
/// that a lookup's binary search reads one small array): a lookup is a few
/// comparisons, several per message, where the `BTreeMap` this was walked
/// its nodes; an insert appends (ids grow; past a wrap of the counter it
/// inserts in order) and a removal, rare, shifts the rest.
#[derive(Debug, Default)]
pub(crate) struct ConnTable {
    ids: Vec<ConnId>,
    conns: Vec<Connection>,
    next: u32,
}

impl ConnTable {
    fn pos(&self, id: ConnId) -> Option<usize> {
        self.ids.binary_search(&id).ok()
    }

    pub fn get(&self, id: ConnId) -> Option<&Connection> {
        self.pos(id).map(|i| &self.conns[i])
    }

    pub fn get_mut(&mut self, id: ConnId) -> Option<&mut Connection> {
        self.pos(id).map(|i| &mut self.conns[i])
    }

    pub fn contains(&self, id: ConnId) -> bool {
        self.pos(id).is_some()
    }

    /// The id the next inserted connection gets.
    pub fn next_id(&self) -> ConnId {
        ConnId(self.next)
    }

    pub fn insert(&mut self, c: Connection) {
        debug_assert_eq!(c.id, self.next_id());
        self.next = self.next.wrapping_add(1);
        match self.ids.binary_search(&c.id) {
            Ok(i) => self.conns[i] = c,
            Err(i) => {
                self.ids.insert(i, c.id);
                self.conns.insert(i, c);
            }
        }
    }

    pub fn remove(&mut self, id: ConnId) -> Option<Connection> {
        let i = self.pos(id)?;
        self.ids.remove(i);
        Some(self.conns.remove(i))
    }

    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Connection> {
        self.conns.iter()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Connection> {
        self.conns.iter_mut()
    }
}

impl std::ops::Index<ConnId> for ConnTable {
    type Output = Connection;
    fn index(&self, id: ConnId) -> &Connection {
        self.get(id).expect("connection exists")
    }
}

impl std::ops::IndexMut<ConnId> for ConnTable {
    fn index_mut(&mut self, id: ConnId) -> &mut Connection {
        self.get_mut(id).expect("connection exists")
    }
}

impl<'a> IntoIterator for &'a ConnTable {
    type Item = &'a Connection;
    type IntoIter = std::slice::Iter<'a, Connection>;
    fn into_iter(self) -> Self::IntoIter {
        self.conns.iter()
    }
}

/// What a collected connection leaves behind (`Node::collect_idle`): the
/// sequence state that the peer may still rely on. Its next transmit
/// numbers keep ours growing (a retransmission numbered below what the
/// peer already received would be dropped by its duplicate rule: lost),
/// its receive state keeps the duplicate and stale rules working for what
/// the peer still retransmits, and its generation tells whether the peer
/// restarted meanwhile.
#[derive(Clone, Debug)]
pub(crate) struct ConnMemo {
    pub paths: Vec<PathMemo>,
    pub peer_gen: u32,
    pub peer_gen_maps: bool,
    pub with_sport_idx: bool,
    pub heard: bool,
    /// `Node::map_versions` of the peer's address, if this was its last
    /// connection.
    pub map_version: Option<(u32, u64)>,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct PathMemo {
    pub next_tx_seq: u64,
    pub next_rx_seq: u64,
    pub rx_reset: bool,
    pub rx_any: bool,
    pub rx_conns: u64,
    pub inst: u64,
}

impl Connection {
    pub(crate) fn memo(&self) -> ConnMemo {
        ConnMemo {
            paths: self
                .paths
                .iter()
                .map(|p| PathMemo {
                    next_tx_seq: p.next_tx_seq,
                    next_rx_seq: p.next_rx_seq,
                    rx_reset: p.rx_reset,
                    rx_any: p.rx_any,
                    rx_conns: p.rx_conns,
                    inst: p.inst,
                })
                .collect(),
            peer_gen: self.peer_gen,
            peer_gen_maps: self.peer_gen_maps,
            with_sport_idx: self.with_sport_idx,
            heard: self.heard,
            map_version: None,
        }
    }

    /// Restores what a collected predecessor left (`Connection::memo`).
    pub(crate) fn restore(&mut self, m: &ConnMemo) {
        for (p, pm) in self.paths.iter_mut().zip(&m.paths) {
            p.next_tx_seq = pm.next_tx_seq;
            p.next_rx_seq = pm.next_rx_seq;
            p.rx_reset = pm.rx_reset;
            p.rx_any = pm.rx_any;
            p.rx_conns = pm.rx_conns;
            // Instances keep growing too: a transport event of the
            // predecessor's connection must not match the new one.
            p.inst = pm.inst;
        }
        self.peer_gen = m.peer_gen;
        self.peer_gen_maps = m.peer_gen_maps;
        self.with_sport_idx = m.with_sport_idx;
        self.heard = m.heard;
    }

    /// No socket's message queued, nothing scheduled, every path down
    /// (probes and pongs still queued go with the connection).
    pub(crate) fn idle(&self) -> bool {
        !self.has_queued() && self.paths.iter().all(|p| p.state == PathState::Down && p.reconnect_at.is_none())
    }

    /// Messages of sockets queued or unacked on any path (not probes and
    /// pongs: a peer is not worth reconnecting to, or keeping, for those).
    pub(crate) fn has_queued(&self) -> bool {
        self.paths.iter().any(|p| p.send_queue.iter().chain(p.retrans.iter()).any(|m| m.sock.is_some()))
    }
}

impl Node {
    /// Peers counted against `NodeConfig::max_peers`.
    pub(crate) fn peers(&self) -> usize {
        self.conns.iter().filter(|c| c.kind != TransportKind::Loop && !c.evicted).count()
    }

    /// Room for one more peer: at the limit the oldest peer that never sent
    /// a message and has nothing queued is evicted (its paths are shut
    /// down; it is collected once down). False when none can be, or when a
    /// quarter of the limit is already being evicted.
    pub(crate) fn make_room(&mut self) -> bool {
        if self.peers() < self.ep.cfg.max_peers {
            return true;
        }
        // Evicted peers hold their connections until their drain ends: at
        // most a quarter of the limit at a time, or a flood of new peers
        // would turn into a flood of draining connections.
        let evicting = self.conns.iter().filter(|c| c.evicted).count();
        if evicting >= (self.ep.cfg.max_peers / 4).max(1) {
            return false;
        }
        let victim = self
            .conns
            .iter()
            .find(|c| c.kind != TransportKind::Loop && !c.evicted && !c.heard && !c.has_queued())
            .map(|c| c.id);
        let Some(v) = victim else { return false };
        self.ep.counters.conn_evicted_silent += 1;
        self.conns[v].evicted = true;
        for i in 0..self.conns[v].paths.len() {
            self.drop_path(PathId { conn: v, index: i as u8 });
        }
        // (Already down, e.g. a larger peer's poke we answered: at once.)
        if self.conns[v].idle() {
            self.collect(v);
        }
        true
    }

    /// Every path of the connection went down: collect it once idle.
    pub(crate) fn conn_all_down(&mut self, c: ConnId, now: Instant) {
        let conn = &self.conns[c];
        if conn.kind == TransportKind::Loop {
            return;
        }
        if conn.evicted {
            self.collect_idle(c, now);
            return;
        }
        if let Some(idle) = self.ep.cfg.conn_idle_gc {
            if conn.gc_at.is_none() {
                let at = crate::types::later(now, idle);
                self.conns[c].gc_at = Some(at);
                self.schedule(at, Timer::Collect(c));
            }
        }
    }

    /// Collects the connection if it is idle (every path down, nothing
    /// queued or scheduled), remembering its sequence state; otherwise
    /// looks again after another idle period.
    pub(crate) fn collect_idle(&mut self, c: ConnId, now: Instant) {
        let Some(conn) = self.conns.get(c) else { return };
        if !conn.idle() {
            if conn.all_down() {
                let at = crate::types::later(now, self.ep.cfg.conn_idle_gc.unwrap_or(Duration::from_secs(1)));
                self.conns[c].gc_at = Some(at);
                self.schedule(at, Timer::Collect(c));
            }
            return;
        }
        self.collect(c);
    }

    /// Removes an idle connection, remembering its sequence state.
    pub(crate) fn collect(&mut self, c: ConnId) {
        // Receive flow control ends with the connection: the transport
        // forgets the pause (a later connection of the peer has a new id and
        // is paused again, if need be, by its first delivery).
        let mut paused: Vec<PathId> = self.ep.rx_paused.keys().copied().filter(|p| p.conn == c).collect();
        paused.sort();
        for pid in paused {
            self.ep.rx_paused.remove(&pid);
            if let Some(info) = self.path_info(pid) {
                self.push_rx_flow(info, false);
            }
        }
        let conn = self.conns.remove(c).unwrap();
        self.ep.counters.conn_collected += 1;
        let key = (conn.laddr, conn.faddr, conn.kind, conn.tos);
        self.conn_index.remove(&key);
        let mut memo = conn.memo();
        let last = !self.conns.iter().any(|o| o.faddr == conn.faddr);
        if last && !self.is_local(&conn.faddr) {
            // The peer's congestion map (8 KiB) goes with its last
            // connection; it sends it again on every new connection.
            self.ep.cong.maps.remove(&conn.faddr);
            memo.map_version = self.ep.cong.versions.remove(&conn.faddr);
        }
        for slot in self.ep.socks.iter_mut() {
            if let Some(k) = slot.sock.as_mut() {
                k.lane0_backlog.retain(|(lc, _)| *lc != c);
                k.lanes.remove(&c);
            }
        }
        if self.ep.cfg.conn_memo_max > 0 {
            while self.memos.len() >= self.ep.cfg.conn_memo_max {
                let Some(old) = self.memo_order.pop_front() else { break };
                self.memos.remove(&old);
            }
            self.memos.insert(key, memo);
            self.memo_order.push_back(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn conn(id: u32) -> Connection {
        let faddr = Ipv4Addr::new(10, 0, 1, (id % 250) as u8).into();
        Connection::new(ConnId(id), Ipv4Addr::new(10, 0, 0, 1).into(), faddr, TransportKind::Tcp, 0, 0, 1)
    }

    fn ids(t: &ConnTable) -> Vec<u32> {
        t.iter().map(|c| c.id.0).collect()
    }

    #[test]
    fn the_table_finds_live_ids_only_and_iterates_in_id_order() {
        let mut t = ConnTable::default();
        for _ in 0..300 {
            let id = t.next_id();
            t.insert(conn(id.0));
        }
        assert_eq!(t.len(), 300);
        // Collect every third connection.
        for id in (0..300).step_by(3) {
            assert_eq!(t.remove(ConnId(id)).map(|c| c.id), Some(ConnId(id)));
        }
        assert!(t.remove(ConnId(0)).is_none(), "a removed id is gone");
        assert_eq!(t.len(), 200);
        for id in 0..300 {
            assert_eq!(t.contains(ConnId(id)), id % 3 != 0, "id {id}");
            assert_eq!(t.get(ConnId(id)).map(|c| c.id.0), (id % 3 != 0).then_some(id));
        }
        // Ids are never reused: the next one is 300, and a stale id finds nothing.
        let next = t.next_id();
        assert_eq!(next, ConnId(300));
        t.insert(conn(next.0));
        assert!(t.get(ConnId(3)).is_none());
        t[ConnId(301 - 1)].tos = 7;
        assert_eq!(t.get(ConnId(300)).unwrap().tos, 7);
        t.get_mut(ConnId(1)).unwrap().tos = 9;
        assert_eq!(t[ConnId(1)].tos, 9);
        let want: Vec<u32> = (0..=300).filter(|i| i % 3 != 0 || *i == 300).collect();
        assert_eq!(ids(&t), want);
        assert_eq!((&t).into_iter().count(), want.len());
        assert!(t.iter_mut().all(|c| c.id.0 % 3 != 0 || c.id.0 == 300));
    }

    #[test]
    fn ids_past_the_counter_wrap_iterate_in_id_order() {
        let mut t = ConnTable { next: u32::MAX - 1, ..ConnTable::default() };
        for _ in 0..4 {
            let id = t.next_id();
            t.insert(conn(id.0));
        }
        // As the BTreeMap it replaces: the wrapped ids sort first.
        assert_eq!(ids(&t), vec![0, 1, u32::MAX - 1, u32::MAX]);
        assert_eq!(t.get(ConnId(u32::MAX)).map(|c| c.id), Some(ConnId(u32::MAX)));
        assert_eq!(t.get(ConnId(1)).map(|c| c.id), Some(ConnId(1)));
    }
}
