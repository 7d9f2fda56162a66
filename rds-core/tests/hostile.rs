//! Hostile input at the node level: malformed congestion maps reset the
//! path and are counted; no header, payload or call sequence panics.
//! The random tests are seeded loops (the crate's own SplitMix64), so a
//! failure reproduces from the printed seed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rds_core::DownReason;
use rds_core::driver::{self, Dispatch};
use rds_core::types::Rng;
use rds_core::wire::{CONG_MAP_BYTES, Ext, FrameDecoder, HEADER_LEN, Header, flags};
use rds_core::*;
use rds_testkit::net::{Net, config, ip, make_node, sa};

/// A node at 127.0.0.2 with `n` paths accepted from a peer at 127.0.0.1
/// (after path 0, the peer's probe announces 8 paths: before the handshake
/// only path 0 is accepted).
fn node_with_paths(n: usize) -> (Node, Vec<PathInfo>) {
    let mut node = make_node(config(1), ip(2), TransportKind::Tcp);
    let mut paths = Vec::new();
    for k in 0..n {
        match node.accept(TransportKind::Tcp, ip(2), ip(1), 40000 + k as u16, Instant::now()) {
            Accept::Path(info) => paths.push(info),
            other => panic!("{other:?}"),
        }
        if k == 0 && n > 1 {
            let mut probe = Header::data(wire::PROBE_PORT, 0, 0);
            probe.sequence = 1;
            probe.push_extension(Ext::Npaths(8)).unwrap();
            assert_eq!(node.received(paths[0].id, paths[0].inst, msg(probe, Vec::new())), RecvOutcome::Ping);
        }
    }
    driver::outputs(&mut node);
    (node, paths)
}

fn msg(h: Header, payload: Vec<u8>) -> RxMessage {
    RxMessage::new(h, Payload::new(payload))
}

#[test]
fn congestion_map_of_the_wrong_length_resets_the_path() {
    let (mut n, paths) = node_with_paths(2);
    let p0 = paths[0];
    for (len, payload_len) in [(100u32, 100usize), (8191, 8191), (8193, 8193), (0, 0), (8192, 100), (100, 8192)] {
        let (mut n, paths) = node_with_paths(1);
        let p = paths[0];
        let mut h = Header::cong_map();
        h.len = len;
        assert_eq!(n.received(p.id, p.inst, msg(h, vec![0xff; payload_len])), RecvOutcome::ProtocolError, "len {len}");
        assert_eq!(n.counters().recv_drop_bad_frame, 1);
        assert_eq!(n.counters().cong_update_received, 0);
        let outs: Vec<Output> = driver::outputs(&mut n);
        // The path was up and taken by the peer: closed gracefully.
        assert_eq!(outs, [Output::Shutdown(PathInfo { taken: true, ..n.path_info(p.id).unwrap() })]);
        assert_eq!(n.path_state(p.id), Some(PathState::Disconnecting));
        // The map was not applied: the peer's ports are not congested.
        let s = n.socket();
        n.bind(s, sa(2, 4000)).unwrap();
        assert_eq!(n.send(s, Some(sa(1, 5000)), &Payload::empty(), &SendOptions::default()), Ok(0));
    }
    // A good map on another path still works and the bad one's path goes down.
    let mut good = vec![0u8; CONG_MAP_BYTES];
    good[625] = 0x01; // port 5000
    let p1 = paths[1];
    let mut bad = Header::cong_map();
    bad.len = 4;
    assert_eq!(n.received(p0.id, p0.inst, msg(bad, vec![0; 4])), RecvOutcome::ProtocolError);
    assert_eq!(n.received(p1.id, p1.inst, msg(Header::cong_map(), good)), RecvOutcome::CongMap);
    let s = n.socket();
    n.bind(s, sa(2, 4000)).unwrap();
    assert_eq!(n.send(s, Some(sa(1, 5000)), &Payload::empty(), &SendOptions::default()), Err(Errno::ENOBUFS));
    assert_eq!(n.send(s, Some(sa(1, 5001)), &Payload::empty(), &SendOptions::default()), Ok(0));
    let now = Instant::now();
    n.path_down(p0.id, p0.inst, DownReason::ShutdownDone, now);
    assert_eq!(n.path_state(p0.id), Some(PathState::Down));
    assert_eq!(n.counters().conn_reset, 1);
    // Not a map: CONG_BITMAP with another bit is data (for port 0: ignored).
    let mut h = Header::cong_map();
    h.flags = flags::CONG_BITMAP | flags::RETRANSMITTED;
    assert_eq!(n.received(p1.id, p1.inst, msg(h, vec![0; CONG_MAP_BYTES])), RecvOutcome::Ignored);
}

#[test]
fn a_bad_map_between_two_nodes_reconnects_and_traffic_goes_on() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"before").unwrap();
    net.run();
    // Node 1's side of path 0 receives a broken map (as if node 0 sent it).
    let p = net.path(1, 0, 0);
    let inst = net.links[&(1, p)].inst;
    let mut h = Header::cong_map();
    h.len = 10;
    let o = net.nodes[1].received(p, inst, msg(h, vec![0; 10]));
    assert_eq!(o, RecvOutcome::ProtocolError);
    net.run();
    assert_eq!(net.shutdowns.len(), 1);
    assert_eq!(net.shutdowns[0].0, 1);
    net.advance(0);
    net.run();
    net.send(0, a, sa(2, 4000), b"after").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"before".to_vec(), b"after".to_vec()]);
    assert_eq!(net.nodes[1].counters().recv_drop_bad_frame, 1);
}

fn random_header(rng: &mut Rng) -> Header {
    let mut h = match rng.below(8) {
        // Fully random bytes.
        0 => {
            let mut b = [0u8; HEADER_LEN];
            for x in b.iter_mut() {
                *x = rng.next_u64() as u8;
            }
            return Header::from_bytes(&b);
        }
        1 => Header::cong_map(),
        2 => Header::data(1, 0, 0),
        3 => Header::data(0, 1, 0),
        4 => Header::data(rng.below(8) as u16, 0, 0),
        _ => Header::data(4000 + rng.below(8) as u16, 4000 + rng.below(10) as u16, 0),
    };
    h.sequence = match rng.below(6) {
        0 => u64::MAX - rng.below(3),
        1 => 0,
        _ => rng.below(40),
    };
    if rng.below(4) == 0 {
        h.flags = rng.next_u64() as u8;
    } else if rng.below(3) == 0 {
        h.flags = flags::RETRANSMITTED;
    }
    match rng.below(5) {
        0 => {
            for x in h.exthdr.iter_mut() {
                *x = rng.next_u64() as u8;
            }
        }
        1 => {
            let _ = h.push_extension(Ext::Npaths(rng.next_u64() as u16));
            let _ = h.push_extension(Ext::GenNum(rng.below(4) as u32));
            if rng.below(2) == 0 {
                let _ = h.push_extension(Ext::SportIdx);
            }
        }
        2 => {
            let _ = h.push_extension(Ext::RdmaDest { rkey: rng.next_u64() as u32, offset: rng.next_u64() as u32 });
        }
        _ => {}
    }
    h
}

fn random_payload(rng: &mut Rng, h: &mut Header) -> Vec<u8> {
    let len = match rng.below(6) {
        0 if h.flags == flags::CONG_BITMAP || rng.below(3) == 0 => CONG_MAP_BYTES,
        0 => rng.below(50) as usize,
        1 => 0,
        2 => rng.below(CONG_MAP_BYTES as u64 + 2) as usize,
        _ => rng.below(200) as usize,
    };
    let p: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
    // Usually consistent with h_len, as a transport delivers it.
    if rng.below(5) != 0 {
        h.len = len as u32;
    }
    p
}

/// Serves a node's outputs the way a sloppy but legal driver might: at most
/// 1,000 of them per call (the rest wait for the next), through rds-core's
/// driver.
fn drive(n: &mut Node, rng: &mut Rng, now: Instant, acked: &mut Vec<(PathId, u64, u64)>) {
    let mut d = Sloppy { n, rng, now, acked, left: 1000 };
    let _ = driver::drain_with(&mut d, |d| Some(&mut *d.n));
}

struct Sloppy<'a> {
    n: &'a mut Node,
    rng: &'a mut Rng,
    now: Instant,
    acked: &'a mut Vec<(PathId, u64, u64)>,
    /// Outputs still to serve in this call; at 0 the drain stops.
    left: u32,
}

impl Sloppy<'_> {
    fn count(&mut self) -> Result<(), ()> {
        self.left -= 1;
        if self.left == 0 { Err(()) } else { Ok(()) }
    }
}

impl Dispatch for Sloppy<'_> {
    type Error = ();

    fn connect(&mut self, info: PathInfo) -> Result<(), ()> {
        if self.rng.below(2) == 0 {
            self.n.path_up(info.id, info.inst, Instant::now());
        } else {
            self.n.path_down(info.id, info.inst, DownReason::ConnectFailed, self.now);
        }
        self.count()
    }

    fn shutdown(&mut self, info: PathInfo) -> Result<(), ()> {
        self.n.path_down(info.id, info.inst, DownReason::ShutdownDone, self.now);
        self.count()
    }

    fn kick(&mut self, info: PathInfo) -> Result<(), ()> {
        let mut out = Vec::new();
        self.n.pull(info.id, info.inst, 1 + self.rng.below(5000) as usize, &mut out);
        for m in out {
            if !m.is_cong_map() {
                self.acked.push((info.id, info.inst, m.header.sequence));
            }
        }
        self.count()
    }

    fn rx_flow(&mut self, _: PathInfo, _: bool, _: u64) -> Result<(), ()> {
        self.count()
    }

    fn wake(&mut self, _: SockId) -> Result<(), ()> {
        self.count()
    }
}

#[test]
fn random_headers_and_payloads_never_panic() {
    for seed in 0..40u64 {
        let mut rng = Rng::new(seed.wrapping_mul(0x9e37_79b9) ^ 0x5eed);
        let mut cfg = config(1);
        if seed % 2 == 1 {
            cfg.handshake_exts = HandshakeExts::Full;
        }
        if seed % 3 == 0 {
            cfg.npaths = 1 + (seed % 8) as u8;
        }
        let mut n = make_node(cfg, ip(2), TransportKind::Tcp);
        n.add_local(ip(3), TransportKind::Tcp);
        let mut socks = Vec::new();
        for port in 4000..4008u16 {
            let s = n.socket();
            n.bind(s, sa(2, port)).unwrap();
            if port % 2 == 0 {
                n.setsockopt(s, SockOpt::RcvBuf(2000)).unwrap();
                n.setsockopt(s, SockOpt::CongMonitor(true)).unwrap();
            }
            socks.push(s);
        }
        let mut paths: Vec<PathInfo> = Vec::new();
        let mut now = Instant::now();
        let mut acked = Vec::new();
        let mut outcomes = std::collections::BTreeMap::new();
        for step in 0..1500u32 {
            let what = rng.below(100);
            let ctx = format!("seed {seed} step {step}");
            match what {
                // A peer connects (mostly from a smaller address, which is
                // accepted; sometimes from a larger one, which is refused).
                0..=9 => {
                    let peer = match rng.below(5) {
                        0 => ip(9),
                        1 | 2 => "10.0.0.1".parse().unwrap(),
                        _ => ip(1),
                    };
                    if let Accept::Path(info) =
                        n.accept(TransportKind::Tcp, ip(2), peer, rng.next_u64() as u16, Instant::now())
                    {
                        paths.push(info);
                    }
                }
                // A message arrives on some path instance, current or not.
                10..=69 => {
                    let mut h = random_header(&mut rng);
                    let payload = random_payload(&mut rng, &mut h);
                    let (id, inst) = match paths.get(rng.below(paths.len() as u64 + 1) as usize) {
                        // Mostly the path's current instance (it may be down).
                        Some(p) if rng.below(10) != 0 => (p.id, n.path_info(p.id).map_or(p.inst, |i| i.inst)),
                        Some(p) => (p.id, rng.below(5)),
                        None => (PathId { conn: ConnId(rng.below(4) as u32), index: rng.below(9) as u8 }, 1),
                    };
                    let o = n.received(id, inst, msg(h, payload));
                    *outcomes.entry(format!("{o:?}")).or_insert(0u32) += 1;
                }
                // The application does things.
                70..=79 => {
                    let s = socks[rng.below(socks.len() as u64) as usize];
                    let dst = match rng.below(4) {
                        0 => SocketAddr::new(ip(3), rng.below(3) as u16 + 4000),
                        1 => sa(1, 0),
                        _ => sa(1, 5000 + rng.below(4) as u16),
                    };
                    let len = rng.below(3000) as usize;
                    let _ = n.send(s, Some(dst), &Payload::new(vec![7; len]), &SendOptions::default());
                }
                80..=84 => {
                    let s = socks[rng.below(socks.len() as u64) as usize];
                    let _ = n.recv(s, rng.below(3) == 0);
                }
                85..=87 => {
                    if let Some(&(p, inst, seq)) = acked.get(rng.below(acked.len() as u64 + 1) as usize) {
                        n.acked(p, inst, seq + rng.below(3));
                    }
                }
                88..=89 => {
                    if let Some(p) = paths.get(rng.below(paths.len() as u64 + 1) as usize) {
                        n.path_down(p.id, p.inst, DownReason::Closed, now);
                    }
                }
                90..=91 => {
                    let s = socks[rng.below(socks.len() as u64) as usize];
                    let _ = n.drop_messages(s, if rng.below(2) == 0 { None } else { Some(sa(1, 5000)) });
                }
                92..=93 => {
                    if let Some(p) = paths.get(rng.below(paths.len() as u64 + 1) as usize) {
                        n.reset_path(p.id);
                    }
                }
                _ => {
                    now += Duration::from_millis(rng.below(1500));
                    n.handle_timeout(now);
                }
            }
            drive(&mut n, &mut rng, now, &mut acked);
            // Invariants that must hold whatever came in.
            for s in &socks {
                assert!(n.snd_bytes(*s) <= 64 << 20, "{ctx}");
            }
        }
        // The node still works: drain the sockets, then a clean message on a
        // new connection from another peer is delivered.
        for s in &socks {
            while n.recv(*s, false).is_ok() {}
        }
        let peer: std::net::IpAddr = "10.0.0.2".parse().unwrap(); // new and smaller: it connects
        let Accept::Path(p) = n.accept(TransportKind::Tcp, ip(2), peer, 1, Instant::now()) else {
            panic!("seed {seed}: accept refused")
        };
        let mut h = Header::data(6000, 4001, 5);
        h.sequence = 1;
        assert_eq!(n.received(p.id, p.inst, msg(h, b"clean".to_vec())), RecvOutcome::Delivered, "seed {seed}");
        match n.recv(socks[1], false) {
            Ok(Received::Data(i)) => assert_eq!(&i.payload[..], b"clean"),
            other => panic!("seed {seed}: {other:?}"),
        }
        let c = n.counters();
        if seed == 0 {
            eprintln!("seed 0 outcomes: {outcomes:?}");
            eprintln!(
                "seed 0: delivered {} pings {} maps {} dups {} bad frames {} no-sock {} restarts {}",
                c.recv_queued,
                c.recv_ping,
                c.cong_update_received,
                c.recv_drop_old_seq,
                c.recv_drop_bad_frame,
                c.recv_drop_no_sock,
                c.peer_restart
            );
        }
    }
}

#[test]
fn frame_decoder_never_panics_on_random_streams() {
    for seed in 0..200u64 {
        let mut rng = Rng::new(seed ^ 0xdec0de);
        let mut d = FrameDecoder::new(if seed % 2 == 0 { 1 << 20 } else { 4096 });
        let mut frames = 0usize;
        let mut total = 0u64;
        for _ in 0..50 {
            let n = rng.below(3000) as usize;
            let mut buf: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            // Sometimes a plausible header with a small length.
            if n >= HEADER_LEN && rng.below(2) == 0 {
                let mut h = Header::data(1, 2, rng.below(600) as u32);
                h.sequence = rng.next_u64();
                buf[..HEADER_LEN].copy_from_slice(&h.to_bytes());
            }
            match d.feed(&buf, &mut |f| {
                assert!(f.payload.len() == f.header.len as usize);
                frames += 1;
            }) {
                Ok(()) => total += n as u64,
                Err(wire::WireError::TooLong { len, max }) => {
                    assert!(len > max);
                    break;
                }
                Err(e) => panic!("seed {seed}: unexpected {e:?}"),
            }
            assert_eq!(d.consumed(), total);
        }
        let _ = frames;
    }
}

#[test]
fn header_parsing_never_panics() {
    let mut rng = Rng::new(42);
    for _ in 0..20_000 {
        let len = rng.below(100) as usize;
        let b: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match Header::decode(&b) {
            Ok(h) => {
                assert!(len >= HEADER_LEN);
                assert_eq!(&h.to_bytes()[..], &b[..HEADER_LEN]);
                assert!(h.extensions().count() <= 16);
                let _ = h.kind();
                let _ = format!("{h:?}");
                let _ = wire::verify_checksum(&h.to_bytes());
            }
            Err(e) => assert_eq!(e, wire::WireError::Truncated { have: len }),
        }
    }
}
