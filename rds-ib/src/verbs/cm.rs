//! RDMA CM: the event channel, CM ids, the connection parameters with the
//! kernel's private data, and the active side's connect
//! ([`IbConnection::connect`], proposing 4.1 and falling back to 3.1 after
//! a reject with value 1). The passive side is [`super::listener`].

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as sys;
use rds_core::wire::{self, PROTOCOL_3_1};

use super::device::Verbs;
use super::qp::{IbConnection, Link};
use super::{RDS_CM_PORT, RDS_IB_PORT, RESOLVE_TIMEOUT_MS, RETRY_COUNT, check, err, errno, sockaddr_ip};
use crate::proto::private::{ActiveNegotiation, ConnectPrivate, Family, PrivAddrs, RejectAction};

/// `IB_CM_REJ_CONSUMER_DEFINED`: the reject reason carrying reject data.
const REJ_CONSUMER_DEFINED: i32 = 28;

/// A CM event copied out of librdmacm (and acked).
pub(super) struct CmEvent {
    pub(super) kind: sys::rdma_cm_event_type::Type,
    pub(super) status: i32,
    pub(super) id: *mut sys::rdma_cm_id,
    pub(super) private: Option<Vec<u8>>,
}

pub(super) fn event_name(kind: sys::rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a static C string for any value.
    unsafe { CStr::from_ptr(sys::rdma_event_str(kind)) }.to_string_lossy().into_owned()
}

/// An RDMA CM event channel, non-blocking.
pub(super) struct CmChannel(pub(super) *mut sys::rdma_event_channel);

impl CmChannel {
    pub(super) fn new() -> io::Result<CmChannel> {
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
        Ok(CmChannel(ch))
    }

    /// A new RDMA CM id on this channel (TCP port space, as the kernel's
    /// RDS uses), destroyed when the guard drops; a connection that takes
    /// the id over forgets the guard. Declare the guard after the channel so
    /// that it drops first.
    pub(super) fn create_id(&self) -> io::Result<IdGuard> {
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        check(
            // SAFETY: the channel is live; id is an out pointer.
            unsafe { sys::rdma_create_id(self.0, &mut id, ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP) },
            "rdma_create_id",
        )?;
        Ok(IdGuard(id))
    }

    /// The next event, waiting until `deadline`; `None` on timeout.
    pub(super) fn next(&self, deadline: Instant) -> io::Result<Option<CmEvent>> {
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
    pub(super) fn expect(&self, want: sys::rdma_cm_event_type::Type, deadline: Instant) -> io::Result<CmEvent> {
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

impl Drop for CmChannel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel was destroyed before (field order).
        unsafe { sys::rdma_destroy_event_channel(self.0) };
    }
}

/// The kernel's RDMA CM port for an address family: 18634 (`RDS_PORT`) for
/// IPv4, 16385 (`RDS_CM_PORT`) for IPv6 (`rds_rdma_listen_init`).
pub fn cm_port(addr: &IpAddr) -> u16 {
    if addr.is_ipv4() { RDS_IB_PORT } else { RDS_CM_PORT }
}

/// The private data layout of an address family.
pub(super) fn family(addr: &IpAddr) -> Family {
    if addr.is_ipv4() { Family::V4 } else { Family::V6 }
}

pub(super) fn id_addrs(id: *mut sys::rdma_cm_id) -> (Option<IpAddr>, Option<IpAddr>) {
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

/// The reject value for a connect request we refuse for now (a connect of
/// our own to that peer is under way, or the path is busy): 0, which the
/// kernel's active side takes like [`crate::proto::private::REJ_INCOMPAT`]: it drops the attempt
/// and reconnects (proposing 3.1 from then on, as after any such reject of
/// its own). A value above 1 is only logged by the kernel: its connection
/// then stays CONNECTING for good and it rejects every connect of ours as
/// a crossed one (seen in the forced-disconnect VM test: no connection
/// again after a refusal).
pub const REJ_RETRY: i32 = 0;

/// Destroys an id on an early error return.
pub(super) struct IdGuard(pub(super) *mut sys::rdma_cm_id);

impl Drop for IdGuard {
    fn drop(&mut self) {
        // SAFETY: the id was created by us and has no QP yet.
        unsafe { sys::rdma_destroy_id(self.0) };
    }
}

pub(super) fn conn_param(dp: &[u8]) -> sys::rdma_conn_param {
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
    _ch: CmChannel,
    /// The peer accepted (CONNECT_RESPONSE) rather than rejected.
    pub accepted: bool,
}

impl StalledRequest {
    /// Sends the request from `local` to `peer`'s RDMA CM port and waits
    /// until `deadline` for the peer's answer.
    pub fn send(local: IpAddr, peer: IpAddr, deadline: Instant) -> io::Result<StalledRequest> {
        let ch = CmChannel::new()?;
        let guard = ch.create_id()?;
        let id = guard.0;
        let mut src = sockaddr_ip(local, 0);
        let mut dst = sockaddr_ip(peer, cm_port(&peer));
        check(
            // SAFETY: id is live; both socket addresses are valid for the call.
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

impl IbConnection {
    /// Connects to the kernel (or any RDS-IB peer) at `peer` from `local`:
    /// resolve, route, QP, connect with the private data proposing 4.1; a
    /// reject with value 1 retries once with 3.1.
    pub fn connect(verbs: &Arc<Verbs>, local: IpAddr, peer: IpAddr, timeout: Duration) -> io::Result<IbConnection> {
        if local.is_ipv4() != peer.is_ipv4() {
            return Err(err(libc::EAFNOSUPPORT, "RDS-IB connect: address families differ"));
        }
        let mut nego = ActiveNegotiation::new();
        let deadline = Instant::now() + timeout;
        for _attempt in 0..2 {
            match IbConnection::connect_once(verbs, local, peer, &mut nego, deadline)? {
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
    pub(super) fn connect_once(
        verbs: &Arc<Verbs>,
        local: IpAddr,
        peer: IpAddr,
        nego: &mut ActiveNegotiation,
        deadline: Instant,
    ) -> io::Result<Result<IbConnection, RejectAction>> {
        let ch = CmChannel::new()?;
        let guard = ch.create_id()?;
        let id = guard.0;
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
        check(r, "rdma_resolve_addr")?;
        ch.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED, deadline)?;
        // SAFETY: id is live with a resolved address.
        check(unsafe { sys::rdma_resolve_route(id, RESOLVE_TIMEOUT_MS) }, "rdma_resolve_route")?;
        ch.expect(sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED, deadline)?;
        std::mem::forget(guard);
        let mut conn = IbConnection::build(verbs.clone(), Link::Cm { id, ch }, None)?;
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
}
