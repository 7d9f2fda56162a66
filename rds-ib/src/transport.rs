//! [`IbTransport`]: the verbs path behind [`rds_core::RdsTransport`]
//! (feature `verbs`, IPv4).
//!
//! Threads (the event thread's code is in `transport/event_loop.rs`, the
//! listener threads' in `transport/listen.rs`):
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
use std::time::Duration;

use rds_core::{PathId, PathInfo, RdsTransport, TransportCaps, TransportConnInfo, TransportSink};

use crate::proto::sidechannel::{DEFAULT_PORT, Key};
use crate::verbs::{IbConnection, Listener, SideListener, Verbs, device_names};

mod event_loop;
mod listen;

use event_loop::EventLoop;
use listen::{AnyListener, listen_loop};

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
