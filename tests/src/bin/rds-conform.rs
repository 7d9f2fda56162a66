//! rds-conform: our side of the conformance scenarios against the Linux
//! kernel's RDS-TCP (the kernel side is `tests/kernel/conform.py`;
//! `tests/tests/kernel_tcp.rs` runs both in the VM rig).
//!
//! usage: rds-conform SCENARIO --self ADDR --peer ADDR
//!
//! Scenarios: ping, tools, datagrams, congestion, mprds, reconnect, resetall, restart-a,
//! restart-b, selftest. The two sides meet at `barrier NAME` points (the
//! rig's helper) and print
//!
//! ```text
//! RESULT <scenario> <direction> PASS|FAIL <note>
//! INFO <scenario> <text>
//! ```
//!
//! Payloads are deterministic ([`payload`], the same function as the
//! script's), so receivers check content, order and count per flow
//! (source port, destination port) on their own.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rds_core::{PathState, TransportKind};
use rds_sock::{RdsSocket, RecvFlags};
use sha2::{Digest, Sha256};

const SIZES: [usize; 5] = [0, 1, 4096, 65536, 1 << 20];
const BIG: usize = 4 << 20;

struct Ctx {
    me: IpAddr,
    peer: IpAddr,
}

impl Ctx {
    /// Whether we have the larger address: the side that kills single
    /// connections (`kill_one_when_all_up`; conform.py's `larger_side`).
    fn larger(&self) -> bool {
        self.me > self.peer
    }
}

fn result(scenario: &str, dir: &str, ok: bool, note: &str) {
    println!("RESULT {scenario} {dir} {} {note}", if ok { "PASS" } else { "FAIL" });
}

fn info(scenario: &str, text: &str) {
    println!("INFO {scenario} {text}");
}

/// Both guests reached `name` (the rig's barrier files in /vmrig/sync), or
/// false after `secs` or once the other side gave up on the scenario (the
/// run script writes ABORT.<scenario> when a side ends early).
fn barrier(name: &str, secs: u32) -> bool {
    let d = "/vmrig/sync";
    let me = std::env::var("VMRIG_NODE").unwrap_or_else(|_| "1".into());
    let nodes: u32 = std::env::var("VMRIG_NODES").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let sc = std::env::var("CONFORM_SC").unwrap_or_else(|_| "none".into());
    let _ = std::fs::write(format!("{d}/{name}.{me}"), b"");
    let end = Instant::now() + Duration::from_secs(u64::from(secs));
    while Instant::now() < end {
        if (1..=nodes).all(|k| std::path::Path::new(&format!("{d}/{name}.{k}")).exists()) {
            return true;
        }
        if std::path::Path::new(&format!("{d}/ABORT.{sc}")).exists() {
            info("barrier", &format!("{name}: the other side gave up"));
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    info("barrier", &format!("{name} timed out"));
    false
}

fn sh(cmd: &str) -> String {
    match Command::new("sh").arg("-c").arg(cmd).output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => format!("sh: {e}"),
    }
}

fn flow_id(sport: u16, dport: u16) -> u32 {
    (u32::from(sport) << 16) | u32::from(dport)
}

/// 32 bytes of sha256("flow:i"), a 16-byte header [flow u32][i u64][n u32]
/// (little-endian), then the hash repeated; cut to `n` bytes.
fn payload(flow: u32, i: u64, n: usize) -> Vec<u8> {
    let unit: [u8; 32] = Sha256::digest(format!("{flow}:{i}").as_bytes()).into();
    let mut v = Vec::with_capacity(n.max(48));
    v.extend_from_slice(&unit);
    v.extend_from_slice(&flow.to_le_bytes());
    v.extend_from_slice(&i.to_le_bytes());
    v.extend_from_slice(&(n as u32).to_le_bytes());
    while v.len() < n {
        v.extend_from_slice(&unit);
    }
    v.truncate(n);
    v
}

fn end_msg(count: u64) -> Vec<u8> {
    let mut v = b"END".to_vec();
    v.extend_from_slice(&count.to_le_bytes());
    v
}

fn is_end(d: &[u8]) -> Option<u64> {
    (d.len() == 11 && &d[..3] == b"END").then(|| u64::from_le_bytes(d[3..].try_into().unwrap()))
}

/// The index a payload of at least 48 bytes carries.
fn index_of(d: &[u8]) -> Option<u64> {
    (d.len() >= 48).then(|| u64::from_le_bytes(d[36..44].try_into().unwrap()))
}

fn errno_name(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Checks messages per flow: index order, size, exact content.
struct FlowChecker {
    peer: IpAddr,
    size_of: fn(u32, u64) -> usize,
    next: HashMap<u32, u64>,
    ends: HashMap<u32, u64>,
    errors: Vec<String>,
    count: u64,
    lost: u64,
    dup: u64,
    /// The first few losses and duplicates (kept apart from `errors`).
    gap_notes: Vec<String>,
}

impl FlowChecker {
    fn new(peer: IpAddr, size_of: fn(u32, u64) -> usize) -> FlowChecker {
        FlowChecker {
            peer,
            size_of,
            next: HashMap::new(),
            ends: HashMap::new(),
            errors: Vec::new(),
            count: 0,
            lost: 0,
            dup: 0,
            gap_notes: Vec::new(),
        }
    }

    fn err(&mut self, e: String) {
        if self.errors.len() < 5 {
            self.errors.push(e);
        } else if self.errors.len() == 5 {
            self.errors.push("...".into());
        }
    }

    fn gap(&mut self, e: String) {
        if self.gap_notes.len() < 4 {
            self.gap_notes.push(e);
        }
    }

    fn add(&mut self, from: SocketAddr, dport: u16, data: &[u8]) {
        if from.port() == 0 {
            // A pong (our node's pings set up the paths).
            return;
        }
        if from.ip() != self.peer {
            self.err(format!("message from unexpected {from}"));
            return;
        }
        let flow = flow_id(from.port(), dport);
        if let Some(n) = is_end(data) {
            self.ends.insert(flow, n);
            return;
        }
        let mut i = *self.next.get(&flow).unwrap_or(&0);
        // Messages of 48 bytes and more carry their index: a gap (lost
        // messages) or a step back (a duplicate) is counted and the check
        // goes on from there, instead of failing every later message.
        if let Some(g) = index_of(data).filter(|&g| g != i && data == payload(flow, g, data.len()).as_slice()) {
            if g < i {
                self.dup += 1;
                self.gap(format!("flow {}->{dport} message {g} again after {}", from.port(), i - 1));
                return;
            }
            self.lost += g - i;
            self.gap(format!("flow {}->{dport} messages {i}..{} lost", from.port(), g - 1));
            i = g;
        }
        let n = (self.size_of)(flow, i);
        if data != payload(flow, i, n).as_slice() {
            self.err(format!(
                "flow {}->{dport} message {i}: got {} B (index {:?}), want {n} B",
                from.port(),
                data.len(),
                index_of(data)
            ));
        }
        self.next.insert(flow, i + 1);
        self.count += 1;
    }

    fn complete(&self, expect: &HashMap<u32, u64>) -> bool {
        expect.iter().all(|(f, n)| self.next.get(f).copied().unwrap_or(0) >= *n)
    }

    fn ended(&self, flows: &[u32]) -> bool {
        // A flow's END comes after all its messages (per-flow order).
        flows.iter().all(|f| self.ends.contains_key(f))
    }

    /// Against fixed counts (`expect`) or the senders' END counts.
    fn verdict(&self, flows: &[u32], expect: Option<&HashMap<u32, u64>>) -> (bool, String) {
        self.verdict_gaps(flows, expect, false)
    }

    /// `allow_gaps`: lost and duplicated messages are counted but do not
    /// fail (a 6.1 peer cannot avoid them after whole-connection resets);
    /// wrong content, a missing END or counts that do not add up still do.
    fn verdict_gaps(&self, flows: &[u32], expect: Option<&HashMap<u32, u64>>, allow_gaps: bool) -> (bool, String) {
        let mut errs = self.errors.clone();
        if !allow_gaps {
            errs.extend(self.gap_notes.iter().cloned());
        }
        for f in flows {
            let got = self.next.get(f).copied().unwrap_or(0);
            let want = match expect {
                Some(e) => e.get(f).copied(),
                None => self.ends.get(f).copied(),
            };
            match want {
                None => errs.push(format!("flow {}->{}: no END after {got}", f >> 16, f & 0xffff)),
                // The last messages of a flow lost: the END tells.
                Some(w) if allow_gaps && got < w => {}
                Some(w) if w != got => {
                    errs.push(format!("flow {}->{}: {got} messages, sender sent {w}", f >> 16, f & 0xffff))
                }
                _ => {}
            }
        }
        errs.truncate(6);
        (errs.is_empty(), errs.join("; "))
    }
}

/// Receives on every socket (a thread each) into the checker until `done`
/// holds or the deadline passes.
fn receive_all(
    socks: &[Arc<RdsSocket>],
    checker: &Arc<Mutex<FlowChecker>>,
    done: impl Fn(&FlowChecker) -> bool + Send + Sync + 'static,
    deadline: Instant,
) {
    let done = Arc::new(done);
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for s in socks {
        let (s, checker, done, stop) = (s.clone(), checker.clone(), done.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let port = s.local_addr().unwrap().port();
            s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let mut buf = vec![0u8; BIG];
            while !stop.load(SeqCst) && Instant::now() < deadline {
                if done(&checker.lock().unwrap()) {
                    stop.store(true, SeqCst);
                    break;
                }
                match s.recv_msg(&mut buf, RecvFlags::default()) {
                    Ok(m) => {
                        if let Some(from) = m.from {
                            let mut c = checker.lock().unwrap();
                            c.add(from, port, &buf[..m.len]);
                            if done(&c) {
                                stop.store(true, SeqCst);
                            }
                        }
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {}
                    Err(e) => {
                        checker.lock().unwrap().err(format!("recv on {port}: {}", errno_name(&e)));
                        break;
                    }
                }
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
}

fn sock(ctx: &Ctx, port: u16, sndbuf: Option<usize>, rcvbuf: Option<usize>) -> io::Result<Arc<RdsSocket>> {
    let s = RdsSocket::new()?;
    if let Some(b) = sndbuf {
        s.set_send_buffer_size_force(b)?;
    }
    if let Some(b) = rcvbuf {
        s.set_recv_buffer_size_force(b)?;
    }
    s.bind(SocketAddr::new(ctx.me, port))?;
    Ok(Arc::new(s))
}

fn socks(ctx: &Ctx, ports: &[u16], buf: usize) -> Vec<Arc<RdsSocket>> {
    ports.iter().map(|p| sock(ctx, *p, Some(buf), Some(buf)).unwrap_or_else(|e| panic!("bind {p}: {e}"))).collect()
}

/// Waits until every socket's messages were acked by the kernel.
fn flush_all(socks: &[Arc<RdsSocket>], secs: u64) -> bool {
    socks.iter().all(|s| s.flush(Duration::from_secs(secs)))
}

fn counter(name: &str) -> u64 {
    RdsSocket::new()
        .map(|s| s.engine().counters().into_iter().find(|(k, _)| k == name).map_or(0, |(_, v)| v))
        .unwrap_or(0)
}

// ----------------------------------------------------------------------------

fn sc_ping(ctx: &Ctx) {
    barrier("ping-a", 120);
    // Our rds-ping tool (next to this binary) against the kernel.
    let exe = std::env::current_exe().unwrap();
    let ping = exe.with_file_name("rds-ping");
    let out = Command::new("timeout")
        .arg("30")
        .arg(&ping)
        .args(["-c", "5", "-i", "0.3", "-I", &ctx.me.to_string(), &ctx.peer.to_string()])
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            let replies = text
                .lines()
                .filter(|l| {
                    let l = l.trim();
                    l.ends_with(" usec")
                        && !l.contains("DUP")
                        && l.split(':').next().is_some_and(|n| n.trim().parse::<u32>().is_ok())
                })
                .count();
            let bad = text.lines().filter(|l| l.contains("DUP") || l.contains("ERROR")).count();
            let rtts: Vec<&str> = text.lines().filter_map(|l| l.split(':').nth(1)).map(str::trim).collect();
            result(
                "ping",
                "us->kernel",
                o.status.success() && replies == 5 && bad == 0,
                &format!(
                    "our rds-ping: {replies}/5 replies from {}:0 ({}), exit {:?}",
                    ctx.peer,
                    rtts.join(", "),
                    o.status.code()
                ),
            );
        }
        Err(e) => result("ping", "us->kernel", false, &format!("cannot run {}: {e}", ping.display())),
    }
    barrier("ping-a-done", 90);
    // The kernel pings us: our node only needs to serve the address.
    let _s = sock(ctx, 4999, None, None).expect("bind");
    barrier("ping-b", 60);
    barrier("ping-b-done", 90);
    let pings = counter("recv_ping");
    info("ping", &format!("our node answered {pings} pings (recv_ping)"));
}

const TOOLS_N: u64 = 40;

/// `rds-gen` / `rds-sink` (next to this binary) against the kernel: each
/// prints `<addr>:<port> <messages> <bytes> <sha256>`; the HASH lines let
/// the harness compare with what the kernel side received or sent.
fn sc_tools(ctx: &Ctx) {
    let exe = std::env::current_exe().unwrap();
    let parse = |text: &str| -> Option<(String, u64, u64, String)> {
        let l = text.lines().next()?;
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() != 4 {
            return None;
        }
        Some((f[0].to_string(), f[1].parse().ok()?, f[2].parse().ok()?, f[3].to_string()))
    };
    barrier("tools-a", 120);
    let generator = exe.with_file_name("rds-gen");
    let src = format!("{}:7301", ctx.me);
    let out = Command::new("timeout")
        .arg("90")
        .arg(&generator)
        .args(["-s", &src, "-d", &format!("{}:7300", ctx.peer), "-m", "64K", "-l", &(TOOLS_N * 65536).to_string()])
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            match parse(&text) {
                Some((from, n, bytes, sha)) => {
                    println!("HASH tools sent us->kernel {n} {sha}");
                    result(
                        "tools",
                        "us->kernel",
                        o.status.success() && from == src && n == TOOLS_N && bytes == TOOLS_N * 65536,
                        &format!("our rds-gen printed `{}`, exit {:?}", text.trim(), o.status.code()),
                    );
                }
                None => result(
                    "tools",
                    "us->kernel",
                    false,
                    &format!("rds-gen printed {text:?}, stderr {:?}", String::from_utf8_lossy(&o.stderr)),
                ),
            }
        }
        Err(e) => result("tools", "us->kernel", false, &format!("cannot run {}: {e}", generator.display())),
    }
    barrier("tools-a-done", 120);
    let sink = exe.with_file_name("rds-sink");
    let child = Command::new("timeout")
        .arg("90")
        .arg(&sink)
        .args(["-s", &format!("{}:7302", ctx.me), "--digest", "-l", &TOOLS_N.to_string(), "-b", "8M"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            result("tools", "kernel->us", false, &format!("cannot run {}: {e}", sink.display()));
            barrier("tools-b", 120);
            barrier("tools-b-done", 120);
            return;
        }
    };
    // rds-sink binds at once; give it a moment to start serving.
    std::thread::sleep(Duration::from_millis(500));
    barrier("tools-b", 120);
    let o = child.wait_with_output().expect("rds-sink");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let want_from = format!("{}:7303", ctx.peer);
    match parse(&text) {
        Some((from, n, _bytes, sha)) => {
            println!("HASH tools recv kernel->us {n} {sha}");
            result(
                "tools",
                "kernel->us",
                o.status.success() && from == want_from && n == TOOLS_N,
                &format!("our rds-sink printed `{}`, exit {:?}", text.trim(), o.status.code()),
            );
        }
        None => result(
            "tools",
            "kernel->us",
            false,
            &format!("rds-sink printed {text:?}, stderr {:?}", String::from_utf8_lossy(&o.stderr)),
        ),
    }
    barrier("tools-b-done", 120);
}

const DG_OURS: [u16; 3] = [5001, 5002, 5003];
const DG_KERNEL: [u16; 3] = [6001, 6002, 6003];
const DG_PER_FLOW: u64 = 10;

fn dg_size(flow: u32, i: u64) -> usize {
    SIZES[((i + u64::from(flow)) % SIZES.len() as u64) as usize]
}

fn sc_datagrams(ctx: &Ctx) {
    let ss = socks(ctx, &DG_OURS, BIG);
    let expect: HashMap<u32, u64> =
        DG_KERNEL.iter().flat_map(|a| DG_OURS.iter().map(move |b| (flow_id(*a, *b), DG_PER_FLOW))).collect();
    let flows: Vec<u32> = expect.keys().copied().collect();
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, dg_size)));
    barrier("dg-ready", 120);
    let t0 = Instant::now();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for s in &ss {
        let (s, errors, sent, peer) = (s.clone(), errors.clone(), sent.clone(), ctx.peer);
        senders.push(std::thread::spawn(move || {
            let sport = s.local_addr().unwrap().port();
            for i in 0..DG_PER_FLOW {
                for d in DG_KERNEL {
                    let f = flow_id(sport, d);
                    if let Err(e) = s.send_to(&payload(f, i, dg_size(f, i)), SocketAddr::new(peer, d)) {
                        errors.lock().unwrap().push(format!("send {sport}->{d} #{i}: {}", errno_name(&e)));
                        return;
                    }
                    sent.fetch_add(1, SeqCst);
                }
            }
        }));
    }
    let e2 = expect.clone();
    receive_all(&ss, &checker, move |c| c.complete(&e2), Instant::now() + Duration::from_secs(150));
    for t in senders {
        let _ = t.join();
    }
    let acked = flush_all(&ss, 60);
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&flows, Some(&expect));
    result(
        "datagrams",
        "kernel->us",
        ok,
        &format!(
            "{}/{} messages of 0 B..1 MiB on 9 flows (3 x 3 sockets), exact and in order in {:.1} s \
             (our sockets SO_SNDBUFFORCE/SO_RCVBUFFORCE 4 MiB){}",
            c.count,
            expect.values().sum::<u64>(),
            t0.elapsed().as_secs_f64(),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    let errors = errors.lock().unwrap();
    result(
        "datagrams",
        "us->kernel",
        errors.is_empty() && acked,
        &format!(
            "we sent {}/90, {}{}",
            sent.load(SeqCst),
            if acked { "all acked" } else { "NOT all acked" },
            if errors.is_empty() { String::new() } else { format!("; {}", errors.join("; ")) }
        ),
    );
    barrier("dg-done", 180);
}

fn cong_size(_: u32, _: u64) -> usize {
    4096
}

fn sc_congestion(ctx: &Ctx) {
    // A: we send to a kernel socket that does not read.
    let us = sock(ctx, 7002, None, None).expect("bind");
    let dst = SocketAddr::new(ctx.peer, 7001);
    let flow = flow_id(7002, 7001);
    barrier("cong-a-ready", 60);
    us.set_nonblocking(true).unwrap();
    let (mut i, mut saw) = (0u64, false);
    let t0 = Instant::now();
    let mut other = None;
    while t0.elapsed() < Duration::from_secs(30) && i < 20000 {
        match us.send_to(&payload(flow, i, 4096), dst) {
            Ok(_) => i += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                saw = true;
                break;
            }
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                other = Some(errno_name(&e));
                break;
            }
        }
    }
    let n_nonblock = i;
    us.set_nonblocking(false).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let us = us.clone();
        std::thread::spawn(move || {
            let r = us.send_to(&payload(flow, n_nonblock, 4096), dst);
            let _ = tx.send((r.map_err(|e| errno_name(&e)), Instant::now()));
        });
    }
    std::thread::sleep(Duration::from_millis(1500));
    let blocked = matches!(rx.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty));
    let t_drain = Instant::now();
    barrier("cong-a-drain", 90);
    let done = rx.recv_timeout(Duration::from_secs(60));
    let completed = matches!(done, Ok((Ok(_), _)));
    let after = done.as_ref().map(|(_, t)| t.saturating_duration_since(t_drain).as_secs_f64()).unwrap_or(0.0);
    let sent = n_nonblock + u64::from(completed);
    let end_ok = completed && us.send_to(&end_msg(sent), dst).is_ok();
    let acked = us.flush(Duration::from_secs(30));
    result(
        "congestion",
        "us->kernel",
        saw && blocked && completed && end_ok && acked,
        &format!(
            "our sender: {}; {}{}",
            if saw {
                format!("ENOBUFS after {n_nonblock} x 4 KiB non-blocking")
            } else {
                format!("no ENOBUFS ({})", other.unwrap_or_else(|| "timeout".into()))
            },
            if blocked { "blocking send blocked >= 1.5 s" } else { "blocking send did NOT block" },
            if completed {
                format!(", completed {after:.2} s after the reader started draining")
            } else {
                format!(", did not complete ({done:?})")
            }
        ),
    );
    barrier("cong-a-done", 90);

    // B: the kernel sends to our socket that does not read.
    let ur = sock(ctx, 7011, None, None).expect("bind");
    ur.set_recv_buffer_size(16384).unwrap();
    let flow = flow_id(7012, 7011);
    barrier("cong-b-ready", 60);
    let rcv_before = counter("cong_update_queued");
    barrier("cong-b-drain", 90);
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, cong_size)));
    receive_all(
        std::slice::from_ref(&ur),
        &checker,
        move |c| c.ended(&[flow]),
        Instant::now() + Duration::from_secs(60),
    );
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&[flow], None);
    let maps = counter("cong_update_queued") - rcv_before;
    result(
        "congestion",
        "kernel->us",
        ok,
        &format!(
            "our reader (SO_RCVBUF 16 KiB) drained {} messages after the stall, exact and in order ({maps} map updates queued while draining){}",
            c.count,
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    barrier("cong-b-done", 90);
}

const MP_PER_FLOW: u64 = 150;

fn mp_size(_: u32, i: u64) -> usize {
    [100, 4096, 16384][(i % 3) as usize]
}

/// One port per 6.1 multipath lane: `jhash_1word(port, 0) & 7` = 0..7 (the
/// kernel side's ports).
fn lane_ports(start: u16) -> Vec<u16> {
    fn jhash_1word(a: u32) -> u32 {
        let iv = 0xdeadbeefu32.wrapping_add(4);
        let (mut a, mut b, mut c) = (a.wrapping_add(iv), iv, iv);
        c ^= b;
        c = c.wrapping_sub(b.rotate_left(14));
        a ^= c;
        a = a.wrapping_sub(c.rotate_left(11));
        b ^= a;
        b = b.wrapping_sub(a.rotate_left(25));
        c ^= b;
        c = c.wrapping_sub(b.rotate_left(16));
        a ^= c;
        a = a.wrapping_sub(c.rotate_left(4));
        b ^= a;
        b = b.wrapping_sub(a.rotate_left(14));
        c ^= b;
        c.wrapping_sub(b.rotate_left(24))
    }
    let mut found: [Option<u16>; 8] = [None; 8];
    let mut p = start;
    while found.iter().any(Option::is_none) {
        let h = (jhash_1word(u32::from(p)) & 7) as usize;
        found[h].get_or_insert(p);
        p += 1;
    }
    found.iter().map(|p| p.unwrap()).collect()
}

fn sc_mprds(ctx: &Ctx) {
    let ours: Vec<u16> = (0..8).map(|k| 8000 + k).collect();
    let kernel = lane_ports(9000);
    let ss = socks(ctx, &ours, BIG);
    let expect: HashMap<u32, u64> = kernel.iter().zip(&ours).map(|(a, b)| (flow_id(*a, *b), MP_PER_FLOW)).collect();
    let flows: Vec<u32> = expect.keys().copied().collect();
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, mp_size)));
    // Messages sent before the path count is known all go on path 0 (as a
    // non-blocking kernel sender's do): ping first, and wait until the
    // handshake answered and the paths are up.
    let engine = ss[0].engine().clone();
    let _ = ss[0].send_to(&[], SocketAddr::new(ctx.peer, 0));
    let (me, peer) = (ctx.me, ctx.peer);
    let t0 = Instant::now();
    let ready = loop {
        let up = engine.with_node(|n| {
            n.info_connections()
                .into_iter()
                .find(|c| c.laddr == me && c.faddr == peer && c.transport == TransportKind::Tcp)
                .map_or(
                    0,
                    |c| if c.npaths == 8 { c.paths.iter().filter(|p| p.state == PathState::Up).count() } else { 0 },
                )
        });
        if up == 8 || t0.elapsed() > Duration::from_secs(30) {
            break up;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    info("mprds", &format!("{ready}/8 paths up {:.2} s after the first ping", t0.elapsed().as_secs_f64()));
    barrier("mp-ready", 120);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut senders = Vec::new();
    for (s, d) in ss.iter().zip(kernel.clone()) {
        let (s, errors, peer) = (s.clone(), errors.clone(), ctx.peer);
        senders.push(std::thread::spawn(move || {
            let sport = s.local_addr().unwrap().port();
            let f = flow_id(sport, d);
            for i in 0..MP_PER_FLOW {
                if let Err(e) = s.send_to(&payload(f, i, mp_size(f, i)), SocketAddr::new(peer, d)) {
                    errors.lock().unwrap().push(format!("send {sport}: {}", errno_name(&e)));
                    return;
                }
            }
        }));
    }
    let e2 = expect.clone();
    receive_all(&ss, &checker, move |c| c.complete(&e2), Instant::now() + Duration::from_secs(120));
    for t in senders {
        let _ = t.join();
    }
    let acked = flush_all(&ss, 60);
    barrier("mp-sent", 120);
    // Our view of the connection: the paths, their sequence numbers, the
    // TCP connections of the transport.
    let conn = engine.with_node(|n| {
        n.info_connections().into_iter().find(|c| c.laddr == me && c.faddr == peer && c.transport == TransportKind::Tcp)
    });
    let tcp = engine.tcp_connections().into_iter().filter(|r| r.peer.is_some_and(|p| p.ip() == peer)).count();
    let (npaths, up, desc, tx_lanes, rx_lanes) = match &conn {
        Some(c) => {
            let up = c.paths.iter().filter(|p| p.state == PathState::Up).count();
            let desc: Vec<String> = c
                .paths
                .iter()
                .map(|p| format!("{}:{:?} tx {} rx {}", p.index, p.state, p.next_tx_seq, p.next_rx_seq))
                .collect();
            // Our lane k carries socket 8000+k's 150 messages.
            let tx = c.paths.iter().filter(|p| p.next_tx_seq > MP_PER_FLOW).count();
            let rx = c.paths.iter().filter(|p| p.next_rx_seq > 0).count();
            (c.npaths, up, desc.join(", "), tx, rx)
        }
        None => (0, 0, "no connection".into(), 0, 0),
    };
    info("mprds", &format!("our paths: npaths {npaths}; {desc}; {tcp} TCP connections"));
    result(
        "mprds",
        "both",
        npaths == 8 && up == 8 && tcp == 8,
        &format!("our node: npaths {npaths}, {up}/8 paths up, {tcp} TCP connections"),
    );
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&flows, Some(&expect));
    result(
        "mprds",
        "kernel->us",
        ok && rx_lanes == 8,
        &format!(
            "{}/{} messages on 8 flows exact and in order; {rx_lanes}/8 of our paths received{}",
            c.count,
            expect.values().sum::<u64>(),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    let errors = errors.lock().unwrap();
    result(
        "mprds",
        "us->kernel",
        errors.is_empty() && acked && tx_lanes == 8,
        &format!(
            "{tx_lanes}/8 of our paths carried > {MP_PER_FLOW} messages (lane = port % 8){}{}",
            if acked { "" } else { "; NOT all acked" },
            if errors.is_empty() { String::new() } else { format!("; {}", errors.join("; ")) }
        ),
    );
    barrier("mp-done", 120);
}

fn rc_size(_: u32, i: u64) -> usize {
    [64, 1000, 4096, 300, 2000][(i % 5) as usize]
}

/// Kills all our TCP connections to the peer (resetall).
fn kill_all_ours(ctx: &Ctx) -> String {
    let n = sh(&format!("ss -tnH state established '( sport = :16385 or dport = :16385 )' dst {}", ctx.peer))
        .lines()
        .count();
    if n == 0 {
        return "no connection".into();
    }
    sh(&format!("ss -K dst {} '( sport = :16385 or dport = :16385 )' >/dev/null", ctx.peer));
    format!("ss -K all ({n})")
}

/// Kills one of our 8 TCP connections to the peer, but only while all 8
/// are up (seen twice, 0.5 s apart): a kill while another path is still
/// reconnecting leaves two slots free, and a 6.1 kernel's lowest-free-slot
/// accept can then swap two paths (what resetall does on purpose). The
/// connections come from the engine, not from `ss`, which takes seconds to
/// start in a guest busy with the stream. None when it did not kill.
fn kill_one_when_all_up(ctx: &Ctx, engine: &rds_sock::Engine) -> Option<String> {
    let up = || {
        let mut c: Vec<(SocketAddr, SocketAddr)> = engine
            .tcp_connections()
            .into_iter()
            .filter_map(|r| match (r.path, r.local, r.peer) {
                (Some(_), Some(l), Some(p)) if p.ip() == ctx.peer => Some((l, p)),
                _ => None,
            })
            .collect();
        c.sort();
        c
    };
    if up().len() < 8 {
        return None;
    }
    std::thread::sleep(Duration::from_millis(500));
    let c = up();
    if c.len() < 8 {
        return None;
    }
    let (l, p) = c[c.len() / 2];
    sh(&format!("ss -K dst {} '( sport = :{} and dport = :{} )' >/dev/null", ctx.peer, l.port(), p.port()));
    Some(format!("ss -K {l}<->{p}"))
}

/// Which of our TCP connections the stream scenario kills every 2 s.
#[derive(Clone, Copy, PartialEq)]
enum Kill {
    /// One connection (one path): every message exactly once and in order.
    One,
    /// All of them at once: against a 6.1 kernel, paths may change
    /// sequence spaces, so losses and duplicates are counted, not failed.
    All,
}

/// Both sides stream on 8 flows for `secs` while connections are killed;
/// every sender ends its flow with END(count).
fn stream_scenario(ctx: &Ctx, name: &str, ours: &[u16], kernel: &[u16], secs: f64, kill: Kill) {
    let ss = socks(ctx, ours, 1 << 20);
    let flows: Vec<u32> = kernel.iter().zip(ours).map(|(a, b)| flow_id(*a, *b)).collect();
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, rc_size)));
    let engine = ss[0].engine().clone();
    let c0 = engine.counters();
    barrier(&format!("{name}-ready"), 120);
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let total = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for (s, d) in ss.iter().zip(kernel.iter().copied()) {
        let (s, errors, peer, stop, total) = (s.clone(), errors.clone(), ctx.peer, stop.clone(), total.clone());
        senders.push(std::thread::spawn(move || {
            s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
            let sport = s.local_addr().unwrap().port();
            let f = flow_id(sport, d);
            let dst = SocketAddr::new(peer, d);
            let mut i = 0u64;
            while !stop.load(SeqCst) {
                if let Err(e) = s.send_to(&payload(f, i, rc_size(f, i)), dst) {
                    errors.lock().unwrap().push(format!("send {sport} #{i}: {}", errno_name(&e)));
                    return;
                }
                i += 1;
                // Paced like the kernel side (about 100 messages/s per flow).
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Err(e) = s.send_to(&end_msg(i), dst) {
                errors.lock().unwrap().push(format!("send END {sport}: {}", errno_name(&e)));
            }
            total.fetch_add(i, SeqCst);
        }));
    }
    if std::env::var_os("CONFORM_TRACE").is_some() {
        // Which TCP connection (local port) served which of our paths.
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::HashSet::new();
            let t0 = Instant::now();
            while !stop.load(SeqCst) {
                for r in engine.tcp_connections() {
                    if let (Some(p), Some(l)) = (r.path, r.local) {
                        if seen.insert((p.index, l.port())) {
                            println!("TRACE {:.2}s path {} {}", t0.elapsed().as_secs_f64(), p.index, l.port());
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
    }
    let kills = Arc::new(Mutex::new(Vec::new()));
    // Single kills come from the side with the larger address only, one at
    // a time (see `kill_one_when_all_up`): kills from both sides at once
    // could leave two of a 6.1 kernel's slots free, and `ss` takes seconds
    // in a loaded guest, so timing cannot keep them apart.
    let kills_here = kill == Kill::All || ctx.larger();
    let killer = {
        let (stop, kills, peer, me, engine) = (stop.clone(), kills.clone(), ctx.peer, ctx.me, engine.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let ctx = Ctx { me, peer };
            std::thread::sleep(Duration::from_millis(1500));
            while kills_here && t0.elapsed().as_secs_f64() < secs - 0.5 {
                let t = t0.elapsed().as_secs_f64();
                let what = match kill {
                    Kill::All => Some(kill_all_ours(&ctx)),
                    Kill::One => kill_one_when_all_up(&ctx, &engine),
                };
                if let Some(what) = what {
                    kills.lock().unwrap().push(format!("{t:.1}s..{:.1}s {what}", t0.elapsed().as_secs_f64()));
                }
                std::thread::sleep(Duration::from_secs(2));
            }
            while t0.elapsed().as_secs_f64() < secs {
                std::thread::sleep(Duration::from_millis(100));
            }
            stop.store(true, SeqCst);
        })
    };
    let f2 = flows.clone();
    receive_all(&ss, &checker, move |c| c.ended(&f2), Instant::now() + Duration::from_secs_f64(secs + 120.0));
    let _ = killer.join();
    for t in senders {
        let _ = t.join();
    }
    let acked = flush_all(&ss, 60);
    let c1 = engine.counters();
    let d = |k: &str| {
        let get = |v: &Vec<(String, u64)>| v.iter().find(|(n, _)| n == k).map_or(0, |(_, x)| *x);
        get(&c1) - get(&c0)
    };
    info(name, &format!("our kills: {}", kills.lock().unwrap().join(", ")));
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict_gaps(&flows, None, kill == Kill::All);
    println!("GAPS {name} kernel->us {} {}", c.lost, c.dup);
    result(
        name,
        "kernel->us",
        ok,
        &format!(
            "{} messages on 8 flows {} (lost {}, duplicated {}); our conn_reset +{}, recv_drop_old_seq +{}{}",
            c.count,
            if kill == Kill::All { "exact and in order" } else { "exact, in order, no loss or duplicate" },
            c.lost,
            c.dup,
            d("conn_reset"),
            d("recv_drop_old_seq"),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    let errors = errors.lock().unwrap();
    // The side that kills must have killed something, or the scenario
    // tested nothing.
    let unkilled = kills_here && kills.lock().unwrap().is_empty();
    result(
        name,
        "us->kernel",
        errors.is_empty() && acked && !unkilled,
        &format!(
            "we sent {} messages + END on 8 flows{}{}{}",
            total.load(SeqCst),
            if acked { "" } else { "; NOT all acked" },
            if errors.is_empty() { String::new() } else { format!("; {}", errors.join("; ")) },
            if unkilled { "; we killed no connection" } else { "" }
        ),
    );
    barrier(&format!("{name}-done"), 180);
}

const RS_EPOCH2: u64 = 100_000;

fn rs_size(_: u32, _: u64) -> usize {
    1024
}

/// The first process of the restart scenario: exchanges 100 messages each
/// way with the kernel, then stops itself (SIGSTOP) so that the kernel's
/// next messages pile up unacked; the run script kills it (SIGKILL).
fn sc_restart_a(ctx: &Ctx) {
    let rx = sock(ctx, 7100, None, None).expect("bind");
    let tx = sock(ctx, 7101, None, None).expect("bind");
    let (f_in, f_out) = (flow_id(7200, 7100), flow_id(7101, 7201));
    barrier("rs-1", 120);
    for i in 0..100 {
        tx.send_to(&payload(f_out, i, 1024), SocketAddr::new(ctx.peer, 7201)).expect("send");
    }
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, rs_size)));
    let expect: HashMap<u32, u64> = [(f_in, 100)].into();
    let e2 = expect.clone();
    receive_all(
        std::slice::from_ref(&rx),
        &checker,
        move |c| c.complete(&e2),
        Instant::now() + Duration::from_secs(60),
    );
    let acked = tx.flush(Duration::from_secs(30));
    let (ok, note) = checker.lock().unwrap().verdict(&[f_in], Some(&expect));
    info(
        "restart",
        &format!("first process: epoch 1 received {} ({note}), sent all acked: {acked}", if ok { "ok" } else { "BAD" }),
    );
    barrier("rs-2", 60);
    // Stop: our TCP stops reading, the kernel's next burst stays unacked.
    // SAFETY: raise() with a valid signal number.
    unsafe { libc::raise(libc::SIGSTOP) };
    // Never continued: the run script kills us.
    std::thread::sleep(Duration::from_secs(600));
}

/// The restarted process: must never see a message sent to the first one.
fn sc_restart_b(ctx: &Ctx) {
    let rx = sock(ctx, 7100, None, None).expect("bind");
    let tx = sock(ctx, 7101, None, None).expect("bind");
    let (f_in, f_out) = (flow_id(7200, 7100), flow_id(7101, 7201));
    barrier("rs-6", 120);
    let sender = {
        let (tx, peer) = (tx.clone(), ctx.peer);
        std::thread::spawn(move || -> Result<(), String> {
            for k in 0..100 {
                tx.send_to(&payload(f_out, RS_EPOCH2 + k, 1024), SocketAddr::new(peer, 7201))
                    .map_err(|e| errno_name(&e))?;
            }
            Ok(())
        })
    };
    let stale = Arc::new(AtomicU64::new(0));
    let mut checker = FlowChecker::new(ctx.peer, rs_size);
    checker.next.insert(f_in, RS_EPOCH2);
    let checker = Arc::new(Mutex::new(checker));
    rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = vec![0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut done_at = None;
    let mut stale_idx = Vec::new();
    while Instant::now() < deadline && done_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_secs(2)) {
        match rx.recv_from(&mut buf) {
            Ok((n, from)) => {
                let d = &buf[..n];
                if index_of(d).is_some_and(|i| i < RS_EPOCH2) {
                    stale.fetch_add(1, SeqCst);
                    if stale_idx.len() < 5 {
                        stale_idx.push(index_of(d).unwrap());
                    }
                    continue;
                }
                let mut c = checker.lock().unwrap();
                c.add(from, 7100, d);
                if c.next.get(&f_in).copied() == Some(RS_EPOCH2 + 100) && done_at.is_none() {
                    done_at = Some(Instant::now());
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {}
            Err(e) => {
                checker.lock().unwrap().err(format!("recv: {}", errno_name(&e)));
                break;
            }
        }
    }
    let sent = sender.join().unwrap_or_else(|_| Err("panic".into()));
    let acked = tx.flush(Duration::from_secs(30));
    let expect: HashMap<u32, u64> = [(f_in, RS_EPOCH2 + 100)].into();
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&[f_in], Some(&expect));
    let n_stale = stale.load(SeqCst);
    let dropped = counter("recv_drop_stale");
    result(
        "restart",
        "kernel->us",
        ok && n_stale == 0,
        &format!(
            "restarted process: {}/100 new messages exact and in order, {n_stale} stale messages delivered{} \
             (our recv_drop_stale {dropped}, recv_drop_old_seq {}){}",
            c.count,
            if stale_idx.is_empty() { String::new() } else { format!(" (indexes {stale_idx:?})") },
            counter("recv_drop_old_seq"),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    result(
        "restart",
        "us->kernel",
        sent.is_ok() && acked,
        &format!(
            "restarted process sent 100, {}{}",
            if acked { "all acked" } else { "NOT all acked" },
            sent.err().map(|e| format!("; {e}")).unwrap_or_default()
        ),
    );
    barrier("rs-7", 120);
}

const ST_TOTAL: u64 = 50_000;
const ST_KPORT: u16 = 10000;
const ST_UPORT: u16 = 20000;

/// The kernel selftest's workload, our half (see the script's sc_selftest).
fn sc_selftest(ctx: &Ctx) {
    let me = SocketAddr::new(ctx.me, ST_UPORT);
    let peer = SocketAddr::new(ctx.peer, ST_KPORT);
    // (payload, destination, to the kernel?)
    let mut mine: Vec<(Vec<u8>, SocketAddr, bool)> = Vec::new();
    let mut expect = [Sha256::new(), Sha256::new()]; // [from us, from the kernel]
    let mut expect_n = [0u64; 2];
    for n in 0..ST_TOTAL {
        let d = Sha256::digest(format!("packet {n}").as_bytes());
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        let (from_k, to_k) = (d[0] & 1 == 0, d[1] & 1 == 0);
        if !from_k {
            mine.push((hex.clone().into_bytes(), if to_k { peer } else { me }, to_k));
        }
        if !to_k {
            let w = usize::from(from_k);
            expect[w].update(hex.as_bytes());
            expect_n[w] += 1;
        }
    }
    let s = sock(ctx, ST_UPORT, Some(1 << 20), Some(1 << 20)).expect("bind");
    s.set_nonblocking(true).unwrap();
    let nem = sh("tc qdisc replace dev eth0 root netem loss 1% corrupt 1% duplicate 1% 2>&1 && echo ok");
    info("selftest", &format!("netem loss 1% corrupt 1% duplicate 1% on eth0: {}", nem.trim()));
    let engine = s.engine().clone();
    let c0 = engine.counters();
    barrier("st-ready", 120);
    let mut got = [Sha256::new(), Sha256::new()];
    let mut got_n = [0u64; 2];
    let mut sent_k = Sha256::new();
    let mut stray = Vec::new();
    let mut idx = 0usize;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(240);
    let mut buf = vec![0u8; 4096];
    let mut next_kill = t0 + Duration::from_millis(900);
    let mut kills = 0;
    let done = |idx: usize, got_n: &[u64; 2]| idx >= mine.len() && got_n[0] >= expect_n[0] && got_n[1] >= expect_n[1];
    while !done(idx, &got_n) && Instant::now() < deadline {
        while idx < mine.len() {
            let (p, dst, to_k) = &mine[idx];
            match s.send_to(p, *dst) {
                Ok(_) => {
                    if *to_k {
                        sent_k.update(p);
                    }
                    idx += 1;
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EAGAIN | libc::ENOBUFS | libc::ECONNRESET | libc::EPIPE)
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    stray.push(format!("send: {}", errno_name(&e)));
                    idx = mine.len();
                }
            }
        }
        let mut pfd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 10) };
        while let Ok(m) = s.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() }) {
            let Some(from) = m.from else { continue };
            let w = if from == peer {
                1
            } else if from == me {
                0
            } else {
                stray.push(format!("from {from}"));
                continue;
            };
            got[w].update(&buf[..m.len]);
            got_n[w] += 1;
        }
        // Forced reconnects: the side with the larger address kills one TCP
        // connection now and then, one at a time (as in reconnect).
        if Instant::now() >= next_kill {
            if ctx.larger() && kill_one_when_all_up(ctx, &engine).is_some() {
                kills += 1;
            }
            next_kill = Instant::now() + Duration::from_millis(900);
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let acked = s.flush(Duration::from_secs(60));
    sh("tc qdisc del dev eth0 root 2>/dev/null");
    let c1 = engine.counters();
    let d = |k: &str| {
        let get = |v: &Vec<(String, u64)>| v.iter().find(|(n, _)| n == k).map_or(0, |(_, x)| *x);
        get(&c1) - get(&c0)
    };
    info(
        "selftest",
        &format!(
            "us: sent {idx}/{}, {kills} single-connection kills, conn_reset +{}, recv_drop_old_seq +{}, {elapsed:.1} s",
            mine.len(),
            d("conn_reset"),
            d("recv_drop_old_seq")
        ),
    );
    let hex = |h: &Sha256| h.clone().finalize().iter().map(|b| format!("{b:02x}")).collect::<String>();
    println!("HASH selftest sent us->kernel {} {}", mine.iter().filter(|m| m.2).count(), hex(&sent_k));
    println!("HASH selftest recv kernel->us {} {}", got_n[1], hex(&got[1]));
    let ok = got_n[1] == expect_n[1] && hex(&got[1]) == hex(&expect[1]) && stray.is_empty();
    result(
        "selftest",
        "kernel->us",
        ok,
        &format!(
            "{}/{} messages, running sha256 {} (loss/corrupt/duplicate 1%, {kills} single-connection kills by us, {elapsed:.0} s){}",
            got_n[1],
            expect_n[1],
            if ok { "equal" } else { "DIFFERENT" },
            if stray.is_empty() { String::new() } else { format!("; {}", stray[..stray.len().min(3)].join("; ")) }
        ),
    );
    let ok_self = got_n[0] == expect_n[0] && hex(&got[0]) == hex(&expect[0]);
    info(
        "selftest",
        &format!("us->us pair: {}/{} {}", got_n[0], expect_n[0], if ok_self { "equal" } else { "DIFFERENT" }),
    );
    result(
        "selftest",
        "us->kernel",
        idx == mine.len() && acked,
        &format!("we sent {idx}/{} of our messages{}", mine.len(), if acked { "" } else { ", NOT all acked" }),
    );
    barrier("st-done", 300);
}

/// `kinfo counters|send|retrans`: the kernel's RDS_INFO_* (run on the
/// kernel's guest for the script, whose getsockopt is limited to 1 KiB).
fn kinfo(what: &str) -> i32 {
    const SOL_RDS: i32 = 276;
    let (opt, item) = match what {
        "counters" => (10000, 40),
        "send" => (10003, 26),
        "retrans" => (10004, 26),
        _ => return 2,
    };
    // SAFETY: plain socket/getsockopt/close on a buffer we own.
    unsafe {
        let fd = libc::socket(21, libc::SOCK_SEQPACKET, 0);
        if fd < 0 {
            eprintln!("socket(AF_RDS): {}", io::Error::last_os_error());
            return 1;
        }
        let mut buf = vec![0u8; 1 << 16];
        let mut len;
        loop {
            len = buf.len() as libc::socklen_t;
            if libc::getsockopt(fd, SOL_RDS, opt, buf.as_mut_ptr().cast(), &mut len) >= 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOSPC) || buf.len() >= 1 << 26 {
                eprintln!("getsockopt({opt}): {e}");
                libc::close(fd);
                return 1;
            }
            buf.resize((len as usize).max(buf.len() * 2), 0);
        }
        libc::close(fd);
        for r in buf[..len as usize].chunks_exact(item) {
            if what == "counters" {
                let name = String::from_utf8_lossy(&r[..32]).trim_end_matches('\0').to_string();
                println!("{name} {}", u64::from_le_bytes(r[32..40].try_into().unwrap()));
            } else {
                let seq = u64::from_le_bytes(r[..8].try_into().unwrap());
                let len = u32::from_le_bytes(r[8..12].try_into().unwrap());
                let lport = u16::from_be_bytes([r[20], r[21]]);
                let fport = u16::from_be_bytes([r[22], r[23]]);
                println!("{seq} {len} {lport} {fport}");
            }
        }
    }
    0
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("kinfo") {
        std::process::exit(kinfo(args.get(1).map_or("", String::as_str)));
    }
    if args.first().map(String::as_str) == Some("barrier") {
        let secs = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(120);
        std::process::exit(if barrier(args.get(1).map_or("x", String::as_str), secs) { 0 } else { 1 });
    }
    let get =
        |k: &str| args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<IpAddr>().ok());
    let (Some(scenario), Some(me), Some(peer)) = (args.first(), get("--self"), get("--peer")) else {
        eprintln!("usage: rds-conform SCENARIO --self ADDR --peer ADDR");
        std::process::exit(2);
    };
    let ctx = Ctx { me, peer };
    match scenario.as_str() {
        "ping" => sc_ping(&ctx),
        "tools" => sc_tools(&ctx),
        "datagrams" => sc_datagrams(&ctx),
        "congestion" => sc_congestion(&ctx),
        "mprds" => sc_mprds(&ctx),
        "reconnect" => {
            stream_scenario(&ctx, "reconnect", &(8096..8104).collect::<Vec<u16>>(), &lane_ports(9100), 12.0, Kill::One)
        }
        "resetall" => {
            stream_scenario(&ctx, "resetall", &(8096..8104).collect::<Vec<u16>>(), &lane_ports(9100), 12.0, Kill::All)
        }
        "restart-a" => sc_restart_a(&ctx),
        "restart-b" => sc_restart_b(&ctx),
        "selftest" => sc_selftest(&ctx),
        other => {
            eprintln!("rds-conform: unknown scenario {other}");
            std::process::exit(2);
        }
    }
    // Give the kernel's TCP acks a moment, then leave without closing
    // sockets in an order that could drop anything.
    std::process::exit(0);
}
