//! The bed every hostile test runs on, and what the tests share.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rds_core::wire::{Header, MAX_MSG_SIZE, RDS_TCP_PORT};
use rds_sock::{Engine, EngineConfig, RdsSocket, RecvFlags};
use rds_tests::*;

/// The node's socket the hostile traffic goes to.
pub(crate) const TARGET: u16 = 4000;
/// The node's socket that receives the valid message after each reset.
pub(crate) const CHECK: u16 = 4001;
/// The node's socket that echoes the honest peer's pings.
pub(crate) const ECHO: u16 = 4002;
/// The honest peer's socket.
pub(crate) const HONEST: u16 = 5000;
/// The hostile peer's RDS source port.
pub(crate) const SPORT: u16 = 7777;
/// Bound of every wait for something that should happen at once.
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// Round trips the honest peer completes at least, concurrently.
pub(crate) const ROUND_TRIPS: u64 = 200;

pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

pub(crate) fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// All counters of an engine at one moment.
pub(crate) struct Counts(pub(crate) HashMap<String, u64>);

impl Counts {
    pub(crate) fn of(e: &Engine) -> Counts {
        Counts(e.counters().into_iter().collect())
    }
    pub(crate) fn get(&self, name: &str) -> u64 {
        *self.0.get(name).unwrap_or_else(|| panic!("no counter {name}"))
    }
    pub(crate) fn delta(&self, before: &Counts, name: &str) -> u64 {
        self.get(name) - before.get(name)
    }
}

/// Waits (bounded) until counter `name` has grown by `want` since `before`;
/// returns the growth then, which the caller asserts on.
pub(crate) fn wait_delta(e: &Engine, before: &Counts, name: &str, want: u64) -> u64 {
    let until = Instant::now() + WAIT;
    loop {
        let d = Counts::of(e).delta(before, name);
        if d >= want || Instant::now() >= until {
            return d;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// How the hostile connection ended, seen by its reader.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum End {
    Eof,
    Reset,
    Error(io::ErrorKind),
}

/// The hostile peer: a raw TCP connection whose reader thread discards
/// what our node sends (its congestion map, a probe) and reports the end.
pub(crate) struct Raw {
    pub(crate) s: TcpStream,
    pub(crate) end: mpsc::Receiver<(End, u64)>,
    pub(crate) ended: Option<(End, u64)>,
}

impl Raw {
    pub(crate) fn connect(from: IpAddr, to: SocketAddr) -> Raw {
        let s = tcp_from(from, to, false).unwrap_or_else(|e| panic!("connect {from} -> {to}: {e}"));
        let mut r = s.try_clone().unwrap();
        let (tx, end) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            let mut total = 0u64;
            let end = loop {
                match r.read(&mut buf) {
                    Ok(0) => break End::Eof,
                    Ok(n) => total += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break End::Reset,
                    Err(e) => break End::Error(e.kind()),
                }
            };
            let _ = tx.send((end, total));
        });
        Raw { s, end, ended: None }
    }

    pub(crate) fn local(&self) -> SocketAddr {
        self.s.local_addr().unwrap()
    }

    pub(crate) fn write(&self, b: &[u8]) -> io::Result<()> {
        (&self.s).write_all(b)
    }

    /// How the connection ended, waiting up to `within`; `None` if it is
    /// still open.
    pub(crate) fn ended(&mut self, within: Duration) -> Option<&End> {
        if self.ended.is_none() {
            self.ended = self.end.recv_timeout(within).ok();
        }
        self.ended.as_ref().map(|e| &e.0)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // Also ends the reader (which holds a duplicate of the descriptor).
        let _ = self.s.shutdown(Shutdown::Both);
    }
}

/// The honest peer's ping-pong with the node: the node's echo socket sends
/// every datagram back; the peer checks each answer's source, content and
/// order, and measures the round trip.
pub(crate) struct Honest {
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) done: Arc<AtomicU64>,
    pub(crate) echo: JoinHandle<Result<u64, String>>,
    pub(crate) pinger: JoinHandle<Result<(u64, Duration), String>>,
}

impl Honest {
    pub(crate) fn start(node: &Engine, node_ip: IpAddr, honest: &Engine, honest_ip: IpAddr) -> Honest {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let echo_sock = node.socket().unwrap();
        echo_sock.bind(sa(node_ip, ECHO)).unwrap();
        echo_sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let ping_sock = honest.socket().unwrap();
        ping_sock.bind(sa(honest_ip, HONEST)).unwrap();
        ping_sock.set_read_timeout(Some(WAIT)).unwrap();
        let echo = {
            let stop = stop.clone();
            std::thread::spawn(move || -> Result<u64, String> {
                let mut buf = vec![0u8; 1 << 16];
                let mut n = 0;
                let deadline = Instant::now() + Duration::from_secs(300);
                while Instant::now() < deadline {
                    match echo_sock.recv_from(&mut buf) {
                        Ok((len, from)) => {
                            echo_sock.send_to(&buf[..len], from).map_err(|e| format!("echo {n}: {e}"))?;
                            n += 1;
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                            if stop.load(Ordering::SeqCst) {
                                break;
                            }
                        }
                        Err(e) => return Err(format!("echo after {n}: {e}")),
                    }
                }
                Ok(n)
            })
        };
        let pinger = {
            let (stop, done) = (stop.clone(), done.clone());
            std::thread::spawn(move || -> Result<(u64, Duration), String> {
                let to = sa(node_ip, ECHO);
                let mut buf = vec![0u8; 1 << 16];
                let mut max = Duration::ZERO;
                let deadline = Instant::now() + Duration::from_secs(300);
                let mut i = 0u64;
                while !(stop.load(Ordering::SeqCst) && i >= ROUND_TRIPS) && i < 1_000_000 {
                    if Instant::now() > deadline {
                        return Err(format!("only {i} round trips in 300 s"));
                    }
                    let p = payload(11, i, 16 + (i as usize * 97) % 2000);
                    let t = Instant::now();
                    ping_sock.send_to(&p, to).map_err(|e| format!("ping {i}: {e}"))?;
                    let (len, from) = ping_sock.recv_from(&mut buf).map_err(|e| format!("pong {i}: {e}"))?;
                    max = max.max(t.elapsed());
                    if from != to {
                        return Err(format!("pong {i} from {from}"));
                    }
                    check_payload(11, i, &buf[..len])?;
                    if len != p.len() {
                        return Err(format!("pong {i}: {len} bytes, sent {}", p.len()));
                    }
                    i += 1;
                    done.store(i, Ordering::SeqCst);
                }
                Ok((i, max))
            })
        };
        Honest { stop, done, echo, pinger }
    }

    /// Waits (bounded) for the first round trip: the connection is up.
    pub(crate) fn wait_first(&self) {
        let until = Instant::now() + WAIT;
        while self.done.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < until, "the honest peer's first round trip did not complete");
            assert!(!self.pinger.is_finished(), "the honest peer stopped");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub(crate) fn finish(self, test: &str) {
        self.stop.store(true, Ordering::SeqCst);
        let (n, max) = self.pinger.join().unwrap().unwrap_or_else(|e| panic!("{test}: honest peer: {e}"));
        let echoed = self.echo.join().unwrap().unwrap_or_else(|e| panic!("{test}: node's echo: {e}"));
        assert_eq!(echoed, n, "{test}: the node echoed {echoed} datagrams for {n} round trips");
        assert!(n >= ROUND_TRIPS);
        println!(
            "{test}: honest peer: {n} round trips, each exact and in order; longest {:.2} ms",
            max.as_secs_f64() * 1e3
        );
    }
}

/// The node, the honest peer and the hostile address.
pub(crate) struct Bed {
    pub(crate) name: &'static str,
    pub(crate) hostile: IpAddr,
    pub(crate) node_ip: IpAddr,
    pub(crate) node: Engine,
    pub(crate) honest: Engine,
    pub(crate) target: RdsSocket,
    pub(crate) check: RdsSocket,
    pub(crate) traffic: Option<Honest>,
}

impl Bed {
    pub(crate) fn new(name: &'static str) -> Bed {
        Bed::with(name, EngineConfig::default())
    }

    /// The bed with the node's configuration `cfg`.
    pub(crate) fn with(name: &'static str, cfg: EngineConfig) -> Bed {
        let ip = addr_block(48);
        let (hostile, node_ip, honest_ip) = (ip(1), ip(2), ip(3));
        let node = Engine::new(cfg).unwrap();
        let honest = Engine::new(EngineConfig::default()).unwrap();
        let target = node.socket().unwrap();
        target.bind(sa(node_ip, TARGET)).unwrap();
        let check = node.socket().unwrap();
        check.bind(sa(node_ip, CHECK)).unwrap();
        check.set_read_timeout(Some(WAIT)).unwrap();
        let traffic = Honest::start(&node, node_ip, &honest, honest_ip);
        traffic.wait_first();
        Bed { name, hostile, node_ip, node, honest, target, check, traffic: Some(traffic) }
    }

    pub(crate) fn raw(&self) -> Raw {
        Raw::connect(self.hostile, sa(self.node_ip, RDS_TCP_PORT))
    }

    /// Another hostile address: 127.47.n.`host`, smaller than the node's
    /// (the smaller address is the side that connects).
    pub(crate) fn other(&self, host: u8) -> IpAddr {
        let IpAddr::V4(v4) = self.node_ip else { unreachable!() };
        let o = v4.octets();
        IpAddr::V4(Ipv4Addr::new(o[0], o[1] - 1, o[2], host))
    }

    /// The node's TCP connection with the peer socket `peer`.
    pub(crate) fn conn_of(&self, peer: SocketAddr) -> Option<rds_core::TransportConnInfo> {
        self.node.tcp_connections().into_iter().find(|c| c.peer == Some(peer))
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts::of(&self.node)
    }

    /// Messages and bytes queued on a socket of the node.
    pub(crate) fn queued(&self, port: u16) -> (usize, u64) {
        let s = self.node.sockets().into_iter().find(|s| s.bound == Some(sa(self.node_ip, port))).expect("socket");
        (s.recv_queue, s.rcv_bytes)
    }

    /// Closes a hostile connection that the node still has, and waits for
    /// the node to count its end.
    pub(crate) fn close(&self, raw: Raw) {
        let before = self.counts();
        drop(raw);
        let d = wait_delta(&self.node, &before, "conn_reset", 1);
        assert_eq!(d, 1, "{}: the node did not see the hostile peer's close", self.name);
    }

    /// A valid connection from the hostile address: its message (sequence
    /// 1) is delivered exactly once, from the right address and port.
    pub(crate) fn valid_again(&self, tag: u64) {
        let raw = self.raw();
        let p = payload(99, tag, 300);
        raw.write(&frame(Header::data(SPORT, CHECK, p.len() as u32), 1, &p)).unwrap();
        let mut buf = vec![0u8; 4096];
        let m = self.check.recv_msg(&mut buf, RecvFlags::default()).unwrap_or_else(|e| {
            panic!("{} ({tag}): a valid message after the reset was not delivered: {e}", self.name)
        });
        assert_eq!(m.from, Some(sa(self.hostile, SPORT)), "{}: source", self.name);
        assert_eq!(m.len, p.len());
        check_payload(99, tag, &buf[..m.len]).unwrap();
        assert_eq!(m.rdma_dest, None);
        // Exactly once.
        std::thread::sleep(Duration::from_millis(200));
        let again = self.check.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() });
        assert_eq!(
            again.map(|m| m.len).unwrap_err().raw_os_error(),
            Some(libc::EAGAIN),
            "{}: delivered twice",
            self.name
        );
        self.close(raw);
    }

    /// Waits (bounded) until a flood to TARGET is held back: the node
    /// paused its path (`recv_pause` grew since `before`) and TARGET's queue
    /// stopped growing. Returns that queue (messages, bytes).
    pub(crate) fn held_back(&self, before: &Counts) -> (usize, u64) {
        let paused = wait_until(Duration::from_secs(60), || self.counts().delta(before, "recv_pause") >= 1);
        assert!(paused, "the node never paused the flood's path ({:?} queued)", self.queued(TARGET));
        let mut last = self.queued(TARGET);
        let steady = wait_until(Duration::from_secs(30), || {
            std::thread::sleep(Duration::from_millis(300));
            let q = self.queued(TARGET);
            std::mem::replace(&mut last, q) == q
        });
        assert!(steady, "the queue kept growing");
        last
    }

    pub(crate) fn finish(mut self) {
        self.traffic.take().unwrap().finish(self.name);
        self.node.shutdown(Duration::ZERO);
        self.honest.shutdown(Duration::ZERO);
    }
}

/// A value of `key=` in a connection's detail string.
pub(crate) fn detail(c: &rds_core::TransportConnInfo, key: &str) -> u64 {
    let v = c
        .detail
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {}", c.detail));
    v.parse().unwrap_or_else(|_| panic!("{key}{v}"))
}

/// 64-bit FNV-1a.
pub(crate) fn fnv(mut h: u64, b: &[u8]) -> u64 {
    for &x in b {
        h = (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3);
    }
    h
}
pub(crate) const FNV0: u64 = 0xcbf2_9ce4_8422_2325;

/// Messages `first..first + count` of flow `flow` from the socket: each
/// exact, from `from`, in order; none more. Returns (bytes, FNV digest).
pub(crate) fn read_all(sock: &RdsSocket, from: SocketAddr, flow: u32, first: u64, count: u64) -> (u64, u64) {
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = vec![0u8; MAX_MSG_SIZE];
    let (mut bytes, mut h) = (0u64, FNV0);
    for i in first..first + count {
        let m =
            sock.recv_msg(&mut buf, RecvFlags::default()).unwrap_or_else(|e| panic!("flow {flow}: message {i}: {e}"));
        assert_eq!(m.from, Some(from), "flow {flow}: message {i}: source");
        check_payload(flow, i, &buf[..m.len]).unwrap_or_else(|e| panic!("message {i}: {e}"));
        bytes += m.len as u64;
        h = fnv(h, &buf[..m.len]);
    }
    let more = sock.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() });
    assert_eq!(
        more.map(|m| m.len).unwrap_err().raw_os_error(),
        Some(libc::EAGAIN),
        "flow {flow}: more messages than sent"
    );
    (bytes, h)
}

/// A legitimate 32 MiB transfer from the honest engine to the node (512
/// messages of 64 KiB, flow `flow`): (seconds, digest sent, digest
/// received). Each message is made just before it is sent and dropped
/// after: the transfer's own 32 MiB are never live at once, so a test that
/// measures the process's memory around it measures the RDS stack, not
/// freed test buffers the allocator kept (they once showed as 34 MiB of
/// growth, about a whole transfer, in a loaded suite run).
pub(crate) fn transfer(bed: &Bed, tx: &RdsSocket, rx: &RdsSocket, flow: u32) -> (f64, u64, u64) {
    const N: u64 = 512;
    const LEN: usize = 64 << 10;
    let to = rx.local_addr().unwrap();
    let from = tx.local_addr().unwrap();
    let t0 = Instant::now();
    let (sent, (got, digest)) = std::thread::scope(|sc| {
        let sender = sc.spawn(|| {
            let mut sent = FNV0;
            for i in 0..N {
                let m = payload(flow, i, LEN);
                sent = fnv(sent, &m);
                tx.send_to(&m, to).unwrap_or_else(|e| panic!("{}: send {i}: {e}", bed.name));
            }
            sent
        });
        let r = read_all(rx, from, flow, 0, N);
        (sender.join().unwrap(), r)
    });
    assert_eq!(got, N * LEN as u64);
    (t0.elapsed().as_secs_f64(), sent, digest)
}
