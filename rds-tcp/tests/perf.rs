//! Rough throughput and latency numbers over loopback (ignored by default;
//! run with `cargo test -p rds-tcp --release --test perf -- --ignored --nocapture`).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Host, ip};
use rds_core::{Payload, RdsTransport};

fn run_stream(a_ip: &str, b_ip: &str, port: u16, size: usize, secs: f64, plain: bool) {
    let a = Host::new(ip(a_ip), port, 1);
    let b = Host::new(ip(b_ip), port, 2);
    let d = Instant::now() + Duration::from_secs(15);
    let sa = if plain { a.plain_socket(5000) } else { a.socket(5000) };
    let sb = b.socket(4000);
    let to = SocketAddr::new(b.addr, 4000);
    // Warm up: connection and handshake.
    a.send(sa, to, &Payload::copy_from(b"warm"), d);
    b.recv(sb, d);
    let payload = Payload::new(vec![7u8; size]);
    let a2 = a.clone();
    let stop_at = Instant::now() + Duration::from_secs_f64(secs);
    let tx = std::thread::spawn(move || {
        let mut n = 0u64;
        while Instant::now() < stop_at {
            for _ in 0..64 {
                a2.send(sa, to, &payload, d);
                n += 1;
            }
        }
        // End marker: the only 3-byte message.
        a2.send(sa, to, &Payload::copy_from(b"END"), d);
        n
    });
    let start = Instant::now();
    let mut got = 0u64;
    let mut bytes = 0u64;
    loop {
        let inc = b.recv(sb, d);
        if inc.payload.len() == 3 {
            break;
        }
        got += 1;
        bytes += inc.payload.len() as u64;
    }
    assert_eq!(got, tx.join().unwrap());
    let el = start.elapsed().as_secs_f64();
    eprintln!(
        "size {size:>7} {}: {got} msgs in {el:.2} s = {:.0} msg/s, {:.1} MB/s; tcp counters {:?}",
        if plain { "default sndbuf" } else { "sndbuf 8 MiB  " },
        got as f64 / el,
        bytes as f64 / el / 1e6,
        a.tcp.counters()
    );
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore]
fn throughput() {
    run_stream("127.0.30.1", "127.0.30.2", 17201, 64, 2.0, false);
    run_stream("127.0.31.1", "127.0.31.2", 17202, 1024, 2.0, false);
    run_stream("127.0.32.1", "127.0.32.2", 17203, 64 << 10, 2.0, false);
    run_stream("127.0.33.1", "127.0.33.2", 17204, 1 << 20, 2.0, false);
    // The default send buffer (212992, half usable) keeps few messages in
    // flight: ack latency shows here.
    run_stream("127.0.35.1", "127.0.35.2", 17206, 1024, 2.0, true);
    run_stream("127.0.36.1", "127.0.36.2", 17207, 64 << 10, 2.0, true);
}

#[test]
#[ignore]
fn ping_pong_latency() {
    let a = Host::new(ip("127.0.34.1"), 17205, 1);
    let b = Host::new(ip("127.0.34.2"), 17205, 2);
    let d = Instant::now() + Duration::from_secs(60);
    let sa = a.socket(5000);
    let sb = b.socket(4000);
    let (to_b, to_a) = (SocketAddr::new(b.addr, 4000), SocketAddr::new(a.addr, 5000));
    let b2 = b.clone();
    let echo = std::thread::spawn(move || {
        for _ in 0..5001 {
            let inc = b2.recv(sb, d);
            b2.send(sb, to_a, &inc.payload, d);
        }
    });
    let p = Payload::new(vec![1u8; 64]);
    a.send(sa, to_b, &p, d);
    a.recv(sa, d);
    let start = Instant::now();
    for _ in 0..5000 {
        a.send(sa, to_b, &p, d);
        a.recv(sa, d);
    }
    let el = start.elapsed();
    echo.join().unwrap();
    eprintln!("64-byte ping-pong: {:.1} us per round trip", el.as_secs_f64() * 1e6 / 5000.0);
    a.shutdown();
    b.shutdown();
}

#[test]
#[ignore]
fn default_sndbuf_64k() {
    run_stream("127.0.37.1", "127.0.37.2", 17208, 64 << 10, 1.0, true);
}
