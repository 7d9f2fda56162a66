//! rds-ib-peer: our engine over RDS-IB (feature `ib`), for the VM tests
//! (`tests/ib_vm.rs`).
//!
//! ```text
//! rds-ib-peer ORDER LOCAL LPORT PEER PPORT SIZE...
//!     ORDER is send-recv or recv-send: an RdsSocket with
//!     SO_RDS_TRANSPORT = RDS_TRANS_IB bound to LOCAL:LPORT; then (after
//!     `barrier $BARRIER 60` when BARRIER is set) it sends one message per
//!     SIZE to PEER:PPORT (byte i of message k is (i + k) % 251) and waits
//!     until all are acked, and receives one message per SIZE from
//!     PEER:PPORT checking sender, length and contents, in ORDER.
//! ```
//!
//!
//! ```text
//! rds-ib-peer recv-none LOCAL LPORT PEER PPORT
//!     binds as above and expects nothing for WAIT_S seconds (default 20):
//!     `NONE` (ok) or `RX ...` lines (FAIL).
//! rds-ib-peer recv-then-none LOCAL LPORT PEER PPORT SIZE...
//!     receives as recv-send does, then expects nothing more for WAIT_S
//!     seconds: `NONE` (ok) or `RX ...` (FAIL).
//! rds-ib-peer send-unacked LOCAL LPORT PEER PPORT SIZE...
//!     sends as above and waits FLUSH_S seconds (default 15) for the acks:
//!     `ACKED n` or `UNACKED`, ok either way.
//! rds-ib-peer tcp-send LOCAL LPORT PEER PPORT SIZE...
//!     send-unacked from a socket with SO_RDS_TRANSPORT = TCP (with the
//!     verbs-only setup, LOCAL needs RDS_IB_PSK_TCP=1 to be served by TCP).
//! rds-ib-peer tcp-probe LOCAL LPORT PEER PPORT
//!     a raw TCP connection to PEER:16385 (RDS_TCP_PORT): `TCPCONNECT
//!     refused`, or `TCPCONNECT connected` and then one hand-made RDS data
//!     frame (48-byte header, 5 bytes "probe") from LPORT to PPORT,
//!     `TCPFRAME sent`.
//! rds-ib-peer rogue LOCAL LPORT PEER PPORT
//!     a verbs-only side channel client without the key: HELLO, then a
//!     well-formed CLIENT_PARAMS whose MAC is made with the key file
//!     RDS_IB_PSK_FILE (a wrong one) to PEER:RDS_IB_SIDE_PORT (18635);
//!     prints `ROGUE closed` when the peer closes the connection without a
//!     frame, `ROGUE answered` if it answers.
//! rds-ib-peer stall LOCAL LPORT PEER PPORT
//!     an RDMA CM connect request to PEER that never completes
//!     (`rds_ib::verbs::StalledRequest`: no QP, the peer's accept never
//!     answered): `STALL accepted` or `STALL refused`, then holds it for
//!     HOLD_S seconds (default 10), `STALL released`.
//! ```
//!
//!
//! ```text
//! rds-ib-peer stream-send LOCAL LPORT PEER PPORT N
//!     sends N numbered datagrams of mixed sizes (64 B .. 64 KiB, see
//!     `stream_len`; the first 8 bytes are k big-endian, the rest is
//!     pattern(k)) to PEER:PPORT, sleeping GAP_US microseconds (default
//!     3000) after each, then waits FLUSH_S seconds (default 120) until all
//!     are acked: `SENT n bytes b`, `ACKED n` or FAIL.
//! rds-ib-peer stream-recv LOCAL LPORT PEER PPORT N
//!     receives until message N-1 arrived (WAIT_S seconds without anything
//!     ends it, default 60), then STRAGGLE_S more seconds (default 3) for
//!     late duplicates; checks each against the next expected k (sender,
//!     length and every byte): `RXSTAT received r inorder o dup d lost l
//!     bad b` and at most 20 `ANOMALY ...` lines; ok only when o == N and
//!     nothing else happened.
//! ```
//!
//! Both print `DELTA name d` (counters at the end minus just after bind);
//! `END_BARRIER` names a barrier run before the counters and the shutdown.
//! `RCV_BUDGET=bytes` starts the engine with that node receive budget
//! (`NodeConfig::rcv_budget`); with `HOLD_S=s` stream-recv reads nothing
//! for that long after the barrier (receive flow control pauses the path),
//! then prints `HOLD name d` (the same counters then) and reads.
//!
//! Env: `END_BARRIER` names a barrier run before the counters; `GAP_MS` sleeps that long between sends; `PAUSE_AT=k` runs
//! `barrier pause-k 120` before sending message k (a test cuts the link
//! meanwhile). Output: `BOUND`, `TX k len n`, `ACKED`, `ACKTIME s` (from
//! the first send), `RX k len n from
//! A:P ok|BAD`, counters (`CTR name value`), then `RESULT ok|FAIL ...`.

use std::net::SocketAddr;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use rds_sock::{Engine, TransportKind};

fn pattern(k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i + k) % 251) as u8).collect()
}

fn barrier(name: &str, secs: u32) -> Result<(), String> {
    let st =
        Command::new("barrier").arg(name).arg(secs.to_string()).status().map_err(|e| format!("barrier {name}: {e}"))?;
    if st.success() { Ok(()) } else { Err(format!("barrier {name} failed")) }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5
        || !matches!(
            args[0].as_str(),
            "send-recv"
                | "recv-send"
                | "recv-none"
                | "recv-then-none"
                | "send-unacked"
                | "tcp-send"
                | "tcp-probe"
                | "rogue"
                | "stall"
                | "stream-send"
                | "stream-recv"
        )
    {
        eprintln!(
            "usage: rds-ib-peer send-recv|recv-send|recv-none|recv-then-none|send-unacked|tcp-send|tcp-probe|rogue|stall|stream-send|stream-recv LOCAL LPORT PEER PPORT SIZE..."
        );
        return ExitCode::from(2);
    }
    let res = match args[0].as_str() {
        "rogue" => rogue(&args),
        "stall" => stall(&args),
        "tcp-probe" => tcp_probe(&args),
        _ => run(&args),
    };
    rds_tests::report_result(res)
}

fn run(a: &[String]) -> Result<(), String> {
    let sa = |ip: &str, port: &str| -> Result<SocketAddr, String> {
        let ip: std::net::IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
        Ok(SocketAddr::new(ip, port.parse().map_err(|e| format!("{port}: {e}"))?))
    };
    let local = sa(&a[1], &a[2]).map_err(|e| format!("local: {e}"))?;
    let peer = sa(&a[3], &a[4]).map_err(|e| format!("peer: {e}"))?;
    if a[0].starts_with("stream-") {
        return stream(a, local, peer);
    }
    let sizes: Vec<usize> =
        a[5..].iter().map(|s| s.parse().map_err(|_| format!("bad size {s}"))).collect::<Result<_, _>>()?;
    let gap = std::env::var("GAP_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    let pause_at: Option<usize> = std::env::var("PAUSE_AT").ok().and_then(|v| v.parse().ok());
    let env_secs = |name: &str, dflt: u64| {
        Duration::from_secs(std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(dflt))
    };
    let engine = Engine::global().map_err(|e| format!("engine: {e}"))?;
    let s = engine.socket().map_err(|e| format!("socket: {e}"))?;
    if a[0] == "tcp-send" {
        s.set_transport(TransportKind::Tcp).map_err(|e| format!("SO_RDS_TRANSPORT=TCP: {e}"))?;
    } else {
        s.set_transport(TransportKind::Ib).map_err(|e| format!("SO_RDS_TRANSPORT=IB: {e}"))?;
    }
    s.set_send_buffer_size_force(8 << 20).map_err(|e| e.to_string())?;
    s.set_recv_buffer_size_force(8 << 20).map_err(|e| e.to_string())?;
    s.bind(local).map_err(|e| format!("bind {local}: {e}"))?;
    println!("BOUND {local} transport {}", s.transport_raw().map_err(|e| e.to_string())?);
    if let Ok(b) = std::env::var("BARRIER") {
        barrier(&b, 60)?;
    }
    let send = |s: &rds_sock::RdsSocket| -> Result<(), String> {
        let t_send = Instant::now();
        for (k, &n) in sizes.iter().enumerate() {
            if pause_at == Some(k) {
                println!("PAUSE {k}");
                barrier(&format!("pause-{k}"), 120)?;
                barrier(&format!("resume-{k}"), 120)?;
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match s.send_to(&pattern(k, n), peer) {
                    Ok(_) => break,
                    Err(e)
                        if matches!(e.raw_os_error(), Some(libc::ENOBUFS) | Some(libc::EAGAIN))
                            && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => return Err(format!("send {k}: {e}")),
                }
            }
            println!("TX {k} len {n}");
            if let Some(g) = gap {
                std::thread::sleep(g);
            }
        }
        if !s.flush(Duration::from_secs(90)) {
            return Err("not all messages acked in 90 s".into());
        }
        println!("ACKED {}", sizes.len());
        println!("ACKTIME {:.2} s", t_send.elapsed().as_secs_f64());
        Ok(())
    };
    let recv = |s: &rds_sock::RdsSocket| -> Result<(), String> {
        s.set_read_timeout(Some(Duration::from_secs(90))).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 2 << 20];
        let mut bad = 0;
        for (k, &n) in sizes.iter().enumerate() {
            let (len, from) = s.recv_from(&mut buf).map_err(|e| format!("recv {k}: {e}"))?;
            let ok = from == peer && buf[..len] == pattern(k, n)[..];
            bad += usize::from(!ok);
            println!("RX {k} len {len} from {from} {}", if ok { "ok" } else { "BAD" });
        }
        if bad > 0 { Err(format!("{bad} bad messages")) } else { Ok(()) }
    };
    let recv_none = |s: &rds_sock::RdsSocket| -> Result<(), String> {
        s.set_read_timeout(Some(env_secs("WAIT_S", 20))).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 2 << 20];
        match s.recv_from(&mut buf) {
            Ok((len, from)) => {
                println!("RX 0 len {len} from {from} UNEXPECTED");
                Err("a message arrived".into())
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ETIMEDOUT)) => {
                println!("NONE");
                Ok(())
            }
            Err(e) => Err(format!("recv: {e}")),
        }
    };
    let send_unacked = |s: &rds_sock::RdsSocket| -> Result<(), String> {
        for (k, &n) in sizes.iter().enumerate() {
            s.send_to(&pattern(k, n), peer).map_err(|e| format!("send {k}: {e}"))?;
            println!("TX {k} len {n}");
        }
        if s.flush(env_secs("FLUSH_S", 15)) {
            println!("ACKED {}", sizes.len());
        } else {
            println!("UNACKED");
        }
        Ok(())
    };
    let res = match a[0].as_str() {
        "send-recv" => send(&s).and_then(|()| recv(&s)),
        "recv-send" => recv(&s).and_then(|()| send(&s)),
        "recv-none" => recv_none(&s),
        "recv-then-none" => recv(&s).and_then(|()| recv_none(&s)),
        _ => send_unacked(&s),
    };
    if let Ok(b) = std::env::var("END_BARRIER") {
        let _ = barrier(&b, 180);
    }
    for (name, v) in engine.counters() {
        if name.starts_with("ib_")
            || name.starts_with("recv_drop")
            || name.contains("conn_reset")
            || name.contains("retrans")
        {
            println!("CTR {name} {v}");
        }
    }
    // Let the peer's last acks and our own go out before the process ends.
    let rep = engine.shutdown(Duration::from_secs(5));
    println!("UNSENT {}", rep.messages());
    res
}

/// Length of stream message k: 64 B .. 64 KiB, mostly small, a few large.
fn stream_len(k: usize) -> usize {
    let h = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let h = (h ^ (h >> 31)) as usize;
    match h % 8 {
        0 => 65536,
        1 => 64,
        2 | 3 => 64 + (h >> 8) % (65536 - 64 + 1),
        _ => 64 + (h >> 8) % 4033,
    }
}

fn stream_msg(k: usize) -> Vec<u8> {
    let mut m = pattern(k, stream_len(k));
    m[..8].copy_from_slice(&(k as u64).to_be_bytes());
    m
}

/// `stream-send` / `stream-recv` (see the module docs).
fn stream(a: &[String], local: SocketAddr, peer: SocketAddr) -> Result<(), String> {
    let n: usize = a.get(5).and_then(|v| v.parse().ok()).ok_or("N missing")?;
    let env_u64 = |name: &str, dflt: u64| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(dflt);
    let engine = match std::env::var("RCV_BUDGET").ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(b) => {
            let mut cfg = rds_sock::EngineConfig::default();
            cfg.node.rcv_budget = b;
            Engine::new(cfg)
        }
        None => Engine::global(),
    }
    .map_err(|e| format!("engine: {e}"))?;
    let s = engine.socket().map_err(|e| format!("socket: {e}"))?;
    s.set_transport(TransportKind::Ib).map_err(|e| format!("SO_RDS_TRANSPORT=IB: {e}"))?;
    s.set_send_buffer_size_force(8 << 20).map_err(|e| e.to_string())?;
    s.set_recv_buffer_size_force(16 << 20).map_err(|e| e.to_string())?;
    s.bind(local).map_err(|e| format!("bind {local}: {e}"))?;
    println!("BOUND {local} transport {}", s.transport_raw().map_err(|e| e.to_string())?);
    let before = engine.counters();
    if let Ok(b) = std::env::var("BARRIER") {
        barrier(&b, 60)?;
    }
    let t0 = Instant::now();
    let res = if a[0] == "stream-send" {
        let gap = Duration::from_micros(env_u64("GAP_US", 3000));
        let mut bytes = 0usize;
        let mut res = Ok(());
        'send: for k in 0..n {
            let m = stream_msg(k);
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match s.send_to(&m, peer) {
                    Ok(_) => break,
                    Err(e)
                        if matches!(e.raw_os_error(), Some(libc::ENOBUFS) | Some(libc::EAGAIN))
                            && Instant::now() < deadline =>
                    {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => {
                        res = Err(format!("send {k}: {e}"));
                        break 'send;
                    }
                }
            }
            bytes += m.len();
            if k % 500 == 0 {
                println!("PROGRESS {k} at {:.2} s", t0.elapsed().as_secs_f64());
            }
            std::thread::sleep(gap);
        }
        if res.is_ok() {
            println!("SENT {n} bytes {bytes} in {:.2} s", t0.elapsed().as_secs_f64());
            if s.flush(Duration::from_secs(env_u64("FLUSH_S", 120))) {
                println!("ACKED {n} at {:.2} s", t0.elapsed().as_secs_f64());
            } else {
                res = Err(format!("not all of the {n} messages acked"));
            }
        }
        res
    } else {
        let mut buf = vec![0u8; 1 << 17];
        let (mut received, mut inorder, mut dup, mut lost, mut bad) = (0usize, 0usize, 0usize, 0usize, 0usize);
        let mut anomalies = 0;
        let mut note = |what: String| {
            anomalies += 1;
            if anomalies <= 20 {
                println!("ANOMALY {what}");
            }
        };
        let mut next = 0usize;
        let hold = env_u64("HOLD_S", 0);
        if hold > 0 {
            std::thread::sleep(Duration::from_secs(hold));
            print_ctrs(&engine, &before, "HOLD");
        }
        s.set_read_timeout(Some(Duration::from_secs(env_u64("WAIT_S", 60)))).map_err(|e| e.to_string())?;
        let mut straggling = false;
        loop {
            let (len, from) = match s.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ETIMEDOUT)) => break,
                Err(e) => return Err(format!("recv after {received}: {e}")),
            };
            received += 1;
            let k = if len >= 8 { u64::from_be_bytes(buf[..8].try_into().unwrap()) as usize } else { usize::MAX };
            if from != peer || len < 8 || k >= n || buf[..len] != stream_msg(k)[..] {
                bad += 1;
                note(format!("bad message #{received} len {len} from {from} k {k}"));
            } else if k < next {
                dup += 1;
                note(format!("duplicate k {k} (expected {next})"));
            } else {
                if k > next {
                    lost += k - next;
                    note(format!("gap: k {k} while expecting {next}"));
                } else {
                    inorder += 1;
                }
                next = k + 1;
            }
            if next == n && !straggling {
                println!("LAST at {:.2} s", t0.elapsed().as_secs_f64());
                straggling = true;
                s.set_read_timeout(Some(Duration::from_secs(env_u64("STRAGGLE_S", 3)))).map_err(|e| e.to_string())?;
            }
        }
        lost += n - next;
        println!("RXSTAT received {received} inorder {inorder} dup {dup} lost {lost} bad {bad}");
        if inorder == n && received == n && dup + lost + bad == 0 {
            Ok(())
        } else {
            Err(format!("received {received}, in order {inorder} of {n}, dup {dup}, lost {lost}, bad {bad}"))
        }
    };
    if let Ok(b) = std::env::var("END_BARRIER") {
        let _ = barrier(&b, 180);
    }
    if res.is_err() || std::env::var_os("RDS_IB_DEBUG").is_some() {
        for c in engine.connections() {
            println!("CONN {c:?}");
        }
    }
    print_ctrs(&engine, &before, "DELTA");
    let rep = engine.shutdown(Duration::from_secs(5));
    println!("UNSENT {}", rep.messages());
    res
}

/// `TAG name d`: the counters of interest now minus `before`.
fn print_ctrs(engine: &Engine, before: &[(String, u64)], tag: &str) {
    for (name, v) in &engine.counters() {
        if name.starts_with("ib_")
            || name.contains("conn_reset")
            || name.contains("retrans")
            || name.contains("drop")
            || name.starts_with("recv_pause")
            || name.starts_with("recv_resume")
        {
            let b = before.iter().find(|(m, _)| m == name).map_or(0, |(_, x)| *x);
            println!("{tag} {name} {}", v.saturating_sub(b));
        }
    }
}

/// A connect request that never completes (see the module docs).
fn stall(a: &[String]) -> Result<(), String> {
    let local: std::net::IpAddr = a[1].parse().map_err(|e| format!("local: {e}"))?;
    let peer: std::net::IpAddr = a[3].parse().map_err(|e| format!("peer: {e}"))?;
    let hold = std::env::var("HOLD_S").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let r = rds_ib::verbs::StalledRequest::send(local, peer, Instant::now() + Duration::from_secs(10))
        .map_err(|e| format!("stalled request: {e}"))?;
    println!("STALL {}", if r.accepted { "accepted" } else { "refused" });
    std::thread::sleep(Duration::from_secs(hold));
    drop(r);
    println!("STALL released");
    Ok(())
}

/// A raw TCP connection to the peer's RDS-TCP port (see the module docs).
fn tcp_probe(a: &[String]) -> Result<(), String> {
    use std::io::Write;
    use std::net::{IpAddr, TcpStream};
    let peer: IpAddr = a[3].parse().map_err(|e| format!("peer: {e}"))?;
    let lport: u16 = a[2].parse().map_err(|e| format!("{}: {e}", a[2]))?;
    let pport: u16 = a[4].parse().map_err(|e| format!("{}: {e}", a[4]))?;
    let port = std::env::var("RDS_TCP_PORT").ok().and_then(|v| v.parse().ok()).unwrap_or(rds_core::wire::RDS_TCP_PORT);
    match TcpStream::connect_timeout(&(peer, port).into(), Duration::from_secs(10)) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            println!("TCPCONNECT refused");
            Ok(())
        }
        Err(e) => Err(format!("connect {peer}:{port}: {e}")),
        Ok(mut s) => {
            println!("TCPCONNECT connected");
            let mut h = rds_core::wire::Header::data(lport, pport, 5);
            h.sequence = 1;
            let mut frame = h.to_bytes().to_vec();
            frame.extend_from_slice(b"probe");
            s.write_all(&frame).map_err(|e| format!("frame: {e}"))?;
            println!("TCPFRAME sent");
            std::thread::sleep(Duration::from_secs(2));
            Ok(())
        }
    }
}

/// A side channel client without the right key (see the module docs).
fn rogue(a: &[String]) -> Result<(), String> {
    use rds_ib::sidechannel::{self as sc, Kind, Params};
    use std::io::{Read, Write};
    use std::net::{IpAddr, TcpStream};
    let local: IpAddr = a[1].parse().map_err(|e| format!("local: {e}"))?;
    let peer: IpAddr = a[3].parse().map_err(|e| format!("peer: {e}"))?;
    let path = std::env::var(rds_ib::transport::ENV_PSK_FILE).map_err(|_| "RDS_IB_PSK_FILE not set".to_string())?;
    let key = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
    let port =
        std::env::var(rds_ib::transport::ENV_SIDE_PORT).ok().and_then(|v| v.parse().ok()).unwrap_or(sc::DEFAULT_PORT);
    let mut s = TcpStream::connect_timeout(&(peer, port).into(), Duration::from_secs(10))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(20))).map_err(|e| e.to_string())?;
    let nc = sc::random_nonce().map_err(|e| e.to_string())?;
    let (_, hello) = sc::Client::new(&sc::Key::new(key.clone()).map_err(|e| e.to_string())?, nc);
    s.write_all(&hello).map_err(|e| format!("HELLO: {e}"))?;
    let mut ch = [0u8; sc::CHALLENGE_LEN];
    s.read_exact(&mut ch).map_err(|e| format!("CHALLENGE: {e}"))?;
    println!("ROGUE challenged");
    let gid = match local {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    };
    let p = Params {
        qpn: 0x1234,
        psn: sc::random_psn().map_err(|e| e.to_string())?,
        gid,
        lid: 0,
        mtu: 1024,
        rds_version: 0x0401,
        path: 0,
        credits: 0,
        tos: 0,
        ack_seq: 0,
        local,
        peer,
    };
    let body = p.encode().map_err(|e| e.to_string())?;
    let len = (Kind::ClientParams.body_len() as u16).to_be_bytes();
    let mut h = sc::MAGIC.to_vec();
    h.extend_from_slice(&[sc::VERSION, Kind::ClientParams as u8, len[0], len[1]]);
    let ns = &ch[sc::HEADER_LEN..sc::HEADER_LEN + sc::NONCE_LEN];
    let tag = sc::hmac_sha256(&key, &[sc::L_CLIENT_PARAMS, &nc, ns, &h, &body]);
    let mut msg = h;
    msg.extend_from_slice(&body);
    msg.extend_from_slice(&tag);
    s.write_all(&msg).map_err(|e| format!("CLIENT_PARAMS: {e}"))?;
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => println!("ROGUE closed"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => println!("ROGUE closed"),
        Ok(_) => println!("ROGUE answered"),
        Err(e) => return Err(format!("waiting for the close: {e}")),
    }
    Ok(())
}
