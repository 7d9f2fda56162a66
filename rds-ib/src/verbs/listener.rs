//! The passive side of RDMA CM: [`Listener`] accepts connect requests on
//! the kernel's port for the address family, never blocking on one peer.

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::{c_int, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys as sys;

use super::cm::{CmChannel, CmEvent, REJ_RETRY, cm_port, conn_param, event_name, family, id_addrs};
use super::qp::{IbConnection, Link};
use super::{SideEvent, Verbs, check, err, sockaddr_ip};
use crate::proto::private::{ConnectPrivate, PrivAddrs, passive_negotiate, reject_data, version_usable};

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
    conn: IbConnection,
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
    ch: CmChannel,
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
    pub fn accept(&mut self, deadline: Instant) -> io::Result<Option<IbConnection>> {
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
        let ch = CmChannel::new()?;
        let guard = ch.create_id()?;
        let id = guard.0;
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
    ) -> io::Result<IbConnection> {
        let ch = match CmChannel::new() {
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
        let mut conn = IbConnection::build(self.verbs.clone(), Link::Cm { id, ch }, None)?;
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
