//! The transmit path: pulling messages from the core and writing them
//! to a path's TCP connection ([`Inner::xmit`]), the per-connection
//! transmit state ([`TxState`]: `writev` batching, partial writes, the
//! stream offsets of messages awaiting their TCP ack) and ack polling
//! with `SIOCOUTQ`.
//!
//! # Transmit
//!
//! [`RdsTransport::kick`](rds_core::RdsTransport::kick) means "pull and
//! send". At most one thread transmits on a connection at a time (the
//! kernel's `RDS_IN_XMIT` bit): a kick that finds the connection busy marks
//! it "again" and returns, and the transmitting thread loops until a pull
//! returns nothing or says it took everything queued (that pull's messages
//! written, the round ends). The calling thread transmits inline, as the kernel does
//! in the `sendmsg` caller's context: it pulls up to
//! [`crate::TcpConfig::pull_budget`] bytes of messages and writes them with
//! `writev` (header and payload slices, up to 1024 per call), so a burst of
//! small messages costs few system calls. The writes of a one-way stream
//! are coalesced in time: a send inside the window leaves its message to
//! the window's single write (the `coalesce` module, [`Inner::hold_until`];
//! the window is [`crate::TcpConfig::coalesce`] or a few times what a
//! transmit measured here, up to [`crate::TcpConfig::coalesce_max`]). A
//! message sent after a pause, a reply and request/response traffic go out
//! immediately. On
//! `EAGAIN` the connection waits for the reactor's next writable event,
//! which resumes transmission there (the reactor's registration of a
//! connection asks for writable events only while a write waits:
//! [`Inner::want_writable`]); a
//! message interrupted by `EAGAIN` is finished before anything else. An
//! application thread hands over to the reactor after
//! [`crate::TcpConfig::inline_limit`] bytes. No lock of the transport is
//! held while it calls the sink.
//!
//! A send's own kick can be made under the core's lock instead
//! ([`crate::TcpTransport::claim_xmit`]): the same checks, and when they
//! give the sending thread the transmit it pulls in the node call of its
//! send (one node call per message fewer) and writes with
//! [`crate::TcpTransport::xmit_claimed`] once the lock is released.
//!
//! How acks are polled (after writes, on events, on the reactor's ack
//! timer) is in the crate docs' "Acks" section.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use rds_core::wire::HEADER_LEN;
use rds_core::{Payload, TxMessage};
use socket2::SockRef;

use crate::path_conn::{self, PathConn, UP};
use crate::reactor::{self, Cmd};
use crate::stats::inc;
use crate::{Inner, sys};

/// How one transmitter's round ended.
enum Round {
    /// Nothing more to send.
    Idle,
    /// The socket is full; the reactor resumes on the next writable event.
    Blocked,
    /// Transmitted enough here; the reactor continues.
    Yield,
    /// The connection is closing or failed.
    Dead,
}

impl crate::TcpTransport {
    /// Polls the acks (`SIOCOUTQ`) of the up paths from `laddr` to `faddr`
    /// with messages awaiting theirs, and reports them to the core, as
    /// the reactor's ack timer does: for a sending thread that found its
    /// socket's send buffer full, the acks that make room (on a local link
    /// mostly made inside its own writes, or while the receiver reads)
    /// without waiting for the timer. A path whose transmit state a
    /// writing thread holds is skipped (the writer polls as it writes).
    /// Returns whether any path's acked offset advanced; `None` when the
    /// pair has no path up (the room then comes with the connection, or
    /// not over TCP). A path up with nothing awaiting acks is worth asking
    /// again: the messages that filled the buffer may still be queued for
    /// a write (a coalescing window's flush, the reactor's turn).
    pub fn poll_pair_acks(&self, laddr: std::net::IpAddr, faddr: std::net::IpAddr) -> Option<bool> {
        let conns = self.inner.paths.lock().pair(laddr, faddr)?;
        let sink = self.inner.sink();
        let mut advanced = None;
        for p in conns.iter().filter(|p| p.state() == UP) {
            let polled = self.inner.poll_conn_acks(sink.as_deref(), p, |_| false);
            *advanced.get_or_insert(false) |= polled == Some(true);
        }
        advanced
    }
}

/// A kick of a path's transmit made by the send that queued its message,
/// under the core's lock ([`crate::TcpTransport::claim_xmit`]): whether
/// the transmit is the caller's (`owns`: it pulls the path's messages
/// under that same lock and writes them with
/// [`crate::TcpTransport::xmit_claimed`] after), or what
/// `xmit_claimed` still has to do for the kick (arm the coalescing
/// window's flush) outside the lock.
pub struct XmitClaim<'a> {
    inner: &'a Inner,
    conn: Arc<PathConn>,
    on_reactor: bool,
    /// The clock read of the coalescing check, which the first write's
    /// stamp reuses.
    stamp: Option<u64>,
    /// The message stays queued for the coalescing window's flush, due
    /// then ([`Inner::hold`]).
    hold_at: Option<u64>,
    owns: bool,
    /// The connection's pull buffer (for its capacity), while the
    /// transmit is the caller's.
    msgs: Vec<TxMessage>,
}

impl XmitClaim<'_> {
    /// Whether the caller transmits: it pulls the path's messages now.
    pub fn owns(&self) -> bool {
        self.owns
    }

    /// Where the caller pulls the path's messages to, when it owns the
    /// transmit.
    pub fn msgs(&mut self) -> &mut Vec<TxMessage> {
        &mut self.msgs
    }
}

/// A claim dropped before [`crate::TcpTransport::xmit_claimed`] (a panic
/// between the two) loses nothing: what it pulled is queued for the
/// connection's writes and the reactor transmits, as after a round that
/// yields.
impl Drop for XmitClaim<'_> {
    fn drop(&mut self) {
        if !self.owns {
            return;
        }
        if !self.msgs.is_empty() {
            self.conn.tx.lock().enqueue(&mut self.msgs);
        }
        self.conn.in_xmit.store(false, SeqCst);
        self.inner.reactors[self.conn.reactor].send(Cmd::Xmit(self.conn.clone()));
    }
}

impl crate::TcpTransport {
    /// [`rds_core::RdsTransport::kick`] of `path` by a send, made under the
    /// core's lock right after the send queued its message, so that the
    /// sending thread can pull the path's messages in that same node call
    /// instead of a second one (the kick's pull): the checks
    /// a kick's transmit makes before a round (the coalescing window, another
    /// transmitting thread, a write waiting for room, the path not up), with
    /// the transmit claimed for the caller when they let it transmit.
    /// Atomics and a clock read only: no lock, no system call but the
    /// clock. `None` when the path has no connection (the kick would do
    /// nothing). Whatever it returns that is `Some` goes to
    /// [`Self::xmit_claimed`], which finishes the kick.
    pub fn claim_xmit(&self, path: &rds_core::PathInfo) -> Option<XmitClaim<'_>> {
        let conn = self.inner.conn_of(path)?;
        let (on_reactor, stamp, hold_at) = self.inner.coalesce_check(&conn);
        let mut c = XmitClaim { inner: &self.inner, conn, on_reactor, stamp, hold_at, owns: false, msgs: Vec::new() };
        if c.hold_at.is_some() {
            return Some(c);
        }
        c.owns = self.inner.claim(&c.conn);
        if c.owns {
            // Only the thread holding `in_xmit` uses it.
            c.msgs = std::mem::take(&mut *c.conn.pull_buf.lock());
        }
        Some(c)
    }

    /// The bytes of messages a claimed transmit pulls at once
    /// ([`crate::TcpConfig::pull_budget`]).
    pub fn pull_budget(&self) -> usize {
        self.inner.cfg.pull_budget
    }

    /// Finishes the kick of [`Self::claim_xmit`] after the core's lock:
    /// arms the coalescing window's flush for a message held, or, for a
    /// transmit the caller owns, writes what it pulled into
    /// [`XmitClaim::msgs`] (`pulled_all`: that pull took everything
    /// queued) and goes on as a transmit does (pulls more through the sink
    /// while there is more, hands over to the reactor after the inline
    /// limit), then releases the transmit.
    pub fn xmit_claimed(&self, mut c: XmitClaim<'_>, pulled_all: bool) {
        if let (Some(at), Some(now)) = (c.hold_at, c.stamp) {
            self.inner.hold(&c.conn, at, now);
            return;
        }
        if c.owns {
            c.owns = false;
            // (`xmit_round` clears them after writing.)
            self.inner.transmit(&c.conn, c.on_reactor, c.stamp, Some((&mut c.msgs, pulled_all)));
            let mut buf = c.conn.pull_buf.lock();
            if buf.capacity() < c.msgs.capacity() {
                *buf = std::mem::take(&mut c.msgs);
            }
        }
    }
}

impl Inner {
    /// Transmits on the connection unless another thread is doing it (then
    /// that thread goes around once more).
    pub fn xmit(&self, conn: &Arc<PathConn>) {
        let (on_reactor, stamp, hold_at) = self.coalesce_check(conn);
        if let (Some(at), Some(now)) = (hold_at, stamp) {
            self.hold(conn, at, now);
            return;
        }
        if self.claim(conn) {
            self.transmit(conn, on_reactor, stamp, None);
        }
    }

    /// What a kick from the calling thread checks before it claims the
    /// transmit: whether the thread is a reactor's, the clock read of
    /// the coalescing check if it made one (an application thread's kick
    /// with coalescing on; the first write's stamp reuses it: a clock read
    /// is a system call where the clocksource has no vDSO support, as in
    /// the VM rig), and, when the message stays queued for the window's
    /// flush, until when ([`Inner::hold_until`]; the caller arms it with
    /// [`Inner::hold`]).
    fn coalesce_check(&self, conn: &Arc<PathConn>) -> (bool, Option<u64>, Option<u64>) {
        let on_reactor = reactor::on_reactor();
        if on_reactor || self.cfg.coalesce.is_zero() {
            return (on_reactor, None, None);
        }
        let now = path_conn::now_ns();
        (false, Some(now), self.hold_until(conn, now))
    }

    /// Claims the connection's transmit for the calling thread: false when
    /// it is not up, a write waits for room (the reactor resumes), or
    /// another thread transmits (which then goes around once more:
    /// `again`).
    fn claim(&self, conn: &PathConn) -> bool {
        conn.again.store(true, SeqCst);
        if conn.wait_writable.load(SeqCst) || conn.state() != UP {
            return false;
        }
        if conn.in_xmit.swap(true, SeqCst) {
            return false;
        }
        conn.again.store(false, SeqCst);
        true
    }

    /// Transmits on a connection whose transmit this thread claimed
    /// ([`Inner::claim`]), first writing `pre` (messages the claimant
    /// pulled, and whether that pull took everything queued) if any:
    /// rounds until one ends with nothing more asked for, and releases it.
    fn transmit(
        &self,
        conn: &Arc<PathConn>,
        on_reactor: bool,
        mut stamp: Option<u64>,
        mut pre: Option<(&mut Vec<TxMessage>, bool)>,
    ) {
        loop {
            let r = self.xmit_round(conn, on_reactor, stamp.take(), pre.take());
            conn.in_xmit.store(false, SeqCst);
            match r {
                Round::Idle | Round::Blocked => {
                    if !conn.again.load(SeqCst) {
                        return;
                    }
                }
                Round::Yield => {
                    self.reactors[conn.reactor].send(Cmd::Xmit(conn.clone()));
                    return;
                }
                Round::Dead => return,
            }
            if !self.claim(conn) {
                return;
            }
        }
    }

    /// When the reactor's ack timer must first poll a connection that
    /// starts awaiting acks: [`crate::TcpConfig::ack_poll_min`], or
    /// [`crate::TcpConfig::ack_poll_answered`] when the connection brought
    /// a message other than a congestion map within
    /// [`crate::TcpConfig::ack_poll_max`]
    /// (`reactor::read::is_answer`; `tcp_ack_timer_answered` counts them). The reactor polls the acks of a watched
    /// connection at each of its events, so in request/response traffic the
    /// response brings the request's ack and the timer is only a fallback
    /// for when the peer falls silent: armed once per `ack_poll_answered`
    /// instead of once per message (a `timerfd_settime` and, as the
    /// deadline is never moved later, an early reactor wake-up each).
    fn ack_timer(&self, conn: &PathConn, now: u64) -> std::time::Duration {
        if conn.answered_within(now, self.cfg.ack_poll_max) {
            inc(&self.stats.ack_timer_answered);
            self.cfg.ack_poll_answered
        } else {
            self.cfg.ack_poll_min
        }
    }

    /// Reports what a poll of `conn`'s acks found ([`TxState::poll_acks`]):
    /// the acked offset advanced (`tcp_write_space_calls`), and the highest
    /// sequence number now acked, to the core.
    pub(crate) fn acks_polled(
        &self,
        sink: Option<&dyn rds_core::TransportSink>,
        conn: &PathConn,
        (seq, advanced): (Option<u64>, bool),
    ) {
        if advanced {
            inc(&self.stats.write_space_calls);
        }
        if let (Some(s), Some(sink)) = (seq, sink) {
            sink.acked(conn.info.id, conn.info.inst, s);
        }
    }

    /// Polls `conn`'s acks and reports them ([`Self::acks_polled`]),
    /// unless a writing thread holds its transmit state (it polls as it
    /// writes), nothing on it awaits an ack, or `leave` says to leave them
    /// (to the ack timer); whether its acked offset advanced, `None` when
    /// it was not polled.
    pub(crate) fn poll_conn_acks(
        &self,
        sink: Option<&dyn rds_core::TransportSink>,
        conn: &PathConn,
        leave: impl FnOnce(&TxState) -> bool,
    ) -> Option<bool> {
        // Most paths of a pair have nothing in flight: no lock taken.
        if !conn.awaits_acks() {
            return None;
        }
        let polled = {
            let mut tx = conn.tx.try_lock()?;
            if !tx.has_unacked() || leave(&tx) {
                return None;
            }
            tx.poll_acks(&conn.stream)
        };
        let advanced = polled.1;
        self.acks_polled(sink, conn, polled);
        Some(advanced)
    }

    /// One transmitter's work: write what is queued, pull more, repeat;
    /// `pre`: messages pulled already, written first (see
    /// [`Inner::transmit`]).
    fn xmit_round(
        &self,
        conn: &Arc<PathConn>,
        on_reactor: bool,
        stamp: Option<u64>,
        pre: Option<(&mut Vec<TxMessage>, bool)>,
    ) -> Round {
        let Some(sink) = self.sink() else { return Round::Dead };
        let limit = if on_reactor { self.cfg.reactor_xmit_limit } else { self.cfg.inline_limit } as u64;
        if let Some((msgs, pulled_all)) = pre {
            let r = self.xmit_loop(conn, &*sink, limit, msgs, stamp, Some(pulled_all));
            msgs.clear();
            return r;
        }
        // The connection's pull buffer, for its capacity: only the thread
        // holding `in_xmit` uses it.
        let mut msgs = std::mem::take(&mut *conn.pull_buf.lock());
        let r = self.xmit_loop(conn, &*sink, limit, &mut msgs, stamp, None);
        msgs.clear();
        *conn.pull_buf.lock() = msgs;
        r
    }

    /// [`Self::xmit_round`] with its sink, byte limit and pull buffer.
    /// `stamp`: a clock read of the caller's, which the first write's
    /// stamp takes; later writes read the clock, and the ack timer's start
    /// uses the latest of them.
    fn xmit_loop(
        &self,
        conn: &Arc<PathConn>,
        sink: &dyn rds_core::TransportSink,
        limit: u64,
        msgs: &mut Vec<TxMessage>,
        mut stamp: Option<u64>,
        pre: Option<bool>,
    ) -> Round {
        let (id, inst) = (conn.info.id, conn.info.inst);
        let mut sent = 0u64;
        let mut last = stamp;
        // The last pull took everything the core had queued: once that is
        // written the round ends without asking again (a pull that finds
        // nothing costs a node call). A message queued since comes with a
        // kick, which sends the holder of `in_xmit` around once more
        // (`Inner::xmit`, `again`).
        let mut pulled_all = false;
        // Messages the claimant pulled (`pre`: whether that pull took all):
        // queued as a pull's are, before the first write.
        if let Some(all) = pre {
            pulled_all = all;
            if !msgs.is_empty() {
                self.queue_pulled(conn, msgs, last);
            }
        }
        loop {
            let wgen = conn.wr_gen.load(SeqCst);
            let (res, polled) = {
                let mut tx = conn.tx.lock();
                if conn.state() != UP {
                    return Round::Dead;
                }
                let before = tx.written;
                let res = if tx.has_queued() {
                    let now = stamp.take().unwrap_or_else(path_conn::now_ns);
                    last = Some(now);
                    conn.last_write.store(now, SeqCst);
                    conn.held.store(0, SeqCst);
                    let n = tx.queued_len();
                    // A map's 8 KiB would class a stream of larger (or
                    // smaller) messages as mid-size until the next sample.
                    let timed = conn.write_cost.sample_due(n, || tx.queued_has_map());
                    let res = tx.write(&conn.stream);
                    if timed && matches!(res, Ok(WriteRes::Flushed)) {
                        // The coalescing window's measure: from the send's
                        // clock read (before its pull) to the end of the write.
                        let t = path_conn::now_ns();
                        last = Some(t);
                        conn.write_cost.record(t.saturating_sub(now), n, tx.written - before);
                    }
                    res
                } else {
                    Ok(WriteRes::Flushed)
                };
                sent += tx.written - before;
                // Acks only free send-buffer space; the reactor's ack timer
                // polls them too. Ask the kernel (an ioctl) once per
                // ACK_POLL_BYTES written, not after every write, or when
                // the timer found us writing (`PathConn::ack_poll_owed`).
                let polled = if tx.written_since_poll() >= ACK_POLL_BYTES
                    || (conn.ack_poll_owed.load(SeqCst) && conn.ack_poll_owed.swap(false, SeqCst))
                {
                    tx.poll_acks(&conn.stream)
                } else {
                    (None, false)
                };
                (res, polled)
            };
            self.acks_polled(Some(sink), conn, polled);
            match res {
                Ok(WriteRes::Flushed) => {}
                Ok(WriteRes::WouldBlock) => {
                    inc(&self.stats.sndbuf_full);
                    conn.wait_writable.store(true, SeqCst);
                    self.want_writable(conn);
                    // A writable event between our EAGAIN and the flag would
                    // be lost: if one came, take the flag back and retry.
                    if conn.wr_gen.load(SeqCst) != wgen && conn.wait_writable.swap(false, SeqCst) {
                        continue;
                    }
                    return Round::Blocked;
                }
                Err(_) => {
                    self.reactors[conn.reactor].send(Cmd::Failed(conn.clone()));
                    return Round::Dead;
                }
            }
            if sent >= limit {
                return Round::Yield;
            }
            if pulled_all {
                return Round::Idle;
            }
            msgs.clear();
            pulled_all = !sink.pull(id, inst, self.cfg.pull_budget, msgs);
            if msgs.is_empty() {
                return Round::Idle;
            }
            self.queue_pulled(conn, msgs, last);
        }
    }

    /// Queues pulled messages for the connection's writes; when a
    /// sequenced one starts the connection awaiting acks, the reactor
    /// watches them (`last`: the latest clock read, if any).
    fn queue_pulled(&self, conn: &Arc<PathConn>, msgs: &mut Vec<TxMessage>, last: Option<u64>) {
        let notify = {
            let mut tx = conn.tx.lock();
            let tracked = tx.enqueue(msgs);
            if tracked && !tx.watched {
                tx.watched = true;
                true
            } else {
                false
            }
        };
        if notify {
            let now = last.unwrap_or_else(path_conn::now_ns);
            self.reactors[conn.reactor].watch(conn.clone(), self.ack_timer(conn, now), path_conn::instant_of(now));
        }
    }
}

/// Bytes a transmitting thread writes between two polls of the acks.
const ACK_POLL_BYTES: u64 = 32 << 10;

/// Slices a `writev` builds on the stack (8 messages); more go in a vector.
const IOV_STACK: usize = 16;

/// Slices per `writev` (Linux `IOV_MAX` is 1024).
const IOV_BATCH: usize = 1024;

/// A message pulled from the core, being written.
pub(crate) struct TxItem {
    hdr: [u8; HEADER_LEN],
    payload: Payload,
    /// A congestion map (8 KiB, whatever the stream's messages).
    map: bool,
}

impl TxItem {
    fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }
}

#[derive(Default)]
pub(crate) struct TxState {
    /// Pulled messages not completely written; the first one has `head_off`
    /// bytes on the wire already.
    queue: VecDeque<TxItem>,
    head_off: usize,
    /// Stream bytes written to the socket.
    pub written: u64,
    /// Stream offset of the end of the last queued message.
    queued_end: u64,
    /// (end offset, sequence) of sequenced messages not yet acked.
    unacked: VecDeque<(u64, u64)>,
    /// Stream bytes the peer's TCP acknowledged, as last seen.
    pub acked: u64,
    /// End offset of the last sequenced message queued.
    pub expected_una: u64,
    /// The reactor polls this connection's acks.
    pub watched: bool,
    /// `written` when acks were last polled.
    polled_at: u64,
    /// `!unacked.is_empty()`, kept for reading without the lock
    /// ([`PathConn::awaits_acks`]): set with the first message queued,
    /// cleared by the poll that found the last one acked.
    awaits: Arc<AtomicBool>,
}

/// How a write attempt ended.
pub(crate) enum WriteRes {
    /// Everything queued is in the socket.
    Flushed,
    /// The socket's send buffer is full.
    WouldBlock,
}

impl TxState {
    /// The flag that shows, without the lock, whether a sequenced message
    /// awaits its ack ([`PathConn::awaits_acks`]).
    pub fn awaits_flag(&self) -> Arc<AtomicBool> {
        self.awaits.clone()
    }

    pub fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Queues pulled messages; returns whether a sequenced message was added.
    pub fn enqueue(&mut self, msgs: &mut Vec<TxMessage>) -> bool {
        let mut tracked = false;
        for m in msgs.drain(..) {
            self.queued_end += m.wire_len() as u64;
            let map = m.is_cong_map();
            if !map {
                self.unacked.push_back((self.queued_end, m.header.sequence));
                self.expected_una = self.queued_end;
                tracked = true;
            }
            self.queue.push_back(TxItem { hdr: m.header.to_bytes(), payload: m.payload, map });
        }
        if tracked {
            self.awaits.store(true, SeqCst);
        }
        tracked
    }

    /// A message is partly written.
    pub fn mid_message(&self) -> bool {
        self.head_off > 0
    }

    pub fn queued_len(&self) -> usize {
        self.queue.len()
    }

    /// Whether a congestion map is among the queued messages: a transmit
    /// that carries one does not measure the stream's messages
    /// (`WriteCost`).
    pub fn queued_has_map(&self) -> bool {
        self.queue.iter().any(|i| i.map)
    }

    pub fn unacked_len(&self) -> usize {
        self.unacked.len()
    }

    pub fn has_unacked(&self) -> bool {
        !self.unacked.is_empty()
    }

    /// Bytes written since acks were last polled.
    pub fn written_since_poll(&self) -> u64 {
        self.written - self.polled_at
    }

    /// Reads `SIOCOUTQ` and returns the highest sequence now fully acked,
    /// plus whether the acked offset advanced. Called with the state locked,
    /// so `written` and the queue length are read consistently.
    pub fn poll_acks(&mut self, stream: &TcpStream) -> (Option<u64>, bool) {
        if self.unacked.is_empty() {
            return (None, false);
        }
        self.polled_at = self.written;
        let Ok(outq) = sys::outq(stream.as_raw_fd()) else { return (None, false) };
        let acked = self.written.saturating_sub(outq);
        let advanced = acked > self.acked;
        if advanced {
            self.acked = acked;
        }
        let mut seq = None;
        while let Some(&(end, s)) = self.unacked.front() {
            if end > self.acked {
                break;
            }
            seq = Some(s);
            self.unacked.pop_front();
        }
        if self.unacked.is_empty() {
            self.awaits.store(false, SeqCst);
        }
        (seq, advanced)
    }

    /// Writes queued messages until done or the socket is full.
    pub fn write(&mut self, stream: &TcpStream) -> io::Result<WriteRes> {
        while !self.queue.is_empty() {
            let res = {
                // A few messages' slices on the stack (no allocation per
                // write); more in a vector, only as many as needed.
                let mut small = [IoSlice::new(&[]); IOV_STACK];
                let mut n = 0;
                let mut big: Vec<IoSlice<'_>> = Vec::new();
                let on_stack = 2 * self.queue.len() <= IOV_STACK;
                if !on_stack {
                    big.reserve_exact((2 * self.queue.len()).min(IOV_BATCH));
                }
                for (i, item) in self.queue.iter().enumerate() {
                    if n + 2 > IOV_BATCH {
                        break;
                    }
                    let skip = if i == 0 { self.head_off } else { 0 };
                    let pskip = skip.saturating_sub(HEADER_LEN);
                    let parts = [
                        (skip < HEADER_LEN).then(|| IoSlice::new(&item.hdr[skip.min(HEADER_LEN)..])),
                        (pskip < item.payload.len()).then(|| IoSlice::new(&item.payload[pskip..])),
                    ];
                    for part in parts.into_iter().flatten() {
                        if on_stack {
                            small[n] = part;
                        } else {
                            big.push(part);
                        }
                        n += 1;
                    }
                }
                let iov = if on_stack { &small[..n] } else { &big[..] };
                send_nosignal(stream, iov)
            };
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => self.advance(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(WriteRes::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(WriteRes::Flushed)
    }

    fn advance(&mut self, mut k: usize) {
        self.written += k as u64;
        while k > 0 {
            let Some(front) = self.queue.front() else { break };
            let rem = front.len() - self.head_off;
            if k >= rem {
                k -= rem;
                self.head_off = 0;
                self.queue.pop_front();
            } else {
                self.head_off += k;
                k = 0;
            }
        }
    }
}

/// `writev` that never raises SIGPIPE: `sendmsg` with `MSG_NOSIGNAL` (as
/// the kernel's RDS-TCP sends). The engine writes in the caller's thread,
/// inside programs whose SIGPIPE is the default (C programs under the
/// preload shim, qperf among them): a write to a connection the peer reset
/// or we shut down (EPIPE) must be an error for the path, not the end of
/// the program; `writev` (std's `write_vectored`) raises the signal.
fn send_nosignal(stream: &TcpStream, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    SockRef::from(stream).send_vectored_with_flags(iov, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rds_core::wire::Header;
    use std::io::Read;
    use std::net::{Shutdown, TcpListener};

    fn msg(seq: u64, len: usize) -> TxMessage {
        let mut header = Header::data(1000, 2000, len as u32);
        header.sequence = seq;
        let payload: Vec<u8> = (0..len).map(|i| (i as u64 * 7 + seq) as u8).collect();
        TxMessage { header, payload: Payload::new(payload), ack_required: false, rdma: None }
    }

    /// Partial writes (a tiny send buffer, a reader that is late) never
    /// corrupt the stream, and acks cover exactly the messages whose last
    /// byte the peer acknowledged.
    #[test]
    fn partial_writes_keep_the_stream_exact() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx_sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        tx_sock.set_send_buffer_size(4096).unwrap();
        tx_sock.connect(&l.local_addr().unwrap().into()).unwrap();
        tx_sock.set_nonblocking(true).unwrap();
        let stream: TcpStream = tx_sock.into();
        let (mut rx, _) = l.accept().unwrap();

        let mut msgs: Vec<TxMessage> = (1..=200).map(|i| msg(i, (i as usize * 997) % 20_000)).collect();
        msgs.insert(3, TxMessage { header: Header::cong_map(), ..msg(0, 8192) });
        let mut expect = Vec::new();
        for m in &msgs {
            expect.extend_from_slice(&m.header.to_bytes());
            expect.extend_from_slice(&m.payload);
        }
        let mut st = TxState::default();
        let awaits = st.awaits_flag();
        assert!(!awaits.load(SeqCst), "nothing queued");
        assert!(st.enqueue(&mut msgs));
        assert!(awaits.load(SeqCst), "shown without the lock");
        assert_eq!(st.unacked_len(), 200, "the congestion map is not tracked");
        assert!(st.queued_has_map(), "a queued map is known (not a cost sample)");
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; expect.len()];
            rx.read_exact(&mut got).unwrap();
            assert!(got == expect, "byte stream differs");
        });
        let mut blocked = 0;
        let mut last_seq = 0;
        loop {
            match st.write(&stream).unwrap() {
                WriteRes::Flushed => break,
                WriteRes::WouldBlock => {
                    blocked += 1;
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
            if let (Some(s), _) = st.poll_acks(&stream) {
                assert!(s > last_seq);
                last_seq = s;
            }
        }
        assert!(blocked > 0, "the small buffer forced partial writes");
        assert!(!st.queued_has_map(), "written");
        reader.join().unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while last_seq < 200 {
            assert!(std::time::Instant::now() < until, "acks");
            if let (Some(s), _) = st.poll_acks(&stream) {
                last_seq = s;
            }
        }
        assert_eq!(st.acked, st.written);
        assert!(!st.has_unacked());
        assert!(!awaits.load(SeqCst), "the poll that found the last acked cleared it");
    }

    /// A send after our own shutdown is EPIPE, and no SIGPIPE is raised:
    /// with the signal blocked in this thread, a raised one would stay
    /// pending (Linux never discards a blocked signal as ignored), so the
    /// test sees it without the process dying. Then `writev` does raise it
    /// (the test can fail).
    #[test]
    fn send_nosignal_raises_no_sigpipe() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _peer = l.accept().unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        // SAFETY: sigset operations on locals; the mask is this thread's
        // and is restored below; sigtimedwait with a zero timeout only
        // takes a pending SIGPIPE of this thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGPIPE);
            let mut old: libc::sigset_t = std::mem::zeroed();
            assert_eq!(libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old), 0);
            let pending = || {
                let mut p: libc::sigset_t = std::mem::zeroed();
                libc::sigpending(&mut p);
                libc::sigismember(&p, libc::SIGPIPE) == 1
            };
            let take = || {
                let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                libc::sigtimedwait(&set, std::ptr::null_mut(), &zero);
            };
            take();
            let buf = [1u8; 16];
            let iov = [IoSlice::new(&buf), IoSlice::new(&buf)];
            let e = send_nosignal(&s, &iov).unwrap_err();
            let after_send = pending();
            let w = libc::writev(s.as_raw_fd(), iov.as_ptr().cast(), 2);
            let after_writev = pending();
            take();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            assert_eq!(e.raw_os_error(), Some(libc::EPIPE));
            assert!(!after_send, "send_nosignal raised SIGPIPE");
            assert_eq!(w, -1);
            assert!(after_writev, "writev raises SIGPIPE (the control)");
        }
    }
}
