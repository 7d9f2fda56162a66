//! Plain exchanges with the kernel: `ping` (our rds-ping at the kernel, the
//! kernel's at us), `tools` (rds-gen / rds-sink against the kernel's
//! sockets, contents hashed) and `datagrams` (0 B .. 1 MiB between 3 of our
//! sockets and 3 of the kernel's, both ways).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{BIG, Ctx, SIZES, barrier, counter, errno_name, flush_all, info, result, sock, socks};
use crate::flows::{FlowChecker, flow_id, payload, receive_all};

pub fn sc_ping(ctx: &Ctx) {
    barrier("ping-a", 120);
    // Our rds-ping tool (next to this binary) against the kernel.
    let exe = std::env::current_exe().unwrap();
    let ping = exe.with_file_name("rds-ping");
    let out = Command::new("timeout")
        .arg("30")
        .arg(&ping)
        .args(["-c", "5", "-i", "0.3", "-I", &ctx.me.to_string(), &ctx.peer.to_string()])
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            let replies = text
                .lines()
                .filter(|l| {
                    let l = l.trim();
                    l.ends_with(" usec")
                        && !l.contains("DUP")
                        && l.split(':').next().is_some_and(|n| n.trim().parse::<u32>().is_ok())
                })
                .count();
            let bad = text.lines().filter(|l| l.contains("DUP") || l.contains("ERROR")).count();
            let rtts: Vec<&str> = text.lines().filter_map(|l| l.split(':').nth(1)).map(str::trim).collect();
            result(
                "ping",
                "us->kernel",
                o.status.success() && replies == 5 && bad == 0,
                &format!(
                    "our rds-ping: {replies}/5 replies from {}:0 ({}), exit {:?}",
                    ctx.peer,
                    rtts.join(", "),
                    o.status.code()
                ),
            );
        }
        Err(e) => result("ping", "us->kernel", false, &format!("cannot run {}: {e}", ping.display())),
    }
    barrier("ping-a-done", 90);
    // The kernel pings us: our node only needs to serve the address.
    let _s = sock(ctx, 4999, None, None).expect("bind");
    barrier("ping-b", 60);
    barrier("ping-b-done", 90);
    let pings = counter("recv_ping");
    info("ping", &format!("our node answered {pings} pings (recv_ping)"));
}

const TOOLS_N: u64 = 40;

/// `rds-gen` / `rds-sink` (next to this binary) against the kernel: each
/// prints `<addr>:<port> <messages> <bytes> <sha256>`; the HASH lines let
/// the harness compare with what the kernel side received or sent.
pub fn sc_tools(ctx: &Ctx) {
    let exe = std::env::current_exe().unwrap();
    let parse = |text: &str| -> Option<(String, u64, u64, String)> {
        let l = text.lines().next()?;
        let f: Vec<&str> = l.split(' ').collect();
        if f.len() != 4 {
            return None;
        }
        Some((f[0].to_string(), f[1].parse().ok()?, f[2].parse().ok()?, f[3].to_string()))
    };
    barrier("tools-a", 120);
    let generator = exe.with_file_name("rds-gen");
    let src = format!("{}:7301", ctx.me);
    let out = Command::new("timeout")
        .arg("90")
        .arg(&generator)
        .args(["-s", &src, "-d", &format!("{}:7300", ctx.peer), "-m", "64K", "-l", &(TOOLS_N * 65536).to_string()])
        .output();
    match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            match parse(&text) {
                Some((from, n, bytes, sha)) => {
                    println!("HASH tools sent us->kernel {n} {sha}");
                    result(
                        "tools",
                        "us->kernel",
                        o.status.success() && from == src && n == TOOLS_N && bytes == TOOLS_N * 65536,
                        &format!("our rds-gen printed `{}`, exit {:?}", text.trim(), o.status.code()),
                    );
                }
                None => result(
                    "tools",
                    "us->kernel",
                    false,
                    &format!("rds-gen printed {text:?}, stderr {:?}", String::from_utf8_lossy(&o.stderr)),
                ),
            }
        }
        Err(e) => result("tools", "us->kernel", false, &format!("cannot run {}: {e}", generator.display())),
    }
    barrier("tools-a-done", 120);
    let sink = exe.with_file_name("rds-sink");
    let child = Command::new("timeout")
        .arg("90")
        .arg(&sink)
        .args(["-s", &format!("{}:7302", ctx.me), "--digest", "-l", &TOOLS_N.to_string(), "-b", "8M"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            result("tools", "kernel->us", false, &format!("cannot run {}: {e}", sink.display()));
            barrier("tools-b", 120);
            barrier("tools-b-done", 120);
            return;
        }
    };
    // rds-sink binds at once; give it a moment to start serving.
    std::thread::sleep(Duration::from_millis(500));
    barrier("tools-b", 120);
    let o = child.wait_with_output().expect("rds-sink");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let want_from = format!("{}:7303", ctx.peer);
    match parse(&text) {
        Some((from, n, _bytes, sha)) => {
            println!("HASH tools recv kernel->us {n} {sha}");
            result(
                "tools",
                "kernel->us",
                o.status.success() && from == want_from && n == TOOLS_N,
                &format!("our rds-sink printed `{}`, exit {:?}", text.trim(), o.status.code()),
            );
        }
        None => result(
            "tools",
            "kernel->us",
            false,
            &format!("rds-sink printed {text:?}, stderr {:?}", String::from_utf8_lossy(&o.stderr)),
        ),
    }
    barrier("tools-b-done", 120);
}

const DG_OURS: [u16; 3] = [5001, 5002, 5003];
const DG_KERNEL: [u16; 3] = [6001, 6002, 6003];
const DG_PER_FLOW: u64 = 10;

fn dg_size(flow: u32, i: u64) -> usize {
    SIZES[((i + u64::from(flow)) % SIZES.len() as u64) as usize]
}

pub fn sc_datagrams(ctx: &Ctx) {
    let ss = socks(ctx, &DG_OURS, BIG);
    let expect: HashMap<u32, u64> =
        DG_KERNEL.iter().flat_map(|a| DG_OURS.iter().map(move |b| (flow_id(*a, *b), DG_PER_FLOW))).collect();
    let flows: Vec<u32> = expect.keys().copied().collect();
    let checker = Arc::new(Mutex::new(FlowChecker::new(ctx.peer, dg_size)));
    barrier("dg-ready", 120);
    let t0 = Instant::now();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for s in &ss {
        let (s, errors, sent, peer) = (s.clone(), errors.clone(), sent.clone(), ctx.peer);
        senders.push(std::thread::spawn(move || {
            let sport = s.local_addr().unwrap().port();
            for i in 0..DG_PER_FLOW {
                for d in DG_KERNEL {
                    let f = flow_id(sport, d);
                    if let Err(e) = s.send_to(&payload(f, i, dg_size(f, i)), SocketAddr::new(peer, d)) {
                        errors.lock().unwrap().push(format!("send {sport}->{d} #{i}: {}", errno_name(&e)));
                        return;
                    }
                    sent.fetch_add(1, SeqCst);
                }
            }
        }));
    }
    let e2 = expect.clone();
    receive_all(&ss, &checker, move |c| c.complete(&e2), Instant::now() + Duration::from_secs(150));
    for t in senders {
        let _ = t.join();
    }
    let acked = flush_all(&ss, 60);
    let c = checker.lock().unwrap();
    let (ok, note) = c.verdict(&flows, Some(&expect));
    result(
        "datagrams",
        "kernel->us",
        ok,
        &format!(
            "{}/{} messages of 0 B..1 MiB on 9 flows (3 x 3 sockets), exact and in order in {:.1} s \
             (our sockets SO_SNDBUFFORCE/SO_RCVBUFFORCE 4 MiB){}",
            c.count,
            expect.values().sum::<u64>(),
            t0.elapsed().as_secs_f64(),
            if note.is_empty() { String::new() } else { format!("; {note}") }
        ),
    );
    let errors = errors.lock().unwrap();
    if !ok || !errors.is_empty() || !acked {
        // What our side looked like: a path that never came up, or never
        // got the kernel's sign that it took it, stops its lane.
        let conns = ss[0].engine().with_node(|n| n.info_connections());
        let paths: Vec<String> = conns
            .iter()
            .filter(|c| c.faddr == ctx.peer)
            .flat_map(|c| c.paths.iter())
            .map(|p| {
                format!(
                    "{}:{:?} tx {} rx {} sendq {} retrans {}",
                    p.index, p.state, p.next_tx_seq, p.next_rx_seq, p.send_queue, p.retrans
                )
            })
            .collect();
        let counters: Vec<String> = ["conn_reset", "cong_update_received", "mprds_probe_sent", "mprds_confirm_probe"]
            .iter()
            .map(|k| format!("{k} {}", counter(k)))
            .collect();
        info("datagrams", &format!("our paths: {}; {}", paths.join(", "), counters.join(", ")));
    }
    result(
        "datagrams",
        "us->kernel",
        errors.is_empty() && acked,
        &format!(
            "we sent {}/90, {}{}",
            sent.load(SeqCst),
            if acked { "all acked" } else { "NOT all acked" },
            if errors.is_empty() { String::new() } else { format!("; {}", errors.join("; ")) }
        ),
    );
    barrier("dg-done", 180);
}
