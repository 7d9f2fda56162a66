//! One RDS-IB connection ([`IbConnection`]): its RC queue pair, the two
//! completion queues on one completion channel, the registered header and
//! fragment buffers of its rings, and what the QP hangs off (an RDMA CM id
//! or the verbs-only side channel). Creation, CQ events, the CM events of
//! the connection, draining and teardown are here; the rings' posting and
//! completions are in [`super::rings`], the CM connect in [`super::cm`].

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;
use std::time::Instant;

use rdma_sys as sys;
use rds_core::wire::{HEADER_LEN, Header};

use super::cm::{CmChannel, event_name};
use super::device::Verbs;
use super::{RECV_WR, SEND_WR, check, err, errno, rdma, side};
use crate::proto::credits::{FlowControl, RxGate};
use crate::proto::frag::{FRAG_SIZE, Reassembler, SignalState};

/// A registered buffer.
pub(super) struct RegisteredBuf {
    pub(super) buf: Vec<u8>,
    pub(super) mr: *mut sys::ibv_mr,
}

impl RegisteredBuf {
    pub(super) fn new(pd: *mut sys::ibv_pd, len: usize) -> io::Result<RegisteredBuf> {
        let mut buf = vec![0u8; len];
        let access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int;
        // SAFETY: buf is a live heap allocation of len bytes that is never
        // reallocated and outlives the registration (dropped after dereg).
        let mr = unsafe { sys::ibv_reg_mr(pd, buf.as_mut_ptr() as *mut c_void, len, access) };
        if mr.is_null() {
            return Err(errno());
        }
        Ok(RegisteredBuf { buf, mr })
    }

    pub(super) fn lkey(&self) -> u32 {
        // SAFETY: mr is a live registration.
        unsafe { (*self.mr).lkey }
    }

    pub(super) fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        // SAFETY: the registration is live and no work request uses it any more
        // (the QP was destroyed first).
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
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

/// One RDS-IB connection: CM id, RC QP, CQs, rings.
pub struct IbConnection {
    // Field order is drop order where it matters: the QP (and the CM id)
    // goes first (in Drop), then CQs and MRs, then the channel or socket,
    // then the shared PD.
    pub(super) link: Link,
    pub(super) send_cq: *mut sys::ibv_cq,
    pub(super) recv_cq: *mut sys::ibv_cq,
    pub(super) comp: *mut sys::ibv_comp_channel,
    /// Receive work requests posted and not completed yet.
    pub(super) rx_posted: usize,
    /// The first error seen on the connection (a failed completion, a
    /// protocol error): nothing is processed or posted after it.
    pub(super) failed: Option<ConnError>,
    /// rdma_disconnect was called.
    pub(super) disconnected: bool,
    /// Ack everything received whenever the receive CQ runs dry.
    pub(super) eager_acks: bool,
    pub(super) eager_acked: u64,
    pub(super) rx_hdr: RegisteredBuf,
    pub(super) rx_data: RegisteredBuf,
    pub(super) tx_hdr: RegisteredBuf,
    pub(super) tx_data: RegisteredBuf,
    pub(super) _verbs: Arc<Verbs>,
    pub(super) tx_free: Vec<usize>,
    /// Posted sends in order: slot and whether it is an ack-only frame.
    pub(super) tx_inflight: VecDeque<(usize, bool)>,
    pub(super) fc: FlowControl,
    /// Receive flow control: completed buffers held, not reposted, while
    /// the core has the path paused ([`IbConnection::set_rx_paused`]).
    pub(super) gate: RxGate,
    pub(super) sig: SignalState,
    pub(super) reasm: Reassembler,
    pub(super) next_seq: u64,
    pub(super) version: u16,
    pub(super) local: IpAddr,
    pub(super) peer: IpAddr,
    pub(super) peer_credit: u32,
    pub(super) peer_proposed: u16,
    pub(super) up: bool,
    pub(super) stats: ConnStats,
    pub(super) ready: VecDeque<Received>,
    /// RDMA operations in flight (`verbs/rdma.rs`).
    pub(super) rdma: rdma::RdmaState,
}

// SAFETY: the verbs and CM objects of a connection may be used from any
// thread; an IbConnection is used by one thread at a time (&mut self).
unsafe impl Send for IbConnection {}

impl IbConnection {
    /// Creates CQs, MRs and the QP on `id` (whose device is known) and posts
    /// the receive ring.
    ///
    /// Owns `link` from here on: on an error everything (the CM id too) is
    /// released. A [`Link::Side`] QP is created with `ibv_create_qp` and
    /// moved to INIT on `side_port` (the CM moves its own).
    pub(super) fn build(
        verbs: Arc<Verbs>,
        link: Link,
        side: Option<(*mut sys::ibv_context, u8)>,
    ) -> io::Result<IbConnection> {
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
                RegisteredBuf::new(pd, RECV_WR * HEADER_LEN)?,
                RegisteredBuf::new(pd, RECV_WR * FRAG_SIZE)?,
                RegisteredBuf::new(pd, SEND_WR * HEADER_LEN)?,
                RegisteredBuf::new(pd, SEND_WR * FRAG_SIZE)?,
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
        let mut conn = IbConnection {
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

    pub(super) fn qp(&self) -> *mut sys::ibv_qp {
        match &self.link {
            // SAFETY: id is live for the life of self.
            Link::Cm { id, .. } => unsafe { (**id).qp },
            Link::Side { qp, .. } => *qp,
        }
    }

    /// The connection's RDMA CM event channel (CM mode only).
    pub(super) fn cm_channel(&self) -> io::Result<&CmChannel> {
        match &self.link {
            Link::Cm { ch, .. } => Ok(ch),
            Link::Side { .. } => Err(err(libc::EINVAL, "no RDMA CM on a verbs-only connection")),
        }
    }

    pub(super) fn cm_id(&self) -> *mut sys::rdma_cm_id {
        match &self.link {
            Link::Cm { id, .. } => *id,
            Link::Side { .. } => ptr::null_mut(),
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
    /// answer in [`IbConnection::credit_answer`]; the accepting side, knowing the
    /// offer, turns it on only for a non-zero one and then grants its own
    /// ring.
    pub(super) fn credit_offer(&mut self, verbs: &Verbs, peer_credits: Option<u32>) -> u32 {
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
    pub(super) fn credit_answer(&mut self, peer_credits: u32) {
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

    pub(super) fn fail(&mut self, protocol: bool, what: String) {
        self.up = false;
        if self.failed.is_none() {
            self.failed = Some(ConnError { protocol, what });
        }
    }

    pub(super) fn failure_error(&self) -> io::Error {
        match &self.failed {
            Some(f) if f.protocol => err(libc::EPROTO, &f.what),
            Some(f) => err(libc::ECONNRESET, &f.what),
            None => err(libc::ENOTCONN, "RDS-IB connection down"),
        }
    }

    /// The descriptor of the CQs' completion channel (readable when a
    /// completion arrived after [`IbConnection::on_cq_event`] rearmed them).
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

    pub(super) fn req_notify(&mut self) -> io::Result<()> {
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
    /// messages wait in [`IbConnection::take_ready`]. An error means the connection
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

    /// Drains both CQs (see [`IbConnection::on_cq_event`]).
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

    /// Ends the connection: moves the QP to the error state (the peer sees
    /// DISCONNECTED) and drains both CQs until every posted work request
    /// completed or flushed, or `deadline` passes. Messages received before
    /// the end stay in [`IbConnection::take_ready`]; nothing posted is completed
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

    pub(super) fn ack_cq_events(&mut self) {
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
    pub(super) fn poll_cm(&mut self) -> io::Result<()> {
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

impl Drop for IbConnection {
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
pub(super) enum Link {
    Cm { id: *mut sys::rdma_cm_id, ch: CmChannel },
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
