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
//! rds-ib-peer send-unacked LOCAL LPORT PEER PPORT SIZE...
//!     sends as above and waits FLUSH_S seconds (default 15) for the acks:
//!     `ACKED n` or `UNACKED`, ok either way.
//! rds-ib-peer rogue LOCAL LPORT PEER PPORT
//!     a verbs-only side channel client without the key: HELLO, then a
//!     well-formed CLIENT_PARAMS whose MAC is made with the key file
//!     RDS_IB_PSK_FILE (a wrong one) to PEER:RDS_IB_SIDE_PORT (18635);
//!     prints `ROGUE closed` when the peer closes the connection without a
//!     frame, `ROGUE answered` if it answers.
//! ```
//!
//! Env: `GAP_MS` sleeps that long between sends; `PAUSE_AT=k` runs
//! `barrier pause-k 120` before sending message k (a test cuts the link
//! meanwhile). Output: `BOUND`, `TX k len n`, `ACKED`, `RX k len n from
//! A:P ok|BAD`, counters (`CTR name value`), then `RESULT ok|FAIL ...`.

use std::net::SocketAddr;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use rds_sock::{Engine, TransportKind};

fn pattern(k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i + k) % 251) as u8).collect()
}

fn barrier(name: &str, secs: u32) -> Result<(), String> {
    let st = Command::new("barrier").arg(name).arg(secs.to_string()).status().map_err(|e| format!("barrier {name}: {e}"))?;
    if st.success() { Ok(()) } else { Err(format!("barrier {name} failed")) }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 5 || !matches!(args[0].as_str(), "send-recv" | "recv-send" | "recv-none" | "send-unacked" | "rogue") {
        eprintln!("usage: rds-ib-peer send-recv|recv-send|recv-none|send-unacked|rogue LOCAL LPORT PEER PPORT SIZE...");
        return ExitCode::from(2);
    }
    let res = if args[0] == "rogue" { rogue(&args) } else { run(&args) };
    match res {
        Ok(()) => {
            println!("RESULT ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("RESULT FAIL {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: &[String]) -> Result<(), String> {
    let local: SocketAddr = format!("{}:{}", a[1], a[2]).parse().map_err(|e| format!("local: {e}"))?;
    let peer: SocketAddr = format!("{}:{}", a[3], a[4]).parse().map_err(|e| format!("peer: {e}"))?;
    let sizes: Vec<usize> = a[5..].iter().map(|s| s.parse().map_err(|_| format!("bad size {s}"))).collect::<Result<_, _>>()?;
    let gap = std::env::var("GAP_MS").ok().and_then(|v| v.parse().ok()).map(Duration::from_millis);
    let pause_at: Option<usize> = std::env::var("PAUSE_AT").ok().and_then(|v| v.parse().ok());
    let env_secs = |name: &str, dflt: u64| Duration::from_secs(std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(dflt));
    let engine = Engine::global().map_err(|e| format!("engine: {e}"))?;
    let s = engine.socket().map_err(|e| format!("socket: {e}"))?;
    s.set_transport(TransportKind::Ib).map_err(|e| format!("SO_RDS_TRANSPORT=IB: {e}"))?;
    s.set_send_buffer_size_force(8 << 20).map_err(|e| e.to_string())?;
    s.set_recv_buffer_size_force(8 << 20).map_err(|e| e.to_string())?;
    s.bind(local).map_err(|e| format!("bind {local}: {e}"))?;
    println!("BOUND {local} transport {}", s.transport_raw().map_err(|e| e.to_string())?);
    if let Ok(b) = std::env::var("BARRIER") {
        barrier(&b, 60)?;
    }
    let send = |s: &rds_sock::RdsSocket| -> Result<(), String> {
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
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOBUFS) | Some(libc::EAGAIN)) && Instant::now() < deadline => {
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
        _ => send_unacked(&s),
    };
    for (name, v) in engine.counters() {
        if name.starts_with("ib_") || name.contains("conn_reset") || name.contains("retrans") {
            println!("CTR {name} {v}");
        }
    }
    // Let the peer's last acks and our own go out before the process ends.
    let rep = engine.shutdown(Duration::from_secs(5));
    println!("UNSENT {}", rep.messages());
    res
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
    let port = std::env::var(rds_ib::transport::ENV_SIDE_PORT).ok().and_then(|v| v.parse().ok()).unwrap_or(sc::DEFAULT_PORT);
    let mut s = TcpStream::connect_timeout(&(peer, port).into(), Duration::from_secs(10)).map_err(|e| format!("connect: {e}"))?;
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
