//! Unit tests of `listener.rs`.

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
