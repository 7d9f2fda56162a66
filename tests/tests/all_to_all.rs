//! Three nodes (three engines on 127.x.y.1-3, real TCP between them), three
//! sockets each, all-to-all: 100,000 datagrams of random sizes from 0 B to
//! 1 MiB. Every datagram must arrive exactly once, with exact content, in
//! order per (source socket, destination socket) flow.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rds_tests::*;

const NODES: usize = 3;
const PER_NODE: usize = 3;
const SOCKS: usize = NODES * PER_NODE;
const TOTAL: usize = 100_000;
const MAX: usize = 1 << 20;

#[test]
fn three_nodes_all_to_all_100k() {
    let ip = addr_block(41);
    let engines: Vec<_> = (0..NODES).map(|_| engine()).collect();
    let (socks, addrs) = mesh(&engines, ip, PER_NODE, 4001, set_up_for_1mib);
    let index_of: HashMap<SocketAddr, usize> = addrs.iter().enumerate().map(|(i, a)| (*a, i)).collect();

    // The plan: socket i sends its messages round-robin to every other
    // socket, so every socket knows how many it gets from each source.
    let per_sock = TOTAL.div_ceil(SOCKS);
    let plan = |src: usize, k: usize| all_to_all_plan(SOCKS, src, k);
    let expect = all_to_all_counts(SOCKS, per_sock); // [dst][src]

    let start = Instant::now();
    let mut threads = Vec::new();
    for (src, s) in socks.iter().enumerate() {
        let s = s.clone();
        let addrs = addrs.clone();
        threads.push(std::thread::spawn(move || -> Result<u64, String> {
            let mut rng = Rng::new(src as u64 + 1);
            let mut bytes = 0u64;
            for k in 0..per_sock {
                let (dst, index) = plan(src, k);
                let len = size(&mut rng, MAX);
                let p = payload((src * SOCKS + dst) as u32, index, len);
                s.send_to(&p, addrs[dst]).map_err(|e| format!("sock {src} send {k}: {e}"))?;
                bytes += len as u64;
            }
            Ok(bytes)
        }));
    }
    let mut receivers = Vec::new();
    for (dst, s) in socks.iter().enumerate() {
        let s = s.clone();
        let index_of = index_of.clone();
        let want = expect[dst].clone();
        receivers.push(std::thread::spawn(move || -> Result<(u64, u64), String> {
            let mut next = vec![0u64; SOCKS];
            let mut got = 0u64;
            let mut bytes = 0u64;
            let total: u64 = want.iter().sum();
            while got < total {
                let (p, from) = s.recv_payload().map_err(|e| format!("sock {dst} after {got}: {e}"))?;
                let src = *index_of.get(&from).ok_or_else(|| format!("unknown sender {from}"))?;
                let flow = (src * SOCKS + dst) as u32;
                if next[src] >= want[src] {
                    return Err(format!("flow {src}->{dst}: more than the {} messages sent", want[src]));
                }
                check_payload(flow, next[src], &p)?;
                next[src] += 1;
                got += 1;
                bytes += p.len() as u64;
            }
            if next != want {
                return Err(format!("sock {dst}: per-source counts {next:?}, expected {want:?}"));
            }
            Ok((got, bytes))
        }));
    }
    let mut sent_bytes = 0;
    let mut failure = None;
    for t in threads {
        match t.join().unwrap() {
            Ok(b) => sent_bytes += b,
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    if let Some(e) = failure {
        // A receiver that stopped early makes senders block: report it first.
        for (i, r) in receivers.into_iter().enumerate() {
            if r.is_finished() {
                if let Err(re) = r.join().unwrap() {
                    eprintln!("receiver {i}: {re}");
                }
            }
        }
        for (i, en) in engines.iter().enumerate() {
            eprintln!("--- engine {i}\n{}", en.with_node(|n| n.dump()));
            let set: Vec<String> =
                en.counters().into_iter().filter(|c| c.1 != 0).map(|c| format!("{}={}", c.0, c.1)).collect();
            eprintln!("counters: {}", set.join(" "));
        }
        panic!("{e}");
    }
    let mut got = 0;
    let mut got_bytes = 0;
    for t in receivers {
        let (n, b) = t.join().unwrap().unwrap();
        got += n;
        got_bytes += b;
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(got as usize, per_sock * SOCKS);
    assert!(got as usize >= TOTAL);
    assert_eq!(got_bytes, sent_bytes);
    eprintln!(
        "all-to-all: {got} datagrams, {:.1} MB in {secs:.1} s ({:.0} msg/s, {:.0} MB/s)",
        got_bytes as f64 / 1e6,
        got as f64 / secs,
        got_bytes as f64 / 1e6 / secs
    );
    // Nothing is left anywhere, and nothing arrives late.
    assert_drained(&socks, Duration::from_secs(10));
    // Each node counted every datagram addressed to it as delivered.
    let delivered: u64 = engines.iter().map(|e| counter(e, "recv_delivered")).sum();
    assert_eq!(delivered, got);
    for e in &engines {
        let r = e.shutdown(Duration::from_secs(1));
        assert_eq!(r.messages(), 0, "{r:?}");
    }
}
