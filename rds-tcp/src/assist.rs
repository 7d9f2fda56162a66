//! Receive in the blocked reader's thread ([`RxAssist`]).
//!
//! Without it a message crosses two threads on its way in: the reactor
//! wakes on the readable event, reads and delivers, and wakes the
//! application's thread, which then takes the message. The kernel's RDS
//! delivers from its TCP receive callback and wakes the reader once. A
//! thread about to block in a receive can instead poll the TCP
//! connections the next message will likely come on (the paths of the
//! address pair of its last message) beside its own readiness descriptor,
//! and read and deliver what arrives itself: one wake-up, no hand-over.
//!
//! The rules that keep every message once and in order:
//! - One reader per connection at a time (`PathConn::rx_busy`); a thread
//!   that finds the reactor reading leaves the connection to it.
//! - While a connection has an assisting thread (`PathConn::assist`), the
//!   reactor leaves its readable events to that thread (it still handles
//!   the writable side, acks and the end of the stream: an event that
//!   brought the peer's FIN or an error is read by the reactor as
//!   always). A thread that stops assisting a connection whose event the
//!   reactor left (`rx_unread`) reads it once more if it may, and hands it
//!   back (`Cmd::RxRead`) if the flag is still set after it decremented
//!   `assist`; the reactor sets the flag before it looks at `assist`, so
//!   one of the two always reads.
//! - The paths of a pair are read independently, in any order: a
//!   socket's messages that went on path 0 before the multipath
//!   handshake hold its lane until the peer answered a probe ping sent
//!   after them (`rds_core::lane0`), not until a read of path 0 here.
//! - A pass that stops early (the budget, a pause) hands the connection to
//!   the reactor; the end of the stream, an error or a protocol error too
//!   (`Cmd::RxFailed`: the reactor reads it to its end and closes it).
//!   The reactor closes a connection only after the pass in progress
//!   delivered what it read.
//! - Connections that are not up, or ending, are left to the reactor; so
//!   is everything when the address pair has more than
//!   [`ASSIST_MAX_PATHS`] paths (one RDS connection has at most 8, but
//!   every TOS value makes another). The pair's paths come from the
//!   transport's index by address pair, whatever the number of peers.
//!
//! A caller that knows the connection its last message came on (its
//! `lane`, from [`RxAssist::lane`] of the wait before) polls that one
//! alone, not every path of the pair:
//! the answers of request/response traffic come on one lane, and the
//! other lanes' messages reach it through the reactor as before. When the
//! caller asks (`quiet`), the lane is also taken off the reactor's
//! registration for readable events while the thread assists
//! (`PathConn::quiet`, counted in `tcp_rx_assist_quiet`): the bytes that
//! answer a request then wake this thread alone, where the reactor was
//! woken too, only to leave them. The registration gets them back when the
//! thread stops assisting, and epoll then reports bytes that came
//! meanwhile, so the reactor reads what nobody took. The other paths of
//! the pair stay registered: their events are left to the thread as above.
//!
//! Without the linger (below) that costs two `epoll_ctl` calls per wait in
//! the receiving thread, the second between the message and the caller's
//! next step. A caller that
//! waits for the answer to what it sent gains: its next step is the next
//! request, and a reactor wake-up beside each answer cost more (qperf
//! `rds_lat` in the VM rig, 4 rounds alternating in one boot: 353-473 us
//! one way without, 253-337 us with). A receiver of a one-way stream does
//! not gain: the reactor's wake-up beside its message delays nothing it
//! waits for (qperf `rds_bw` of 8 KiB, the same run: 56-73 MB/s without,
//! 45-62 MB/s with; another boot, against the lane off the reactor in every
//! wait: 8 KiB 60-69 against 43-62 MB/s, 1 KiB 34-38 against 27-36, 64 KiB
//! and the latency within each other's spread). Its waits are few, as a
//! stream's reads are mostly left to the reactor (`perf stat` of qperf's
//! receiving thread at 8 KiB: 0.15 `epoll_ctl` calls per message before,
//! none after), so the calls alone do not account for the difference; it
//! was not traced further. rds-sock asks for it when the socket sent a
//! message since its previous wait.
//!
//! # The linger
//!
//! A quiet wait whose last message came on its lane leaves the lane off
//! the reactor's registration when it ends, for [`ASSIST_LINGER`]
//! (`PathConn::lingering`, holding its count of `quiet`): the caller's
//! next wait, after it sent the next request or the answer, takes the lane
//! over as it is (no `epoll_ctl`) and renews the linger at its end. Where
//! the reactor used to take every message a program did not wait for yet
//! (a window of requests in flight: the answer comes while the program
//! sends the next), the program's next wait now reads it: one thread
//! woken per message instead of two. The reactor takes the lane back when
//! a linger runs out unrenewed (`tcp_rx_linger_expired`): its timer
//! (`reactor::timer::TimerShared`), armed for its earliest deadline and
//! only ever moved earlier (a renewal never postpones another linger's
//! end), wakes it at most once per [`ASSIST_LINGER`] while lingers are
//! renewed; the registration's change makes epoll report the bytes that
//! came meanwhile, and the reactor reads them. A wait that did not ask for `quiet` takes a lingering lane over
//! too and gives it back at its end. So a message that comes on a lingering
//! lane while its program is not in a blocking receive (it polls the
//! socket's descriptor instead) is delivered up to [`ASSIST_LINGER`] late,
//! never lost.
//!
//! Measured in the VM rig (rds-window, `scripts/perf/rds_window.c`, 64 B,
//! each message answered; 3 rounds alternating in one boot): 16 in flight
//! 4.0-4.4 k messages/s without, 10.0-12.8 k with (the kernel's RDS-TCP
//! 7.3-8.3 k in the boot before); one in flight, round trip 646-729 us
//! without, 519-657 with. A linger of 1 ms ran out in most gaps between
//! waits there (a busy guest under emulation deschedules the program for
//! longer): 4.0-5.9 k and 613-730 us; 2 ms, 7.2-10.0 k and 576-729 us
//! (worse than without: about 500 reactor wake-ups a second per side).
//! 10 ms on a timerfd of its own that each renewal set later (no wake-up
//! while renewed) measured the same as 10 ms on the reactor's timer, which
//! is what it is: set later, a renewal of one lane postponed the end of
//! another lane's linger on the same reactor for as long as it went on.

use std::cell::RefCell;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use rds_core::{RxMessage, TransportSink};

use crate::path_conn::{PathConn, UP};
use crate::reactor::Cmd;
use crate::reactor::read::{ReadEnd, acquire_rx, read_pass};
use crate::stats::inc;
use crate::{Inner, TcpTransport};

/// Above this many paths of one address pair (its RDS connections, one
/// per TOS value, of up to 8 paths each), no thread assists: a wait would
/// poll them all.
pub const ASSIST_MAX_PATHS: usize = 64;

/// Bytes one wait's reads take for a stream ([`RxAssist::read_a_stream`]).
pub const ASSIST_STREAM_BYTES: usize = 16 << 10;

/// Below this many bytes written and not known to be acked, an
/// assisting thread leaves a watched path's acks to the reactor's ack
/// timer ([`RxAssist`]'s ack poll). At most half the smallest send buffer
/// (`SOCK_MIN_SNDBUF`, 4,608 bytes): a socket's bytes awaiting those acks
/// plus its largest message (half its send buffer) never fill its send
/// buffer, so no sender waits for the timer.
pub const ASSIST_ACK_LAZY_BYTES: u64 = 2 << 10;

/// How long a lane stays off the reactor's registration after a wait
/// that read its answer there and asked for `quiet` (module docs): the
/// next such wait within it takes the lane over without a system call;
/// past it, the reactor takes the lane back (`tcp_rx_linger_expired`).
pub const ASSIST_LINGER: std::time::Duration = std::time::Duration::from_millis(10);

/// Read buffer of an assisting thread.
const ABUF: usize = 64 << 10;

thread_local! {
    static BUF: RefCell<(Vec<u8>, Vec<RxMessage>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The connections of one address pair a thread about to block in a
/// receive polls and reads itself (module docs). Dropping it hands back
/// what it did not read.
pub struct RxAssist {
    inner: Arc<Inner>,
    /// The pair's paths, path 0 first (the transport's shared list,
    /// `PathTable::pair`: no vector built per wait).
    conns: Arc<[Arc<PathConn>]>,
    /// Bit `i`: `conns[i]` was up and is not given back: its acks are
    /// polled and its answers marked.
    held: u64,
    /// Bit `i` (a subset of `held`): it polls and reads `conns[i]` (and
    /// counts in its `assist`). The others (when it polls its lane only)
    /// have their acks polled and their answers marked, nothing more.
    polled: u64,
    /// Messages its reads delivered (to any socket), and bytes they read.
    delivered: usize,
    bytes: usize,
    /// The connection it took readable events off the reactor for (or
    /// whose linger it took over).
    quiet: Option<usize>,
    /// Its caller asked for `quiet`: at the end it may leave the lane
    /// lingering (module docs).
    may_linger: bool,
    /// The end of its last read pass that read bytes (a `now_ns` value; 0:
    /// none).
    read_at: u64,
    /// The last connection a read of its delivered messages on (0: none).
    lane: u64,
    /// It left a lane lingering as it gave it back (module docs): the
    /// reactor's timer then wakes within [`ASSIST_LINGER`] and runs the
    /// transport's linger tick ([`TcpTransport::set_linger_tick`]).
    lingered: bool,
}

impl std::fmt::Debug for RxAssist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxAssist")
            .field("paths", &self.held.count_ones())
            .field("polled", &self.polled.count_ones())
            .finish()
    }
}

impl TcpTransport {
    /// The up paths from `laddr` to `faddr` for a blocked receiver to poll
    /// and read itself (module docs); `None` when there is none or the
    /// pair has more than [`ASSIST_MAX_PATHS`] paths. `lane` is
    /// [`RxAssist::lane`] of the caller's previous wait (0: none): unless
    /// `wide`, when that connection is up only it is polled (a `poll` of
    /// two descriptors instead of nine with 8 paths; a caller
    /// whose message came some other way asks for `wide` once, to learn
    /// its new lane), and, when `quiet`, its bytes stop waking the
    /// reactor while this assists (module docs).
    pub fn rx_assist(&self, laddr: IpAddr, faddr: IpAddr, lane: u64, wide: bool, quiet: bool) -> Option<RxAssist> {
        if self.inner.is_closed() {
            return None;
        }
        let conns = self.inner.paths.lock().pair(laddr, faddr)?;
        if conns.len() > ASSIST_MAX_PATHS {
            return None;
        }
        // At most 64 paths: a bit each.
        let held = (0..conns.len()).filter(|&i| conns[i].state() == UP).fold(0u64, |m, i| m | 1 << i);
        if held == 0 {
            return None;
        }
        // The caller's lane known and up: that lane is polled; the other
        // paths only have their acks polled and their answers marked (a
        // request may go out on another lane than its answer comes back
        // on: a kernel's answer comes on its socket's hashed lane).
        let at =
            (lane != 0).then(|| (0..conns.len()).find(|&i| held & 1 << i != 0 && lane_of(&conns[i]) == lane)).flatten();
        let mut polled = 0u64;
        for i in (0..conns.len()).filter(|i| held & 1 << i != 0) {
            let c = &conns[i];
            if wide || at.is_none() || Some(i) == at {
                polled |= 1 << i;
                c.assist.fetch_add(1, SeqCst);
            }
        }
        // A lane left lingering by an earlier wait (module docs) is taken
        // over with its count of `quiet`: no `epoll_ctl`. A wait that did
        // not ask for `quiet` gives it back at its end.
        let took = at.filter(|&i| conns[i].lingering.swap(false, SeqCst));
        let at_quiet = took.or(at.filter(|_| quiet));
        if quiet && at_quiet.is_some() {
            inc(&self.inner.stats.rx_assist_quiet);
        }
        if let (Some(i), None) = (at_quiet, took) {
            let c = &conns[i];
            c.quiet.fetch_add(1, SeqCst);
            self.inner.refresh_quiet(c);
        }
        Some(RxAssist {
            inner: self.inner.clone(),
            conns,
            held,
            polled,
            delivered: 0,
            bytes: 0,
            quiet: at_quiet,
            may_linger: quiet,
            read_at: 0,
            lane: 0,
            lingered: false,
        })
    }
}

/// A connection's number for [`RxAssist::lane`] (its reactor token, unique
/// in the transport and never 0).
fn lane_of(c: &PathConn) -> u64 {
    c.token.0 as u64
}

impl RxAssist {
    /// The descriptors still to poll for reading, with their index.
    pub fn fds(&self) -> impl Iterator<Item = (usize, RawFd)> + '_ {
        self.polled_ix().map(|i| (i, self.conns[i].stream.as_raw_fd()))
    }

    /// Indexes of the connections it polls, in path order.
    fn polled_ix(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.conns.len()).filter(|&i| self.polls(i))
    }

    /// Whether it polls connection `i` (and has not given it back).
    fn polls(&self, i: usize) -> bool {
        i < self.conns.len() && self.polled & 1 << i != 0
    }

    /// The connections it still holds (`held`), in path order.
    fn held(&self) -> impl Iterator<Item = &Arc<PathConn>> + '_ {
        self.conns.iter().enumerate().filter(|&(i, _)| self.held & 1 << i != 0).map(|(_, c)| c)
    }

    /// Reads connection `i` and delivers what it holds (a ready one of a
    /// poll round). False when it read nothing: the connection was left to
    /// the reactor and is no longer polled.
    pub fn read(&mut self, i: usize) -> bool {
        match self.try_read(i) {
            Some(read) => read,
            None => {
                self.hand_back(i);
                false
            }
        }
    }

    /// [`RxAssist::read`]; `None` when this thread may not read it now
    /// (busy, paused, ending), the caller then hands it back.
    fn try_read(&mut self, i: usize) -> Option<bool> {
        if !self.polls(i) {
            return None;
        }
        let c = self.conns[i].clone();
        let sink = self.inner.sink()?;
        if !self.readable(&c) {
            return None;
        }
        BUF.with(|b| {
            let mut b = b.borrow_mut();
            let (buf, batch) = &mut *b;
            if buf.len() < ABUF {
                buf.resize(ABUF, 0);
            }
            // `None`: the reactor is reading it, and its pass delivers.
            let end = self.pass(&c, &*sink, buf, batch)?;
            if !matches!(end, ReadEnd::Drained) {
                self.ended(&c, end);
            }
            Some(true)
        })
    }

    /// One read pass on `c` when its read side is free (else `None`),
    /// counted.
    fn pass(
        &mut self,
        c: &PathConn,
        sink: &dyn TransportSink,
        buf: &mut [u8],
        batch: &mut Vec<RxMessage>,
    ) -> Option<ReadEnd> {
        if !acquire_rx(c, false) {
            return None;
        }
        let pass = read_pass(&self.inner, sink, c, buf, batch, false);
        crate::reactor::read::release_rx(c);
        self.delivered += pass.delivered;
        self.bytes += pass.bytes;
        inc(&self.inner.stats.rx_assist_reads);
        if pass.bytes > 0 {
            self.read_at = pass.at;
            self.mark_answered(c, pass.at);
            self.poll_acks(sink);
        }
        if pass.delivered > 0 {
            self.lane = lane_of(c);
        }
        Some(pass.end)
    }

    /// The connection its reads last delivered messages on (0: none), for
    /// the caller's next [`TcpTransport::rx_assist`].
    pub fn lane(&self) -> u64 {
        self.lane
    }

    /// Polls the acks of the pair's paths with messages awaiting theirs, as
    /// the reactor does at a readable event (`poll_one`, `poll_siblings`):
    /// an answer acks its request, which went on another lane when the
    /// answering socket's lane is another (a kernel's, hashed from its
    /// port; ours when it sent to the peer first, or another socket of its
    /// node holds the request's lane). Left to the reactor's ack
    /// timer, a request/response exchange kept it polling every
    /// `ack_poll_min` (each poll found the last request acked, progress).
    /// A path whose transmit state a writing thread holds is skipped (the
    /// writer polls as it writes). So is one that the reactor's ack timer
    /// watches with fewer than [`ASSIST_ACK_LAZY_BYTES`] not known to be
    /// acked (`tcp_rx_assist_acks_left`): the timer polls it within
    /// `ack_poll_answered`, and an exchange of small messages saves an
    /// `ioctl` per message (a request's ack then waits for a few more or the
    /// timer, which in such an exchange fires anyway, as the fallback).
    fn poll_acks(&self, sink: &dyn TransportSink) {
        for p in self.held() {
            self.inner.poll_conn_acks(Some(sink), p, |tx| {
                let lazy = tx.watched && tx.written - tx.acked < ASSIST_ACK_LAZY_BYTES;
                if lazy {
                    inc(&self.inner.stats.rx_assist_acks_left);
                }
                lazy
            });
        }
    }

    /// Bytes came in on `c`: record it as the reactor does for a readable
    /// event. Every path of the pair counts as answered (`last_rx_event`),
    /// so the next message sent on one, a request whose answer came on
    /// another lane, arms the ack timer at `ack_poll_answered`, a fallback,
    /// instead of `ack_poll_min`: without it each request of a
    /// request/response exchange cost a timer wake-up of the reactor
    /// (its readable events, which poll the siblings' acks, are left to
    /// this thread). The reactor's `last_rx` keeps its send coalescing
    /// from mistaking the exchange for a one-way stream. `now` is the
    /// pass's end ([`crate::reactor::read::Pass::at`]).
    fn mark_answered(&self, c: &PathConn, now: u64) {
        for p in self.held() {
            p.last_rx_event.store(now, SeqCst);
        }
        self.inner.reactors[c.reactor].last_rx.store(now, SeqCst);
    }

    /// Whether its caller asked for `quiet` (it sent since its previous
    /// wait: it waits for answers).
    pub fn asked_quiet(&self) -> bool {
        self.may_linger
    }

    /// Whether its reads so far look like a stream: more than one message,
    /// or [`ASSIST_STREAM_BYTES`] or more. The reactor reads a stream better: it
    /// reads ahead while the receiver works through what is queued.
    pub fn read_a_stream(&self) -> bool {
        self.delivered > 1 || self.bytes >= ASSIST_STREAM_BYTES
    }

    /// Up, not ending, not paused: this thread may read it.
    fn readable(&self, c: &PathConn) -> bool {
        c.state() == UP && !c.rx_ending.load(SeqCst) && !self.inner.rx_paused(c.info.id)
    }

    /// A pass that did not drain the connection: the reactor goes on.
    fn ended(&mut self, c: &Arc<PathConn>, end: ReadEnd) {
        let i = self.polled_ix().find(|&i| Arc::ptr_eq(&self.conns[i], c));
        if let Some(i) = i {
            self.release(i, false);
        }
        crate::reactor::read::leave_to_reactor(&self.inner, c, &end);
    }

    /// Stops assisting connection `i`; an event the reactor left to us
    /// since our last read goes back to it.
    fn hand_back(&mut self, i: usize) {
        if let Some(c) = self.release(i, true) {
            if c.rx_unread.load(SeqCst) {
                self.inner.reactors[c.reactor].send(Cmd::RxRead(c));
            }
        }
    }

    /// Gives polled connection `i` back (its acks are no longer polled
    /// here either); `None` when it was not polled or is given back
    /// already. Its readable events go back to the reactor, unless
    /// `may_linger` and it is left lingering (module docs).
    fn release(&mut self, i: usize, may_linger: bool) -> Option<Arc<PathConn>> {
        if !self.polls(i) {
            return None;
        }
        self.polled &= !(1 << i);
        self.held &= !(1 << i);
        let c = self.conns[i].clone();
        if self.quiet == Some(i) {
            self.quiet = None;
            if may_linger && self.linger(&c) {
                self.lingered = true;
            } else {
                c.quiet.fetch_sub(1, SeqCst);
                self.inner.refresh_quiet(&c);
            }
        }
        c.assist.fetch_sub(1, SeqCst);
        Some(c)
    }

    /// Leaves `c`, whose count of `quiet` this holds, off the reactor's
    /// registration for [`ASSIST_LINGER`] after this wait (module docs),
    /// when its caller asked for `quiet` and this wait's last delivery was
    /// on it (its answers come there) and it may still be read here. True
    /// when the count now belongs to the linger (or was already given back
    /// by the reactor ending it).
    fn linger(&self, c: &Arc<PathConn>) -> bool {
        if !self.may_linger || self.read_at == 0 || self.lane != lane_of(c) || !self.readable(c) {
            return false;
        }
        let until = self.read_at.saturating_add(ASSIST_LINGER.as_nanos() as u64);
        c.linger_until.store(until, SeqCst);
        c.lingering.store(true, SeqCst);
        let list = (!c.linger_listed.swap(true, SeqCst)).then(|| c.clone());
        let (at, now) = (crate::path_conn::instant_of(until), crate::path_conn::instant_of(self.read_at));
        if self.inner.reactors[c.reactor].linger(list, at, now) {
            return true;
        }
        // No timer to end it: not left lingering, unless the reactor
        // already ended it (and gave the count back).
        !c.lingering.swap(false, SeqCst)
    }
}

impl RxAssist {
    /// Ends the assist as dropping it does; whether it left a lane
    /// lingering, so that the reactor's timer runs the transport's linger
    /// tick within [`ASSIST_LINGER`] ([`TcpTransport::set_linger_tick`]).
    pub fn finish(mut self) -> bool {
        self.hand_back_all();
        self.lingered
    }

    /// Hands every connection back. One whose event the reactor left to
    /// us since our last read (mostly one for bytes we already took) is
    /// read once more here when we may (one `read` that finds nothing,
    /// where handing it back costs a command, a reactor wake-up and that
    /// same `read` there).
    fn hand_back_all(&mut self) {
        for i in 0..self.conns.len() {
            if !self.polls(i) {
                continue;
            }
            if self.conns[i].rx_unread.load(SeqCst) {
                let _ = self.try_read(i);
            }
            self.hand_back(i);
        }
    }
}

impl Drop for RxAssist {
    /// Hands every connection back ([`RxAssist::finish`] did already).
    fn drop(&mut self) {
        self.hand_back_all();
    }
}
