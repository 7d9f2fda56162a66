//! The verbs path (feature `verbs`): devices, the shared protection domain,
//! RDMA CM connection setup with the kernel's private data, one RC queue
//! pair per connection with its completion queues, the receive ring and the
//! send path, on `rdma-sys`.
//!
//! A [`Conn`] is driven by its owner calling [`Conn::send`] and
//! [`Conn::poll`]; [`crate::transport`] owns the connections behind
//! [`rds_core::RdsTransport`] (its event thread polls them, its listener
//! threads accept without blocking on any one peer). What it does follows
//! the kernel's `rds_rdma`:
//!
//! * RDMA CM in the TCP port space, port [`RDS_IB_PORT`] (18634) for IPv4
//!   and [`RDS_CM_PORT`] (16385) for IPv6, as the kernel's two listeners;
//!   address and route resolution with a 5000 ms timeout; `retry_count`
//!   [`RETRY_COUNT`] (the kernel's `rds_ib_retry_count`) and
//!   `rnr_retry_count` 7 (infinite: mainline runs without credit flow
//!   control and relies on RNR retry);
//! * credit flow control offered by default ([`Verbs::set_flow_control`]):
//!   the connect request and the accept advertise the posted receive ring,
//!   every reposted buffer is granted again in `h_credit` (an ack-only
//!   frame once 16 wait), and our sends are limited by credits when both
//!   sides advertised some; a mainline kernel advertises 0, which turns it
//!   off ([`crate::proto::credits`]);
//! * the connect request carries `rds_ib_connect_private` proposing 4.1
//!   ([`crate::proto::private`]), falling back to 3.1 after a reject with value 1;
//!   the passive side answers with the version `passive_negotiate` picks and
//!   rejects incompatible requests with the reject value 1;
//! * one RC QP per connection; a ring of [`RECV_WR`] receive work requests of
//!   two SGEs each (the 48-byte header buffer and a 4 KiB fragment buffer),
//!   refilled as each completes; SENDs of two SGEs (a header copy and the
//!   fragment, one SGE for a 0-byte message), signaled and solicited as
//!   [`crate::proto::frag`] decides; explicit ack-only frames as
//!   [`crate::proto::credits`] decides.
//!
//! Device contexts: librdmacm opens every RDMA device once per process and
//! hands that context out in `rdma_cm_id::verbs`; a QP must be created on a
//! PD of that very context. So [`Verbs`] keeps one PD per CM device context,
//! shared by every connection on that device, instead of opening devices a
//! second time. [`device_names`] lists the devices with `ibv_get_device_list`.
//!
//! Every `unsafe` block is a call into libibverbs/librdmacm or a read of
//! memory they own, each with its reason.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_sys as sys;
use rds_core::wire::{self, HEADER_LEN, Header, PROTOCOL_3_1};

use crate::proto::credits::{FlowControl, RxGate};
use crate::proto::frag::{
    FRAG_SIZE, OutFrame, OutMessage, Reassembler, RecvError, RxKind, SignalState, ack_only_header,
};
mod side;
pub use side::{PortInfo, SideEvent, SideListener};
pub mod mr;
mod rdma;
pub use rdma::MAX_RDMA_SGES;

use crate::proto::private::{
    ActiveNegotiation, ConnectPrivate, Family, PrivAddrs, RejectAction, passive_negotiate, reject_data, version_usable,
};

/// The RDMA CM port of RDS over IPv4 (`RDS_PORT` 18634).
pub const RDS_IB_PORT: u16 = 18634;
/// The RDMA CM port of RDS over IPv6 (`RDS_CM_PORT` 16385, the kernel's
/// second listener, IPv6 requests only).
pub const RDS_CM_PORT: u16 = 16385;
/// Receive work requests posted per connection.
pub const RECV_WR: usize = 512;
/// Send slots (header copy + 4 KiB buffer) per connection.
pub const SEND_WR: usize = 256;
/// Transport retries of an RC QP before its sends fail with
/// `IBV_WC_RETRY_EXC_ERR` (the CM REQ carries it, so both sides of a
/// connection we open use it; the kernel's `rds_ib_retry_count` default,
/// 1 in 6.1). Not 7: rxe (Soft-RoCE) takes 7 as "retry forever", so a
/// peer that went silent would never end the connection.
pub const RETRY_COUNT: u8 = 1;

/// Address and route resolution timeout (`RDS_RDMA_RESOLVE_TIMEOUT_MS`).
pub const RESOLVE_TIMEOUT_MS: i32 = 5000;
/// `IB_CM_REJ_CONSUMER_DEFINED`: the reject reason carrying reject data.
const REJ_CONSUMER_DEFINED: i32 = 28;

fn errno() -> io::Error {
    io::Error::last_os_error()
}

fn err(code: i32, what: &str) -> io::Error {
    let e = io::Error::from_raw_os_error(code);
    io::Error::new(e.kind(), format!("{what}: {e} (errno {code})"))
}

/// A librdmacm/libibverbs call returning -1 and setting errno.
fn check(ret: c_int, what: &str) -> io::Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        let e = errno();
        Err(err(e.raw_os_error().unwrap_or(libc::EIO), what))
    }
}

/// Names of the RDMA devices (`ibv_get_device_list`).
pub fn device_names() -> io::Result<Vec<String>> {
    let mut n: c_int = 0;
    // SAFETY: n is a valid out pointer; the list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(errno());
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds n valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: dev is a device of the list; its name is a C string it owns.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: list came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    Ok(names)
}

/// Whether an RDMA device serves the local address `addr`
/// (`rds_ib_laddr_check`: an RDMA CM id bound to it lands on a device).
pub fn addr_has_device(addr: IpAddr) -> io::Result<bool> {
    let ch = Channel::new()?;
    let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
    // SAFETY: ch is live; id is an out pointer.
    check(
        unsafe { sys::rdma_create_id(ch.0, &mut id, ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP) },
        "rdma_create_id",
    )?;
    let _guard = IdGuard(id);
    let mut sa = sockaddr_ip(addr, 0);
    // SAFETY: id is live; sa is valid for the call.
    if unsafe { sys::rdma_bind_addr(id, &mut sa as *mut _ as *mut libc::sockaddr) } != 0 {
        return Ok(false);
    }
    // SAFETY: id is live; verbs is set when the address is on a device.
    Ok(!unsafe { (*id).verbs }.is_null())
}

struct Pd {
    ctx: *mut sys::ibv_context,
    pd: *mut sys::ibv_pd,
}

/// The process-wide verbs state: one protection domain per device context
/// (librdmacm's), shared by all connections.
pub struct Verbs {
    pds: Mutex<Vec<Pd>>,
    /// Device contexts opened by us (verbs-only mode): name and context.
    opened: Mutex<Vec<(String, *mut sys::ibv_context)>>,
    /// QPs created so far (both modes).
    qp_created: std::sync::atomic::AtomicU64,
    /// Credit flow control offered on new connections (both setups).
    flow_control: std::sync::atomic::AtomicBool,
}

// SAFETY: the PD and context pointers are library objects that verbs allow
// to be used from any thread; the list is behind a mutex.
unsafe impl Send for Verbs {}
// SAFETY: as above.
unsafe impl Sync for Verbs {}

impl Verbs {
    pub fn new() -> Arc<Verbs> {
        Arc::new(Verbs {
            pds: Mutex::new(Vec::new()),
            opened: Mutex::new(Vec::new()),
            qp_created: Default::default(),
            // On by default: the transport declares credit flow control
            // ([`rds_core::TransportCaps::credits`]).
            flow_control: std::sync::atomic::AtomicBool::new(crate::CAPS.credits),
        })
    }

    /// Whether new connections offer credit flow control (on by
    /// default; [`crate::proto::credits`]): our private data advertises the
    /// posted receive ring, and our sends are limited by credits when the
    /// peer advertised some too. A peer that advertises 0 (every mainline
    /// kernel) turns our limiting off; then RNR retry paces the sender.
    /// Verbs-only connections negotiate it the same way in the side
    /// channel's parameters (`credits`).
    pub fn set_flow_control(&self, on: bool) {
        self.flow_control.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn flow_control(&self) -> bool {
        self.flow_control.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The shared PD of a device context, allocated on first use.
    fn pd_for(&self, ctx: *mut sys::ibv_context) -> io::Result<*mut sys::ibv_pd> {
        let mut pds = self.pds.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pds.iter().find(|p| p.ctx == ctx) {
            return Ok(p.pd);
        }
        // SAFETY: ctx is a live device context taken from an rdma_cm_id.
        let pd = unsafe { sys::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(errno());
        }
        pds.push(Pd { ctx, pd });
        Ok(pd)
    }

    /// QPs created so far, in both setup modes.
    pub fn qp_created(&self) -> u64 {
        self.qp_created.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of PDs allocated (one per device in use).
    pub fn pd_count(&self) -> usize {
        self.pds.lock().map(|p| p.len()).unwrap_or(0)
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        let pds = self.pds.get_mut().unwrap_or_else(|p| p.into_inner());
        for p in pds.drain(..) {
            // SAFETY: every connection holding this PD (through an Arc) is gone.
            unsafe { sys::ibv_dealloc_pd(p.pd) };
        }
        let opened = self.opened.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, ctx) in opened.drain(..) {
            // SAFETY: opened by us; its PDs are gone.
            unsafe { sys::ibv_close_device(ctx) };
        }
    }
}

/// A CM event copied out of librdmacm (and acked).
struct CmEvent {
    kind: sys::rdma_cm_event_type::Type,
    status: i32,
    id: *mut sys::rdma_cm_id,
    private: Option<Vec<u8>>,
}

fn event_name(kind: sys::rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a static C string for any value.
    unsafe { CStr::from_ptr(sys::rdma_event_str(kind)) }.to_string_lossy().into_owned()
}

/// An RDMA CM event channel, non-blocking.
struct Channel(*mut sys::rdma_event_channel);

impl Channel {
    fn new() -> io::Result<Channel> {
        // SAFETY: plain constructor.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(errno());
        }
        // SAFETY: ch is a live channel; fd is its descriptor.
        let fd = unsafe { (*ch).fd };
        // SAFETY: fcntl on a descriptor we own.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            let e = errno();
            // SAFETY: the channel has no ids yet.
            unsafe { sys::rdma_destroy_event_channel(ch) };
            return Err(e);
        }
        Ok(Channel(ch))
    }

    /// The next event, waiting until `deadline`; `None` on timeout.
    fn next(&self, deadline: Instant) -> io::Result<Option<CmEvent>> {
        loop {
            let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
            // SAFETY: self.0 is live; ev is a valid out pointer.
            let ret = unsafe { sys::rdma_get_cm_event(self.0, &mut ev) };
            if ret == 0 {
                // SAFETY: librdmacm returned a valid event we have not acked.
                let e = unsafe { &*ev };
                // SAFETY: param.conn is the member used by connection events;
                // private_data points to private_data_len bytes until the ack.
                let private = unsafe {
                    let c = &e.param.conn;
                    if c.private_data.is_null() || c.private_data_len == 0 {
                        None
                    } else {
                        Some(
                            std::slice::from_raw_parts(c.private_data as *const u8, c.private_data_len as usize)
                                .to_vec(),
                        )
                    }
                };
                let out = CmEvent { kind: e.event, status: e.status, id: e.id, private };
                // SAFETY: acking the event we got, once.
                unsafe { sys::rdma_ack_cm_event(ev) };
                return Ok(Some(out));
            }
            let e = errno();
            if e.raw_os_error() != Some(libc::EAGAIN) {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let ms = (deadline - now).as_millis().min(1000) as c_int;
            // SAFETY: self.0 is live.
            let mut pfd = libc::pollfd { fd: unsafe { (*self.0).fd }, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, ms.max(1)) };
        }
    }

    /// Waits for an event of kind `want` on any id of the channel.
    fn expect(&self, want: sys::rdma_cm_event_type::Type, deadline: Instant) -> io::Result<CmEvent> {
        match self.next(deadline)? {
            Some(e) if e.kind == want && e.status == 0 => Ok(e),
            Some(e) => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("RDMA CM: {} (status {}) while waiting for {}", event_name(e.kind), e.status, event_name(want)),
            )),
            None => Err(err(libc::ETIMEDOUT, &format!("RDMA CM: no {}", event_name(want)))),
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel was destroyed before (field order).
        unsafe { sys::rdma_destroy_event_channel(self.0) };
    }
}

/// A registered buffer.
struct Mr {
    buf: Vec<u8>,
    mr: *mut sys::ibv_mr,
}

impl Mr {
    fn new(pd: *mut sys::ibv_pd, len: usize) -> io::Result<Mr> {
        let mut buf = vec![0u8; len];
        let access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int;
        // SAFETY: buf is a live heap allocation of len bytes that is never
        // reallocated and outlives the registration (dropped after dereg).
        let mr = unsafe { sys::ibv_reg_mr(pd, buf.as_mut_ptr() as *mut c_void, len, access) };
        if mr.is_null() {
            return Err(errno());
        }
        Ok(Mr { buf, mr })
    }

    fn lkey(&self) -> u32 {
        // SAFETY: mr is a live registration.
        unsafe { (*self.mr).lkey }
    }

    fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the registration is live and no work request uses it any more
        // (the QP was destroyed first).
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

fn sockaddr_v4(addr: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(addr).to_be() },
        sin_zero: [0; 8],
    }
}

/// A socket address of either family for the RDMA CM calls (which read the
/// family and the matching structure).
fn sockaddr_ip(addr: IpAddr, port: u16) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        IpAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr.
            unsafe { *(&mut ss as *mut _ as *mut libc::sockaddr_in) = sockaddr_v4(a, port) };
        }
        IpAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: as above.
            unsafe { *(&mut ss as *mut _ as *mut libc::sockaddr_in6) = sin6 };
        }
    }
    ss
}

/// The kernel's RDMA CM port for an address family: 18634 (`RDS_PORT`) for
/// IPv4, 16385 (`RDS_CM_PORT`) for IPv6 (`rds_rdma_listen_init`).
pub fn cm_port(addr: &IpAddr) -> u16 {
    if addr.is_ipv4() { RDS_IB_PORT } else { RDS_CM_PORT }
}

/// The private data layout of an address family.
fn family(addr: &IpAddr) -> Family {
    if addr.is_ipv4() { Family::V4 } else { Family::V6 }
}

fn id_addrs(id: *mut sys::rdma_cm_id) -> (Option<IpAddr>, Option<IpAddr>) {
    let get = |sa: *const libc::sockaddr| -> Option<IpAddr> {
        // SAFETY: sa points into the id's route address storage.
        let fam = unsafe { (*sa).sa_family } as i32;
        match fam {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
                Some(IpAddr::V6(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    };
    // SAFETY: id is live; rdma_get_local_addr/peer_addr return pointers into it.
    let (l, p) = unsafe { (sys::rdma_get_local_addr(&*id), sys::rdma_get_peer_addr(&*id)) };
    (get(l as *const libc::sockaddr), get(p as *const libc::sockaddr))
}

/// A complete message received on a connection.
#[derive(Debug)]
pub struct Received {
    pub header: Header,
    pub payload: Vec<u8>,
}

/// Why a connection failed.
#[derive(Clone, Debug)]
pub struct ConnError {
    /// The peer broke the protocol (bad frame), rather than a transport error.
    pub protocol: bool,
    pub what: String,
}

/// Counters of one connection.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnStats {
    pub tx_flushed: u64,
    pub rx_flushed: u64,
    pub tx_frames: u64,
    pub tx_messages: u64,
    pub tx_acks: u64,
    pub rx_frames: u64,
    pub rx_messages: u64,
    pub rx_acks: u64,
    pub rx_cong_maps: u64,
}

/// The reject value for a connect request we refuse for now (a connect of
/// our own to that peer is under way, or the path is busy): 0, which the
/// kernel's active side takes like [`crate::proto::private::REJ_INCOMPAT`]: it drops the attempt
/// and reconnects (proposing 3.1 from then on, as after any such reject of
/// its own). A value above 1 is only logged by the kernel: its connection
/// then stays CONNECTING for good and it rejects every connect of ours as
/// a crossed one (seen in the forced-disconnect VM test: no connection
/// again after a refusal).
pub const REJ_RETRY: i32 = 0;

/// One RDS-IB connection: CM id, RC QP, CQs, rings.
pub struct Conn {
    // Field order is drop order where it matters: the QP (and the CM id)
    // goes first (in Drop), then CQs and MRs, then the channel or socket,
    // then the shared PD.
    link: Link,
    send_cq: *mut sys::ibv_cq,
    recv_cq: *mut sys::ibv_cq,
    comp: *mut sys::ibv_comp_channel,
    /// Receive work requests posted and not completed yet.
    rx_posted: usize,
    /// The first error seen on the connection (a failed completion, a
    /// protocol error): nothing is processed or posted after it.
    failed: Option<ConnError>,
    /// rdma_disconnect was called.
    disconnected: bool,
    /// Ack everything received whenever the receive CQ runs dry.
    eager_acks: bool,
    eager_acked: u64,
    rx_hdr: Mr,
    rx_data: Mr,
    tx_hdr: Mr,
    tx_data: Mr,
    _verbs: Arc<Verbs>,
    tx_free: Vec<usize>,
    /// Posted sends in order: slot and whether it is an ack-only frame.
    tx_inflight: VecDeque<(usize, bool)>,
    fc: FlowControl,
    /// Receive flow control: completed buffers held, not reposted, while
    /// the core has the path paused ([`Conn::set_rx_paused`]).
    gate: RxGate,
    sig: SignalState,
    reasm: Reassembler,
    next_seq: u64,
    version: u16,
    local: IpAddr,
    peer: IpAddr,
    peer_credit: u32,
    peer_proposed: u16,
    up: bool,
    stats: ConnStats,
    ready: VecDeque<Received>,
    /// RDMA operations in flight (`verbs/rdma.rs`).
    rdma: rdma::RdmaState,
}

// SAFETY: the verbs and CM objects of a connection may be used from any
// thread; a Conn is used by one thread at a time (&mut self).
unsafe impl Send for Conn {}

impl Conn {
    /// Creates CQs, MRs and the QP on `id` (whose device is known) and posts
    /// the receive ring.
    ///
    /// Owns `link` from here on: on an error everything (the CM id too) is
    /// released. A [`Link::Side`] QP is created with `ibv_create_qp` and
    /// moved to INIT on `side_port` (the CM moves its own).
    fn build(verbs: Arc<Verbs>, link: Link, side: Option<(*mut sys::ibv_context, u8)>) -> io::Result<Conn> {
        let ctx = match (&link, side) {
            // SAFETY: id is live and bound to a device (address resolved or
            // a connect request), so verbs is set.
            (Link::Cm { id, .. }, _) => unsafe { (**id).verbs },
            (Link::Side { .. }, Some((ctx, _))) => ctx,
            (Link::Side { .. }, None) => ptr::null_mut(),
        };
        if ctx.is_null() {
            return Err(err(libc::ENODEV, "RDMA CM id without a device"));
        }
        let pd = verbs.pd_for(ctx)?;
        // One completion channel for both CQs: its descriptor becomes
        // readable when either CQ gets a completion after a notify request.
        // SAFETY: ctx is live.
        let comp = unsafe { sys::ibv_create_comp_channel(ctx) };
        if comp.is_null() {
            return Err(errno());
        }
        // SAFETY: comp is live; fd is its descriptor.
        let cfd = unsafe { (*comp).fd };
        // SAFETY: fcntl on the channel's descriptor.
        let fl = unsafe { libc::fcntl(cfd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(cfd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            let e = errno();
            // SAFETY: no CQ uses the channel yet.
            unsafe { sys::ibv_destroy_comp_channel(comp) };
            return Err(e);
        }
        // SAFETY: ctx and comp are live; vector 0.
        let send_cq = unsafe { sys::ibv_create_cq(ctx, SEND_WR as c_int + 1, ptr::null_mut(), comp, 0) };
        if send_cq.is_null() {
            let e = errno();
            // SAFETY: no CQ uses the channel.
            unsafe { sys::ibv_destroy_comp_channel(comp) };
            return Err(e);
        }
        // SAFETY: as above.
        let recv_cq = unsafe { sys::ibv_create_cq(ctx, RECV_WR as c_int, ptr::null_mut(), comp, 0) };
        if recv_cq.is_null() {
            let e = errno();
            // SAFETY: created above, unused.
            unsafe {
                sys::ibv_destroy_cq(send_cq);
                sys::ibv_destroy_comp_channel(comp);
            }
            return Err(e);
        }
        let mrs = (|| {
            Ok::<_, io::Error>((
                Mr::new(pd, RECV_WR * HEADER_LEN)?,
                Mr::new(pd, RECV_WR * FRAG_SIZE)?,
                Mr::new(pd, SEND_WR * HEADER_LEN)?,
                Mr::new(pd, SEND_WR * FRAG_SIZE)?,
            ))
        })();
        let (rx_hdr, rx_data, tx_hdr, tx_data) = match mrs {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: created above, unused.
                unsafe {
                    sys::ibv_destroy_cq(send_cq);
                    sys::ibv_destroy_cq(recv_cq);
                    sys::ibv_destroy_comp_channel(comp);
                }
                return Err(e);
            }
        };
        let mut conn = Conn {
            link,
            send_cq,
            recv_cq,
            comp,
            rx_posted: 0,
            failed: None,
            disconnected: false,
            eager_acks: false,
            eager_acked: 0,
            rx_hdr,
            rx_data,
            tx_hdr,
            tx_data,
            _verbs: verbs.clone(),
            tx_free: (0..SEND_WR).rev().collect(),
            tx_inflight: VecDeque::new(),
            fc: FlowControl::new(false),
            gate: RxGate::default(),
            sig: SignalState::default(),
            reasm: Reassembler::default(),
            next_seq: 1,
            version: 0,
            local: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            peer: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            peer_credit: 0,
            peer_proposed: 0,
            up: false,
            stats: ConnStats::default(),
            ready: VecDeque::new(),
            rdma: rdma::RdmaState::default(),
        };
        // SAFETY: an all-zero ibv_qp_init_attr is valid (null pointers, 0 sizes).
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq;
        attr.recv_cq = recv_cq;
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = SEND_WR as u32 + 1;
        attr.cap.max_recv_wr = RECV_WR as u32;
        attr.cap.max_send_sge = 2;
        attr.cap.max_recv_sge = 2;
        match &mut conn.link {
            Link::Cm { id, .. } => {
                // SAFETY: id, pd and attr are valid; the QP is owned by id.
                check(unsafe { sys::rdma_create_qp(*id, pd, &mut attr) }, "rdma_create_qp")?;
            }
            Link::Side { qp, .. } => {
                // SAFETY: pd and attr are valid; the QP is destroyed by Link.
                let q = unsafe { sys::ibv_create_qp(pd, &mut attr) };
                if q.is_null() {
                    let e = errno();
                    return Err(err(e.raw_os_error().unwrap_or(libc::EIO), "ibv_create_qp"));
                }
                *qp = q;
            }
        }
        verbs.qp_created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some((_, port)) = side {
            conn.modify_init(port)?;
        }
        for i in 0..RECV_WR {
            conn.post_recv(i)?;
        }
        conn.req_notify()?;
        Ok(conn)
    }

    fn qp(&self) -> *mut sys::ibv_qp {
        match &self.link {
            // SAFETY: id is live for the life of self.
            Link::Cm { id, .. } => unsafe { (**id).qp },
            Link::Side { qp, .. } => *qp,
        }
    }

    /// The connection's RDMA CM event channel (CM mode only).
    fn cm_channel(&self) -> io::Result<&Channel> {
        match &self.link {
            Link::Cm { ch, .. } => Ok(ch),
            Link::Side { .. } => Err(err(libc::EINVAL, "no RDMA CM on a verbs-only connection")),
        }
    }

    fn cm_id(&self) -> *mut sys::rdma_cm_id {
        match &self.link {
            Link::Cm { id, .. } => *id,
            Link::Side { .. } => ptr::null_mut(),
        }
    }

    fn post_recv(&mut self, i: usize) -> io::Result<()> {
        let mut sge = [
            sys::ibv_sge {
                addr: self.rx_hdr.addr(i * HEADER_LEN),
                length: HEADER_LEN as u32,
                lkey: self.rx_hdr.lkey(),
            },
            sys::ibv_sge {
                addr: self.rx_data.addr(i * FRAG_SIZE),
                length: FRAG_SIZE as u32,
                lkey: self.rx_data.lkey(),
            },
        ];
        let mut wr = sys::ibv_recv_wr { wr_id: i as u64, next: ptr::null_mut(), sg_list: sge.as_mut_ptr(), num_sge: 2 };
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; wr and its SGEs are valid for the call and
        // point into registered buffers of this connection.
        let ret = unsafe { sys::ibv_post_recv(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(err(ret, "ibv_post_recv"));
        }
        self.rx_posted += 1;
        Ok(())
    }

    /// Connects to the kernel (or any RDS-IB peer) at `peer` from `local`:
    /// resolve, route, QP, connect with the private data proposing 4.1; a
    /// reject with value 1 retries once with 3.1.
    pub fn connect(verbs: &Arc<Verbs>, local: IpAddr, peer: IpAddr, timeout: Duration) -> io::Result<Conn> {
        if local.is_ipv4() != peer.is_ipv4() {
            return Err(err(libc::EAFNOSUPPORT, "RDS-IB connect: address families differ"));
        }
        let mut nego = ActiveNegotiation::new();
        let deadline = Instant::now() + timeout;
        for _attempt in 0..2 {
            match Conn::connect_once(verbs, local, peer, &mut nego, deadline)? {
                Ok(conn) => return Ok(conn),
                Err(RejectAction::Drop { fallback: true }) if nego.proposed() == PROTOCOL_3_1 => continue,
                Err(a) => {
                    return Err(err(libc::ECONNREFUSED, &format!("RDS-IB connect rejected ({a:?})")));
                }
            }
        }
        Err(err(libc::ECONNREFUSED, "RDS-IB connect rejected twice"))
    }

    #[allow(clippy::type_complexity)]
    fn connect_once(
        verbs: &Arc<Verbs>,
        local: IpAddr,
        peer: IpAddr,
        nego: &mut ActiveNegotiation,
        deadline: Instant,
    ) -> io::Result<Result<Conn, RejectAction>> {
        let ch = Channel::new()?;
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: ch is live; id is an out pointer.
        check(
            unsafe { sys::rdma_create_id(ch.0, &mut id, ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP) },
            "rdma_create_id",
        )?;
        let mut src = sockaddr_ip(local, 0);
        let mut dst = sockaddr_ip(peer, cm_port(&peer));
        // SAFETY: id is live; both socket addresses are valid for the call.
        let r = unsafe {
            sys::rdma_resolve_addr(
                id,
                &mut src as *mut _ as *mut libc::sockaddr,
                &mut dst as *mut _ as *mut libc::sockaddr,
                RESOLVE_TIMEOUT_MS,
            )
        };
        let guard = IdGuard(id);
        check(r, "rdma_resolve_addr")?;
        ch.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED, deadline)?;
        // SAFETY: id is live with a resolved address.
        check(unsafe { sys::rdma_resolve_route(id, RESOLVE_TIMEOUT_MS) }, "rdma_resolve_route")?;
        ch.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED, deadline)?;
        std::mem::forget(guard);
        let mut conn = Conn::build(verbs.clone(), Link::Cm { id, ch }, None)?;
        conn.local = local;
        conn.peer = peer;
        let addrs = PrivAddrs::new(local, peer).ok_or_else(|| err(libc::EAFNOSUPPORT, "RDS-IB connect"))?;
        let credit = conn.credit_offer(verbs, None);
        let dp = nego.request(addrs, 0, 0, credit).encode();
        let mut param = conn_param(&dp);
        // SAFETY: id has a QP; param and its private data live across the call.
        check(unsafe { sys::rdma_connect(id, &mut param) }, "rdma_connect")?;
        let Some(ev) = conn.cm_channel()?.next(deadline)? else {
            return Err(err(libc::ETIMEDOUT, "RDS-IB connect: no answer"));
        };
        match ev.kind {
            sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED => {
                let data = ev.private.unwrap_or_default();
                let est = nego
                    .on_established(&data, family(&peer))
                    .map_err(|u| err(libc::EPROTO, &format!("RDS-IB version {:#06x} not supported", u.version)))?;
                conn.version = est.version;
                conn.peer_credit = est.peer_credit;
                conn.credit_answer(est.peer_credit);
                conn.fc.on_frame(est.ack_seq, 0);
                conn.up = true;
                Ok(Ok(conn))
            }
            sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => {
                let data = if ev.status == REJ_CONSUMER_DEFINED { ev.private.as_deref() } else { None };
                Ok(Err(nego.on_reject(data, 0)))
            }
            k => Err(err(libc::ECONNREFUSED, &format!("RDS-IB connect: {} (status {})", event_name(k), ev.status))),
        }
    }

    /// The negotiated protocol version.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The peer's initial credits from the private data (0: no flow control).
    pub fn peer_credit(&self) -> u32 {
        self.peer_credit
    }

    /// On an accepted connection: the version the peer proposed in its
    /// connect request (0 on our own connects).
    pub fn peer_proposed(&self) -> u16 {
        self.peer_proposed
    }

    pub fn local(&self) -> IpAddr {
        self.local
    }

    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Our initial credit grant, for the private data (RDMA CM) or the
    /// parameters (verbs-only), negotiated as `rds_ib_set_flow_control`: the
    /// connecting side (`peer_credits` None) offers its posted receive ring
    /// when flow control is on ([`Verbs::set_flow_control`]) and learns the
    /// answer in [`Conn::credit_answer`]; the accepting side, knowing the
    /// offer, turns it on only for a non-zero one and then grants its own
    /// ring.
    fn credit_offer(&mut self, verbs: &Verbs, peer_credits: Option<u32>) -> u32 {
        let on = verbs.flow_control();
        match peer_credits {
            None => self.fc = FlowControl::new(on),
            Some(c) => {
                self.fc.credits.set_flow_control(on, c);
            }
        }
        self.fc.credits.advertise(self.rx_posted as u32);
        self.fc.credits.take_initial_advertisement()
    }

    /// The connecting side: the peer's answer to our offer (0: no limits on
    /// our sends, RNR retry paces them).
    fn credit_answer(&mut self, peer_credits: u32) {
        let on = self.fc.credits.flow_control();
        self.fc.credits.set_flow_control(on, peer_credits);
    }

    /// Credit and ack counters (`ib_tx_credit_updates`, ...).
    pub fn flow_counters(&self) -> crate::proto::credits::FlowCounters {
        self.fc.counters
    }

    /// Whether our sends are limited by credits (flow control negotiated on).
    pub fn flow_control(&self) -> bool {
        self.fc.credits.flow_control()
    }

    pub fn stats(&self) -> ConnStats {
        self.stats
    }

    /// The highest sequence the peer acknowledged (`h_ack`).
    pub fn peer_acked(&self) -> u64 {
        self.fc.acks.peer_acked()
    }

    /// Sends one message of `payload` from `sport` to `dport`; returns its
    /// sequence number. Blocks (polling the send CQ) while the send ring is
    /// full, at most until `deadline`.
    pub fn send(&mut self, sport: u16, dport: u16, payload: &[u8], deadline: Instant) -> io::Result<u64> {
        if !self.up {
            return Err(err(libc::ENOTCONN, "RDS-IB send"));
        }
        let seq = self.next_seq;
        let h = Header { sequence: seq, len: payload.len() as u32, sport, dport, ..Header::default() };
        let mut msg = OutMessage::new(h, payload.len(), true).map_err(|e| err(libc::EMSGSIZE, &e.to_string()))?;
        self.next_seq += 1;
        let mut frames = Vec::new();
        while !msg.is_done() {
            // One slot stays free for an ack-only frame.
            while self.tx_free.len() < 2 {
                if Instant::now() >= deadline {
                    return Err(err(libc::ETIMEDOUT, "RDS-IB send ring full"));
                }
                if !self.reap_send()? {
                    self.poll_cm()?;
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            let want = (self.tx_free.len() - 1).min(msg.remaining()) as u32;
            let first = msg.is_fresh();
            let Some(batch) = self.fc.data_batch(want, first) else {
                return Err(err(libc::ENOBUFS, "RDS-IB send: no credits"));
            };
            frames.clear();
            let n = msg.next_batch(batch.frames as usize, batch.ack, batch.adv_credits, &mut self.sig, &mut frames);
            self.fc.give_back(batch.frames - n as u32);
            self.post_frames(&frames, payload)?;
        }
        self.stats.tx_messages += 1;
        Ok(seq)
    }

    fn post_frames(&mut self, frames: &[OutFrame], payload: &[u8]) -> io::Result<()> {
        let n = frames.len();
        let mut sges = vec![[sys::ibv_sge { addr: 0, length: 0, lkey: 0 }; 2]; n];
        // SAFETY: an all-zero ibv_send_wr is valid (null pointers, no flags).
        let mut wrs: Vec<sys::ibv_send_wr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut slots = Vec::with_capacity(n);
        for (k, f) in frames.iter().enumerate() {
            let Some(slot) = self.tx_free.pop() else {
                return Err(err(libc::ENOBUFS, "RDS-IB send ring"));
            };
            slots.push(slot);
            self.tx_hdr.buf[slot * HEADER_LEN..(slot + 1) * HEADER_LEN].copy_from_slice(&f.header);
            let data = &payload[f.payload.clone()];
            self.tx_data.buf[slot * FRAG_SIZE..slot * FRAG_SIZE + data.len()].copy_from_slice(data);
            sges[k][0] = sys::ibv_sge {
                addr: self.tx_hdr.addr(slot * HEADER_LEN),
                length: HEADER_LEN as u32,
                lkey: self.tx_hdr.lkey(),
            };
            sges[k][1] = sys::ibv_sge {
                addr: self.tx_data.addr(slot * FRAG_SIZE),
                length: data.len() as u32,
                lkey: self.tx_data.lkey(),
            };
            let mut flags = 0;
            if f.signaled {
                flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if f.solicited {
                flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
            }
            if self.rdma.take_fence() {
                flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
            }
            wrs[k].wr_id = slot as u64;
            wrs[k].sg_list = sges[k].as_mut_ptr();
            wrs[k].num_sge = if data.is_empty() { 1 } else { 2 };
            wrs[k].opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
            wrs[k].send_flags = flags;
        }
        for k in 1..n {
            let next: *mut sys::ibv_send_wr = &mut wrs[k];
            wrs[k - 1].next = next;
        }
        if n == 0 {
            return Ok(());
        }
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chained WRs and their SGEs are valid for
        // the call and point into this connection's registered buffers.
        let ret = unsafe { sys::ibv_post_send(self.qp(), wrs.as_mut_ptr(), &mut bad) };
        if ret != 0 {
            self.tx_free.extend(slots);
            return Err(err(ret, "ibv_post_send"));
        }
        self.tx_inflight.extend(slots.into_iter().map(|s| (s, false)));
        self.stats.tx_frames += n as u64;
        Ok(())
    }

    fn post_ack(&mut self, ack: u64, credit: u8) -> io::Result<()> {
        let Some(slot) = self.tx_free.pop() else {
            self.fc.acks.send_failed();
            return Ok(());
        };
        let hdr = ack_only_header(ack, credit);
        self.tx_hdr.buf[slot * HEADER_LEN..(slot + 1) * HEADER_LEN].copy_from_slice(&hdr);
        let mut sge = sys::ibv_sge {
            addr: self.tx_hdr.addr(slot * HEADER_LEN),
            length: HEADER_LEN as u32,
            lkey: self.tx_hdr.lkey(),
        };
        // SAFETY: an all-zero ibv_send_wr is valid.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = slot as u64;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0 | sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: as in post_frames, for one WR.
        let ret = unsafe { sys::ibv_post_send(self.qp(), &mut wr, &mut bad) };
        if ret != 0 {
            self.tx_free.push(slot);
            self.fc.acks.send_failed();
            return Err(err(ret, "ibv_post_send (ack)"));
        }
        self.tx_inflight.push_back((slot, true));
        self.stats.tx_acks += 1;
        Ok(())
    }

    /// Polls the send CQ; a completion frees its slot and every earlier
    /// (unsignaled) one. Send completions never complete a message (only
    /// the peer's `h_ack` does), so a flushed one only frees its slot.
    /// Returns whether anything completed.
    fn reap_send(&mut self) -> io::Result<bool> {
        // SAFETY: ibv_wc is plain data; all-zero is valid.
        let mut wc: [sys::ibv_wc; 16] = unsafe { std::mem::zeroed() };
        let mut any = false;
        loop {
            // SAFETY: the CQ is live; wc has room for 16 entries.
            let n = unsafe { sys::ibv_poll_cq(self.send_cq, 16, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(err(libc::EIO, "ibv_poll_cq (send)"));
            }
            for w in &wc[..n as usize] {
                self.rdma.on_wc(w.wr_id, w.status);
                if w.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                    if w.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                        self.stats.tx_flushed += 1;
                    }
                    self.fail(false, format!("send completion status {} (wr {})", w.status, w.wr_id));
                }
                // A flushed WR is always signaled (flushes complete every
                // WR), so it frees exactly its own slot and earlier ones.
                while let Some((slot, is_ack)) = self.tx_inflight.pop_front() {
                    self.tx_free.push(slot);
                    if is_ack {
                        self.fc.acks.send_complete();
                    }
                    if slot as u64 == w.wr_id {
                        break;
                    }
                }
            }
            any |= n > 0;
            if n < 16 {
                break;
            }
        }
        if self.failed.is_some() {
            return Err(self.failure_error());
        }
        Ok(any)
    }

    fn fail(&mut self, protocol: bool, what: String) {
        self.up = false;
        if self.failed.is_none() {
            self.failed = Some(ConnError { protocol, what });
        }
    }

    fn failure_error(&self) -> io::Error {
        match &self.failed {
            Some(f) if f.protocol => err(libc::EPROTO, &f.what),
            Some(f) => err(libc::ECONNRESET, &f.what),
            None => err(libc::ENOTCONN, "RDS-IB connection down"),
        }
    }

    /// Polls the receive CQ, reassembles, reposts buffers, queues complete
    /// messages. After a failure (a bad completion or a protocol error)
    /// completions are only drained: flushed receives are counted, nothing
    /// is reposted or delivered. Returns whether anything completed.
    fn reap_recv(&mut self) -> io::Result<bool> {
        // SAFETY: ibv_wc is plain data; all-zero is valid.
        let mut wc: [sys::ibv_wc; 32] = unsafe { std::mem::zeroed() };
        let mut any = false;
        loop {
            // SAFETY: the CQ is live; wc has room for 32 entries.
            let n = unsafe { sys::ibv_poll_cq(self.recv_cq, 32, wc.as_mut_ptr()) };
            if n < 0 {
                return Err(err(libc::EIO, "ibv_poll_cq (recv)"));
            }
            for w in &wc[..n as usize] {
                self.rx_posted = self.rx_posted.saturating_sub(1);
                if w.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                    if w.status == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                        self.stats.rx_flushed += 1;
                    }
                    self.fail(false, format!("receive completion status {}", w.status));
                    continue;
                }
                if self.failed.is_some() {
                    continue;
                }
                let i = w.wr_id as usize;
                if i >= RECV_WR {
                    self.fail(true, "receive completion of an unknown buffer".into());
                    continue;
                }
                let len = w.byte_len as usize;
                self.stats.rx_frames += 1;
                let res = if len < HEADER_LEN {
                    Err(RecvError::NoHeader { byte_len: len })
                } else {
                    let mut hdr = [0u8; HEADER_LEN];
                    hdr.copy_from_slice(&self.rx_hdr.buf[i * HEADER_LEN..(i + 1) * HEADER_LEN]);
                    let plen = (len - HEADER_LEN).min(FRAG_SIZE);
                    self.reasm.on_parts(&hdr, &self.rx_data.buf[i * FRAG_SIZE..i * FRAG_SIZE + plen])
                };
                let frame = match res {
                    Ok(f) => f,
                    Err(e) => {
                        self.fail(true, e.to_string());
                        continue;
                    }
                };
                // Paused: the bytes are copied out (the message is held in
                // `ready`), the buffer waits for the resume.
                if self.gate.completed(i) {
                    match self.post_recv(i) {
                        Ok(()) => self.fc.on_refill(1),
                        Err(e) => self.fail(false, e.to_string()),
                    }
                }
                self.fc.on_frame(frame.ack, frame.credit);
                match frame.kind {
                    RxKind::AckOnly => self.stats.rx_acks += 1,
                    RxKind::Partial => {}
                    RxKind::Message { header, payload } => {
                        if header.flags == wire::flags::CONG_BITMAP {
                            self.stats.rx_cong_maps += 1;
                        }
                        self.fc.acks.on_message(header.sequence, header.flags);
                        self.stats.rx_messages += 1;
                        self.ready.push_back(Received { header, payload });
                    }
                }
            }
            any |= n > 0;
            if n < 32 {
                break;
            }
        }
        if self.failed.is_some() {
            return Err(self.failure_error());
        }
        if self.eager_acks && self.fc.acks.current() > self.eager_acked {
            // Everything received so far gets acked when the receive CQ
            // runs dry, whether or not the sender asked: its last messages
            // are not left waiting for traffic in the other direction.
            self.eager_acked = self.fc.acks.current();
            self.fc.acks.request();
        }
        if let Some(a) = self.fc.attempt_ack() {
            self.post_ack(a.ack, a.credit)?;
        }
        Ok(any)
    }

    /// The descriptor of the CQs' completion channel (readable when a
    /// completion arrived after [`Conn::on_cq_event`] rearmed them).
    pub fn cq_fd(&self) -> c_int {
        // SAFETY: comp is live for the life of self.
        unsafe { (*self.comp).fd }
    }

    /// The descriptor of the connection's RDMA CM event channel.
    /// On a verbs-only connection: its side channel socket (readable when
    /// the peer closes it).
    pub fn cm_fd(&self) -> c_int {
        match &self.link {
            // SAFETY: the channel is live for the life of self.
            Link::Cm { ch, .. } => unsafe { (*ch.0).fd },
            Link::Side { sock, .. } => std::os::fd::AsRawFd::as_raw_fd(sock),
        }
    }

    fn req_notify(&mut self) -> io::Result<()> {
        for cq in [self.send_cq, self.recv_cq] {
            // SAFETY: the CQ is live.
            let r = unsafe { sys::ibv_req_notify_cq(cq, 0) };
            if r != 0 {
                return Err(err(r, "ibv_req_notify_cq"));
            }
        }
        Ok(())
    }

    /// The completion channel is readable: takes and acks its events,
    /// rearms both CQs, then drains them (receives first, so an `h_ack`
    /// that frees send slots is seen before the send side runs). Received
    /// messages wait in [`Conn::take_ready`]. An error means the connection
    /// failed; what was received before the failure is still ready.
    pub fn on_cq_event(&mut self) -> io::Result<bool> {
        loop {
            let mut cq: *mut sys::ibv_cq = ptr::null_mut();
            let mut ctx: *mut c_void = ptr::null_mut();
            // SAFETY: comp is live and non-blocking; the out pointers are valid.
            let r = unsafe { sys::ibv_get_cq_event(self.comp, &mut cq, &mut ctx) };
            if r != 0 {
                break;
            }
            // SAFETY: cq is one of our CQs; one event taken, one acked.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
        }
        if self.failed.is_none() {
            self.req_notify()?;
        }
        self.reap()
    }

    /// Drains both CQs (see [`Conn::on_cq_event`]).
    pub fn reap(&mut self) -> io::Result<bool> {
        let r = self.reap_recv();
        let s = self.reap_send();
        // An ack that came due while the previous ack-only frame was in
        // flight goes once that frame completed (`rds_ib_ack_send_complete`
        // attempts the ack again); otherwise the last ack of a stream waits
        // for traffic that never comes.
        if r.is_ok() && s.is_ok() && self.failed.is_none() {
            if let Some(a) = self.fc.attempt_ack() {
                self.post_ack(a.ack, a.credit)?;
            }
        }
        Ok(r? | s?)
    }

    /// Receive flow control ([`rds_core::RdsTransport::rx_flow`]): while
    /// paused, receive buffers that complete are reassembled (the messages
    /// wait in [`Conn::take_ready`], the owner does not take them) but not
    /// reposted, so the peer runs out of credits, or without credit flow
    /// control meets RNR and retries (see [`crate::proto::credits`]); at most one
    /// ring ([`RECV_WR`] fragments) is held. Resuming reposts the held
    /// buffers and grants them (an ack-only credit update when due).
    pub fn set_rx_paused(&mut self, paused: bool) -> io::Result<()> {
        if paused == self.gate.paused() {
            return Ok(());
        }
        let bufs = self.gate.set(paused);
        if self.failed.is_some() || bufs.is_empty() {
            return Ok(());
        }
        let n = bufs.len() as u32;
        for i in bufs {
            if let Err(e) = self.post_recv(i) {
                self.fail(false, e.to_string());
                return Err(self.failure_error());
            }
        }
        self.fc.on_refill(n);
        if let Some(a) = self.fc.attempt_ack() {
            self.post_ack(a.ack, a.credit)?;
        }
        Ok(())
    }

    /// Receive flow control: (times paused, receive buffers held now, most
    /// held at once).
    pub fn rx_gate(&self) -> (u64, usize, usize) {
        (self.gate.pauses, self.gate.held(), self.gate.peak)
    }

    /// Whether receiving is paused ([`Conn::set_rx_paused`]).
    pub fn rx_gate_paused(&self) -> bool {
        self.gate.paused()
    }

    /// Bytes of the complete messages waiting in [`Conn::take_ready`]
    /// (payload plus header).
    pub fn ready_bytes(&self) -> usize {
        self.ready.iter().map(|r| r.payload.len() + HEADER_LEN).sum()
    }

    /// Complete messages received so far, in order.
    pub fn take_ready(&mut self, out: &mut Vec<Received>) {
        out.extend(self.ready.drain(..));
    }

    /// The next RDMA CM event of the connection, if one is pending; a
    /// disconnect (or device removal, address change, timewait exit) is an
    /// `Err` and marks the connection down.
    pub fn poll_cm_event(&mut self) -> io::Result<Option<String>> {
        if let Link::Side { sock, .. } = &self.link {
            let r = side::poll_closed(sock);
            if r.is_err() {
                self.up = false;
            }
            return r.map(|()| None);
        }
        match self.cm_channel()?.next(Instant::now())? {
            None => Ok(None),
            Some(ev) => {
                if matches!(
                    ev.kind,
                    sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
                        | sys::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL
                        | sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_CHANGE
                        | sys::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT
                ) {
                    self.up = false;
                    return Err(err(libc::ECONNRESET, &format!("RDMA CM: {}", event_name(ev.kind))));
                }
                Ok(Some(event_name(ev.kind)))
            }
        }
    }

    /// Posts as many fragments of `msg` (whose payload is `payload`) as the
    /// send ring and the send credits allow, one slot always kept for an
    /// ack-only frame. Returns whether the whole message is posted; if not,
    /// call again after send completions (or credits) arrive.
    pub fn post_message(&mut self, msg: &mut OutMessage, payload: &[u8]) -> io::Result<bool> {
        if !self.up {
            return Err(self.failure_error());
        }
        let mut frames = Vec::new();
        while !msg.is_done() {
            if self.tx_free.len() < 2 {
                return Ok(false);
            }
            let want = (self.tx_free.len() - 1).min(msg.remaining()) as u32;
            let first = msg.is_fresh();
            let Some(batch) = self.fc.data_batch(want, first) else {
                return Ok(false);
            };
            frames.clear();
            let n = msg.next_batch(batch.frames as usize, batch.ack, batch.adv_credits, &mut self.sig, &mut frames);
            self.fc.give_back(batch.frames - n as u32);
            self.post_frames(&frames, payload)?;
        }
        self.stats.tx_messages += 1;
        Ok(true)
    }

    /// Ends the connection: moves the QP to the error state (the peer sees
    /// DISCONNECTED) and drains both CQs until every posted work request
    /// completed or flushed, or `deadline` passes. Messages received before
    /// the end stay in [`Conn::take_ready`]; nothing posted is completed
    /// twice (send completions only free slots).
    pub fn drain(&mut self, deadline: Instant) {
        self.disconnect();
        self.up = false;
        // Receives that completed before the flush are still reassembled
        // and delivered; the first flushed one marks the connection failed,
        // after which nothing is reposted.
        while self.rx_posted > 0 || !self.tx_inflight.is_empty() {
            let busy = matches!(self.reap_recv(), Ok(true) | Err(_)) | matches!(self.reap_send(), Ok(true) | Err(_));
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if !busy {
                let mut pfd = libc::pollfd { fd: self.cq_fd(), events: libc::POLLIN, revents: 0 };
                let ms = (deadline - now).as_millis().clamp(1, 10) as c_int;
                // SAFETY: one valid pollfd. The CQs may not be armed; the
                // timeout bounds the wait.
                unsafe { libc::poll(&mut pfd, 1, ms) };
                self.ack_cq_events();
            }
        }
    }

    fn ack_cq_events(&mut self) {
        loop {
            let mut cq: *mut sys::ibv_cq = ptr::null_mut();
            let mut ctx: *mut c_void = ptr::null_mut();
            // SAFETY: comp is live and non-blocking; the out pointers are valid.
            if unsafe { sys::ibv_get_cq_event(self.comp, &mut cq, &mut ctx) } != 0 {
                break;
            }
            // SAFETY: cq is one of our CQs; one event taken, one acked.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
        }
    }

    /// Acks everything received whenever the receive CQ runs dry (besides
    /// the acks the sender asks for with ACK_REQUIRED).
    pub fn set_eager_acks(&mut self, on: bool) {
        self.eager_acks = on;
    }

    /// Whether the connection failed with a protocol error (a bad frame).
    pub fn protocol_error(&self) -> bool {
        matches!(&self.failed, Some(f) if f.protocol)
    }

    /// Work requests still posted: receives and sends.
    pub fn posted(&self) -> (usize, usize) {
        (self.rx_posted, self.tx_inflight.len())
    }

    /// Handles CM events of the connection (a disconnect ends it).
    fn poll_cm(&mut self) -> io::Result<()> {
        if let Link::Side { sock, .. } = &self.link {
            let r = side::poll_closed(sock);
            if r.is_err() {
                self.up = false;
            }
            return r;
        }
        if let Some(ev) = self.cm_channel()?.next(Instant::now())? {
            if matches!(
                ev.kind,
                sys::rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
                    | sys::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL
                    | sys::rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT
            ) {
                self.up = false;
                return Err(err(libc::ECONNRESET, &format!("RDMA CM: {}", event_name(ev.kind))));
            }
        }
        Ok(())
    }

    /// Requests an explicit ack of everything received so far.
    pub fn ack_now(&mut self) -> io::Result<()> {
        self.fc.acks.request();
        if let Some(a) = self.fc.attempt_ack() {
            self.post_ack(a.ack, a.credit)?;
        }
        Ok(())
    }

    /// Drives completions and CM events until a message is ready or
    /// `deadline` passes (`None`).
    pub fn poll(&mut self, deadline: Instant) -> io::Result<Option<Received>> {
        loop {
            if let Some(m) = self.ready.pop_front() {
                return Ok(Some(m));
            }
            let busy = self.reap_recv()? | self.reap_send()?;
            if !self.ready.is_empty() {
                continue;
            }
            self.poll_cm()?;
            if Instant::now() >= deadline {
                return Ok(None);
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Drives completions until the peer acked `seq` (its `h_ack`), queueing
    /// whatever arrives meanwhile.
    pub fn wait_acked(&mut self, seq: u64, deadline: Instant) -> io::Result<bool> {
        while self.fc.acks.peer_acked() < seq {
            let busy = self.reap_recv()? | self.reap_send()?;
            self.poll_cm()?;
            if Instant::now() >= deadline {
                return Ok(false);
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        Ok(true)
    }

    /// Disconnects (the peer sees DISCONNECTED); resources go with drop.
    pub fn disconnect(&mut self) {
        if !self.disconnected {
            self.up = false;
            self.disconnected = true;
            match &self.link {
                // SAFETY: id is live and connected.
                Link::Cm { id, .. } => unsafe {
                    sys::rdma_disconnect(*id);
                },
                Link::Side { qp, sock } => {
                    // The QP to ERR flushes everything posted; the peer
                    // sees the side channel close.
                    if !qp.is_null() {
                        // SAFETY: an all-zero ibv_qp_attr is valid.
                        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
                        a.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
                        // SAFETY: the QP is live; a is valid for the call.
                        unsafe { sys::ibv_modify_qp(*qp, &mut a, sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int) };
                    }
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
            }
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.disconnect();
        // The QP (and CM id) first; nothing is posted from now on. The CQs
        // and MRs are destroyed after the QP that used them.
        self.link.release();
        // SAFETY: the CQs and the channel are ours and no QP uses them now.
        unsafe {
            sys::ibv_destroy_cq(self.send_cq);
            sys::ibv_destroy_cq(self.recv_cq);
            sys::ibv_destroy_comp_channel(self.comp);
        }
    }
}

/// What a connection's QP hangs off: an RDMA CM id (with its event
/// channel), or, in the verbs-only mode, a QP of our own and the TCP side
/// channel it was set up over.
enum Link {
    Cm { id: *mut sys::rdma_cm_id, ch: Channel },
    Side { qp: *mut sys::ibv_qp, sock: std::net::TcpStream },
}

impl Link {
    /// Destroys the QP and the CM id (once; later calls do nothing).
    fn release(&mut self) {
        match self {
            Link::Cm { id, .. } => {
                if !id.is_null() {
                    // SAFETY: the id is ours; its QP, if any, was created by
                    // rdma_create_qp and nothing is posted any more.
                    unsafe {
                        if !(**id).qp.is_null() {
                            sys::rdma_destroy_qp(*id);
                        }
                        sys::rdma_destroy_id(*id);
                    }
                    *id = ptr::null_mut();
                }
            }
            Link::Side { qp, .. } => {
                if !qp.is_null() {
                    // SAFETY: the QP is ours and nothing is posted any more.
                    unsafe { sys::ibv_destroy_qp(*qp) };
                    *qp = ptr::null_mut();
                }
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.release();
    }
}

/// Destroys an id on an early error return.
struct IdGuard(*mut sys::rdma_cm_id);

impl Drop for IdGuard {
    fn drop(&mut self) {
        // SAFETY: the id was created by us and has no QP yet.
        unsafe { sys::rdma_destroy_id(self.0) };
    }
}

fn conn_param(dp: &[u8]) -> sys::rdma_conn_param {
    sys::rdma_conn_param {
        private_data: dp.as_ptr() as *const c_void,
        private_data_len: dp.len() as u8,
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 0,
        retry_count: RETRY_COUNT,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// A connect request that never completes (a hostile or broken peer, for
/// tests): valid private data proposing 4.1, but no QP behind it, so the
/// peer's accept gets a CONNECT_RESPONSE here that is never answered (no
/// RTU): the peer's connection never becomes ESTABLISHED. The CM id goes
/// with the value.
pub struct StalledRequest {
    // The id before the channel (field order is drop order).
    _id: IdGuard,
    _ch: Channel,
    /// The peer accepted (CONNECT_RESPONSE) rather than rejected.
    pub accepted: bool,
}

impl StalledRequest {
    /// Sends the request from `local` to `peer`'s RDMA CM port and waits
    /// until `deadline` for the peer's answer.
    pub fn send(local: IpAddr, peer: IpAddr, deadline: Instant) -> io::Result<StalledRequest> {
        let ch = Channel::new()?;
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: ch is live; id is an out pointer.
        check(
            unsafe { sys::rdma_create_id(ch.0, &mut id, ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP) },
            "rdma_create_id",
        )?;
        let guard = IdGuard(id);
        let mut src = sockaddr_ip(local, 0);
        let mut dst = sockaddr_ip(peer, cm_port(&peer));
        // SAFETY: id is live; both socket addresses are valid for the call.
        check(
            unsafe {
                sys::rdma_resolve_addr(
                    id,
                    &mut src as *mut _ as *mut libc::sockaddr,
                    &mut dst as *mut _ as *mut libc::sockaddr,
                    RESOLVE_TIMEOUT_MS,
                )
            },
            "rdma_resolve_addr",
        )?;
        ch.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED, deadline)?;
        // SAFETY: id is live with a resolved address.
        check(unsafe { sys::rdma_resolve_route(id, RESOLVE_TIMEOUT_MS) }, "rdma_resolve_route")?;
        ch.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED, deadline)?;
        let addrs = PrivAddrs::new(local, peer).ok_or_else(|| err(libc::EAFNOSUPPORT, "stalled request"))?;
        let dp = ConnectPrivate::new(addrs, wire::PROTOCOL_4_1, 0, 0, 0).encode();
        let mut param = conn_param(&dp);
        // No QP on the id: librdmacm takes the QP number from the
        // parameters, and the answer is left to us (we never give it).
        param.qp_num = 0x00c0_ffee;
        // SAFETY: id is live with a resolved route; param and dp live
        // across the call.
        check(unsafe { sys::rdma_connect(id, &mut param) }, "rdma_connect")?;
        let accepted = match ch.next(deadline)? {
            Some(ev) => ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE,
            None => false,
        };
        Ok(StalledRequest { _id: guard, _ch: ch, accepted })
    }
}

/// How long an accepted RDMA CM connection may take to become ESTABLISHED
/// (after our `rdma_accept`); then it is dropped and counted in
/// [`Listener::establish_failed`].
pub const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(5);
/// Accepted connections a [`Listener`] waits on at once for ESTABLISHED.
pub const MAX_PENDING_ACCEPTS: usize = 64;
/// Accepted connections a [`Listener`] waits on at once from one source
/// address: a peer that sends connect requests and never completes them
/// cannot take the slots of others (further requests are rejected with
/// [`REJ_RETRY`] and counted in [`Listener::refused`]).
pub const MAX_PENDING_ACCEPTS_PER_SOURCE: usize = 2;

/// An accepted connection waiting for ESTABLISHED.
struct PendingAccept<T> {
    conn: Conn,
    tag: T,
    deadline: Instant,
}

/// The passive side: an RDMA CM listener on `local`, port [`cm_port`].
///
/// It never blocks on one peer: an accepted request waits for ESTABLISHED
/// on its own event channel, among up to [`MAX_PENDING_ACCEPTS`] others
/// ([`MAX_PENDING_ACCEPTS_PER_SOURCE`] per source), each with a deadline
/// of [`ESTABLISH_TIMEOUT`], while new requests keep being served. Every
/// connect request's CM id is rejected and destroyed, or owned by a
/// connection, on every path (errors included).
pub struct Listener<T = ()> {
    id: *mut sys::rdma_cm_id,
    ch: Channel,
    verbs: Arc<Verbs>,
    local: IpAddr,
    pending: Vec<PendingAccept<T>>,
    /// Connect requests rejected (incompatible version or no private data).
    pub rejected: u64,
    /// Events other than connect requests seen on the listening id.
    pub other_events: u64,
    /// Compatible requests the admission check of [`Listener::accept_with`]
    /// refused, or over the pending limits.
    pub refused: u64,
    /// Admitted requests whose setup failed (QP, accept) or that did not
    /// become ESTABLISHED within [`ESTABLISH_TIMEOUT`].
    pub establish_failed: u64,
}

// SAFETY: the listener's id and channel are library objects usable from any
// thread; the listener is used by one thread at a time (&mut self).
unsafe impl<T: Send> Send for Listener<T> {}

/// Rejects a connect request with the kernel's reject data for `value` and
/// destroys its id.
fn reject_request(id: *mut sys::rdma_cm_id, value: i32) {
    let rej = reject_data(value);
    // SAFETY: id is the new id of a connect request whose event was acked;
    // rej lives across the call; the id is destroyed after, once.
    unsafe {
        sys::rdma_reject(id, rej.as_ptr() as *const c_void, rej.len() as u8);
        sys::rdma_destroy_id(id);
    }
}

impl Listener<()> {
    /// Accepts the next compatible connect request and waits until it is
    /// established (other requests are served meanwhile). Incompatible
    /// requests are rejected with the kernel's reject data and counted;
    /// `None` when `deadline` passes first.
    pub fn accept(&mut self, deadline: Instant) -> io::Result<Option<Conn>> {
        loop {
            match self.accept_with(deadline, &mut |_, _| Some(()))? {
                Some(SideEvent::Up(conn, ())) => return Ok(Some(*conn)),
                Some(SideEvent::Failed(..)) => continue,
                None => return Ok(None),
            }
        }
    }
}

impl<T> Listener<T> {
    /// Listens on `local` at the kernel's port for its family ([`cm_port`]).
    pub fn bind(verbs: &Arc<Verbs>, local: IpAddr) -> io::Result<Listener<T>> {
        let ch = Channel::new()?;
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: ch is live; id is an out pointer.
        check(
            unsafe { sys::rdma_create_id(ch.0, &mut id, ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP) },
            "rdma_create_id",
        )?;
        let guard = IdGuard(id);
        let mut sa = sockaddr_ip(local, cm_port(&local));
        // SAFETY: id is live; sa is valid for the call.
        check(unsafe { sys::rdma_bind_addr(id, &mut sa as *mut _ as *mut libc::sockaddr) }, "rdma_bind_addr")?;
        // SAFETY: id is bound.
        check(unsafe { sys::rdma_listen(id, 64) }, "rdma_listen")?;
        std::mem::forget(guard);
        Ok(Listener {
            id,
            ch,
            verbs: verbs.clone(),
            local,
            pending: Vec::new(),
            rejected: 0,
            other_events: 0,
            refused: 0,
            establish_failed: 0,
        })
    }

    /// Accepted connections waiting for ESTABLISHED.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Serves connect requests and the accepted connections waiting for
    /// ESTABLISHED until one of them has an outcome or `deadline` passes
    /// (`None`). `admit(local, peer)` is asked about every compatible
    /// request: `None` rejects it with [`REJ_RETRY`] (the kernel's active
    /// side then drops and retries), counted in `refused`; its `Some(tag)`
    /// comes back with the outcome: [`SideEvent::Up`] once established,
    /// [`SideEvent::Failed`] when the setup failed or ESTABLISHED did not
    /// come within [`ESTABLISH_TIMEOUT`] (the connection, its QP and CM id
    /// are gone; the caller reports the path down). An `Err` is a failure
    /// of the listening id's channel itself.
    pub fn accept_with(
        &mut self,
        deadline: Instant,
        admit: &mut dyn FnMut(IpAddr, IpAddr) -> Option<T>,
    ) -> io::Result<Option<SideEvent<T>>> {
        loop {
            if let Some(ev) = self.poll_pending() {
                return Ok(Some(ev));
            }
            if let Some(ev) = self.ch.next(Instant::now())? {
                if let Some(out) = self.on_request(ev, admit) {
                    return Ok(Some(out));
                }
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wake = self.pending.iter().map(|p| p.deadline).fold(deadline, Instant::min);
            let mut fds = Vec::with_capacity(1 + self.pending.len());
            // SAFETY: the channel is live for the life of self.
            fds.push(libc::pollfd { fd: unsafe { (*self.ch.0).fd }, events: libc::POLLIN, revents: 0 });
            fds.extend(self.pending.iter().map(|p| libc::pollfd {
                fd: p.conn.cm_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
            let ms = wake.saturating_duration_since(now).as_millis().clamp(1, 1000) as c_int;
            // SAFETY: fds is a valid array of pollfds for the call.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        }
    }

    /// The first accepted connection with an outcome: ESTABLISHED, another
    /// event (a reject, an error), or its deadline passed.
    fn poll_pending(&mut self) -> Option<SideEvent<T>> {
        let now = Instant::now();
        for i in 0..self.pending.len() {
            let p = &mut self.pending[i];
            let res = p.conn.cm_channel().and_then(|c| c.next(now));
            let outcome = match res {
                Ok(Some(ev)) if ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED && ev.status == 0 => {
                    Ok(())
                }
                Ok(Some(ev)) => Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("RDMA CM: {} (status {}) while waiting for ESTABLISHED", event_name(ev.kind), ev.status),
                )),
                Ok(None) if now >= p.deadline => Err(err(libc::ETIMEDOUT, "RDMA CM: no ESTABLISHED")),
                Ok(None) => continue,
                Err(e) => Err(e),
            };
            let mut p = self.pending.swap_remove(i);
            return Some(match outcome {
                Ok(()) => {
                    p.conn.up = true;
                    SideEvent::Up(Box::new(p.conn), p.tag)
                }
                Err(e) => {
                    self.establish_failed += 1;
                    // Dropping the connection destroys its QP and CM id.
                    drop(p.conn);
                    SideEvent::Failed(e, p.tag)
                }
            });
        }
        None
    }

    /// One event of the listening id. A connect request is rejected (and
    /// its id destroyed), or accepted and left waiting for ESTABLISHED;
    /// `Some` when an admitted request failed before that.
    fn on_request(&mut self, ev: CmEvent, admit: &mut dyn FnMut(IpAddr, IpAddr) -> Option<T>) -> Option<SideEvent<T>> {
        if ev.kind != sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            self.other_events += 1;
            return None;
        }
        let fam = family(&self.local);
        let data = ev.private.clone().unwrap_or_default();
        let negotiated = passive_negotiate(&data, fam);
        let (version, dp) = match (negotiated, ConnectPrivate::decode(&data, fam)) {
            (Ok(v), Ok(dp)) if version_usable(v) => (v, dp),
            (res, _) => {
                reject_request(
                    ev.id,
                    match res {
                        Err(i) => i.reject_value(),
                        Ok(_) => crate::proto::private::REJ_INCOMPAT,
                    },
                );
                self.rejected += 1;
                return None;
            }
        };
        let (la, pa) = id_addrs(ev.id);
        let unspec = if self.local.is_ipv4() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        };
        let (local, peer) = (la.unwrap_or(self.local), pa.unwrap_or(unspec));
        let from_peer = self.pending.iter().filter(|p| p.conn.peer == peer).count();
        if self.pending.len() >= MAX_PENDING_ACCEPTS || from_peer >= MAX_PENDING_ACCEPTS_PER_SOURCE {
            reject_request(ev.id, REJ_RETRY);
            self.refused += 1;
            return None;
        }
        let Some(tag) = admit(local, peer) else {
            reject_request(ev.id, REJ_RETRY);
            self.refused += 1;
            return None;
        };
        match self.setup(ev.id, local, peer, version, &dp) {
            Ok(conn) => {
                self.pending.push(PendingAccept { conn, tag, deadline: Instant::now() + ESTABLISH_TIMEOUT });
                None
            }
            Err(e) => {
                self.establish_failed += 1;
                Some(SideEvent::Failed(e, tag))
            }
        }
    }

    /// QP and accept for an admitted request. Owns `id` on every path: on
    /// an error before the connection owns it, it is rejected and
    /// destroyed; after, dropping the connection destroys it.
    fn setup(
        &self,
        id: *mut sys::rdma_cm_id,
        local: IpAddr,
        peer: IpAddr,
        version: u16,
        dp: &ConnectPrivate,
    ) -> io::Result<Conn> {
        let ch = match Channel::new() {
            Ok(ch) => ch,
            Err(e) => {
                reject_request(id, REJ_RETRY);
                return Err(e);
            }
        };
        // SAFETY: id is live and all its events are acked; it moves to the
        // connection's own channel.
        if let Err(e) = check(unsafe { sys::rdma_migrate_id(id, ch.0) }, "rdma_migrate_id") {
            reject_request(id, REJ_RETRY);
            return Err(e);
        }
        let mut conn = Conn::build(self.verbs.clone(), Link::Cm { id, ch }, None)?;
        conn.local = local;
        conn.peer = peer;
        conn.version = version;
        conn.peer_credit = dp.credit;
        conn.peer_proposed = dp.version();
        let credit = conn.credit_offer(&self.verbs, Some(dp.credit));
        conn.fc.on_frame(dp.ack_seq, 0);
        let addrs = PrivAddrs::new(conn.local, conn.peer)
            .ok_or_else(|| err(libc::EPROTO, "RDS-IB accept: address families differ"))?;
        let rep = ConnectPrivate::new(addrs, version, dp.tos, 0, credit).encode();
        let mut param = conn_param(&rep);
        // SAFETY: the id has a QP; param and rep live across the call.
        check(unsafe { sys::rdma_accept(conn.cm_id(), &mut param) }, "rdma_accept")?;
        Ok(conn)
    }
}

impl<T> Drop for Listener<T> {
    fn drop(&mut self) {
        // Accepted connections still waiting: their QPs and CM ids go.
        self.pending.clear();
        // SAFETY: the listening id is ours and has no QP.
        unsafe { sys::rdma_destroy_id(self.id) };
    }
}
