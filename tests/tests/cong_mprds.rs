//! Congestion control, multipath (mprds), RDS_CANCEL_SENT_TO and
//! SO_TIMESTAMP through the socket API, over real TCP between engines, with
//! the engines' snapshots (what rds-info shows) as the window into queues
//! and paths.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime};

use rds_core::wire::{self, Ext, FrameDecoder, Header, Kind};
use rds_core::{PathState, Queue};
use rds_sock::{Engine, EngineConfig, RdsSocket, RecvFlags};
use rds_tests::*;

const LONG: Duration = Duration::from_secs(20);

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// poll(2) on a socket's readiness descriptor.
fn poll_fd(s: &RdsSocket, events: i16, timeout: Duration) -> bool {
    let mut p = libc::pollfd { fd: s.as_raw_fd(), events, revents: 0 };
    // SAFETY: one valid pollfd, alive for the call.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) };
    n == 1 && p.revents & events != 0
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + LONG;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Payload bytes queued on the receive queue of the socket bound to `at`.
fn rcv_bytes(e: &Engine, at: SocketAddr) -> u64 {
    e.sockets().into_iter().find(|s| s.bound == Some(at)).expect("socket").rcv_bytes
}

fn snd_bytes(e: &Engine, at: SocketAddr) -> u64 {
    e.sockets().into_iter().find(|s| s.bound == Some(at)).expect("socket").snd_bytes
}

/// Receives `n` datagrams of flow `flow` from `from`, checking each is the
/// next index from `first` (payload built by `payload`).
fn expect_flow(r: &RdsSocket, from: SocketAddr, flow: u32, first: u64, n: u64) {
    let mut buf = vec![0u8; 1 << 20];
    r.set_read_timeout(Some(LONG)).unwrap();
    for i in first..first + n {
        let (len, who) = r.recv_from(&mut buf).unwrap_or_else(|e| panic!("flow {flow}: waiting for index {i}: {e}"));
        assert_eq!(who, from);
        check_payload(flow, i, &buf[..len]).unwrap();
    }
}

/// Nothing more arrives within a moment.
fn expect_nothing(r: &RdsSocket) {
    r.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 64];
    let e = r.recv_from(&mut buf).expect_err("no further datagram");
    assert_eq!(errno(&e), libc::ETIMEDOUT);
}

// ----------------------------------------------------------------------
// Congestion
// ----------------------------------------------------------------------

/// An engine whose TCP sockets have small buffers, and whose transport
/// reads at most `read_budget` bytes of a connection before delivering.
fn small_tcp_engine(tcp_buf: usize, read_budget: usize) -> Engine {
    let mut cfg = EngineConfig::default();
    cfg.tcp.sndbuf = Some(tcp_buf);
    cfg.tcp.rcvbuf = Some(tcp_buf);
    cfg.tcp.read_budget = read_budget.min(cfg.tcp.read_budget);
    Engine::new(cfg).unwrap()
}

/// Two engines with small TCP buffers (32 KiB), a sender bound at
/// `ip(1)`:5000 and a receiver at `ip(2)`:4000 whose socket may queue
/// 16 KiB (SO_RCVBUF 16 KiB: RDS uses half of the doubled value).
fn small_pair(ip: &impl Fn(u8) -> std::net::IpAddr) -> (Engine, Engine, RdsSocket, RdsSocket) {
    let (e1, e2) = (small_tcp_engine(32 << 10, usize::MAX), small_tcp_engine(32 << 10, usize::MAX));
    let s = e1.socket().unwrap();
    s.bind(sa(ip(1), 5000)).unwrap();
    let r = e2.socket().unwrap();
    r.bind(sa(ip(2), 4000)).unwrap();
    r.set_recv_buffer_size(16 << 10).unwrap();
    (e1, e2, s, r)
}

#[test]
fn slow_receiver_enobufs_then_blocking_then_everything_once_in_order() {
    let ip = addr_block(44);
    // Small TCP buffers: what TCP acked but the receiving node has not read
    // yet is part of what can be in flight past a congested port.
    let (e1, e2, s, r) = small_pair(&ip);
    let (src, dst) = (sa(ip(1), 5000), sa(ip(2), 4000));
    // RDS uses half: 16 KiB of receive queue, 16 KiB unacked.
    s.set_send_buffer_size(16 << 10).unwrap();
    let (rcv_limit, snd_limit) = (16u64 << 10, 16u64 << 10);
    const LEN: usize = 1024;
    // The receiver's queue passes its limit by what was in flight until the
    // sender saw the map (the sender's unacked bytes, both TCP buffers, a
    // read batch): tens of KiB here, well under this bound, which is a
    // small part of the 2+ MiB sent.
    let bound = 512u64 << 10;

    s.set_nonblocking(true).unwrap();
    let mut sent = 0u64;
    let mut peak_rcv = 0;
    let end = Instant::now() + LONG;
    loop {
        match s.send_to(&payload(1, sent, LEN), dst) {
            Ok(n) => {
                assert_eq!(n, LEN);
                sent += 1;
                let q = snd_bytes(&e1, src);
                assert!(q <= snd_limit + LEN as u64, "sender holds {q} bytes unacked");
            }
            Err(e) if errno(&e) == libc::ENOBUFS => break,
            Err(e) if errno(&e) == libc::EAGAIN => {
                assert!(poll_fd(&s, libc::POLLOUT, LONG), "writable again once acked");
            }
            Err(e) => panic!("send {sent}: {e}"),
        }
        peak_rcv = peak_rcv.max(rcv_bytes(&e2, dst));
        assert!(Instant::now() < end, "no ENOBUFS after {sent} datagrams: congestion does not work");
    }
    assert!(sent as usize * LEN > rcv_limit as usize, "congested only past the receive buffer ({sent} sent)");
    // Congested stays congested: more attempts fail and queue nothing.
    for _ in 0..50 {
        assert_eq!(errno(&s.send_to(&payload(1, sent, LEN), dst).unwrap_err()), libc::ENOBUFS);
    }
    assert!(counter(&e1, "cong_send_error") >= 51);
    // Everything sent arrived on the receive queue, nothing else.
    wait_for("the sent datagrams on the receiver's queue", || e2.messages(Queue::Recv).len() as u64 == sent);
    let q = rcv_bytes(&e2, dst);
    assert_eq!(q, sent * LEN as u64);
    assert!(q.max(peak_rcv) <= bound, "receive queue reached {} bytes (bound {bound})", q.max(peak_rcv));
    let sock = e2.sockets().into_iter().find(|k| k.bound == Some(dst)).unwrap();
    assert!(sock.congested && sock.rcvbuf as u64 == rcv_limit, "{sock:?}");

    // A blocking sender waits while the port is congested.
    s.set_nonblocking(false).unwrap();
    s.set_write_timeout(Some(LONG)).unwrap();
    const MORE: u64 = 2000;
    let done = Arc::new(AtomicU64::new(0));
    let s = Arc::new(s);
    let sender = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            for i in sent..sent + MORE {
                s.send_to(&payload(1, i, LEN), dst).unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    wait_for("the sender to block", || counter(&e1, "cong_send_blocked") >= 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(done.load(Ordering::SeqCst), 0, "a blocking send went through to a congested port");

    // The receiver drains, slower than the sender sends (the port congests
    // again and again): every datagram exactly once, in order, and the
    // receive queue stays bounded.
    let mut buf = vec![0u8; 2 * LEN];
    r.set_read_timeout(Some(LONG)).unwrap();
    let mut peak = 0;
    for i in 0..sent + MORE {
        let (n, from) = r.recv_from(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
        assert_eq!(from, src);
        check_payload(1, i, &buf[..n]).unwrap();
        if i % 16 == 0 {
            peak = peak.max(rcv_bytes(&e2, dst));
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    sender.join().unwrap();
    assert_eq!(done.load(Ordering::SeqCst), MORE);
    assert!(peak <= bound, "receive queue reached {peak} bytes while draining (bound {bound})");
    assert!(counter(&e1, "cong_send_blocked") >= 2, "the sender met congestion while the receiver drained");
    assert_eq!(counter(&e2, "recv_drop_over_limit"), 0);
    expect_nothing(&r);
    assert!(s.flush(LONG));
    assert!(e1.messages(Queue::Send).is_empty() && e1.messages(Queue::Retrans).is_empty());
    assert_eq!(snd_bytes(&e1, src), 0);
    assert!(counter(&e2, "cong_update_queued") >= 2, "congested and uncongested maps");
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

/// Two engines with small buffers, the receiver's port congested by
/// non-blocking sends until ENOBUFS; returns (sender engine, receiver
/// engine, sender, receiver, datagrams sent).
fn congested_pair(ip: impl Fn(u8) -> std::net::IpAddr) -> (Engine, Engine, RdsSocket, RdsSocket, u64) {
    let (e1, e2, s, r) = small_pair(&ip);
    let dst = sa(ip(2), 4000);
    s.set_nonblocking(true).unwrap();
    let mut sent = 0u64;
    let end = Instant::now() + LONG;
    loop {
        match s.send_to(&payload(1, sent, 1024), dst) {
            Ok(_) => sent += 1,
            Err(e) if errno(&e) == libc::ENOBUFS => break,
            Err(e) if errno(&e) == libc::EAGAIN => assert!(poll_fd(&s, libc::POLLOUT, LONG)),
            Err(e) => panic!("send {sent}: {e}"),
        }
        assert!(Instant::now() < end, "no ENOBUFS after {sent} datagrams");
    }
    (e1, e2, s, r, sent)
}

/// The C ABI's blocking send (`RdsSocket::send_msg_wait`, whatever the
/// socket's own mode) to a congested port waits for the congestion map
/// that clears it, as the kernel's `rds_cong_wait`: it is counted as
/// blocked (`cong_send_blocked`, not `cong_send_error`), it tries again
/// only when the socket is woken, not on a timer (the wait it replaced
/// slept 50 us doubling to 1 ms: hundreds of tries in the 300 ms here),
/// and it goes through once the receiver drained.
#[test]
fn a_blocking_c_send_waits_for_the_map_that_clears_the_port() {
    let ip = addr_block(44);
    let (e1, e2, s, r, sent) = congested_pair(ip);
    let dst = sa(ip(2), 4000);
    let (errors, blocked) = (counter(&e1, "cong_send_error"), counter(&e1, "cong_send_blocked"));
    let done = Arc::new(AtomicBool::new(false));
    let s = Arc::new(s);
    let sender = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            let flags = rds_sock::SendFlags::default();
            let n = s.send_msg_wait(&payload(1, sent, 1024), Some(dst), &flags, Some(Instant::now() + LONG)).unwrap();
            done.store(true, Ordering::SeqCst);
            n
        })
    };
    wait_for("the sender to block", || counter(&e1, "cong_send_blocked") > blocked);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!done.load(Ordering::SeqCst), "a blocking send went through to a congested port");
    let tries = counter(&e1, "cong_send_blocked") - blocked;
    assert!(tries <= 10, "{tries} tries in 300 ms: the wait is a timer, not the map");
    let mut buf = vec![0u8; 2048];
    r.set_read_timeout(Some(LONG)).unwrap();
    for i in 0..=sent {
        let (n, _) = r.recv_from(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
        check_payload(1, i, &buf[..n]).unwrap();
    }
    assert_eq!(sender.join().unwrap(), 1024);
    assert_eq!(counter(&e1, "cong_send_error"), errors, "a blocking send counted as a non-blocking one");
    expect_nothing(&r);
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

extern "C" fn on_usr1(_: libc::c_int) {}

/// A signal ends the wait of a blocking C send (`send_msg_wait`) with
/// EINTR, as it ends the kernel's: the wait is a `ppoll`, and nothing
/// was queued.
#[test]
fn a_signal_interrupts_a_blocking_c_send() {
    let ip = addr_block(44);
    let (e1, e2, s, r, sent) = congested_pair(ip);
    let dst = sa(ip(2), 4000);
    // SAFETY: installs a handler that does nothing, without SA_RESTART,
    // for SIGUSR1, which nothing else in this test binary uses.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let blocked = counter(&e1, "cong_send_blocked");
    let (tx, rx) = mpsc::channel();
    let s = Arc::new(s);
    let sender = {
        let s = s.clone();
        std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let flags = rds_sock::SendFlags::default();
            s.send_msg_wait(&payload(1, sent, 1024), Some(dst), &flags, Some(Instant::now() + LONG))
        })
    };
    let thread = rx.recv().unwrap();
    wait_for("the sender to block", || counter(&e1, "cong_send_blocked") > blocked);
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: the sender thread is alive until joined below.
    assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
    let e = sender.join().unwrap().expect_err("interrupted");
    assert_eq!(errno(&e), libc::EINTR);
    // What was sent before arrives; the interrupted datagram does not.
    let mut buf = vec![0u8; 2048];
    r.set_read_timeout(Some(LONG)).unwrap();
    for i in 0..sent {
        let (n, _) = r.recv_from(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
        check_payload(1, i, &buf[..n]).unwrap();
    }
    expect_nothing(&r);
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

#[test]
fn a_conformant_sender_to_a_tiny_receive_buffer_loses_nothing() {
    // 64 KiB datagrams to a socket that may queue 2 KiB: far more than 16 x
    // its buffer is in flight before the sender sees the map. That used to
    // exceed the hard receive cap, and datagrams our TCP had acked were
    // dropped (recv_drop_over_limit).
    let ip = addr_block(44);
    let (e1, e2) = (engine(), engine());
    let (src, dst) = (sa(ip(1), 5000), sa(ip(2), 4000));
    let s = e1.socket().unwrap();
    s.bind(src).unwrap();
    s.set_send_buffer_size_force(8 << 20).unwrap();
    s.set_write_timeout(Some(LONG)).unwrap();
    let r = e2.socket().unwrap();
    r.bind(dst).unwrap();
    r.set_recv_buffer_size(4096).unwrap();
    const N: u64 = 400;
    const LEN: usize = 64 << 10;
    let sender = std::thread::spawn(move || {
        for i in 0..N {
            s.send_to(&payload(7, i, LEN), dst).unwrap();
        }
        s
    });
    let mut buf = vec![0u8; LEN];
    r.set_read_timeout(Some(LONG)).unwrap();
    for i in 0..N {
        let (n, from) = r.recv_from(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
        assert_eq!(from, src);
        check_payload(7, i, &buf[..n])
            .unwrap_or_else(|e| panic!("{e} (over limit: {})", counter(&e2, "recv_drop_over_limit")));
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let s = sender.join().unwrap();
    expect_nothing(&r);
    assert!(s.flush(LONG));
    assert_eq!(counter(&e2, "recv_drop_over_limit"), 0);
    assert!(counter(&e1, "cong_send_blocked") >= 1, "the port was congested");
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

/// Sends 1 KiB datagrams from the non-blocking `s` to `dst` until ENOBUFS.
fn fill_until_enobufs(s: &RdsSocket, dst: SocketAddr, flow: u32) -> u64 {
    let end = Instant::now() + LONG;
    let mut i = 0;
    loop {
        match s.send_to(&payload(flow, i, 1024), dst) {
            Ok(_) => i += 1,
            Err(e) if errno(&e) == libc::ENOBUFS => return i,
            Err(e) if errno(&e) == libc::EAGAIN => assert!(poll_fd(s, libc::POLLOUT, LONG)),
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < end, "{dst} never congested");
    }
}

#[test]
fn cong_monitor_reports_exactly_the_port_groups_that_cleared() {
    let ip = addr_block(44);
    let (e1, e2) = (engine(), engine());
    let s = e1.socket().unwrap();
    s.bind(sa(ip(1), 5000)).unwrap();
    s.set_nonblocking(true).unwrap();
    s.set_cong_monitor(true).unwrap();
    // A monitoring socket that never meets congestion.
    let quiet = e1.socket().unwrap();
    quiet.bind(sa(ip(1), 5001)).unwrap();
    quiet.set_cong_monitor(true).unwrap();
    quiet.set_nonblocking(true).unwrap();
    // Ports 4000, 4001 and 4002 are port groups 32, 33 and 34.
    let (p1, p2, p3) = (sa(ip(2), 4000), sa(ip(2), 4001), sa(ip(2), 4002));
    let rs: Vec<RdsSocket> = [p1, p2, p3]
        .iter()
        .map(|a| {
            let r = e2.socket().unwrap();
            r.bind(*a).unwrap();
            r
        })
        .collect();
    rs[0].set_recv_buffer_size(4096).unwrap();
    rs[1].set_recv_buffer_size(4096).unwrap();

    let n1 = fill_until_enobufs(&s, p1, 1);
    let n2 = fill_until_enobufs(&s, p2, 2);
    s.send_to(&payload(3, 0, 100), p3).unwrap();
    // Both congested, nothing cleared: no notification.
    assert!(!poll_fd(&s, libc::POLLIN, Duration::from_millis(200)), "readable without a cleared group");
    let mut buf = vec![0u8; 4096];
    let dontwait = RecvFlags { dontwait: true, ..RecvFlags::default() };
    assert_eq!(errno(&s.recv_msg(&mut buf, dontwait).unwrap_err()), libc::EAGAIN);

    for (k, (r, from_flow, n, group)) in [(&rs[0], 1u32, n1, 32u32), (&rs[1], 2, n2, 33)].into_iter().enumerate() {
        expect_flow(r, sa(ip(1), 5000), from_flow, 0, n);
        // The receiver drained: its port clears, the map goes out, and the
        // monitoring sender's descriptor becomes readable with exactly that
        // port group.
        assert!(poll_fd(&s, libc::POLLIN, LONG), "no notification for group {group}");
        let m = s.recv_msg(&mut buf, dontwait).unwrap();
        assert_eq!(m.cong_update, Some(1u64 << group), "notification {k}");
        assert_eq!((m.len, m.from, m.rdma_status), (0, None, None));
        assert_eq!(errno(&s.recv_msg(&mut buf, dontwait).unwrap_err()), libc::EAGAIN);
        assert!(!poll_fd(&s, libc::POLLIN, Duration::from_millis(100)), "readable after the notification was read");
    }
    // The socket that never saw congestion was never notified.
    assert!(!poll_fd(&quiet, libc::POLLIN, Duration::ZERO));
    assert_eq!(errno(&quiet.recv_msg(&mut buf, dontwait).unwrap_err()), libc::EAGAIN);
    // Both ports take datagrams again.
    s.send_to(&payload(1, n1, 10), p1).unwrap();
    s.send_to(&payload(2, n2, 10), p2).unwrap();
    expect_flow(&rs[0], sa(ip(1), 5000), 1, n1, 1);
    expect_flow(&rs[1], sa(ip(1), 5000), 2, n2, 1);
    expect_flow(&rs[2], sa(ip(1), 5000), 3, 0, 1);
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

// ----------------------------------------------------------------------
// RDS_CANCEL_SENT_TO
// ----------------------------------------------------------------------

/// Holds the engine's node lock until the returned sender is dropped or
/// sent to: its transport cannot deliver, so its TCP windows fill up.
fn freeze(e: &Engine) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (release, wait) = mpsc::channel::<()>();
    let (frozen, is_frozen) = mpsc::channel::<()>();
    let e = e.clone();
    let h = std::thread::spawn(move || {
        e.with_node(|_| {
            frozen.send(()).unwrap();
            let _ = wait.recv_timeout(LONG);
        })
    });
    is_frozen.recv().unwrap();
    (release, h)
}

#[test]
fn cancel_sent_to_drops_that_destinations_queued_and_unacked_messages_only() {
    let ip = addr_block(44);
    // Small TCP buffers, and a receiver that reads at most 64 KiB before
    // handing over (and then blocks, frozen): most datagrams stay with us.
    let (e1, e2) = (small_tcp_engine(64 << 10, usize::MAX), small_tcp_engine(64 << 10, 64 << 10));
    let src = sa(ip(1), 5000);
    let s = e1.socket().unwrap();
    s.bind(src).unwrap();
    s.set_send_buffer_size_force(16 << 20).unwrap();
    let (da, db) = (sa(ip(2), 4000), sa(ip(2), 4001));
    let ra = e2.socket().unwrap();
    ra.bind(da).unwrap();
    let rb = e2.socket().unwrap();
    rb.bind(db).unwrap();
    for r in [&ra, &rb] {
        r.set_recv_buffer_size_force(16 << 20).unwrap();
    }
    // Connection and paths up first.
    s.send_to(&payload(0, 0, 16), da).unwrap();
    s.send_to(&payload(1, 0, 16), db).unwrap();
    expect_flow(&ra, src, 0, 0, 1);
    expect_flow(&rb, src, 1, 0, 1);
    assert!(s.flush(LONG));

    // The receiver stalls; 2 x 300 datagrams of 8 KB go out alternately.
    // The length names the datagram: 8000 + 2 * index (+1 for rb).
    let (release, frozen) = freeze(&e2);
    const N: u64 = 300;
    let len = |flow: u32, i: u64| 8000 + 2 * i as usize + flow as usize;
    for i in 1..=N {
        s.send_to(&payload(0, i, len(0, i)), da).unwrap();
        s.send_to(&payload(1, i, len(1, i)), db).unwrap();
    }
    // Wait until the queues stopped moving (TCP windows full).
    let snap = || (e1.messages(Queue::Send), e1.messages(Queue::Retrans));
    let mut before = snap();
    loop {
        std::thread::sleep(Duration::from_millis(150));
        let now = snap();
        if now == before {
            break;
        }
        before = now;
    }
    let (queued, unacked) = before;
    let index = |m: &rds_core::MsgSnapshot| (m.len as u64 - 8000) / 2;
    let of = |list: &[rds_core::MsgSnapshot], port: u16| -> Vec<u64> {
        list.iter().filter(|m| m.fport == port).map(index).collect()
    };
    let (qa, ua, qb, ub) = (of(&queued, 4000), of(&unacked, 4000), of(&queued, 4001), of(&unacked, 4001));
    let tcp = e1.tcp_connections();
    assert!(
        !qa.is_empty() && !qb.is_empty(),
        "some never transmitted: {qa:?} {qb:?}; unacked {ua:?} {ub:?}; tcp {tcp:?}; {}",
        e1.with_node(|n| n.dump())
    );
    assert!(!ua.is_empty() && !ub.is_empty(), "some transmitted and unacked: {ua:?} {ub:?}");
    // Sent in order: the never-transmitted ones are a suffix.
    let k = N + 1 - qa.len() as u64;
    assert_eq!(qa, (k..=N).collect::<Vec<_>>());
    // (A pong to the peer's probe may be queued too: it is no datagram.)
    assert!(
        queued
            .iter()
            .chain(&unacked)
            .filter(|m| m.fport == 4000 || m.fport == 4001)
            .all(|m| m.laddr == src.ip() && m.lport == 5000 && m.faddr == da.ip())
    );

    let cancelled_before = counter(&e1, "send_drop_cancelled");
    let n = s.cancel_sent_to(da).unwrap();
    assert_eq!(n, qa.len() + ua.len(), "exactly the queued and unacked datagrams to {da}");
    assert_eq!(counter(&e1, "send_drop_cancelled") - cancelled_before, n as u64);
    let (q2, u2) = snap();
    assert!(of(&q2, 4000).is_empty() && of(&u2, 4000).is_empty(), "nothing left for {da}");
    assert_eq!((of(&q2, 4001), of(&u2, 4001)), (qb.clone(), ub.clone()), "{db} untouched");
    // Cancelling again finds nothing; another port of that address is another destination.
    assert_eq!(s.cancel_sent_to(da).unwrap(), 0);

    release.send(()).unwrap();
    frozen.join().unwrap();
    // db gets everything; da gets what had been handed to TCP (bytes on the
    // wire cannot be recalled, as in the kernel) and none of the queued ones.
    expect_flow(&rb, src, 1, 1, N);
    expect_flow(&ra, src, 0, 1, k - 1);
    expect_nothing(&ra);
    expect_nothing(&rb);
    assert!(s.flush(LONG));
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

// ----------------------------------------------------------------------
// Multipath
// ----------------------------------------------------------------------

#[test]
fn eight_paths_between_two_of_our_nodes() {
    let ip = addr_block(44);
    let (e1, e2) = (engine(), engine());
    let s = e1.socket().unwrap();
    s.bind(sa(ip(1), 5000)).unwrap();
    let r = e2.socket().unwrap();
    r.bind(sa(ip(2), 4000)).unwrap();
    s.send_to(&payload(0, 0, 100), sa(ip(2), 4000)).unwrap();
    expect_flow(&r, sa(ip(1), 5000), 0, 0, 1);
    for (e, l, f) in [(&e1, ip(1), ip(2)), (&e2, ip(2), ip(1))] {
        wait_for("8 paths up", || e.connections().iter().any(|c| c.laddr == l && c.faddr == f && c.paths_up() == 8));
        let conns = e.connections();
        assert_eq!(conns.len(), 1, "{conns:?}");
        let c = &conns[0];
        assert_eq!((c.npaths, c.paths.len(), c.transport), (8, 8, rds_sock::TransportKind::Tcp));
        for (i, p) in c.paths.iter().enumerate() {
            assert_eq!((p.index as usize, p.state, p.connects), (i, PathState::Up, 1), "{p:?}");
        }
        // The transport registers an accepted connection just after the
        // core took it.
        let tcp_paths = || {
            let mut idx: Vec<u8> = e.tcp_connections().iter().map(|t| t.path.unwrap().index).collect();
            idx.sort();
            idx
        };
        wait_for("8 TCP connections", || tcp_paths().len() == 8);
        assert_eq!(tcp_paths(), (0..8).collect::<Vec<u8>>());
    }
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

/// A raw-TCP RDS peer that answers the multipath probe with a pong without
/// extension headers (a peer without mprds) and records what it receives.
struct LegacyPeer {
    stop: Arc<AtomicBool>,
    accepts: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Vec<Header>>>,
    data: mpsc::Receiver<(Header, Vec<u8>)>,
}

impl LegacyPeer {
    fn start(at: SocketAddr) -> LegacyPeer {
        let l = TcpListener::bind(at).unwrap();
        l.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let accepts = Arc::new(AtomicU64::new(0));
        let (tx, data) = mpsc::channel();
        let (stop2, accepts2) = (stop.clone(), accepts.clone());
        let thread = std::thread::spawn(move || {
            let mut conns: Vec<(TcpStream, FrameDecoder, u64)> = Vec::new();
            let mut probes = Vec::new();
            let mut buf = vec![0u8; 256 << 10];
            while !stop2.load(Ordering::SeqCst) {
                if let Ok((c, _)) = l.accept() {
                    accepts2.fetch_add(1, Ordering::SeqCst);
                    c.set_nonblocking(true).unwrap();
                    conns.push((c, FrameDecoder::default(), 1));
                }
                let mut idle = true;
                for (c, dec, next_seq) in conns.iter_mut() {
                    let n = match c.read(&mut buf) {
                        Ok(0) | Err(_) => continue,
                        Ok(n) => n,
                    };
                    idle = false;
                    let mut frames = Vec::new();
                    dec.feed(&buf[..n], &mut |f| frames.push(f)).unwrap();
                    for f in frames {
                        match f.header.kind() {
                            Kind::ProbePing => {
                                probes.push(f.header);
                                let pong = Header { sequence: *next_seq, ..Header::data(0, wire::PROBE_PORT, 0) };
                                *next_seq += 1;
                                c.set_nonblocking(false).unwrap();
                                c.write_all(&pong.to_bytes()).unwrap();
                                c.set_nonblocking(true).unwrap();
                            }
                            Kind::Data => tx.send((f.header, f.payload)).unwrap(),
                            _ => {}
                        }
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            probes
        });
        LegacyPeer { stop, accepts, thread: Some(thread), data }
    }

    fn finish(mut self) -> Vec<Header> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

#[test]
fn one_path_against_a_peer_whose_pong_has_no_npaths() {
    let ip = addr_block(44);
    let cfg = EngineConfig::default();
    let (port, gen_num) = (cfg.tcp.port, cfg.node.gen_num);
    let peer = LegacyPeer::start(SocketAddr::new(ip(2), port));
    let e = Engine::new(cfg).unwrap();
    // Eight sockets whose ports would spread over eight lanes.
    let socks: Vec<RdsSocket> = (0..8u16)
        .map(|i| {
            let s = e.socket().unwrap();
            s.bind(sa(ip(1), 5000 + i)).unwrap();
            s
        })
        .collect();
    const N: u64 = 20;
    for i in 0..N {
        for (f, s) in socks.iter().enumerate() {
            s.send_to(&payload(f as u32, i, 64 + i as usize), sa(ip(2), 4000)).unwrap();
        }
    }
    // Every datagram arrives on the one connection, each flow in order.
    let mut next = [0u64; 8];
    for _ in 0..8 * N {
        let (h, p) = peer.data.recv_timeout(LONG).expect("datagram at the legacy peer");
        let f = usize::from(h.sport - 5000);
        assert_eq!(h.dport, 4000);
        check_payload(f as u32, next[f], &p).unwrap();
        next[f] += 1;
    }
    assert_eq!(next, [N; 8]);
    for s in &socks {
        assert!(s.flush(LONG), "acked by the peer's TCP");
    }
    // No further connection is attempted.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(peer.accepts.load(Ordering::SeqCst), 1);
    let c = e.connections().into_iter().find(|c| c.faddr == ip(2)).unwrap();
    assert_eq!((c.npaths, c.paths_up(), c.path0().state), (1, 1, PathState::Up));
    assert!(c.paths[1..].iter().all(|p| p.state == PathState::Down && p.connects == 0), "{c:?}");
    assert_eq!(c.path0().next_tx_seq, 1 + 1 + 8 * N, "the probe and the datagrams, all on path 0");
    assert_eq!(e.tcp_connections().len(), 1);
    let probes = peer.finish();
    assert_eq!(probes.len(), 1, "one probe");
    // HandshakeExts::Full (the default): our generation follows NPATHS.
    assert_eq!(probes[0].extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8), Ext::GenNum(gen_num)]);
    e.shutdown(Duration::ZERO);
}

#[test]
fn flows_keep_their_order_across_the_fan_out_from_path_0() {
    fan_out_in_order(1, 1, 0, None);
}

/// The same with the receiver's transport reading at most 4 KiB of a
/// connection per pass, behind 40 KiB first datagrams: path 0 still holds
/// bytes when the lanes' first datagrams could arrive (a blocked receiver
/// reading the connections itself, `rds_tcp`'s assist, stops on path 0 at
/// the budget), and the lanes wait for the peer's proof that it read them
/// (`rds_core::lane0`).
#[test]
fn flows_keep_their_order_when_path_0_is_read_in_small_passes() {
    fan_out_in_order(1, 1, 40_000, Some(4096));
}

/// The same with the paths of each node spread over reactor threads (three
/// on the sender, two on the receiver): the lanes are read by other
/// threads than path 0, in no particular order.
#[test]
fn flows_keep_their_order_across_the_fan_out_read_by_two_reactors() {
    fan_out_in_order(3, 2, 40_000, None);
}

/// 16 sockets (two per lane) send their first datagrams on path 0 before
/// the handshake, then on their own lanes: every flow arrives in order.
/// `tx_threads`, `rx_threads`: the reactor threads of the sending and
/// receiving engines; `first_len`: the first datagrams' extra bytes (more
/// bytes on path 0 still unread when the lanes' first datagrams arrive);
/// `rx_budget`: the receiving transport's `read_budget`, if not the default.
fn fan_out_in_order(tx_threads: usize, rx_threads: usize, first_len: usize, rx_budget: Option<usize>) {
    let ip = addr_block(44);
    let engine = |threads: usize, budget: Option<usize>| {
        let mut cfg = EngineConfig::default();
        cfg.tcp.threads = threads;
        if let Some(b) = budget {
            cfg.tcp.read_budget = b;
        }
        Engine::new(cfg).unwrap()
    };
    let e1 = engine(tx_threads, None);
    const SOCKS: u16 = 16;
    const FIRST: u64 = 20;
    const MID: u64 = 100;
    const N: u64 = 400;
    let dst = sa(ip(2), 4000);
    // Ports 6000.. are lanes 0..7, two sockets each.
    let socks: Vec<Arc<RdsSocket>> = (0..SOCKS)
        .map(|i| {
            let s = e1.socket().unwrap();
            s.bind(sa(ip(1), 6000 + i)).unwrap();
            s.set_send_buffer_size_force(1 << 20).unwrap();
            Arc::new(s)
        })
        .collect();
    // The peer's socket is bound, but the peer is stalled: our connection
    // comes up (its kernel accepts), the probe goes unanswered, and every
    // socket's first datagrams go on path 0.
    let e2 = engine(rx_threads, rx_budget);
    let r = e2.socket().unwrap();
    r.set_recv_buffer_size_force(64 << 20).unwrap();
    r.bind(dst).unwrap();
    let (release, frozen) = freeze(&e2);
    let len = move |i: u64| 100 + (i as usize * 37) % 3000 + if i < FIRST { first_len } else { 0 };
    for (f, s) in socks.iter().enumerate() {
        for i in 0..FIRST {
            s.send_to(&payload(f as u32, i, len(i)), dst).unwrap();
        }
    }
    let c = e1.connections().into_iter().find(|c| c.faddr == ip(2)).unwrap();
    assert_eq!(c.npaths, 0, "no handshake yet");
    assert!(c.paths[1..].iter().all(|p| p.next_tx_seq == 1), "{c:?}");
    assert_eq!(c.path0().next_tx_seq, 1 + 1 + u64::from(SOCKS) * FIRST, "the probe and every first datagram on path 0");

    // The peer wakes up; the senders go on while the paths come up, and
    // once the handshake is done (then on their own lanes).
    release.send(()).unwrap();
    frozen.join().unwrap();
    let threads: Vec<_> = socks
        .iter()
        .enumerate()
        .map(|(f, s)| {
            let (s, e1) = (s.clone(), e1.clone());
            std::thread::spawn(move || {
                let send = |i: u64| {
                    s.send_to(&payload(f as u32, i, len(i)), dst).unwrap();
                };
                (FIRST..MID).for_each(send);
                wait_for("the handshake", || e1.connections().iter().any(|c| c.faddr == dst.ip() && c.npaths == 8));
                (MID..N).for_each(send);
            })
        })
        .collect();
    let mut next = vec![0u64; usize::from(SOCKS)];
    let mut buf = vec![0u8; 4096 + first_len];
    r.set_read_timeout(Some(LONG)).unwrap();
    for _ in 0..u64::from(SOCKS) * N {
        let (n, from) = r.recv_from(&mut buf).unwrap();
        let f = usize::from(from.port() - 6000);
        check_payload(f as u32, next[f], &buf[..n]).unwrap_or_else(|e| {
            let nz = |e: &Engine| e.counters().into_iter().filter(|(_, v)| *v != 0).collect::<Vec<_>>();
            panic!(
                "out of order: {e}\nsender {:?}\n{}\nreceiver {:?}\n{}",
                nz(&e1),
                e1.with_node(|n| n.dump()),
                nz(&e2),
                e2.with_node(|n| n.dump())
            )
        });
        next[f] += 1;
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(next.iter().all(|n| *n == N), "{next:?}");
    expect_nothing(&r);

    // The receiver saw 8 paths; every path carried datagrams, path 0 at
    // least the early ones; the sequence numbers account for every datagram
    // and every probe or pong the sender queued.
    let c = e2.connections().into_iter().find(|c| c.faddr == ip(1)).unwrap();
    assert_eq!(c.npaths, 8);
    let per_path: Vec<u64> = c.paths.iter().map(|p| p.next_rx_seq.saturating_sub(1)).collect();
    assert!(per_path[0] >= u64::from(SOCKS) * FIRST, "{per_path:?}");
    assert!(per_path[1..].iter().all(|n| *n > 0), "no fan-out: {per_path:?}");
    assert_eq!(per_path.iter().sum::<u64>(), u64::from(SOCKS) * N + counter(&e1, "send_pong"), "{per_path:?}");
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

// ----------------------------------------------------------------------
// SO_TIMESTAMP
// ----------------------------------------------------------------------

#[test]
fn so_timestamp_gives_receive_times_close_to_now() {
    let ip = addr_block(44);
    let (e1, e2) = (engine(), engine());
    let s = e1.socket().unwrap();
    s.bind(sa(ip(1), 5000)).unwrap();
    let r = e2.socket().unwrap();
    r.bind(sa(ip(2), 4000)).unwrap();
    let mut buf = [0u8; 64];
    // Off by default.
    s.send_to(b"plain", sa(ip(2), 4000)).unwrap();
    r.set_read_timeout(Some(LONG)).unwrap();
    let m = r.recv_msg(&mut buf, RecvFlags::default()).unwrap();
    assert_eq!((&buf[..m.len], m.timestamp), (&b"plain"[..], None));

    r.set_timestamp(true).unwrap();
    let mut last = SystemTime::UNIX_EPOCH;
    for i in 0..20u8 {
        let before = SystemTime::now();
        s.send_to(&[i; 10], sa(ip(2), 4000)).unwrap();
        let m = r.recv_msg(&mut buf, RecvFlags::default()).unwrap();
        let after = SystemTime::now();
        assert_eq!(&buf[..m.len], &[i; 10]);
        let t = m.timestamp.expect("a timestamp");
        // Taken on arrival: between the send and the return of recvmsg (1 ms
        // of slack for clock granularity).
        assert!(t + Duration::from_millis(1) >= before, "stamp {t:?} before the send {before:?}");
        assert!(t <= after, "stamp {t:?} after recvmsg returned {after:?}");
        assert!(t >= last, "stamps go forward");
        last = t;
        if i % 5 == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Queued a while before being read: the stamp is the arrival, not the read.
    s.send_to(b"late", sa(ip(2), 4000)).unwrap();
    wait_for("arrival", || e2.messages(Queue::Recv).len() == 1);
    let arrived = SystemTime::now();
    std::thread::sleep(Duration::from_millis(200));
    let m = r.recv_msg(&mut buf, RecvFlags::default()).unwrap();
    let t = m.timestamp.unwrap();
    assert!(t <= arrived, "stamped at arrival ({t:?}), not at read");
    assert!(SystemTime::now().duration_since(t).unwrap() < Duration::from_secs(2));
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}
