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
//! * The connecting side ([`IbConnection::connect_side`]) creates its QP only after
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

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::os::raw::c_int;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as sys;

use rds_core::wire::{PROTOCOL_3_1, PROTOCOL_4_1};

use super::qp::{IbConnection, Link};
use super::{Verbs, err, errno, sockaddr_v4};
use crate::proto::sidechannel::{Client, HEADER_LEN, Key, Params, SideError, parse_header};
use crate::secrets::{random_nonce, random_psn};

mod listener;
pub use listener::{SideEvent, SideListener};

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

impl IbConnection {
    fn side_sock(&self) -> io::Result<&TcpStream> {
        match &self.link {
            Link::Side { sock, .. } => Ok(sock),
            Link::Cm { .. } => Err(err(libc::EINVAL, "not a verbs-only connection")),
        }
    }

    /// A verbs-only QP on the port serving the address (INIT, receive ring
    /// posted), owning the side channel.
    fn build_side(verbs: &Arc<Verbs>, port: &PortInfo, sock: TcpStream) -> io::Result<IbConnection> {
        IbConnection::build(verbs.clone(), Link::Side { qp: ptr::null_mut(), sock }, Some((port.ctx, port.port)))
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
    /// control), taken by `IbConnection::credit_offer`.
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
    ) -> io::Result<IbConnection> {
        let deadline = Instant::now() + timeout;
        let sock = tcp_connect(local, SocketAddr::from((peer, port)), deadline)?;
        let (mut hs, hello) = Client::new(key, random_nonce()?);
        write_frame(&sock, &hello, deadline)?;
        hs.on_challenge(&read_frame(&sock, deadline)?)?;
        // The server has the key: only now a QP.
        let pi = verbs.port_for_ip(local)?;
        debug_port("connect", local, peer, &pi);
        let psn = random_psn()?;
        let mut conn = IbConnection::build_side(verbs, &pi, sock)?;
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
