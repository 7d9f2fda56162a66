//! The engine: one RDS node of this process with its threads (settings in
//! `engine/config.rs`, what it shows of itself in `engine/introspect.rs`).
//!
//! It owns an [`rds_core::Node`] behind one mutex and drives it: API calls
//! from sockets, events from the transports (which run their own reactor
//! threads), and a timer thread for reconnect backoff. Every call into the
//! node drains its outputs while holding the lock and dispatches them after
//! releasing it, so no system call runs under the node lock (but a send's
//! clock read for the TCP coalescing check, a vDSO call where the
//! clocksource has one: a send kicks its path and pulls its messages in
//! its own node call, `Inner::run_send`, and writes after). How
//! often that lock was found held, and how long its takers waited, are
//! counted ([`Engine::node_lock_stats`]).

use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use rds_core::driver::{self, Dispatch, NodeHost};
use rds_core::loopback::LoopTransport;
use rds_core::{
    Errno, Node, Output, PathInfo, RdsTransport, Received, SockId, TransportCaps, TransportKind, TransportSink, Unsent,
};
use rds_tcp::TcpTransport;

use crate::info::ipc;
use crate::readiness::ReadyFd;

mod config;
mod fork;
mod introspect;
mod owed;

pub use config::{ENV_IB_PSK_TCP, EngineConfig, RESERVED_FDS, nofile_limit, peers_for_fds};

/// What [`Engine::shutdown`] found still queued when it stopped.
#[derive(Clone, Debug, Default)]
pub struct ShutdownReport {
    /// Per connection: messages never sent, sent but unacked, and bytes.
    pub unsent: Vec<Unsent>,
}

impl ShutdownReport {
    /// Messages that may not have reached their peer.
    pub fn messages(&self) -> usize {
        self.unsent.iter().map(|u| u.queued + u.unacked).sum()
    }
}

struct State {
    node: Node,
    /// Sequence for readiness updates (orders them across threads).
    seq: u64,
    /// Deadline the timer thread sleeps until.
    timer_deadline: Option<Instant>,
}

/// Socket `s`'s readiness now, with the next number of `seq` (which orders
/// the descriptor's updates across threads: `ReadyFd::update`).
fn stamped_readiness(seq: &mut u64, node: &Node, s: SockId) -> (u64, rds_core::Readiness) {
    *seq += 1;
    (*seq, node.readiness(s))
}

/// Per-socket state shared between the socket handle and the engine.
pub(crate) struct SockShared {
    events: Mutex<u64>,
    cond: Condvar,
    /// Created with the socket (so handing it out cannot fail); kept in sync
    /// only once somebody asked for it.
    fd: ReadyFd,
    fd_active: AtomicBool,
    /// (local, peer) address of the last message received: where a
    /// blocked receiver expects the next one from
    /// ([`crate::RdsSocket::recv_msg_wait`]).
    pub(crate) rx_hint: Mutex<Option<(IpAddr, IpAddr)>>,
    /// The TCP connection the last assisted read delivered on
    /// ([`rds_tcp::RxAssist::lane`]; 0: none): the next blocking wait polls
    /// it only, and takes its readable events off the reactor.
    pub(crate) rx_lane: AtomicU64,
    /// The last blocking wait was woken through the descriptor, by a
    /// message the reactor read (perhaps on another lane): the next one
    /// polls every path of the pair.
    pub(crate) rx_wide: AtomicBool,
    /// The thread reading the socket's connections itself in a blocking
    /// receive ([`assist_mark`]: its [`thread_token`], and whether the
    /// receive takes a message, not peeks), 0 when none. A wake-up it
    /// causes for this socket leaves the descriptor alone (`deferred`),
    /// since the receive that follows takes the message; that receive
    /// brings the descriptor up to date under its own node call
    /// ([`Inner::run_recv`]; [`Inner::refresh_fd`] when it found nothing).
    /// A raise and a clear, two system calls per message, saved. A
    /// receive that takes its message takes it in that wake-up instead,
    /// under the node lock that delivered it (`taken`).
    pub(crate) assist_by: AtomicU64,
    pub(crate) deferred: AtomicBool,
    /// Whether the last update left for later (`deferred`) showed the
    /// socket readable: a poll whose own read delivered reports it so
    /// without raising the descriptor (`engine/owed.rs`).
    pub(crate) deferred_readable: AtomicBool,
    /// Listed for the next linger tick (`engine/owed.rs`).
    pub(crate) owed_listed: AtomicBool,
    /// The message a blocking receive's own read delivered and took for
    /// it in the same node call ([`SockShared::take_own`]), which the
    /// receive returns when its wait ends (`RdsSocket::recv_msg_wait`):
    /// one node call per message fewer. Only that thread fills and
    /// empties it, within that one receive.
    pub(crate) taken: Mutex<Option<Received>>,
    /// Blocking waits left that do not read connections themselves: set
    /// when one read delivered a stream (more than one message), which
    /// the reactor reads better, reading ahead while the receiver works
    /// through the queue ([`crate::RdsSocket::recv_msg_wait`]).
    pub(crate) assist_skip: AtomicU32,
    /// The socket sent a message since its last blocking wait began
    /// ([`crate::RdsSocket::recv_msg_wait`]): the next wait takes its
    /// lane's readable events off the reactor.
    pub(crate) sent_since_wait: AtomicBool,
    /// The eventfd of a thread waiting for the socket's next wake-up in
    /// a wait that signals interrupt ([`crate::RdsSocket::send_msg_wait`]).
    pub(crate) waiter: SendWaiter,
}

/// The eventfd [`crate::RdsSocket::send_msg_wait`] waits on: created the
/// first time a thread waits, written by every wake-up while a thread
/// holds it (`busy`), closed with the socket's shared state (no wake-up
/// can write to a closed or reused descriptor number: each holds the
/// state). One thread at a time: it alone drains it, so no wake-up is
/// lost between its look at the event count and its `ppoll`.
#[derive(Default)]
pub(crate) struct SendWaiter {
    pub(crate) efd: OnceLock<std::os::fd::OwnedFd>,
    pub(crate) busy: AtomicBool,
}

/// What [`SockShared::assist_by`] holds while the calling thread reads
/// the socket's connections in its blocking receive: its
/// [`thread_token`], and whether that receive takes the message it
/// delivers (`take`: not a peek), in one word (two stores would let a
/// peek see another thread's `take`).
pub(crate) fn assist_mark(take: bool) -> u64 {
    thread_token() << 1 | u64::from(take)
}

/// A number for the calling thread, never 0.
pub(crate) fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TOKEN.with(|t| *t)
}

impl SockShared {
    fn new() -> io::Result<SockShared> {
        Ok(SockShared {
            events: Mutex::new(0),
            cond: Condvar::new(),
            fd: ReadyFd::new()?,
            fd_active: AtomicBool::new(false),
            rx_hint: Mutex::new(None),
            rx_lane: AtomicU64::new(0),
            rx_wide: AtomicBool::new(false),
            assist_by: AtomicU64::new(0),
            deferred: AtomicBool::new(false),
            deferred_readable: AtomicBool::new(false),
            owed_listed: AtomicBool::new(false),
            taken: Mutex::new(None),
            assist_skip: AtomicU32::new(0),
            sent_since_wait: AtomicBool::new(false),
            waiter: SendWaiter::default(),
        })
    }

    /// Under the node lock, in a wake-up of socket `s`: when the calling
    /// thread reads the socket's connections in a blocking receive that
    /// takes its message (`assist_by`), takes the socket's next message
    /// for it into `taken`, as that receive's node call would have right
    /// after. Whether `taken` holds a message now: the wake-up then
    /// brings the descriptor up to date at once (the receive makes no
    /// node call that would).
    fn take_own(&self, s: SockId, node: &mut Node) -> bool {
        // (No thread-local lookup for a wake-up nobody's receive reads for,
        // as the reactor's deliveries mostly are.)
        let by = self.assist_by.load(Ordering::SeqCst);
        if by & 1 == 0 || by != assist_mark(true) {
            return false;
        }
        let mut slot = self.taken.lock();
        if slot.is_none()
            && let Ok(r) = node.recv(s, false)
        {
            *slot = Some(r);
        }
        slot.is_some()
    }

    /// A wake-up (`own`: after [`SockShared::take_own`] took the
    /// message: the descriptor is brought up to date now, not deferred).
    /// Whether it raised the descriptor (sent its readable byte).
    fn wake(&self, seq: u64, readable: bool, writable: bool, own: bool) -> bool {
        *self.events.lock() += 1;
        self.cond.notify_all();
        // After the count moved (the waiter marks itself busy before it
        // looks at the count): a waiter that saw the old count is in, or
        // on its way to, `ppoll` on the eventfd.
        if self.waiter.busy.load(Ordering::SeqCst) {
            if let Some(fd) = self.waiter.efd.get() {
                crate::wait::eventfd_signal(fd);
            }
        }
        if self.fd_active.load(Ordering::Acquire) {
            let by = self.assist_by.load(Ordering::SeqCst);
            // This thread's own read (its wait's): left for later unless
            // the receive took the message and left the queue empty, which
            // the descriptor shows already (it was not readable when the
            // wait began); with more queued, the receive's end decides
            // (`engine/owed.rs`).
            if by != 0 && by >> 1 == thread_token() && (!own || readable) {
                self.deferred_readable.store(readable, Ordering::SeqCst);
                self.deferred.store(true, Ordering::SeqCst);
            } else {
                return self.fd.update(seq, readable, writable);
            }
        }
        false
    }

    /// An update of the descriptor was left for later and showed the
    /// socket readable (`deferred_readable`).
    pub(crate) fn deferred_shows_readable(&self) -> bool {
        self.deferred.load(Ordering::SeqCst) && self.deferred_readable.load(Ordering::SeqCst)
    }

    /// Waits until no read-back of the descriptor's readable byte is owed
    /// ([`ReadyFd::settle`]): before a wait polls it.
    pub(crate) fn settle_fd(&self) {
        if self.fd_active.load(Ordering::Acquire) {
            self.fd.settle();
        }
    }

    /// The descriptor is kept in sync, has no update left for later
    /// (`deferred`) and shows the socket not readable.
    pub(crate) fn fd_shows_empty(&self) -> bool {
        self.fd_active.load(Ordering::Acquire) && !self.deferred.load(Ordering::SeqCst) && !self.fd.readable()
    }

    /// The descriptor is kept in sync and shows the socket readable.
    pub(crate) fn fd_shows_readable(&self) -> bool {
        self.fd_active.load(Ordering::Acquire) && self.fd.readable()
    }

    /// Current event count; a later [`SockShared::wait`] returns once it moved.
    pub fn snapshot(&self) -> u64 {
        *self.events.lock()
    }

    /// Waits until an event after `snap`; false on timeout.
    pub fn wait(&self, snap: u64, deadline: Option<Instant>) -> bool {
        let mut g = self.events.lock();
        while *g == snap {
            match deadline {
                Some(d) => {
                    if self.cond.wait_until(&mut g, d).timed_out() && *g == snap {
                        return false;
                    }
                }
                None => self.cond.wait(&mut g),
            }
        }
        true
    }
}

enum Work {
    Out(Output),
    /// A socket's wake-up: the socket, its readiness (stamp, readable,
    /// writable), and whether the waking thread took its message
    /// (`SockShared::take_own`).
    Wake(SockId, Arc<SockShared>, u64, bool, bool, bool),
}

/// What the sockets' readiness descriptors cost (`engine/owed.rs`):
/// `engine_fd_raised`, `engine_fd_owed`, `engine_fd_owed_ticked`.
#[derive(Default)]
struct FdCounts {
    raised: AtomicU64,
    owed: AtomicU64,
    owed_ticked: AtomicU64,
}

/// How the node lock was taken ([`Engine::node_lock_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeLockStats {
    /// Every acquisition.
    pub taken: u64,
    /// Acquisitions that found the lock held by another thread and waited.
    pub waited: u64,
    /// The time those waited, summed, in microseconds.
    pub wait_us: u64,
}

/// [`NodeLockStats`] as they are counted: an uncontended acquisition adds
/// one relaxed increment and reads no clock (a clock read is a system call
/// where the clock source has no vDSO read); only one that waits reads it.
#[derive(Default)]
struct LockCounts {
    taken: AtomicU64,
    waited: AtomicU64,
    wait_ns: AtomicU64,
}

pub(crate) struct Inner {
    state: Mutex<State>,
    lock_counts: LockCounts,
    /// [`Engine::shutdown`] stopped the engine: set under the node lock
    /// (the timer thread looks at it there, before it waits on
    /// `timer_cond`), read without it by every send and receive
    /// ([`Engine::is_stopped`]).
    stopped: AtomicBool,
    timer_cond: Condvar,
    socks: RwLock<rds_core::types::FastMap<SockId, Arc<SockShared>>>,
    tcp: Arc<TcpTransport>,
    lo: Arc<LoopTransport>,
    /// RDS over IB / RoCE (feature `ib`, when the host has an RDMA device).
    #[cfg(feature = "ib")]
    ib: Option<Arc<rds_ib::IbTransport>>,
    /// [`EngineConfig::ib_psk_tcp`].
    #[cfg_attr(not(feature = "ib"), allow(dead_code))]
    ib_psk_tcp: bool,
    serve_lock: Mutex<()>,
    /// Sockets whose poll left their descriptor's update for the next
    /// linger tick, and whether any is listed (`engine/owed.rs`).
    owed: Mutex<Vec<SockId>>,
    owed_any: AtomicBool,
    fd_counts: FdCounts,
    timer: Mutex<Option<JoinHandle<()>>>,
    /// The engine's number in this process (names its info socket).
    number: u32,
    info: Mutex<Option<ipc::Server>>,
}

thread_local! {
    static WORK: std::cell::RefCell<Vec<Work>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// This thread's work list for a node call (empty, with the capacity the
/// last one left). `try_with`: a thread's held kicks are written by a
/// destructor at its end (`crate::batch`), when `WORK` may be gone.
fn take_work() -> Vec<Work> {
    WORK.try_with(|w| std::mem::take(&mut *w.borrow_mut())).unwrap_or_default()
}

/// Gives a node call's (dispatched, empty) work list back to the thread
/// when it grew past the one kept.
fn keep_work(work: Vec<Work>) {
    let _ = WORK.try_with(|w| {
        let mut w = w.borrow_mut();
        if w.capacity() < work.capacity() {
            *w = work;
        }
    });
}

impl Inner {
    /// Takes the node lock, counting the acquisition and, when another
    /// thread held it, the wait ([`LockCounts`]). Inlined, as the lock's
    /// own fast path is: it runs several times per message.
    #[inline(always)]
    fn lock_state(&self) -> parking_lot::MutexGuard<'_, State> {
        self.lock_counts.taken.fetch_add(1, Ordering::Relaxed);
        match self.state.try_lock() {
            Some(g) => g,
            None => self.lock_state_slow(),
        }
    }

    /// [`Inner::lock_state`] when another thread holds the lock: waits,
    /// and counts the wait.
    #[cold]
    #[inline(never)]
    fn lock_state_slow(&self) -> parking_lot::MutexGuard<'_, State> {
        let c = &self.lock_counts;
        let t0 = Instant::now();
        let g = self.state.lock();
        c.waited.fetch_add(1, Ordering::Relaxed);
        c.wait_ns.fetch_add(t0.elapsed().as_nanos().try_into().unwrap_or(u64::MAX), Ordering::Relaxed);
        g
    }

    fn lock_stats(&self) -> NodeLockStats {
        let c = &self.lock_counts;
        NodeLockStats {
            taken: c.taken.load(Ordering::Relaxed),
            waited: c.waited.load(Ordering::Relaxed),
            wait_us: c.wait_ns.load(Ordering::Relaxed) / 1000,
        }
    }

    /// Runs `f` on the node, then dispatches what it asked for.
    pub(crate) fn run<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.run_then(f, |_| ())
    }

    /// [`Inner::run`] for a receive from socket `s`: when a wake-up left
    /// its descriptor alone (`SockShared::deferred`: this thread's own
    /// read delivered the message), brings the descriptor up to date
    /// after `f`, under the same lock, where [`Inner::refresh_fd`] would
    /// take it again (a receive that read its connection itself took
    /// the lock twice).
    pub(crate) fn run_recv<R>(&self, sh: &SockShared, s: SockId, f: impl FnOnce(&mut Node) -> R) -> R {
        let mut refresh = None;
        let r = self.run_then(f, |st| {
            if sh.deferred.swap(false, Ordering::SeqCst) {
                let (seq, rd) = stamped_readiness(&mut st.seq, &st.node, s);
                // More queued, and the linger tick will bring the
                // descriptor up: left behind until the receive that
                // empties the queue (`engine/owed.rs`).
                if !(rd.readable && sh.keep_deferred()) {
                    refresh = Some((seq, rd));
                }
            }
        });
        if let Some((seq, rd)) = refresh {
            self.update_fd(sh, seq, rd);
        }
        r
    }

    /// [`Inner::run`] for a send: when the send kicked a TCP path, the
    /// kick is made under the same lock ([`TcpTransport::claim_xmit`]),
    /// and when it gives this thread the path's transmit (no other thread
    /// transmits on it, no coalescing window holds the message) this
    /// thread pulls the path's messages in this same node call, and writes
    /// them after releasing the lock, first: the kernel's `rds_sendmsg`
    /// transmits in the caller's context too, and the pull that the kick
    /// would make through the transport took the lock a second time. A
    /// send whose write a batch of replies holds (`crate::batch`) is
    /// dispatched as any.
    pub(crate) fn run_send<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        let mut work = take_work();
        let mut claimed = None;
        let r = {
            let mut st = self.lock_state();
            let r = f(&mut st.node);
            self.collect_claiming(&mut st, &mut work, Some(&mut claimed));
            r
        };
        if let Some(Claimed { path, claim, pulled_all }) = claimed {
            crate::batch::kicked(&self.tcp, &path);
            self.tcp.xmit_claimed(claim, pulled_all);
        }
        self.dispatch(&mut work);
        keep_work(work);
        r
    }

    /// [`Inner::run`], with `then` run on the state under the same lock
    /// after the node's outputs were collected.
    fn run_then<R>(&self, f: impl FnOnce(&mut Node) -> R, then: impl FnOnce(&mut State)) -> R {
        let mut work = take_work();
        let r = {
            let mut st = self.lock_state();
            let r = f(&mut st.node);
            self.collect(&mut st, &mut work);
            then(&mut st);
            r
        };
        self.dispatch(&mut work);
        keep_work(work);
        r
    }

    fn collect(&self, st: &mut State, work: &mut Vec<Work>) {
        self.collect_claiming(st, work, None);
    }

    /// [`Inner::collect`]; with `claim` (a send's), the first kick of a TCP
    /// path is made at once ([`Inner::run_send`]).
    fn collect_claiming<'i>(&'i self, st: &mut State, work: &mut Vec<Work>, claim: Option<&mut Option<Claimed<'i>>>) {
        let State { node, seq, .. } = st;
        let mut c = Collect { inner: self, node, seq, work, claim };
        let Ok(_) = driver::drain_with(&mut c, |c| Some(&mut *c.node));
        let next = st.node.poll_timeout();
        if next.is_some() && (st.timer_deadline.is_none() || next < st.timer_deadline) {
            self.timer_cond.notify_one();
        }
    }

    fn dispatch(&self, work: &mut Vec<Work>) {
        for w in work.drain(..) {
            match w {
                // A reply that may go out with the next ones (`crate::batch`).
                Work::Out(Output::Kick(p)) if p.kind == TransportKind::Tcp && crate::batch::active() => {
                    if self.tcp.kick_later(p) {
                        crate::batch::hold(&self.tcp, p);
                    } else {
                        self.tcp.kick(p);
                    }
                }
                Work::Out(o) => {
                    if let Output::Kick(p) = &o
                        && p.kind == TransportKind::Tcp
                    {
                        crate::batch::kicked(&self.tcp, p);
                    }
                    driver::carry_out(o, |k| self.transport(k));
                }
                Work::Wake(_, sh, seq, r, w, own) => {
                    let raised = sh.wake(seq, r, w, own);
                    self.count_raised(raised);
                }
            }
        }
    }

    /// The TCP paths of an address pair for a blocked receiver to read
    /// itself ([`rds_tcp::RxAssist`]).
    pub(crate) fn rx_assist(
        &self,
        laddr: IpAddr,
        faddr: IpAddr,
        lane: u64,
        wide: bool,
        quiet: bool,
    ) -> Option<rds_tcp::RxAssist> {
        self.tcp.rx_assist(laddr, faddr, lane, wide, quiet)
    }

    /// Polls the TCP acks of an address pair's paths for a blocked
    /// sender ([`rds_tcp::TcpTransport::poll_pair_acks`]).
    pub(crate) fn poll_pair_acks(&self, laddr: IpAddr, faddr: IpAddr) -> Option<bool> {
        self.tcp.poll_pair_acks(laddr, faddr)
    }

    /// The TCP transport.
    #[cfg(test)]
    pub(crate) fn tcp_transport(&self) -> Arc<TcpTransport> {
        self.tcp.clone()
    }

    fn transport(&self, kind: TransportKind) -> &dyn RdsTransport {
        match kind {
            TransportKind::Tcp => &*self.tcp,
            #[cfg(feature = "ib")]
            TransportKind::Ib if self.ib.is_some() => &**self.ib.as_ref().unwrap(),
            // IB is not available in this build (or on this host); the node
            // never creates IB connections without a registered IB transport.
            TransportKind::Loop | TransportKind::Ib => &*self.lo,
        }
    }

    fn timer_loop(self: Arc<Self>) {
        loop {
            self.run(|n| n.handle_timeout(Instant::now()));
            let mut st = self.lock_state();
            if self.stopped.load(Ordering::Acquire) {
                return;
            }
            let deadline = st.node.poll_timeout();
            st.timer_deadline = deadline;
            match deadline {
                Some(d) if d <= Instant::now() => continue,
                Some(d) => {
                    self.timer_cond.wait_until(&mut st, d);
                }
                None => self.timer_cond.wait(&mut st),
            }
            st.timer_deadline = None;
        }
    }

    /// Brings a socket's readiness descriptor up to date: when it starts
    /// being kept in sync, and after a wake-up left it alone
    /// ([`SockShared::deferred`]).
    pub(crate) fn refresh_fd(&self, sh: &SockShared, s: SockId) {
        let (seq, r) = {
            let mut st = self.lock_state();
            let st = &mut *st;
            stamped_readiness(&mut st.seq, &st.node, s)
        };
        self.update_fd(sh, seq, r);
    }

    /// Applies readiness `r`, computed at `seq`, to a socket's descriptor.
    fn update_fd(&self, sh: &SockShared, seq: u64, r: rds_core::Readiness) {
        let raised = sh.fd.update(seq, r.readable, r.writable);
        self.count_raised(raised);
    }

    /// Counts a descriptor raised (`engine_fd_raised`): every update of a
    /// descriptor reports here whether it sent the readable byte.
    fn count_raised(&self, raised: bool) {
        if raised {
            self.fd_counts.raised.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The readiness descriptor of a socket; the first call starts keeping
    /// it in sync with the socket.
    pub(crate) fn ready_fd(&self, sh: &SockShared, s: SockId) -> i32 {
        if !sh.fd_active.swap(true, Ordering::AcqRel) {
            self.refresh_fd(sh, s);
        }
        sh.fd.raw()
    }
}

/// What `collect` hands the node's outputs to, under the node lock: the
/// transports' outputs wait for `dispatch` (after the lock), a wake reads
/// the socket's readiness now.
struct Collect<'a, 'i> {
    inner: &'i Inner,
    node: &'a mut Node,
    seq: &'a mut u64,
    work: &'a mut Vec<Work>,
    /// A send's: where its kick of a TCP path, made at once, goes.
    claim: Option<&'a mut Option<Claimed<'i>>>,
}

/// A send's kick of a TCP path, made under the node lock
/// ([`Inner::run_send`]): what [`TcpTransport::xmit_claimed`] finishes
/// after it.
struct Claimed<'i> {
    path: PathInfo,
    claim: rds_tcp::XmitClaim<'i>,
    /// The pull under the claim took everything queued.
    pulled_all: bool,
}

impl Dispatch for Collect<'_, '_> {
    type Error = Infallible;

    fn connect(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.work.push(Work::Out(Output::Connect(path)));
        Ok(())
    }

    fn shutdown(&mut self, path: PathInfo) -> Result<(), Infallible> {
        self.work.push(Work::Out(Output::Shutdown(path)));
        Ok(())
    }

    fn kick(&mut self, path: PathInfo) -> Result<(), Infallible> {
        // A send's first kick of a TCP path (a batch of replies holds its
        // writes: dispatched as any): made now, and when this thread gets
        // the path's transmit it pulls the messages here, in the send's
        // node call (the pull's outputs drain with the send's).
        if let Some(slot) = self.claim.as_deref_mut()
            && slot.is_none()
            && path.kind == TransportKind::Tcp
            && !crate::batch::active()
            && let Some(mut claim) = self.inner.tcp.claim_xmit(&path)
        {
            let mut pulled_all = true;
            if claim.owns() {
                pulled_all = !self.node.pull(path.id, path.inst, self.inner.tcp.pull_budget(), claim.msgs());
            }
            *slot = Some(Claimed { path, claim, pulled_all });
            return Ok(());
        }
        self.work.push(Work::Out(Output::Kick(path)));
        Ok(())
    }

    fn rx_flow(&mut self, path: PathInfo, paused: bool, seq: u64) -> Result<(), Infallible> {
        self.work.push(Work::Out(Output::RxFlow { path, paused, seq }));
        Ok(())
    }

    fn wake(&mut self, s: SockId) -> Result<(), Infallible> {
        // A socket woken again in the same node call (a message delivered,
        // then taken by `take_own`): its one wake-up carries the latest
        // readiness.
        for w in self.work.iter_mut() {
            if let Work::Wake(id, sh, seq, readable, writable, own) = w
                && *id == s
            {
                if !*own {
                    *own = sh.take_own(s, self.node);
                }
                let (q, r) = stamped_readiness(self.seq, self.node, s);
                (*seq, *readable, *writable) = (q, r.readable, r.writable);
                return Ok(());
            }
        }
        if let Some(sh) = self.inner.socks.read().get(&s) {
            let own = sh.take_own(s, self.node);
            let (seq, r) = stamped_readiness(self.seq, self.node, s);
            self.work.push(Work::Wake(s, sh.clone(), seq, r.readable, r.writable, own));
        }
        Ok(())
    }
}

/// Transport events become node calls through [`NodeHost`] (which makes
/// `Inner` the transports' [`rds_core::TransportSink`]).
impl NodeHost for Inner {
    fn with_node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.run(f)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// An RDS node in this process: owns the addresses it serves, their
/// connections and sockets. Cheap to clone (a handle).
///
/// A process usually needs one: [`Engine::global`], which
/// [`crate::RdsSocket::new`] uses. Tests and tools create several to run
/// several nodes (each with its own addresses) in one process.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

static GLOBAL: OnceLock<Engine> = OnceLock::new();
/// Engines started by this process so far.
static ENGINES: AtomicU32 = AtomicU32::new(0);

impl Engine {
    /// Starts an engine: the TCP transport's reactor threads and a timer
    /// thread. It serves no address until a socket binds one (or
    /// [`Engine::serve`] is called).
    pub fn new(cfg: EngineConfig) -> io::Result<Engine> {
        let mut node = Node::new(cfg.node);
        node.register_transport(TransportCaps::tcp());
        node.register_transport(TransportCaps::loopback());
        let tcp = TcpTransport::new(cfg.tcp)?;
        let lo = LoopTransport::new();
        // Setup mode from the environment: RDMA CM by default; verbs-only
        // with a pre-shared key when RDS_IB_PSK_FILE names a key file (side
        // channel port RDS_IB_SIDE_PORT, default 18635). A bad key file
        // leaves the engine without IB rather than unauthenticated.
        #[cfg(feature = "ib")]
        let ib = match rds_ib::IbConfig::from_env() {
            Ok(c) => rds_ib::IbTransport::with_config(c).ok(),
            Err(e) => {
                eprintln!("rds-ib: not started: {e}");
                None
            }
        };
        #[cfg(feature = "ib")]
        if ib.is_some() {
            node.register_transport(TransportCaps::ib());
        }
        let inner = Arc::new(Inner {
            state: Mutex::new(State { node, seq: 0, timer_deadline: None }),
            lock_counts: LockCounts::default(),
            stopped: AtomicBool::new(false),
            timer_cond: Condvar::new(),
            socks: RwLock::new(Default::default()),
            tcp,
            lo,
            #[cfg(feature = "ib")]
            ib,
            ib_psk_tcp: cfg.ib_psk_tcp,
            serve_lock: Mutex::new(()),
            owed: Mutex::new(Vec::new()),
            owed_any: AtomicBool::new(false),
            fd_counts: FdCounts::default(),
            timer: Mutex::new(None),
            number: ENGINES.fetch_add(1, Ordering::Relaxed),
            info: Mutex::new(None),
        });
        let sink: Weak<dyn TransportSink> = Arc::downgrade(&inner) as Weak<dyn TransportSink>;
        inner.tcp.set_sink(sink.clone());
        #[cfg(feature = "ib")]
        if let Some(ib) = &inner.ib {
            ib.set_sink(sink.clone());
        }
        inner.lo.set_sink(sink);
        let weak = Arc::downgrade(&inner);
        inner.tcp.set_linger_tick(Box::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.settle_owed();
            }
        }));
        let t = inner.clone();
        let h = std::thread::Builder::new().name("rds-timer".into()).spawn(move || t.timer_loop())?;
        *inner.timer.lock() = Some(h);
        if let Some(dir) = &cfg.info_dir {
            // Introspection is not worth failing the engine for: without
            // the socket, rds-info just does not see this node.
            let weak = Arc::downgrade(&inner);
            let answer: ipc::Answer = Box::new(move |want| {
                let engine = Engine { inner: weak.upgrade()? };
                if engine.is_stopped() {
                    return None;
                }
                Some(crate::info::codec::encode_snapshot(&engine.snapshot(), want))
            });
            *inner.info.lock() = ipc::Server::start(dir, inner.number, answer).ok();
        }
        Ok(Engine { inner })
    }

    /// The process-wide engine, started with [`EngineConfig::default`] on
    /// first use.
    pub fn global() -> io::Result<Engine> {
        if let Some(e) = GLOBAL.get() {
            return Ok(e.clone());
        }
        let e = Engine::new(EngineConfig::default())?;
        Ok(GLOBAL.get_or_init(|| e).clone())
    }

    /// A new unbound socket of this engine.
    pub fn socket(&self) -> io::Result<crate::RdsSocket> {
        crate::RdsSocket::with_engine(self.clone())
    }

    pub(crate) fn register_sock(&self) -> io::Result<(SockId, Arc<SockShared>)> {
        let sh = Arc::new(SockShared::new()?);
        let id = self.inner.run(|n| n.socket());
        self.inner.socks.write().insert(id, sh.clone());
        Ok((id, sh))
    }

    pub(crate) fn unregister_sock(&self, id: SockId) {
        self.inner.run(|n| n.close(id));
        self.inner.socks.write().remove(&id);
    }

    /// Makes this node serve `ip` (over TCP: listen on `ip`:16385).
    /// EADDRNOTAVAIL when the host does not have the address, EADDRINUSE
    /// when another process serves it; EMFILE, ENFILE, ENOBUFS or ENOMEM
    /// when the check of the address could not open a socket.
    ///
    /// In the verbs-only IB setup an address of an RDMA device is served by
    /// IB alone (its side channel), not TCP, unless
    /// [`EngineConfig::ib_psk_tcp`] asks for both: RDS-TCP carries no key.
    pub fn serve(&self, ip: IpAddr) -> io::Result<()> {
        let _g = self.inner.serve_lock.lock();
        if self.inner.run(|n| n.is_local(&ip)) {
            return Ok(());
        }
        self.inner.tcp.laddr_check(ip).map_err(laddr_error)?;
        #[cfg(feature = "ib")]
        if let Some(ib) = &self.inner.ib {
            if ib.is_verbs_only() && !self.inner.ib_psk_tcp && ib.laddr_check(ip).is_ok() {
                match ib.start_local(ip) {
                    Ok(()) => {
                        self.inner.run(|n| n.add_local(ip, TransportKind::Ib));
                        return Ok(());
                    }
                    // Not served by IB after all: TCP as any other address.
                    Err(e) => {
                        if std::env::var_os("RDS_IB_DEBUG").is_some() {
                            eprintln!("rds-ib: {ip}: {e}")
                        }
                    }
                }
                self.inner.tcp.start_local(ip)?;
                self.inner.run(|n| n.add_local(ip, TransportKind::Tcp));
                return Ok(());
            }
        }
        self.inner.tcp.start_local(ip)?;
        // IB too where an RDMA device serves the address: sockets bound to
        // it then use IB unless SO_RDS_TRANSPORT chose TCP (as the kernel
        // tries IB's laddr_check first). When the RDMA CM port is taken
        // (the kernel's rds_rdma, another process) the address is TCP only.
        #[cfg(feature = "ib")]
        if let Some(ib) = &self.inner.ib {
            match ib.laddr_check(ip).and_then(|()| ib.start_local(ip)) {
                Ok(()) => self.inner.run(|n| n.add_local(ip, TransportKind::Ib)),
                Err(e) => {
                    if std::env::var_os("RDS_IB_DEBUG").is_some() {
                        eprintln!("rds-ib: {ip}: {e}")
                    }
                }
            }
        }
        self.inner.run(|n| n.add_local(ip, TransportKind::Tcp));
        Ok(())
    }

    /// The IB transport, when it runs (feature `ib`): the socket layer's
    /// RDMA services (GET_MR, FREE_MR) are its.
    #[cfg(feature = "ib")]
    pub(crate) fn ib(&self) -> Option<&Arc<rds_ib::IbTransport>> {
        self.inner.ib.as_ref()
    }

    /// Stops the engine: waits up to `drain` for queued messages to be
    /// acked, then closes every connection and listener. Reports what was
    /// still unsent. Sockets of this engine fail afterwards with ESHUTDOWN.
    ///
    /// A process is an RDS node: call this before it exits. Connections end
    /// with a FIN, which acknowledges everything received; a process that
    /// just exits may reset them while bytes are in flight, and its peers
    /// then wait for acks of messages it had read (and resend them to the
    /// next instance at this address, which drops them as stale).
    pub fn shutdown(&self, drain: Duration) -> ShutdownReport {
        // A drain too long to be an instant waits until everything is acked.
        let deadline = Instant::now().checked_add(drain);
        loop {
            let unsent = self.inner.run(|n| n.unsent());
            if unsent.is_empty() || deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let unsent = self.inner.run(|n| n.unsent());
        {
            let _st = self.inner.lock_state();
            self.inner.stopped.store(true, Ordering::Release);
            self.inner.timer_cond.notify_all();
        }
        if let Some(h) = self.inner.timer.lock().take() {
            let _ = h.join();
        }
        if let Some(mut srv) = self.inner.info.lock().take() {
            srv.stop();
        }
        self.inner.tcp.close();
        #[cfg(feature = "ib")]
        if let Some(ib) = &self.inner.ib {
            ib.close();
        }
        ShutdownReport { unsent }
    }

    /// Whether [`Engine::shutdown`] stopped the engine: a load, not a
    /// node call (a socket's every send and receive asks).
    pub(crate) fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::Acquire)
    }

    /// How the node lock has been taken since the engine started: every
    /// call into the node (a socket's send or receive, a transport's event,
    /// the timer) takes it once. The share that waited, and how long, tell
    /// whether the one lock serialises this node's load (also in
    /// [`Engine::counters`] as `engine_node_lock_*`).
    pub fn node_lock_stats(&self) -> NodeLockStats {
        self.inner.lock_stats()
    }
}

/// What a failed TCP `laddr_check` (a TCP socket bound to the address)
/// means for `bind`: the host lacks the address (EADDRNOTAVAIL, as the
/// kernel's RDS says), unless the check ran out of descriptors or memory,
/// which is said as it is: EADDRNOTAVAIL would send the operator looking
/// for an address problem.
fn laddr_error(e: io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => e,
        _ => io::Error::from(Errno::EADDRNOTAVAIL),
    }
}

#[cfg(test)]
mod laddr_error_tests {
    use super::*;

    #[test]
    fn resource_errors_pass_through_address_errors_become_eaddrnotavail() {
        for e in [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM] {
            assert_eq!(laddr_error(io::Error::from_raw_os_error(e)).raw_os_error(), Some(e));
        }
        for e in [libc::EADDRNOTAVAIL, libc::EINVAL, libc::EADDRINUSE, libc::EAFNOSUPPORT] {
            assert_eq!(laddr_error(io::Error::from_raw_os_error(e)).raw_os_error(), Some(libc::EADDRNOTAVAIL));
        }
    }
}
