//! The socket API beyond errno: readiness in mio, loopback delivery without
//! TCP (and its flow control), and the engine's shutdown report.

use std::os::fd::AsRawFd;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use rds_sock::Deadline;
use rds_tests::*;

#[test]
fn the_descriptor_works_in_mio_edge_triggered() {
    let ip = addr_block(43);
    let Pair { e1: _e1, e2: _e2, a, b } = pair(ip, 4001);
    b.set_nonblocking(true).unwrap();
    let mut poll = Poll::new().unwrap();
    let fd = b.as_raw_fd();
    poll.registry().register(&mut SourceFd(&fd), Token(7), Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(8);
    let mut buf = [0u8; 64];
    for round in 0..3u8 {
        a.send_to(&[round; 10], sa(ip(2), 4001)).unwrap();
        // One edge per arrival after the queue was drained.
        let mut got = false;
        for _ in 0..50 {
            poll.poll(&mut events, Some(Duration::from_millis(100))).unwrap();
            if events.iter().any(|e| e.token() == Token(7) && e.is_readable()) {
                got = true;
                break;
            }
        }
        assert!(got, "no readable event in round {round}");
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&[round; 10][..], sa(ip(1), 4001)));
        assert_eq!(b.recv_from(&mut buf).unwrap_err().raw_os_error(), Some(libc::EAGAIN));
    }
}

#[test]
fn loopback_between_addresses_of_one_node_never_touches_tcp() {
    let ip = addr_block(43);
    let e = engine();
    let a = e.socket().unwrap();
    let b = e.socket().unwrap();
    a.bind(sa(ip(1), 4001)).unwrap();
    b.bind(sa(ip(2), 4002)).unwrap();
    for i in 0..100u32 {
        a.send_to(&i.to_le_bytes(), sa(ip(2), 4002)).unwrap();
    }
    let mut buf = [0u8; 8];
    for i in 0..100u32 {
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&i.to_le_bytes()[..], sa(ip(1), 4001)));
    }
    assert!(e.tcp_connections().is_empty(), "a TCP connection was opened: {:?}", e.tcp_connections());
    let c = e.counters();
    let get = |k: &str| c.iter().find(|(n, _)| n == k).unwrap().1;
    assert_eq!(get("recv_delivered"), 100);
    assert_eq!(get("tcp_data_ready_calls"), 0);
    assert_eq!(get("cong_update_queued"), 0, "no map is sent to oneself");
}

#[test]
fn the_node_lock_counts_every_call_and_the_waits_behind_another() {
    let ip = addr_block(43);
    let e = engine();
    let a = e.socket().unwrap();
    a.bind(sa(ip(1), 4003)).unwrap();
    // Loopback: no transport thread takes the lock beside these calls.
    let s0 = e.node_lock_stats();
    for i in 0..50u32 {
        a.send_to(&i.to_le_bytes(), sa(ip(1), 4003)).unwrap();
    }
    let mut buf = [0u8; 8];
    for i in 0..50u32 {
        let (n, _) = a.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &i.to_le_bytes()[..]);
    }
    let s1 = e.node_lock_stats();
    assert!(s1.taken >= s0.taken + 100, "a send and a receive take it once each at least: {s0:?} -> {s1:?}");
    // One thread holds the lock until another has asked for it (its
    // attempt counted), then 200 ms more: the other waited, and says so.
    // Without the count of waits, or with a clock read only after the
    // lock was taken, this fails.
    let er = &e;
    let held = std::thread::scope(|sc| {
        let (tx, rx) = std::sync::mpsc::channel();
        let holder = sc.spawn(move || {
            er.with_node(move |_| {
                let mine = er.node_lock_stats().taken;
                tx.send(()).unwrap();
                let t0 = std::time::Instant::now();
                while er.node_lock_stats().taken == mine {
                    assert!(t0.elapsed() < Duration::from_secs(10), "the other thread never asked");
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(200));
            })
        });
        rx.recv().unwrap();
        let before = e.node_lock_stats();
        e.with_node(|_| ());
        holder.join().unwrap();
        (before, e.node_lock_stats())
    });
    let (before, after) = held;
    // (The engine's timer thread may have waited too.)
    assert!(after.waited > before.waited, "{before:?} -> {after:?}");
    assert!(after.wait_us >= before.wait_us + 100_000, "{before:?} -> {after:?}");
    assert!(after.waited <= after.taken);
    let c = e.counters();
    let get = |k: &str| c.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    // The counters are read after `after`: the timer thread may have
    // taken and waited for the lock in between (it waited behind the
    // holder as well).
    assert!(get("engine_node_lock_taken") >= Some(after.taken), "{c:?}");
    assert!(get("engine_node_lock_waited") >= Some(after.waited), "{c:?}");
    assert!(get("engine_node_lock_wait_us") >= Some(after.wait_us), "{c:?}");
}

#[test]
fn shutdown_reports_what_was_never_delivered() {
    let ip = addr_block(43);
    let e = engine();
    let a = e.socket().unwrap();
    a.bind(sa(ip(1), 4001)).unwrap();
    // Nobody serves ip(9): nothing can be delivered.
    for _ in 0..3 {
        a.send_to(&[1; 1000], sa(ip(9), 4001)).unwrap();
    }
    let report = e.shutdown(Duration::from_millis(100));
    assert_eq!(report.messages(), 3, "{report:?}");
    assert_eq!(report.unsent.len(), 1);
    assert_eq!(report.unsent[0].faddr, Some(ip(9)));
    assert_eq!(report.unsent[0].bytes, 3000);
    assert_eq!(a.send_to(b"x", sa(ip(9), 4001)).unwrap_err().raw_os_error(), Some(libc::ESHUTDOWN));
    assert_eq!(e.socket().unwrap_err().raw_os_error(), Some(libc::ESHUTDOWN));
}

/// Timeouts too long to be an instant (`Duration::MAX`, as a C program's
/// huge `SO_RCVTIMEO` would map to) never expire: a blocking receive and
/// send with them work, and so do `flush` and `Engine::shutdown`, instead
/// of panicking on `Instant` overflow.
#[test]
fn timeouts_too_long_to_represent_never_expire() {
    let ip = addr_block(43);
    let e = engine();
    let a = e.socket().unwrap();
    let b = e.socket().unwrap();
    a.bind(sa(ip(1), 4001)).unwrap();
    b.bind(sa(ip(2), 4002)).unwrap();
    a.set_write_timeout(Some(Duration::MAX)).unwrap();
    b.set_read_timeout(Some(Duration::MAX)).unwrap();
    assert_eq!(b.read_timeout().unwrap(), Some(Duration::MAX));
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        a.send_to(b"late", sa(ip(2), 4002)).unwrap();
        assert!(a.flush(Duration::MAX), "acked");
        a
    });
    let mut buf = [0u8; 16];
    let (n, from) = b.recv_from(&mut buf).expect("a blocking receive with Duration::MAX");
    assert_eq!((&buf[..n], from), (&b"late"[..], sa(ip(1), 4001)));
    let _a = sender.join().expect("the send with Duration::MAX did not panic");
    let report = e.shutdown(Duration::MAX);
    assert_eq!(report.messages(), 0);
}

/// Loopback (two sockets of one engine): a receiver that never reads pauses
/// the sending path once the node's receive budget is passed; the sender
/// blocks (its send buffer holds what was not pulled) instead of the
/// receiver dropping over its cap, and the receiver's reads resume it:
/// every message arrives once, in order.
#[test]
fn loopback_receiver_that_never_reads_holds_the_sender_back() {
    let ip = addr_block(51);
    let mut cfg = rds_sock::EngineConfig::default();
    cfg.node.rcv_budget = 4 << 20;
    let e = rds_sock::Engine::new(cfg).unwrap();
    let (tx, rx) = (e.socket().unwrap(), e.socket().unwrap());
    tx.bind(sa(ip(1), 5000)).unwrap();
    rx.bind(sa(ip(1), 4000)).unwrap();
    // A receive buffer far above the budget: congestion does not stop the
    // sender first.
    rx.set_recv_buffer_size_force(64 << 20).unwrap();
    tx.set_write_timeout(Some(Duration::from_millis(300))).unwrap();
    const LEN: usize = 64 << 10;
    let mut sent = 0u64;
    let timed_out = loop {
        match tx.send_to(&payload(9, sent, LEN), sa(ip(1), 4000)) {
            Ok(_) => sent += 1,
            Err(err) => break err,
        }
        assert!(sent < 1000, "the sender was never held back");
    };
    assert_eq!(timed_out.raw_os_error(), Some(libc::ETIMEDOUT));
    let c: std::collections::HashMap<String, u64> = e.counters().into_iter().collect();
    assert_eq!((c["recv_pause"], c["recv_drop_over_limit"]), (1, 0));
    let held = e.with_node(|n| n.rx_held());
    assert!(held > 4 << 20 && held <= (4 << 20) + (1 << 20) + LEN as u64, "{held} bytes held");
    // Reading resumes the path: then everything arrives, more can be sent.
    let more = 20;
    let sender = std::thread::spawn(move || {
        tx.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        for i in sent..sent + more {
            tx.send_to(&payload(9, i, LEN), sa(ip(1), 4000)).unwrap();
        }
    });
    rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; LEN];
    for i in 0..sent + more {
        let (n, from) = rx.recv_from(&mut buf).unwrap_or_else(|err| panic!("message {i}: {err}"));
        assert_eq!(from, sa(ip(1), 5000));
        check_payload(9, i, &buf[..n]).unwrap();
    }
    sender.join().unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    assert_eq!(rx.recv_from(&mut buf).unwrap_err().raw_os_error(), Some(libc::ETIMEDOUT));
    let c: std::collections::HashMap<String, u64> = e.counters().into_iter().collect();
    assert!(c["recv_resume"] >= 1 && c["recv_drop_over_limit"] == 0);
    e.shutdown(Duration::ZERO);
}

/// Every duration setting at `Duration::MAX` (backoffs, ack polling, the
/// drain, the stall deadline, write coalescing off, idle collection): two
/// engines still exchange datagrams over TCP both ways, a connection is
/// closed and comes back, and shutdown returns, instead of a panic on
/// `Instant` or `Duration` overflow in the core or on a reactor thread.
#[test]
fn duration_settings_at_their_maximum_do_not_overflow() {
    let ip = addr_block(43);
    let cfg = || {
        let mut c = rds_sock::EngineConfig::default();
        c.node.reconnect_max = Duration::MAX;
        c.node.reconnect_settle = Duration::MAX;
        c.node.conn_idle_gc = Some(Duration::MAX);
        c.tcp.ack_poll_min = Duration::MAX;
        c.tcp.ack_poll_max = Duration::MAX;
        c.tcp.ack_poll_answered = Duration::MAX;
        c.tcp.shutdown_drain = Duration::MAX;
        c.tcp.rx_frame_timeout = Duration::MAX;
        c.tcp.defer_max = Duration::MAX;
        c.tcp.coalesce = Duration::ZERO;
        rds_sock::Engine::new(c).unwrap()
    };
    let (e1, e2) = (cfg(), cfg());
    let a = e1.socket().unwrap();
    let b = e2.socket().unwrap();
    a.bind(sa(ip(1), 4001)).unwrap();
    b.bind(sa(ip(2), 4002)).unwrap();
    a.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    for round in 0..3u8 {
        a.send_to(&[round; 20], sa(ip(2), 4002)).unwrap();
        let (n, from) = b.recv_from(&mut buf).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!((&buf[..n], from), (&[round; 20][..], sa(ip(1), 4001)));
        b.send_to(&[round + 100; 20], sa(ip(1), 4001)).unwrap();
        let (n, from) = a.recv_from(&mut buf).unwrap_or_else(|e| panic!("round {round} back: {e}"));
        assert_eq!((&buf[..n], from), (&[round + 100; 20][..], sa(ip(2), 4002)));
        if round == 0 {
            // The larger address closes its connections; the smaller one
            // reconnects on the next send.
            let n = e2.tcp_connections().len();
            assert!(n >= 1, "a connection is up");
            e2.with_node(|node| {
                let c = node.find_conn(ip(2), ip(1), rds_sock::TransportKind::Tcp).expect("connection");
                node.reset_path(rds_core::PathId { conn: c, index: 0 });
            });
        }
    }
    // (With acks polled "never", what was sent stays unacked: shutdown
    // just has to return.)
    e1.shutdown(Duration::from_millis(100));
    e2.shutdown(Duration::ZERO);
}

/// The C ABI's blocking receive (`recv_msg_wait`) reads the TCP connection
/// itself and leaves the descriptor alone for the datagram it takes; the
/// other datagrams of a burst its read delivered with the first must
/// still show on the descriptor (POLLIN) when it returns, and none may
/// show once the queue is empty: the descriptor stays exact.
#[test]
fn the_descriptor_stays_exact_around_a_receive_that_reads_the_connection() {
    use rds_sock::RecvFlags;
    const BURST: u8 = 8;
    let ip = addr_block(43);
    let Pair { e1: _e1, e2, a, b } = pair(ip, 4009);
    let poll_in = |ms: i32| {
        let mut p = libc::pollfd { fd: b.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        r == 1 && p.revents & libc::POLLIN != 0
    };
    let mut buf = [0u8; 64];
    // The first datagram tells b's receive which connection to read.
    a.send_to(b"first", sa(ip(2), 4009)).unwrap();
    let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), Deadline::Never).unwrap();
    assert_eq!(&buf[..m.len], b"first");
    let counter = |name: &str| e2.counters().into_iter().find(|c| c.0 == name).map_or(0, |c| c.1);
    let reads = counter("tcp_rx_assist_reads");
    for round in 0..100u8 {
        assert!(!poll_in(0), "round {round}: readable with nothing queued");
        let sender = {
            let a = &a;
            let to = sa(ip(2), 4009);
            move || {
                std::thread::sleep(Duration::from_millis(20));
                // A burst: the receiver's read mostly takes several.
                for k in 1..=BURST {
                    a.send_to(&[round, k], to).unwrap();
                }
            }
        };
        std::thread::scope(|s| {
            s.spawn(sender);
            let m = b
                .recv_msg_wait(
                    &mut buf,
                    RecvFlags::default(),
                    Some(std::time::Instant::now() + Duration::from_secs(10)),
                )
                .unwrap();
            assert_eq!(&buf[..m.len], &[round, 1]);
        });
        for k in 2..=BURST {
            assert!(poll_in(5000), "round {round}: datagram {k} does not show on the descriptor");
            let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), Deadline::Never).unwrap();
            assert_eq!(&buf[..m.len], &[round, k]);
        }
    }
    assert!(!poll_in(0), "readable with nothing queued");
    assert!(counter("tcp_rx_assist_reads") > reads, "the receive never read the connection itself");
}

/// Request/response through the blocking receive (which reads the
/// connection itself, `rds_tcp::RxAssist`): `rounds` requests of `size`
/// bytes from `a` to `b`, each answered after `pause` by an answer of the
/// same size. Every request and answer must arrive once, in order, with
/// its content; nothing more.
fn answered_exchange(a: &rds_sock::RdsSocket, b: &rds_sock::RdsSocket, (rounds, size, pause): (u32, usize, Duration)) {
    exchange(a, b, (rounds, size), pause, Duration::ZERO);
}

/// [`answered_exchange`] with `lead` between an answer and the next
/// request (the pause is the requester's), answered at once.
fn paced_exchange(a: &rds_sock::RdsSocket, b: &rds_sock::RdsSocket, (rounds, size, lead): (u32, usize, Duration)) {
    exchange(a, b, (rounds, size), Duration::ZERO, lead);
}

/// `rounds` requests of `size` bytes from `a` to `b`, each sent `lead`
/// after the answer before it and answered `pause` after it came.
fn exchange(
    a: &rds_sock::RdsSocket,
    b: &rds_sock::RdsSocket,
    (rounds, size): (u32, usize),
    pause: Duration,
    lead: Duration,
) {
    use rds_sock::RecvFlags;
    let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let deadline = || Some(std::time::Instant::now() + Duration::from_secs(10));
    let msg = |i: u32| -> Vec<u8> { (0..size).map(|k| (k as u32).wrapping_mul(31).wrapping_add(i) as u8).collect() };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = vec![0u8; size + 1];
            for i in 0..rounds {
                let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), deadline()).unwrap();
                assert_eq!((&buf[..m.len], m.from), (&msg(i)[..], Some(a_addr)), "request {i}");
                std::thread::sleep(pause);
                b.send_to(&msg(i | 1 << 31), a_addr).unwrap();
            }
        });
        let mut buf = vec![0u8; size + 1];
        for i in 0..rounds {
            std::thread::sleep(lead);
            a.send_to(&msg(i), b_addr).unwrap();
            let m = a.recv_msg_wait(&mut buf, RecvFlags::default(), deadline()).unwrap();
            assert_eq!((&buf[..m.len], m.from), (&msg(i | 1 << 31)[..], Some(b_addr)), "answer {i}");
        }
    });
    let mut buf = [0u8; 8];
    let none = RecvFlags { dontwait: true, ..RecvFlags::default() };
    assert!(a.recv_msg(&mut buf, none).is_err() && b.recv_msg(&mut buf, none).is_err(), "nothing more");
}

/// The engine's counter `name`.
fn engine_counter(e: &rds_sock::Engine, name: &str) -> u64 {
    e.counters().into_iter().find(|c| c.0 == name).map_or(0, |c| c.1)
}

/// Up, and the first answer tells each receive which connection to read.
fn first_exchange(a: &rds_sock::RdsSocket, b: &rds_sock::RdsSocket) {
    use rds_sock::RecvFlags;
    let deadline = || Some(std::time::Instant::now() + Duration::from_secs(10));
    let mut buf = [0u8; 64];
    a.send_to(&u32::MAX.to_le_bytes(), b.local_addr().unwrap()).unwrap();
    b.recv_msg_wait(&mut buf, RecvFlags::default(), deadline()).unwrap();
    b.send_to(&u32::MAX.to_le_bytes(), a.local_addr().unwrap()).unwrap();
    a.recv_msg_wait(&mut buf, RecvFlags::default(), deadline()).unwrap();
}

/// A [`Pair`] on `port` after its [`first_exchange`], with its two
/// sockets' addresses.
fn exchanged_pair(
    ip: impl Fn(u8) -> std::net::IpAddr,
    port: u16,
) -> (Pair, std::net::SocketAddr, std::net::SocketAddr) {
    let p = pair(ip, port);
    first_exchange(&p.a, &p.b);
    let (a_addr, b_addr) = (p.a.local_addr().unwrap(), p.b.local_addr().unwrap());
    (p, a_addr, b_addr)
}

/// A deadline 10 s from now, for a blocking receive that must not hang.
fn in_10s() -> Option<std::time::Instant> {
    Some(std::time::Instant::now() + Duration::from_secs(10))
}

/// Request/response through the blocking receive, the answer slower than
/// the ack timer's shortest interval: each answer polls the acks (or, for
/// small messages, leaves them to the timer), so the reactor's ack timer
/// stays a fallback: armed for `ack_poll_answered` (40 ms), it polls the
/// watched acks when the reactor's timer fires, which the receivers'
/// lingers (`rds_tcp::ASSIST_LINGER`, 10 ms) make it do about once per
/// linger: about one poll per 10 ms, 43-45 in 473 ms of 400 rounds
/// (2026-11-30).
/// Every request and answer arrives once, in order. (The timer used to
/// back off from `ack_poll_min` after each firing while the exchange went
/// on: 52 polls in 170 ms; at one per `ack_poll_max`, 4 ms, as until
/// 2026-11-29, 41; the rule itself is tested in rds-tcp's
/// `reactor::acks`.)
///
/// The two sockets use different lanes (4010 and 4015, lanes 2 and 7 of
/// 8), as a kernel peer's socket and ours may: each request goes out on
/// one connection and its answer comes back on another, which the
/// receiving thread polls. The request's connection must count as answered
/// all the same. (Between our nodes a socket that first hears from a peer
/// answers on the lane it heard when no other socket of its node holds
/// that lane, rds-core's mprds docs, "Lanes": b sends to another port of
/// a's node before it hears from a, which keeps its port's lane.)
#[test]
fn an_answered_exchange_leaves_the_ack_timer_a_fallback() {
    const ROUNDS: u32 = 400;
    let ip = addr_block(43);
    let Pair { e1, e2, a, b: _ } = pair(ip, 4010);
    let b = e2.socket().unwrap();
    b.bind(sa(ip(2), 4015)).unwrap();
    let other = e1.socket().unwrap();
    other.bind(sa(ip(1), 4011)).unwrap();
    b.send_to(b"first", other.local_addr().unwrap()).unwrap();
    let mut buf = [0u8; 8];
    other.recv_msg_wait(&mut buf, rds_sock::RecvFlags::default(), in_10s()).unwrap();
    first_exchange(&a, &b);
    let (polls0, start) = (engine_counter(&e1, "tcp_ack_timer_polls"), std::time::Instant::now());
    answered_exchange(&a, &b, (ROUNDS, 4, Duration::from_millis(1)));
    let (polls, ms) = (engine_counter(&e1, "tcp_ack_timer_polls") - polls0, start.elapsed().as_millis() as u64);
    // About one per linger, with room for half as many again and the first
    // firings (from `ack_poll_min`, doubling, until the first answer); the
    // bound of one per 40 ms this test had (plus 10) failed once on a
    // loaded machine: 17 in 175 ms of 150 rounds. With `ack_poll_answered`
    // at 4 ms, as the timer was before, 102 polls in 472 ms.
    let linger = rds_tcp::ASSIST_LINGER.as_millis() as u64;
    assert!(polls <= ms / linger * 3 / 2 + 16, "{polls} ack-timer polls in {ms} ms of answered exchange");
}

/// A round trip of request/response through the blocking receive (which
/// reads the connection itself) takes the requester's node lock three
/// times: its send, in which it also pulls the message for its own write
/// (`Inner::run_send`), a first look of the receive (with a deadline it
/// looks before it waits, and finds nothing yet), and the read's delivery,
/// in which the receive takes its message (`SockShared::taken`; qperf's
/// receive, with no deadline and its descriptor in sync, skips the look:
/// two). With the pull in a node call of its own and the receive taking
/// the message in one more, it took the lock five times (5.1-5.2 measured
/// here); with only the receive's merged, four (4.06-4.46); before all
/// that, each send and each receive also took it to see whether the
/// engine had stopped, and a receive whose own read delivered the message
/// took it once more to bring the socket's descriptor up to date: 9.
#[test]
fn a_round_trip_takes_the_node_lock_three_times() {
    const ROUNDS: u32 = 400;
    let ip = addr_block(43);
    let (Pair { e1, e2: _e2, a, b }, ..) = exchanged_pair(ip, 4016);
    // The descriptors kept in sync, as the C ABI's receive keeps them.
    let _ = (a.as_raw_fd(), b.as_raw_fd());
    let taken0 = e1.node_lock_stats().taken;
    let reads0 = engine_counter(&e1, "tcp_rx_assist_reads");
    answered_exchange(&a, &b, (ROUNDS, 64, Duration::ZERO));
    let per = (e1.node_lock_stats().taken - taken0) as f64 / f64::from(ROUNDS);
    let reads = engine_counter(&e1, "tcp_rx_assist_reads") - reads0;
    assert!(reads >= u64::from(ROUNDS) / 2, "{reads} of {ROUNDS} answers read by the receive itself");
    // The timers' node calls and the reactor's for an odd message come on
    // top (3.08-3.46 measured, with the machine busy too): a bound with
    // room, under the 4.06 of a send that pulls in a node call of its own.
    assert!(per < 3.9, "{per:.2} node-lock acquisitions per round trip");
}

/// A blocking receive that peeks, reading the connection itself, leaves
/// the message queued (it does not take it in the delivery's node call as
/// a receive that takes does): the receive after it gets the same one,
/// and nothing more is queued then.
#[test]
fn a_peeking_blocking_receive_leaves_the_message_for_the_next() {
    use rds_sock::RecvFlags;
    let ip = addr_block(43);
    let (Pair { e1: _e1, e2, a, b }, _, b_addr) = exchanged_pair(ip, 4017);
    let _ = b.as_raw_fd();
    let reads0 = engine_counter(&e2, "tcp_rx_assist_reads");
    let peek = RecvFlags { peek: true, ..RecvFlags::default() };
    let none = RecvFlags { dontwait: true, ..RecvFlags::default() };
    let mut buf = [0u8; 16];
    for round in 0..50u8 {
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(2));
                a.send_to(&[round; 3], b_addr).unwrap();
            });
            let m = b.recv_msg_wait(&mut buf, peek, in_10s()).unwrap();
            assert_eq!(&buf[..m.len], &[round; 3], "peeked, round {round}");
        });
        let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
        assert_eq!(&buf[..m.len], &[round; 3], "received after the peek, round {round}");
        assert!(b.recv_msg(&mut buf, none).is_err(), "more than one queued after round {round}");
    }
    assert!(engine_counter(&e2, "tcp_rx_assist_reads") > reads0, "the peeking receive never read the connection");
}

/// Two threads in blocking receives on one socket, both reading its
/// connection themselves and taking what their reads deliver: every
/// message arrives once, and each thread gets its messages in the order
/// they were sent.
#[test]
fn two_blocking_receivers_of_one_socket_get_each_message_once_in_order() {
    use rds_sock::RecvFlags;
    const N: u32 = 2000;
    let ip = addr_block(43);
    let (Pair { e1: _e1, e2: _e2, a, b }, a_addr, b_addr) = exchanged_pair(ip, 4018);
    let _ = b.as_raw_fd();
    let got: Vec<Vec<u32>> = std::thread::scope(|s| {
        let recv = || {
            let mut mine = Vec::new();
            let mut buf = [0u8; 8];
            loop {
                let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
                assert_eq!((m.len, m.from), (4, Some(a_addr)));
                let v = u32::from_le_bytes(buf[..4].try_into().unwrap());
                if v == u32::MAX {
                    return mine;
                }
                mine.push(v);
            }
        };
        let (r1, r2) = (s.spawn(recv), s.spawn(recv));
        for i in 0..N {
            a.send_to(&i.to_le_bytes(), b_addr).unwrap();
            if i % 64 == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        a.send_to(&u32::MAX.to_le_bytes(), b_addr).unwrap();
        a.send_to(&u32::MAX.to_le_bytes(), b_addr).unwrap();
        vec![r1.join().unwrap(), r2.join().unwrap()]
    });
    for (t, mine) in got.iter().enumerate() {
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "thread {t} got its messages out of order");
    }
    let mut all: Vec<u32> = got.concat();
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "every message once");
}

/// In an exchange of small messages the receiving thread leaves the acks
/// of its requests to the reactor's ack timer (`tcp_rx_assist_acks_left`,
/// an `ioctl` saved per message), and the timer still acks every one:
/// each side's sent messages are all acked soon after the exchange (no
/// sender waits on them). Messages larger than
/// `rds_tcp::ASSIST_ACK_LAZY_BYTES` are polled at once, as before.
#[test]
fn small_answers_leave_their_acks_to_the_timer_large_ones_do_not() {
    let ip = addr_block(43);
    let Pair { e1, e2, a, b } = pair(ip, 4011);
    first_exchange(&a, &b);
    let left = |e: &rds_sock::Engine| engine_counter(e, "tcp_rx_assist_acks_left");
    let (l1, l2) = (left(&e1), left(&e2));
    answered_exchange(&a, &b, (200, 64, Duration::ZERO));
    assert!(left(&e1) > l1 && left(&e2) > l2, "no ack poll left to the timer: {} {}", left(&e1) - l1, left(&e2) - l2);
    assert!(a.flush(Duration::from_secs(2)) && b.flush(Duration::from_secs(2)), "small messages left unacked");
    let big = rds_tcp::ASSIST_ACK_LAZY_BYTES as usize + 1;
    let (l1, l2) = (left(&e1), left(&e2));
    answered_exchange(&a, &b, (50, big, Duration::ZERO));
    assert_eq!((left(&e1) - l1, left(&e2) - l2), (0, 0), "an ack poll of {big}-byte messages left to the timer");
    assert!(a.flush(Duration::from_secs(2)) && b.flush(Duration::from_secs(2)), "large messages left unacked");
}

/// A blocked receiver polls the lane its last message came on.
/// When the answers move to another lane (another socket of the peer, on
/// a port of another lane, asks), a wait woken through the descriptor
/// forgets the lane and the next one polls every path: the receiver
/// learns the new lane and reads it itself again (`tcp_rx_assist_reads`
/// keeps growing), where it would otherwise leave every later message to
/// the reactor. Every message arrives once, in order. Each request goes
/// out 1 ms after the answer before it came, so that the receiver is in
/// its wait when it arrives even on a loaded machine (one that came
/// earlier is the reactor's, and counts for nothing here).
#[test]
fn a_receiver_learns_the_lane_its_requests_moved_to() {
    const ROUNDS: u32 = 100;
    let ip = addr_block(43);
    // `a` on port 4012 (lane 4 of 8), `a2` on 4013 (lane 5), `b` on 4012.
    let Pair { e1, e2, a, b } = pair(ip, 4012);
    let a2 = e1.socket().unwrap();
    a2.bind(sa(ip(1), 4013)).unwrap();
    first_exchange(&a, &b);
    first_exchange(&a2, &b);
    let reads = || engine_counter(&e2, "tcp_rx_assist_reads");
    let paced = (ROUNDS, 64, Duration::from_millis(1));
    paced_exchange(&a, &b, paced);
    let r0 = reads();
    paced_exchange(&a2, &b, paced);
    let r1 = reads();
    paced_exchange(&a, &b, paced);
    let r2 = reads();
    assert!(
        r1 - r0 >= u64::from(ROUNDS / 4) && r2 - r1 >= u64::from(ROUNDS / 4),
        "the receiver read {} and {} of {ROUNDS} requests itself after they moved lanes",
        r1 - r0,
        r2 - r1
    );
}

/// A blocked receiver takes its lane's readable events off the reactor
/// (`tcp_rx_assist_quiet`) only when its socket sent a message since its
/// previous wait: when it waits for an answer, not as the receiver of a
/// one-way stream, whose waits read the connection themselves all the
/// same (`tcp_rx_assist_reads`). Every message arrives once, in order.
/// Each message goes out 1 ms after the one before, so that the receiver
/// is in its wait when it arrives even on a loaded machine.
#[test]
fn only_a_receiver_that_sent_takes_its_lane_off_the_reactor() {
    use rds_sock::RecvFlags;
    const N: u32 = 100;
    let ip = addr_block(43);
    let (Pair { e1: _e1, e2, a, b }, a_addr, b_addr) = exchanged_pair(ip, 4030);
    let quiet = || engine_counter(&e2, "tcp_rx_assist_quiet");
    let reads = || engine_counter(&e2, "tcp_rx_assist_reads");
    let deadline = || Some(std::time::Instant::now() + Duration::from_secs(10));
    let mut buf = [0u8; 8];
    // One way, a to b. b's first wait follows its answer in
    // `first_exchange`: the counts start after it.
    let (mut q0, mut r0) = (0, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..N {
                std::thread::sleep(Duration::from_millis(1));
                a.send_to(&i.to_le_bytes(), b_addr).unwrap();
            }
        });
        for i in 0..N {
            let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), deadline()).unwrap();
            assert_eq!((&buf[..m.len], m.from), (&i.to_le_bytes()[..], Some(a_addr)), "message {i}");
            if i == 0 {
                (q0, r0) = (quiet(), reads());
            }
        }
    });
    let (q1, r1) = (quiet(), reads());
    assert_eq!(q1 - q0, 0, "a receiver that sent nothing took its lane off the reactor");
    assert!(r1 - r0 >= u64::from(N / 4), "the stream's receiver read {} of {N} messages itself", r1 - r0);
    // Request/response: b answers each request before it waits again.
    paced_exchange(&a, &b, (N, 64, Duration::from_millis(1)));
    let q2 = quiet();
    assert!(q2 - q1 >= u64::from(N / 4), "{} of {N} waits for a request that followed an answer were quiet", q2 - q1);
}

/// A receiver whose waits read its answers on its lane leaves the lane
/// off the reactor for `rds_tcp::ASSIST_LINGER` after each wait
/// (`rds_tcp::RxAssist`): the next wait takes it over without waking the
/// reactor. When no wait comes, the reactor takes the lane back when the
/// linger runs out (`tcp_rx_linger_expired`) and reads what came on it
/// meanwhile: a message sent right after the last exchange, which the
/// receiver never waits for, reaches its queue all the same, once, and in
/// bounded time (a second here; the linger is 10 ms), also while another
/// socket of the same engine keeps renewing the linger of its own lane on
/// the same reactor (its renewals must not postpone this one's end). The
/// waits of the exchange took their lane over: far fewer lingers ran out
/// than there were waits.
#[test]
fn a_lingering_lane_comes_back_to_the_reactor() {
    use rds_sock::RecvFlags;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    const N: u32 = 100;
    let ip = addr_block(43);
    // Port 4040: lane 0 both ways. c and d (4043): lane 3, on the same
    // engines and reactors.
    let Pair { e1, e2, a, b } = pair(ip, 4040);
    let (c, d) = (e1.socket().unwrap(), e2.socket().unwrap());
    c.bind(sa(ip(1), 4043)).unwrap();
    d.bind(sa(ip(2), 4043)).unwrap();
    first_exchange(&a, &b);
    first_exchange(&c, &d);
    let expired = || engine_counter(&e2, "tcp_rx_linger_expired");
    let stop = AtomicBool::new(false);
    let e1 = std::thread::scope(|s| {
        // d answers c's requests until told to stop (at most 30 s): its
        // waits renew the linger of lane 3 all along.
        s.spawn(|| {
            let end = std::time::Instant::now() + Duration::from_secs(30);
            while !stop.load(SeqCst) && std::time::Instant::now() < end {
                paced_exchange(&c, &d, (20, 64, Duration::ZERO));
            }
        });
        let e0 = expired();
        // b answers each request before it waits again: each of its waits
        // is quiet and leaves lane 0 lingering.
        paced_exchange(&a, &b, (N, 64, Duration::ZERO));
        let e1 = expired();
        assert!(
            e1 - e0 < u64::from(N / 2),
            "{} lingers ran out during {N} exchanges: the waits did not take their lane over",
            e1 - e0
        );
        // b's last wait left lane 0 lingering; this comes on it while b
        // does not wait.
        a.send_to(b"after", b.local_addr().unwrap()).unwrap();
        let none = RecvFlags { dontwait: true, ..RecvFlags::default() };
        let mut buf = [0u8; 16];
        let start = std::time::Instant::now();
        let m = loop {
            match b.recv_msg(&mut buf, none) {
                Ok(m) => break m,
                Err(_) if start.elapsed() < Duration::from_secs(5) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    stop.store(true, SeqCst);
                    panic!("the message on the lingering lane never reached the queue: {e}");
                }
            }
        };
        let took = start.elapsed();
        stop.store(true, SeqCst);
        assert_eq!((&buf[..m.len], m.from), (&b"after"[..], Some(a.local_addr().unwrap())));
        assert!(took < Duration::from_secs(1), "it took {took:?}");
        assert!(b.recv_msg(&mut buf, none).is_err(), "once");
        e1
    });
    // Lingers run out: lane 0's, unless d's waits took it over (its lane
    // was path 0 before the multipath handshake) or it ran out before the
    // count above; d's last one in any case, now that it stopped.
    let start = std::time::Instant::now();
    while expired() <= e1 && start.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(expired() > e1, "no linger ran out (tcp_rx_linger_expired)");
}

/// The blocking receive without a deadline (the C ABI's, qperf's) waits
/// before it first looks when the socket's descriptor shows nothing
/// queued (`RdsSocket::known_empty`): it must still return what was
/// queued before the call (the descriptor readable: it looks first), what
/// arrives while it waits, and what a wake-up still on its way to the
/// descriptor announces, every message once, in order, with nothing left.
/// Each round: the answer to a request (so it waits first), then a burst
/// of 0..3 more sent before the receiver calls again, and one sent from
/// another thread a moment after it started waiting.
#[test]
fn a_receive_without_deadline_that_waits_first_misses_nothing() {
    use rds_sock::RecvFlags;
    const ROUNDS: u32 = 200;
    let ip = addr_block(43);
    let Pair { e1: _e1, e2: _e2, a, b } = pair(ip, 4016);
    first_exchange(&a, &b);
    let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    // A hang here is the failure this test looks for: end the process.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = done.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        if !watch.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("a receive without deadline never returned");
            std::process::exit(101);
        }
    });
    let mut buf = [0u8; 16];
    let mut next = 0u32;
    let mut expect = |b: &rds_sock::RdsSocket, buf: &mut [u8; 16]| {
        let m = b.recv_msg_wait(buf, RecvFlags::default(), Deadline::Never).unwrap();
        assert_eq!((&buf[..m.len], m.from), (&next.to_le_bytes()[..], Some(a_addr)), "message {next}");
        next += 1;
    };
    let mut sent = 0u32;
    for round in 0..ROUNDS {
        // The request, answered: b waits first, then its reply goes out.
        a.send_to(&sent.to_le_bytes(), b_addr).unwrap();
        sent += 1;
        expect(&b, &mut buf);
        // A burst queued before b looks again (readable: it looks first).
        for _ in 0..round % 4 {
            a.send_to(&sent.to_le_bytes(), b_addr).unwrap();
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
        for _ in 0..round % 4 {
            expect(&b, &mut buf);
        }
        // One more from another thread, a moment after b started waiting.
        std::thread::scope(|s| {
            let a = &a;
            let n = sent;
            s.spawn(move || {
                std::thread::sleep(Duration::from_micros(u64::from(round % 5) * 100));
                a.send_to(&n.to_le_bytes(), b_addr).unwrap();
            });
            expect(&b, &mut buf);
        });
        sent += 1;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(next, sent);
    let none = RecvFlags { dontwait: true, ..RecvFlags::default() };
    assert!(b.recv_msg(&mut buf, none).is_err(), "nothing more");
}

/// A blocking send that finds its send buffer full finds the room its
/// messages' TCP acks made itself (`RdsSocket::wait_to_send` polls the
/// pair's `SIOCOUTQ` between short naps), as the kernel's sender learns of
/// them in `sk_write_space`. Here nothing else would: the sender's ack
/// timer never fires (`ack_poll_min`, `ack_poll_max` and
/// `ack_poll_answered` an hour, no
/// write coalescing, whose flushes arm the same timer), the
/// receiver sends nothing back (no readable event polls them), and the
/// sender's own writes, 1000 bytes each, poll them only every 32 KiB.
/// The send buffer (`SO_SNDBUF` 2048: the kernel's minimum of 4608, half
/// of it usable) takes three messages; 60 go, half through the C ABI's
/// interruptible wait (`send_msg_wait`), half through a blocking
/// `send_to` with a write timeout, each bounded at 10 s; all 60 arrive
/// once and in order.
#[test]
fn a_blocked_sender_polls_the_acks_that_make_room() {
    const N: u32 = 60;
    let ip = addr_block(43);
    let mut cfg = rds_sock::EngineConfig::default();
    cfg.tcp.ack_poll_min = Duration::from_secs(3600);
    cfg.tcp.ack_poll_max = Duration::from_secs(3600);
    cfg.tcp.ack_poll_answered = Duration::from_secs(3600);
    // No write coalescing either: a window's flush arms the reactor's
    // timer, and the acks awaited then are polled with it.
    cfg.tcp.coalesce = Duration::ZERO;
    cfg.tcp.coalesce_max = Duration::ZERO;
    let e1 = rds_sock::Engine::new(cfg).unwrap();
    let e2 = rds_sock::Engine::new(rds_sock::EngineConfig::default()).unwrap();
    let (a, b) = (e1.socket().unwrap(), e2.socket().unwrap());
    a.bind(sa(ip(1), 4020)).unwrap();
    b.bind(sa(ip(2), 4020)).unwrap();
    a.set_send_buffer_size(2048).unwrap();
    a.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let to = sa(ip(2), 4020);
    let recv = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        (0..N)
            .map(|_| {
                let (n, from) = b.recv_from(&mut buf).expect("a message within 10 s");
                assert_eq!((n, from), (1000, sa(ip(1), 4020)));
                u32::from_le_bytes(buf[..4].try_into().unwrap())
            })
            .collect::<Vec<u32>>()
    });
    let polls0 = engine_counter(&e1, "tcp_ack_timer_polls");
    let mut msg = [7u8; 1000];
    for i in 0..N {
        msg[..4].copy_from_slice(&i.to_le_bytes());
        let r = if i % 2 == 0 {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            a.send_msg_wait(&msg, Some(to), &rds_sock::SendFlags::default(), Some(deadline))
        } else {
            a.send_to(&msg, to)
        };
        assert_eq!(r.unwrap_or_else(|e| panic!("send {i}: {e}")), 1000);
    }
    assert_eq!(recv.join().unwrap(), (0..N).collect::<Vec<u32>>(), "every message once, in order");
    assert_eq!(engine_counter(&e1, "tcp_ack_timer_polls"), polls0, "the ack timer never fired");
    assert!(engine_counter(&e1, "send_queue_full") > 0, "the send buffer was full");
}

/// Waits (at most 10 s) until `e` queued `n` more messages on its
/// sockets than `from` (`recv_queued`).
fn await_queued(e: &rds_sock::Engine, from: u64, n: u64) {
    let start = std::time::Instant::now();
    while engine_counter(e, "recv_queued") < from + n {
        assert!(start.elapsed() < Duration::from_secs(10), "{n} messages never reached the queue");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Answers to requests already queued go out together (`rds_sock`'s
/// batch, `rds_tcp::TcpTransport::kick_later`): b finds 16 requests
/// queued and answers each as it reads it. The first 15 answers find
/// more requests queued and are held for the next (`tcp_tx_batched`);
/// the last finds none and goes out at once, with them. A send from
/// another thread than the receiving one is never held. a gets every
/// answer once, in order.
#[test]
fn answers_to_queued_requests_go_out_together() {
    use rds_sock::RecvFlags;
    const N: u32 = 16;
    let ip = addr_block(43);
    let (Pair { e1: _e1, e2, a, b }, a_addr, b_addr) = exchanged_pair(ip, 4050);
    let batched = || engine_counter(&e2, "tcp_tx_batched");
    let d0 = engine_counter(&e2, "recv_queued");
    for i in 0..N {
        a.send_to(&i.to_le_bytes(), b_addr).unwrap();
    }
    await_queued(&e2, d0, u64::from(N));
    let b0 = batched();
    // Another thread's send, with 16 requests queued: written at once.
    std::thread::scope(|s| {
        s.spawn(|| b.send_to(b"other", a_addr).unwrap());
    });
    assert_eq!(batched(), b0, "a send from a thread that did not receive was held");
    let mut buf = [0u8; 16];
    for i in 0..N {
        let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
        assert_eq!((&buf[..m.len], m.from), (&i.to_le_bytes()[..], Some(a_addr)), "request {i}");
        b.send_to(&(i | 1 << 31).to_le_bytes(), a_addr).unwrap();
    }
    assert_eq!(batched() - b0, u64::from(N - 1), "the answers that found more requests queued were held");
    let m = a.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
    assert_eq!(&buf[..m.len], b"other");
    for i in 0..N {
        let m = a.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
        assert_eq!((&buf[..m.len], m.from), (&(i | 1 << 31).to_le_bytes()[..], Some(b_addr)), "answer {i}");
    }
    let none = RecvFlags { dontwait: true, ..RecvFlags::default() };
    assert!(a.recv_msg(&mut buf, none).is_err() && b.recv_msg(&mut buf, none).is_err(), "nothing more");
}

/// A held answer goes out without its program (`rds_tcp::REPLY_BATCH_MAX`):
/// b reads one of two queued requests and answers it (held: one more is
/// queued), then makes no call for 3 s. The reactor writes the answer,
/// which a gets while b still sleeps; then b answers the second request.
#[test]
fn a_held_answer_goes_out_while_its_program_does_something_else() {
    use rds_sock::RecvFlags;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let ip = addr_block(43);
    let (Pair { e1: _e1, e2, a, b }, a_addr, b_addr) = exchanged_pair(ip, 4051);
    let d0 = engine_counter(&e2, "recv_queued");
    a.send_to(b"one", b_addr).unwrap();
    a.send_to(b"two", b_addr).unwrap();
    await_queued(&e2, d0, 2);
    let b0 = engine_counter(&e2, "tcp_tx_batched");
    let awake = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = [0u8; 16];
            let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
            assert_eq!(&buf[..m.len], b"one");
            b.send_to(b"answer one", a_addr).unwrap();
            assert_eq!(engine_counter(&e2, "tcp_tx_batched") - b0, 1, "the answer was held");
            std::thread::sleep(Duration::from_secs(3));
            awake.store(true, SeqCst);
            let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
            assert_eq!(&buf[..m.len], b"two");
            b.send_to(b"answer two", a_addr).unwrap();
        });
        let mut buf = [0u8; 16];
        let m = a.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
        assert_eq!((&buf[..m.len], m.from), (&b"answer one"[..], Some(b_addr)));
        assert!(!awake.load(SeqCst), "the held answer waited for its program");
        let m = a.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
        assert_eq!(&buf[..m.len], b"answer two");
    });
}

/// Two engines whose TCP transport holds answers for up to `reply_batch`
/// (`rds_tcp::TcpConfig::reply_batch`), a socket on each.
fn pair_holding(ip: impl Fn(u8) -> std::net::IpAddr, port: u16, reply_batch: Duration) -> Pair {
    let cfg = || {
        let mut c = rds_sock::EngineConfig::default();
        c.tcp.reply_batch = reply_batch;
        rds_sock::Engine::new(c).unwrap()
    };
    let (e1, e2) = (cfg(), cfg());
    let (a, b) = (e1.socket().unwrap(), e2.socket().unwrap());
    a.bind(sa(ip(1), port)).unwrap();
    b.bind(sa(ip(2), port)).unwrap();
    Pair { e1, e2, a, b }
}

/// A thread that ends holding an answer writes it as it ends (as a
/// program's `exit` does: the held list's destructor), where the reactor
/// would write it only after `reply_batch`, here 60 s: b's thread reads
/// one of two queued requests, answers it (held) and ends; a gets the
/// answer well within its 10 s deadline. With `reply_batch` zero no
/// answer is held at all.
#[test]
fn a_thread_that_ends_writes_the_answers_it_held() {
    use rds_sock::RecvFlags;
    for (port, hold) in [(4052, Duration::from_secs(60)), (4053, Duration::ZERO)] {
        let ip = addr_block(43);
        let Pair { e1: _e1, e2, a, b } = pair_holding(ip, port, hold);
        first_exchange(&a, &b);
        let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let q0 = engine_counter(&e2, "recv_queued");
        a.send_to(b"one", b_addr).unwrap();
        a.send_to(b"two", b_addr).unwrap();
        await_queued(&e2, q0, 2);
        let b0 = engine_counter(&e2, "tcp_tx_batched");
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut buf = [0u8; 16];
                let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
                assert_eq!(&buf[..m.len], b"one");
                b.send_to(b"answer one", a_addr).unwrap();
            });
        });
        let held = u64::from(!hold.is_zero());
        assert_eq!(engine_counter(&e2, "tcp_tx_batched") - b0, held, "held with reply_batch {hold:?}");
        let mut buf = [0u8; 16];
        let m = a.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
        assert_eq!((&buf[..m.len], m.from), (&b"answer one"[..], Some(b_addr)));
        let m = b.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
        assert_eq!(&buf[..m.len], b"two");
    }
}

/// Answers held for two peers at once: x's one thread answers the
/// requests of y and z, which send theirs in bursts of 20, so that x finds
/// both peers' requests queued and holds answers on two connections
/// (`tcp_tx_batched`). Each requester gets every answer once, in order,
/// with its content; x gets every request once, in order per sender.
#[test]
fn answers_held_for_several_peers_arrive_once_in_order() {
    use rds_sock::RecvFlags;
    const BURSTS: u32 = 25;
    const BURST: u32 = 20;
    let ip = addr_block(43);
    let engines = [engine(), engine(), engine()];
    let socks: Vec<_> = engines
        .iter()
        .enumerate()
        .map(|(n, e)| {
            let s = e.socket().unwrap();
            s.bind(sa(ip(n as u8 + 1), 4054)).unwrap();
            s
        })
        .collect();
    let (x, peers) = (&socks[0], &socks[1..]);
    let x_addr = x.local_addr().unwrap();
    let b0 = engine_counter(&engines[0], "tcp_tx_batched");
    let answer = |req: &[u8]| -> Vec<u8> { req.iter().map(|b| b ^ 0x5a).collect() };
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut next = [0u32; 2];
            let mut buf = [0u8; 16];
            for _ in 0..2 * BURSTS * BURST {
                let m = x.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
                let from = m.from.unwrap();
                let k = peers.iter().position(|p| p.local_addr().unwrap() == from).expect("a known peer");
                assert_eq!(&buf[..m.len], &(next[k] | (k as u32) << 24).to_le_bytes()[..], "request from peer {k}");
                next[k] += 1;
                x.send_to(&answer(&buf[..m.len]), from).unwrap();
            }
        });
        for (k, p) in peers.iter().enumerate() {
            s.spawn(move || {
                let mut buf = [0u8; 16];
                for burst in 0..BURSTS {
                    for i in 0..BURST {
                        let req = (burst * BURST + i) | (k as u32) << 24;
                        p.send_to(&req.to_le_bytes(), x_addr).unwrap();
                    }
                    for i in 0..BURST {
                        let req = (burst * BURST + i) | (k as u32) << 24;
                        let m = p.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
                        assert_eq!(
                            (&buf[..m.len], m.from),
                            (&answer(&req.to_le_bytes())[..], Some(x_addr)),
                            "answer {req:#x}"
                        );
                    }
                }
            });
        }
    });
    assert!(engine_counter(&engines[0], "tcp_tx_batched") > b0, "no answer was held");
    let none = RecvFlags { dontwait: true, ..RecvFlags::default() };
    let mut buf = [0u8; 16];
    for s in &socks {
        assert!(s.recv_msg(&mut buf, none).is_err(), "nothing more");
    }
}

/// A poll whose own read delivered the socket's next message reports it
/// without raising the socket's descriptor (rds-sock's `engine/owed.rs`):
/// a thread already waiting on the descriptor with a plain `poll(2)` (as
/// one in `epoll_wait` or `select`, which nothing interposes) is woken by
/// the TCP transport's linger tick instead, within the lane's linger (10
/// ms; 3 s allowed here), and the message is received once, in order.
/// Repeated until one round left the descriptor to the tick
/// (`engine_fd_owed_ticked`): a round whose answer the reactor read raised
/// it at once.
#[test]
fn a_poll_that_leaves_the_descriptor_behind_still_wakes_another_waiter() {
    until_the_tick_raises_it(4060, 1, |a, round| {
        let mut fds = [libc::pollfd { fd: a.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
        assert_eq!(a.poll_with(&mut fds, 0, Some(Duration::from_secs(10))).unwrap(), 1, "round {round}");
        assert_eq!(fds[0].revents, libc::POLLIN, "round {round}");
    });
}

/// A blocking receive whose own read delivered more than the message it
/// returns leaves the rest queued without raising the socket's descriptor,
/// for the receives that follow to take (rds-sock's `engine/owed.rs`): a
/// thread already waiting on the descriptor with a plain `poll(2)` is
/// woken by the linger tick instead, and every message is received once,
/// in order; a poll in between reports them. `b` answers each request
/// with three messages; repeated until one round left the descriptor to
/// the tick: a round whose read took one answer alone left nothing queued.
#[test]
fn a_blocking_receive_that_leaves_messages_queued_still_wakes_another_waiter() {
    until_the_tick_raises_it(4061, 3, |a, round| {
        let mut buf = [0u8; 64];
        let m = a.recv_msg_wait(&mut buf, rds_sock::RecvFlags::default(), in_10s()).unwrap();
        assert_eq!(&buf[..m.len], format!("req {round}0").as_bytes(), "round {round}");
    });
}

/// Rounds of a request from `a` answered by `b` with `copies` messages
/// (`answer_each`) until one round left `a`'s descriptor to the linger
/// tick (`engine_fd_owed_ticked`), at most 200. In each, another thread
/// waits on `a`'s descriptor in a plain `poll(2)` (`poll_from_elsewhere`)
/// and must be woken while `a` does nothing more after `first` (its wait
/// for the first answer); then `a` takes the answers in order, a poll
/// before each reporting it, and finds nothing more.
fn until_the_tick_raises_it(port: u16, copies: u8, first: impl Fn(&rds_sock::RdsSocket, u32)) {
    use rds_sock::RecvFlags;
    let ip = addr_block(43);
    let (Pair { e1, e2: _e2, a, b }, a_addr, b_addr) = exchanged_pair(ip, port);
    let ticked0 = engine_counter(&e1, "engine_fd_owed_ticked");
    let owed0 = engine_counter(&e1, "engine_fd_owed");
    let fd = a.as_raw_fd();
    let poll_a = |timeout: Duration| {
        let mut fds = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
        let n = a.poll_with(&mut fds, 0, Some(timeout)).unwrap();
        n == 1 && fds[0].revents == libc::POLLIN
    };
    let mut buf = [0u8; 64];
    let mut rounds = 0u32;
    std::thread::scope(|s| {
        s.spawn(|| answer_each(&b, a_addr, copies));
        while rounds < 200 && engine_counter(&e1, "engine_fd_owed_ticked") == ticked0 {
            rounds += 1;
            let waiter = s.spawn(poll_from_elsewhere(fd));
            std::thread::sleep(Duration::from_millis(2));
            a.send_to(format!("req {rounds}").as_bytes(), b_addr).unwrap();
            first(&a, rounds);
            let (woken, after) = waiter.join().unwrap();
            assert!(woken, "round {rounds}: the other waiter was not woken ({after:?})");
            // The answers `first` left (all of them after a poll), each
            // reported by a poll first (queued, or on its way).
            let from = if copies == 1 { 0 } else { 1 };
            for k in from..copies {
                assert!(poll_a(Duration::from_secs(5)), "round {rounds}: answer {k} not reported");
                let m = a.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() }).unwrap();
                let want = format!("req {rounds}{k}");
                assert_eq!((&buf[..m.len], m.from), (want.as_bytes(), Some(b_addr)), "round {rounds}");
            }
            assert!(!poll_a(Duration::ZERO), "round {rounds}: readable with nothing queued");
        }
        a.send_to(b"end", b_addr).unwrap();
        for k in 0..copies {
            let m = a.recv_msg_wait(&mut buf, RecvFlags::default(), in_10s()).unwrap();
            assert_eq!(&buf[..m.len], format!("end{k}").as_bytes());
        }
    });
    let ticked = engine_counter(&e1, "engine_fd_owed_ticked") - ticked0;
    let owed = engine_counter(&e1, "engine_fd_owed") - owed0;
    assert!(ticked > 0, "no round left the descriptor to the linger tick in {rounds} rounds ({owed} waits left it)");
    assert!(a.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() }).is_err(), "nothing more");
}

/// `b` answers every message with `copies` messages to `to`, each the
/// message with its number appended (`0`, `1`, ...), until one says `end`.
fn answer_each(b: &rds_sock::RdsSocket, to: std::net::SocketAddr, copies: u8) {
    let mut buf = [0u8; 64];
    loop {
        let m = b.recv_msg_wait(&mut buf, rds_sock::RecvFlags::default(), in_10s()).unwrap();
        for k in 0..copies {
            let mut ans = buf[..m.len].to_vec();
            ans.push(b'0' + k);
            b.send_to(&ans, to).unwrap();
        }
        if &buf[..m.len] == b"end" {
            break;
        }
    }
}

/// Another thread's wait on descriptor `fd` in a plain `poll(2)` (as one
/// in `epoll_wait` or `select`, which nothing interposes), for at most 3
/// s: whether it saw the descriptor readable, and after how long.
fn poll_from_elsewhere(fd: std::os::fd::RawFd) -> impl FnOnce() -> (bool, Duration) + Send {
    move || {
        let t0 = std::time::Instant::now();
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, 3000) };
        (r == 1 && p.revents & libc::POLLIN != 0, t0.elapsed())
    }
}
