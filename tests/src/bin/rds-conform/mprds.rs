//! `mprds`: the multipath handshake, then 8 flows each way over the paths
//! it set up (the kernel's ports one per 6.1 lane: [`lane_ports`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rds_core::{PathState, TransportKind};

use crate::common::{BIG, Ctx, barrier, errno_name, flush_all, info, result, socks};
use crate::flows::{FlowChecker, flow_id, payload, receive_all};

const MP_PER_FLOW: u64 = 150;

fn mp_size(_: u32, i: u64) -> usize {
    [100, 4096, 16384][(i % 3) as usize]
}

/// One port per 6.1 multipath lane: `jhash_1word(port, 0) & 7` = 0..7 (the
/// kernel side's ports).
pub fn lane_ports(start: u16) -> Vec<u16> {
    fn jhash_1word(a: u32) -> u32 {
        let iv = 0xdeadbeefu32.wrapping_add(4);
        let (mut a, mut b, mut c) = (a.wrapping_add(iv), iv, iv);
        c ^= b;
        c = c.wrapping_sub(b.rotate_left(14));
        a ^= c;
        a = a.wrapping_sub(c.rotate_left(11));
        b ^= a;
        b = b.wrapping_sub(a.rotate_left(25));
        c ^= b;
        c = c.wrapping_sub(b.rotate_left(16));
        a ^= c;
        a = a.wrapping_sub(c.rotate_left(4));
        b ^= a;
        b = b.wrapping_sub(a.rotate_left(14));
        c ^= b;
        c.wrapping_sub(b.rotate_left(24))
    }
    let mut found: [Option<u16>; 8] = [None; 8];
    let mut p = start;
    while found.iter().any(Option::is_none) {
        let h = (jhash_1word(u32::from(p)) & 7) as usize;
        found[h].get_or_insert(p);
        p += 1;
    }
    found.iter().map(|p| p.unwrap()).collect()
}

pub fn sc_mprds(ctx: &Ctx) {
    let ours: Vec<u16> = (0..8).map(|k| 8000 + k).collect();
    let kernel = lane_ports(9000);
    let ss = socks(ctx, &ours, BIG);
    let expect: HashMap<u32, u64> = kernel.iter().zip(&ours).map(|(a, b)| (flow_id(*a, *b), MP_PER_FLOW)).collect();
    let flows: Vec<u32> = expect.keys().copied().collect();
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, mp_size)));
    // Messages sent before the path count is known all go on path 0 (as a
    // non-blocking kernel sender's do): ping first, and wait until the
    // handshake answered and the paths are up.
    let engine = ss[0].engine().clone();
    let _ = ss[0].send_to(&[], SocketAddr::new(ctx.peer, 0));
    let (me, peer) = (ctx.me, ctx.peer);
    let t0 = Instant::now();
    let ready = loop {
        let up = engine.with_node(|n| {
            n.info_connections()
                .into_iter()
                .find(|c| c.laddr == me && c.faddr == peer && c.transport == TransportKind::Tcp)
                .map_or(
                    0,
                    |c| if c.npaths == 8 { c.paths.iter().filter(|p| p.state == PathState::Up).count() } else { 0 },
                )
        });
        if up == 8 || t0.elapsed() > Duration::from_secs(30) {
            break up;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    info("mprds", &format!("{ready}/8 paths up {:.2} s after the first ping", t0.elapsed().as_secs_f64()));
    barrier("mp-ready", 120);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut senders = Vec::new();
    for (s, d) in ss.iter().zip(kernel.clone()) {
        let (s, errors, peer) = (s.clone(), errors.clone(), ctx.peer);
        senders.push(std::thread::spawn(move || {
            let sport = s.local_addr().unwrap().port();
            let f = flow_id(sport, d);
            for i in 0..MP_PER_FLOW {
                if let Err(e) = s.send_to(&payload(f, i, mp_size(f, i)), SocketAddr::new(peer, d)) {
                    errors.lock().unwrap().push(format!("send {sport}: {}", errno_name(&e)));
                    return;
                }
            }
        }));
    }
    let e2 = expect.clone();
    receive_all(&ss, &checker, move |c| c.complete(&e2), Instant::now() + Duration::from_secs(120));
    for t in senders {
        let _ = t.join();
    }
    let acked = flush_all(&ss, 60);
    barrier("mp-sent", 120);
    // Our view of the connection: the paths, their sequence numbers, the
    // TCP connections of the transport.
    let conn = engine.with_node(|n| {
        n.info_connections().into_iter().find(|c| c.laddr == me && c.faddr == peer && c.transport == TransportKind::Tcp)
    });
    let tcp = engine.tcp_connections().into_iter().filter(|r| r.peer.is_some_and(|p| p.ip() == peer)).count();
    let (npaths, up, desc, tx_lanes, rx_lanes) = match &conn {
        Some(c) => {
            let up = c.paths.iter().filter(|p| p.state == PathState::Up).count();
            let desc: Vec<String> = c
                .paths
                .iter()
                .map(|p| format!("{}:{:?} tx {} rx {}", p.index, p.state, p.next_tx_seq, p.next_rx_seq))
                .collect();
            // Each of our 8 sockets fixed a lane of its own (its port's,
            // 8000+k: k, or the path the kernel's answer came on, when no
            // other socket held it: rds-core mprds, "Lanes"), which
            // carries its 150 messages.
            let tx = c.paths.iter().filter(|p| p.next_tx_seq > MP_PER_FLOW).count();
            let rx = c.paths.iter().filter(|p| p.next_rx_seq > 0).count();
            (c.npaths, up, desc.join(", "), tx, rx)
        }
        None => (0, 0, "no connection".into(), 0, 0),
    };
    info("mprds", &format!("our paths: npaths {npaths}; {desc}; {tcp} TCP connections"));
    result(
        "mprds",
        "both",
        npaths == 8 && up == 8 && tcp == 8,
        &format!("our node: npaths {npaths}, {up}/8 paths up, {tcp} TCP connections"),
    );
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&flows, Some(&expect));
    result(
        "mprds",
        "kernel->us",
        ok && rx_lanes == 8,
        &format!(
            "{}/{} messages on 8 flows exact and in order; {rx_lanes}/8 of our paths received{}",
            c.count,
            expect.values().sum::<u64>(),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    let errors = errors.lock().unwrap();
    result(
        "mprds",
        "us->kernel",
        errors.is_empty() && acked && tx_lanes == 8,
        &format!(
            "{tx_lanes}/8 of our paths carried > {MP_PER_FLOW} messages (a lane per socket){}{}",
            if acked { "" } else { "; NOT all acked" },
            if errors.is_empty() { String::new() } else { format!("; {}", errors.join("; ")) }
        ),
    );
    barrier("mp-done", 120);
}
