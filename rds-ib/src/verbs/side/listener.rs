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
