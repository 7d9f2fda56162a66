//! Congestion maps: one 65536-bit bitmap per address, and the rules that
//! maintain, send, receive and test them (`net/rds/cong.c`).
//!
//! Port `p` is bit `p % 8` of byte `p / 8` (the kernel's little-endian bit
//! order over two 4 KiB pages). A local map says which of our ports are
//! congested and is sent to peers; a peer's map (received in a
//! congestion-map message) says which of its ports we must not send to.

use std::net::IpAddr;

use crate::message::RxMessage;
use crate::node::{HandshakeExts, Node};
use crate::recv::RecvOutcome;
use crate::sock::Sock;
use crate::types::{ConnId, FastMap, PathId, SockId, TransportKind};
use crate::wire::{CONG_MAP_BYTES, Ext, Header, PROBE_PORT, WireError};

/// How close together (by their receive times, when neither time says the
/// order) two maps of a peer without map versions must be, on different
/// paths, for their order to count as unknown (see `Node::map_order`):
/// 5 ms. The reordered pairs seen in the
/// VM rig were sent 0.5 and 1.7 ms apart and read closer still. It was
/// 50 ms, and that window also caught maps in their right order: in the
/// kernel conformance scenario "congestion us->kernel" a kernel's "port
/// congested" map, read within 50 ms of an earlier map on another path,
/// was taken as "uncongested", and our sender never saw the port
/// congested (three of four suites on 2026-11-27).
pub const MAP_REORDER_NS: u64 = 5_000_000;

/// A digest of a received congestion map's bytes (64-bit FNV-1a over
/// its 8-byte words, and over the bytes of a tail), to tell whether a
/// peer's map changed since its previous one without keeping a copy
/// (`Connection::map_received`).
pub(crate) fn map_digest(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().unwrap())).wrapping_mul(PRIME);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h
}

/// The node's congestion state (`net/rds/cong.c`): one map per address,
/// ours (maintained by our sockets' receive accounting, sent to peers) and
/// peers' (applied from their updates, tested before every send), and with
/// `HandshakeExts::Full` the maps' versions. Connections owe a map update
/// (`Connection::map_queued`) and carry it on their map lane.
#[derive(Debug, Default)]
pub(crate) struct Congestion {
    /// Congestion maps by address: ours (maintained by our sockets) and
    /// peers' (from their updates).
    pub maps: FastMap<IpAddr, CongMap>,
    /// `HandshakeExts::Full` map versions: for our addresses (our
    /// generation, last version sent), for peers' (their generation, last
    /// version applied). See `Node::map_header`.
    pub versions: FastMap<IpAddr, (u32, u64)>,
    /// Our addresses where a socket became congested since a map of the
    /// address was last taken for transmit: only a socket of one of these
    /// can be congested without its congestion announced
    /// (`Node::map_taken`, which walks the sockets for these alone: a map
    /// goes to every connection of its address, and each one's pull walked
    /// every socket of the node before).
    pub unannounced: Vec<IpAddr>,
    /// The sockets a map update concerns (`Node::cong_map_updated`): those
    /// whose send found a port congested (`Sock::seen_congestion`, set
    /// once), the only ones a monitor's notification can be for (its
    /// port-group mask is what its non-blocking sends found congested). A
    /// closed one stays until an update or a compaction drops it
    /// (`Node::cong_watch`). An update walked every socket of the node
    /// before.
    pub watchers: Vec<SockId>,
}

impl Congestion {
    /// Whether `port` of `addr` is congested (`rds_cong_wait`'s test).
    pub fn congested(&self, addr: &IpAddr, port: u16) -> bool {
        self.maps.get(addr).is_some_and(|m| m.test(port))
    }

    /// The map of `addr`, created empty if there is none yet.
    pub fn map(&mut self, addr: IpAddr) -> &mut CongMap {
        self.maps.entry(addr).or_default()
    }

    /// The header of a congestion-map update from our address `laddr` (see
    /// `Node::map_header`); `full_gen`: our generation with
    /// `HandshakeExts::Full`, which numbers the maps of each address.
    pub fn map_header(&mut self, laddr: IpAddr, index: u8, hello: bool, full_gen: Option<u32>) -> Header {
        let mut h = Header::cong_map();
        if let Some(gen_num) = full_gen {
            h.sport = u16::from(index);
            h.dport = if hello { PROBE_PORT } else { 0 };
            let _ = h.push_extension(Ext::GenNum(gen_num));
            let v = self.versions.entry(laddr).or_insert((gen_num, 0));
            v.1 += 1;
            h.sequence = v.1;
        }
        h
    }

    /// Whether a map of `faddr` of generation `gen_num` and version
    /// `version` is newer than the last one applied (then it is the last
    /// one applied now); an older one came the other way round.
    pub fn newer(&mut self, faddr: IpAddr, gen_num: u32, version: u64) -> bool {
        let last = self.versions.entry(faddr).or_insert((0, 0));
        if last.0 == gen_num && version <= last.1 {
            return false;
        }
        *last = (gen_num, version);
        true
    }
}

/// The congestion rule that needs nothing but the socket.
impl Sock {
    /// `rds_recv_rcvbuf_delta`'s hysteresis: the socket becomes congested
    /// above its receive buffer and uncongested below half of it. Returns
    /// the change, if any. Sockets of the loop transport (bound to 127/8 or
    /// ::1) are never congested.
    pub(crate) fn congestion_change(&mut self) -> Option<bool> {
        if self.transport == Some(TransportKind::Loop) {
            return None;
        }
        let limit = self.rcvbuf_limit();
        if !self.congested && self.rcv_bytes > limit {
            self.congested = true;
            Some(true)
        } else if self.congested && self.rcv_bytes < limit / 2 {
            self.congested = false;
            Some(false)
        } else {
            None
        }
    }
}

/// `RDS_CONG_MONITOR_MASK(port)`: the port group bit of a port.
pub fn monitor_mask(port: u16) -> u64 {
    1u64 << (port % 64)
}

/// A 65536-port congestion bitmap.
#[derive(Clone, PartialEq, Eq)]
pub struct CongMap {
    bits: Box<[u8; CONG_MAP_BYTES]>,
}

impl Default for CongMap {
    fn default() -> Self {
        CongMap { bits: Box::new([0; CONG_MAP_BYTES]) }
    }
}

impl std::fmt::Debug for CongMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set: Vec<u16> = self.congested_ports().take(16).collect();
        write!(f, "CongMap{set:?}")
    }
}

impl CongMap {
    pub fn new() -> CongMap {
        CongMap::default()
    }

    /// Parses a congestion-map payload; it must be exactly 8192 bytes.
    pub fn from_wire(payload: &[u8]) -> Result<CongMap, WireError> {
        let arr: &[u8; CONG_MAP_BYTES] =
            payload.try_into().map_err(|_| WireError::BadCongMapLen { len: payload.len() as u32 })?;
        Ok(CongMap { bits: Box::new(*arr) })
    }

    /// The 8192-byte wire form.
    pub fn as_bytes(&self) -> &[u8; CONG_MAP_BYTES] {
        &self.bits
    }

    pub fn set(&mut self, port: u16) {
        self.bits[usize::from(port / 8)] |= 1 << (port % 8);
    }

    pub fn clear(&mut self, port: u16) {
        self.bits[usize::from(port / 8)] &= !(1 << (port % 8));
    }

    pub fn test(&self, port: u16) -> bool {
        self.bits[usize::from(port / 8)] & (1 << (port % 8)) != 0
    }

    /// Ports whose bit is set, ascending.
    pub fn congested_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.bits
            .iter()
            .enumerate()
            .flat_map(|(i, b)| (0..8u16).filter(move |bit| b & (1 << bit) != 0).map(move |bit| (i as u16) * 8 + bit))
    }

    /// Replaces this map with `new` and returns the port-group mask of ports
    /// that went from congested to uncongested (what IB reports to
    /// RDS_CONG_MONITOR users; TCP in the kernel reports all ones).
    pub fn update_from(&mut self, new: &CongMap) -> u64 {
        // Port p is bit p % 64 of little-endian word p / 64, and its group
        // bit is p % 64: the mask is the union of the words' cleared bits.
        let mut mask = 0u64;
        for (old, new) in self.bits.chunks_exact(8).zip(new.bits.chunks_exact(8)) {
            let old = u64::from_le_bytes(old.try_into().unwrap());
            let new = u64::from_le_bytes(new.try_into().unwrap());
            mask |= old & !new;
        }
        *self.bits = *new.bits;
        mask
    }

    /// Keeps only the ports congested both here and in `new` (two maps
    /// whose order is unknown, `Node::map_order`); returns the mask of
    /// [`CongMap::update_from`].
    pub fn intersect_from(&mut self, new: &CongMap) -> u64 {
        let mut both = new.clone();
        for (b, o) in both.bits.iter_mut().zip(self.bits.iter()) {
            *b &= o;
        }
        self.update_from(&both)
    }
}

impl Node {
    /// Applies the socket's hysteresis ([`Sock::congestion_change`]) to
    /// our map, and tells the peers when the rule below says so;
    /// `arrival`: the check follows a message queued on the socket.
    ///
    /// # When the peers hear of it
    ///
    /// The kernel queues a map update to every connection of the address
    /// at each change (`rds_cong_queue_updates`). We announce a socket's
    /// congestion when it holds a message back: at the first message that
    /// arrives while the socket is congested, not at the one that crossed
    /// the line; an update that leaves meanwhile for another reason (a
    /// port of the same address, a new connection's map) announces it
    /// too (`Node::map_taken`). A congestion that a reader ends before the
    /// next message arrives is never sent, and neither is its end
    /// (`cong_update_spared`); the end of an announced one is sent at
    /// once, as in the kernel. A reader of 64 KiB messages with the
    /// default buffer (congested above two queued, uncongested when none
    /// is) flipped with almost every pair it drained when its node read
    /// ahead of it: in the VM rig, qperf `rds_bw` of 64 KiB under the
    /// shim queued 1,802 updates in 5 s for 7,089 messages (the kernel's
    /// RDS 79 for 11,208), 8 KiB each, to every connection of the
    /// address; with this rule 360 for 8,189 (380 spared), and the
    /// stream ran at 134 MB/s against 118. What a peer may send in the
    /// meantime is what the kernel's peer sends while an update travels:
    /// one message more per congestion, which the receiver queues as it
    /// queues any (a map never drops a message). Local senders test the
    /// map itself and see every change at once.
    pub(crate) fn recheck_congestion(&mut self, s: SockId, arrival: bool) {
        let Some(sock) = self.sock_mut(s) else { return };
        let Some(bound) = sock.bound else { return };
        let (addr, port) = (bound.ip(), bound.port());
        match sock.congestion_change() {
            Some(true) => {
                sock.cong_announced = false;
                if !self.ep.cong.unannounced.contains(&addr) {
                    self.ep.cong.unannounced.push(addr);
                }
                self.ep.cong.maps.entry(addr).or_default().set(port);
                self.cong_map_updated(0);
            }
            Some(false) => {
                let announced = std::mem::take(&mut sock.cong_announced);
                self.ep.cong.maps.entry(addr).or_default().clear(port);
                if announced {
                    self.cong_queue_updates(addr);
                } else {
                    self.ep.counters.cong_update_spared += 1;
                }
                self.cong_map_updated(crate::cong::monitor_mask(port));
            }
            None if arrival && sock.congested && !sock.cong_announced => {
                sock.cong_announced = true;
                self.cong_queue_updates(addr);
            }
            None => {}
        }
    }

    /// `rds_cong_queue_updates`: every connection from this address owes
    /// the peer our map.
    pub(crate) fn cong_queue_updates(&mut self, addr: IpAddr) {
        let conns: Vec<ConnId> =
            self.conns.iter().filter(|c| c.laddr == addr && c.kind != TransportKind::Loop).map(|c| c.id).collect();
        for c in conns {
            self.queue_map(c);
        }
    }

    /// Our map of `laddr` was taken for transmit: the congestion of every
    /// socket bound there that it carries is announced, and its end must
    /// follow (`recheck_congestion`).
    pub(crate) fn map_taken(&mut self, laddr: IpAddr) {
        // No socket of `laddr` became congested since its last map was
        // taken: every congested one is announced already.
        let Some(i) = self.ep.cong.unannounced.iter().position(|a| *a == laddr) else { return };
        self.ep.cong.unannounced.swap_remove(i);
        for slot in self.ep.socks.iter_mut() {
            if let Some(sock) = slot.sock.as_mut()
                && sock.congested
                && sock.bound.is_some_and(|b| b.ip() == laddr)
            {
                sock.cong_announced = true;
            }
        }
    }

    /// `rds_cong_map_updated`: wake blocked senders and notify monitoring
    /// sockets of the port groups that were uncongested.
    pub(crate) fn cong_map_updated(&mut self, uncongested: u64) {
        self.ep.counters.cong_update_received += 1;
        self.wake_writers();
        let mut woken = Vec::new();
        let mut watchers = std::mem::take(&mut self.ep.cong.watchers);
        watchers.retain(|&s| {
            let Some(sock) = self.sock_mut(s) else { return false };
            if sock.cong_monitor {
                let n = sock.cong_mask & uncongested;
                if n != 0 {
                    sock.cong_notify |= n;
                    sock.cong_mask &= !n;
                    woken.push(s);
                }
            } else {
                sock.cong_poll_pending = true;
                woken.push(s);
            }
            true
        });
        self.ep.cong.watchers = watchers;
        // In the sockets' order, as a walk of them woke them.
        woken.sort_unstable_by_key(|s| s.idx);
        for s in woken {
            self.wake(s, false);
        }
    }

    /// Lists socket `s`, whose send met congestion for the first time,
    /// among `Congestion::watchers`. A closing socket is not looked for
    /// there (a close stays O(1)); instead the list drops the closed ones
    /// when it holds twice as many entries as there are socket slots, so it
    /// never holds more, and after a compaction it takes at least as many
    /// pushes as there are slots before the next one.
    pub(crate) fn cong_watch(&mut self, s: SockId) {
        if self.ep.cong.watchers.len() >= 2 * self.ep.socks.len() {
            let mut watchers = std::mem::take(&mut self.ep.cong.watchers);
            watchers.retain(|&w| self.ep.sock(w).is_some());
            self.ep.cong.watchers = watchers;
        }
        self.ep.cong.watchers.push(s);
    }

    /// Owes the peer our congestion map on this connection and kicks the
    /// path that carries maps.
    pub(crate) fn queue_map(&mut self, conn: ConnId) {
        if !std::mem::replace(&mut self.conn_mut(conn).map_queued, true) {
            self.ep.counters.cong_update_queued += 1;
        }
        match self.conn(conn).map_lane() {
            Some(lane) => self.kick(PathId { conn, index: lane as u8 }),
            // No path up: connect (reconnects are only for something to
            // send, and the map is).
            None if self.conn(conn).kind != TransportKind::Loop => self.connect_if_down(PathId { conn, index: 0 }),
            None => {}
        }
    }

    /// The header of a congestion-map update from our address `laddr`.
    /// With `HandshakeExts::Full` it also carries our GEN_NUM, the index of
    /// the path it travels on (h_sport) and a version (h_sequence, growing
    /// per address): the map lane moves when paths go down and come up, so
    /// two maps can travel on different connections and arrive in the
    /// wrong order; the receiver applies only newer versions. The first map
    /// on a path that is not the map lane is a hello (h_dport 1): its
    /// receiver takes the generation and the path from it, not the bitmap.
    /// Kernels read nothing of a map's header but h_len and h_flags.
    pub(crate) fn map_header(&mut self, laddr: IpAddr, index: u8, hello: bool) -> Header {
        let full = self.ep.cfg.handshake_exts == HandshakeExts::Full;
        self.ep.cong.map_header(laddr, index, hello, full.then_some(self.ep.cfg.gen_num))
    }

    /// A congestion-map message: must be exactly 8192 bytes. It updates our
    /// copy of the peer address's map and wakes whoever waits on it.
    pub(crate) fn cong_recv(&mut self, pid: PathId, msg: &RxMessage) -> RecvOutcome {
        if msg.header.len as usize != CONG_MAP_BYTES || msg.payload.len() != CONG_MAP_BYTES {
            self.ep.counters.recv_drop_bad_frame += 1;
            self.drop_path(pid);
            return RecvOutcome::ProtocolError;
        }
        let Ok(new) = CongMap::from_wire(&msg.payload) else {
            self.drop_path(pid);
            return RecvOutcome::ProtocolError;
        };
        let conn = pid.conn;
        let gen_num = msg.header.extensions().find_map(|e| if let Ext::GenNum(g) = e { Some(g) } else { None });
        if let Some(g) = gen_num {
            // An rds-rs peer with HandshakeExts::Full: its maps carry its
            // generation, the path they travel on and a version
            // (`map_header`).
            let newly = !self.conn(conn).peer_gen_maps;
            self.conn_mut(conn).peer_gen_maps = true;
            if !self.gen_heard(pid, g) {
                // A dead instance's map, late: stale.
                return RecvOutcome::CongMap;
            }
            if msg.header.sport != u16::from(pid.index) {
                // An accept race paired this slot with another of the
                // peer's paths: their sequence spaces differ. Nothing but
                // maps went on it (both sides hold until they hear from
                // each other, but a leading probe may follow); drop it,
                // and ignore the rest of it; the paths connect again.
                self.drop_path(pid);
                if let Some(path) = self.path_mut(pid) {
                    path.crossed = true;
                }
                return RecvOutcome::Ignored;
            }
            if newly {
                // Our hellos are due on the other paths up.
                for i in 0..self.conn(conn).paths.len() {
                    self.kick(PathId { conn, index: i as u8 });
                }
            }
            if msg.header.dport == PROBE_PORT {
                return RecvOutcome::CongMap;
            }
            let faddr = self.conn(conn).faddr;
            if !self.ep.cong.newer(faddr, g, msg.header.sequence) {
                // Older than a map already applied (it came the other way).
                return RecvOutcome::CongMap;
            }
        } else if self.conn(conn).peer_gen_maps {
            // The peer came back without them: nobody will send the maps
            // our held paths wait for.
            self.conn_mut(conn).peer_gen_maps = false;
            for i in 0..self.conn(conn).paths.len() {
                let pid = PathId { conn, index: i as u8 };
                if std::mem::take(&mut self.path_mut(pid).unwrap().hold) {
                    self.kick(pid);
                }
            }
        }
        let faddr = self.conn(conn).faddr;
        let order = if gen_num.is_none() { self.map_order(pid, msg) } else { MapOrder::After };
        let map = self.ep.cong.map(faddr);
        let mask = match order {
            MapOrder::After => map.update_from(&new),
            MapOrder::Unknown => {
                self.ep.counters.cong_update_reordered += 1;
                map.intersect_from(&new)
            }
            MapOrder::Before => {
                // The map applied last is newer: this one says nothing.
                self.ep.counters.cong_update_stale += 1;
                return RecvOutcome::CongMap;
            }
        };
        self.cong_map_updated(mask);
        RecvOutcome::CongMap
    }

    /// Where a map of a peer without map versions, which came on `pid`,
    /// stands against the one applied before it.
    ///
    /// Such a peer (a 6.1 kernel) sends each update on whichever path
    /// transmits first, so two updates can travel on two TCP connections,
    /// and we read the connections one after another, not in the order
    /// their bytes arrived. A kernel receiver reads each segment as it
    /// arrives (`sk_data_ready`) and so applies maps in their arrival
    /// order; so do we where the times say it: `rx_time_ns` is never
    /// before the map's arrival, and exactly it when `rx_time_exact` (the
    /// kernel's receive time of the segment a read that drained the
    /// socket ended with: `SO_TIMESTAMPNS`, rds-tcp). A map that arrived
    /// after the previous one's time applies; one that arrived before the
    /// previous one's exact time is stale (`cong_update_stale`).
    ///
    /// Otherwise, within [`MAP_REORDER_NS`] of each other on different
    /// paths, the order is unknown, and a port stays congested only if
    /// both maps say so (`cong_update_reordered`): in the VM rig (qperf
    /// `rds_bw`, ours the client, read times only) the kernel's
    /// "congested" map and its "uncongested" one 0.5 ms later (1.7 ms in
    /// another round) came on two connections and were read in the other
    /// order: the port stayed congested for good, since the kernel sends
    /// nothing more until the port changes again, and the blocked sender
    /// waited until the end of the test (10 of 24 rounds at 0.4-7.3 MB/s
    /// against 15-20; with the rule 8 of 8 at 15-17). A port wrongly left
    /// uncongested costs the peer's socket some queueing past its receive
    /// buffer until its next update (congestion is not a reason to drop:
    /// the kernel queues what arrives); a port wrongly left congested
    /// stops every sender to it until then. The rule alone lost
    /// congestion for good too: as a kernel's paths come up it sends its
    /// map on each, and a port congested in the last one, read 0.9 ms
    /// after an uncongested one on another path, was ANDed away; its
    /// reader stalled, the kernel sent no other map, and our senders never
    /// saw the port congested (kernel conformance "congestion us->kernel",
    /// us larger, 5 of 5 runs before the arrival times were used).
    /// Further apart, maps apply in the order of their times.
    fn map_order(&mut self, pid: PathId, msg: &RxMessage) -> MapOrder {
        let Some(t) = msg.rx_time_ns else { return MapOrder::After };
        let exact = msg.rx_time_exact;
        let last = &mut self.conn_mut(pid.conn).last_map;
        let order = match *last {
            None => MapOrder::After,
            // One stream: in order.
            Some((i, ..)) if i == pid.index => MapOrder::After,
            Some((_, t0, _)) if exact && t > t0 => MapOrder::After,
            Some((_, t0, exact0)) if exact0 && t < t0 => MapOrder::Before,
            Some((_, t0, _)) if t.abs_diff(t0) < MAP_REORDER_NS => MapOrder::Unknown,
            Some((_, t0, _)) if t < t0 => MapOrder::Before,
            Some(_) => MapOrder::After,
        };
        if !matches!(order, MapOrder::Before) {
            *last = Some((pid.index, t, exact));
        }
        order
    }
}

/// How a versionless peer's congestion map stands against the one applied
/// before it (`Node::map_order`).
enum MapOrder {
    /// It arrived after it, or on the same path: it applies.
    After,
    /// It arrived before it: stale.
    Before,
    /// Unknown: a port stays congested only if both say so.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn little_endian_bit_order() {
        let mut m = CongMap::new();
        m.set(0);
        m.set(9);
        m.set(32768);
        m.set(65535);
        let b = m.as_bytes();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[1], 0x02);
        assert_eq!(b[4096], 0x01, "port 32768 is the first bit of the second page");
        assert_eq!(b[8191], 0x80);
        assert!(m.test(9) && !m.test(8));
        assert_eq!(m.congested_ports().collect::<Vec<_>>(), vec![0, 9, 32768, 65535]);
        m.clear(9);
        assert!(!m.test(9));
    }

    /// `Node::cong_watch`: closed sockets are not looked for at close; the
    /// list drops them once it holds twice the socket slots, and keeps the
    /// live ones.
    #[test]
    fn the_watchers_stay_within_twice_the_socket_slots() {
        let mut node = Node::new(crate::node::NodeConfig::default());
        let kept: Vec<SockId> = (0..3).map(|_| node.socket()).collect();
        for &s in &kept {
            node.cong_watch(s);
        }
        let mut most = 0;
        for _ in 0..1000 {
            let s = node.socket();
            node.cong_watch(s);
            node.close(s);
            most = most.max(node.ep.cong.watchers.len());
        }
        assert_eq!(node.ep.socks.len(), 4, "a closed socket's slot is reused");
        assert!(most <= 2 * node.ep.socks.len() + 1, "{most} entries for {} slots", node.ep.socks.len());
        for s in kept {
            assert!(node.ep.cong.watchers.contains(&s), "a live socket stays listed");
        }
    }

    #[test]
    fn wrong_length_is_rejected() {
        assert_eq!(CongMap::from_wire(&[0; 8191]), Err(WireError::BadCongMapLen { len: 8191 }));
        assert!(CongMap::from_wire(&[0; 8192]).is_ok());
    }

    #[test]
    fn uncongested_mask() {
        let mut old = CongMap::new();
        old.set(5);
        old.set(69);
        old.set(7);
        let mut new = CongMap::new();
        new.set(7);
        new.set(100);
        let mask = old.update_from(&new);
        assert_eq!(mask, monitor_mask(5), "5 and 69 share port group 5");
        assert_eq!(old, new);
        // Every port: the mask is the union of the cleared ports' groups.
        let mut a = CongMap::new();
        for p in (0..=65535u16).step_by(7) {
            a.set(p);
        }
        let mut b = a.clone();
        for p in [7u16, 70, 4095, 65534, 32767] {
            b.clear(p);
        }
        let want = [7u16, 70, 4095, 65534, 32767].iter().filter(|p| a.test(**p)).fold(0, |m, p| m | monitor_mask(*p));
        assert_eq!(a.update_from(&b), want);
        assert_ne!(want, 0);
    }
}
