//! A node's whole receive path fed arbitrary bytes, the way rds-tcp feeds
//! it: TCP byte streams of accepted path connections split by the
//! `FrameDecoder` into frames handed to `Node::received` (data, pings,
//! probes with extension headers, congestion maps, retransmissions, stale
//! instances), interleaved with what the rest of a driver does (recv,
//! send, pull and ack, connection loss, timers, new connections).
//!
//! The node's outputs are drained by rds-core's driver (`driver::drain_with`
//! into this target's `Dispatch`).
//!
//! Checked: nothing panics; a protocol error or a bad map takes the path
//! down; receive-buffer accounting balances once the sockets are drained;
//! no message of a closed socket stays queued.
#![no_main]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use rds_core::driver::{self, Dispatch};
use rds_core::wire::{FrameDecoder, HEADER_LEN, Header};
use rds_core::*;

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

/// One accepted transport connection, as rds-tcp keeps it.
struct Conn {
    info: PathInfo,
    decoder: FrameDecoder,
}

/// The rest of a driver, through rds-core's driver: connects (to a larger
/// peer, or pokes) fail, shutdowns end at once, kicks are pulled and their
/// messages remembered for acks; at most `left` outputs, then an error.
struct Driver<'a> {
    n: &'a mut Node,
    pulled: &'a mut Vec<(PathId, u64, u64)>,
    now: Instant,
    outputs: &'a mut HashMap<&'static str, u32>,
    left: u32,
}

impl Driver<'_> {
    fn count(&mut self) -> Result<(), ()> {
        self.left -= 1;
        if self.left == 0 { Err(()) } else { Ok(()) }
    }
}

impl Dispatch for Driver<'_> {
    type Error = ();

    // Connects (to a larger peer, or pokes) fail: the peer is not there.
    fn connect(&mut self, info: PathInfo) -> Result<(), ()> {
        *self.outputs.entry("connect").or_insert(0) += 1;
        self.n.path_down(info.id, info.inst, DownReason::ConnectFailed, self.now);
        self.count()
    }

    fn shutdown(&mut self, info: PathInfo) -> Result<(), ()> {
        *self.outputs.entry("shutdown").or_insert(0) += 1;
        self.n.path_down(info.id, info.inst, DownReason::ShutdownDone, self.now);
        self.count()
    }

    fn kick(&mut self, info: PathInfo) -> Result<(), ()> {
        let mut out = Vec::new();
        self.n.pull(info.id, info.inst, 64 << 10, &mut out);
        for m in out {
            if !m.is_cong_map() {
                self.pulled.push((info.id, info.inst, m.header.sequence));
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

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let Some(setup) = inp.byte() else { return };
    let cfg = NodeConfig {
        npaths: 1 + setup % 8,
        handshake_exts: if setup & 0x08 != 0 { HandshakeExts::Full } else { HandshakeExts::Mainline },
        ping_enable: setup & 0x10 == 0,
        gen_num: 7,
        seed: u64::from(setup),
        rcv_hard_factor: 1 + u32::from(setup >> 5),
        ..NodeConfig::default()
    };
    let mut n = Node::new(cfg);
    n.register_transport(TransportCaps::tcp());
    n.register_transport(TransportCaps::loopback());
    n.add_local(ip(2), TransportKind::Tcp);
    let mut socks = Vec::new();
    for (k, port) in (4000..4004u16).enumerate() {
        let s = n.socket();
        n.bind(s, SocketAddr::new(ip(2), port)).unwrap();
        if k % 2 == 1 {
            n.setsockopt(s, SockOpt::RcvBuf(3000)).unwrap();
            n.setsockopt(s, SockOpt::CongMonitor(true)).unwrap();
        }
        socks.push(s);
    }
    let mut conns: Vec<Conn> = Vec::new();
    // Messages pulled for transmission: (path, instance, sequence).
    let mut pulled: Vec<(PathId, u64, u64)> = Vec::new();
    let mut now = Instant::now();
    let mut outputs: HashMap<&'static str, u32> = HashMap::new();

    let drive = |n: &mut Node, pulled: &mut Vec<(PathId, u64, u64)>, now: Instant, outputs: &mut HashMap<_, _>| {
        let mut d = Driver { n, pulled, now, outputs, left: 10_000 };
        if driver::drain_with(&mut d, |d| Some(&mut *d.n)).is_err() {
            panic!("the node never stops asking for work");
        }
    };

    for _ in 0..2000 {
        let Some(op) = inp.byte() else { break };
        match op % 10 {
            // A peer connects: mostly 127.0.0.1 (smaller, accepted).
            0 => {
                let peer = if op & 0x80 != 0 { ip(3) } else { ip(1) };
                let port = u16::from(inp.byte().unwrap_or(0));
                if let Accept::Path(info) = n.accept(TransportKind::Tcp, ip(2), peer, 40000 + port, now) {
                    // A newer instance replaces an older one of the same path.
                    conns.retain(|c| c.info.id != info.id);
                    conns.push(Conn { info, decoder: FrameDecoder::default() });
                }
            }
            // Stream bytes arrive on a connection.
            1..=4 => {
                if conns.is_empty() {
                    continue;
                }
                let k = usize::from(inp.byte().unwrap_or(0)) % conns.len();
                let len = usize::from(inp.byte().unwrap_or(0)) * 4;
                let bytes = inp.bytes(len).to_vec();
                let c = &mut conns[k];
                let (id, inst) = (c.info.id, c.info.inst);
                let mut frames = Vec::new();
                let r = c.decoder.feed(&bytes, &mut |f| frames.push(f));
                for f in frames {
                    n.received(id, inst, RxMessage::from(f));
                }
                if r.is_err() {
                    conns.remove(k);
                    n.path_down(id, inst, DownReason::ProtocolError, now);
                }
            }
            // A whole frame with a consistent length (reaches deeper faster).
            5 => {
                if conns.is_empty() {
                    continue;
                }
                let k = usize::from(inp.byte().unwrap_or(0)) % conns.len();
                let mut hb = [0u8; HEADER_LEN];
                let raw = inp.bytes(HEADER_LEN);
                hb[..raw.len()].copy_from_slice(raw);
                let mut h = Header::from_bytes(&hb);
                let plen = if h.flags == rds_core::wire::flags::CONG_BITMAP && op & 0x40 == 0 {
                    rds_core::wire::CONG_MAP_BYTES
                } else {
                    usize::from(h.len as u16) % 3000
                };
                h.len = plen as u32;
                let fill = inp.byte().unwrap_or(0);
                let c = &conns[k];
                let msg = RxMessage::new(h, Payload::new(vec![fill; plen]));
                let o = n.received(c.info.id, c.info.inst, msg);
                if o == RecvOutcome::ProtocolError {
                    assert_ne!(n.path_state(c.info.id), Some(PathState::Up), "a protocol error takes the path down");
                }
            }
            6 => {
                let s = socks[usize::from(op >> 4) % socks.len()];
                let _ = n.recv(s, op & 0x08 != 0);
            }
            7 => {
                let s = socks[usize::from(op >> 4) % socks.len()];
                let port = 5000 + u16::from(op & 0x0f);
                let len = usize::from(inp.byte().unwrap_or(0)) * 16;
                let _ = n.send(
                    s,
                    Some(SocketAddr::new(ip(1), port)),
                    &Payload::new(vec![op; len]),
                    &SendOptions::default(),
                );
            }
            // Acks of pulled messages (possibly stale ones).
            8 => {
                if let Some(&(p, inst, seq)) = pulled.get(usize::from(inp.byte().unwrap_or(0)) % pulled.len().max(1)) {
                    n.acked(p, inst, seq);
                }
            }
            // A connection fails, or time passes.
            _ => {
                if op & 0x10 != 0 && !conns.is_empty() {
                    let c = conns.remove(usize::from(op >> 5) % conns.len());
                    n.path_down(c.info.id, c.info.inst, DownReason::Closed, now);
                } else {
                    now += Duration::from_millis(u64::from(op >> 4) * 100);
                    n.handle_timeout(now);
                }
            }
        }
        drive(&mut n, &mut pulled, now, &mut outputs);
    }

    // Receive accounting balances once every socket is drained.
    for s in &socks {
        while n.recv(*s, false).is_ok() {}
        assert!(!n.readiness(*s).readable || n.recv(*s, false).is_ok());
    }
    let c = n.counters().clone();
    assert_eq!(c.recv_bytes_added_to_sock, c.recv_bytes_freed_fromsock, "receive bytes accounted");
    // Acking everything pulled frees every sent byte of the live connections;
    // closing the sockets frees the rest.
    for &(p, inst, seq) in &pulled {
        n.acked(p, inst, seq);
    }
    drive(&mut n, &mut pulled, now, &mut outputs);
    for s in socks {
        n.close(s);
    }
    // Closing a socket drops every message it still had queued or unacked.
    let left: usize = n.unsent().iter().map(|u| u.queued + u.unacked).sum();
    assert_eq!(left, 0, "{:?}", n.unsent());
});
