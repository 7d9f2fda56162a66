//! The verbs-only connection setup (no RDMA CM): a TCP side channel
//! carries the handshake of [`crate::proto::sidechannel`] (pre-shared key,
//! HMAC-SHA256 challenge-response), then the QP parameters, and each side
//! moves its own QP INIT -> RTR -> RTS with `ibv_modify_qp`.
//!
//! * The accepting side ([`SideListener`], TCP port
//!   [`crate::proto::sidechannel::DEFAULT_PORT`] 18635 unless configured) creates
//!   nothing before the client's CLIENT_PARAMS frame verified: a peer
//!   without the key, or with a replayed or altered frame, has its TCP
//!   connection closed and is counted (`auth_failed`, or `bad_handshake`
//!   for garbage, EOF and timeouts), and no QP exists for it.
//! * Every connection runs on a thread of its own, the listener's thread
//!   only accepts, counts and asks the admission check. At most
//!   [`MAX_PENDING_HANDSHAKES`] unauthenticated handshakes run at once,
//!   and at most [`MAX_PENDING_PER_SOURCE`] from one source address, each
//!   with one deadline ([`HANDSHAKE_TIMEOUT`] for HELLO .. CLIENT_PARAMS
//!   in all, however the peer spreads its bytes): a source that connects
//!   and stalls, however often, holds two slots, not the listener nor
//!   other peers' slots. A connection beyond either bound is closed at
//!   once (counted in `bad_handshake` and `busy` or `busy_source`). An
//!   authenticated peer's thread asks the listener for admission, then
//!   creates the QP, exchanges the parameters and READY (again bounded by
//!   [`HANDSHAKE_TIMEOUT`]) without holding up the listener.
//! * The connecting side ([`Conn::connect_side`]) creates its QP only after
//!   the server proved the key.
//! * The device and the GID come from the local IPv4 address: the port
//!   whose GID table holds `::ffff:a.b.c.d` as a RoCE v2 GID (sysfs
//!   `gid_attrs/types`), falling back to any GID of that address. PSNs are
//!   24 random bits from the OS CSPRNG; the path MTU is the smaller of both
//!   sides' active MTU.
//! * After RTS each side sends READY; it takes its connection up (and
//!   sends RDS frames) only after the peer's READY, so the peer's QP is in
//!   RTR by then. The side channel stays open for the connection's life:
//!   its close is the verbs-only DISCONNECTED.
//!
//! RoCE only: an InfiniBand port (LID routed, no IP in its GID table) is
//! not found by address yet.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::raw::c_int;
use std::ptr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_sys as sys;

use rds_core::wire::{PROTOCOL_3_1, PROTOCOL_4_1};

use super::{Conn, Link, Verbs, err, errno, sockaddr_v4};
use crate::proto::sidechannel::{Client, HEADER_LEN, Key, Params, Server, SideError, parse_header};
use crate::secrets::{random_nonce, random_psn};

/// How long the accepting side waits for a peer's handshake: HELLO to
/// CLIENT_PARAMS in all, then again for SERVER_PARAMS to READY.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Unauthenticated handshakes a [`SideListener`] serves at once.
pub const MAX_PENDING_HANDSHAKES: usize = 64;
/// Unauthenticated handshakes a [`SideListener`] serves at once from one
/// source address: a source that opens more connections than this (idle
/// or not) cannot take the slots of other peers.
pub const MAX_PENDING_PER_SOURCE: usize = 2;
/// `IBV_LINK_LAYER_INFINIBAND`.
const LINK_LAYER_IB: u8 = 1;

/// The port, GID and MTU serving a local address.
#[derive(Clone, Copy, Debug)]
pub struct PortInfo {
    ctx: *mut sys::ibv_context,
    pub port: u8,
    pub gid_index: u8,
    pub gid: [u8; 16],
    pub lid: u16,
    /// The active MTU (`ibv_mtu` value, 1 = 256 .. 5 = 4096).
    pub mtu: sys::ibv_mtu::Type,
    pub roce_v2: bool,
}

fn mtu_bytes(m: sys::ibv_mtu::Type) -> u16 {
    if (1..=5).contains(&m) { 128u16 << m } else { 1024 }
}

fn mtu_enum(bytes: u16) -> sys::ibv_mtu::Type {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        _ => 5,
    }
}

/// With `RDS_IB_DEBUG` set: which port and GID a connection uses.
fn debug_port(what: &str, local: Ipv4Addr, peer: Ipv4Addr, p: &PortInfo) {
    if std::env::var_os("RDS_IB_DEBUG").is_some() {
        eprintln!(
            "rds-ib: verbs-only {what} {local} -> {peer}: port {} gid index {} roce_v2 {} mtu {}",
            p.port,
            p.gid_index,
            p.roce_v2,
            mtu_bytes(p.mtu)
        );
    }
}

fn gid_type(dev: &str, port: u8, idx: i32) -> Option<String> {
    std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{idx}"))
        .ok()
        .map(|s| s.trim().to_string())
}

impl Verbs {
    /// Finds (opening devices as needed) the port whose GID table holds
    /// the IPv4-mapped `addr`, preferring a RoCE v2 GID.
    pub fn port_for_ip(&self, addr: Ipv4Addr) -> io::Result<PortInfo> {
        let want = addr.to_ipv6_mapped().octets();
        let mut n: c_int = 0;
        // SAFETY: n is a valid out pointer; the list is freed below.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(errno());
        }
        let mut found: Option<PortInfo> = None;
        'devs: for i in 0..n.max(0) as usize {
            // SAFETY: the list holds n valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev is a device of the list; its name is a C string it owns.
            let name =
                unsafe { std::ffi::CStr::from_ptr(sys::ibv_get_device_name(dev)) }.to_string_lossy().into_owned();
            let ctx = {
                let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
                match opened.iter().find(|(n, _)| *n == name) {
                    Some((_, c)) => *c,
                    None => {
                        // SAFETY: dev is a live device of the list.
                        let c = unsafe { sys::ibv_open_device(dev) };
                        if c.is_null() {
                            continue;
                        }
                        opened.push((name.clone(), c));
                        c
                    }
                }
            };
            // SAFETY: ibv_device_attr is plain data.
            let mut dattr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
            // SAFETY: ctx is live; dattr is a valid out pointer.
            if unsafe { sys::ibv_query_device(ctx, &mut dattr) } != 0 {
                continue;
            }
            for port in 1..=dattr.phys_port_cnt {
                // SAFETY: ibv_port_attr is plain data.
                let mut pattr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
                // SAFETY: ctx is live; pattr is a valid out pointer.
                if unsafe { sys::___ibv_query_port(ctx, port, &mut pattr) } != 0 {
                    continue;
                }
                for idx in 0..pattr.gid_tbl_len.clamp(0, 256) {
                    // SAFETY: ibv_gid is plain data.
                    let mut gid: sys::ibv_gid = unsafe { std::mem::zeroed() };
                    // SAFETY: ctx is live; gid is a valid out pointer.
                    if unsafe { sys::ibv_query_gid(ctx, port, idx, &mut gid) } != 0 {
                        continue;
                    }
                    // SAFETY: the raw view of the union is always valid.
                    let raw = unsafe { gid.raw };
                    if raw != want {
                        continue;
                    }
                    let v2 = gid_type(&name, port, idx).is_some_and(|t| t.contains("v2"));
                    let info = PortInfo {
                        ctx,
                        port,
                        gid_index: idx as u8,
                        gid: raw,
                        lid: pattr.lid,
                        mtu: pattr.active_mtu,
                        roce_v2: v2,
                    };
                    if v2 {
                        found = Some(info);
                        break 'devs;
                    }
                    if found.is_none() && pattr.link_layer != LINK_LAYER_IB {
                        found = Some(info);
                    }
                }
            }
        }
        // SAFETY: list came from ibv_get_device_list and is freed once.
        unsafe { sys::ibv_free_device_list(list) };
        found.ok_or_else(|| err(libc::EADDRNOTAVAIL, &format!("no RDMA port has a GID for {addr}")))
    }
}

/// Fills `buf` from a blocking socket by `deadline` (each read waits at
/// most the time left: a peer sending a byte now and then gets no more).
fn read_exact_by(s: &TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(err(libc::ETIMEDOUT, "RDS-IB side channel handshake"));
        }
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match (&*s).read(&mut buf[off..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => off += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one whole frame (header, then the body its kind has) by `deadline`.
fn read_frame(s: &TcpStream, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; HEADER_LEN];
    read_exact_by(s, &mut buf, deadline)?;
    let (_, len) = parse_header(&buf)?;
    buf.resize(HEADER_LEN + len, 0);
    read_exact_by(s, &mut buf[HEADER_LEN..], deadline)?;
    Ok(buf)
}

/// Writes one frame by `deadline` (frames are small: the socket buffer
/// takes them unless the peer stopped reading long ago).
fn write_frame(s: &TcpStream, frame: &[u8], deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))?;
    (&*s).write_all(frame)
}

/// The side channel after the handshake: EOF (the peer closed, its
/// verbs-only DISCONNECTED) or any byte is an error; nothing pending is
/// `Ok`.
pub(super) fn poll_closed(sock: &TcpStream) -> io::Result<()> {
    let mut b = [0u8; 1];
    match (&*sock).read(&mut b) {
        Ok(0) => Err(err(libc::ECONNRESET, "RDS-IB side channel closed by the peer")),
        Ok(_) => Err(err(libc::EPROTO, "RDS-IB side channel: data after READY")),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
        Err(e) => Err(e),
    }
}

/// A TCP connection from `local` (port chosen by the kernel) to `peer`.
fn tcp_connect(local: Ipv4Addr, peer: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
    if fd < 0 {
        return Err(errno());
    }
    // SAFETY: fd is a new socket we own from here on.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let src = sockaddr_v4(local, 0);
    let SocketAddr::V4(p) = peer else { return Err(err(libc::EAFNOSUPPORT, "side channel")) };
    let dst = sockaddr_v4(*p.ip(), p.port());
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: src is a valid sockaddr_in for the call.
    if unsafe { libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len) } < 0 {
        return Err(errno());
    }
    // SAFETY: dst is a valid sockaddr_in for the call.
    if unsafe { libc::connect(fd, (&dst as *const libc::sockaddr_in).cast(), len) } < 0 {
        let e = errno();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(err(libc::ETIMEDOUT, "side channel connect"));
            }
            let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().clamp(1, 1000) as c_int) };
            if r > 0 {
                break;
            }
        }
        if let Some(e) = s.take_error()? {
            return Err(e);
        }
    }
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    Ok(s)
}

impl Conn {
    fn side_sock(&self) -> io::Result<&TcpStream> {
        match &self.link {
            Link::Side { sock, .. } => Ok(sock),
            Link::Cm { .. } => Err(err(libc::EINVAL, "not a verbs-only connection")),
        }
    }

    /// A verbs-only QP on the port serving the address (INIT, receive ring
    /// posted), owning the side channel.
    fn build_side(verbs: &Arc<Verbs>, port: &PortInfo, sock: TcpStream) -> io::Result<Conn> {
        Conn::build(verbs.clone(), Link::Side { qp: ptr::null_mut(), sock }, Some((port.ctx, port.port)))
    }

    fn modify(&mut self, attr: &mut sys::ibv_qp_attr, mask: sys::ibv_qp_attr_mask, what: &str) -> io::Result<()> {
        // SAFETY: the QP is live; attr is valid for the call.
        let r = unsafe { sys::ibv_modify_qp(self.qp(), attr, mask.0 as c_int) };
        if r != 0 {
            return Err(err(r, what));
        }
        Ok(())
    }

    /// RESET -> INIT on `port`.
    pub(super) fn modify_init(&mut self, port: u8) -> io::Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: an all-zero ibv_qp_attr is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp INIT",
        )
    }

    /// INIT -> RTR toward the peer's QP, then RTR -> RTS with our PSN.
    fn modify_rtr_rts(&mut self, port: &PortInfo, peer: &Params, psn: u32) -> io::Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: an all-zero ibv_qp_attr is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = port.mtu.min(mtu_enum(peer.mtu));
        a.dest_qp_num = peer.qpn;
        a.rq_psn = peer.psn;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid.raw = peer.gid;
        a.ah_attr.grh.sgid_index = port.gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.port_num = port.port;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp RTR",
        )?;
        // SAFETY: as above.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        // 4.096 us * 2^18 = 1.07 s per try: with the kernel's single
        // retry (RETRY_COUNT) a silent peer ends the connection after ~2 s,
        // and a slow (emulated) one is not taken for dead.
        a.timeout = 18;
        a.retry_cnt = super::RETRY_COUNT;
        a.rnr_retry = 7;
        a.sq_psn = psn;
        a.max_rd_atomic = 1;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp RTS",
        )
    }

    /// Our parameters; `credits` is our initial credit grant (0: no flow
    /// control), taken by `Conn::credit_offer`.
    fn our_params(&self, port: &PortInfo, psn: u32, version: u16, credits: u32) -> Params {
        // SAFETY: the QP is live.
        let qpn = unsafe { (*self.qp()).qp_num };
        Params {
            qpn,
            psn,
            gid: port.gid,
            lid: port.lid,
            mtu: mtu_bytes(port.mtu),
            rds_version: version,
            path: 0,
            credits,
            tos: 0,
            ack_seq: 0,
            local: self.local,
            peer: self.peer,
        }
    }

    fn side_established(&mut self, p: &Params, connecting: bool) -> io::Result<()> {
        self.version = p.rds_version;
        self.peer_credit = p.credits;
        if connecting {
            self.credit_answer(p.credits);
        }
        self.fc.on_frame(p.ack_seq, 0);
        self.side_sock()?.set_nonblocking(true)?;
        self.up = true;
        Ok(())
    }

    /// Connects verbs-only to `peer`'s side channel at `port`: TCP connect,
    /// the server proves the key, then our QP, the parameters both ways,
    /// INIT -> RTR -> RTS, READY both ways.
    pub fn connect_side(
        verbs: &Arc<Verbs>,
        local: Ipv4Addr,
        peer: Ipv4Addr,
        key: &Key,
        port: u16,
        timeout: Duration,
    ) -> io::Result<Conn> {
        let deadline = Instant::now() + timeout;
        let sock = tcp_connect(local, SocketAddr::from((peer, port)), deadline)?;
        let (mut hs, hello) = Client::new(key, random_nonce()?);
        write_frame(&sock, &hello, deadline)?;
        hs.on_challenge(&read_frame(&sock, deadline)?)?;
        // The server has the key: only now a QP.
        let pi = verbs.port_for_ip(local)?;
        debug_port("connect", local, peer, &pi);
        let psn = random_psn()?;
        let mut conn = Conn::build_side(verbs, &pi, sock)?;
        conn.local = IpAddr::V4(local);
        conn.peer = IpAddr::V4(peer);
        let credits = conn.credit_offer(verbs, None);
        let mine = conn.our_params(&pi, psn, PROTOCOL_4_1, credits);
        let s = conn.side_sock()?;
        write_frame(s, &hs.params(&mine)?, deadline)?;
        let theirs = hs.on_server_params(&read_frame(s, deadline)?)?;
        if theirs.local != IpAddr::V4(peer) || theirs.peer != IpAddr::V4(local) {
            return Err(SideError::BadField("addresses").into());
        }
        if !matches!(theirs.rds_version, PROTOCOL_4_1 | PROTOCOL_3_1) {
            return Err(err(libc::EPROTO, &format!("RDS-IB version {:#06x} not supported", theirs.rds_version)));
        }
        conn.modify_rtr_rts(&pi, &theirs, psn)?;
        let s = conn.side_sock()?;
        write_frame(s, &hs.ready()?, deadline)?;
        hs.on_ready(&read_frame(s, deadline)?)?;
        conn.side_established(&theirs, true)?;
        Ok(conn)
    }
}

/// The accepting side of the verbs-only mode: a TCP listener on
/// `local:port`. Each connection runs on a thread of its own: first the
/// unauthenticated handshake (at most [`MAX_PENDING_HANDSHAKES`] at once,
/// at most [`MAX_PENDING_PER_SOURCE`] from one source address), then, for a
/// peer that proved the key and that the caller's admission check took,
/// the QP, the parameters and READY. The listener's own thread accepts,
/// counts and asks the admission check, and nothing else: no peer, with
/// or without the key, can hold it up.
///
/// `T` is what the admission check returns for a peer it takes (the
/// transport: the core's path); it comes back with that peer's outcome
/// ([`SideEvent`]).
pub struct SideListener<T = ()> {
    tcp: TcpListener,
    verbs: Arc<Verbs>,
    local: Ipv4Addr,
    key: Key,
    timeout: Duration,
    max_pending: usize,
    max_per_source: usize,
    /// Unauthenticated handshakes on their threads now, in all and per
    /// source address.
    pending: Arc<Mutex<Pending>>,
    done_tx: mpsc::Sender<FromThread>,
    done_rx: mpsc::Receiver<FromThread>,
    /// An eventfd the connection threads write after telling something.
    wake: Arc<OwnedFd>,
    /// Admitted peers whose connection is being set up, by ticket.
    admitted: HashMap<u64, T>,
    next_ticket: u64,
    /// Peers that failed the key check (bad MAC on CLIENT_PARAMS: wrong
    /// key, replayed or altered frame). No QP was created for them.
    pub auth_failed: u64,
    /// Handshakes that ended otherwise before authentication (garbage,
    /// EOF, timeout, wrong version, addresses not matching the TCP
    /// connection, no free handshake slot). No QP was created for them.
    pub bad_handshake: u64,
    /// Of `bad_handshake`: connections closed at once because
    /// [`MAX_PENDING_HANDSHAKES`] handshakes were under way.
    pub busy: u64,
    /// Of `bad_handshake`: connections closed at once because their source
    /// address had [`MAX_PENDING_PER_SOURCE`] handshakes under way.
    pub busy_source: u64,
    /// Authenticated requests the admission check refused.
    pub refused: u64,
    /// Tests: called on a connection's thread after the admission, before
    /// anything of the QP, with the peer's address.
    #[cfg(test)]
    before_qp: Option<Arc<dyn Fn(Ipv4Addr) + Send + Sync>>,
}

/// What [`SideListener::accept_with`] reports about a peer the admission
/// check took.
pub enum SideEvent<T> {
    /// Its connection is up (READY both ways).
    Up(Box<Conn>, T),
    /// Setting up its connection failed after the admission (the QP, if
    /// any, is gone; the caller reports the path down).
    Failed(io::Error, T),
}

/// Unauthenticated handshakes under way.
#[derive(Default)]
struct Pending {
    total: usize,
    by_source: HashMap<Ipv4Addr, usize>,
}

/// What a connection's thread tells the listener.
enum FromThread {
    /// The unauthenticated part ended without a peer we may talk to (the
    /// connection is closed); `auth`: on a bad MAC.
    Failed { auth: bool },
    /// The peer proved the key and its claimed addresses are its TCP
    /// connection's: may it have the connection `local` - `from`? A ticket
    /// (taken) or `None` (refused) goes back on `answer`.
    Admit { local: Ipv4Addr, from: Ipv4Addr, answer: mpsc::SyncSender<Option<u64>> },
    /// The admitted peer's connection, up or failed.
    Done { ticket: u64, res: io::Result<Box<Conn>> },
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn poke(wake: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write of a valid u64 to our eventfd.
    unsafe { libc::write(wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Frees an unauthenticated handshake slot and wakes the listener, however
/// the thread's unauthenticated part ends.
struct Slot {
    pending: Arc<Mutex<Pending>>,
    from: Ipv4Addr,
    wake: Arc<OwnedFd>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut p = lock(&self.pending);
            p.total = p.total.saturating_sub(1);
            if let Some(n) = p.by_source.get_mut(&self.from) {
                *n -= 1;
                if *n == 0 {
                    p.by_source.remove(&self.from);
                }
            }
        }
        poke(&self.wake);
    }
}

/// What a connection's thread needs.
struct Ctx {
    key: Key,
    verbs: Arc<Verbs>,
    fallback_local: Ipv4Addr,
    timeout: Duration,
    tx: mpsc::Sender<FromThread>,
    wake: Arc<OwnedFd>,
    #[cfg(test)]
    before_qp: Option<Arc<dyn Fn(Ipv4Addr) + Send + Sync>>,
}

impl Ctx {
    fn tell(&self, m: FromThread) {
        let _ = self.tx.send(m);
        poke(&self.wake);
    }
}

/// Reports an admitted peer's outcome exactly once, also when the thread
/// unwinds (then as a failure).
struct Outcome<'a> {
    cx: &'a Ctx,
    ticket: u64,
    res: Option<io::Result<Box<Conn>>>,
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        let res = self.res.take().unwrap_or_else(|| Err(err(libc::EIO, "RDS-IB side channel setup thread ended")));
        self.cx.tell(FromThread::Done { ticket: self.ticket, res });
    }
}

/// The unauthenticated part: HELLO, CHALLENGE, CLIENT_PARAMS by
/// `deadline`. `Err(true)` on a bad MAC, `Err(false)` otherwise.
fn pre_auth(
    sock: &TcpStream,
    fallback_local: Ipv4Addr,
    key: &Key,
    deadline: Instant,
) -> Result<(Ipv4Addr, Server, Params), bool> {
    let run = || -> Result<(Ipv4Addr, Server, Params), (bool, io::Error)> {
        let plain = |e: io::Error| (false, e);
        sock.set_nonblocking(false).map_err(plain)?;
        sock.set_nodelay(true).map_err(plain)?;
        let local = match sock.local_addr().map_err(plain)?.ip() {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => fallback_local,
        };
        let mut hs = Server::new(key, random_nonce().map_err(|e| (false, e))?);
        let hello = read_frame(sock, deadline).map_err(plain)?;
        let ch = hs.on_hello(&hello).map_err(|e| (false, e.into()))?;
        write_frame(sock, &ch, deadline).map_err(plain)?;
        let cp = read_frame(sock, deadline).map_err(plain)?;
        let theirs = hs.on_client_params(&cp).map_err(|e| (e == SideError::AuthFailed, e.into()))?;
        Ok((local, hs, theirs))
    };
    run().map_err(|(auth, _)| auth)
}

/// One accepted connection, on its own thread: the unauthenticated part
/// (holding `slot`), the claims, the admission (asked of the listener),
/// then the connection (QP, parameters, READY), reported to the listener.
fn serve_connection(sock: TcpStream, from: Ipv4Addr, slot: Slot, cx: Ctx) {
    let pre = pre_auth(&sock, cx.fallback_local, &cx.key, Instant::now() + cx.timeout);
    // Authenticated or not, the unauthenticated part is over.
    drop(slot);
    let (local, hs, theirs) = match pre {
        Ok(x) => x,
        Err(auth) => {
            let _ = sock.shutdown(std::net::Shutdown::Both);
            cx.tell(FromThread::Failed { auth });
            return;
        }
    };
    // Its claimed addresses must be the TCP connection's.
    if theirs.local != IpAddr::V4(from)
        || theirs.peer != IpAddr::V4(local)
        || !matches!(theirs.rds_version, PROTOCOL_4_1 | PROTOCOL_3_1)
    {
        let _ = sock.shutdown(std::net::Shutdown::Both);
        cx.tell(FromThread::Failed { auth: false });
        return;
    }
    let (answer, ticket) = mpsc::sync_channel(1);
    cx.tell(FromThread::Admit { local, from, answer });
    // The listener answers every request it takes off its channel at once;
    // gone, it drops the request and with it `answer`.
    let Ok(Some(ticket)) = ticket.recv() else {
        let _ = sock.shutdown(std::net::Shutdown::Both);
        return;
    };
    let mut outcome = Outcome { cx: &cx, ticket, res: None };
    #[cfg(test)]
    if let Some(f) = &cx.before_qp {
        f(from);
    }
    outcome.res = Some(establish(&cx.verbs, sock, from, local, hs, theirs, cx.timeout).map(Box::new));
}

/// An authenticated, admitted peer: our QP, the parameters both ways,
/// READY both ways, by `timeout`.
fn establish(
    verbs: &Arc<Verbs>,
    sock: TcpStream,
    from: Ipv4Addr,
    local: Ipv4Addr,
    mut hs: Server,
    theirs: Params,
    timeout: Duration,
) -> io::Result<Conn> {
    let deadline = Instant::now() + timeout;
    let pi = verbs.port_for_ip(local)?;
    debug_port("accept", local, from, &pi);
    let psn = random_psn()?;
    let mut conn = Conn::build_side(verbs, &pi, sock)?;
    conn.local = IpAddr::V4(local);
    conn.peer = IpAddr::V4(from);
    conn.peer_proposed = theirs.rds_version;
    let credits = conn.credit_offer(verbs, Some(theirs.credits));
    let mine = conn.our_params(&pi, psn, theirs.rds_version, credits);
    conn.modify_rtr_rts(&pi, &theirs, psn)?;
    let s = conn.side_sock()?;
    write_frame(s, &hs.params(&mine)?, deadline)?;
    write_frame(s, &hs.ready()?, deadline)?;
    hs.on_ready(&read_frame(s, deadline)?)?;
    conn.side_established(&theirs, false)?;
    Ok(conn)
}

impl<T> SideListener<T> {
    pub fn bind(verbs: &Arc<Verbs>, local: Ipv4Addr, key: Key, port: u16) -> io::Result<SideListener<T>> {
        let tcp = TcpListener::bind((local, port))?;
        tcp.set_nonblocking(true)?;
        // SAFETY: plain eventfd creation; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: fd is a new descriptor nobody else owns.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let (done_tx, done_rx) = mpsc::channel();
        Ok(SideListener {
            tcp,
            verbs: verbs.clone(),
            local,
            key,
            timeout: HANDSHAKE_TIMEOUT,
            max_pending: MAX_PENDING_HANDSHAKES,
            max_per_source: MAX_PENDING_PER_SOURCE,
            pending: Arc::new(Mutex::new(Pending::default())),
            done_tx,
            done_rx,
            wake,
            admitted: HashMap::new(),
            next_ticket: 0,
            auth_failed: 0,
            bad_handshake: 0,
            busy: 0,
            busy_source: 0,
            refused: 0,
            #[cfg(test)]
            before_qp: None,
        })
    }

    /// Other limits than [`HANDSHAKE_TIMEOUT`] and
    /// [`MAX_PENDING_HANDSHAKES`] (tests).
    pub fn set_limits(&mut self, timeout: Duration, max_pending: usize) {
        self.timeout = timeout;
        self.max_pending = max_pending.max(1);
    }

    /// Another limit than [`MAX_PENDING_PER_SOURCE`] (tests).
    pub fn set_max_per_source(&mut self, n: usize) {
        self.max_per_source = n.max(1);
    }

    /// The TCP port listened on.
    pub fn port(&self) -> io::Result<u16> {
        Ok(self.tcp.local_addr()?.port())
    }

    /// Unauthenticated handshakes under way on their threads.
    pub fn pending(&self) -> usize {
        lock(&self.pending).total
    }

    /// Serves the listener until `deadline`: accepts connections (each to a
    /// thread of its own), counts the unauthenticated and refused ones,
    /// asks `admit(local, peer)` about each authenticated peer (`Some(t)`
    /// takes it: no QP exists before), and returns the first outcome of a
    /// peer taken, with its `t`; `None` when `deadline` passes first.
    /// Connections go on on their threads after a return; their news is
    /// taken by the next calls.
    pub fn accept_with(
        &mut self,
        deadline: Instant,
        admit: &mut dyn FnMut(Ipv4Addr, Ipv4Addr) -> Option<T>,
    ) -> io::Result<Option<SideEvent<T>>> {
        loop {
            // News from the connection threads first.
            while let Ok(m) = self.done_rx.try_recv() {
                match m {
                    FromThread::Failed { auth: true } => self.auth_failed += 1,
                    FromThread::Failed { auth: false } => self.bad_handshake += 1,
                    FromThread::Admit { local, from, answer } => match admit(local, from) {
                        Some(t) => {
                            let ticket = self.next_ticket;
                            self.next_ticket += 1;
                            if answer.send(Some(ticket)).is_err() {
                                // The thread is gone: taken, but nothing will come.
                                return Ok(Some(SideEvent::Failed(
                                    err(libc::ECONNABORTED, "RDS-IB side channel setup"),
                                    t,
                                )));
                            }
                            self.admitted.insert(ticket, t);
                        }
                        None => {
                            self.refused += 1;
                            let _ = answer.send(None);
                        }
                    },
                    FromThread::Done { ticket, res } => {
                        if let Some(t) = self.admitted.remove(&ticket) {
                            return Ok(Some(match res {
                                Ok(c) => SideEvent::Up(c, t),
                                Err(e) => SideEvent::Failed(e, t),
                            }));
                        }
                    }
                }
            }
            // New connections, each to a thread of its own.
            let mut accepted = false;
            loop {
                match self.tcp.accept() {
                    Ok((sock, from)) => {
                        accepted = true;
                        self.start(sock, from);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            if accepted {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = [
                libc::pollfd { fd: self.tcp.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: two valid pollfds.
            unsafe { libc::poll(pfd.as_mut_ptr(), 2, left.as_millis().clamp(1, 1000) as c_int) };
            if pfd[1].revents != 0 {
                let mut n: u64 = 0;
                // SAFETY: an 8-byte read into a valid u64 from our eventfd.
                unsafe { libc::read(self.wake.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
            }
        }
    }

    /// Hands a new connection to a thread of its own, or closes it (no free
    /// slot in all or for its source, not IPv4, no thread).
    fn start(&mut self, sock: TcpStream, from: SocketAddr) {
        let IpAddr::V4(from_ip) = from.ip() else {
            self.bad_handshake += 1;
            return;
        };
        {
            let mut p = lock(&self.pending);
            let here = p.by_source.get(&from_ip).copied().unwrap_or(0);
            let full = if p.total >= self.max_pending {
                Some(&mut self.busy)
            } else if here >= self.max_per_source {
                Some(&mut self.busy_source)
            } else {
                None
            };
            if let Some(c) = full {
                *c += 1;
                self.bad_handshake += 1;
                let _ = sock.shutdown(std::net::Shutdown::Both);
                return;
            }
            p.total += 1;
            *p.by_source.entry(from_ip).or_default() += 1;
        }
        let slot = Slot { pending: self.pending.clone(), from: from_ip, wake: self.wake.clone() };
        let cx = Ctx {
            key: self.key.clone(),
            verbs: self.verbs.clone(),
            fallback_local: self.local,
            timeout: self.timeout,
            tx: self.done_tx.clone(),
            wake: self.wake.clone(),
            #[cfg(test)]
            before_qp: self.before_qp.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("rds-ib-side-hs".into())
            .spawn(move || serve_connection(sock, from_ip, slot, cx));
        if spawned.is_err() {
            // The closure (socket and slot) was dropped with the error.
            self.bad_handshake += 1;
        }
    }
}

/// The listener's handshake handling without any RDMA device: every
/// authenticated peer is refused by `admit`, so no QP is ever asked for.
/// Loopback addresses 127.93.1-3.x (no other test uses 127.93/16).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::sidechannel::{HELLO_LEN, MAGIC};

    const KEY: &[u8] = b"rds-ib side listener test key 01";

    fn key() -> Key {
        Key::new(KEY.to_vec()).unwrap()
    }

    fn listener<T>(addr: Ipv4Addr, timeout: Duration, max_pending: usize) -> SideListener<T> {
        let mut l = SideListener::bind(&Verbs::new(), addr, key(), 0).unwrap();
        l.set_limits(timeout, max_pending);
        l
    }

    /// The listener has not closed its end of `s` (no EOF, no reset).
    fn still_open(s: &TcpStream) -> bool {
        s.set_nonblocking(true).unwrap();
        let r = s.peek(&mut [0u8; 1]);
        s.set_nonblocking(false).unwrap();
        matches!(r, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Drives the listener (refusing every authenticated peer) until
    /// `done(listener)` or 60 s.
    fn drive_until(l: &mut SideListener, mut done: impl FnMut(&SideListener) -> bool) {
        let bound = Instant::now() + Duration::from_secs(60);
        while !done(l) {
            assert!(
                Instant::now() < bound,
                "not reached in 60 s: pending {} bad {} busy {} busy_source {}",
                l.pending(),
                l.bad_handshake,
                l.busy,
                l.busy_source
            );
            let r = l.accept_with(Instant::now() + Duration::from_millis(100), &mut |_, _| None);
            assert!(matches!(r, Ok(None)), "{:?}", r.err());
        }
    }

    /// A client with the key, from `local`: HELLO, the server's proof,
    /// CLIENT_PARAMS; then it waits for the listener's answer. Returns
    /// whether the listener closed the connection (the refusal) rather
    /// than answering.
    fn honest(local: Ipv4Addr, server: SocketAddr) -> io::Result<bool> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let sock = tcp_connect(local, server, deadline)?;
        let (mut hs, hello) = Client::new(&key(), random_nonce()?);
        write_frame(&sock, &hello, deadline)?;
        hs.on_challenge(&read_frame(&sock, deadline)?)?;
        let p = Params {
            qpn: 0x11,
            psn: 1,
            gid: local.to_ipv6_mapped().octets(),
            lid: 0,
            mtu: 1024,
            rds_version: PROTOCOL_4_1,
            path: 0,
            credits: 0,
            tos: 0,
            ack_seq: 0,
            local: IpAddr::V4(local),
            peer: server.ip(),
        };
        write_frame(&sock, &hs.params(&p)?, deadline)?;
        sock.set_read_timeout(Some(Duration::from_secs(60)))?;
        match (&sock).read(&mut [0u8; 1]) {
            Ok(0) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(true),
            Ok(_) => Ok(false),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn stalled_clients_do_not_delay_an_honest_handshake() {
        let addr = Ipv4Addr::new(127, 93, 1, 1);
        let client = Ipv4Addr::new(127, 93, 1, 2);
        // A handshake deadline far beyond the test: served one at a time,
        // the honest peer would wait behind the stalled ones for minutes.
        let mut l = listener(addr, Duration::from_secs(600), MAX_PENDING_HANDSHAKES);
        let srv = SocketAddr::from((addr, l.port().unwrap()));
        // Three connect and send nothing, one sends half a header (each
        // from an address of its own: one source gets two slots).
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut stalled: Vec<TcpStream> =
            (0..3).map(|i| tcp_connect(Ipv4Addr::new(127, 93, 1, 10 + i), srv, deadline).unwrap()).collect();
        let half = tcp_connect(Ipv4Addr::new(127, 93, 1, 13), srv, deadline).unwrap();
        (&half).write_all(&MAGIC[..2]).unwrap();
        stalled.push(half);
        drive_until(&mut l, |l| l.pending() == 4);
        let h = std::thread::spawn(move || honest(client, srv));
        let mut admitted = Vec::new();
        drive_until_admit(&mut l, &stalled, &mut admitted);
        assert_eq!(
            admitted,
            vec![(addr, client, true)],
            "one admission check, for the honest peer, with every stalled client still connected"
        );
        assert!(h.join().unwrap().unwrap(), "the honest peer was refused (closed) after authenticating");
        assert_eq!((l.refused, l.auth_failed, l.bad_handshake, l.busy), (1, 0, 0, 0));
        assert_eq!(l.pending(), 4, "the stalled handshakes are still waiting");
        assert!(stalled.iter().all(still_open));
        // They end when their clients give up, each counted, slots freed.
        drop(stalled);
        drive_until(&mut l, |l| l.pending() == 0 && l.bad_handshake == 4);
        assert_eq!((l.refused, l.auth_failed, l.busy), (1, 0, 0));
    }

    /// Runs the listener until `admit` was asked once; `admit` records the
    /// addresses and whether every stalled client was still connected.
    fn drive_until_admit(l: &mut SideListener, stalled: &[TcpStream], admitted: &mut Vec<(Ipv4Addr, Ipv4Addr, bool)>) {
        let bound = Instant::now() + Duration::from_secs(60);
        while admitted.is_empty() {
            assert!(Instant::now() < bound, "the honest peer was not served in 60 s");
            let r = l.accept_with(Instant::now() + Duration::from_millis(100), &mut |lo, pe| {
                admitted.push((lo, pe, stalled.iter().all(still_open)));
                None
            });
            assert!(matches!(r, Ok(None)), "{:?}", r.err());
        }
    }

    #[test]
    fn idle_connections_from_one_source_do_not_keep_another_source_out() {
        let addr = Ipv4Addr::new(127, 93, 4, 1);
        let attacker = Ipv4Addr::new(127, 93, 4, 2);
        let client = Ipv4Addr::new(127, 93, 4, 3);
        let mut l = listener(addr, Duration::from_secs(600), MAX_PENDING_HANDSHAKES);
        let srv = SocketAddr::from((addr, l.port().unwrap()));
        // More idle connections from one source than the listener has
        // handshake slots in all, none of them sending a byte.
        let n = MAX_PENDING_HANDSHAKES + 4;
        let deadline = Instant::now() + Duration::from_secs(60);
        let idle: Vec<TcpStream> = (0..n).map(|_| tcp_connect(attacker, srv, deadline).unwrap()).collect();
        drive_until(&mut l, |l| l.pending() + l.bad_handshake as usize == n);
        let h = std::thread::spawn(move || honest(client, srv));
        let mut admitted = Vec::new();
        drive_until_admit(&mut l, &[], &mut admitted);
        assert_eq!(admitted, vec![(addr, client, true)], "the honest peer from another source was served");
        assert!(h.join().unwrap().unwrap(), "the honest peer was refused (closed) after authenticating");
        let over = (n - MAX_PENDING_PER_SOURCE) as u64;
        assert_eq!(l.pending(), MAX_PENDING_PER_SOURCE, "one source holds more than its slots");
        assert_eq!((l.busy_source, l.bad_handshake, l.busy, l.refused, l.auth_failed), (over, over, 0, 1, 0));
        // The two that hold slots are still connected, the others closed.
        let open = idle.iter().filter(|s| still_open(s)).count();
        assert_eq!(open, MAX_PENDING_PER_SOURCE);
        // When they go, their slots are free again for that source too.
        drop(idle);
        drive_until(&mut l, |l| l.pending() == 0 && l.bad_handshake == over + MAX_PENDING_PER_SOURCE as u64);
        let again = tcp_connect(attacker, srv, deadline).unwrap();
        drive_until(&mut l, |l| l.pending() == 1);
        assert_eq!(l.busy_source, over);
        drop(again);
        drive_until(&mut l, |l| l.pending() == 0);
    }

    /// Drives a listener that admits every authenticated peer (`T` = the
    /// peer's address) until `done(admitted, outcomes)` or 60 s; outcomes
    /// are (peer, whether it came up).
    fn drive_admitting(
        l: &mut SideListener<Ipv4Addr>,
        admitted: &mut Vec<Ipv4Addr>,
        outcomes: &mut Vec<(Ipv4Addr, bool)>,
        done: impl Fn(&[Ipv4Addr], &[(Ipv4Addr, bool)]) -> bool,
    ) {
        let bound = Instant::now() + Duration::from_secs(60);
        while !done(admitted, outcomes) {
            assert!(Instant::now() < bound, "not reached in 60 s: admitted {admitted:?}, outcomes {outcomes:?}");
            let r = l.accept_with(Instant::now() + Duration::from_millis(100), &mut |_, pe| {
                admitted.push(pe);
                Some(pe)
            });
            match r {
                Ok(None) => {}
                Ok(Some(SideEvent::Up(_, pe))) => outcomes.push((pe, true)),
                Ok(Some(SideEvent::Failed(_, pe))) => outcomes.push((pe, false)),
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn a_peer_slow_in_establish_does_not_hold_up_the_listener() {
        let addr = Ipv4Addr::new(127, 93, 5, 1);
        let slow = Ipv4Addr::new(127, 93, 5, 2);
        let other = Ipv4Addr::new(127, 93, 5, 3);
        let mut l: SideListener<Ipv4Addr> = listener(addr, Duration::from_secs(600), MAX_PENDING_HANDSHAKES);
        // The slow peer's setup stops right after its admission (where the
        // QP would be made and its READY awaited) until released.
        let (release, held) = mpsc::channel::<()>();
        let held = Mutex::new(held);
        let (entered_tx, entered) = mpsc::channel::<Ipv4Addr>();
        let entered_tx = Mutex::new(entered_tx);
        l.before_qp = Some(Arc::new(move |from| {
            let _ = lock(&entered_tx).send(from);
            if from == slow {
                let _ = lock(&held).recv_timeout(Duration::from_secs(120));
            }
        }));
        let srv = SocketAddr::from((addr, l.port().unwrap()));
        let (mut admitted, mut outcomes) = (Vec::new(), Vec::new());
        let hs = std::thread::spawn(move || honest(slow, srv));
        drive_admitting(&mut l, &mut admitted, &mut outcomes, |a, _| a.len() == 1);
        assert_eq!(entered.recv_timeout(Duration::from_secs(60)), Ok(slow), "the slow peer's setup began");
        // Meanwhile another peer is served from HELLO to its outcome (no
        // device here: its setup fails at the port lookup, after admission).
        let ho = std::thread::spawn(move || honest(other, srv));
        drive_admitting(&mut l, &mut admitted, &mut outcomes, |_, o| !o.is_empty());
        assert_eq!(admitted, vec![slow, other]);
        assert_eq!(outcomes, vec![(other, false)], "the other peer's outcome came while the slow one was still held");
        assert!(!hs.is_finished(), "the slow peer is still waiting for its setup");
        assert!(ho.join().unwrap().unwrap(), "the other peer's connection was closed after its failed setup");
        release.send(()).unwrap();
        drive_admitting(&mut l, &mut admitted, &mut outcomes, |_, o| o.len() == 2);
        assert_eq!(outcomes, vec![(other, false), (slow, false)]);
        assert!(hs.join().unwrap().unwrap());
        assert_eq!((l.refused, l.auth_failed, l.bad_handshake, l.busy, l.busy_source, l.pending()), (0, 0, 0, 0, 0, 0));
        assert!(l.admitted.is_empty());
    }

    #[test]
    fn each_handshake_has_one_deadline_however_the_peer_sends() {
        let addr = Ipv4Addr::new(127, 93, 2, 1);
        let mut l = listener(addr, Duration::from_secs(1), MAX_PENDING_HANDSHAKES);
        let srv = SocketAddr::from((addr, l.port().unwrap()));
        let silent = TcpStream::connect(srv).unwrap();
        // One byte of a HELLO every 250 ms: 10 s for the frame, each byte
        // well within any per-read timeout.
        let drip = std::thread::spawn(move || {
            let s = TcpStream::connect(srv).unwrap();
            let (_, hello) = Client::new(&key(), [7; crate::proto::sidechannel::NONCE_LEN]);
            for (i, b) in hello.iter().enumerate() {
                if (&s).write_all(&[*b]).is_err() {
                    return i;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            HELLO_LEN
        });
        drive_until(&mut l, |l| l.bad_handshake == 2 && l.pending() == 0);
        let sent = drip.join().unwrap();
        assert!(sent < HELLO_LEN, "the dripping client got its whole HELLO in ({sent} bytes)");
        assert!(!still_open(&silent), "the silent client is still connected");
        assert_eq!((l.auth_failed, l.refused, l.busy), (0, 0, 0));
    }

    #[test]
    fn handshakes_beyond_the_bound_are_closed_at_once() {
        let addr = Ipv4Addr::new(127, 93, 3, 1);
        let mut l = listener(addr, Duration::from_secs(600), 2);
        let srv = SocketAddr::from((addr, l.port().unwrap()));
        let deadline = Instant::now() + Duration::from_secs(60);
        let from = |i: u8| tcp_connect(Ipv4Addr::new(127, 93, 3, 10 + i), srv, deadline).unwrap();
        let first: Vec<TcpStream> = (0..2).map(from).collect();
        drive_until(&mut l, |l| l.pending() == 2);
        let third = from(2);
        drive_until(&mut l, |l| l.busy == 1);
        assert_eq!((l.pending(), l.bad_handshake, l.auth_failed, l.refused, l.busy_source), (2, 1, 0, 0, 0));
        third.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let r = (&third).read(&mut [0u8; 1]);
        assert!(matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset), "{r:?}");
        assert!(first.iter().all(still_open));
        // A freed slot serves the next one.
        drop(first);
        drive_until(&mut l, |l| l.pending() == 0 && l.bad_handshake == 3);
        let again = from(3);
        drive_until(&mut l, |l| l.pending() == 1);
        assert_eq!(l.busy, 1);
        drop(again);
        drive_until(&mut l, |l| l.pending() == 0 && l.bad_handshake == 4);
    }
}
