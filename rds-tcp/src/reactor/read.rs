//! Reading: a connection read until it is drained (a short read or
//! `EAGAIN`) or the read budget, split into messages and delivered in
//! batches; path 0 of a connection read before its other paths; receive
//! flow control (paused paths are not read unless the connection is
//! ending); stalled partial messages reset.
//!
//! # Why a short read ends the pass
//!
//! A `read` that returns fewer bytes than it was offered found the
//! socket's receive queue empty: `tcp_recvmsg` copies until the queue (and
//! the backlog it processes before returning) runs out, and stops early
//! only at urgent data (RDS never sends any; a peer that does only delays
//! its own connection until its next segment, and a partial message then
//! still meets `rx_frame_timeout`). The read that would follow only
//! returns `EAGAIN`, so it is skipped. Nothing is missed: mio registers
//! sockets edge-triggered (`EPOLLET`), and every segment queued after that
//! read calls `sk_data_ready`, which puts the socket back on the epoll
//! ready list: a new readable event. The exception is an event that
//! already carried the end (`EPOLLRDHUP`, `EPOLLERR`: `rx_ending`): the
//! FIN or the error raises no further edge, so such a connection is read
//! until `EOF`, the error or `EAGAIN` as before.

use std::io::{self, IoSliceMut};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Instant;

use rds_core::wire::{Frame, HEADER_LEN};
use rds_core::{DownReason, PathId, RxMessage, TransportSink};

use super::{Cmd, Reactor};
use crate::path_conn::{CLOSED, DRAINING, PathConn, UP};
use crate::stats::inc;
use crate::{Inner, down_reason, sys};

/// Read buffer of a reactor.
pub(super) const RBUF: usize = 256 << 10;
/// Payload length from which reads go straight into the message's buffer
/// (its bytes after those that came with its header), and from which the
/// next message's header and payload are read in one guessed `readv`.
/// One `readv` per message then, where the read buffer takes many
/// messages per call with a copy each: a gain from 8 KiB (qperf `rds_bw`
/// of 8 KiB under the shim, alternating runs: loopback 0.82-0.89 ->
/// 0.91-1.04 GB/s; in the VM rig 23-37 -> 35-62 MB/s, noisy); below,
/// not measured.
const DIRECT_MIN: usize = 8 << 10;
/// Bytes offered per direct read at most (a whole maximal payload: one
/// `read` takes all that is queued). The decoder offers less until that
/// much arrived: its window grows with the bytes received
/// (`FrameDecoder::read_direct`), so a hostile `h_len` costs what the peer
/// really sent.
const DIRECT_MAX: usize = 1 << 20;
/// Messages handed to the sink per call at most.
const BATCH_MSGS: usize = 1024;
const BATCH_BYTES: usize = 4 << 20;

/// How reading a connection ended.
pub(crate) enum ReadEnd {
    /// `EAGAIN`, or a short read: read everything there was.
    Drained,
    /// The fairness budget ran out; more may be readable.
    Budget,
    /// The core paused the path (receive flow control).
    Paused,
    Eof,
    Error,
    Protocol,
}

impl ReadEnd {
    /// A failed `read`: `EAGAIN` drained the socket, `EINTR` reads again
    /// (0 bytes so far), anything else ends the connection.
    fn of_error(e: &io::Error) -> Result<usize, ReadEnd> {
        match e.kind() {
            io::ErrorKind::WouldBlock => Err(ReadEnd::Drained),
            io::ErrorKind::Interrupted => Ok(0),
            _ => Err(ReadEnd::Error),
        }
    }
}

/// Whether a message read marks its connection as answered
/// (`PathConn::last_rx_event`, see `Inner::ack_timer`): any but a
/// congestion map. A receiver's maps come on path 0 while a stream's
/// sender waits there for its acks when its socket's lane is path 0 (the
/// port hashes to it: one socket in eight). Counting them, as the
/// readable events that brought them once did, put that sender's ack
/// timer at `ack_poll_max`: qperf `rds_bw` of 8 KiB on loopback under the
/// shim ran at 84-293 MB/s in those runs, against 0.9-1 GB/s on a lane.
fn is_answer(f: &Frame) -> bool {
    f.header.flags & rds_core::wire::flags::CONG_BITMAP == 0
}

/// The messages a read pass took and not yet handed to the sink, and
/// whether any of them was an answer ([`is_answer`]).
struct Intake<'a> {
    batch: &'a mut Vec<RxMessage>,
    bytes: usize,
    answered: bool,
}

impl Intake<'_> {
    /// A message read.
    fn push(&mut self, f: Frame) {
        self.answered |= is_answer(&f);
        self.bytes += f.payload.len();
        self.batch.push(RxMessage::from(f));
    }

    /// Gives the messages from `first` on, which one read took, that
    /// read's kernel receive time `stamp` (of its last segment); `exact`
    /// when the read drained the socket and ended with the last of them,
    /// whose time is then its arrival.
    fn stamp(&mut self, first: usize, stamp: Option<u64>, exact: bool) {
        for m in &mut self.batch[first..] {
            m.rx_time_ns = stamp;
        }
        if let Some(m) = self.batch.last_mut() {
            m.rx_time_exact = exact;
        }
    }

    /// Hands the batch to the sink, every message without a kernel receive
    /// time ([`Intake::stamp`]) stamped with the read time `at` (a `now_ns`
    /// value taken once the batch's last bytes were read: one clock read
    /// per batch, not per read or message); returns how many messages it
    /// held.
    fn deliver(&mut self, sink: &dyn TransportSink, id: PathId, inst: u64, at: u64) -> usize {
        let n = self.batch.len();
        if n > 0 {
            let ts = crate::path_conn::real_ns(at);
            for m in self.batch.iter_mut().filter(|m| m.rx_time_ns.is_none()) {
                m.rx_time_ns = ts;
            }
            sink.received(id, inst, self.batch);
            self.batch.clear();
        }
        self.bytes = 0;
        n
    }
}

impl Reactor {
    /// A [`read_pass`] on `conn`, whose read side this thread took
    /// (`acquire_rx`), which it gives back.
    fn held_pass(&mut self, conn: &PathConn, sink: &dyn TransportSink, force: bool) -> ReadEnd {
        // The reactor's batch, for its capacity (a nested call, should
        // there be one, starts an empty one).
        let mut batch: Vec<RxMessage> = std::mem::take(&mut self.rx_batch);
        let end = read_pass(&self.inner, sink, conn, &mut self.rbuf, &mut batch, force).end;
        release_rx(conn);
        batch.clear();
        self.rx_batch = batch;
        end
    }

    /// Queues `conn` to be read on the next pass (`rx_more`), once.
    pub(super) fn read_next_pass(&mut self, conn: Arc<PathConn>) {
        if !self.rx_more.iter().any(|c| Arc::ptr_eq(c, &conn)) {
            self.rx_more.push(conn);
        }
    }

    /// Reads and delivers until drained (a short read or `EAGAIN`), the budget, the end or an error;
    /// closes the connection at the end of the stream or on an error.
    /// Returns true when `conn` is queued in `rx_more` for the next pass:
    /// it stopped at the budget, or another thread was reading it.
    ///
    /// A path the core paused is not read (its bytes wait in the socket and
    /// the TCP window closes; the resume queues it in `rx_more`), unless
    /// `force` (the connection is ending: what it holds is delivered, never
    /// dropped). A pause that comes with a batch handed to the sink stops
    /// the reading after that batch: the overshoot is one batch.
    pub(super) fn read_conn(&mut self, conn: &Arc<PathConn>, force: bool) -> bool {
        let Some(sink) = self.inner.sink() else { return false };
        let id = conn.info.id;
        let force = force || conn.rx_ending.load(SeqCst);
        if !force && self.inner.rx_paused(id) {
            inc(&self.inner.stats.rx_paused);
            return false;
        }
        // One reader at a time (`PathConn::rx_busy`): an application thread
        // reading it in a blocking receive (`crate::assist`) finishes its
        // pass first. A connection that is ending is waited for (its
        // bytes are read before it closes); otherwise it is read on the
        // next pass.
        if !acquire_rx(conn, force) {
            self.read_next_pass(conn.clone());
            return true;
        }
        match self.held_pass(conn, &*sink, force) {
            ReadEnd::Drained | ReadEnd::Paused => false,
            ReadEnd::Budget => {
                self.read_next_pass(conn.clone());
                true
            }
            ReadEnd::Eof | ReadEnd::Error => {
                let why = down_reason(conn, DownReason::Closed);
                self.close_conn(conn, why, false);
                false
            }
            ReadEnd::Protocol => {
                self.close_conn(conn, DownReason::ProtocolError, true);
                false
            }
        }
    }

    /// Reads a connection that is ending to its end before it closes, as
    /// far as its socket holds bytes: TCP acknowledged every one of them,
    /// and the peer counts a message as delivered when TCP acknowledged
    /// its last byte (RDS-TCP frees it then), so none may be left behind.
    /// One pass stops at the read budget, and a socket can hold more (its
    /// receive buffer: 2 MiB with [`crate::AckHeadroom`], up to
    /// `net.ipv4.tcp_rmem`'s maximum when autotuned); passes follow until
    /// one ends otherwise (the end, an error, drained), at most as many as
    /// the buffer holds budgets and one more, so that a peer that keeps
    /// sending cannot hold the reactor.
    ///
    /// Before, one pass was all, and a connection killed with more than a
    /// budget unread lost the rest: `connection_killed_mid_stream_loses_nothing`
    /// (rds-tcp's tests) lost 35 to 174 messages in 4 of 20 runs with the
    /// 8 MiB buffer of a 4 MiB [`crate::AckHeadroom`].
    pub(super) fn read_to_end(&mut self, conn: &Arc<PathConn>) {
        let budget = self.inner.cfg.read_budget.max(1);
        let held = socket2::SockRef::from(&conn.stream).recv_buffer_size().unwrap_or(budget);
        for _ in 0..=held.div_ceil(budget) {
            if !self.read_conn(conn, true) || conn.state() == CLOSED {
                break;
            }
        }
    }

    /// Resets the connections whose partly received message got no byte
    /// for `rx_frame_timeout` (paused paths are exempt: we stopped reading).
    pub(super) fn sweep_stalls(&mut self, now: Instant) {
        let timeout = self.inner.cfg.rx_frame_timeout;
        self.next_stall_sweep = None;
        let stalled: Vec<Arc<PathConn>> = self
            .conns
            .values()
            .filter(|c| matches!(c.state(), UP | DRAINING) && !self.inner.rx_paused(c.info.id))
            .filter(|c| {
                let rx = c.rx.lock();
                !rx.decoder.is_idle() && now.saturating_duration_since(rx.progress_at) >= timeout
            })
            .cloned()
            .collect();
        for c in stalled {
            inc(&self.inner.stats.rx_frame_stalled);
            self.close_conn(&c, DownReason::ProtocolError, true);
        }
    }
}

/// Takes `conn`'s read side (`PathConn::rx_busy`); with `wait`, waits for a
/// reader in another thread to finish its pass (a pass never blocks).
pub(crate) fn acquire_rx(conn: &PathConn, wait: bool) -> bool {
    loop {
        if !conn.rx_busy.swap(true, SeqCst) {
            return true;
        }
        if !wait {
            return false;
        }
        std::thread::yield_now();
    }
}

/// What a pass by a thread other than `conn`'s reactor left (more bytes,
/// the end of the stream, an error) goes to that reactor.
pub(crate) fn leave_to_reactor(inner: &Inner, conn: &Arc<PathConn>, end: &ReadEnd) {
    let owner = &inner.reactors[conn.reactor];
    match end {
        ReadEnd::Drained => {}
        ReadEnd::Budget | ReadEnd::Paused => owner.send(Cmd::RxRead(conn.clone())),
        ReadEnd::Eof | ReadEnd::Error => owner.send(Cmd::RxFailed(conn.clone(), false)),
        ReadEnd::Protocol => owner.send(Cmd::RxFailed(conn.clone(), true)),
    }
}

/// Gives `conn`'s read side back (`PathConn::rx_busy`).
pub(crate) fn release_rx(conn: &PathConn) {
    conn.rx_busy.store(false, SeqCst);
}

/// One read pass on `conn`, whose read side the caller holds: reads and
/// delivers until drained (a short read or `EAGAIN`, unless `force`: the
/// connection is ending and is read to its end), the budget
/// (`TcpConfig::read_budget`), a pause, the end or an error; every complete
/// message read is handed to the sink before it returns. Clears `rx_unread` first and sets it again when it
/// stops before the socket is drained.
pub(crate) fn read_pass(
    inner: &Inner,
    sink: &dyn TransportSink,
    conn: &PathConn,
    rbuf: &mut [u8],
    batch: &mut Vec<RxMessage>,
    force: bool,
) -> Pass {
    let budget = inner.cfg.read_budget;
    let (id, inst) = (conn.info.id, conn.info.inst);
    conn.rx_unread.store(false, SeqCst);
    // A short read drained the socket (module docs), unless the end
    // came with the event: then read on to EOF or the error.
    let short_drains = !force;
    batch.clear();
    let mut taken = Intake { batch, bytes: 0, answered: false };
    let mut total = 0usize;
    let mut delivered = 0usize;
    let end = loop {
        if total >= budget {
            break ReadEnd::Budget;
        }
        // The kernel's receive time of the last segment this read took
        // (`sys::recv_stamped`), and whether the read ended exactly at the
        // end of a message and drained the socket: then that message's
        // time is its arrival (`RxMessage::rx_time_exact`).
        let mut stamp = None;
        let first = taken.batch.len();
        let fd = conn.stream.as_raw_fd();
        let step = {
            let mut rx = conn.rx.lock();
            let dec = &mut rx.decoder;
            let step = if dec.is_idle() && dec.last_len() >= DIRECT_MIN {
                // A stream of large messages: the next header and its
                // payload in one `readv`, the payload straight into its
                // buffer (`FrameDecoder::read_guessed`).
                let guess = dec.last_len();
                let read = |bufs: &mut [IoSliceMut<'_>]| {
                    let (n, t) = sys::recv_stamped(fd, bufs)?;
                    stamp = t;
                    Ok(n)
                };
                let res = dec.read_guessed(guess, read, &mut |f| taken.push(f));
                match res {
                    Ok(0) => Err(ReadEnd::Eof),
                    Ok(n) => Ok((n, n < HEADER_LEN + guess)),
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(ReadEnd::Protocol),
                    Err(e) => ReadEnd::of_error(&e).map(|n| (n, false)),
                }
            } else if dec.payload_remaining() > 0 && dec.payload_received() + dec.payload_remaining() >= DIRECT_MIN {
                // Inside a large payload: read straight into it, to its
                // end (so the next read starts at a header, guessed).
                let mut offered = 0;
                let res = dec.read_direct(DIRECT_MAX, |buf| {
                    offered = buf.len();
                    let (n, t) = sys::recv_stamped(fd, &mut [IoSliceMut::new(buf)])?;
                    stamp = t;
                    Ok(n)
                });
                match res {
                    Ok((0, _)) => Err(ReadEnd::Eof),
                    Ok((n, f)) => {
                        if let Some(f) = f {
                            taken.push(f);
                        }
                        Ok((n, n < offered))
                    }
                    Err(e) => ReadEnd::of_error(&e).map(|n| (n, false)),
                }
            } else {
                match sys::recv_stamped(fd, &mut [IoSliceMut::new(rbuf)]) {
                    Ok((0, _)) => Err(ReadEnd::Eof),
                    Ok((n, t)) => {
                        stamp = t;
                        let fed = dec.feed(&rbuf[..n], &mut |f| taken.push(f));
                        match fed {
                            Ok(()) => Ok((n, n < rbuf.len())),
                            Err(_) => Err(ReadEnd::Protocol),
                        }
                    }
                    Err(e) => ReadEnd::of_error(&e).map(|n| (n, false)),
                }
            };
            if stamp.is_some() && taken.batch.len() > first {
                let exact = matches!(step, Ok((_, true))) && dec.is_idle();
                taken.stamp(first, stamp, exact);
            }
            step
        };
        let short = match step {
            Ok((n, short)) => {
                total += n;
                short
            }
            Err(end) => break end,
        };
        if taken.batch.len() >= BATCH_MSGS || taken.bytes >= BATCH_BYTES {
            delivered += taken.deliver(sink, id, inst, crate::path_conn::now_ns());
            if !force && inner.rx_paused(id) {
                break ReadEnd::Paused;
            }
        }
        if short && short_drains {
            inc(&inner.stats.rx_short_reads);
            break ReadEnd::Drained;
        }
    };
    // One clock read for the pass's end: the progress stamp, the answer
    // stamp and the last batch's read time.
    let at = if total > 0 { crate::path_conn::now_ns() } else { 0 };
    if total > 0 {
        let mut rx = conn.rx.lock();
        rx.progress_at = crate::path_conn::instant_of(at);
        if let Some(clamp) = rx.clamp {
            rx.read_since_clamp += total;
            if rx.read_since_clamp >= CLAMP_CHECK_BYTES {
                rx.read_since_clamp = 0;
                drop(rx);
                reassert_clamp(inner, conn, clamp);
            }
        }
    }
    if taken.answered {
        conn.last_rx_event.store(at, SeqCst);
    }
    delivered += taken.deliver(sink, id, inst, at);
    if matches!(end, ReadEnd::Budget | ReadEnd::Paused) {
        conn.rx_unread.store(true, SeqCst);
    }
    Pass { end, delivered, bytes: total, at }
}

/// Bytes a connection with a window clamp ([`crate::AckHeadroom`]) reads
/// between two checks of the clamp ([`reassert_clamp`]).
pub(crate) const CLAMP_CHECK_BYTES: usize = 1 << 20;

/// Lowers the connection's window clamp back to `clamp` if the kernel
/// raised it. Kernels from 6.5 on recompute the clamp from the receive
/// buffer whenever they re-measure the ratio of payload to memory of the
/// segments that arrive (`tcp_measure_rcv_mss`), also on a socket whose
/// buffer the application set; the window would then grow to the whole
/// buffer, and acks wait for reads again ([`crate::AckHeadroom`]). 6.1
/// keeps the clamp. A clamp the kernel lowered (segments that take much
/// more memory than they carry) is left as it is. One `getsockopt` per
/// [`CLAMP_CHECK_BYTES`] read.
pub(crate) fn reassert_clamp(inner: &Inner, conn: &PathConn, clamp: u32) {
    if sys::lower_window_clamp(conn.stream.as_raw_fd(), clamp).unwrap_or(false) {
        inc(&inner.stats.window_clamp_reasserted);
    }
}

/// How a [`read_pass`] went.
pub(crate) struct Pass {
    pub end: ReadEnd,
    /// Messages it delivered, bytes it read.
    pub delivered: usize,
    pub bytes: usize,
    /// When it ended (a `now_ns` value; 0 when it read nothing).
    pub at: u64,
}
