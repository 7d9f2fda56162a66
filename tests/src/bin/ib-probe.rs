//! ib-probe: exercises the verbs path of rds-ib against a kernel `rds_rdma`
//! peer (built with `cargo build --release -p rds-tests --features verbs`;
//! `tests/kernel_ib.rs` runs it in the VM rig against the kernel's
//! `rds_rdma` over Soft-RoCE).
//!
//! ```text
//! ib-probe devices
//! ib-probe active LOCAL PEER SPORT DPORT SIZE...
//!     connect to PEER:18634 from LOCAL, ping (0 bytes to port 0 from SPORT)
//!     and wait for the pong, send one message per SIZE from SPORT to DPORT
//!     (byte i of message k is (i + k) % 251), wait until the peer's h_ack
//!     covers the last one, disconnect
//! ib-probe passive LOCAL PORT SIZE...
//!     listen on LOCAL:18634, accept, and receive one message per SIZE to
//!     PORT, checking lengths and contents in order
//! ```
//!
//! Output: one line per event (`CONNECTED`, `PONG`, `SENT`, `ACKED`, `RX`,
//! `OTHER`), then `RESULT ok` or `RESULT FAIL ...`; exit status 0 only for ok.

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rds_ib::verbs::{IbConnection, Listener, Verbs, device_names};

fn pattern(k: usize, n: usize) -> Vec<u8> {
    (0..n).map(|i| ((i + k) % 251) as u8).collect()
}

fn usage() -> ExitCode {
    eprintln!("usage: ib-probe devices | active LOCAL PEER SPORT DPORT SIZE... | passive LOCAL PORT SIZE...");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        Some("devices") => devices(),
        Some("active") if args.len() >= 5 => active(&args[1..]),
        Some("passive") if args.len() >= 3 => passive(&args[1..]),
        _ => return usage(),
    };
    rds_tests::report_result(res)
}

fn parse<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("bad {what}: {s}"))
}

fn devices() -> Result<(), String> {
    let names = device_names().map_err(|e| e.to_string())?;
    println!("DEVICES {}", names.join(" "));
    if names.is_empty() { Err("no RDMA device".into()) } else { Ok(()) }
}

fn active(a: &[String]) -> Result<(), String> {
    let local: IpAddr = parse(&a[0], "address")?;
    let peer: IpAddr = parse(&a[1], "address")?;
    let sport: u16 = parse(&a[2], "port")?;
    let dport: u16 = parse(&a[3], "port")?;
    let sizes: Vec<usize> = a[4..].iter().map(|s| parse(s, "size")).collect::<Result<_, _>>()?;
    let verbs = Verbs::new();
    let t0 = Instant::now();
    let mut conn =
        IbConnection::connect(&verbs, local, peer, Duration::from_secs(20)).map_err(|e| format!("connect: {e}"))?;
    println!(
        "CONNECTED {} -> {} version {}.{} peer_credit {} pds {} in {} ms",
        conn.local(),
        conn.peer(),
        conn.version() >> 8,
        conn.version() & 0xff,
        conn.peer_credit(),
        verbs.pd_count(),
        t0.elapsed().as_millis()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let t1 = Instant::now();
    let ping_seq = conn.send(sport, 0, &[], deadline).map_err(|e| format!("ping: {e}"))?;
    loop {
        let m = conn.poll(deadline).map_err(|e| format!("waiting for pong: {e}"))?.ok_or("no pong")?;
        let h = &m.header;
        if h.sport == 0 && h.dport == sport && m.payload.is_empty() {
            println!(
                "PONG seq {} to_ping {} sport {} dport {} rtt_us {}",
                h.sequence,
                ping_seq,
                h.sport,
                h.dport,
                t1.elapsed().as_micros()
            );
            break;
        }
        println!(
            "OTHER seq {} sport {} dport {} flags {:#04x} len {}",
            h.sequence,
            h.sport,
            h.dport,
            h.flags,
            m.payload.len()
        );
    }
    let mut last = ping_seq;
    for (k, &n) in sizes.iter().enumerate() {
        let t = Instant::now();
        last = conn.send(sport, dport, &pattern(k, n), deadline).map_err(|e| format!("send {k}: {e}"))?;
        println!("SENT {k} len {n} seq {last} post_us {}", t.elapsed().as_micros());
    }
    let t2 = Instant::now();
    if !conn.wait_acked(last, deadline).map_err(|e| format!("waiting for acks: {e}"))? {
        return Err(format!("peer acked only up to {} of {last}", conn.peer_acked()));
    }
    println!("ACKED {} in {} ms", conn.peer_acked(), t2.elapsed().as_millis());
    // Everything the peer sent is acked before leaving, so nothing of this
    // connection is retransmitted on the next one.
    while let Some(m) = conn.poll(Instant::now() + Duration::from_millis(300)).map_err(|e| e.to_string())? {
        let h = &m.header;
        println!(
            "OTHER seq {} sport {} dport {} flags {:#04x} len {}",
            h.sequence,
            h.sport,
            h.dport,
            h.flags,
            m.payload.len()
        );
    }
    conn.ack_now().map_err(|e| e.to_string())?;
    let _ = conn.poll(Instant::now() + Duration::from_millis(300));
    let s = conn.stats();
    println!(
        "STATS tx_frames {} tx_messages {} tx_acks {} rx_frames {} rx_messages {} rx_acks {} rx_cong_maps {}",
        s.tx_frames, s.tx_messages, s.tx_acks, s.rx_frames, s.rx_messages, s.rx_acks, s.rx_cong_maps
    );
    conn.disconnect();
    Ok(())
}

fn passive(a: &[String]) -> Result<(), String> {
    let local: IpAddr = parse(&a[0], "address")?;
    let port: u16 = parse(&a[1], "port")?;
    let sizes: Vec<usize> = a[2..].iter().map(|s| parse(s, "size")).collect::<Result<_, _>>()?;
    let verbs = Verbs::new();
    let mut l: Listener = Listener::bind(&verbs, local).map_err(|e| format!("listen: {e}"))?;
    println!("LISTENING {local}:{}", rds_ib::verbs::RDS_IB_PORT);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut k = 0;
    while k < sizes.len() {
        let mut conn = l.accept(deadline).map_err(|e| format!("accept: {e}"))?.ok_or("no connect request")?;
        println!(
            "ACCEPTED {} -> {} proposed {}.{} version {}.{} peer_credit {} rejected {}",
            conn.peer(),
            conn.local(),
            conn.peer_proposed() >> 8,
            conn.peer_proposed() & 0xff,
            conn.version() >> 8,
            conn.version() & 0xff,
            conn.peer_credit(),
            l.rejected
        );
        while k < sizes.len() {
            let m = match conn.poll(deadline) {
                Ok(Some(m)) => m,
                Ok(None) => return Err(format!("received {k} of {} messages", sizes.len())),
                Err(e) => {
                    println!("DOWN {e}");
                    break;
                }
            };
            let h = &m.header;
            if h.dport != port {
                println!(
                    "OTHER seq {} sport {} dport {} flags {:#04x} len {}",
                    h.sequence,
                    h.sport,
                    h.dport,
                    h.flags,
                    m.payload.len()
                );
                continue;
            }
            let ok = m.payload == pattern(k, sizes[k]);
            println!(
                "RX {k} len {} seq {} sport {} {}",
                m.payload.len(),
                h.sequence,
                h.sport,
                if ok { "ok" } else { "BAD" }
            );
            if !ok {
                return Err(format!(
                    "message {k}: {} bytes, expected {} bytes of the pattern",
                    m.payload.len(),
                    sizes[k]
                ));
            }
            k += 1;
        }
        if k == sizes.len() {
            conn.ack_now().map_err(|e| e.to_string())?;
            let _ = conn.poll(Instant::now() + Duration::from_millis(500));
            let s = conn.stats();
            println!(
                "STATS tx_frames {} tx_acks {} rx_frames {} rx_messages {} rx_acks {} rx_cong_maps {}",
                s.tx_frames, s.tx_acks, s.rx_frames, s.rx_messages, s.rx_acks, s.rx_cong_maps
            );
        }
    }
    Ok(())
}
