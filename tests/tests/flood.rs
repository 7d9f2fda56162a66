//! Peers and connections under attack, over real TCP on loopback (issue
//! "Hardened against hostile peers", items 4 and 7).
//!
//! * A connection flood: 3,000 TCP connections from 3,000 distinct
//!   127.61.x.y sources (half below the node's address, half above) to a
//!   node in a child process whose descriptors are limited to 1,024
//!   (`setrlimit`, as `ulimit -n 1024`). The node stays up, its descriptors
//!   and memory stay bounded, no thread spins (CPU time of the process
//!   over 3 s while the flood holds), a legitimate ping is answered, a new
//!   socket can still be opened and rds-info still answers; the refused and
//!   evicted peers are counted.
//! * Deferred connections: one whose slot is still held waits longer than
//!   the old connection's drain, and what the peer wrote on it is
//!   delivered; a peer gets at most npaths of them (the oldest replaced).
//! * Idle collection: a peer's connection that stays down is collected
//!   (seen in the snapshot), and the peer's next messages arrive once.
//!
//! The flood's node is this test binary itself, started again with
//! `FLOOD_CHILD` set (the test `flood_child` then runs the node).

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rds_core::wire::{Header, RDS_TCP_PORT};
use rds_sock::info::{ipc, sections};
use rds_sock::{Engine, EngineConfig, RdsSocket, RecvFlags};
use rds_tests::*;

/// Bound of every wait for something that should happen at once.
const WAIT: Duration = Duration::from_secs(10);

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// A TCP socket bound to `from` with a non-blocking connect to `to` under
/// way (a flood does not wait for each handshake).
fn connect_nb(from: IpAddr, to: SocketAddr) -> io::Result<TcpStream> {
    tcp_from(from, to, true)
}

/// A blocking connection from `from` to `to`.
fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let s = connect_nb(from, to).unwrap_or_else(|e| panic!("connect {from} -> {to}: {e}"));
    let until = Instant::now() + WAIT;
    loop {
        match s.peer_addr() {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotConnected && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("connect {from} -> {to}: {e}"),
        }
    }
    s.set_nonblocking(false).unwrap();
    s
}

fn counters(e: &Engine) -> HashMap<String, u64> {
    e.counters().into_iter().collect()
}

// ----------------------------------------------------------------------
// The connection flood
// ----------------------------------------------------------------------

/// The node's address: sources 127.61.1-6.* are below it, 127.61.129-134.*
/// above (the node then resets their connections and connects back once,
/// to nobody: the direction rule).
const FLOOD_NODE: [u8; 4] = [127, 61, 128, 1];
const FLOOD_PORT: u16 = 4000;
const FLOOD_CONNS: usize = 3000;
const FD_LIMIT: u64 = 1024;
/// The node of the test without a peer limit (sources 127.61.1-8.*).
const UNLIMITED_NODE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 61, 64, 1));

/// The node of the flood, in the child process: descriptors limited to
/// 1,024 before anything else, one echo socket, and a command loop on
/// stdin (`CHECK`: open and bind a new socket, report descriptors, memory
/// and counters; end of stdin: exit).
#[test]
fn flood_child() {
    if std::env::var_os("FLOOD_CHILD").is_none() {
        return;
    }
    let lim = libc::rlimit { rlim_cur: FD_LIMIT, rlim_max: FD_LIMIT };
    // SAFETY: setrlimit reads one rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0, "setrlimit");
    let mut node_ip = v4(FLOOD_NODE[0], FLOOD_NODE[1], FLOOD_NODE[2], FLOOD_NODE[3]);
    let mut cfg = EngineConfig::default();
    if std::env::var("FLOOD_CHILD").as_deref() == Ok("unlimited") {
        cfg.node.max_peers = usize::MAX;
        node_ip = UNLIMITED_NODE;
    }
    let engine = Engine::new(cfg).expect("engine");
    let echo = engine.socket().unwrap();
    echo.bind(SocketAddr::new(node_ip, FLOOD_PORT)).unwrap();
    echo.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let echo_thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let until = Instant::now() + Duration::from_secs(300);
        while Instant::now() < until {
            match echo.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let _ = echo.send_to(&buf[..n], from);
                }
                Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {}
                Err(e) if e.raw_os_error() == Some(libc::ESHUTDOWN) => break,
                Err(e) => {
                    println!("ERROR echo {e}");
                    break;
                }
            }
        }
    });
    println!("READY {}", std::process::id());
    let _ = io::stdout().flush();
    let mut extra = Vec::new();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim() == "CHECK" {
            let sock = engine.socket().and_then(|s| s.bind(SocketAddr::new(node_ip, 0)).map(|_| s));
            let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
            let c = counters(&engine);
            let get = |n: &str| c.get(n).copied().unwrap_or(u64::MAX);
            println!(
                "CHECK socket={} fds={} rss={} conns={} refused={} evicted={} collected={} shed={} nores={}",
                match &sock {
                    Ok(_) => "ok".to_string(),
                    Err(e) => format!("{}", e.raw_os_error().unwrap_or(-1)),
                },
                fds,
                rss_of("self"),
                engine.connections().len(),
                get("conn_refused_peer_limit"),
                get("conn_evicted_silent"),
                get("conn_collected"),
                get("tcp_accept_shed"),
                get("tcp_accept_no_resources"),
            );
            let _ = io::stdout().flush();
            extra.extend(sock.ok());
        }
    }
    drop(extra);
    engine.shutdown(Duration::ZERO);
    let _ = echo_thread.join();
}

/// User plus system CPU time of a process, seconds.
fn cpu_of(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 / hz
}

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// The child process; killed and reaped when dropped.
struct Node {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    pid: u32,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    fn start(mode: &str) -> Node {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "flood_child", "--nocapture", "--test-threads=1"])
            .env("FLOOD_CHILD", mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the node");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut n = Node { child, lines, pid: 0 };
        let ready = n.line("READY");
        n.pid = ready.split_whitespace().nth(1).unwrap().parse().unwrap();
        n
    }

    /// The next line with `what`, from there on (others, such as
    /// libtest's, are skipped); an ERROR line fails the test.
    fn line(&mut self, what: &str) -> String {
        let until = Instant::now() + WAIT;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let l = self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("no {what} line from the node"));
            assert!(!l.contains("ERROR"), "node: {l}");
            // (libtest may have written "test flood_child ... " first.)
            if let Some(at) = l.find(what) {
                return l[at..].to_string();
            }
        }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn check(&mut self) -> HashMap<String, String> {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "CHECK").unwrap();
        stdin.flush().unwrap();
        let l = self.line("CHECK");
        l.split_whitespace().skip(1).filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect()
    }
}

fn num(m: &HashMap<String, String>, k: &str) -> u64 {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{k} in {m:?}"))
}

/// A ping from `from` to the node, retried every 300 ms for at most `within`:
/// the pong must come from port 0 of the node, empty. Returns how long it
/// took.
fn ping(from: &RdsSocket, node: IpAddr, within: Duration) -> Option<Duration> {
    let t = Instant::now();
    from.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 64];
    while t.elapsed() < within {
        let _ = from.send_to(&[], SocketAddr::new(node, 0));
        if let Ok(m) = from.recv_msg(&mut buf, RecvFlags::default()) {
            if m.from == Some(SocketAddr::new(node, 0)) && m.len == 0 {
                return Some(t.elapsed());
            }
        }
    }
    None
}

#[test]
fn connection_flood_from_3000_sources_with_1024_descriptors() {
    let node_ip = v4(FLOOD_NODE[0], FLOOD_NODE[1], FLOOD_NODE[2], FLOOD_NODE[3]);
    let mut node = Node::start("1");
    let pid = node.pid;
    let (fds0, rss0) = (fds_of(pid), rss_of(&pid.to_string()));
    let to = SocketAddr::new(node_ip, RDS_TCP_PORT);
    // The legitimate peer, connected before the flood.
    let peer_ip = v4(127, 61, 200, 1);
    let peer = Engine::new(EngineConfig::default()).unwrap();
    let ps = peer.socket().unwrap();
    ps.bind(SocketAddr::new(peer_ip, 5000)).unwrap();
    assert!(ping(&ps, node_ip, WAIT).is_some(), "ping before the flood");

    // The flood, paced to the listener's backlog (64).
    let t0 = Instant::now();
    let mut flood = Vec::with_capacity(FLOOD_CONNS);
    for i in 0..FLOOD_CONNS {
        let half = i % 2;
        let k = i / 2;
        let (hi, lo) = ((k / 250) as u8, (k % 250) as u8 + 2);
        let src = if half == 0 { v4(127, 61, 1 + hi, lo) } else { v4(127, 61, 129 + hi, lo) };
        flood.push(connect_nb(src, to).unwrap_or_else(|e| panic!("flood connect {i} from {src}: {e}")));
        if i % 32 == 31 {
            std::thread::sleep(Duration::from_millis(10));
        }
        if i % 500 == 499 {
            assert!(node.alive(), "the node exited during the flood ({} connections)", i + 1);
        }
    }
    println!("flood: {FLOOD_CONNS} connects in {:.2} s", t0.elapsed().as_secs_f64());
    // Let it settle, then measure while the flood holds.
    std::thread::sleep(Duration::from_secs(3));
    let mut max_fds = 0;
    let mut max_rss = 0;
    let cpu0 = cpu_of(pid);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        max_fds = max_fds.max(fds_of(pid));
        max_rss = max_rss.max(rss_of(&pid.to_string()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let cpu = cpu_of(pid) - cpu0;
    let secs = t.elapsed().as_secs_f64();
    assert!(node.alive(), "the node exited under the flood");
    // A legitimate peer is still answered, a new socket opens, rds-info
    // answers.
    let pinged = ping(&ps, node_ip, WAIT);
    let c = node.check();
    let dir = ipc::runtime_dir();
    let snap =
        ipc::query(&dir.join(format!("{pid}.0.sock")), sections::NODE | sections::COUNTERS | sections::CONNECTIONS);
    println!(
        "flood held: node fds {fds0} -> max {max_fds} (limit {FD_LIMIT}), RSS {} -> max {} KiB, CPU {cpu:.2} s in {secs:.1} s; ping {pinged:?}; {c:?}",
        rss0 >> 10,
        max_rss >> 10
    );
    assert!(pinged.is_some(), "the legitimate ping was not answered under the flood");
    assert_eq!(c.get("socket").map(String::as_str), Some("ok"), "a new socket under the flood: {c:?}");
    let snap = snap.unwrap_or_else(|e| panic!("rds-info under the flood: {e}"));
    assert!(max_fds < 600, "descriptors: {max_fds} of {FD_LIMIT}");
    assert!(max_rss < rss0 + (64 << 20), "RSS grew from {rss0} to {max_rss}");
    assert!(cpu < 0.5, "the node used {cpu:.2} s of CPU in {secs:.1} s while the flood held: a spinning thread");
    // Every connection beyond the limit is counted, and the node keeps at
    // most its peer limit (1024 descriptors: 192) plus the legitimate peer.
    let (refused, evicted) = (num(&c, "refused"), num(&c, "evicted"));
    assert!(refused + evicted >= 1000, "refused {refused}, evicted {evicted}");
    assert!(snap.counter("conn_refused_peer_limit").is_some_and(|r| r >= refused), "rds-info's counters");
    assert!(snap.connections.len() <= 192 + 48 + 1, "{} connections", snap.connections.len());

    // The flood ends: the node is still there and answers.
    for s in &flood {
        let _ = s.shutdown(Shutdown::Both);
    }
    drop(flood);
    assert!(ping(&ps, node_ip, WAIT).is_some(), "ping after the flood");
    assert!(node.alive());
    peer.shutdown(Duration::ZERO);
}

/// Without a peer limit the flood exhausts the node's 1,024 descriptors:
/// the listener then sheds the backlog (accept with the reserve
/// descriptor, close at once, counted) and backs off instead of retrying
/// on a timer for ever; the process stays up without spinning, and the
/// peer that was connected before is still answered.
#[test]
fn descriptor_exhaustion_sheds_the_backlog_without_spinning() {
    let node_ip = UNLIMITED_NODE;
    let mut node = Node::start("unlimited");
    let pid = node.pid;
    let to = SocketAddr::new(node_ip, RDS_TCP_PORT);
    let peer_ip = v4(127, 61, 201, 1);
    let peer = Engine::new(EngineConfig::default()).unwrap();
    let ps = peer.socket().unwrap();
    ps.bind(SocketAddr::new(peer_ip, 5000)).unwrap();
    assert!(ping(&ps, node_ip, WAIT).is_some(), "ping before the flood");
    let mut flood = Vec::new();
    for i in 0..2000usize {
        let (hi, lo) = ((i / 250) as u8, (i % 250) as u8 + 2);
        flood.push(connect_nb(v4(127, 61, 1 + hi, lo), to).unwrap());
        if i % 32 == 31 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let cpu0 = cpu_of(pid);
    let t = Instant::now();
    let mut max_fds = 0;
    while t.elapsed() < Duration::from_secs(3) {
        max_fds = max_fds.max(fds_of(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let cpu = cpu_of(pid) - cpu0;
    assert!(node.alive(), "the node exited when out of descriptors");
    let pinged = ping(&ps, node_ip, WAIT);
    let c = node.check();
    println!("out of descriptors: max fds {max_fds}, CPU {cpu:.2} s in 3 s, ping {pinged:?}, {c:?}");
    assert!(num(&c, "nores") >= 1, "{c:?}");
    assert!(num(&c, "shed") >= 1, "the backlog was shed: {c:?}");
    assert!(cpu < 0.5, "{cpu:.2} s of CPU in 3 s out of descriptors");
    assert!(pinged.is_some(), "the connected peer is still answered");
    drop(flood);
    assert!(node.alive());
    peer.shutdown(Duration::ZERO);
}

// ----------------------------------------------------------------------
// Ping flood against a closed window
// ----------------------------------------------------------------------

/// A raw peer (the smaller address) sends up to 20,000 pings from 4 source
/// ports and never reads: the node's TCP send buffer (16 KiB here) and the
/// peer's window fill, and pongs wait in the node's send queue. At most
/// one waits per source port (the rest are coalesced, counted: every ping
/// read is answered or coalesced); memory stays flat.
#[test]
fn ping_flood_against_a_closed_window_queues_one_pong_per_port() {
    let ip = addr_block(65);
    let (peer_ip, node_ip) = (ip(1), ip(2));
    let mut cfg = EngineConfig::default();
    cfg.tcp.sndbuf = Some(16 << 10);
    let node = Engine::new(cfg).unwrap();
    let rx = node.socket().unwrap();
    rx.bind(SocketAddr::new(node_ip, 4000)).unwrap();
    let s = connect_nb(peer_ip, SocketAddr::new(node_ip, RDS_TCP_PORT)).unwrap();
    // A small window, set before the handshake.
    let small: libc::c_int = 4096;
    // SAFETY: setsockopt reads one int.
    unsafe {
        libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, (&raw const small).cast(), 4);
    }
    assert!(wait_until(WAIT, || s.peer_addr().is_ok()), "connect");
    s.set_nonblocking(false).unwrap();
    let rss0 = rss_of("self");
    let ports = [7001u16, 7002, 7003, 7004];
    let pings = 20_000u64;
    // The writer may block for good once both windows are closed (the
    // node's window updates then ride on segments outside the peer's
    // window, which its TCP drops): it runs on its own, and the node is
    // judged on the pings it did read.
    let ws = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut batch = Vec::new();
        for i in 0..pings {
            batch.extend(frame(Header::data(ports[(i % 4) as usize], 0, 0), i + 1, &[]));
        }
        let _ = (&ws).write_all(&batch);
    });
    let mut last = 0;
    let until = Instant::now() + WAIT;
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let n = counter(&node, "recv_ping");
        if n == pings || (n == last && n >= 2000) || Instant::now() > until {
            break;
        }
        last = n;
    }
    let read = counter(&node, "recv_ping");
    assert!(read >= 2000, "only {read} pings read");
    let snap = node.snapshot();
    let pongs: Vec<u16> =
        snap.send.iter().filter(|m| m.faddr == peer_ip && m.lport == 0 && m.len == 0).map(|m| m.fport).collect();
    let c = counters(&node);
    let grew = rss_of("self").saturating_sub(rss0);
    println!(
        "ping flood: {} pings, {} pongs queued {:?}, {} coalesced, {} on the wire unacked, RSS +{} KiB",
        c["recv_ping"],
        pongs.len(),
        pongs,
        c["send_pong_coalesced"],
        snap.retrans.iter().filter(|m| m.faddr == peer_ip).count(),
        grew >> 10
    );
    let mut sorted = pongs.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), pongs.len(), "one pending pong per port: {pongs:?}");
    assert!(pongs.iter().all(|p| ports.contains(p)), "{pongs:?}");
    assert!(c["send_pong_coalesced"] > read / 2, "{c:?}");
    assert_eq!(c["send_pong"] + c["send_pong_coalesced"], c["recv_ping"] + c["mprds_probe_sent"]);
    assert!(grew < 16 << 20, "RSS grew {grew}");
    let _ = s.shutdown(Shutdown::Both);
    writer.join().unwrap();
    node.shutdown(Duration::ZERO);
}

// ----------------------------------------------------------------------
// Deferred connections
// ----------------------------------------------------------------------

/// A peer (raw TCP from the smaller address) opens path 0 and speaks on it;
/// then a second connection arrives: before the multipath handshake it
/// waits (its slot is unknown). It keeps waiting past 2 s (the old default
/// expiry, which raced the 2 s drain of the old connection) while the old
/// connection stays up; then the old one closes, the new one takes path 0
/// and what the peer wrote on it at once is delivered, exactly once.
#[test]
fn a_deferred_connection_outlives_the_drain_and_its_data_is_delivered() {
    let ip = addr_block(62);
    let (peer_ip, node_ip) = (ip(1), ip(2));
    let node = Engine::new(EngineConfig::default()).unwrap();
    let rx = node.socket().unwrap();
    rx.bind(SocketAddr::new(node_ip, 4000)).unwrap();
    rx.set_read_timeout(Some(WAIT)).unwrap();
    let to = SocketAddr::new(node_ip, RDS_TCP_PORT);
    let mut first = connect_from(peer_ip, to);
    first.write_all(&frame(Header::data(7000, 4000, 5), 1, b"first")).unwrap();
    let mut buf = [0u8; 256];
    let m = rx.recv_msg(&mut buf, RecvFlags::default()).unwrap();
    assert_eq!(&buf[..m.len], b"first");
    let mut second = connect_from(peer_ip, to);
    second.write_all(&frame(Header::data(7000, 4000, 6), 2, b"second")).unwrap();
    // Deferred, not read: nothing arrives for 3 s.
    rx.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let e = rx.recv_msg(&mut buf, RecvFlags::default()).map(|m| m.len).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT));
    // The old connection ends: the deferred one is taken and read.
    first.shutdown(Shutdown::Both).unwrap();
    rx.set_read_timeout(Some(WAIT)).unwrap();
    let m = rx
        .recv_msg(&mut buf, RecvFlags::default())
        .unwrap_or_else(|e| panic!("the deferred connection's message was lost: {e}; counters {:?}", counters(&node)));
    assert_eq!(&buf[..m.len], b"second");
    assert_eq!(m.from, Some(SocketAddr::new(peer_ip, 7000)));
    rx.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    assert!(rx.recv_msg(&mut buf, RecvFlags::default()).is_err(), "delivered once");
    assert_eq!(counter(&node, "tcp_deferred_expired"), 0);
    assert_eq!(counter(&node, "tcp_deferred_replaced"), 0);
    drop(second);
    node.shutdown(Duration::ZERO);
}

/// A peer that keeps opening connections while its path 0 is up gets at
/// most npaths of them kept (unread, deferred); each further one replaces
/// the oldest, counted; the kept ones expire after the deferral limit
/// (counted), and the peer's path 0 keeps working throughout.
#[test]
fn deferred_connections_are_bounded_per_peer_and_expire() {
    let ip = addr_block(63);
    let (peer_ip, node_ip) = (ip(1), ip(2));
    let mut cfg = EngineConfig::default();
    cfg.tcp.defer_max = Duration::from_secs(3);
    let node = Engine::new(cfg).unwrap();
    let npaths = usize::from(node.snapshot().node.npaths);
    let rx = node.socket().unwrap();
    rx.bind(SocketAddr::new(node_ip, 4000)).unwrap();
    rx.set_read_timeout(Some(WAIT)).unwrap();
    let to = SocketAddr::new(node_ip, RDS_TCP_PORT);
    let mut first = connect_from(peer_ip, to);
    first.write_all(&frame(Header::data(7000, 4000, 1), 1, b"a")).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(rx.recv_msg(&mut buf, RecvFlags::default()).unwrap().len, 1);
    let extra = npaths + 12;
    let more: Vec<TcpStream> = (0..extra).map(|_| connect_from(peer_ip, to)).collect();
    assert!(
        wait_until(WAIT, || counter(&node, "tcp_deferred_replaced") >= (extra - npaths) as u64),
        "replaced {}",
        counter(&node, "tcp_deferred_replaced")
    );
    std::thread::sleep(Duration::from_millis(200));
    let c = counters(&node);
    assert_eq!(c["tcp_deferred_replaced"], (extra - npaths) as u64, "{c:?}");
    // The node's TCP sockets: path 0 plus nothing else (the deferred ones
    // are not serving paths).
    assert_eq!(node.tcp_connections().len(), 1);
    // Path 0 still works.
    first.write_all(&frame(Header::data(7000, 4000, 1), 2, b"b")).unwrap();
    let m = rx.recv_msg(&mut buf, RecvFlags::default()).unwrap();
    assert_eq!(&buf[..m.len], b"b");
    // The kept ones expire (the limit is at least the drain plus 1 s).
    assert!(
        wait_until(WAIT, || counter(&node, "tcp_deferred_expired") >= npaths as u64),
        "expired {}",
        counter(&node, "tcp_deferred_expired")
    );
    assert_eq!(counter(&node, "tcp_deferred_expired"), npaths as u64);
    drop(more);
    node.shutdown(Duration::ZERO);
}

// ----------------------------------------------------------------------
// Idle collection
// ----------------------------------------------------------------------

/// Two engines exchange messages; the peer's engine goes away; the node's
/// connection to it is collected after the idle time (snapshot and
/// counter); a new engine on the peer's address then sends, and every one
/// of its messages arrives exactly once, in order.
#[test]
fn an_idle_connection_is_collected_and_the_peer_returns() {
    let ip = addr_block(64);
    let (node_ip, peer_ip) = (ip(1), ip(2));
    let mut cfg = EngineConfig::default();
    cfg.node.conn_idle_gc = Some(Duration::from_secs(1));
    let node = Engine::new(cfg).unwrap();
    let rx = node.socket().unwrap();
    rx.bind(SocketAddr::new(node_ip, 4000)).unwrap();
    rx.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = vec![0u8; 4096];
    let mut expect = |peer: &Engine, round: u64| {
        let s = peer.socket().unwrap();
        s.bind(SocketAddr::new(peer_ip, 5000)).unwrap();
        for i in 0..100u64 {
            s.send_to(&payload(round as u32, i, 100 + i as usize), SocketAddr::new(node_ip, 4000)).unwrap();
        }
        for i in 0..100u64 {
            let m = rx
                .recv_msg(&mut buf, RecvFlags::default())
                .unwrap_or_else(|e| panic!("round {round}: message {i}: {e}"));
            assert_eq!(m.from, Some(SocketAddr::new(peer_ip, 5000)));
            check_payload(round as u32, i, &buf[..m.len]).unwrap();
        }
        s
    };
    let peer = Engine::new(EngineConfig::default()).unwrap();
    let s = expect(&peer, 1);
    assert!(node.snapshot().connection(node_ip, peer_ip).is_some());
    drop(s);
    assert!(peer.shutdown(Duration::from_secs(2)).messages() == 0);
    assert!(
        wait_until(WAIT, || node.snapshot().connection(node_ip, peer_ip).is_none()),
        "the connection was not collected"
    );
    assert_eq!(counter(&node, "conn_collected"), 1);
    // The peer returns (a new instance) and is served exactly once.
    let peer = Engine::new(EngineConfig::default()).unwrap();
    let _s = expect(&peer, 2);
    rx.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    assert!(rx.recv_msg(&mut buf, RecvFlags::default()).is_err(), "nothing more (no duplicate)");
    assert!(node.snapshot().connection(node_ip, peer_ip).is_some());
    peer.shutdown(Duration::ZERO);
    node.shutdown(Duration::ZERO);
}
