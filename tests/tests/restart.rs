//! Reliability under faults: `kill -9` of one node's process mid-stream,
//! then a new process on the same address and ports. The others reconnect
//! and continue, and nothing meant for the old instance reaches the new one.
//!
//! Three nodes on 127.49.n.1-3: A and B are engines in this process, C is a
//! child process (the `rds-node` binary). Flows, each checked for content
//! and order (`rds_tests::payload`, flow id `src << 8 | dst << 4 | kind`):
//!
//! * A <-> B (port 5000), paced, for the whole test: exact, in order, none
//!   lost or duplicated, and flowing while C is stopped, dead and restarted.
//! * A, B -> C (port 5001): epoch 1 (kind 1) streams until C dies; epoch 2
//!   (kind 2, 2,000 datagrams) is sent once A and B saw C's connections go
//!   down. Port 5002 (kind 3): 100 datagrams sent while C is dead.
//! * C -> A, B (port 5001): each C instance streams its own flow (kind = its
//!   instance number).
//!
//! The kill: C is first stopped (SIGSTOP), so that A's and B's streams fill
//! C's small TCP receive window, their own small TCP send buffers and their
//! sockets' send buffers: when C is killed (SIGKILL), datagrams are then
//! certainly in flight (written to C, not acked by its TCP) and others
//! queued behind them, never transmitted; and the state the test snapshots
//! before the kill (`Queue::Retrans`, `Queue::Send`) cannot move. A kill of
//! a running process has the same effect, but catches datagrams in flight
//! only sometimes.
//!
//! What a restarted node must get, per flow from A or B: the datagrams that
//! were never transmitted to the old instance (queued while the connection
//! was full or down, or sent while C was dead), all, exact and in order; and
//! none of those that were transmitted to the old instance and not acked
//! (those were meant for the old instance; the sender resends them on the
//! new connection marked RETRANSMITTED). How they are kept out depends on
//! `NodeConfig::handshake_exts`:
//!
//! * `Mainline` (what a 6.1 kernel speaks): no GEN_NUM
//!   goes on the wire, so A and B cannot tell that C restarted
//!   (`peer_restart` stays 0, nothing is flushed); they resend, and the new
//!   C drops the resent datagrams that come first on its first connection of
//!   the path (`recv_drop_stale`, exactly the number in flight at the kill).
//!   A 6.1 kernel peer would resend the same way (see docs/kernel-facts.md,
//!   `rds_conn_peer_gen_update`: a flush only on a GEN_NUM change, which 6.1
//!   never sends).
//! * `Full` (the engine default): C's first congestion map on a new
//!   connection carries its GEN_NUM, A and B see the restart before they
//!   resend anything (`peer_restart` = 1), and drop what the old instance had not acked
//!   (`send_drop_flushed`, `RdsSocket::flushed`: exactly the number in
//!   flight); the new C drops nothing as stale.
//!
//! Datagrams the old C's TCP had acked but its process never read are lost
//! with it: RDS-TCP counts a datagram delivered when the peer's TCP acked
//! it, as the kernel does. The test reports how many, and checks that the
//! old C read a gap-free prefix of each flow and nothing still unacked.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rds_core::{PathState, Queue, TransportKind};
use rds_sock::{Engine, EngineConfig, HandshakeExts, RdsSocket};
use rds_tests::*;

const PORT_AB: u16 = 5000;
const PORT_C: u16 = 5001;
const PORT_DEAD: u16 = 5002;
/// Node numbers: the last byte of their addresses.
const A: u8 = 1;
const B: u8 = 2;
const C: u8 = 3;
/// Kinds of flows (the low 4 bits of a flow id).
const AB: u8 = 0;
const EPOCH1: u8 = 1;
const EPOCH2: u8 = 2;
const DEAD: u8 = 3;
/// The old C has read this many epoch-1 datagrams from each of A and B
/// (and A and B this many of its own) when it is stopped.
const BEFORE_STOP: usize = 2000;
/// Epoch-2 datagrams from each of A and B to the new C.
const N2: u64 = 2000;
/// Datagrams the new C sends to each of A and B.
const NC2: u64 = 2000;
/// Datagrams each of A and B sends while C is dead.
const N_DEAD: u64 = 100;
/// Every wait is bounded by this.
const WAIT: Duration = Duration::from_secs(60);

fn flow(src: u8, dst: u8, kind: u8) -> u32 {
    u32::from(src) << 8 | u32::from(dst) << 4 | u32::from(kind)
}

/// Datagram sizes, as rds-node computes them: 16..1515 bytes.
fn len_of(flow: u32, index: u64) -> usize {
    16 + ((index.wrapping_mul(7919) ^ u64::from(flow)) % 1500) as usize
}

/// Polls `ok` every 10 ms for at most [`WAIT`]; on timeout panics with
/// `what` and the diagnostics `diag` gives.
fn wait_for(what: &str, diag: &dyn Fn() -> String, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        if Instant::now() > deadline {
            panic!("timed out after {WAIT:?} waiting for {what}\n{}", diag());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a C process printed.
#[derive(Default)]
struct Seen {
    gen_num: Option<u32>,
    /// Per flow id: (line number, sender, index) in the order received.
    flows: HashMap<u32, Vec<(u64, SocketAddr, u64)>>,
    /// Lines that report a bad datagram, or that could not be parsed.
    bad: Vec<String>,
    flushed: Option<bool>,
    counters: HashMap<String, u64>,
    bye: bool,
}

impl Seen {
    fn count(&self, f: u32) -> usize {
        self.flows.get(&f).map_or(0, Vec::len)
    }
    fn summary(&self) -> String {
        let mut v: Vec<String> = self.flows.iter().map(|(f, x)| format!("{f:#x}: {}", x.len())).collect();
        v.sort();
        format!("gen {:?} flows [{}] bad {:?} flushed {:?}", self.gen_num, v.join(", "), self.bad, self.flushed)
    }
}

/// A C process. Dropping it kills it (SIGKILL) and reaps it, so no child
/// outlives a failed test.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    seen: Arc<Mutex<Seen>>,
    reader: Option<JoinHandle<()>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn start(ip: impl Fn(u8) -> IpAddr, instance: u8, exts: HandshakeExts, count: u64) -> Proc {
        let ip_c = ip(C).to_string();
        let (peer_a, peer_b) = (ip(A).to_string(), ip(B).to_string());
        let exts = if exts == HandshakeExts::Full { "full" } else { "mainline" };
        let (inst, count, port) = (instance.to_string(), count.to_string(), PORT_C.to_string());
        let mut child = Command::new(env!("CARGO_BIN_EXE_rds-node"))
            .args(["--ip", &ip_c, "--port", &port, "--instance", &inst, "--exts", exts])
            .args(["--peer", &peer_a, "--peer", &peer_b, "--count", &count])
            // A small receive window: a stopped C leaves datagrams in flight.
            .args(["--tcp-rcvbuf", "65536"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start rds-node");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = seen.clone();
        let reader = std::thread::spawn(move || {
            for (n, line) in BufReader::new(out).lines().enumerate() {
                let Ok(line) = line else { break };
                let mut s = s.lock().unwrap();
                let w: Vec<&str> = line.split_whitespace().collect();
                match w.as_slice() {
                    ["READY", g] => s.gen_num = g.parse().ok(),
                    ["R", from, f, i, _len] => match (from.parse(), f.parse(), i.parse()) {
                        (Ok(from), Ok(f), Ok(i)) => s.flows.entry(f).or_default().push((n as u64, from, i)),
                        _ => s.bad.push(line.clone()),
                    },
                    ["SENT", ..] => {}
                    ["FLUSHED", ok] => s.flushed = Some(*ok == "true"),
                    ["COUNTER", k, v] => {
                        s.counters.insert(k.to_string(), v.parse().unwrap_or(u64::MAX));
                    }
                    ["BYE"] => s.bye = true,
                    _ => s.bad.push(line.clone()),
                }
            }
        });
        Proc { child, stdin, seen, reader: Some(reader) }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap()
    }
}

/// Sets the flag when dropped: the test's threads stop if it panics.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Node A or B: an engine and its sockets.
struct Side {
    no: u8,
    engine: Engine,
    ab: Arc<RdsSocket>,
    toc: Arc<RdsSocket>,
    dead: RdsSocket,
}

fn side(ip: impl Fn(u8) -> IpAddr, no: u8, exts: HandshakeExts) -> Side {
    let mut cfg = EngineConfig::default();
    cfg.node.handshake_exts = exts;
    cfg.info_dir = None;
    // A small TCP send buffer: when C stops, datagrams are left both in
    // flight and never transmitted (queued behind a full connection).
    cfg.tcp.sndbuf = Some(32 << 10);
    let engine = Engine::new(cfg).unwrap();
    let sock = |port: u16, sndbuf: usize| {
        let s = engine.socket().unwrap();
        s.bind(sa(ip(no), port)).unwrap();
        s.set_send_buffer_size_force(sndbuf).unwrap();
        s.set_recv_buffer_size_force(16 << 20).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        s.set_write_timeout(Some(WAIT)).unwrap();
        s
    };
    let (ab, toc, dead) = (sock(PORT_AB, 4 << 20), sock(PORT_C, 1 << 20), sock(PORT_DEAD, 1 << 20));
    dead.set_nonblocking(true).unwrap();
    Side { no, engine, ab: Arc::new(ab), toc: Arc::new(toc), dead }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ETIMEDOUT))
}

/// A <-> B: paced sends until `done` (or `stop`); returns how many were
/// sent.
fn ab_sender(
    s: Arc<RdsSocket>,
    me: u8,
    to: SocketAddr,
    done: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<u64, String>> {
    let f = flow(me, if me == A { B } else { A }, AB);
    std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut i = 0u64;
        while !done.load(Ordering::SeqCst) && !stop.load(Ordering::SeqCst) {
            if i >= 200_000 || t0.elapsed() > 2 * WAIT {
                return Err(format!("flow {f:#x}: still running after {i} datagrams"));
            }
            if i % 10 == 9 {
                std::thread::sleep(Duration::from_millis(1));
            }
            s.send_to(&payload(f, i, len_of(f, i)), to).map_err(|e| format!("flow {f:#x} send {i}: {e}"))?;
            i += 1;
        }
        Ok(i)
    })
}

/// A <-> B: receives until `target` (set once the sender stopped) datagrams
/// arrived, checking each; `got` shows progress.
fn ab_receiver(
    s: Arc<RdsSocket>,
    me: u8,
    from: SocketAddr,
    target: Arc<AtomicU64>,
    got: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<(), String>> {
    let f = flow(if me == A { B } else { A }, me, AB);
    std::thread::spawn(move || {
        let mut n = 0u64;
        while n < target.load(Ordering::SeqCst) {
            if stop.load(Ordering::SeqCst) {
                return Err(format!("flow {f:#x}: stopped after {n}"));
            }
            let (p, src) = match s.recv_payload() {
                Ok(v) => v,
                Err(e) if is_timeout(&e) => continue,
                Err(e) => return Err(format!("flow {f:#x} recv after {n}: {e}")),
            };
            if src != from {
                return Err(format!("flow {f:#x}: datagram {n} from {src}"));
            }
            check_payload(f, n, &p)?;
            n += 1;
            got.store(n, Ordering::SeqCst);
        }
        Ok(())
    })
}

/// A or B -> C: epoch 1, paced, until `epoch2`; then N2 datagrams of epoch
/// 2. Returns the number of epoch-1 datagrams sent; `progress` shows it.
fn toc_sender(
    s: Arc<RdsSocket>,
    me: u8,
    to: SocketAddr,
    epoch2: Arc<AtomicBool>,
    progress: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<u64, String>> {
    std::thread::spawn(move || {
        let (f1, f2) = (flow(me, C, EPOCH1), flow(me, C, EPOCH2));
        let t0 = Instant::now();
        let mut i = 0u64;
        while !epoch2.load(Ordering::SeqCst) {
            if stop.load(Ordering::SeqCst) || i >= 200_000 || t0.elapsed() > 2 * WAIT {
                return Err(format!("flow {f1:#x}: epoch 1 not ended after {i} datagrams"));
            }
            if i % 10 == 9 {
                std::thread::sleep(Duration::from_millis(1));
            }
            s.send_to(&payload(f1, i, len_of(f1, i)), to).map_err(|e| format!("flow {f1:#x} send {i}: {e}"))?;
            i += 1;
            progress.store(i, Ordering::SeqCst);
        }
        for j in 0..N2 {
            if stop.load(Ordering::SeqCst) {
                return Err(format!("flow {f2:#x}: stopped at {j}"));
            }
            s.send_to(&payload(f2, j, len_of(f2, j)), to).map_err(|e| format!("flow {f2:#x} send {j}: {e}"))?;
        }
        Ok(i)
    })
}

/// A or B <- C: instance 1's flow (a gap-free prefix), then instance 2's,
/// NC2 datagrams, never one of instance 1 after one of instance 2.
/// `got[k]` counts instance k+1's.
fn fromc_receiver(
    s: Arc<RdsSocket>,
    me: u8,
    c: SocketAddr,
    got: Arc<[AtomicU64; 2]>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Result<(), String>> {
    std::thread::spawn(move || {
        let (f1, f2) = (flow(C, me, 1), flow(C, me, 2));
        let (mut n1, mut n2) = (0u64, 0u64);
        while n2 < NC2 {
            if stop.load(Ordering::SeqCst) {
                return Err(format!("from C: stopped after {n1} + {n2}"));
            }
            let (p, src) = match s.recv_payload() {
                Ok(v) => v,
                Err(e) if is_timeout(&e) => continue,
                Err(e) => return Err(format!("from C: recv after {n1} + {n2}: {e}")),
            };
            if src != c || p.len() < 16 {
                return Err(format!("from C: a datagram of {} bytes from {src}", p.len()));
            }
            let f = u32::from_le_bytes(p[..4].try_into().unwrap());
            if f == f1 && n2 == 0 {
                check_payload(f1, n1, &p).map_err(|e| format!("old C's flow: {e}"))?;
                n1 += 1;
                got[0].store(n1, Ordering::SeqCst);
            } else if f == f2 {
                check_payload(f2, n2, &p).map_err(|e| format!("new C's flow: {e}"))?;
                n2 += 1;
                got[1].store(n2, Ordering::SeqCst);
            } else {
                return Err(format!("from C: flow {f:#x} after {n1} of the old C and {n2} of the new one"));
            }
        }
        Ok(())
    })
}

/// Asserts that `got` is exactly the indexes `want`, in order; says where
/// it is not, briefly.
fn assert_indexes(what: &str, got: &[u64], want: std::ops::Range<u64>) {
    let want: Vec<u64> = want.collect();
    if got == want.as_slice() {
        return;
    }
    let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
    let near = |v: &[u64]| format!("{:?}", &v[at.saturating_sub(2)..(at + 3).min(v.len())]);
    panic!(
        "{what}: got {} datagrams, expected {} ({}..{}); first difference at position {at}: got {} expected {}",
        got.len(),
        want.len(),
        want.first().map_or(0, |v| *v),
        want.last().map_or(0, |v| *v + 1),
        near(got),
        near(&want)
    );
}

/// Datagrams of `sock` (port `lport`) to C:`fport` on `q`.
fn queued(e: &Engine, q: Queue, c: IpAddr, lport: u16, fport: u16) -> usize {
    e.messages(q).iter().filter(|m| m.faddr == c && m.lport == lport && m.fport == fport).count()
}

/// Paths of `e`'s TCP connection to `c` that are up.
fn paths_up(e: &Engine, c: IpAddr) -> usize {
    e.connections()
        .iter()
        .filter(|k| k.faddr == c && k.transport == TransportKind::Tcp)
        .map(|k| k.paths.iter().filter(|p| p.state == PathState::Up).count())
        .sum()
}

/// `HandshakeExts::Mainline`: the 6.1 wire, no GEN_NUM.
#[test]
fn kill_9_mid_stream_and_restart_mainline() {
    run(addr_block(49), HandshakeExts::Mainline);
}

/// `HandshakeExts::Full` (the engine default): GEN_NUM tells A and B that C
/// restarted.
#[test]
fn kill_9_mid_stream_and_restart_full() {
    assert_eq!(EngineConfig::default().node.handshake_exts, HandshakeExts::Full);
    run(addr_block(49), HandshakeExts::Full);
}

fn run(ip: impl Fn(u8) -> IpAddr + Copy + Send + 'static, exts: HandshakeExts) {
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_guard = StopOnDrop(stop.clone());
    let sides = [side(ip, A, exts), side(ip, B, exts)];
    let ip_c = ip(C);
    let c_addr = sa(ip_c, PORT_C);

    // The old C (instance 1) streams to A and B until it dies.
    let mut c1 = Proc::start(ip, 1, exts, 0);

    // A <-> B.
    let ab_target: [Arc<AtomicU64>; 2] = [Arc::new(AtomicU64::new(u64::MAX)), Arc::new(AtomicU64::new(u64::MAX))];
    let ab_got: [Arc<AtomicU64>; 2] = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let ab_done = Arc::new(AtomicBool::new(false));
    let mut ab_senders = Vec::new();
    let mut ab_receivers = Vec::new();
    for (k, s) in sides.iter().enumerate() {
        let other = sa(ip(if s.no == A { B } else { A }), PORT_AB);
        ab_senders.push(ab_sender(s.ab.clone(), s.no, other, ab_done.clone(), stop.clone()));
        ab_receivers.push(ab_receiver(
            s.ab.clone(),
            s.no,
            other,
            ab_target[k].clone(),
            ab_got[k].clone(),
            stop.clone(),
        ));
    }
    // A, B <-> C.
    let epoch2 = Arc::new(AtomicBool::new(false));
    let progress: [Arc<AtomicU64>; 2] = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let from_c: [Arc<[AtomicU64; 2]>; 2] = [Arc::default(), Arc::default()];
    let mut toc_senders = Vec::new();
    let mut fromc_receivers = Vec::new();
    for (k, s) in sides.iter().enumerate() {
        toc_senders.push(toc_sender(s.toc.clone(), s.no, c_addr, epoch2.clone(), progress[k].clone(), stop.clone()));
        fromc_receivers.push(fromc_receiver(s.toc.clone(), s.no, c_addr, from_c[k].clone(), stop.clone()));
    }

    let diag = |c: &Proc| {
        let mut out = format!("C: {}\n", c.seen().summary());
        for s in &sides {
            let cs: Vec<String> =
                s.engine.counters().iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k}={v}")).collect();
            out += &format!("--- node {}: {}\n{}", s.no, cs.join(" "), s.engine.with_node(|n| n.dump()));
        }
        out
    };

    // Mid-stream: C read thousands of datagrams from each, and sent them
    // thousands.
    wait_for("the old C to stream", &|| diag(&c1), || {
        let s = c1.seen();
        s.count(flow(A, C, EPOCH1)) >= BEFORE_STOP
            && s.count(flow(B, C, EPOCH1)) >= BEFORE_STOP
            && from_c.iter().all(|g| g[0].load(Ordering::SeqCst) >= BEFORE_STOP as u64)
    });
    assert!(c1.seen().bad.is_empty(), "old C: {:?}", c1.seen().bad);

    // Stop C, and wait until A's and B's streams to it are stuck with
    // datagrams in flight: three samples 100 ms apart alike.
    let pid = c1.child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child, which is not reaped yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let ab_at_stop: Vec<u64> = ab_got.iter().map(|g| g.load(Ordering::SeqCst)).collect();
    let snapshot = || -> Vec<(u64, usize, usize)> {
        sides
            .iter()
            .enumerate()
            .map(|(k, s)| {
                (
                    progress[k].load(Ordering::SeqCst),
                    queued(&s.engine, Queue::Send, ip_c, PORT_C, PORT_C),
                    queued(&s.engine, Queue::Retrans, ip_c, PORT_C, PORT_C),
                )
            })
            .collect()
    };
    let mut samples = Vec::new();
    wait_for("A's and B's streams to the stopped C to stall with datagrams in flight", &|| diag(&c1), || {
        std::thread::sleep(Duration::from_millis(90));
        samples.push(snapshot());
        let n = samples.len();
        n >= 3
            && samples[n - 1] == samples[n - 2]
            && samples[n - 2] == samples[n - 3]
            && samples[n - 1].iter().all(|s| s.2 > 0)
    });
    // Per side: epoch-1 datagrams sent, of which the last `unsent` were
    // never transmitted, and the `in_flight` before them transmitted and
    // not acked.
    let at_kill = samples.pop().unwrap();
    for (k, s) in at_kill.iter().enumerate() {
        assert!(s.1 > 0, "node {}: nothing queued untransmitted behind the stopped C: {at_kill:?}", sides[k].no);
    }

    // kill -9. The process is gone for good: reaped, killed by SIGKILL.
    c1.child.kill().unwrap();
    let status = c1.child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "old C: {status:?}");
    // SAFETY: kill(2) with signal 0 only checks the process exists.
    assert_eq!(unsafe { libc::kill(pid, 0) }, -1, "old C still exists");
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ESRCH));
    c1.reader.take().unwrap().join().unwrap();
    let old = std::mem::take(&mut *c1.seen());

    // A and B see every connection to the old C go.
    wait_for("A and B to see the old C's connections go down", &|| diag(&c1), || {
        sides.iter().all(|s| paths_up(&s.engine, ip_c) == 0)
    });
    // From now on nothing can be transmitted to the old instance: epoch 2,
    // and datagrams sent while C is dead, are for the new one.
    epoch2.store(true, Ordering::SeqCst);
    let mut dead_results: HashMap<String, u64> = HashMap::new();
    for s in &sides {
        let f = flow(s.no, C, DEAD);
        for i in 0..N_DEAD {
            let r = s.dead.send_to(&payload(f, i, len_of(f, i)), c_addr);
            *dead_results.entry(r.map_or_else(|e| e.to_string(), |_| "queued".into())).or_default() += 1;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let ab_while_dead: Vec<u64> = ab_got.iter().map(|g| g.load(Ordering::SeqCst)).collect();

    // The new C (instance 2): same address, same ports.
    let c2 = Proc::start(ip, 2, exts, NC2);
    wait_for("the new C to get everything", &|| diag(&c2), || {
        let s = c2.seen();
        [A, B]
            .iter()
            .all(|&x| s.count(flow(x, C, EPOCH2)) == N2 as usize && s.count(flow(x, C, DEAD)) == N_DEAD as usize)
            && s.flushed.is_some()
            && from_c.iter().all(|g| g[1].load(Ordering::SeqCst) == NC2)
    });
    let mut e1_sent = Vec::new();
    for t in toc_senders {
        e1_sent.push(t.join().unwrap().unwrap_or_else(|e| panic!("{e}")));
    }
    for t in fromc_receivers {
        t.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
    }
    for s in &sides {
        assert!(s.toc.flush(Duration::from_secs(30)), "node {}: datagrams to the new C unacked", s.no);
        assert!(s.dead.flush(Duration::from_secs(30)), "node {}: datagrams to the new C unacked", s.no);
    }

    // A <-> B ran all along.
    ab_done.store(true, Ordering::SeqCst);
    for (k, t) in ab_senders.into_iter().enumerate() {
        let n = t.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
        ab_target[1 - k].store(n, Ordering::SeqCst);
    }
    for t in ab_receivers {
        t.join().unwrap().unwrap_or_else(|e| panic!("{e}\n{}", diag(&c2)));
    }
    let ab_total: Vec<u64> = ab_target.iter().map(|t| t.load(Ordering::SeqCst)).rev().collect();
    for k in 0..2 {
        assert!(
            ab_while_dead[k] > ab_at_stop[k],
            "A <-> B stalled while C was stopped and dead: {} datagrams at the stop, {} after its death",
            ab_at_stop[k],
            ab_while_dead[k]
        );
    }

    // The new C's counters, then it exits by itself.
    let mut c2 = c2;
    writeln!(c2.stdin.as_mut().unwrap(), "EXIT").unwrap();
    wait_for("the new C to exit", &|| diag(&c2), || c2.seen().bye);
    let status = c2.child.wait().unwrap();
    assert!(status.success(), "new C: {status:?}");
    c2.reader.take().unwrap().join().unwrap();
    let new = std::mem::take(&mut *c2.seen());

    assert!(old.bad.is_empty(), "old C: {:?}", old.bad);
    assert!(new.bad.is_empty(), "new C: {:?}", new.bad);
    assert_eq!(new.flushed, Some(true), "the new C's datagrams to A and B were not all acked");
    let (g1, g2) = (old.gen_num.unwrap(), new.gen_num.unwrap());
    assert_ne!(g1, g2, "both C instances drew generation {g1}");
    let mut flows: Vec<u32> = old.flows.keys().copied().collect();
    flows.sort();
    assert_eq!(flows, vec![flow(A, C, EPOCH1), flow(B, C, EPOCH1)], "old C");

    // Per sender: what each C instance got.
    let mut in_flight_total = 0;
    let mut report = Vec::new();
    for (k, s) in sides.iter().enumerate() {
        let x = s.no;
        let (sent_at_kill, unsent, in_flight) = at_kill[k];
        let first_unsent = sent_at_kill - unsent as u64;
        let first_in_flight = first_unsent - in_flight as u64;
        in_flight_total += in_flight as u64;
        let from = sa(ip(x), PORT_C);
        let indexes = |seen: &Seen, f: u32, src: SocketAddr| -> Vec<u64> {
            let v = seen.flows.get(&f).cloned().unwrap_or_default();
            assert!(v.iter().all(|e| e.1 == src), "flow {f:#x} from another sender");
            v.iter().map(|e| e.2).collect()
        };
        // The old C read a gap-free prefix, and nothing still unacked.
        let got_old = indexes(&old, flow(x, C, EPOCH1), from);
        let p = got_old.len() as u64;
        assert_indexes(&format!("node {x} -> old C: a gap-free prefix"), &got_old, 0..p);
        assert!(p <= first_in_flight, "node {x} -> old C: read {p} datagrams, but #{first_in_flight} was not acked");
        // The new C got exactly the epoch-1 datagrams never transmitted to
        // the old one, then all of epoch 2, and all sent while it was dead.
        let got_new = indexes(&new, flow(x, C, EPOCH1), from);
        assert_indexes(
            &format!(
                "node {x} -> new C: epoch 1 must be exactly the datagrams never transmitted to the old C \
                 ({in_flight} in flight before them at the kill, from #{first_in_flight})"
            ),
            &got_new,
            first_unsent..e1_sent[k],
        );
        assert_indexes(&format!("node {x} -> new C: epoch 2"), &indexes(&new, flow(x, C, EPOCH2), from), 0..N2);
        let last_e1 = new.flows.get(&flow(x, C, EPOCH1)).and_then(|v| v.last()).map_or(0, |e| e.0);
        let first_e2 = new.flows[&flow(x, C, EPOCH2)][0].0;
        assert!(last_e1 < first_e2, "node {x} -> new C: epoch 1 after epoch 2");
        let got_dead = indexes(&new, flow(x, C, DEAD), sa(ip(x), PORT_DEAD));
        assert_indexes(&format!("node {x} -> new C: sent while C was dead"), &got_dead, 0..N_DEAD);
        report.push(format!(
            "node {x} -> C: old C read {p}, {} acked by its TCP and never read (lost with it), {in_flight} in flight \
             at the kill (not for the new C), {unsent} never transmitted; new C got {} of epoch 1 + {N2} + {N_DEAD}",
            first_in_flight - p,
            got_new.len()
        ));
    }
    assert_eq!(dead_results.get("queued"), Some(&(2 * N_DEAD)), "sends while C was dead: {dead_results:?}");

    // Counters, as documented for each handshake.
    let new_stale = new.counters.get("recv_drop_stale").copied();
    for (k, s) in sides.iter().enumerate() {
        let e = &s.engine;
        let in_flight = at_kill[k].2 as u64;
        assert_eq!(counter(e, "recv_drop_stale"), 0, "node {}: never restarted, dropped nothing as stale", s.no);
        assert!(counter(e, "conn_reset") >= 1, "node {}: no connection reset", s.no);
        assert_eq!(s.ab.flushed() + s.dead.flushed(), 0);
        match exts {
            HandshakeExts::Mainline => {
                assert_eq!(counter(e, "peer_restart"), 0, "node {}: Mainline cannot tell a restart", s.no);
                assert_eq!(counter(e, "send_drop_flushed"), 0, "node {}", s.no);
                assert_eq!(s.toc.flushed(), 0, "node {}", s.no);
            }
            HandshakeExts::Full => {
                assert_eq!(counter(e, "peer_restart"), 1, "node {}: one restart of C", s.no);
                assert_eq!(
                    counter(e, "send_drop_flushed"),
                    in_flight,
                    "node {}: flushed = in flight at the kill",
                    s.no
                );
                assert_eq!(s.toc.flushed(), in_flight, "node {}", s.no);
            }
        }
    }
    match exts {
        HandshakeExts::Mainline => assert_eq!(new_stale, Some(in_flight_total), "new C: stale = in flight at the kill"),
        HandshakeExts::Full => assert_eq!(new_stale, Some(0), "new C: with Full nothing stale reaches it"),
    }
    assert_eq!(new.counters.get("peer_restart").copied(), Some(0), "the new C saw no restart of A or B");

    for s in &sides {
        let r = s.engine.shutdown(Duration::from_secs(1));
        assert_eq!(r.messages(), 0, "{r:?}");
    }
    eprintln!(
        "restart ({exts:?}): {:.1} s; A <-> B {} + {} datagrams ({} + {} at the stop, {} + {} after C's death); {}; \
         new C recv_drop_stale {new_stale:?}",
        t0.elapsed().as_secs_f64(),
        ab_total[0],
        ab_total[1],
        ab_at_stop[0],
        ab_at_stop[1],
        ab_while_dead[0],
        ab_while_dead[1],
        report.join("; ")
    );
}
