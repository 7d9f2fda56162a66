//! `selftest`: the kernel selftest's workload, our half.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rds_sock::RecvFlags;
use sha2::{Digest, Sha256};

use crate::common::{Ctx, barrier, errno_name, info, result, sh, sock};
use crate::reconnect::kill_one_when_all_up;

const ST_TOTAL: u64 = 50_000;
const ST_KPORT: u16 = 10000;
const ST_UPORT: u16 = 20000;

/// The kernel selftest's workload, our half (see the script's sc_selftest).
pub fn sc_selftest(ctx: &Ctx) {
    let me = SocketAddr::new(ctx.me, ST_UPORT);
    let peer = SocketAddr::new(ctx.peer, ST_KPORT);
    // (payload, destination, to the kernel?)
    let mut mine: Vec<(Vec<u8>, SocketAddr, bool)> = Vec::new();
    let mut expect = [Sha256::new(), Sha256::new()]; // [from us, from the kernel]
    let mut expect_n = [0u64; 2];
    for n in 0..ST_TOTAL {
        let d = Sha256::digest(format!("packet {n}").as_bytes());
        let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
        let (from_k, to_k) = (d[0] & 1 == 0, d[1] & 1 == 0);
        if !from_k {
            mine.push((hex.clone().into_bytes(), if to_k { peer } else { me }, to_k));
        }
        if !to_k {
            let w = usize::from(from_k);
            expect[w].update(hex.as_bytes());
            expect_n[w] += 1;
        }
    }
    let s = sock(ctx, ST_UPORT, Some(1 << 20), Some(1 << 20)).expect("bind");
    s.set_nonblocking(true).unwrap();
    let nem = sh("tc qdisc replace dev eth0 root netem loss 1% corrupt 1% duplicate 1% 2>&1 && echo ok");
    info("selftest", &format!("netem loss 1% corrupt 1% duplicate 1% on eth0: {}", nem.trim()));
    let engine = s.engine().clone();
    let c0 = engine.counters();
    barrier("st-ready", 120);
    let mut got = [Sha256::new(), Sha256::new()];
    let mut got_n = [0u64; 2];
    let mut sent_k = Sha256::new();
    let mut stray = Vec::new();
    let mut idx = 0usize;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(240);
    let mut buf = vec![0u8; 4096];
    let mut next_kill = t0 + Duration::from_millis(900);
    let mut kills = 0;
    let done = |idx: usize, got_n: &[u64; 2]| idx >= mine.len() && got_n[0] >= expect_n[0] && got_n[1] >= expect_n[1];
    while !done(idx, &got_n) && Instant::now() < deadline {
        while idx < mine.len() {
            let (p, dst, to_k) = &mine[idx];
            match s.send_to(p, *dst) {
                Ok(_) => {
                    if *to_k {
                        sent_k.update(p);
                    }
                    idx += 1;
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EAGAIN | libc::ENOBUFS | libc::ECONNRESET | libc::EPIPE)
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    stray.push(format!("send: {}", errno_name(&e)));
                    idx = mine.len();
                }
            }
        }
        let mut pfd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, 10) };
        while let Ok(m) = s.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() }) {
            let Some(from) = m.from else { continue };
            let w = if from == peer {
                1
            } else if from == me {
                0
            } else {
                stray.push(format!("from {from}"));
                continue;
            };
            got[w].update(&buf[..m.len]);
            got_n[w] += 1;
        }
        // Forced reconnects: the side with the larger address kills one TCP
        // connection now and then, one at a time (as in reconnect).
        if Instant::now() >= next_kill {
            if ctx.larger() && kill_one_when_all_up(ctx, &engine).is_some() {
                kills += 1;
            }
            next_kill = Instant::now() + Duration::from_millis(900);
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let acked = s.flush(Duration::from_secs(60));
    sh("tc qdisc del dev eth0 root 2>/dev/null");
    let c1 = engine.counters();
    let d = |k: &str| {
        let get = |v: &Vec<(String, u64)>| v.iter().find(|(n, _)| n == k).map_or(0, |(_, x)| *x);
        get(&c1) - get(&c0)
    };
    info(
        "selftest",
        &format!(
            "us: sent {idx}/{}, {kills} single-connection kills, conn_reset +{}, recv_drop_old_seq +{}, {elapsed:.1} s",
            mine.len(),
            d("conn_reset"),
            d("recv_drop_old_seq")
        ),
    );
    let hex = |h: &Sha256| h.clone().finalize().iter().map(|b| format!("{b:02x}")).collect::<String>();
    println!("HASH selftest sent us->kernel {} {}", mine.iter().filter(|m| m.2).count(), hex(&sent_k));
    println!("HASH selftest recv kernel->us {} {}", got_n[1], hex(&got[1]));
    let ok = got_n[1] == expect_n[1] && hex(&got[1]) == hex(&expect[1]) && stray.is_empty();
    result(
        "selftest",
        "kernel->us",
        ok,
        &format!(
            "{}/{} messages, running sha256 {} (loss/corrupt/duplicate 1%, {kills} single-connection kills by us, {elapsed:.0} s){}",
            got_n[1],
            expect_n[1],
            if ok { "equal" } else { "DIFFERENT" },
            if stray.is_empty() { String::new() } else { format!("; {}", stray[..stray.len().min(3)].join("; ")) }
        ),
    );
    let ok_self = got_n[0] == expect_n[0] && hex(&got[0]) == hex(&expect[0]);
    info(
        "selftest",
        &format!("us->us pair: {}/{} {}", got_n[0], expect_n[0], if ok_self { "equal" } else { "DIFFERENT" }),
    );
    result(
        "selftest",
        "us->kernel",
        idx == mine.len() && acked,
        &format!("we sent {idx}/{} of our messages{}", mine.len(), if acked { "" } else { ", NOT all acked" }),
    );
    barrier("st-done", 300);
}
