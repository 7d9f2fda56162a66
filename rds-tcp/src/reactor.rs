//! The reactor threads: a mio poll loop each, serving listeners, the
//! connections of the address pairs hashed to it, ack polling and
//! shutdown drains.
//!
//! This file holds what other threads hold of a reactor
//! ([`ReactorHandle`]: the command queue, the waker, the shared timer), the
//! poll loop and its timers, the commands, shutdown drains and closing a
//! connection; the rest is split by what the reactor does:
//!
//! * `connect`: a path's outgoing connection and its completion;
//! * `accept`: listeners, shedding when out of descriptors, deferred
//!   connections, adopting an accepted connection;
//! * `read`: reading, framing and delivering, path 0 first, receive flow
//!   control, stalled partial messages;
//! * `acks`: polling `SIOCOUTQ` for the acks of written messages;
//! * `timer`: the timer shared with transmitting threads (ack polls, ends
//!   of coalescing windows), only ever moved earlier.

use rds_core::types::later;
use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Shutdown, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use rds_core::{DownReason, PathInfo};
use socket2::SockRef;

use crate::path_conn::{CLOSED, CONNECTING, DRAINING, PathConn, UP};
use crate::stats::inc;
use crate::{Inner, down_reason};

mod accept;
mod acks;
mod connect;
pub(crate) mod read;
mod timer;

use accept::{ACCEPT_BACKOFF_MIN, Deferred, reserve};
use read::RBUF;
use timer::{COARSE, TimerShared};

const WAKER: Token = Token(0);
const TIMER: Token = Token(1);
/// Tokens of listeners and connections start here.
pub(crate) const FIRST_TOKEN: usize = 16;

thread_local! {
    static ON_REACTOR: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current thread is a reactor.
pub(crate) fn on_reactor() -> bool {
    ON_REACTOR.with(|c| c.get())
}

pub(crate) enum Cmd {
    Connect(PathInfo),
    /// An accepted connection the core assigned to a path.
    Adopt(Arc<PathConn>),
    Shutdown(PathInfo),
    /// Continue transmitting (handed over by an application thread).
    Xmit(Arc<PathConn>),
    /// A write failed.
    Failed(Arc<PathConn>),
    /// Fallback of [`ReactorHandle::watch`] without a timerfd.
    Watch(Arc<PathConn>),
    Listen(IpAddr, TcpListener),
    Unlisten(IpAddr),
    /// The core resumed reading the path: read what waits in its socket.
    RxResume(rds_core::PathId),
    /// An assisting application thread left this connection unread or
    /// stopped early (`crate::assist`): read it.
    RxRead(Arc<PathConn>),
    /// An assisting thread's read found the end of the stream or an error
    /// (true: a protocol error): read the rest, close it.
    RxFailed(Arc<PathConn>, bool),
    Stop,
}

/// What other threads hold of a reactor.
pub(crate) struct ReactorHandle {
    /// `path_conn::now_ns` of the last readable event of any of its
    /// connections (write coalescing: a stream is one-way).
    pub last_rx: std::sync::atomic::AtomicU64,
    waker: Waker,
    /// The reactor's registry, for a writing thread to add writable events
    /// to a connection's registration (`Inner::want_writable`).
    pub registry: mio::Registry,
    cmds: Mutex<Vec<Cmd>>,
    timer: Mutex<TimerShared>,
}

impl ReactorHandle {
    pub fn new(poll: &Poll) -> io::Result<ReactorHandle> {
        let fd = crate::sys::TimerFd::new().ok();
        if let Some(t) = &fd {
            poll.registry().register(&mut SourceFd(&t.fd()), TIMER, Interest::READABLE)?;
        }
        Ok(ReactorHandle {
            last_rx: std::sync::atomic::AtomicU64::new(0),
            waker: Waker::new(poll.registry(), WAKER)?,
            registry: poll.registry().try_clone()?,
            cmds: Mutex::new(Vec::new()),
            timer: Mutex::new(TimerShared::new(fd)),
        })
    }

    pub fn send(&self, c: Cmd) {
        let first = {
            let mut q = self.cmds.lock();
            q.push(c);
            q.len() == 1
        };
        if first {
            let _ = self.waker.wake();
        }
    }

    /// Have the reactor transmit on the connection at `at` (the end of a
    /// write-coalescing window, or `now`, the caller's clock read), through
    /// its timer.
    pub fn flush_at(&self, conn: Arc<PathConn>, at: Instant, now: Instant) {
        let armed = {
            let mut t = self.timer.lock();
            t.flush_in.push((at, conn.clone()));
            t.arm_at(at.max(now), now)
        };
        if !armed {
            conn.flush_pending.store(false, std::sync::atomic::Ordering::SeqCst);
            self.send(Cmd::Xmit(conn));
        }
    }

    /// A receiving thread left a connection lingering until `at`
    /// (`crate::assist`; `now`: its clock): have the reactor end the
    /// linger then, unless a wait renews it, through its timer (no wake-up
    /// now). `list`: the connection, when the thread listed it
    /// (`PathConn::linger_listed`). The timer is armed for it even when it
    /// was listed already (a renewal): the reactor may have found it taken
    /// over and left it out of its deadlines. False without a timerfd (or
    /// when arming failed): the thread then must not linger; a listed
    /// connection it gave is listed all the same (the reactor drops it
    /// when it finds it not lingering).
    pub fn linger(&self, list: Option<Arc<PathConn>>, at: Instant, now: Instant) -> bool {
        let mut t = self.timer.lock();
        if let Some(c) = list {
            t.linger_in.push(c);
        }
        t.arm_at(at, now)
    }

    /// The connection has messages awaiting their TCP ack: have the reactor
    /// poll it within `within` of `now` (the caller's latest clock read).
    /// Arms the reactor's timer instead of waking the reactor now (one
    /// wake-up saved per message in request/response traffic).
    pub fn watch(&self, conn: Arc<PathConn>, within: Duration, now: Instant) {
        let at = later(now, within);
        let armed = {
            let mut t = self.timer.lock();
            t.watch_in.push(conn.clone());
            t.arm_at(at, now)
        };
        if !armed {
            // No timerfd: fall back to a command wake-up.
            self.send(Cmd::Watch(conn));
        }
    }
}

struct Reactor {
    inner: Arc<Inner>,
    idx: usize,
    poll: Poll,
    conns: rds_core::types::FastMap<Token, Arc<PathConn>>,
    listeners: HashMap<Token, (IpAddr, TcpListener)>,
    /// Connections with messages awaiting their TCP ack.
    watch: Vec<Arc<PathConn>>,
    ack_interval: Duration,
    next_ack_poll: Option<Instant>,
    /// Shutdowns waiting for the peer's FIN, with their deadline.
    drains: Vec<(Instant, Arc<PathConn>)>,
    /// Connections that hit the read budget.
    rx_more: Vec<Arc<PathConn>>,
    /// Coalescing windows to close (flush at the time).
    flushes: Vec<(Instant, Arc<PathConn>)>,
    /// Connections left lingering by a receiving thread (`crate::assist`),
    /// each once (`PathConn::linger_listed`).
    lingers: Vec<Arc<PathConn>>,
    rbuf: Vec<u8>,
    /// The batch of received messages handed to the sink, kept for its
    /// capacity (the sink drains it).
    rx_batch: Vec<rds_core::RxMessage>,
    /// Watched paths of the connection an event came for (reused, see
    /// `poll_siblings`).
    siblings: Vec<Arc<PathConn>>,
    /// Listeners whose accept failed for lack of resources (EMFILE,
    /// ENOBUFS...), retried at this time.
    accept_retry: Option<Instant>,
    /// Next look for partial messages that stalled
    /// (`TcpConfig::rx_frame_timeout`).
    next_stall_sweep: Option<Instant>,
    /// The current pause after such a failure (doubles up to
    /// `ACCEPT_BACKOFF_MAX`, back to the minimum after an accept).
    accept_backoff: Duration,
    /// A descriptor held in reserve (of /dev/null): when `accept` finds the
    /// process out of descriptors, it is closed to accept the oldest queued
    /// connection and close that at once, then taken again. The backlog
    /// drains (each peer sees its connection closed instead of hanging
    /// unanswered) and the listener never spins on a full backlog.
    reserve_fd: Option<std::fs::File>,
    /// Accepted connections the core deferred (`Accept::Defer`): kept
    /// unread (what the peer wrote was acked by our TCP and must not be
    /// lost), offered again with a growing pause, reset after `defer_max`.
    deferred: Vec<Deferred>,
    /// When the next deferred connection is due to be offered.
    defer_at: Option<Instant>,
    /// When the current pass began (a `now_ns` value).
    woke_ns: u64,
}

pub(crate) fn run(inner: Arc<Inner>, idx: usize, poll: Poll) {
    ON_REACTOR.with(|c| c.set(true));
    let ack_interval = inner.cfg.ack_poll_min;
    let mut r = Reactor {
        inner,
        idx,
        poll,
        conns: Default::default(),
        listeners: HashMap::new(),
        watch: Vec::new(),
        ack_interval,
        next_ack_poll: None,
        drains: Vec::new(),
        rx_more: Vec::new(),
        flushes: Vec::new(),
        lingers: Vec::new(),
        rbuf: vec![0; RBUF],
        rx_batch: Vec::new(),
        siblings: Vec::new(),
        accept_retry: None,
        next_stall_sweep: None,
        accept_backoff: ACCEPT_BACKOFF_MIN,
        reserve_fd: reserve(),
        deferred: Vec::new(),
        defer_at: None,
        woke_ns: 0,
    };
    let mut events = Events::with_capacity(1024);
    // Reused from one pass to the next (no allocation per event).
    // (path index, connection, readable, writable, end, read left to an
    // assisting thread)
    let mut ready: Vec<(u8, Arc<PathConn>, bool, bool, bool, bool)> = Vec::new();
    loop {
        let timeout = r.timeout();
        if let Err(e) = r.poll.poll(&mut events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                // Nothing sensible to do but keep trying.
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        // The pass's one clock read (after the one in `timeout`): a clock
        // read is a system call where the clocksource has no vDSO support
        // (the VM rig's hpet), and each pass made five. Deadlines that come
        // due during the pass are met on the next one (`timeout` finds
        // them due).
        let now = Instant::now();
        r.woke_ns = crate::path_conn::ns_of(now);
        if !r.run_commands() {
            r.stop();
            return;
        }
        // Paths that started awaiting acks while we waited: an event below
        // may bring their acks (`poll_siblings`).
        r.adopt_watch_in(now);
        // Connection events, lower path indexes first.
        ready.clear();
        let mut accept_on = Vec::new();
        for ev in events.iter() {
            match ev.token() {
                WAKER => {}
                TIMER => {
                    let mut t = r.inner.reactors[r.idx].timer.lock();
                    if let Some(fd) = &mut t.fd {
                        fd.clear();
                    }
                    t.at = None;
                }
                tok => {
                    if r.listeners.contains_key(&tok) {
                        accept_on.push(tok);
                    } else if let Some(c) = r.conns.get(&tok) {
                        let rd = ev.is_readable() || ev.is_read_closed() || ev.is_error();
                        let wr = ev.is_writable() || ev.is_write_closed() || ev.is_error();
                        // The peer's FIN or a reset: read even a paused path.
                        let end = ev.is_read_closed() || ev.is_error();
                        let mut left = false;
                        if rd {
                            c.rx_unread.store(true, SeqCst);
                            // A thread blocked in a receive polls it and
                            // reads it itself (`crate::assist`); the end
                            // of the stream is still ours.
                            if !end && c.assist.load(SeqCst) > 0 {
                                inc(&r.inner.stats.rx_assist_left);
                                left = true;
                            }
                        }
                        ready.push((c.info.id.index, c.clone(), rd, wr, end, left));
                    }
                }
            }
        }
        for c in std::mem::take(&mut r.rx_more) {
            if let Some(e) = ready.iter_mut().find(|e| Arc::ptr_eq(&e.1, &c)) {
                e.2 = true;
                e.5 = false;
            } else {
                ready.push((c.info.id.index, c, true, false, false, false));
            }
        }
        ready.sort_by_key(|e| e.0);
        for (_, c, rd, wr, end, left) in ready.drain(..) {
            r.conn_event(&c, rd, wr, end, left);
        }
        for tok in accept_on {
            r.accept_all(tok);
        }
        if r.flushes.iter().any(|f| f.0 <= now) {
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut r.flushes).into_iter().partition(|f| f.0 <= now);
            r.flushes = later;
            for (_, c) in due {
                // A batch begun since this flush was armed waits its own
                // window (`PathConn::flush_due`).
                let at = c.flush_due.load(std::sync::atomic::Ordering::SeqCst);
                if at > r.woke_ns {
                    r.flushes.push((crate::path_conn::instant_of(at), c));
                } else if c.flush_pending.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    r.inner.xmit(&c);
                }
            }
        }
        if !r.lingers.is_empty() {
            r.expire_lingers(r.woke_ns);
            if let Some(tick) = r.inner.linger_tick.get() {
                tick();
            }
        }
        if r.next_ack_poll.is_some_and(|t| t <= now) {
            r.poll_watched(now);
        }
        r.expire_drains(now);
        if r.next_stall_sweep.is_some_and(|t| t <= now) {
            r.sweep_stalls(now);
        }
        if r.defer_at.is_some_and(|t| t <= now) {
            r.offer_deferred(now);
        }
        if r.accept_retry.is_some_and(|t| t <= now) {
            r.accept_retry = None;
            let toks: Vec<Token> = r.listeners.keys().copied().collect();
            for tok in toks {
                r.accept_all(tok);
            }
        }
    }
}

impl Reactor {
    /// The poll timeout: zero when work is pending, else the next timer:
    /// through the timerfd (whose resolution is finer than epoll's
    /// milliseconds) when it is less than [`COARSE`] away, else epoll's
    /// own timeout.
    fn timeout(&mut self) -> Option<Duration> {
        let now = Instant::now();
        self.adopt_watch_in(now);
        let handle = &self.inner.reactors[self.idx];
        let mut t = handle.timer.lock();
        self.flushes.append(&mut t.flush_in);
        self.lingers.append(&mut t.linger_in);
        if self.watch.is_empty() {
            self.next_ack_poll = None;
        }
        if !self.rx_more.is_empty() || !handle.cmds.lock().is_empty() {
            return Some(Duration::ZERO);
        }
        let stall = self.inner.cfg.rx_frame_timeout;
        if self.conns.is_empty() || stall.is_zero() {
            self.next_stall_sweep = None;
        } else if self.next_stall_sweep.is_none() {
            self.next_stall_sweep = Some(later(now, (stall / 4).max(Duration::from_millis(10))));
        }
        let next = [
            self.next_ack_poll,
            self.next_stall_sweep,
            self.drains.iter().map(|d| d.0).min(),
            self.accept_retry,
            self.defer_at,
            self.flushes.iter().map(|f| f.0).min(),
            // A linger a thread took over ends with its wait, not here.
            self.lingers
                .iter()
                .filter(|c| c.lingering.load(SeqCst))
                .map(|c| crate::path_conn::instant_of(c.linger_until.load(SeqCst)))
                .min(),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(at) = next else {
            // A stale expiry at most wakes us once for nothing.
            return None;
        };
        if at <= now {
            return Some(Duration::ZERO);
        }
        if at - now >= COARSE || !t.arm_at(at, now) { Some(at - now) } else { None }
    }

    /// Ends the lingers that are due (`crate::assist`): the connection's
    /// readable events come back to the reactor, which epoll then reports
    /// for bytes that came meanwhile. A linger a receiving thread took
    /// over is dropped from the list (its thread lists it again when it
    /// lingers again); one it renewed stays, its end among the reactor's
    /// deadlines (`timeout`).
    fn expire_lingers(&mut self, now_ns: u64) {
        let mut keep = Vec::with_capacity(self.lingers.len());
        for c in std::mem::take(&mut self.lingers) {
            let lingering = c.lingering.load(SeqCst);
            if lingering && c.state() != CLOSED && c.linger_until.load(SeqCst) > now_ns {
                keep.push(c);
                continue;
            }
            if lingering && c.lingering.swap(false, SeqCst) {
                // The linger's count of `quiet` goes back.
                c.quiet.fetch_sub(1, SeqCst);
                self.inner.refresh_quiet(&c);
                inc(&self.inner.stats.rx_linger_expired);
            }
            // Unlisted, unless a thread left it lingering again meanwhile
            // and did not list it itself (it saw it listed).
            c.linger_listed.store(false, SeqCst);
            if c.lingering.load(SeqCst) && !c.linger_listed.swap(true, SeqCst) {
                keep.push(c);
            }
        }
        self.lingers = keep;
    }

    /// Takes the paths transmitting threads started watching into
    /// `self.watch`, with the ack timer they armed.
    fn adopt_watch_in(&mut self, now: Instant) {
        let (incoming, armed) = {
            let mut t = self.inner.reactors[self.idx].timer.lock();
            (std::mem::take(&mut t.watch_in), t.at)
        };
        if incoming.is_empty() {
            return;
        }
        for c in incoming {
            if c.state() != CLOSED && !self.watch.iter().any(|w| Arc::ptr_eq(w, &c)) {
                self.watch.push(c);
            }
        }
        self.ack_interval = self.inner.cfg.ack_poll_min;
        let at = armed.unwrap_or(later(now, self.ack_interval));
        if self.next_ack_poll.is_none_or(|x| x > at) {
            self.next_ack_poll = Some(at);
        }
    }

    /// Runs queued commands; false on Stop.
    fn run_commands(&mut self) -> bool {
        let cmds = std::mem::take(&mut *self.inner.reactors[self.idx].cmds.lock());
        for c in cmds {
            match c {
                Cmd::Stop => return false,
                Cmd::Connect(info) => self.connect(info),
                Cmd::Adopt(conn) => self.adopt(conn),
                Cmd::Shutdown(info) => self.shutdown(info),
                Cmd::Xmit(conn) => self.inner.xmit(&conn),
                Cmd::Watch(conn) => self.watch(conn),
                Cmd::RxResume(id) => {
                    let conn = self.inner.paths.lock().get(&id).cloned();
                    if let Some(c) = conn.filter(|c| c.reactor == self.idx && matches!(c.state(), UP | DRAINING)) {
                        c.rx.lock().progress_at = Instant::now();
                        self.read_next_pass(c);
                    }
                }
                Cmd::RxRead(c) => {
                    if c.reactor == self.idx && matches!(c.state(), UP | DRAINING) {
                        self.read_next_pass(c);
                    }
                }
                Cmd::RxFailed(c, true) => {
                    if c.state() != CLOSED {
                        self.close_conn(&c, DownReason::ProtocolError, true);
                    }
                }
                Cmd::RxFailed(conn, false) | Cmd::Failed(conn) => {
                    if conn.state() != CLOSED {
                        self.read_to_end(&conn);
                        if conn.state() != CLOSED {
                            let why = down_reason(&conn, DownReason::Closed);
                            self.close_conn(&conn, why, false);
                        }
                    }
                }
                Cmd::Listen(addr, l) => {
                    let tok = self.inner.token();
                    let fd = l.as_raw_fd();
                    if self.poll.registry().register(&mut SourceFd(&fd), tok, Interest::READABLE).is_ok() {
                        self.listeners.insert(tok, (addr, l));
                        // Connections queued before registration.
                        self.accept_all(tok);
                    }
                }
                Cmd::Unlisten(addr) => {
                    let toks: Vec<Token> =
                        self.listeners.iter().filter(|(_, (a, _))| *a == addr).map(|(t, _)| *t).collect();
                    for t in toks {
                        if let Some((_, l)) = self.listeners.remove(&t) {
                            let _ = self.poll.registry().deregister(&mut SourceFd(&l.as_raw_fd()));
                        }
                    }
                }
            }
        }
        true
    }

    fn stop(&mut self) {
        for (_, c) in self.conns.drain() {
            c.state.store(CLOSED, SeqCst);
            let _ = self.poll.registry().deregister(&mut SourceFd(&c.stream.as_raw_fd()));
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        self.listeners.clear();
        self.watch.clear();
        self.drains.clear();
        self.rx_more.clear();
    }

    fn register(&mut self, conn: &Arc<PathConn>) -> io::Result<()> {
        let fd = conn.stream.as_raw_fd();
        self.poll.registry().register(&mut SourceFd(&fd), conn.token, Interest::READABLE | Interest::WRITABLE)?;
        self.conns.insert(conn.token, conn.clone());
        Ok(())
    }

    /// The core asks to close this instance of a path.
    fn shutdown(&mut self, info: PathInfo) {
        let conn = self
            .inner
            .paths
            .lock()
            .get(&info.id)
            .filter(|c| c.info.inst == info.inst)
            .cloned()
            .or_else(|| self.conns.values().find(|c| c.info.id == info.id && c.info.inst == info.inst).cloned());
        let Some(conn) = conn else {
            if let Some(sink) = self.inner.sink() {
                sink.path_down(info.id, info.inst, DownReason::ShutdownDone);
            }
            return;
        };
        *conn.requested.lock() = Some(DownReason::ShutdownDone);
        match conn.state() {
            // One the peer has not evidently taken is reset, not drained
            // (`PathInfo::taken`): a 6.1 kernel may still hold it in its
            // accept queue.
            CONNECTING => self.close_conn(&conn, DownReason::ShutdownDone, true),
            UP if !info.taken => {
                // What already arrived is delivered first (as for an
                // ending connection): the peer's TCP counts it as
                // delivered (a kernel frees what our TCP acked).
                self.read_to_end(&conn);
                if conn.state() != CLOSED {
                    inc(&self.inner.stats.reset_untaken);
                    self.close_conn(&conn, DownReason::ShutdownDone, true);
                }
            }
            UP => {
                {
                    let _tx = conn.tx.lock();
                    conn.state.store(DRAINING, SeqCst);
                }
                let _ = conn.stream.shutdown(Shutdown::Write);
                self.drains.push((later(Instant::now(), self.inner.cfg.shutdown_drain), conn.clone()));
                self.read_conn(&conn, false);
            }
            _ => {}
        }
    }

    fn expire_drains(&mut self, now: Instant) {
        if !self.drains.iter().any(|d| d.0 <= now) {
            return;
        }
        let (due, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.drains).into_iter().partition(|d| d.0 <= now);
        self.drains = keep;
        for (_, c) in due {
            if c.state() != CLOSED {
                // Deliver whatever arrived before giving up on the FIN.
                self.read_to_end(&c);
                if c.state() != CLOSED {
                    let why = down_reason(&c, DownReason::Closed);
                    self.close_conn(&c, why, false);
                }
            }
        }
    }

    /// `end`: the peer's FIN or an error came with the event; a paused path
    /// is read then too (to its end: what is left in the socket, bounded by
    /// its receive buffer), so that it notices the end and goes down.
    ///
    /// `left`: a thread blocked in a receive reads it (`crate::assist`):
    /// everything else about the event (acks, the writable side) is still
    /// handled here.
    fn conn_event(&mut self, conn: &Arc<PathConn>, readable: bool, writable: bool, end: bool, left: bool) {
        if end {
            conn.rx_ending.store(true, SeqCst);
        }
        match conn.state() {
            CONNECTING if readable || writable => {
                self.check_connect(conn, readable && !writable);
                // Data the peer sent right after accepting came with this
                // (edge-triggered) event: read it now, or nothing will ever
                // announce it again once the window is full.
                if conn.state() == UP {
                    inc(&self.inner.stats.data_ready_calls);
                    self.read_conn(conn, end);
                }
            }
            UP | DRAINING => {
                if readable {
                    // The connection counts as answered when the read
                    // brings a message (`read::is_answer`), not for the
                    // event.
                    self.inner.reactors[self.idx].last_rx.store(self.woke_ns, SeqCst);
                }
                if writable {
                    conn.wr_gen.fetch_add(1, SeqCst);
                    if conn.wait_writable.swap(false, SeqCst) {
                        self.inner.xmit(conn);
                    }
                    self.inner.drop_writable(conn);
                }
                if readable && !left {
                    inc(&self.inner.stats.data_ready_calls);
                    self.read_conn(conn, end);
                }
                if conn.state() != CLOSED {
                    self.poll_one(conn);
                }
                if readable {
                    self.poll_siblings(conn);
                }
            }
            _ => {}
        }
    }

    /// Closes a connection (reset when `rst`) and reports it down.
    fn close_conn(&mut self, conn: &Arc<PathConn>, why: DownReason, rst: bool) {
        if conn.state() == CLOSED {
            return;
        }
        // A blocked receiver reading it (`crate::assist`) delivers what it
        // read before the path goes down; the read side is then kept: no
        // pass starts on a closed connection.
        read::acquire_rx(conn, true);
        let (acked, was_up) = {
            let mut tx = conn.tx.lock();
            let prev = conn.state.swap(CLOSED, SeqCst);
            if prev == CLOSED {
                return;
            }
            tx.watched = false;
            let acked = if prev == CONNECTING { None } else { tx.poll_acks(&conn.stream).0 };
            if tx.mid_message() {
                inc(&self.inner.stats.tx_partial);
            }
            (acked, prev != CONNECTING)
        };
        if !conn.rx.lock().decoder.is_idle() {
            inc(&self.inner.stats.rx_partial_discarded);
        }
        let _ = self.poll.registry().deregister(&mut SourceFd(&conn.stream.as_raw_fd()));
        self.conns.remove(&conn.token);
        self.watch.retain(|c| !Arc::ptr_eq(c, conn));
        self.rx_more.retain(|c| !Arc::ptr_eq(c, conn));
        self.drains.retain(|d| !Arc::ptr_eq(&d.1, conn));
        if rst {
            let _ = SockRef::from(&conn.stream).set_linger(Some(Duration::ZERO));
        } else if was_up {
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        {
            let mut paths = self.inner.paths.lock();
            if paths.get(&conn.info.id).is_some_and(|c| Arc::ptr_eq(c, conn)) {
                paths.remove(&conn.info.id);
            }
        }
        if let Some(sink) = self.inner.sink() {
            if let Some(s) = acked {
                sink.acked(conn.info.id, conn.info.inst, s);
            }
            sink.path_down(conn.info.id, conn.info.inst, why);
        }
        self.deferred_due(conn.info.faddr);
    }
}
