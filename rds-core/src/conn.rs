//! Connections and paths: the kernel's `rds_connection` / `rds_conn_path`
//! and their state machine.
//!
//! States and transitions are the kernel's: any state -> ERROR,
//! UP -> DISCONNECTING, ERROR -> DISCONNECTING, DISCONNECTING -> DOWN,
//! DOWN -> CONNECTING, CONNECTING -> UP. Sequence numbers and retransmit queues survive transport reconnects; a
//! connection that stays down with nothing queued is collected after
//! `NodeConfig::conn_idle_gc`, leaving its sequence state behind
//! (`ConnMemo`).

use std::collections::VecDeque;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::message::QueuedMsg;
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
    /// Our first map on this connection is still to be sent.
    pub hello_owed: bool,
    /// The peer generation this connection instance speaks for: the first
    /// GEN_NUM heard on it (0 = none yet).
    pub inst_gen: u32,
    /// When this instance came up, in the connection's order of path ups.
    pub up_seq: u64,
    /// Path 0: cancelled messages that were on the wire and held their
    /// sockets' lanes (pre-handshake messages, see `QueuedMsg::lane0_of`),
    /// by sequence: the hold lasts until this path's acks pass them.
    pub lane0_wire: Vec<(u64, SockId)>,
    /// The peer evidently took this connection: a frame arrived on it, or
    /// a congestion map arrived on any path after we started connecting it
    /// (a 6.1 kernel sends its map whenever it accepts a connection). The
    /// smaller side connects path i+1 only after path i is confirmed
    /// (`connect_worker`).
    pub confirmed: bool,
    /// `Conn::maps_rx` when this connection attempt started.
    pub maps_at_connect: u64,
    /// A sequenced message was accepted on this path (any connection).
    pub rx_any: bool,
    /// Connections of this path that the peer may have sent on: accepted
    /// ones, and our own attempts unless they were the larger address's
    /// poke (the peer never sends on those).
    pub rx_conns: u64,
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
            hello_owed: false,
            inst_gen: 0,
            up_seq: 0,
            lane0_wire: Vec::new(),
            confirmed: false,
            maps_at_connect: 0,
            rx_any: false,
            rx_conns: 0,
        }
    }

    /// Messages and bytes on the send and retransmit queues.
    pub fn queued(&self) -> (usize, usize) {
        let n = self.send_queue.len() + self.retrans.len();
        let b = self.send_queue.iter().chain(self.retrans.iter()).map(|m| m.payload.len()).sum();
        (n, b)
    }
}

#[derive(Debug)]
pub(crate) struct Conn {
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
    /// When the idle collection looks at this connection next
    /// (`Node::collect_idle`); set when every path went down.
    pub gc_at: Option<Instant>,
    /// Evicted to make room for another peer (`NodeConfig::max_peers`): no
    /// longer counted, collected as soon as it is idle.
    pub evicted: bool,
}

impl Conn {
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
/// iterate in creation order.
#[derive(Debug, Default)]
pub(crate) struct ConnTable {
    map: std::collections::BTreeMap<ConnId, Conn>,
    next: u32,
}

impl ConnTable {
    pub fn get(&self, id: ConnId) -> Option<&Conn> {
        self.map.get(&id)
    }

    pub fn get_mut(&mut self, id: ConnId) -> Option<&mut Conn> {
        self.map.get_mut(&id)
    }

    pub fn contains(&self, id: ConnId) -> bool {
        self.map.contains_key(&id)
    }

    /// The id the next inserted connection gets.
    pub fn next_id(&self) -> ConnId {
        ConnId(self.next)
    }

    pub fn insert(&mut self, c: Conn) {
        debug_assert_eq!(c.id, self.next_id());
        self.next = self.next.wrapping_add(1);
        self.map.insert(c.id, c);
    }

    pub fn remove(&mut self, id: ConnId) -> Option<Conn> {
        self.map.remove(&id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Conn> {
        self.map.values()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Conn> {
        self.map.values_mut()
    }
}

impl std::ops::Index<ConnId> for ConnTable {
    type Output = Conn;
    fn index(&self, id: ConnId) -> &Conn {
        &self.map[&id]
    }
}

impl std::ops::IndexMut<ConnId> for ConnTable {
    fn index_mut(&mut self, id: ConnId) -> &mut Conn {
        self.map.get_mut(&id).expect("connection exists")
    }
}

impl<'a> IntoIterator for &'a ConnTable {
    type Item = &'a Conn;
    type IntoIter = std::collections::btree_map::Values<'a, ConnId, Conn>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.values()
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

impl Conn {
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

    /// Restores what a collected predecessor left (`Conn::memo`).
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
        !self.has_queued()
            && self
                .paths
                .iter()
                .all(|p| p.state == PathState::Down && p.reconnect_at.is_none() && p.lane0_wire.is_empty())
    }

    /// Messages of sockets queued or unacked on any path (not probes and
    /// pongs: a peer is not worth reconnecting to, or keeping, for those).
    pub(crate) fn has_queued(&self) -> bool {
        self.paths.iter().any(|p| p.send_queue.iter().chain(p.retrans.iter()).any(|m| m.sock.is_some()))
    }
}

#[cfg(test)]
mod tests {
    use super::PathState::*;

    #[test]
    fn kernel_transitions() {
        assert!(Down.can_go(Connecting));
        assert!(Connecting.can_go(Up));
        assert!(Up.can_go(Disconnecting));
        assert!(Error.can_go(Disconnecting));
        assert!(Disconnecting.can_go(Down));
        assert!(Up.can_go(Error) && Down.can_go(Error));
        assert!(!Down.can_go(Up));
        assert!(!Up.can_go(Down));
        assert!(!Connecting.can_go(Down));
    }
}
