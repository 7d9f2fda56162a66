//! [`IbTransport`]: the verbs path behind [`rds_core::RdsTransport`]
//! (feature `verbs`, IPv4).
//!
//! Threads:
//!
//! * one event thread per transport owns every established connection. It
//!   waits in `epoll` on an eventfd (commands), each connection's RDMA CM
//!   event channel and each connection's CQ completion channel
//!   (`ibv_get_cq_event` when it is readable, then the CQs are rearmed and
//!   drained; no sleeping). It hands reassembled messages to
//!   [`TransportSink::received`], reports the peer's `h_ack` as
//!   [`TransportSink::acked`], and pulls messages from the core and posts
//!   them while the send ring (and the credits) have room;
//! * a short-lived thread per outgoing connect (RDMA CM address and route
//!   resolution and the connect handshake block for up to seconds); it
//!   hands the established connection to the event thread;
//! * one listener thread per served address (RDMA CM port 18634 for IPv4,
//!   16385 for IPv6), which
//!   asks the core ([`TransportSink::accept`]) before accepting and never
//!   waits on one peer (RDMA CM: accepted requests wait for ESTABLISHED
//!   side by side, each for at most [`crate::verbs::ESTABLISH_TIMEOUT`],
//!   see [`Listener`]); in the
//!   verbs-only setup (side channel port 18635) it only accepts, counts
//!   and asks the core, while each connection's handshake and QP setup
//!   runs on a thread of its own ([`SideListener`]), whose outcome comes
//!   back to the listener thread with the path the core gave it.
//!
//! Both sides of an IB connection connect when they have something to send
//! (the kernel's rds_rdma has no direction rule). When connect requests
//! cross, the one from the smaller address wins: a listener refuses a
//! request from a larger address while its own connect to that address is
//! under way (reject value [`crate::verbs::REJ_RETRY`]); the kernel rejects
//! the incoming one while connecting, and the random reconnect backoff of
//! both sides sorts it out. Over RDMA CM the larger address waits 20..270
//! ms before its request goes out and sends none if the peer's connection
//! took the path meanwhile (superseded connects count as failed): a kernel
//! whose new connection to us is up drops it when a request of ours
//! arrives, which reconnects at once on both sides repeat (up to 28 times
//! in a row in the forced-disconnect VM test before; 1 to 3 with it).
//!
//! Receive flow control ([`RdsTransport::rx_flow`], per path, so a
//! reconnected path stays paused): a paused connection's receive buffers
//! are not reposted once they complete, and its complete messages stay in
//! the connection, in order, instead of going up. With credit flow control
//! the peer runs out of credits; a kernel peer (6.1 advertises no credits)
//! meets RNR and retries without end (`rnr_retry_count` 7), so it stalls
//! without an error or a reconnect. Held: at most one receive ring
//! ([`crate::verbs::RECV_WR`] fragments of 4 KiB) beyond the batch that
//! caused the pause (`ib_rx_held_peak`). The resume reposts and grants the
//! buffers, then hands up what was held before anything newer; a
//! connection that ends while paused hands it up before `path_down`.
//!
//! A connection ends on a CM event (DISCONNECTED, DEVICE_REMOVAL, ...), a
//! failed completion, a protocol error or a shutdown asked by the core: the
//! QP goes to the error state, both CQs are drained (successful receives
//! before the flush are still delivered, IBV_WC_WR_FLUSH_ERR completions only
//! free their slots; a message counts as delivered only through an `h_ack`,
//! so nothing completes twice), then `path_down` is reported.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rds_core::{
    Accept, DownReason, PathId, PathInfo, Payload, RdsTransport, RxMessage, TransportCaps, TransportConnInfo,
    TransportKind, TransportSink, TxMessage,
};

use crate::proto::frag::OutMessage;
use crate::proto::sidechannel::{DEFAULT_PORT, Key};
use crate::verbs::{IbConnection, Listener, Received, SideEvent, SideListener, Verbs, device_names};

/// How connections are set up.
#[derive(Clone, Debug, Default)]
pub enum SetupMode {
    /// RDMA CM on port 18634 (IPv4) or 16385 (IPv6) with the kernel's
    /// private data (talks to the kernel's `rds_rdma`).
    #[default]
    Cm,
    /// No RDMA CM: a TCP side channel on `port` authenticated with the
    /// pre-shared `key` (HMAC-SHA256 challenge-response, see
    /// [`crate::proto::sidechannel`]) carries the QP parameters; QPs are moved
    /// INIT -> RTR -> RTS by hand. Only our own nodes speak it.
    VerbsOnly { key: Key, port: u16 },
}

/// The transport's configuration.
#[derive(Clone, Debug, Default)]
pub struct IbConfig {
    pub mode: SetupMode,
}

/// The environment variable naming the pre-shared key file: when set, the
/// transport runs verbs-only (the file's bytes, surrounding whitespace
/// trimmed, at least 16; a file its group or others may access is
/// refused, see [`Key::from_file`]).
pub const ENV_PSK_FILE: &str = "RDS_IB_PSK_FILE";
/// The environment variable with the verbs-only side channel's TCP port
/// (default [`DEFAULT_PORT`], 18635).
pub const ENV_SIDE_PORT: &str = "RDS_IB_SIDE_PORT";

impl IbConfig {
    /// From the environment: [`SetupMode::VerbsOnly`] when
    /// `RDS_IB_PSK_FILE` is set (an unreadable, short, or group- or
    /// other-accessible key file is an error, never a fallback to the
    /// unauthenticated CM mode), with the
    /// port from `RDS_IB_SIDE_PORT` (default 18635); otherwise
    /// [`SetupMode::Cm`].
    pub fn from_env() -> io::Result<IbConfig> {
        let Some(path) = std::env::var_os(ENV_PSK_FILE) else { return Ok(IbConfig::default()) };
        let key = Key::from_file(std::path::Path::new(&path))
            .map_err(|e| io::Error::new(e.kind(), format!("{ENV_PSK_FILE}={e}")))?;
        let port = match std::env::var(ENV_SIDE_PORT) {
            Ok(v) => v.trim().parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{ENV_SIDE_PORT}={v}: not a port"))
            })?,
            Err(_) => DEFAULT_PORT,
        };
        Ok(IbConfig { mode: SetupMode::VerbsOnly { key, port } })
    }
}

/// How long an outgoing connect may take (resolution, route, handshake).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a closing connection waits for its flushed work requests.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Bytes pulled from the core at a time.
const PULL_BUDGET: usize = 256 * 1024;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

enum Cmd {
    Kick(PathId, u64),
    Shutdown(PathId, u64),
    /// An outgoing connect finished.
    Connected(PathInfo, io::Result<IbConnection>),
    /// The listener accepted a connection the core took as this path.
    Accepted(PathInfo, IbConnection),
    /// The path's receive flow control changed (`Shared::rx_flow`).
    RxFlow(PathId),
    Close,
}

struct Shared {
    sink: RwLock<Option<Weak<dyn TransportSink>>>,
    cmds: Mutex<VecDeque<Cmd>>,
    wake_fd: c_int,
    /// Outgoing connects under way: path to instance.
    connecting: Mutex<HashMap<PathId, u64>>,
    /// (local, peer) pairs with an outgoing connect under way.
    connecting_pairs: Mutex<HashSet<(IpAddr, IpAddr)>>,
    counters: Mutex<Counters>,
    /// Receive flow control per path, whatever connection serves it now
    /// or later: (paused, seq of the last applied `rx_flow`).
    rx_flow: Mutex<HashMap<PathId, (bool, u64)>>,
    stopped: AtomicBool,
}

#[derive(Clone, Copy, Default)]
struct Counters {
    connects: u64,
    connect_failed: u64,
    accepted: u64,
    refused: u64,
    side_auth_failed: u64,
    side_bad_handshake: u64,
    tx_messages: u64,
    rx_messages: u64,
    conn_down: u64,
    rx_flushed: u64,
    tx_flushed: u64,
    rdma_ops: u64,
    rdma_failed: u64,
    /// Connections whose receiving was paused (receive flow control).
    rx_paused: u64,
    /// RDMA CM: admitted connect requests that failed to set up or to
    /// become ESTABLISHED in time.
    establish_failed: u64,
    /// Resumes applied to a paused connection.
    rx_resumed: u64,
    /// Most bytes of complete messages (payload and header) a paused
    /// connection held.
    rx_held_peak: u64,
    /// Credit and ack counters of every connection so far.
    flow: crate::proto::credits::FlowCounters,
}

impl Shared {
    fn sink(&self) -> Option<Arc<dyn TransportSink>> {
        self.sink.read().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(Weak::upgrade)
    }

    fn push(&self, c: Cmd) {
        lock(&self.cmds).push_back(c);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake_fd, (&one as *const u64).cast(), 8) };
    }
}

struct ListenerHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// RDS over InfiniBand / RoCE behind [`RdsTransport`].
pub struct IbTransport {
    verbs: Arc<Verbs>,
    pub(crate) cfg: IbConfig,
    /// User memory registered for RDMA (`crate::rdma_api`).
    pub(crate) mrs: crate::verbs::mr::MrTable,
    shared: Arc<Shared>,
    listeners: Mutex<HashMap<IpAddr, ListenerHandle>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl IbTransport {
    /// Whether this host has an RDMA device (`ibv_get_device_list`).
    pub fn available() -> bool {
        device_names().map(|d| !d.is_empty()).unwrap_or(false)
    }

    /// Starts the transport's event thread (RDMA CM mode). ENODEV when the
    /// host has no RDMA device.
    pub fn new() -> io::Result<Arc<IbTransport>> {
        IbTransport::with_config(IbConfig::default())
    }

    /// [`IbTransport::new`] in the setup mode `cfg` asks for.
    pub fn with_config(cfg: IbConfig) -> io::Result<Arc<IbTransport>> {
        if !IbTransport::available() {
            return Err(io::Error::from_raw_os_error(libc::ENODEV));
        }
        // SAFETY: plain eventfd creation.
        let wake_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake_fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let shared = Arc::new(Shared {
            sink: RwLock::new(None),
            cmds: Mutex::new(VecDeque::new()),
            wake_fd,
            connecting: Mutex::new(HashMap::new()),
            connecting_pairs: Mutex::new(HashSet::new()),
            counters: Mutex::new(Counters::default()),
            rx_flow: Mutex::new(HashMap::new()),
            stopped: AtomicBool::new(false),
        });
        let mut ev = EventLoop::new(shared.clone())?;
        let h = std::thread::Builder::new().name("rds-ib".into()).spawn(move || ev.run())?;
        let verbs = Verbs::new();
        Ok(Arc::new(IbTransport {
            mrs: crate::verbs::mr::MrTable::new(verbs.clone()),
            verbs,
            cfg,
            shared,
            listeners: Mutex::new(HashMap::new()),
            thread: Mutex::new(Some(h)),
        }))
    }

    /// Whether this transport runs the verbs-only setup (pre-shared key).
    pub fn is_verbs_only(&self) -> bool {
        matches!(self.cfg.mode, SetupMode::VerbsOnly { .. })
    }

    /// Where events go (the engine).
    pub fn set_sink(&self, sink: Weak<dyn TransportSink>) {
        *self.shared.sink.write().unwrap_or_else(|p| p.into_inner()) = Some(sink);
    }

    /// IPv4 as IPv4 (also when written IPv4-mapped), IPv6 as IPv6.
    fn canonical(addr: IpAddr) -> IpAddr {
        addr.to_canonical()
    }

    /// The verbs-only setup mode is IPv4 only.
    fn v4(addr: IpAddr) -> io::Result<Ipv4Addr> {
        match addr {
            IpAddr::V4(a) => Ok(a),
            IpAddr::V6(a) => a.to_ipv4_mapped().ok_or_else(|| io::Error::from_raw_os_error(libc::EADDRNOTAVAIL)),
        }
    }
}

impl RdsTransport for IbTransport {
    fn caps(&self) -> TransportCaps {
        crate::CAPS
    }

    /// `rds_ib_laddr_check`: an RDMA CM id binds to the address and lands
    /// on an RDMA device (verbs-only: a port has a GID for the address).
    fn laddr_check(&self, addr: IpAddr) -> io::Result<()> {
        if let SetupMode::VerbsOnly { .. } = self.cfg.mode {
            // No RDMA CM: the address must be in a port's GID table.
            return self.verbs.port_for_ip(IbTransport::v4(addr)?).map(|_| ());
        }
        if crate::verbs::addr_has_device(IbTransport::canonical(addr))? {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(libc::EADDRNOTAVAIL))
        }
    }

    fn start_local(&self, addr: IpAddr) -> io::Result<()> {
        let a = IbTransport::canonical(addr);
        let mut ls = lock(&self.listeners);
        if ls.contains_key(&addr) {
            return Ok(());
        }
        let (bound, port) = match &self.cfg.mode {
            SetupMode::Cm => (Listener::bind(&self.verbs, a).map(AnyListener::Cm), crate::verbs::cm_port(&a)),
            SetupMode::VerbsOnly { key, port } => {
                (SideListener::bind(&self.verbs, IbTransport::v4(a)?, key.clone(), *port).map(AnyListener::Side), *port)
            }
        };
        let mut l = bound.map_err(|e| {
            if e.raw_os_error() == Some(libc::EADDRINUSE) {
                e
            } else {
                io::Error::new(e.kind(), format!("RDS-IB listen on {a}:{port}: {e}"))
            }
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let shared = self.shared.clone();
        let h = std::thread::Builder::new()
            .name("rds-ib-listen".into())
            .spawn(move || listen_loop(&mut l, &st, &shared))?;
        ls.insert(addr, ListenerHandle { stop, thread: Some(h) });
        Ok(())
    }

    fn stop_local(&self, addr: IpAddr) {
        let h = lock(&self.listeners).remove(&addr);
        if let Some(mut h) = h {
            h.stop.store(true, Ordering::Release);
            if let Some(t) = h.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn connect(&self, path: PathInfo) {
        let (l, f) = (IbTransport::canonical(path.laddr), IbTransport::canonical(path.faddr));
        let side = matches!(self.cfg.mode, SetupMode::VerbsOnly { .. });
        if l.is_ipv4() != f.is_ipv4() || (side && !l.is_ipv4()) {
            self.shared.push(Cmd::Connected(path, Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT))));
            return;
        }
        lock(&self.shared.connecting).insert(path.id, path.inst);
        lock(&self.shared.connecting_pairs).insert((l, f));
        lock(&self.shared.counters).connects += 1;
        let verbs = self.verbs.clone();
        let shared = self.shared.clone();
        let mode = self.cfg.mode.clone();
        let spawned = std::thread::Builder::new().name("rds-ib-connect".into()).spawn(move || {
            if matches!(mode, SetupMode::Cm) && l > f && !hold_back(&shared, path) {
                lock(&shared.connecting_pairs).remove(&(l, f));
                shared.push(Cmd::Connected(path, Err(io::Error::from_raw_os_error(libc::ECANCELED))));
                return;
            }
            let r = match &mode {
                SetupMode::Cm => IbConnection::connect(&verbs, l, f, CONNECT_TIMEOUT),
                SetupMode::VerbsOnly { key, port } => match (l, f) {
                    (IpAddr::V4(l), IpAddr::V4(f)) => {
                        IbConnection::connect_side(&verbs, l, f, key, *port, CONNECT_TIMEOUT)
                    }
                    _ => Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
                },
            };
            lock(&shared.connecting_pairs).remove(&(l, f));
            shared.push(Cmd::Connected(path, r));
        });
        if let Err(e) = spawned {
            lock(&self.shared.connecting_pairs).remove(&(l, f));
            self.shared.push(Cmd::Connected(path, Err(e)));
        }
    }

    fn shutdown(&self, path: PathInfo) {
        self.shared.push(Cmd::Shutdown(path.id, path.inst));
    }

    fn kick(&self, path: PathInfo) {
        self.shared.push(Cmd::Kick(path.id, path.inst));
    }

    /// Receive flow control: a paused path's connection hands nothing up
    /// and reposts no receive buffer (see [`IbConnection::set_rx_paused`]): with
    /// credit flow control the peer stops when its credits run out; a
    /// kernel peer (no credit flow control) gets RNR NAKs and retries
    /// without end (`rnr_retry_count` 7). What completes meanwhile (at
    /// most one receive ring) is held in order and acked, never dropped:
    /// the resume hands it up first, and a connection that ends while
    /// paused hands it up before `path_down`. The state is per path, so a
    /// reconnected path stays paused; a stale `seq` is ignored.
    fn rx_flow(&self, path: PathInfo, paused: bool, seq: u64) {
        {
            let mut flow = lock(&self.shared.rx_flow);
            let f = flow.entry(path.id).or_insert((false, 0));
            if seq <= f.1 {
                return;
            }
            *f = (paused, seq);
        }
        self.shared.push(Cmd::RxFlow(path.id));
    }

    fn close(&self) {
        let addrs: Vec<IpAddr> = lock(&self.listeners).keys().copied().collect();
        for a in addrs {
            self.stop_local(a);
        }
        self.shared.stopped.store(true, Ordering::Release);
        self.shared.push(Cmd::Close);
        if let Some(t) = lock(&self.thread).take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = *lock(&self.shared.counters);
        let flow = c.flow.named();
        let mut v = vec![
            ("ib_connect", c.connects),
            ("ib_connect_failed", c.connect_failed),
            ("ib_accepted", c.accepted),
            ("ib_accept_refused", c.refused),
            ("ib_accept_establish_failed", c.establish_failed),
            ("ib_qp_created", self.verbs.qp_created()),
            ("ib_side_auth_failed", c.side_auth_failed),
            ("ib_side_bad_handshake", c.side_bad_handshake),
            ("ib_tx_messages", c.tx_messages),
            ("ib_rx_messages", c.rx_messages),
            ("ib_conn_down", c.conn_down),
            ("ib_rx_flushed", c.rx_flushed),
            ("ib_tx_flushed", c.tx_flushed),
            ("ib_rdma_ops", c.rdma_ops),
            ("ib_rdma_failed", c.rdma_failed),
            ("ib_rdma_mrs", self.mrs.count() as u64),
            ("ib_rx_paused", c.rx_paused),
            ("ib_rx_resumed", c.rx_resumed),
            ("ib_rx_held_peak", c.rx_held_peak),
        ];
        v.extend(flow);
        v
    }

    fn conn_info(&self) -> Vec<TransportConnInfo> {
        Vec::new()
    }
}

impl Drop for IbTransport {
    fn drop(&mut self) {
        self.close();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the last user of the eventfd is gone; it is ours.
        unsafe { libc::close(self.wake_fd) };
    }
}

/// The larger address's connect (RDMA CM) first waits 20..270 ms: after a
/// connection loss both sides reconnect at once, and a connect request of
/// ours that reaches a kernel whose own new connection to us is up makes
/// it drop that connection (its stale-connection rule), over and over
/// (up to 28 cycles seen in ib_vm_disconnect). Meanwhile the smaller
/// side's request usually arrives and takes the path: then `false`, and
/// no request goes out.
fn hold_back(shared: &Shared, path: PathInfo) -> bool {
    let jitter = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    std::thread::sleep(Duration::from_millis(20 + u64::from(jitter % 250)));
    lock(&shared.connecting).get(&path.id) == Some(&path.inst)
}

/// The listener of either setup mode.
enum AnyListener {
    Cm(Listener<PathInfo>),
    Side(SideListener<PathInfo>),
}

fn listen_loop(l: &mut AnyListener, stop: &AtomicBool, shared: &Arc<Shared>) {
    match l {
        AnyListener::Cm(l) => cm_listen_loop(l, stop, shared),
        AnyListener::Side(l) => side_listen_loop(l, stop, shared),
    }
}

/// The admission check of an accepting listener: the core's path, or
/// `None` (counted in `refused`).
fn admit(shared: &Shared, local: IpAddr, peer: IpAddr, refused: &mut u64) -> Option<PathInfo> {
    // Crossed connects: the smaller address's own connect wins.
    if rds_core::addr_cmp(&local, &peer).is_lt() && lock(&shared.connecting_pairs).contains(&(local, peer)) {
        *refused += 1;
        return None;
    }
    let sink = shared.sink()?;
    match sink.accept(TransportKind::Ib, local, peer, 0) {
        Accept::Path(info) => Some(info),
        _ => {
            *refused += 1;
            None
        }
    }
}

/// A path the core gave a connection that did not come up.
fn taken_but_failed(shared: &Shared, info: PathInfo) {
    if let Some(sink) = shared.sink() {
        sink.path_down(info.id, info.inst, DownReason::ConnectFailed);
    }
}

fn cm_listen_loop(l: &mut Listener<PathInfo>, stop: &AtomicBool, shared: &Arc<Shared>) {
    // The listener's counts already added: refusals (the core's, crossed
    // connects and the pending limits) and failed setups.
    let mut seen = (l.refused, l.establish_failed);
    while !stop.load(Ordering::Acquire) {
        let deadline = Instant::now() + Duration::from_millis(200);
        // The listener counts admit's refusals itself.
        let res = l.accept_with(deadline, &mut |local, peer| admit(shared, local, peer, &mut 0));
        {
            let mut c = lock(&shared.counters);
            c.refused += l.refused - seen.0;
            c.establish_failed += l.establish_failed - seen.1;
            seen = (l.refused, l.establish_failed);
        }
        listener_outcome(shared, res);
    }
}

/// What one accept of either listener produced: an established
/// connection goes to the event thread; one the core took but that did not
/// come up is reported down; after an error the listener pauses briefly.
fn listener_outcome(shared: &Arc<Shared>, res: io::Result<Option<SideEvent<PathInfo>>>) {
    match res {
        Ok(Some(SideEvent::Up(conn, info))) => {
            lock(&shared.counters).accepted += 1;
            shared.push(Cmd::Accepted(info, *conn));
        }
        Ok(Some(SideEvent::Failed(_, info))) => taken_but_failed(shared, info),
        Ok(None) => {}
        Err(_) => std::thread::sleep(Duration::from_millis(50)),
    }
}

/// The verbs-only listener: it only accepts, counts and admits; every
/// connection's handshake and setup runs on a thread of its own, whose
/// outcome comes back here with the path the core gave it.
fn side_listen_loop(l: &mut SideListener<PathInfo>, stop: &AtomicBool, shared: &Arc<Shared>) {
    let mut seen = (0, 0);
    while !stop.load(Ordering::Acquire) {
        let mut refused = 0;
        let deadline = Instant::now() + Duration::from_millis(200);
        let res = l
            .accept_with(deadline, &mut |local, peer| admit(shared, IpAddr::V4(local), IpAddr::V4(peer), &mut refused));
        {
            let mut c = lock(&shared.counters);
            c.refused += refused;
            c.side_auth_failed += l.auth_failed - seen.0;
            c.side_bad_handshake += l.bad_handshake - seen.1;
            seen = (l.auth_failed, l.bad_handshake);
        }
        listener_outcome(shared, res);
    }
}

/// The established connection of a path, owned by the event thread, with
/// what it still has to post.
struct PathConnection {
    info: PathInfo,
    conn: IbConnection,
    token: u64,
    /// Messages pulled and not fully posted yet, the first possibly half.
    tx: VecDeque<(TxMessage, Option<OutMessage>)>,
    /// The highest `h_ack` reported to the core.
    acked: u64,
    /// The connection's flow counters already added to `Counters::flow`.
    fc_seen: crate::proto::credits::FlowCounters,
}

struct EventLoop {
    shared: Arc<Shared>,
    epfd: c_int,
    conns: HashMap<PathId, PathConnection>,
    tokens: HashMap<u64, PathId>,
    next_token: u64,
}

const WAKE_TOKEN: u64 = u64::MAX;

impl EventLoop {
    fn new(shared: Arc<Shared>) -> io::Result<EventLoop> {
        // SAFETY: plain epoll creation.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let ev = EventLoop { shared, epfd, conns: HashMap::new(), tokens: HashMap::new(), next_token: 0 };
        ev.ctl(libc::EPOLL_CTL_ADD, ev.shared.wake_fd, WAKE_TOKEN)?;
        Ok(ev)
    }

    fn ctl(&self, op: c_int, fd: c_int, token: u64) -> io::Result<()> {
        let mut e = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
        // SAFETY: epfd and fd are live descriptors; e is valid for the call.
        if unsafe { libc::epoll_ctl(self.epfd, op, fd, &mut e) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn run(&mut self) {
        // SAFETY: epoll_event is plain data.
        let mut evs: [libc::epoll_event; 64] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: evs has room for 64 events.
            let n = unsafe { libc::epoll_wait(self.epfd, evs.as_mut_ptr(), 64, 1000) };
            let n = if n < 0 { 0 } else { n as usize };
            for e in &evs[..n] {
                let token = e.u64;
                if token == WAKE_TOKEN {
                    let mut v: u64 = 0;
                    // SAFETY: reading 8 bytes into a live u64 from our eventfd.
                    unsafe { libc::read(self.shared.wake_fd, (&mut v as *mut u64).cast(), 8) };
                    continue;
                }
                let Some(&pid) = self.tokens.get(&(token >> 1)) else { continue };
                if token & 1 == 1 {
                    self.on_cq(pid);
                } else {
                    self.on_cm(pid);
                }
            }
            let cmds: Vec<Cmd> = lock(&self.shared.cmds).drain(..).collect();
            for c in cmds {
                if !self.on_cmd(c) {
                    self.close_all();
                    // SAFETY: our epoll descriptor, closed once.
                    unsafe { libc::close(self.epfd) };
                    return;
                }
            }
        }
    }

    fn on_cmd(&mut self, c: Cmd) -> bool {
        match c {
            Cmd::Close => return false,
            Cmd::Kick(pid, inst) => {
                if self.conns.get(&pid).is_some_and(|a| a.info.inst == inst) {
                    self.transmit(pid);
                }
            }
            Cmd::Shutdown(pid, inst) => {
                let connecting = {
                    let mut c = lock(&self.shared.connecting);
                    if c.get(&pid) == Some(&inst) {
                        c.remove(&pid);
                        true
                    } else {
                        false
                    }
                };
                if connecting {
                    if let Some(s) = self.shared.sink() {
                        s.path_down(pid, inst, DownReason::ShutdownDone);
                    }
                } else if self.conns.get(&pid).is_some_and(|a| a.info.inst == inst) {
                    self.teardown(pid, DownReason::ShutdownDone);
                } else if let Some(s) = self.shared.sink() {
                    // Nothing of that instance left: done already.
                    s.path_down(pid, inst, DownReason::ShutdownDone);
                }
            }
            Cmd::Connected(info, res) => {
                let current = {
                    let mut c = lock(&self.shared.connecting);
                    if c.get(&info.id) == Some(&info.inst) {
                        c.remove(&info.id);
                        true
                    } else {
                        false
                    }
                };
                match res {
                    Ok(conn) if current && !self.shared.stopped.load(Ordering::Acquire) => {
                        let ack = conn.peer_acked();
                        if self.install(info, conn, ack) {
                            if let Some(s) = self.shared.sink() {
                                s.path_up(info.id, info.inst);
                                if ack > 0 {
                                    s.acked(info.id, info.inst, ack);
                                }
                            }
                            // Completions that came before the descriptors
                            // were watched; then the first pull.
                            self.on_cq(info.id);
                        }
                    }
                    Ok(mut conn) => {
                        // Superseded (shut down, or an accepted connection
                        // took the path meanwhile).
                        conn.drain(Instant::now() + DRAIN_TIMEOUT);
                    }
                    Err(_) => {
                        lock(&self.shared.counters).connect_failed += 1;
                        if current {
                            if let Some(s) = self.shared.sink() {
                                s.path_down(info.id, info.inst, DownReason::ConnectFailed);
                            }
                        }
                    }
                }
            }
            Cmd::RxFlow(pid) => {
                if self.conns.contains_key(&pid) && !self.apply_rx_flow(pid) {
                    // Resumed: hand up what was held, then go on.
                    self.on_cq(pid);
                }
            }
            Cmd::Accepted(info, conn) if self.conns.get(&info.id).is_some_and(|a| a.info.inst > info.inst) => {
                // Established after a newer connection took the path (the
                // listener waits on several at once): the core has moved
                // on; this one goes (dropping it disconnects it).
                drop(conn);
            }
            Cmd::Accepted(info, conn) => {
                lock(&self.shared.connecting).remove(&info.id);
                let ack = conn.peer_acked();
                if self.install(info, conn, ack) {
                    if let Some(s) = self.shared.sink() {
                        if ack > 0 {
                            s.acked(info.id, info.inst, ack);
                        }
                    }
                    self.on_cq(info.id);
                }
            }
        }
        true
    }

    /// Registers a connection for a path (ending an older one of the path).
    fn install(&mut self, info: PathInfo, mut conn: IbConnection, acked: u64) -> bool {
        conn.set_eager_acks(true);
        if self.conns.contains_key(&info.id) {
            self.teardown(info.id, DownReason::Closed);
        }
        let token = self.next_token;
        self.next_token += 1;
        let (cm, cq) = (conn.cm_fd(), conn.cq_fd());
        let ok = self.ctl(libc::EPOLL_CTL_ADD, cm, token << 1).is_ok()
            && self.ctl(libc::EPOLL_CTL_ADD, cq, (token << 1) | 1).is_ok();
        self.tokens.insert(token, info.id);
        self.conns.insert(
            info.id,
            PathConnection { info, conn, token, tx: VecDeque::new(), acked, fc_seen: Default::default() },
        );
        if !ok {
            self.teardown(info.id, DownReason::Closed);
            return false;
        }
        // A path paused before (an earlier connection) stays paused.
        self.apply_rx_flow(info.id);
        true
    }

    /// Applies the path's receive flow control to its connection; returns
    /// whether it is paused. A failed repost ends the connection at its
    /// next completion (the error is kept in the connection).
    fn apply_rx_flow(&mut self, pid: PathId) -> bool {
        let paused = lock(&self.shared.rx_flow).get(&pid).is_some_and(|f| f.0);
        let Some(a) = self.conns.get_mut(&pid) else { return paused };
        if a.conn.rx_gate_paused() != paused {
            let _ = a.conn.set_rx_paused(paused);
            let mut c = lock(&self.shared.counters);
            if paused {
                c.rx_paused += 1;
            } else {
                c.rx_resumed += 1;
            }
        }
        paused
    }

    fn on_cq(&mut self, pid: PathId) {
        let paused = self.apply_rx_flow(pid);
        let Some(a) = self.conns.get_mut(&pid) else { return };
        let res = a.conn.on_cq_event();
        let mut ready = Vec::new();
        if paused {
            // Held in the connection, in order, until the resume (or the
            // connection's end: teardown hands them up).
            let held = a.conn.ready_bytes() as u64;
            let mut c = lock(&self.shared.counters);
            c.rx_held_peak = c.rx_held_peak.max(held);
        } else {
            a.conn.take_ready(&mut ready);
        }
        let (inst, peer_acked) = (a.info.inst, a.conn.peer_acked());
        let newly_acked = (peer_acked > a.acked).then(|| {
            a.acked = peer_acked;
            peer_acked
        });
        let protocol = a.conn.protocol_error();
        let fc = a.conn.flow_counters();
        let fc_new = fc.since(&a.fc_seen);
        a.fc_seen = fc;
        lock(&self.shared.counters).flow.add(&fc_new);
        let mut rdma_done = Vec::new();
        a.conn.take_rdma_done(&mut rdma_done);
        // Completions first: the notification of an op is queued before a
        // reply the peer sent after the op's message (reaped together).
        self.rdma_complete(pid, inst, rdma_done);
        self.deliver(pid, inst, ready);
        if let (Some(seq), Some(s)) = (newly_acked, self.shared.sink()) {
            s.acked(pid, inst, seq);
        }
        match res {
            Ok(_) => self.transmit(pid),
            Err(_) => self.teardown(pid, if protocol { DownReason::ProtocolError } else { DownReason::Closed }),
        }
    }

    fn on_cm(&mut self, pid: PathId) {
        let Some(a) = self.conns.get_mut(&pid) else { return };
        loop {
            match a.conn.poll_cm_event() {
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        self.teardown(pid, DownReason::Closed);
    }

    fn deliver(&self, pid: PathId, inst: u64, ready: Vec<Received>) {
        if ready.is_empty() {
            return;
        }
        lock(&self.shared.counters).rx_messages += ready.len() as u64;
        let mut msgs: Vec<RxMessage> = ready
            .into_iter()
            .map(|r| RxMessage { header: r.header, payload: Payload::new(r.payload), rx_time_ns: None })
            .collect();
        if let Some(s) = self.shared.sink() {
            s.received(pid, inst, &mut msgs);
        }
    }

    /// Reports completed RDMA operations (sequence, `RDS_RDMA_*`) to the core.
    fn rdma_complete(&self, pid: PathId, inst: u64, done: Vec<(u64, i32)>) {
        if done.is_empty() {
            return;
        }
        {
            let mut c = lock(&self.shared.counters);
            c.rdma_ops += done.len() as u64;
            c.rdma_failed += done.iter().filter(|d| d.1 != 0).count() as u64;
        }
        if let Some(s) = self.shared.sink() {
            for (seq, status) in done {
                s.rdma_complete(pid, inst, seq, status);
            }
        }
    }

    /// Posts pulled messages while the ring and the credits allow, pulling
    /// more from the core as the queue empties.
    fn transmit(&mut self, pid: PathId) {
        let Some(sink) = self.shared.sink() else { return };
        let mut failed = false;
        let mut sent = 0u64;
        loop {
            let Some(a) = self.conns.get_mut(&pid) else { return };
            if a.tx.is_empty() {
                let mut out = Vec::new();
                sink.pull(pid, a.info.inst, PULL_BUDGET, &mut out);
                // The sink may have called back into us; the entry is still
                // ours (only this thread changes the map).
                let Some(a) = self.conns.get_mut(&pid) else { return };
                if out.is_empty() {
                    break;
                }
                a.tx.extend(out.into_iter().map(|m| (m, None)));
                continue;
            }
            let (m, om) = a.tx.front_mut().unwrap();
            if om.is_none() {
                // An RDMA op goes first, and the message tells the peer its
                // rkey (RDS_EXTHDR_RDMA: a USE_ONCE MR is released on it).
                if let Some(op) = m.rdma.clone() {
                    match a.conn.post_rdma(m.header.sequence, &op) {
                        Ok(true) => {
                            let _ =
                                m.header.push_extension(rds_core::wire::Ext::Rdma { rkey: op.remote_cookie as u32 });
                        }
                        Ok(false) => break,
                        Err(_) => {
                            failed = true;
                            break;
                        }
                    }
                }
                match OutMessage::new(m.header, m.payload.len(), m.ack_required) {
                    Ok(o) => *om = Some(o),
                    Err(_) => {
                        // Never from the core (it bounds lengths); skip it.
                        a.tx.pop_front();
                        continue;
                    }
                }
            }
            let payload = m.payload.clone();
            let Some(o) = om.as_mut() else { break };
            match a.conn.post_message(o, &payload) {
                Ok(true) => {
                    a.tx.pop_front();
                    sent += 1;
                }
                Ok(false) => break,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if sent > 0 {
            lock(&self.shared.counters).tx_messages += sent;
        }
        if failed {
            self.teardown(pid, DownReason::Closed);
        }
    }

    /// Ends a connection: disconnect, drain (delivering what completed
    /// before the flush), report `path_down`.
    fn teardown(&mut self, pid: PathId, reason: DownReason) {
        let Some(mut a) = self.conns.remove(&pid) else { return };
        self.tokens.remove(&a.token);
        let _ = self.ctl(libc::EPOLL_CTL_DEL, a.conn.cm_fd(), 0);
        let _ = self.ctl(libc::EPOLL_CTL_DEL, a.conn.cq_fd(), 0);
        let reason = if a.conn.protocol_error() { DownReason::ProtocolError } else { reason };
        a.conn.drain(Instant::now() + DRAIN_TIMEOUT);
        let mut ready = Vec::new();
        a.conn.take_ready(&mut ready);
        let st = a.conn.stats();
        {
            let mut c = lock(&self.shared.counters);
            c.conn_down += 1;
            c.rx_flushed += st.rx_flushed;
            c.tx_flushed += st.tx_flushed;
        }
        let inst = a.info.inst;
        let mut rdma_done = Vec::new();
        a.conn.take_rdma_done(&mut rdma_done);
        self.rdma_complete(pid, inst, rdma_done);
        self.deliver(pid, inst, ready);
        let peer_acked = a.conn.peer_acked();
        drop(a.conn);
        if let Some(s) = self.shared.sink() {
            if peer_acked > a.acked {
                s.acked(pid, inst, peer_acked);
            }
            s.path_down(pid, inst, reason);
        }
    }

    fn close_all(&mut self) {
        let pids: Vec<PathId> = self.conns.keys().copied().collect();
        for p in pids {
            self.teardown(p, DownReason::ShutdownDone);
        }
    }
}
