//! The accepting side of the verbs-only setup: [`SideListener`], its
//! handshake threads and their bounds (see [`super`]).

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::sync::mpsc;

use crate::proto::sidechannel::Server;

use super::*;

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
    Up(Box<IbConnection>, T),
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
    Done { ticket: u64, res: io::Result<Box<IbConnection>> },
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
    res: Option<io::Result<Box<IbConnection>>>,
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
) -> io::Result<IbConnection> {
    let deadline = Instant::now() + timeout;
    let pi = verbs.port_for_ip(local)?;
    debug_port("accept", local, from, &pi);
    let psn = random_psn()?;
    let mut conn = IbConnection::build_side(verbs, &pi, sock)?;
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
mod tests;
