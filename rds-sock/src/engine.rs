//! The engine: one RDS node of this process with its threads.
//!
//! It owns an [`rds_core::Node`] behind one mutex and drives it: API calls
//! from sockets, events from the transports (which run their own reactor
//! threads), and a timer thread for reconnect backoff. Every call into the
//! node drains its outputs while holding the lock and dispatches them after
//! releasing it, so no system call ever runs under the node lock.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use rds_core::driver::{self, Dispatch, NodeHost};
use rds_core::loopback::LoopTransport;
use rds_core::{
    Errno, Node, NodeConfig, Output, PathId, PathInfo, RdsTransport, SockId, TransportCaps, TransportKind,
    TransportSink, Unsent,
};
use rds_tcp::{TcpConfig, TcpTransport};

use crate::info::{NodeIdent, Snapshot, ipc, kernel};
use crate::readiness::ReadyFd;

/// Settings of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The general layer's settings (paths, buffers, backoff, ...).
    pub node: NodeConfig,
    /// RDS over TCP (port 16385 by default, reactor threads).
    pub tcp: TcpConfig,
    /// Where the engine serves its snapshots to `rds-info` (a Unix-domain
    /// socket in this directory, see [`crate::info::ipc`]); `None` serves
    /// none. Default: [`ipc::runtime_dir`].
    pub info_dir: Option<PathBuf>,
    /// In the verbs-only IB setup (a pre-shared key, `RDS_IB_PSK_FILE`;
    /// feature `ib`): also serve RDS-TCP on the addresses IB serves.
    /// Default `false`: there an address IB serves is served by IB alone,
    /// so nobody without the key reaches the node through it (port 16385
    /// refuses connections; sockets cannot bind it with SO_RDS_TRANSPORT
    /// = TCP, ENOPROTOOPT). With `true` both serve it and each socket
    /// receives only over its own transport. From `RDS_IB_PSK_TCP=1`.
    /// Ignored in the RDMA CM setup (TCP is always served there, as the
    /// kernel's rds_tcp listens on every address).
    pub ib_psk_tcp: bool,
}

/// The environment variable of [`EngineConfig::ib_psk_tcp`] (`1`: serve
/// RDS-TCP on the verbs-only setup's IB addresses too).
pub const ENV_IB_PSK_TCP: &str = "RDS_IB_PSK_TCP";

impl Default for EngineConfig {
    /// Kernel defaults; buffer limits read from this host's
    /// `net.core.{w,r}mem_{default,max}`; a random generation number; the TCP
    /// port from `RDS_TCP_PORT` if set; [`EngineConfig::ib_psk_tcp`] from
    /// `RDS_IB_PSK_TCP`; `NodeConfig::max_peers` within this
    /// process's descriptor limit ([`peers_for_fds`] of [`nofile_limit`],
    /// read now: set the limit before); deferred connections per peer
    /// (`TcpConfig::defer_per_peer`) = the path count.
    fn default() -> Self {
        let mut node = NodeConfig::default();
        let read = |name: &str, dflt: u32| {
            std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(dflt)
        };
        node.wmem_default = read("wmem_default", node.wmem_default);
        node.wmem_max = read("wmem_max", node.wmem_max);
        node.rmem_default = read("rmem_default", node.rmem_default);
        node.rmem_max = read("rmem_max", node.rmem_max);
        let r = random_u64();
        node.gen_num = (r as u32).max(1);
        node.seed = r;
        // Reconnects in order after a reset of all paths (see the field).
        node.reconnect_settle = Duration::from_millis(50);
        // Peers within the descriptors: a peer holds one connection per
        // path and may have as many deferred; RESERVED_FDS stay for the
        // process's own sockets, rds-info and the like.
        node.max_peers = node.max_peers.min(peers_for_fds(nofile_limit()));
        let mut tcp = TcpConfig::default();
        if let Some(p) = std::env::var("RDS_TCP_PORT").ok().and_then(|v| v.parse().ok()) {
            tcp.port = p;
        }
        tcp.defer_per_peer = usize::from(node.npaths.max(1));
        let ib_psk_tcp = std::env::var(ENV_IB_PSK_TCP).is_ok_and(|v| v.trim() == "1");
        EngineConfig { node, tcp, info_dir: Some(ipc::runtime_dir()), ib_psk_tcp }
    }
}

/// Descriptors [`EngineConfig::default`] keeps out of the peers' reach
/// (`NodeConfig::max_peers`): sockets (`RdsSocket::new`), rds-info's
/// connections, the application's own files.
pub const RESERVED_FDS: u64 = 256;

/// The soft `RLIMIT_NOFILE` of this process.
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into `r`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return u64::from(u32::MAX);
    }
    r.rlim_cur
}

/// The peer limit for a descriptor limit: a quarter of what is left after
/// [`RESERVED_FDS`] (most peers use one or two connections; a peer of 8
/// paths uses 8, and what goes beyond is shed by the listener, not fatal),
/// at least 16.
pub fn peers_for_fds(nofile: u64) -> usize {
    usize::try_from((nofile.saturating_sub(RESERVED_FDS) / 4).max(16)).unwrap_or(usize::MAX)
}

/// 64 random bits from the kernel.
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 8 {
        // Never fatal: fall back to the clock.
        return std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    }
    u64::from_ne_bytes(b)
}

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
    stopped: bool,
}

/// Per-socket state shared between the socket handle and the engine.
pub(crate) struct SockShared {
    events: Mutex<u64>,
    cond: Condvar,
    /// Created with the socket (so handing it out cannot fail); kept in sync
    /// only once somebody asked for it.
    fd: ReadyFd,
    fd_active: AtomicBool,
}

impl SockShared {
    fn new() -> io::Result<SockShared> {
        Ok(SockShared {
            events: Mutex::new(0),
            cond: Condvar::new(),
            fd: ReadyFd::new()?,
            fd_active: AtomicBool::new(false),
        })
    }

    fn wake(&self, seq: u64, readable: bool, writable: bool) {
        *self.events.lock() += 1;
        self.cond.notify_all();
        if self.fd_active.load(Ordering::Acquire) {
            self.fd.update(seq, readable, writable);
        }
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
    Wake(Arc<SockShared>, u64, bool, bool),
}

pub(crate) struct Inner {
    state: Mutex<State>,
    timer_cond: Condvar,
    socks: RwLock<HashMap<SockId, Arc<SockShared>>>,
    tcp: Arc<TcpTransport>,
    lo: Arc<LoopTransport>,
    /// RDS over IB / RoCE (feature `ib`, when the host has an RDMA device).
    #[cfg(feature = "ib")]
    ib: Option<Arc<rds_ib::IbTransport>>,
    /// [`EngineConfig::ib_psk_tcp`].
    #[cfg_attr(not(feature = "ib"), allow(dead_code))]
    ib_psk_tcp: bool,
    serve_lock: Mutex<()>,
    timer: Mutex<Option<JoinHandle<()>>>,
    /// The engine's number in this process (names its info socket).
    number: u32,
    info: Mutex<Option<ipc::Server>>,
}

thread_local! {
    static WORK: std::cell::RefCell<Vec<Work>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Inner {
    /// Runs `f` on the node, then dispatches what it asked for.
    pub(crate) fn run<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        let mut work = WORK.with(|w| std::mem::take(&mut *w.borrow_mut()));
        let r = {
            let mut st = self.state.lock();
            let r = f(&mut st.node);
            self.collect(&mut st, &mut work);
            r
        };
        self.dispatch(&mut work);
        WORK.with(|w| {
            let mut w = w.borrow_mut();
            if w.capacity() < work.capacity() {
                *w = work;
            }
        });
        r
    }

    fn collect(&self, st: &mut State, work: &mut Vec<Work>) {
        let State { node, seq, .. } = st;
        let mut c = Collect { inner: self, node, seq, work };
        let Ok(_) = driver::drain_with(&mut c, |c| Some(&mut *c.node));
        let next = st.node.poll_timeout();
        if next.is_some() && (st.timer_deadline.is_none() || next < st.timer_deadline) {
            self.timer_cond.notify_one();
        }
    }

    fn dispatch(&self, work: &mut Vec<Work>) {
        for w in work.drain(..) {
            match w {
                Work::Out(o) => {
                    driver::carry_out(o, |k| self.transport(k));
                }
                Work::Wake(sh, seq, r, w) => sh.wake(seq, r, w),
            }
        }
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
            let mut st = self.state.lock();
            if st.stopped {
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

    /// The readiness descriptor of a socket; the first call starts keeping
    /// it in sync with the socket.
    pub(crate) fn ready_fd(&self, sh: &SockShared, s: SockId) -> i32 {
        if !sh.fd_active.swap(true, Ordering::AcqRel) {
            let (seq, r) = {
                let mut st = self.state.lock();
                st.seq += 1;
                (st.seq, st.node.readiness(s))
            };
            sh.fd.update(seq, r.readable, r.writable);
        }
        sh.fd.raw()
    }
}

/// What `collect` hands the node's outputs to, under the node lock: the
/// transports' outputs wait for `dispatch` (after the lock), a wake reads
/// the socket's readiness now.
struct Collect<'a> {
    inner: &'a Inner,
    node: &'a mut Node,
    seq: &'a mut u64,
    work: &'a mut Vec<Work>,
}

impl Dispatch for Collect<'_> {
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
        self.work.push(Work::Out(Output::Kick(path)));
        Ok(())
    }

    fn rx_flow(&mut self, path: PathInfo, paused: bool, seq: u64) -> Result<(), Infallible> {
        self.work.push(Work::Out(Output::RxFlow { path, paused, seq }));
        Ok(())
    }

    fn wake(&mut self, s: SockId) -> Result<(), Infallible> {
        if let Some(sh) = self.inner.socks.read().get(&s) {
            *self.seq += 1;
            let r = self.node.readiness(s);
            self.work.push(Work::Wake(sh.clone(), *self.seq, r.readable, r.writable));
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
            state: Mutex::new(State { node, seq: 0, timer_deadline: None, stopped: false }),
            timer_cond: Condvar::new(),
            socks: RwLock::new(HashMap::new()),
            tcp,
            lo,
            #[cfg(feature = "ib")]
            ib,
            ib_psk_tcp: cfg.ib_psk_tcp,
            serve_lock: Mutex::new(()),
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
    /// when another process serves it.
    ///
    /// In the verbs-only IB setup an address of an RDMA device is served by
    /// IB alone (its side channel), not TCP, unless
    /// [`EngineConfig::ib_psk_tcp`] asks for both: RDS-TCP carries no key.
    pub fn serve(&self, ip: IpAddr) -> io::Result<()> {
        let _g = self.inner.serve_lock.lock();
        if self.inner.run(|n| n.is_local(&ip)) {
            return Ok(());
        }
        self.inner.tcp.laddr_check(ip).map_err(|_| io::Error::from(Errno::EADDRNOTAVAIL))?;
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

    /// Runs `f` on the node (for introspection and tests).
    pub fn with_node<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        self.inner.run(f)
    }

    /// Counters as `RDS_INFO_COUNTERS` (and `rds-info -c`) list them: the
    /// kernel's core counters, the TCP transport's, then our own.
    pub fn counters(&self) -> Vec<(String, u64)> {
        let core = self.inner.run(|n| n.counters().clone());
        #[allow(unused_mut)]
        let mut transport = self.inner.tcp.counters();
        #[cfg(feature = "ib")]
        if let Some(ib) = &self.inner.ib {
            transport.extend(ib.counters());
        }
        rds_core::info::counters_in_kernel_order(&core, &transport)
    }

    /// Fault injection (tests, operators): cuts the TCP connection of a
    /// path in both directions as a failing connection would, wherever its
    /// byte streams are, without telling the node
    /// ([`TcpTransport::abort_path`]). The node sees the connection end,
    /// gets what was already received, resends what was not acked and
    /// reconnects. Returns whether the path had a connection.
    pub fn abort_tcp_path(&self, path: PathId) -> bool {
        self.inner.tcp.abort_path(path)
    }

    /// Connections of the TCP transport (as `rds-info -T`).
    pub fn tcp_connections(&self) -> Vec<rds_core::TransportConnInfo> {
        self.inner.tcp.conn_info()
    }

    /// Connections with every path (`rds-info -n`); a path's SENDING flag
    /// is set while its transport is transmitting.
    pub fn connections(&self) -> Vec<rds_core::ConnSnapshot> {
        let mut conns = self.inner.run(|n| n.info_connections());
        mark_sending(&mut conns, &self.inner.tcp.conn_info());
        conns
    }

    /// Sockets (`rds-info -k`).
    pub fn sockets(&self) -> Vec<rds_core::SockSnapshot> {
        self.inner.run(|n| n.info_sockets())
    }

    /// Messages of the send, retransmit or receive queues (`rds-info -s`,
    /// `-t`, `-r`).
    pub fn messages(&self, q: rds_core::Queue) -> Vec<rds_core::MsgSnapshot> {
        self.inner.run(|n| n.info_messages(q))
    }

    /// Everything at once: the node's part taken under one lock, then the
    /// transport's sockets.
    pub fn snapshot(&self) -> Snapshot {
        use rds_core::Queue;
        let (node, core, mut connections, sockets, send, retrans, recv) = self.inner.run(|n| {
            let mut addresses: Vec<IpAddr> = n.locals().map(|(a, _)| *a).collect();
            addresses.sort();
            let node = NodeIdent {
                pid: std::process::id(),
                engine: self.inner.number,
                uid: ipc::euid(),
                command: std::fs::read_to_string("/proc/self/comm").map(|c| c.trim().to_string()).unwrap_or_default(),
                addresses,
                gen_num: n.config().gen_num,
                npaths: n.config().npaths,
                tcp_port: self.inner.tcp.config().port,
            };
            (
                node,
                n.counters().clone(),
                n.info_connections(),
                n.info_sockets(),
                n.info_messages(Queue::Send),
                n.info_messages(Queue::Retrans),
                n.info_messages(Queue::Recv),
            )
        });
        let tcp = self.inner.tcp.conn_info();
        mark_sending(&mut connections, &tcp);
        let counters = rds_core::info::counters_in_kernel_order(&core, &self.inner.tcp.counters());
        Snapshot { node, counters, connections, sockets, send, retrans, recv, tcp }
    }

    /// `getsockopt(SOL_RDS, RDS_INFO_*, buf, &optlen)` with `optlen =
    /// buf.len()`: the kernel's packed structs, ENOSPC with the needed
    /// length when `buf` is short (see [`kernel`]).
    pub fn rds_info_getsockopt(&self, opt: i32, buf: &mut [u8]) -> Result<kernel::InfoOk, kernel::InfoError> {
        kernel::getsockopt(&self.snapshot(), opt, buf)
    }

    /// Where this engine serves its snapshots, if it does.
    pub fn info_socket_path(&self) -> Option<PathBuf> {
        self.inner.info.lock().as_ref().map(|s| s.path().to_path_buf())
    }

    /// The engine's number in this process (0 for the first).
    pub fn number(&self) -> u32 {
        self.inner.number
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
            let mut st = self.inner.state.lock();
            st.stopped = true;
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

    pub(crate) fn is_stopped(&self) -> bool {
        self.inner.state.lock().stopped
    }
}

/// Sets SENDING on the paths whose transport connection is transmitting.
fn mark_sending(conns: &mut [rds_core::ConnSnapshot], tcp: &[rds_core::TransportConnInfo]) {
    for t in tcp.iter().filter(|t| t.sending) {
        let Some(p) = t.path else { continue };
        if let Some(path) = conns.get_mut(p.conn.0 as usize).and_then(|c| c.paths.get_mut(usize::from(p.index))) {
            path.flags |= rds_core::info::conn_flags::SENDING;
        }
    }
}
