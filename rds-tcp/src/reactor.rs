//! The reactor threads: a mio poll loop each, serving listeners, the
//! connections of the address pairs hashed to it, ack polling and
//! shutdown drains.

use rds_core::types::later;
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use rds_core::wire::Frame;
use rds_core::{Accept, DownReason, PathInfo, RxMessage, TransportKind, addr_cmp};
use socket2::{SockAddr, SockRef, Socket, Type};

use crate::path_conn::{CLOSED, CONNECTING, DRAINING, PathConn, UP};
use crate::stats::inc;
use crate::{Inner, down_reason, sock_domain};

const WAKER: Token = Token(0);
const TIMER: Token = Token(1);
/// Tokens of listeners and connections start here.
pub(crate) const FIRST_TOKEN: usize = 16;

/// Read buffer of a reactor.
const RBUF: usize = 256 << 10;
/// Payload bytes still missing above which reads go straight into the
/// message's buffer.
const DIRECT_MIN: usize = 16 << 10;
/// Bytes offered per direct read at most (a whole maximal payload: one
/// `read` takes all that is queued). The decoder offers less until that
/// much arrived: its window grows with the bytes received
/// (`FrameDecoder::read_direct`), so a hostile `h_len` costs what the peer
/// really sent.
const DIRECT_MAX: usize = 1 << 20;
/// Messages handed to the sink per call at most.
const BATCH_MSGS: usize = 1024;
const BATCH_BYTES: usize = 4 << 20;

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
    Stop,
}

/// The reactor's timer, shared so that a transmitting thread can start ack
/// polling without waking the reactor.
struct TimerShared {
    fd: Option<crate::sys::TimerFd>,
    /// When the timerfd fires, if armed.
    at: Option<Instant>,
    /// Connections that started awaiting acks, not yet seen by the reactor.
    watch_in: Vec<Arc<PathConn>>,
    /// Connections to flush at the end of their coalescing window.
    flush_in: Vec<(Instant, Arc<PathConn>)>,
}

impl TimerShared {
    fn arm_at(&mut self, at: Instant, now: Instant) -> bool {
        match &mut self.fd {
            Some(fd) => {
                if self.at != Some(at) {
                    if fd.arm(at.saturating_duration_since(now)).is_err() {
                        return false;
                    }
                    self.at = Some(at);
                }
                true
            }
            None => false,
        }
    }
}

/// What other threads hold of a reactor.
pub(crate) struct ReactorHandle {
    waker: Waker,
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
            waker: Waker::new(poll.registry(), WAKER)?,
            cmds: Mutex::new(Vec::new()),
            timer: Mutex::new(TimerShared { fd, at: None, watch_in: Vec::new(), flush_in: Vec::new() }),
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
    /// write-coalescing window), through its timer.
    pub fn flush_at(&self, conn: Arc<PathConn>, at: Instant) {
        let now = Instant::now();
        let armed = {
            let mut t = self.timer.lock();
            t.flush_in.push((at, conn.clone()));
            if t.at.is_some_and(|x| x <= at) { true } else { t.arm_at(at.max(now), now) }
        };
        if !armed {
            conn.flush_pending.store(false, std::sync::atomic::Ordering::SeqCst);
            self.send(Cmd::Xmit(conn));
        }
    }

    /// The connection has messages awaiting their TCP ack: have the reactor
    /// poll it within `within`. Arms the reactor's timer instead of waking
    /// the reactor now (one wake-up saved per message in request/response
    /// traffic).
    pub fn watch(&self, conn: Arc<PathConn>, within: Duration) {
        let now = Instant::now();
        let at = later(now, within);
        let armed = {
            let mut t = self.timer.lock();
            t.watch_in.push(conn.clone());
            if t.at.is_some_and(|x| x <= at) { true } else { t.arm_at(at, now) }
        };
        if !armed {
            // No timerfd: fall back to a command wake-up.
            self.send(Cmd::Watch(conn));
        }
    }
}

/// How reading a connection ended.
enum ReadEnd {
    /// `EAGAIN`: read everything there was.
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

struct Reactor {
    inner: Arc<Inner>,
    idx: usize,
    poll: Poll,
    conns: HashMap<Token, Arc<PathConn>>,
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
    rbuf: Vec<u8>,
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
}

struct Deferred {
    /// When the core first deferred it.
    since: Instant,
    /// When it is offered again, and the pause before that.
    next: Instant,
    pause: Duration,
    stream: TcpStream,
    peer: SocketAddr,
}

/// How soon a deferred connection is offered to the core again at first;
/// the pause doubles up to `DEFER_RETRY_MAX` (each offer takes the node's
/// lock).
const DEFER_RETRY: Duration = Duration::from_millis(5);
const DEFER_RETRY_MAX: Duration = Duration::from_millis(100);
/// Pauses of the listener after `accept` found no resources.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

fn reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

pub(crate) fn run(inner: Arc<Inner>, idx: usize, poll: Poll) {
    ON_REACTOR.with(|c| c.set(true));
    let ack_interval = inner.cfg.ack_poll_min;
    let mut r = Reactor {
        inner,
        idx,
        poll,
        conns: HashMap::new(),
        listeners: HashMap::new(),
        watch: Vec::new(),
        ack_interval,
        next_ack_poll: None,
        drains: Vec::new(),
        rx_more: Vec::new(),
        flushes: Vec::new(),
        rbuf: vec![0; RBUF],
        accept_retry: None,
        next_stall_sweep: None,
        accept_backoff: ACCEPT_BACKOFF_MIN,
        reserve_fd: reserve(),
        deferred: Vec::new(),
        defer_at: None,
    };
    let mut events = Events::with_capacity(1024);
    loop {
        let timeout = r.timeout();
        if let Err(e) = r.poll.poll(&mut events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                // Nothing sensible to do but keep trying.
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        if !r.run_commands() {
            r.stop();
            return;
        }
        // Connection events, lower path indexes first.
        let mut ready: Vec<(u8, Arc<PathConn>, bool, bool, bool)> = Vec::new();
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
                        ready.push((c.info.id.index, c.clone(), rd, wr, end));
                    }
                }
            }
        }
        for c in std::mem::take(&mut r.rx_more) {
            if let Some(e) = ready.iter_mut().find(|e| Arc::ptr_eq(&e.1, &c)) {
                e.2 = true;
            } else {
                ready.push((c.info.id.index, c, true, false, false));
            }
        }
        ready.sort_by_key(|e| e.0);
        for (_, c, rd, wr, end) in ready {
            r.conn_event(&c, rd, wr, end);
        }
        for tok in accept_on {
            r.accept_all(tok);
        }
        let now = Instant::now();
        if r.flushes.iter().any(|f| f.0 <= now) {
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut r.flushes).into_iter().partition(|f| f.0 <= now);
            r.flushes = later;
            for (_, c) in due {
                if c.flush_pending.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    r.inner.xmit(&c);
                }
            }
        }
        if r.next_ack_poll.is_some_and(|t| t <= now) {
            r.poll_watched();
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

fn rx_time_ns() -> Option<u64> {
    SystemTime::now().duration_since(UNIX_EPOCH).ok().map(|d| d.as_nanos() as u64)
}

fn rx_msg(f: Frame, ts: Option<u64>) -> RxMessage {
    let mut m = RxMessage::from(f);
    m.rx_time_ns = ts;
    m
}

impl Reactor {
    /// The poll timeout: zero when work is pending, else the next timer
    /// (through the timerfd, whose resolution is finer than epoll's
    /// milliseconds).
    fn timeout(&mut self) -> Option<Duration> {
        let handle = &self.inner.reactors[self.idx];
        let mut t = handle.timer.lock();
        let now = Instant::now();
        if !t.watch_in.is_empty() {
            for c in std::mem::take(&mut t.watch_in) {
                if c.state() != CLOSED && !self.watch.iter().any(|w| Arc::ptr_eq(w, &c)) {
                    self.watch.push(c);
                }
            }
            self.ack_interval = self.inner.cfg.ack_poll_min;
            let at = t.at.unwrap_or(later(now, self.ack_interval));
            if self.next_ack_poll.is_none_or(|x| x > at) {
                self.next_ack_poll = Some(at);
            }
        }
        self.flushes.append(&mut t.flush_in);
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
        if t.arm_at(at, now) { None } else { Some(at - now) }
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
                        // Path 0 held its connection's other paths back
                        // (`path0_read`): read them too.
                        let lanes: Vec<Arc<PathConn>> = if id.index == 0 {
                            self.conns
                                .values()
                                .filter(|x| x.info.id.conn == id.conn && x.info.id.index != 0)
                                .cloned()
                                .collect()
                        } else {
                            Vec::new()
                        };
                        for c in std::iter::once(c).chain(lanes) {
                            if !self.rx_more.iter().any(|x| Arc::ptr_eq(x, &c)) {
                                self.rx_more.push(c);
                            }
                        }
                    }
                }
                Cmd::Failed(conn) => {
                    if conn.state() != CLOSED {
                        self.read_conn(&conn, true);
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

    /// Opens the connection of a path.
    fn connect(&mut self, info: PathInfo) {
        let old = self.inner.paths.lock().get(&info.id).cloned();
        if let Some(old) = old {
            if old.info.inst >= info.inst {
                return;
            }
            self.close_conn(&old, DownReason::Closed, old.state() == CONNECTING);
        }
        let Some(sink) = self.inner.sink() else { return };
        let peer = SocketAddr::new(info.faddr, self.inner.cfg.port);
        let stream = match self.open(info, peer) {
            Ok(s) => s,
            Err(_) => {
                sink.path_down(info.id, info.inst, DownReason::ConnectFailed);
                return;
            }
        };
        let conn = Arc::new(PathConn::new(self.inner.token(), self.idx, info, stream, peer, CONNECTING));
        if self.register(&conn).is_err() {
            sink.path_down(info.id, info.inst, DownReason::ConnectFailed);
            return;
        }
        self.inner.paths.lock().insert(info.id, conn);
    }

    fn open(&self, info: PathInfo, peer: SocketAddr) -> io::Result<TcpStream> {
        let s = Socket::new(sock_domain(&info.faddr), Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        self.inner.tune(&SockRef::from(&s))?;
        s.bind(&SockAddr::from(SocketAddr::new(info.laddr, 0)))?;
        match s.connect(&SockAddr::from(peer)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        Ok(s.into())
    }

    /// An outgoing connection became writable (or failed).
    fn check_connect(&mut self, conn: &Arc<PathConn>, hup: bool) {
        let failed = match conn.stream.take_error() {
            Ok(Some(_)) | Err(_) => true,
            Ok(None) => match conn.stream.peer_addr() {
                Ok(_) => false,
                Err(e) if e.kind() == io::ErrorKind::NotConnected && !hup => return,
                Err(_) => true,
            },
        };
        if failed {
            self.close_conn(conn, DownReason::ConnectFailed, false);
            return;
        }
        let current = self.inner.paths.lock().get(&conn.info.id).is_some_and(|c| Arc::ptr_eq(c, conn));
        if !current {
            self.close_conn(conn, DownReason::Closed, true);
            return;
        }
        if addr_cmp(&conn.info.laddr, &conn.info.faddr) != std::cmp::Ordering::Less {
            // The poke: the peer has the smaller address and connects to us.
            self.close_conn(conn, DownReason::DirectionRule, true);
            return;
        }
        conn.state.store(UP, SeqCst);
        if let Some(sink) = self.inner.sink() {
            sink.path_up(conn.info.id, conn.info.inst);
        }
        self.inner.xmit(conn);
    }

    /// Accepts every pending connection of a listener.
    fn accept_all(&mut self, tok: Token) {
        loop {
            let res = match self.listeners.get(&tok) {
                Some((_, l)) => l.accept(),
                None => return,
            };
            match res {
                Ok((stream, peer)) => {
                    self.accept_backoff = ACCEPT_BACKOFF_MIN;
                    if self.reserve_fd.is_none() {
                        self.reserve_fd = reserve();
                    }
                    self.accepted(stream, peer);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // ECONNABORTED and the like concern one connection.
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
                Err(e) => {
                    inc(&self.inner.stats.accept_no_resources);
                    let fds = matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
                    if fds && self.shed(tok) {
                        continue;
                    }
                    // The edge is consumed: come back for the queued ones,
                    // after a pause that grows while the shortage lasts.
                    self.accept_retry = Some(Instant::now() + self.accept_backoff);
                    self.accept_backoff = self.accept_backoff.saturating_mul(2).min(ACCEPT_BACKOFF_MAX);
                    return;
                }
            }
        }
    }

    /// Out of descriptors: gives up the reserve descriptor to accept the
    /// oldest queued connection and close it at once (reset, counted), then
    /// takes the reserve again. Returns whether one was shed (the caller
    /// goes on: the backlog drains instead of filling for ever).
    fn shed(&mut self, tok: Token) -> bool {
        if self.reserve_fd.take().is_none() {
            return false;
        }
        let res = match self.listeners.get(&tok) {
            Some((_, l)) => l.accept(),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        let shed = match res {
            Ok((stream, _)) => {
                let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                drop(stream);
                inc(&self.inner.stats.accept_shed);
                true
            }
            Err(_) => false,
        };
        self.reserve_fd = reserve();
        shed && self.reserve_fd.is_some()
    }

    fn accepted(&mut self, stream: TcpStream, peer: SocketAddr) {
        let Ok(local) = stream.local_addr() else { return };
        if stream.set_nonblocking(true).is_err() || self.inner.tune(&SockRef::from(&stream)).is_err() {
            return;
        }
        let reset = |s: &TcpStream| {
            let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
        };
        let Some(sink) = self.inner.sink() else {
            reset(&stream);
            return;
        };
        match sink.accept(TransportKind::Tcp, local.ip(), peer.ip(), peer.port()) {
            Accept::Path(info) => {
                let r = self.inner.reactor_of(info.laddr, info.faddr);
                let conn = Arc::new(PathConn::new(self.inner.token(), r, info, stream, peer, UP));
                if r == self.idx {
                    self.adopt(conn);
                } else {
                    self.inner.reactors[r].send(Cmd::Adopt(conn));
                }
            }
            Accept::Reject | Accept::RejectPeerLarger => {
                inc(&self.inner.stats.listen_closed_stale);
                reset(&stream);
            }
            Accept::Defer => {
                let now = Instant::now();
                self.defer(Deferred { since: now, next: now + DEFER_RETRY, pause: DEFER_RETRY, stream, peer });
            }
        }
    }

    /// Keeps a deferred connection, at most `defer_per_peer` per peer
    /// address: beyond, the peer's oldest is reset (a peer only connects
    /// again when its earlier connection is dead to it).
    fn defer(&mut self, d: Deferred) {
        let ip = d.peer.ip();
        let max = self.inner.cfg.defer_per_peer.max(1);
        while self.deferred.iter().filter(|o| o.peer.ip() == ip).count() >= max {
            let oldest = self
                .deferred
                .iter()
                .enumerate()
                .filter(|(_, o)| o.peer.ip() == ip)
                .min_by_key(|(_, o)| o.since)
                .map(|(i, _)| i)
                .unwrap();
            let old = self.deferred.swap_remove(oldest);
            inc(&self.inner.stats.deferred_replaced);
            inc(&self.inner.stats.listen_closed_stale);
            let _ = SockRef::from(&old.stream).set_linger(Some(Duration::ZERO));
        }
        if self.defer_at.is_none_or(|t| t > d.next) {
            self.defer_at = Some(d.next);
        }
        self.deferred.push(d);
    }

    /// How long a deferred connection may wait: past the old connection's
    /// drain with a margin.
    fn defer_max(&self) -> Duration {
        self.inner.cfg.defer_max.max(self.inner.cfg.shutdown_drain.saturating_add(Duration::from_secs(1)))
    }

    /// Offers the due deferred connections to the core again; resets those
    /// that waited longer than `defer_max`.
    fn offer_deferred(&mut self, now: Instant) {
        let max = self.defer_max();
        let (due, later): (Vec<Deferred>, Vec<Deferred>) =
            std::mem::take(&mut self.deferred).into_iter().partition(|d| d.next <= now);
        self.deferred = later;
        for d in due {
            if now.duration_since(d.since) > max {
                inc(&self.inner.stats.deferred_expired);
                inc(&self.inner.stats.listen_closed_stale);
                let _ = SockRef::from(&d.stream).set_linger(Some(Duration::ZERO));
                continue;
            }
            let n = self.deferred.len();
            self.accepted(d.stream, d.peer);
            if self.deferred.len() > n {
                // Deferred again: keep its age, back off.
                let e = self.deferred.last_mut().unwrap();
                e.since = d.since;
                e.pause = (d.pause * 2).min(DEFER_RETRY_MAX);
                e.next = now + e.pause;
            }
        }
        self.defer_at = self.deferred.iter().map(|d| d.next).min();
    }

    /// A path of `faddr` went down: its deferred connections are offered
    /// at once (the slot they wait for may be free now).
    fn deferred_due(&mut self, faddr: IpAddr) {
        let now = Instant::now();
        let mut any = false;
        for d in self.deferred.iter_mut().filter(|d| d.peer.ip() == faddr) {
            d.next = now;
            d.pause = DEFER_RETRY;
            any = true;
        }
        if any {
            self.defer_at = Some(now);
        }
    }

    /// Starts serving an accepted connection on this reactor.
    fn adopt(&mut self, conn: Arc<PathConn>) {
        let id = conn.info.id;
        let old = self.inner.paths.lock().get(&id).cloned();
        if let Some(old) = old {
            if old.info.inst > conn.info.inst {
                // A newer instance already serves the path.
                let _ = SockRef::from(&conn.stream).set_linger(Some(Duration::ZERO));
                return;
            }
            if old.state() == CONNECTING {
                inc(&self.inner.stats.connect_raced);
            }
            self.close_conn(&old, DownReason::Closed, old.state() == CONNECTING);
        }
        if self.register(&conn).is_err() {
            conn.state.store(CLOSED, SeqCst);
            if let Some(sink) = self.inner.sink() {
                sink.path_down(id, conn.info.inst, DownReason::Closed);
            }
            return;
        }
        self.inner.paths.lock().insert(id, conn.clone());
        // Kicks that came while the core was assigning the path found no
        // connection: transmit now.
        self.inner.xmit(&conn);
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
            CONNECTING => self.close_conn(&conn, DownReason::ShutdownDone, false),
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
                self.read_conn(&c, true);
                if c.state() != CLOSED {
                    let why = down_reason(&c, DownReason::Closed);
                    self.close_conn(&c, why, false);
                }
            }
        }
    }

    fn watch(&mut self, conn: Arc<PathConn>) {
        if conn.state() == CLOSED {
            conn.tx.lock().watched = false;
            return;
        }
        if !self.watch.iter().any(|c| Arc::ptr_eq(c, &conn)) {
            self.watch.push(conn);
        }
        self.ack_interval = self.inner.cfg.ack_poll_min;
        let at = later(Instant::now(), self.ack_interval);
        if self.next_ack_poll.is_none_or(|t| t > at) {
            self.next_ack_poll = Some(at);
        }
    }

    /// Polls `SIOCOUTQ` of every connection with messages awaiting acks.
    fn poll_watched(&mut self) {
        let mut progress = false;
        let mut reports = Vec::new();
        self.watch.retain(|c| {
            let mut tx = c.tx.lock();
            let (seq, advanced) = tx.poll_acks(&c.stream);
            progress |= advanced;
            if let Some(s) = seq {
                reports.push((c.clone(), s));
            }
            if !tx.has_unacked() || c.state() == CLOSED {
                tx.watched = false;
                false
            } else {
                true
            }
        });
        if progress {
            inc(&self.inner.stats.write_space_calls);
        }
        if let Some(sink) = self.inner.sink() {
            for (c, s) in reports {
                sink.acked(c.info.id, c.info.inst, s);
            }
        }
        let (min, max) = (self.inner.cfg.ack_poll_min, self.inner.cfg.ack_poll_max);
        self.ack_interval = if progress { min } else { self.ack_interval.saturating_mul(2).min(max) };
        self.next_ack_poll = (!self.watch.is_empty()).then(|| later(Instant::now(), self.ack_interval));
    }

    /// Acks of one connection (after it was readable or writable).
    fn poll_one(&self, conn: &Arc<PathConn>) {
        let (seq, advanced) = {
            let mut tx = conn.tx.lock();
            if !tx.watched {
                return;
            }
            tx.poll_acks(&conn.stream)
        };
        if advanced {
            inc(&self.inner.stats.write_space_calls);
        }
        if let (Some(s), Some(sink)) = (seq, self.inner.sink()) {
            sink.acked(conn.info.id, conn.info.inst, s);
        }
    }

    /// `end`: the peer's FIN or an error came with the event; a paused path
    /// is read then too (to its end: what is left in the socket, bounded by
    /// its receive buffer), so that it notices the end and goes down.
    fn conn_event(&mut self, conn: &Arc<PathConn>, readable: bool, writable: bool, end: bool) {
        if end {
            conn.rx_ending.store(true, SeqCst);
        }
        match conn.state() {
            CONNECTING if readable || writable => {
                self.check_connect(conn, readable && !writable);
                // Data the peer sent right after accepting came with this
                // (edge-triggered) event: read it now, or nothing will ever
                // announce it again once the window is full.
                if conn.state() == UP && self.path0_read(conn) {
                    inc(&self.inner.stats.data_ready_calls);
                    self.read_conn(conn, end);
                }
            }
            UP | DRAINING => {
                if writable {
                    conn.wr_gen.fetch_add(1, SeqCst);
                    if conn.wait_writable.swap(false, SeqCst) {
                        self.inner.xmit(conn);
                    }
                }
                if readable && self.path0_read(conn) {
                    inc(&self.inner.stats.data_ready_calls);
                    self.read_conn(conn, end);
                }
                if conn.state() != CLOSED {
                    self.poll_one(conn);
                }
            }
            _ => {}
        }
    }

    /// Before another path of a connection is read, its path 0 is read
    /// until `EAGAIN`. A socket moves from path 0 to its own lane once its
    /// path-0 messages are acked, and our TCP acks what it queued, not what
    /// we read: the peer's first message on the lane may arrive while its
    /// last path-0 message still waits in our socket, and whatever order
    /// readiness is reported in, the path-0 bytes must be delivered first.
    /// Returns false when path 0 stopped at the read budget: `conn` is then
    /// read on a later pass (after path 0 again).
    fn path0_read(&mut self, conn: &Arc<PathConn>) -> bool {
        let id = conn.info.id;
        if id.index == 0 {
            return true;
        }
        let p0 = self.inner.paths.lock().get(&rds_core::PathId { conn: id.conn, index: 0 }).cloned();
        let Some(p0) = p0.filter(|p| matches!(p.state(), UP | DRAINING)) else { return true };
        if self.inner.rx_paused(p0.info.id) {
            // Path 0's bytes wait in its socket: the lanes wait behind them
            // (path 0's resume reads them all again).
            inc(&self.inner.stats.rx_lane_deferred);
            return false;
        }
        if self.read_conn(&p0, false) {
            // Path 0 has more than the budget: it goes first again.
            self.rx_more.push(conn.clone());
            inc(&self.inner.stats.rx_lane_deferred);
            return false;
        }
        true
    }

    /// Reads and delivers until `EAGAIN`, the budget, the end or an error;
    /// closes the connection at the end of the stream or on an error.
    /// Returns true when it stopped at the budget (`conn` is then queued in
    /// `rx_more` for the next pass).
    ///
    /// A path the core paused is not read (its bytes wait in the socket and
    /// the TCP window closes; the resume queues it in `rx_more`), unless
    /// `force` (the connection is ending: what it holds is delivered, never
    /// dropped). A pause that comes with a batch handed to the sink stops
    /// the reading after that batch: the overshoot is one batch.
    fn read_conn(&mut self, conn: &Arc<PathConn>, force: bool) -> bool {
        let Some(sink) = self.inner.sink() else { return false };
        let (id, inst) = (conn.info.id, conn.info.inst);
        let force = force || conn.rx_ending.load(SeqCst);
        if !force && self.inner.rx_paused(id) {
            inc(&self.inner.stats.rx_paused);
            return false;
        }
        let budget = self.inner.cfg.read_budget;
        let mut batch: Vec<RxMessage> = Vec::new();
        let mut batch_bytes = 0usize;
        let mut total = 0usize;
        let end = loop {
            if total >= budget {
                break ReadEnd::Budget;
            }
            let step = {
                let mut rx = conn.rx.lock();
                let dec = &mut rx.decoder;
                if dec.payload_remaining() >= DIRECT_MIN {
                    match dec.read_direct(DIRECT_MAX, |buf| (&conn.stream).read(buf)) {
                        Ok((0, _)) => Err(ReadEnd::Eof),
                        Ok((n, f)) => {
                            if let Some(f) = f {
                                batch_bytes += f.payload.len();
                                batch.push(rx_msg(f, rx_time_ns()));
                            }
                            Ok(n)
                        }
                        Err(e) => ReadEnd::of_error(&e),
                    }
                } else {
                    match (&conn.stream).read(&mut self.rbuf) {
                        Ok(0) => Err(ReadEnd::Eof),
                        Ok(n) => {
                            let ts = rx_time_ns();
                            let fed = dec.feed(&self.rbuf[..n], &mut |f| {
                                batch_bytes += f.payload.len();
                                batch.push(rx_msg(f, ts));
                            });
                            match fed {
                                Ok(()) => Ok(n),
                                Err(_) => Err(ReadEnd::Protocol),
                            }
                        }
                        Err(e) => ReadEnd::of_error(&e),
                    }
                }
            };
            match step {
                Ok(n) => total += n,
                Err(end) => break end,
            }
            if batch.len() >= BATCH_MSGS || batch_bytes >= BATCH_BYTES {
                sink.received(id, inst, &mut batch);
                batch.clear();
                batch_bytes = 0;
                if !force && self.inner.rx_paused(id) {
                    break ReadEnd::Paused;
                }
            }
        };
        if total > 0 {
            conn.rx.lock().progress_at = Instant::now();
        }
        if !batch.is_empty() {
            sink.received(id, inst, &mut batch);
        }
        match end {
            ReadEnd::Drained | ReadEnd::Paused => {}
            ReadEnd::Budget => {
                self.rx_more.push(conn.clone());
                return true;
            }
            ReadEnd::Eof | ReadEnd::Error => {
                let why = down_reason(conn, DownReason::Closed);
                self.close_conn(conn, why, false);
            }
            ReadEnd::Protocol => self.close_conn(conn, DownReason::ProtocolError, true),
        }
        false
    }

    /// Resets the connections whose partly received message got no byte
    /// for `rx_frame_timeout` (paused paths are exempt: we stopped reading).
    fn sweep_stalls(&mut self, now: Instant) {
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

    /// Closes a connection (reset when `rst`) and reports it down.
    fn close_conn(&mut self, conn: &Arc<PathConn>, why: DownReason, rst: bool) {
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
