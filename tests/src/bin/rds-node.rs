//! rds-node: one RDS node in a process of its own, for tests that kill a
//! node's process and start it again (tests/restart.rs).
//!
//!     rds-node --ip IP --port P --instance K --exts mainline|full
//!              --peer IP [--peer IP ...] [--count N] [--tcp-rcvbuf BYTES]
//!
//! It binds one RDS socket on IP:P and streams numbered datagrams to port P
//! of every peer (one thread per peer): `--count N` of them as fast as they
//! go, or with `--count 0` paced (10 per millisecond) until it is killed,
//! at most 100,000 or 60 s. Every datagram it receives is checked (content
//! and header, see `rds_tests::payload`) and reported on stdout.
//!
//! Flow ids (the `flow` of `rds_tests::payload`): `src << 8 | dst << 4 |
//! kind`, where src and dst are the last bytes of the nodes' addresses and
//! kind, for this node's streams, is its instance number K.
//!
//! Stdout, one line per event, each written at once:
//!
//!     READY <gen_num>                      bound; the streams start
//!     R <from> <flow> <index> <len>        a datagram received, content checked
//!     BAD <from> <what>                    a datagram that is not what was sent
//!     SENT <peer> <n>                      a bounded stream is all sent
//!     FLUSHED <true|false>                 all of them acked (at most 30 s)
//!     COUNTER <name> <value>               after EXIT on stdin, every counter
//!     BYE                                  then the process exits 0
//!
//! End of stdin (the test died) ends the process at once.

use std::io::{BufRead, Write};
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rds_sock::{Engine, EngineConfig, HandshakeExts, RdsSocket};
use rds_tests::{check_payload, payload};

/// The flow id of a stream from node `src` to node `dst`.
fn flow(src: u8, dst: u8, kind: u8) -> u32 {
    u32::from(src) << 8 | u32::from(dst) << 4 | u32::from(kind)
}

/// Datagram sizes: 16..1515 bytes, a function of flow and index.
fn len_of(flow: u32, index: u64) -> usize {
    16 + ((index.wrapping_mul(7919) ^ u64::from(flow)) % 1500) as usize
}

fn last_byte(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(v) => v.octets()[3],
        IpAddr::V6(v) => v.octets()[15],
    }
}

/// One line on stdout, written at once (a pipe write of a short line is
/// atomic, so a kill never leaves half a line). If the reader is gone,
/// so is the test: exit.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

struct Args {
    ip: IpAddr,
    port: u16,
    instance: u8,
    exts: HandshakeExts,
    peers: Vec<IpAddr>,
    count: u64,
    tcp_rcvbuf: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let v: Vec<String> = std::env::args().skip(1).collect();
    let (mut ip, mut port, mut instance, mut exts) = (None, None, None, None);
    let (mut peers, mut count, mut tcp_rcvbuf) = (Vec::new(), 0, None);
    let mut i = 0;
    while i < v.len() {
        let val = v.get(i + 1).ok_or_else(|| format!("{} needs a value", v[i]))?;
        let bad = || format!("bad value for {}: {val}", v[i]);
        match v[i].as_str() {
            "--ip" => ip = Some(val.parse().map_err(|_| bad())?),
            "--port" => port = Some(val.parse().map_err(|_| bad())?),
            "--instance" => instance = Some(val.parse().map_err(|_| bad())?),
            "--exts" => {
                exts = Some(match val.as_str() {
                    "mainline" => HandshakeExts::Mainline,
                    "full" => HandshakeExts::Full,
                    _ => return Err(format!("--exts: mainline or full, not {val}")),
                })
            }
            "--peer" => peers.push(val.parse().map_err(|_| bad())?),
            "--count" => count = val.parse().map_err(|_| bad())?,
            "--tcp-rcvbuf" => tcp_rcvbuf = Some(val.parse().map_err(|_| bad())?),
            other => return Err(format!("unknown argument {other}")),
        }
        i += 2;
    }
    Ok(Args {
        ip: ip.ok_or("--ip missing")?,
        port: port.ok_or("--port missing")?,
        instance: instance.ok_or("--instance missing")?,
        exts: exts.ok_or("--exts missing")?,
        peers,
        count,
        tcp_rcvbuf,
    })
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rds-node: {e}");
            return ExitCode::from(2);
        }
    };
    let mut cfg = EngineConfig::default();
    cfg.node.handshake_exts = args.exts;
    cfg.tcp.rcvbuf = args.tcp_rcvbuf;
    cfg.info_dir = None;
    let gen_num = cfg.node.gen_num;
    let setup = || -> std::io::Result<(Engine, RdsSocket)> {
        let e = Engine::new(cfg)?;
        let s = e.socket()?;
        s.bind(SocketAddr::new(args.ip, args.port))?;
        s.set_send_buffer_size_force(4 << 20)?;
        s.set_recv_buffer_size_force(16 << 20)?;
        s.set_write_timeout(Some(Duration::from_secs(60)))?;
        Ok((e, s))
    };
    let (engine, sock) = match setup() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("rds-node {}: {e}", args.ip);
            return ExitCode::from(1);
        }
    };
    let sock = Arc::new(sock);
    say(&format!("READY {gen_num}"));

    // The receiver: checks and reports every datagram.
    {
        let sock = sock.clone();
        std::thread::spawn(move || {
            loop {
                let (p, from) = match sock.recv_payload() {
                    Ok(v) => v,
                    Err(e) => {
                        say(&format!("BAD - recv: {e}"));
                        return;
                    }
                };
                if p.len() < 16 {
                    say(&format!("BAD {from} a datagram of {} bytes", p.len()));
                    continue;
                }
                let f = u32::from_le_bytes(p[..4].try_into().unwrap());
                let i = u64::from_le_bytes(p[4..12].try_into().unwrap());
                match check_payload(f, i, &p) {
                    Ok(()) => say(&format!("R {from} {f} {i} {}", p.len())),
                    Err(e) => say(&format!("BAD {from} {e}")),
                }
            }
        });
    }

    // The senders.
    let me = last_byte(args.ip);
    let mut senders = Vec::new();
    for peer in args.peers.clone() {
        let sock = sock.clone();
        let (count, instance, port) = (args.count, args.instance, args.port);
        senders.push(std::thread::spawn(move || {
            let f = flow(me, last_byte(peer), instance);
            let dst = SocketAddr::new(peer, port);
            let (limit, t0) = (if count == 0 { 100_000 } else { count }, Instant::now());
            for i in 0..limit {
                if count == 0 && (i % 10 == 9) {
                    std::thread::sleep(Duration::from_millis(1));
                    if t0.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                }
                if let Err(e) = sock.send_to(&payload(f, i, len_of(f, i)), dst) {
                    say(&format!("BAD {dst} send {i}: {e}"));
                    return;
                }
            }
            if count != 0 {
                say(&format!("SENT {peer} {count}"));
            }
        }));
    }
    if args.count != 0 {
        let sock = sock.clone();
        std::thread::spawn(move || {
            for s in senders {
                let _ = s.join();
            }
            say(&format!("FLUSHED {}", sock.flush(Duration::from_secs(30))));
        });
    }

    // Stdin: EXIT reports the counters; end of input ends the process.
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(l) if l.trim() == "EXIT" => {
                for (k, v) in engine.counters() {
                    say(&format!("COUNTER {k} {v}"));
                }
                say("BYE");
                std::process::exit(0);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    ExitCode::SUCCESS
}
