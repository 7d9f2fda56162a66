//! `RdsSocket`: the public socket, shaped after the kernel's AF_RDS socket.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rds_core::{Errno, Incoming, Payload, Readiness, Received, SendOptions, SockId, SockOpt, TransportKind};

use crate::deadline::Deadline;
use crate::engine::{Engine, SockShared};

mod poll;
mod rdma;

/// Blocking waits that leave the reading to the reactor after one of
/// them read a stream ([`RdsSocket::recv_msg_wait`]).
const STREAM_SKIP: u32 = 64;

/// A blocking send that found the send buffer full polls its TCP acks
/// after this long without a wake-up, then after twice that, up to
/// [`ACK_NAP_MAX`] (`RdsSocket::wait_to_send`). Capped at 1 ms instead,
/// qperf `rds_bw` in the VM rig ran at 100-112 MB/s with 64 KiB messages
/// and 33-36 with 1 KiB, against 114-124 and 40-44 (3 rounds
/// alternating, one boot); starting at 20 us gained nothing.
const ACK_NAP_MIN: Duration = Duration::from_micros(50);
const ACK_NAP_MAX: Duration = Duration::from_micros(250);
/// After this many polls at [`ACK_NAP_MAX`] that found nothing acked (a
/// receiver that does not read, a connection that stalls) the naps double
/// on up to [`ACK_NAP_IDLE`]: a sender blocked for long wakes 250 times a
/// second, not 4,000.
const ACK_NAP_PATIENCE: u32 = 16;
const ACK_NAP_IDLE: Duration = Duration::from_millis(4);

/// Flags of one `recvmsg` call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvFlags {
    /// MSG_PEEK: leave the message queued.
    pub peek: bool,
    /// MSG_TRUNC: return the real length of a message longer than the buffer.
    pub trunc: bool,
    /// MSG_DONTWAIT: do not block even on a blocking socket.
    pub dontwait: bool,
}

/// Flags and ancillary data of one `sendmsg` call.
#[derive(Clone, Debug, Default)]
pub struct SendFlags {
    /// MSG_DONTWAIT.
    pub dontwait: bool,
    /// `RDS_CMSG_RDMA_DEST`: an RDMA cookie to announce to the peer.
    pub rdma_dest: Option<u64>,
    /// `RDS_CMSG_RDMA_ARGS`: an RDMA operation (EOPNOTSUPP over TCP). Its
    /// local buffers are [`rds_core::RdmaSeg`]s: the operation keeps them
    /// alive until its work requests completed, so they may be dropped at
    /// once; the data of a READ is in the buffer when the op's status
    /// (NOTIFY_ME) reported success. Raw addresses do not compile:
    ///
    /// ```compile_fail
    /// // Safe code naming memory it does not own (accepted before
    /// // RdmaOp::local became RdmaSegs: a READ wrote there).
    /// # fn f(sock: &rds_sock::RdsSocket) {
    /// let op = rds_sock::RdmaOp {
    ///     remote_cookie: 1, remote_addr: 0, remote_len: 8,
    ///     local: vec![(0xdead_0000u64, 8u64)],
    ///     flags: 0, user_token: 0,
    /// };
    /// let f = rds_sock::SendFlags { rdma: Some(op), ..Default::default() };
    /// let _ = sock.send_msg(b"x", None, &f);
    /// # }
    /// ```
    ///
    /// ```
    /// let buf = rds_core::RdmaBuf::new(8);
    /// let op = rds_core::RdmaOp {
    ///     remote_cookie: 1, remote_addr: 0, remote_len: 8,
    ///     local: vec![buf.all()],
    ///     flags: 0, user_token: 0,
    /// };
    /// # let _ = rds_sock::SendFlags { rdma: Some(op), ..Default::default() };
    /// ```
    pub rdma: Option<rds_core::RdmaOp>,
}

/// What `recvmsg` returned besides the bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvMeta {
    /// The return value: bytes copied, or with [`RecvFlags::trunc`] the
    /// message's full length. 0 for a notification.
    pub len: usize,
    /// Sender (`msg_name`); `None` for a notification.
    pub from: Option<SocketAddr>,
    /// MSG_TRUNC in `msg_flags`: the message was longer than the buffer.
    pub truncated: bool,
    /// SO_TIMESTAMP: when the message was queued to the socket.
    pub timestamp: Option<SystemTime>,
    /// `RDS_CMSG_CONG_UPDATE`: port groups that became uncongested.
    pub cong_update: Option<u64>,
    /// `RDS_CMSG_RDMA_STATUS`: (user token, status) of an RDMA operation.
    pub rdma_status: Option<(u64, i32)>,
    /// `RDS_CMSG_RDMA_DEST`: cookie the sender announced.
    pub rdma_dest: Option<u64>,
}

#[derive(Default)]
struct Local {
    nonblocking: bool,
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
}

/// A reliable datagram socket (AF_RDS, SOCK_SEQPACKET).
///
/// One socket talks to any number of peers: bind it to a local address and
/// port, then send datagrams to any `address:port`; each datagram arrives
/// exactly once, in order per (source socket, destination socket), or not at
/// all if the destination never becomes reachable. Errors carry the Linux
/// kernel's errno values.
///
/// ```no_run
/// use rds_sock::RdsSocket;
/// let a = RdsSocket::new()?;
/// a.bind("127.0.0.1:4000".parse().unwrap())?;
/// a.send_to(b"hello", "127.0.0.2:5000".parse().unwrap())?;
/// let mut buf = [0u8; 1024];
/// let (n, from) = a.recv_from(&mut buf)?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct RdsSocket {
    engine: Engine,
    id: SockId,
    shared: Arc<SockShared>,
    local: Mutex<Local>,
}

impl std::fmt::Debug for RdsSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdsSocket").field("local", &self.local_addr().ok()).finish()
    }
}

fn err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e.0)
}

/// How a send waits while the core answers `EAGAIN` or `ENOBUFS`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SendWait {
    /// It does not: the error is the caller's (a non-blocking send).
    No,
    /// On the socket's condition variable (the Rust API's blocking send).
    Condvar,
    /// In a `ppoll` that a signal interrupts ([`RdsSocket::send_msg_wait`]).
    Interruptible,
}

impl RdsSocket {
    /// A socket of the process-wide engine ([`Engine::global`]).
    pub fn new() -> io::Result<RdsSocket> {
        Engine::global()?.socket()
    }

    pub(crate) fn with_engine(engine: Engine) -> io::Result<RdsSocket> {
        if engine.is_stopped() {
            return Err(err(Errno::ESHUTDOWN));
        }
        let (id, shared) = engine.register_sock()?;
        Ok(RdsSocket { engine, id, shared, local: Mutex::new(Local::default()) })
    }

    /// The engine (node) this socket belongs to.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    fn run<R>(&self, f: impl FnOnce(&mut rds_core::Node) -> R) -> R {
        self.engine.inner.run(f)
    }

    fn live(&self) -> io::Result<()> {
        if self.engine.is_stopped() { Err(err(Errno::ESHUTDOWN)) } else { Ok(()) }
    }

    /// Binds to a local address and port (port 0 picks a free one). The
    /// engine starts serving the address if it does not yet. EINVAL for an
    /// unspecified, broadcast or multicast address or a second bind;
    /// EADDRNOTAVAIL for an address this host does not have; EADDRINUSE for
    /// a taken port, or an address another process serves.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        self.live()?;
        // The address not served (yet, when another thread is starting to
        // serve it): `serve` starts serving it, or waits for the thread
        // that does and returns (it holds the engine's serve lock), then
        // the bind is tried again and its answer stands. Asking the node
        // whether the address is local instead, after the first answer,
        // let a bind that lost that race return its stale EADDRNOTAVAIL.
        match self.run(|n| n.bind(self.id, addr)) {
            Err(Errno::EADDRNOTAVAIL) => {
                self.engine.serve(addr.ip())?;
                self.run(|n| n.bind(self.id, addr)).map(|_| ()).map_err(err)
            }
            // SO_RDS_TRANSPORT chose a transport and the address is not
            // served yet: serve it (IB too where a device has it), then the
            // chosen transport's laddr_check decides (ENOPROTOOPT).
            Err(Errno::ENOPROTOOPT) => {
                self.engine.serve(addr.ip()).map_err(|_| err(Errno::ENOPROTOOPT))?;
                self.run(|n| n.bind(self.id, addr)).map(|_| ()).map_err(err)
            }
            r => r.map(|_| ()).map_err(err),
        }
    }

    /// The bound address; 0.0.0.0:0 before `bind`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.run(|n| n.local_addr(self.id)).unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)))
    }

    /// Sets the default destination for [`RdsSocket::send`].
    pub fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        self.run(|n| n.connect(self.id, addr)).map_err(err)
    }

    /// The destination set by `connect`; ENOTCONN if none.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.run(|n| n.peer_addr(self.id)).ok_or_else(|| err(Errno::ENOTCONN))
    }

    /// Sends one datagram to `dst`.
    pub fn send_to(&self, buf: &[u8], dst: SocketAddr) -> io::Result<usize> {
        self.send_msg(buf, Some(dst), &SendFlags::default())
    }

    /// Sends one datagram to the `connect`ed destination.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.send_msg(buf, None, &SendFlags::default())
    }

    /// `sendmsg`. Blocking sockets wait while the send buffer is full or the
    /// destination port is congested (up to the write timeout: ETIMEDOUT);
    /// non-blocking ones fail with EAGAIN or ENOBUFS. EMSGSIZE above 1 MiB
    /// or above half the send buffer (the kernel's accounting).
    pub fn send_msg(&self, buf: &[u8], dst: Option<SocketAddr>, flags: &SendFlags) -> io::Result<usize> {
        self.live()?;
        self.send_payload(crate::copy::payload_of(buf), dst, flags)
    }

    /// `sendmsg` that blocks until `deadline` ([`Deadline`]; past it,
    /// `ETIMEDOUT`) whatever the socket's own blocking mode and
    /// timeout, while the send buffer is full or the destination port is
    /// congested, and that a signal interrupts (`EINTR`), as the kernel's
    /// blocking `sendmsg` (its socket wait and `rds_cong_wait` are
    /// interruptible). The C ABI's blocking send. It waits for the event
    /// that lets the send go on (room in the send buffer, a congestion map
    /// update), in a `ppoll` (the `wait` module), not a sleep.
    pub fn send_msg_wait(
        &self,
        buf: &[u8],
        dst: Option<SocketAddr>,
        flags: &SendFlags,
        deadline: impl Into<Deadline>,
    ) -> io::Result<usize> {
        self.live()?;
        self.send_loop(crate::copy::payload_of(buf), dst, flags, SendWait::Interruptible, deadline.into())
    }

    /// Sends a payload the caller already owns (no copy).
    pub fn send_payload(&self, payload: Payload, dst: Option<SocketAddr>, flags: &SendFlags) -> io::Result<usize> {
        let (blocking, timeout) = {
            let l = self.local.lock();
            (!l.nonblocking && !flags.dontwait, l.write_timeout)
        };
        let deadline = Deadline::after(timeout);
        let wait = if blocking { SendWait::Condvar } else { SendWait::No };
        self.send_loop(payload, dst, flags, wait, deadline)
    }

    /// The send, and for a blocking one its waits ([`SendWait`]) while
    /// the core answers `EAGAIN` or `ENOBUFS`. A blocking send registers
    /// with the core as the kernel's does (a writer to wake on room or on
    /// a congestion map update; `cong_send_blocked`), so the wait ends on
    /// that wake-up.
    fn send_loop(
        &self,
        payload: Payload,
        dst: Option<SocketAddr>,
        flags: &SendFlags,
        wait: SendWait,
        mut deadline: Deadline,
    ) -> io::Result<usize> {
        self.check_rdma_send(flags.rdma.as_ref(), flags.rdma_dest)?;
        let blocking = wait != SendWait::No;
        let opts = SendOptions { rdma: flags.rdma.clone(), rdma_dest: flags.rdma_dest, blocking };
        // Whether this send may leave its write for the program's next
        // ones (`crate::batch`): this thread received from the socket last.
        let may_batch = crate::batch::receiving(&self.shared);
        loop {
            let snap = self.shared.snapshot();
            let r = self.engine.inner.run_send(|n| {
                let r = n.send(self.id, dst, &payload, &opts);
                if may_batch && r.is_ok() {
                    let queued = n.recv_queued(self.id);
                    if queued > 0 {
                        crate::batch::start(queued);
                    }
                }
                r
            });
            crate::batch::sent();
            // Stored only when it changes: a stream's sends do not write
            // the line the receiving thread's waits read.
            if r.is_ok() && !self.shared.sent_since_wait.load(std::sync::atomic::Ordering::Relaxed) {
                self.shared.sent_since_wait.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            match r {
                Err(e @ (Errno::EAGAIN | Errno::ENOBUFS)) if blocking => {
                    // EAGAIN: the send buffer is full (ENOBUFS: the port
                    // is congested, which only a map update ends).
                    let acks = if e == Errno::EAGAIN { self.ack_pair(dst) } else { None };
                    self.wait_to_send(snap, wait, &mut deadline, acks)?;
                    self.live()?;
                }
                r => return r.map_err(err),
            }
        }
    }

    /// The TCP address pair whose acks make room for a send to `dst` (or
    /// to the connected address): our bound address and its.
    fn ack_pair(&self, dst: Option<SocketAddr>) -> Option<(IpAddr, IpAddr)> {
        let to = dst.or_else(|| self.peer_addr().ok())?;
        Some((self.local_addr().ok()?.ip(), to.ip()))
    }

    /// A blocking send's wait for the wake-up after `snap` (room in the
    /// send buffer, a congestion map update), until `deadline` (a timeout
    /// starts with the send's first wait). With
    /// `acks` (the send buffer is full), it polls that pair's TCP acks
    /// itself and waits between polls at most [`ACK_NAP_MIN`], doubling to
    /// [`ACK_NAP_MAX`] (and on to [`ACK_NAP_IDLE`] after
    /// [`ACK_NAP_PATIENCE`] fruitless polls), while a TCP path of the pair is up (else only the
    /// wake-up ends it): the kernel learns of an ack in its TCP's
    /// `sk_write_space` and wakes the sender at once, ours polls
    /// `SIOCOUTQ`, and a sender that waited for the reactor's ack timer
    /// idled with only two 64 KiB messages in its send buffer (qperf
    /// `rds_bw`).
    fn wait_to_send(
        &self,
        snap: u64,
        wait: SendWait,
        deadline: &mut Deadline,
        mut acks: Option<(IpAddr, IpAddr)>,
    ) -> io::Result<()> {
        crate::batch::release();
        let deadline = deadline.start();
        let (mut nap, mut fruitless) = (ACK_NAP_MIN, 0u32);
        loop {
            if let Some((l, f)) = acks {
                match self.engine.inner.poll_pair_acks(l, f) {
                    Some(true) => return Ok(()),
                    Some(false) => {}
                    // No TCP path up: only the wake-up can end the wait.
                    None => acks = None,
                }
                if self.shared.snapshot() != snap {
                    return Ok(());
                }
            }
            let until = match acks.and_then(|_| Instant::now().checked_add(nap)) {
                Some(n) => Some(deadline.map_or(n, |d| d.min(n))),
                None => deadline,
            };
            let woke = if wait == SendWait::Interruptible {
                match crate::wait::wait_events(&self.shared, snap, until) {
                    Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => false,
                    r => r.map(|()| true)?,
                }
            } else {
                self.shared.wait(snap, until)
            };
            if woke {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(err(Errno::ETIMEDOUT));
            }
            if nap >= ACK_NAP_MAX {
                fruitless += 1;
            }
            let cap = if fruitless >= ACK_NAP_PATIENCE { ACK_NAP_IDLE } else { ACK_NAP_MAX };
            nap = (nap * 2).min(cap);
        }
    }

    fn recv_inner(&self, flags: RecvFlags) -> io::Result<Received> {
        self.live()?;
        let (blocking, timeout) = {
            let l = self.local.lock();
            (!l.nonblocking && !flags.dontwait, l.read_timeout)
        };
        let mut deadline = Deadline::after(timeout);
        loop {
            let snap = self.shared.snapshot();
            match self.engine.inner.run_recv(&self.shared, self.id, |n| n.recv(self.id, flags.peek)) {
                Ok(Received::Data(inc)) if !flags.peek => {
                    self.took(&inc);
                    return Ok(Received::Data(inc));
                }
                Err(Errno::EAGAIN) => {
                    // Nothing to read: the program goes to wait, here or
                    // in its own poll (held replies go out first).
                    crate::batch::release();
                    if !blocking {
                        return Err(err(Errno::EAGAIN));
                    }
                    if !self.shared.wait(snap, deadline.start()) {
                        return Err(err(Errno::ETIMEDOUT));
                    }
                    self.live()?;
                }
                r => return r.map_err(err),
            }
        }
    }

    /// What a receive that took datagram `inc` off the socket does
    /// besides returning it.
    fn took(&self, inc: &Incoming) {
        crate::batch::received_from(&self.shared);
        self.rdma_unuse(&inc.header);
        *self.shared.rx_hint.lock() = Some((inc.to.ip(), inc.from.ip()));
    }

    /// `recvmsg`: copies the next datagram into `buf` (truncating, see
    /// [`RecvMeta`]), or returns a notification with `len` 0.
    pub fn recv_msg(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<RecvMeta> {
        Ok(meta_of(self.recv_inner(flags)?, buf, flags))
    }

    /// Receives one datagram: (bytes copied, sender). A longer datagram is
    /// truncated to the buffer (and consumed), as with a kernel socket.
    /// Notifications (congestion updates, RDMA status) are skipped here;
    /// use [`RdsSocket::recv_msg`] to see them.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        loop {
            let m = self.recv_msg(buf, RecvFlags::default())?;
            if let Some(from) = m.from {
                return Ok((m.len, from));
            }
        }
    }

    /// Receives one datagram without copying it: (payload, sender).
    pub fn recv_payload(&self) -> io::Result<(Payload, SocketAddr)> {
        loop {
            if let Received::Data(inc) = self.recv_inner(RecvFlags::default())? {
                return Ok((inc.payload, inc.from));
            }
        }
    }

    /// Non-blocking mode (O_NONBLOCK): EAGAIN instead of waiting.
    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.local.lock().nonblocking = on;
        Ok(())
    }

    /// SO_RCVTIMEO; a timed-out receive fails with ETIMEDOUT, as the kernel's
    /// RDS does. `None` waits forever, and so does a timeout too long to
    /// reach (`Duration::MAX`), as the kernel's `MAX_SCHEDULE_TIMEOUT`.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(err(Errno::EINVAL));
        }
        self.local.lock().read_timeout = t;
        Ok(())
    }

    /// SO_SNDTIMEO; a timed-out send fails with ETIMEDOUT. `None`, or a
    /// timeout too long to reach, waits forever.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t == Some(Duration::ZERO) {
            return Err(err(Errno::EINVAL));
        }
        self.local.lock().write_timeout = t;
        Ok(())
    }

    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.local.lock().read_timeout)
    }

    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.local.lock().write_timeout)
    }

    fn setopt(&self, o: SockOpt) -> io::Result<()> {
        self.run(|n| n.setsockopt(self.id, o)).map_err(err)
    }

    fn getopt(&self, o: SockOpt) -> io::Result<u64> {
        self.run(|n| n.getsockopt(self.id, o)).map_err(err)
    }

    /// `getsockopt` of any option the core owns, as the kernel reports it
    /// (the argument of `o` is ignored): buffers doubled, the transport as
    /// its uapi number, booleans as 0 / 1, the TOS (SIOCRDSGETTOS). For the
    /// C ABI, which answers getsockopt for every option.
    pub fn option(&self, o: SockOpt) -> io::Result<u64> {
        self.getopt(o)
    }

    /// SO_SNDBUF: the kernel doubles the value and caps it at
    /// `net.core.wmem_max`; at most half of it may be queued (unacked).
    pub fn set_send_buffer_size(&self, n: usize) -> io::Result<()> {
        self.setopt(SockOpt::SndBuf(n.min(u32::MAX as usize) as u32))
    }

    /// SO_SNDBUFFORCE: as SO_SNDBUF without the `wmem_max` cap.
    pub fn set_send_buffer_size_force(&self, n: usize) -> io::Result<()> {
        self.setopt(SockOpt::SndBufForce(n.min(u32::MAX as usize) as u32))
    }

    /// SO_SNDBUF as getsockopt reports it (doubled).
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        self.getopt(SockOpt::SndBuf(0)).map(|v| v as usize)
    }

    /// SO_RCVBUF: doubled and capped at `net.core.rmem_max`; the socket is
    /// congested while more than half of it is queued.
    pub fn set_recv_buffer_size(&self, n: usize) -> io::Result<()> {
        self.setopt(SockOpt::RcvBuf(n.min(u32::MAX as usize) as u32))
    }

    /// SO_RCVBUFFORCE.
    pub fn set_recv_buffer_size_force(&self, n: usize) -> io::Result<()> {
        self.setopt(SockOpt::RcvBufForce(n.min(u32::MAX as usize) as u32))
    }

    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.getopt(SockOpt::RcvBuf(0)).map(|v| v as usize)
    }

    /// SO_RDS_TRANSPORT with the uapi number: once, before bind
    /// (EOPNOTSUPP after), EINVAL out of range, ENOPROTOOPT for a transport
    /// this build cannot use.
    pub fn set_transport_raw(&self, v: i32) -> io::Result<()> {
        self.setopt(SockOpt::Transport(v))
    }

    /// SO_RDS_TRANSPORT.
    pub fn set_transport(&self, kind: TransportKind) -> io::Result<()> {
        self.set_transport_raw(kind.uapi() as i32)
    }

    /// SO_RDS_TRANSPORT as getsockopt reports it: the uapi number, or
    /// `RDS_TRANS_NONE` (0xffffffff) before bind.
    pub fn transport_raw(&self) -> io::Result<u32> {
        self.getopt(SockOpt::Transport(0)).map(|v| v as u32)
    }

    /// RDS_CONG_MONITOR: congestion-update notifications through recv_msg.
    pub fn set_cong_monitor(&self, on: bool) -> io::Result<()> {
        self.setopt(SockOpt::CongMonitor(on))
    }

    /// RDS_RECVERR.
    pub fn set_recverr(&self, on: bool) -> io::Result<()> {
        self.setopt(SockOpt::RecvErr(on))
    }

    /// SO_TIMESTAMP: receive times in [`RecvMeta::timestamp`].
    pub fn set_timestamp(&self, on: bool) -> io::Result<()> {
        self.setopt(SockOpt::Timestamp(on))
    }

    /// SIOCRDSSETTOS; only before the socket has a connection.
    pub fn set_tos(&self, tos: u8) -> io::Result<()> {
        self.setopt(SockOpt::Tos(tos))
    }

    /// RDS_CANCEL_SENT_TO: drops every message of this socket to `dst`
    /// still queued or unacked; returns how many.
    pub fn cancel_sent_to(&self, dst: SocketAddr) -> io::Result<usize> {
        if self.run(|n| n.local_addr(self.id)).is_none() {
            return Err(err(Errno::ENOTCONN));
        }
        Ok(self.run(|n| n.drop_messages(self.id, Some(dst))))
    }

    /// The socket's readiness as `poll` would report it.
    pub fn readiness(&self) -> Readiness {
        self.run(|n| n.readiness(self.id))
    }

    /// Messages dropped because their peer restarted before acking them.
    pub fn flushed(&self) -> u64 {
        self.run(|n| n.flushed(self.id))
    }

    /// Waits until every message this socket sent was acked by its peer
    /// (or dropped), at most `timeout`. Returns whether it got there.
    pub fn flush(&self, timeout: Duration) -> bool {
        // A timeout too long to be an instant never expires.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            if self.run(|n| n.pending_messages(self.id)) == 0 {
                return true;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The socket's id in its engine.
    pub fn id(&self) -> SockId {
        self.id
    }

    /// `recvmsg` that blocks until `deadline` ([`Deadline`]; past it,
    /// `ETIMEDOUT`) whatever the socket's own blocking mode and
    /// timeout; a signal makes it fail with `EINTR` (it waits in `poll`,
    /// which no signal restarts; calling it again restarts the wait). The
    /// C ABI's blocking receive.
    ///
    /// While it waits it polls, beside the socket's descriptor, the TCP
    /// connections of the address pair its last message came over (the one
    /// its last message came on, once a wait learnt it; all of them before
    /// that, and in the wait after one that a message coming
    /// through the reactor woke), and reads what arrives on them itself
    /// ([`rds_tcp::RxAssist`]): a message
    /// then wakes one thread, this one, instead of the reactor and then
    /// this one, and moves the descriptor neither up nor down when this
    /// receive takes it, nor for the messages the same read delivered
    /// beside it while the receives that follow take them (within
    /// `rds_tcp::ASSIST_LINGER` a wait on the descriptor elsewhere sees
    /// them: rds-sock's `engine/owed.rs`); a receive that does not peek takes it in the
    /// node call that delivered it (the socket's next message, under the
    /// same lock: one node call per message fewer). When the socket sent a message since its previous
    /// wait (it waits for an answer), that lane's bytes also stop waking
    /// the reactor while it waits, and for `rds_tcp::ASSIST_LINGER` after
    /// (the next such wait takes it over: no system call), which a
    /// receiver of a one-way stream does not ask for. When a read of a
    /// socket that sent nothing since its previous wait takes a stream
    /// (more than one message, or 16 KiB or more), the next 64 waits leave
    /// the reading to the reactor, which reads ahead while this thread
    /// works through the queue.
    pub fn recv_msg_wait(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        deadline: impl Into<Deadline>,
    ) -> io::Result<RecvMeta> {
        let flags = RecvFlags { dontwait: true, ..flags };
        let mut deadline = deadline.into();
        let mut wait = self.known_empty(&deadline);
        let r = loop {
            if wait {
                if let Err(e) = self.wait_readable(&mut deadline, !flags.peek) {
                    break Err(e);
                }
                // What the wait's own read delivered, taken for this
                // receive under the lock that delivered it.
                if let Some(r) = self.shared.taken.lock().take() {
                    if let Received::Data(inc) = &r {
                        self.took(inc);
                    }
                    break Ok(meta_of(r, buf, flags));
                }
            }
            match self.recv_msg(buf, flags) {
                Err(e) if e.raw_os_error() == Some(Errno::EAGAIN.0) => wait = true,
                r => break r,
            }
        };
        self.engine.inner.settle_unless_owed(&self.shared, self.id);
        r
    }

    /// Whether a blocking receive may wait before it first looks: the
    /// socket's descriptor is kept in sync ([`AsRawFd`]) and shows it not
    /// readable, with no update of it left for later (`deferred`), no
    /// deadline (one that passed returns what is queued, as before; a
    /// short timeout could pass before a message queued just now shows on
    /// the descriptor) and the engine running. A look that could only find nothing costs a node
    /// call. A message queued since the descriptor's last update is on its
    /// way to it (the wake-up is dispatched after the node lock): it turns
    /// readable and the wait ends at once.
    fn known_empty(&self, deadline: &Deadline) -> bool {
        deadline.is_never() && self.shared.fd_shows_empty() && self.live().is_ok()
    }

    /// Waits until the socket may be readable: its descriptor is
    /// readable, or this thread read and delivered messages itself (see
    /// [`RdsSocket::recv_msg_wait`]); with `take`, the socket's next
    /// message, when this thread's read delivered one, is taken for the
    /// receive under the lock that delivered it, into
    /// `SockShared::taken`.
    fn wait_readable(&self, deadline: &mut Deadline, take: bool) -> io::Result<()> {
        crate::batch::release();
        // A timeout that starts here: its first poll takes its whole
        // length, with no second clock read.
        let (deadline, first) = deadline.start_polling();
        let mut first = first.map(poll::millis);
        let mut fds = [libc::pollfd { fd: self.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        let mut assist = self.assist_begin();
        let mut set = poll::PollSet::new();
        loop {
            let ms = match (deadline, first.take()) {
                (None, _) => -1,
                (Some(_), Some(ms)) => ms,
                (Some(d), None) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(err(Errno::ETIMEDOUT));
                    }
                    poll::millis(left)
                }
            };
            // The message it reads comes to this thread's receive, which
            // brings the descriptor up to date (`defer`).
            let reads = if take { poll::Reads::Take } else { poll::Reads::Defer };
            let round = self.poll_round(&mut fds, 0, &mut assist, &mut set, ms, reads)?;
            if round.read {
                self.owe_unless_settled(&mut assist);
                return Ok(());
            }
            if round.ready > 0 {
                return Ok(());
            }
            if round.polled == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(err(Errno::ETIMEDOUT));
            }
            self.live()?;
        }
    }
}

/// What a receive into `buf` returns for `r` ([`RdsSocket::recv_msg`]):
/// a datagram copied (truncated to `buf`), or a notification with `len` 0.
fn meta_of(r: Received, buf: &mut [u8], flags: RecvFlags) -> RecvMeta {
    match r {
        Received::Data(inc) => {
            let n = inc.payload.len().min(buf.len());
            crate::copy::copy_bytes(&mut buf[..n], &inc.payload[..n]);
            let truncated = inc.payload.len() > buf.len();
            RecvMeta {
                len: if flags.trunc { inc.payload.len() } else { n },
                from: Some(inc.from),
                truncated,
                timestamp: inc.timestamp_ns.map(|ns| SystemTime::UNIX_EPOCH + Duration::from_nanos(ns)),
                rdma_dest: inc.rdma_dest,
                ..RecvMeta::default()
            }
        }
        Received::CongUpdate { mask } => RecvMeta { cong_update: Some(mask), ..RecvMeta::default() },
        Received::RdmaStatus { user_token, status } => {
            RecvMeta { rdma_status: Some((user_token, status)), ..RecvMeta::default() }
        }
    }
}

impl AsRawFd for RdsSocket {
    /// A descriptor that is readable and writable exactly when the socket
    /// is (see the readiness module): usable with poll, epoll, mio, tokio.
    /// Reading or writing it does nothing useful; use the socket's methods.
    fn as_raw_fd(&self) -> RawFd {
        self.engine.inner.ready_fd(&self.shared, self.id)
    }
}

impl AsFd for RdsSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor lives as long as the socket's shared state,
        // which this socket keeps alive.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl Drop for RdsSocket {
    fn drop(&mut self) {
        crate::batch::release();
        self.rdma_drop_keys();
        self.engine.unregister_sock(self.id);
    }
}
