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
    if args.len() < 5 || !matches!(args[0].as_str(), "send-recv" | "recv-send") {
        eprintln!("usage: rds-ib-peer send-recv|recv-send LOCAL LPORT PEER PPORT SIZE...");
        return ExitCode::from(2);
    }
    match run(&args) {
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
    let res = if a[0] == "send-recv" { send(&s).and_then(|()| recv(&s)) } else { recv(&s).and_then(|()| send(&s)) };
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
