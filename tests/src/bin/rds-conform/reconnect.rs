//! `reconnect` and `resetall`: both sides stream on 8 flows while our TCP
//! connections are killed, one at a time or all at once; nothing may be
//! lost or duplicated (resetall: counted, as a 6.1 peer cannot avoid it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Ctx, barrier, errno_name, flush_all, info, result, sh, socks};
use crate::flows::{FlowChecker, end_msg, flow_id, payload, receive_all};

fn rc_size(_: u32, i: u64) -> usize {
    [64, 1000, 4096, 300, 2000][(i % 5) as usize]
}

/// Kills all our TCP connections to the peer (resetall).
fn kill_all_ours(ctx: &Ctx) -> String {
    let n = sh(&format!("ss -tnH state established '( sport = :16385 or dport = :16385 )' dst {}", ctx.peer))
        .lines()
        .count();
    if n == 0 {
        return "no connection".into();
    }
    sh(&format!("ss -K dst {} '( sport = :16385 or dport = :16385 )' >/dev/null", ctx.peer));
    format!("ss -K all ({n})")
}

/// Kills one of our 8 TCP connections to the peer, but only while all 8
/// are up (seen twice, 0.5 s apart): a kill while another path is still
/// reconnecting leaves two slots free, and a 6.1 kernel's lowest-free-slot
/// accept can then swap two paths (what resetall does on purpose). The
/// connections come from the engine, not from `ss`, which takes seconds to
/// start in a guest busy with the stream. None when it did not kill.
pub fn kill_one_when_all_up(ctx: &Ctx, engine: &rds_sock::Engine) -> Option<String> {
    let up = || {
        let mut c: Vec<(SocketAddr, SocketAddr)> = engine
            .tcp_connections()
            .into_iter()
            .filter_map(|r| match (r.path, r.local, r.peer) {
                (Some(_), Some(l), Some(p)) if p.ip() == ctx.peer => Some((l, p)),
                _ => None,
            })
            .collect();
        c.sort();
        c
    };
    if up().len() < 8 {
        return None;
    }
    std::thread::sleep(Duration::from_millis(500));
    let c = up();
    if c.len() < 8 {
        return None;
    }
    let (l, p) = c[c.len() / 2];
    sh(&format!("ss -K dst {} '( sport = :{} and dport = :{} )' >/dev/null", ctx.peer, l.port(), p.port()));
    Some(format!("ss -K {l}<->{p}"))
}

/// Which of our TCP connections the stream scenario kills every 2 s.
#[derive(Clone, Copy, PartialEq)]
pub enum Kill {
    /// One connection (one path): every message exactly once and in order.
    One,
    /// All of them at once: against a 6.1 kernel, paths may change
    /// sequence spaces, so losses and duplicates are counted, not failed.
    All,
}

/// Both sides stream on 8 flows for `secs` while connections are killed;
/// every sender ends its flow with END(count).
pub fn stream_scenario(ctx: &Ctx, name: &str, ours: &[u16], kernel: &[u16], secs: f64, kill: Kill) {
    let ss = socks(ctx, ours, 1 << 20);
    let flows: Vec<u32> = kernel.iter().zip(ours).map(|(a, b)| flow_id(*a, *b)).collect();
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, rc_size)));
    let engine = ss[0].engine().clone();
    let c0 = engine.counters();
    barrier(&format!("{name}-ready"), 120);
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let total = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for (s, d) in ss.iter().zip(kernel.iter().copied()) {
        let (s, errors, peer, stop, total) = (s.clone(), errors.clone(), ctx.peer, stop.clone(), total.clone());
        senders.push(std::thread::spawn(move || {
            s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
            let sport = s.local_addr().unwrap().port();
            let f = flow_id(sport, d);
            let dst = SocketAddr::new(peer, d);
            let mut i = 0u64;
            while !stop.load(SeqCst) {
                if let Err(e) = s.send_to(&payload(f, i, rc_size(f, i)), dst) {
                    errors.lock().unwrap().push(format!("send {sport} #{i}: {}", errno_name(&e)));
                    return;
                }
                i += 1;
                // Paced like the kernel side (about 100 messages/s per flow).
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Err(e) = s.send_to(&end_msg(i), dst) {
                errors.lock().unwrap().push(format!("send END {sport}: {}", errno_name(&e)));
            }
            total.fetch_add(i, SeqCst);
        }));
    }
    if std::env::var_os("CONFORM_TRACE").is_some() {
        // Which TCP connection (local port) served which of our paths.
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::HashSet::new();
            let t0 = Instant::now();
            while !stop.load(SeqCst) {
                for r in engine.tcp_connections() {
                    if let (Some(p), Some(l)) = (r.path, r.local) {
                        if seen.insert((p.index, l.port())) {
                            println!("TRACE {:.2}s path {} {}", t0.elapsed().as_secs_f64(), p.index, l.port());
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
    }
    let kills = Arc::new(Mutex::new(Vec::new()));
    // Single kills come from the side with the larger address only, one at
    // a time (see `kill_one_when_all_up`): kills from both sides at once
    // could leave two of a 6.1 kernel's slots free, and `ss` takes seconds
    // in a loaded guest, so timing cannot keep them apart.
    let kills_here = kill == Kill::All || ctx.larger();
    let killer = {
        let (stop, kills, peer, me, engine) = (stop.clone(), kills.clone(), ctx.peer, ctx.me, engine.clone());
        std::thread::spawn(move || {
            let t0 = Instant::now();
            let ctx = Ctx { me, peer };
            std::thread::sleep(Duration::from_millis(1500));
            while kills_here && t0.elapsed().as_secs_f64() < secs - 0.5 {
                let t = t0.elapsed().as_secs_f64();
                let what = match kill {
                    Kill::All => Some(kill_all_ours(&ctx)),
                    Kill::One => kill_one_when_all_up(&ctx, &engine),
                };
                if let Some(what) = what {
                    kills.lock().unwrap().push(format!("{t:.1}s..{:.1}s {what}", t0.elapsed().as_secs_f64()));
                }
                std::thread::sleep(Duration::from_secs(2));
            }
            while t0.elapsed().as_secs_f64() < secs {
                std::thread::sleep(Duration::from_millis(100));
            }
            stop.store(true, SeqCst);
        })
    };
    let f2 = flows.clone();
    receive_all(&ss, &checker, move |c| c.ended(&f2), Instant::now() + Duration::from_secs_f64(secs + 120.0));
    let _ = killer.join();
    for t in senders {
        let _ = t.join();
    }
    let acked = flush_all(&ss, 60);
    let c1 = engine.counters();
    let d = |k: &str| {
        let get = |v: &Vec<(String, u64)>| v.iter().find(|(n, _)| n == k).map_or(0, |(_, x)| *x);
        get(&c1) - get(&c0)
    };
    info(name, &format!("our kills: {}", kills.lock().unwrap().join(", ")));
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict_gaps(&flows, None, kill == Kill::All);
    println!("GAPS {name} kernel->us {} {}", c.lost, c.dup);
    result(
        name,
        "kernel->us",
        ok,
        &format!(
            "{} messages on 8 flows {} (lost {}, duplicated {}); our conn_reset +{}, recv_drop_old_seq +{}, mprds_confirm_drop +{}, tcp_reset_untaken +{}{}",
            c.count,
            if kill == Kill::All { "exact and in order" } else { "exact, in order, no loss or duplicate" },
            c.lost,
            c.dup,
            d("conn_reset"),
            d("recv_drop_old_seq"),
            d("mprds_confirm_drop"),
            d("tcp_reset_untaken"),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    let errors = errors.lock().unwrap();
    // The side that kills must have killed something, or the scenario
    // tested nothing.
    let unkilled = kills_here && kills.lock().unwrap().is_empty();
    result(
        name,
        "us->kernel",
        errors.is_empty() && acked && !unkilled,
        &format!(
            "we sent {} messages + END on 8 flows{}; our mprds_confirm_probe +{}, mprds_confirm_withheld +{}{}{}",
            total.load(SeqCst),
            if acked { "" } else { "; NOT all acked" },
            d("mprds_confirm_probe"),
            d("mprds_confirm_withheld"),
            if errors.is_empty() { String::new() } else { format!("; {}", errors.join("; ")) },
            if unkilled { "; we killed no connection" } else { "" }
        ),
    );
    barrier(&format!("{name}-done"), 180);
}
