//! One TCP connection serving one instance of one RDS path
//! ([`PathConn`]): its state, its transmit state ([`TxState`], in the
//! `xmit` module: messages pulled and not yet fully written, stream offsets
//! of messages awaiting their TCP ack) and its receive state (the frame
//! decoder).

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering::SeqCst};

use mio::Token;
use parking_lot::Mutex;
use rds_core::wire::FrameDecoder;
use rds_core::{DownReason, PathInfo};

use crate::xmit::TxState;

/// Connection states.
pub(crate) const CONNECTING: u8 = 0;
pub(crate) const UP: u8 = 1;
/// Shutdown requested: no more writes, reading until the peer's FIN.
pub(crate) const DRAINING: u8 = 2;
pub(crate) const CLOSED: u8 = 3;

pub(crate) struct RxState {
    pub decoder: FrameDecoder,
    /// When a read last brought bytes (or the path was resumed): a partial
    /// message older than `TcpConfig::rx_frame_timeout` resets the
    /// connection.
    pub progress_at: std::time::Instant,
    /// The window clamp [`crate::AckHeadroom`] set on the socket, which
    /// reads re-assert ([`crate::reactor::read::reassert_clamp`]), and the
    /// bytes read since they last did.
    pub clamp: Option<u32>,
    pub read_since_clamp: usize,
}

static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Monotonic nanoseconds since the first call (for cheap atomics).
pub(crate) fn now_ns() -> u64 {
    ns_of(std::time::Instant::now())
}

/// Wall-clock time (nanoseconds since the Unix epoch) at the [`now_ns`]
/// value `mono`, for receive timestamps; `None` before the epoch.
///
/// Derived from the monotonic clock with an offset read from the wall
/// clock at most once per [`REAL_OFFSET_TTL`], not read per message: a
/// clock read is a system call where the clocksource has no vDSO support
/// (the VM rig's hpet: the qperf `rds_lat` client under the shim made 16
/// `clock_gettime` calls per round trip before, 4 after). A step of the
/// wall clock shows in the stamps within that long; slewing drifts them by
/// parts per million of it.
pub(crate) fn real_ns(mono: u64) -> Option<u64> {
    use std::sync::atomic::Ordering::Relaxed;
    // Offset (wall minus monotonic, as i64 nanoseconds) and the monotonic
    // time it was read at (0: never).
    static OFFSET: AtomicU64 = AtomicU64::new(0);
    static READ_AT: AtomicU64 = AtomicU64::new(0);
    let at = READ_AT.load(Relaxed);
    let offset = if at == 0 || mono.saturating_sub(at) >= REAL_OFFSET_TTL.as_nanos() as u64 {
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i64;
        let now = now_ns().max(1);
        let o = wall.wrapping_sub(now as i64);
        OFFSET.store(o as u64, Relaxed);
        READ_AT.store(now, Relaxed);
        o
    } else {
        OFFSET.load(Relaxed) as i64
    };
    u64::try_from((mono as i64).wrapping_add(offset)).ok()
}

/// How long [`real_ns`] keeps its wall-clock offset.
pub(crate) const REAL_OFFSET_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// The [`now_ns`] value of an instant (0 before the first call).
pub(crate) fn ns_of(i: std::time::Instant) -> u64 {
    i.saturating_duration_since(*EPOCH.get_or_init(std::time::Instant::now)).as_nanos() as u64
}

/// The instant of a [`now_ns`] value.
pub(crate) fn instant_of(ns: u64) -> std::time::Instant {
    rds_core::types::later(*EPOCH.get_or_init(std::time::Instant::now), std::time::Duration::from_nanos(ns))
}

/// The events a connection's registration with its reactor asks for.
/// Registered for both; writable events come off once the connection is
/// up and no write waits for room, readable ones while an assisting thread
/// reads the connection itself.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Registered {
    pub readable: bool,
    pub writable: bool,
}

/// One TCP connection serving one instance of one RDS path (the kernel's
/// `rds_tcp_connection`, one per `rds_conn_path`): the socket, its state,
/// the transmit and receive state, and the flags the transmitting threads
/// and the reactor share. A path that reconnects gets a new one (a new
/// `info.inst`); reports about an older one are ignored by the core.
pub(crate) struct PathConn {
    pub token: Token,
    pub reactor: usize,
    pub info: PathInfo,
    pub stream: TcpStream,
    pub local: Option<SocketAddr>,
    pub peer: SocketAddr,
    pub state: AtomicU8,
    /// `RDS_IN_XMIT`: a thread is transmitting on this connection.
    pub in_xmit: AtomicBool,
    /// Kicked while someone was transmitting: go around again.
    pub again: AtomicBool,
    /// A write hit EAGAIN: the reactor resumes on the next writable event.
    pub wait_writable: AtomicBool,
    /// Writable events seen (closes the race between EAGAIN and the event).
    pub wr_gen: AtomicU64,
    /// What the reactor's registration of the socket asks for (the lock
    /// orders its changes; `Inner::want_writable`, `Inner::refresh_quiet`).
    pub interest: Mutex<Registered>,
    /// Assisting threads that took this connection's readable events off
    /// the reactor's registration (`crate::assist`): while there is one the
    /// reactor is not woken by its bytes at all.
    pub quiet: AtomicU32,
    /// A receiving thread that read its answers on this connection left
    /// it off the reactor's registration after its wait (`crate::assist`'s
    /// linger): the linger holds one of `quiet`'s counts, which the next
    /// such wait takes over or the reactor gives back at `linger_until`.
    pub lingering: AtomicBool,
    /// When the linger ends unless a wait renews it (a `now_ns` value).
    pub linger_until: AtomicU64,
    /// The reactor has this connection on its list of lingers (or one is
    /// on its way there): set by the thread that lists it, cleared by the
    /// reactor when it drops it.
    pub linger_listed: AtomicBool,
    /// Why the connection is being closed, when the core asked.
    pub requested: Mutex<Option<DownReason>>,
    /// The peer's FIN or an error was seen: the connection is ending, so
    /// it is read to its end even while the core has its path paused, by
    /// every later pass too (one pass stops at the read budget).
    pub rx_ending: AtomicBool,
    pub tx: Mutex<TxState>,
    /// `tx`'s flag of messages awaiting their acks ([`PathConn::awaits_acks`]).
    tx_awaits: std::sync::Arc<AtomicBool>,
    /// Messages pulled from the core, kept for the buffer's capacity
    /// between transmit rounds (only the `in_xmit` holder uses it).
    pub pull_buf: Mutex<Vec<rds_core::TxMessage>>,
    pub rx: Mutex<RxState>,
    /// [`now_ns`] of the last write (write coalescing).
    pub last_write: AtomicU64,
    /// The reactor will flush this connection at the end of a window.
    pub flush_pending: AtomicBool,
    /// [`now_ns`] the pending flush is for: a flush whose timer comes
    /// earlier (armed for a batch the sending thread wrote since) waits
    /// until then.
    pub flush_due: AtomicU64,
    /// [`now_ns`] of the last send from an application thread, and the
    /// number of sends in a row each within the coalescing window of the
    /// one before with no readable event on the reactor in between (a
    /// send held up for less than `coalesce::RUN_KEEP` windows keeps it:
    /// `coalesce::run_after`): write coalescing starts once such a run
    /// shows (`coalesce::COALESCE_RUN`).
    pub last_send: AtomicU64,
    pub send_run: AtomicU32,
    /// Sends left queued since the connection's last write (mid-size
    /// streams' batches, `coalesce` module docs).
    pub held: AtomicU32,
    /// What a transmit of small messages costs here, sampled: the
    /// coalescing window follows it (`crate::coalesce`).
    pub write_cost: crate::coalesce::WriteCost,
    /// [`now_ns`] of the last readable event: the reactor polls the acks
    /// of a watched connection at each of its events, so one that receives
    /// needs its ack timer only as a fallback.
    pub last_rx_event: AtomicU64,
    /// Bytes may wait in the socket: a readable event came since the last
    /// read pass that drained it (set by the reactor when it takes the
    /// event, before it handles any event of that batch; cleared when a
    /// pass starts, set again when one stops before draining). An
    /// assisting thread that stops hands such a connection back to the
    /// reactor (`crate::assist`). Starts set: a new connection is read
    /// once whatever its events say.
    pub rx_unread: AtomicBool,
    /// A thread is reading the connection (the reactor, or an application
    /// thread in a blocking receive, `crate::assist`): one reader at a
    /// time keeps the stream's messages in order, and a connection is
    /// only closed once the read in progress delivered what it read.
    pub rx_busy: AtomicBool,
    /// The reactor's ack timer found the transmit state held by a writing
    /// thread: the writer polls the acks before it lets go
    /// (`Reactor::poll_watched`).
    pub ack_poll_owed: AtomicBool,
    /// Application threads blocked in a receive that poll this
    /// connection and read it themselves (`crate::assist`); while there
    /// is one, the reactor leaves its readable events to them.
    pub assist: AtomicU32,
}

impl PathConn {
    /// Whether a message written (or queued) on it awaits its ack, read
    /// without the transmit lock: a poll of its acks that finds this false
    /// has nothing to do. One queued just now may not show yet; its writer
    /// polls as it writes, and the reactor's ack timer watches it.
    pub fn awaits_acks(&self) -> bool {
        self.tx_awaits.load(SeqCst)
    }

    pub fn new(
        token: Token,
        reactor: usize,
        info: PathInfo,
        stream: TcpStream,
        peer: SocketAddr,
        state: u8,
    ) -> PathConn {
        let local = stream.local_addr().ok();
        let tx = TxState::default();
        PathConn {
            token,
            reactor,
            info,
            stream,
            local,
            peer,
            state: AtomicU8::new(state),
            in_xmit: AtomicBool::new(false),
            again: AtomicBool::new(false),
            wait_writable: AtomicBool::new(false),
            wr_gen: AtomicU64::new(0),
            interest: Mutex::new(Registered { readable: true, writable: true }),
            quiet: AtomicU32::new(0),
            lingering: AtomicBool::new(false),
            linger_until: AtomicU64::new(0),
            linger_listed: AtomicBool::new(false),
            requested: Mutex::new(None),
            rx_ending: AtomicBool::new(false),
            tx_awaits: tx.awaits_flag(),
            tx: Mutex::new(tx),
            pull_buf: Mutex::new(Vec::new()),
            rx: Mutex::new(RxState {
                decoder: FrameDecoder::default(),
                progress_at: std::time::Instant::now(),
                clamp: None,
                read_since_clamp: 0,
            }),
            last_write: AtomicU64::new(0),
            flush_pending: AtomicBool::new(false),
            flush_due: AtomicU64::new(0),
            last_send: AtomicU64::new(0),
            send_run: AtomicU32::new(0),
            held: AtomicU32::new(0),
            write_cost: Default::default(),
            last_rx_event: AtomicU64::new(0),
            rx_unread: AtomicBool::new(true),
            rx_busy: AtomicBool::new(false),
            ack_poll_owed: AtomicBool::new(false),
            assist: AtomicU32::new(0),
        }
    }

    /// Whether the connection brought an answer (a readable event, or a
    /// message other than a congestion map, `last_rx_event`) less than
    /// `within` before `now` (a [`now_ns`] value): its ack timer is then a
    /// fallback (`Inner::ack_timer`, the reactor's poll of its watched
    /// connections).
    pub fn answered_within(&self, now: u64, within: std::time::Duration) -> bool {
        let at = self.last_rx_event.load(SeqCst);
        at != 0 && u128::from(now.saturating_sub(at)) < within.as_nanos()
    }

    pub fn state(&self) -> u8 {
        self.state.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wall_ns() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
    }

    /// `real_ns` gives the wall-clock time of a monotonic stamp, from the
    /// first call on and with the offset it keeps, and a later stamp
    /// maps to a later time by the same distance.
    #[test]
    fn real_ns_follows_the_wall_clock() {
        for _ in 0..3 {
            let before = wall_ns();
            let mono = now_ns();
            let real = real_ns(mono).unwrap();
            let after = wall_ns();
            // Within 50 ms either side (the offset's own read, a slewing
            // clock, a descheduled test thread).
            assert!(real + 50_000_000 >= before && real <= after + 50_000_000, "{before} <= {real} <= {after}");
            let later = real_ns(mono + 1_000_000).unwrap();
            assert!(later.abs_diff(real + 1_000_000) < 1_000_000, "{real} then {later}");
        }
        // A stamp past the offset's lifetime reads the wall clock again.
        let far = now_ns() + 2 * REAL_OFFSET_TTL.as_nanos() as u64;
        assert!(real_ns(far).is_some());
    }

    /// `ns_of` and `instant_of` are inverses (to the nanosecond).
    #[test]
    fn ns_of_and_instant_of_agree() {
        let ns = now_ns() + 123_456;
        assert_eq!(ns_of(instant_of(ns)), ns);
    }
}
