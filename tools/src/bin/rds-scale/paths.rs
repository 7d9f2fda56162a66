//! `rds-scale paths`: one node with 8 paths (mprds) to the serving node,
//! a socket and a sending thread per path (see main.rs): messages per path
//! and CPU time per thread of both processes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rds_sock::{Engine, EngineConfig};

use crate::{QUIT, Stat, addr_of, ask, data, fail, num_of, proc, request, secs_of, stat_u64};

/// Messages per path between two `peer_path_rx` words (`a/b/c/...`).
pub fn path_deltas(before: &str, after: &str) -> Vec<u64> {
    let b: Vec<u64> = before.split('/').map(|x| x.parse().unwrap_or(0)).collect();
    after
        .split('/')
        .enumerate()
        .map(|(i, x)| x.parse::<u64>().unwrap_or(0).saturating_sub(*b.get(i).unwrap_or(&0)))
        .collect()
}

pub fn run(args: &rds_tools::Args) -> bool {
    let server = addr_of(args, "d");
    let at = addr_of(args, "s");
    let nsock = num_of(args, "sockets", 8).clamp(1, 64) as u16;
    let npaths = num_of(args, "npaths", 8).clamp(1, 8) as u8;
    let size = num_of(args, "m", 8 << 10).clamp(9, 1 << 20) as usize;
    let secs = secs_of(args, "T", 4.0);
    let mut cfg = EngineConfig::default();
    cfg.tcp.threads = num_of(args, "threads", 2).clamp(1, 64) as usize;
    cfg.node.npaths = npaths;
    cfg.info_dir = None;
    let engine = Engine::new(cfg).unwrap_or_else(|e| fail(&format!("engine: {e}")));
    let socks: Vec<_> = (0..nsock)
        .map(|i| {
            let a = SocketAddr::new(at.ip(), at.port() + i);
            let s = engine.socket().unwrap_or_else(|e| fail(&format!("socket: {e}")));
            s.set_send_buffer_size_force(4 << 20).unwrap_or_else(|e| fail(&format!("SO_SNDBUF: {e}")));
            s.bind(a).unwrap_or_else(|e| fail(&rds_tools::bind_error(a, &e)));
            s
        })
        .collect();
    let get = |what: &str| -> Stat { ask(&socks[0], server).unwrap_or_else(|e| fail(&format!("stat ({what}): {e}"))) };
    // The first exchange runs the multipath handshake; wait until the
    // serving node sees every path of ours up.
    let mut before = get("warm-up");
    let deadline = Instant::now() + Duration::from_secs(10);
    while (stat_u64(&before, "peer_npaths") != u64::from(npaths)
        || engine.connections().iter().map(|c| c.paths_up()).sum::<usize>() < usize::from(npaths))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
        before = get("warm-up");
    }
    let msgs_before = stat_u64(&before, "msgs");
    let me_before = proc::parse_tasks(&proc::tasks_word());
    let cpu_before = proc::process_cpu_ms();
    let lock_before = engine.node_lock_stats();
    let t0 = Instant::now();
    let end = t0 + secs;
    // (messages, CPU ms) of each sending thread.
    let counts: Vec<(u64, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = socks
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let to = SocketAddr::new(server.ip(), server.port() + i as u16);
                std::thread::Builder::new()
                    .name(format!("scale-tx-{i}"))
                    .spawn_scoped(sc, move || {
                        let mut buf = vec![0u8; size];
                        let mut seq = 0u64;
                        let cpu0 = proc::thread_cpu_ms();
                        while Instant::now() < end {
                            data(&mut buf, seq);
                            s.send_to(&buf, to).unwrap_or_else(|e| fail(&format!("send: {e}")));
                            seq += 1;
                        }
                        (seq, proc::thread_cpu_ms() - cpu0)
                    })
                    .unwrap_or_else(|e| fail(&format!("thread: {e}")))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or((0, 0))).collect()
    });
    for s in &socks {
        if !s.flush(Duration::from_secs(60)) {
            fail("not everything was acknowledged within 60 s");
        }
    }
    let wall_ms = t0.elapsed().as_millis() as u64;
    let lock_after = engine.node_lock_stats();
    let me_after = proc::parse_tasks(&proc::tasks_word());
    let me_pct = (proc::process_cpu_ms() - cpu_before) as f64 * 100.0 / wall_ms.max(1) as f64;
    let sent: u64 = counts.iter().map(|c| c.0).sum();
    let tx_pct: Vec<String> =
        counts.iter().map(|c| format!("{:.0}", c.1 as f64 * 100.0 / wall_ms.max(1) as f64)).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut after = get("after");
    while stat_u64(&after, "msgs") < msgs_before + sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        after = get("after");
    }
    let got = stat_u64(&after, "msgs") - msgs_before;
    let (dups, gaps) = (stat_u64(&after, "dups"), stat_u64(&after, "gaps"));
    let per_path = path_deltas(
        before.get("peer_path_rx").map_or("", String::as_str),
        after.get("peer_path_rx").map_or("", String::as_str),
    );
    // A path is used when it carried at least 1% of the messages.
    let used = per_path.iter().filter(|&&m| m > 0 && m * 100 >= sent).count();
    let (srv_words, _) = proc::cpu_between(
        &proc::parse_tasks(before.get("tasks").map_or("", String::as_str)),
        &proc::parse_tasks(after.get("tasks").map_or("", String::as_str)),
        wall_ms,
    );
    let srv_pct =
        stat_u64(&after, "cpu_ms").saturating_sub(stat_u64(&before, "cpu_ms")) as f64 * 100.0 / wall_ms.max(1) as f64;
    // The sending threads have ended: their own account.
    let (me_words, _) = proc::cpu_between(&me_before, &me_after, wall_ms);
    let k = format!("scale_mp{npaths}");
    println!("R {k}_npaths {}", stat_u64(&after, "peer_npaths"));
    println!("R {k}_tcp_conns {}", stat_u64(&after, "tcp_conns"));
    println!("R {k}_paths_used {used}");
    println!("R {k}_path_msgs {}", per_path.iter().map(u64::to_string).collect::<Vec<_>>().join("/"));
    println!("R {k}_bw {:.1} MB/sec", sent as f64 * size as f64 / (wall_ms.max(1) as f64 / 1e3) / 1e6);
    println!("R {k}_server_threads {}", stat_u64(&after, "threads"));
    println!("R {k}_server_cpu {srv_pct:.0} %");
    println!("R {k}_client_cpu {me_pct:.0} %");
    println!("R {k}_cores {:.2}", (srv_pct + me_pct) / 100.0);
    println!("R {k}_server_tasks {srv_words}");
    println!("R {k}_client_tasks {me_words}");
    println!("R {k}_client_senders {}", tx_pct.join("/"));
    // The node locks: this node's (its sending threads and reactors) over
    // the sends, the serving node's between the two stat answers.
    crate::print_lock(&format!("{k}_client"), lock_before, lock_after, wall_ms);
    crate::print_lock(&format!("{k}_server"), crate::stat_lock(&before), crate::stat_lock(&after), wall_ms);
    println!("R {k}_msgs_sent {sent}");
    println!("R {k}_msgs_received {got}");
    println!("R {k}_dups {dups}");
    println!("R {k}_gaps {gaps}");
    if args.has("quit") {
        let _ = request(&socks[0], server, QUIT);
    }
    engine.shutdown(Duration::from_millis(200));
    got == sent && dups == 0 && gaps == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_per_path() {
        assert_eq!(path_deltas("1/1/1", "11/1/5"), vec![10, 0, 4]);
        assert_eq!(path_deltas("-", "3/4"), vec![3, 4]);
    }
}
