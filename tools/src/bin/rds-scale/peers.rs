//! `rds-scale peers`: N peer nodes of the serving node in one process (see
//! main.rs): its idle memory per peer, and its aggregate throughput with
//! one active peer against N.
//!
//! The peers share one engine (one reactor thread), each with its own
//! socket bound to its own address: the serving node sees N peer nodes
//! either way (N addresses, an RDS connection and its paths each), and on
//! the 2-core machine the load generator then takes one reactor's share of
//! the cores it shares with the serving node, not N engines' reactor and
//! timer threads (`--engine-per-peer`, the earlier harness: 512 threads for
//! 256 peers; alternating the two on the same machine, 2026-11-28, 2 runs
//! of 2 rounds each, the 256-peer rounds reached 0.44-0.82x one peer with
//! an engine each and 0.69-0.94x with the shared one).

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rds_sock::{Engine, EngineConfig, RdsSocket};

use crate::{QUIT, Stat, addr_of, ask, data, fail, num_of, request, secs_of, stat_u64, usage};

/// The `i`th address from `base` on, skipping those ending in .0 or .255.
pub fn nth_addr(base: Ipv4Addr, i: usize) -> Ipv4Addr {
    let mut a = u32::from(base);
    let mut left = i;
    loop {
        let last = a & 0xff;
        if last != 0 && last != 255 {
            if left == 0 {
                return Ipv4Addr::from(a);
            }
            left -= 1;
        }
        a += 1;
    }
}

/// A peer node: its engine (`None`: it uses the shared one), its one
/// socket, and the next sequence number of its flow to the serving node.
struct Peer {
    engine: Option<Engine>,
    sock: RdsSocket,
    seq: u64,
}

fn engine(npaths: u8) -> Engine {
    let mut cfg = EngineConfig::default();
    cfg.tcp.threads = 1;
    cfg.node.npaths = npaths;
    // No rds-info socket (and thread) per peer.
    cfg.info_dir = None;
    Engine::new(cfg).unwrap_or_else(|e| fail(&format!("engine: {e}")))
}

/// A peer at `at`: a socket of `shared`, or of an engine of its own.
fn peer(npaths: u8, at: SocketAddr, shared: Option<&Engine>) -> Peer {
    let own = shared.is_none().then(|| engine(npaths));
    let e = shared.or(own.as_ref()).expect("one of the two");
    let sock = e.socket().unwrap_or_else(|e| fail(&format!("socket: {e}")));
    sock.set_send_buffer_size_force(4 << 20).unwrap_or_else(|e| fail(&format!("SO_SNDBUF: {e}")));
    sock.bind(at).unwrap_or_else(|e| fail(&rds_tools::bind_error(at, &e)));
    Peer { engine: own, sock, seq: 0 }
}

pub fn run(args: &rds_tools::Args) -> bool {
    let server = addr_of(args, "d");
    let n = num_of(args, "peers", 256).clamp(1, 4096) as usize;
    let ip = |o: &str, d: &str| -> Ipv4Addr {
        args.get(o).unwrap_or(d).parse().unwrap_or_else(|_| usage(&format!("bad --{o} address")))
    };
    let (from, control) = (ip("from", "127.0.1.1"), ip("control", "127.0.0.3"));
    let port = num_of(args, "p", 5000) as u16;
    let npaths = num_of(args, "npaths", 8).clamp(1, 8) as u8;
    let size = num_of(args, "m", 8 << 10).clamp(9, 1 << 20) as usize;
    let total = num_of(args, "l", 1 << 30);
    let rounds = num_of(args, "rounds", 2).clamp(1, 20);
    // Messages to one peer before turning to the next: the peers share one
    // sending thread here, and switching engines every few messages would
    // charge that thread's switching to the serving node's figure.
    let burst = num_of(args, "burst", 64).max(1);
    let settle = secs_of(args, "settle", 2.0);
    let shared = (!args.has("engine-per-peer")).then(|| engine(npaths));

    // The control node: connected before the baseline, so that what the
    // serving node allocates once (its first connection) is not charged
    // to the peers.
    let ctl_engine = engine(npaths);
    let ctl = ctl_engine.socket().unwrap_or_else(|e| fail(&format!("socket: {e}")));
    let ctl_at = SocketAddr::new(IpAddr::V4(control), port);
    ctl.bind(ctl_at).unwrap_or_else(|e| fail(&rds_tools::bind_error(ctl_at, &e)));
    let get = |what: &str| -> Stat { ask(&ctl, server).unwrap_or_else(|e| fail(&format!("stat ({what}): {e}"))) };
    get("warm-up");
    std::thread::sleep(settle);
    let before = get("before");

    // N peers, each sends one message; all acknowledged; then idle.
    let t0 = Instant::now();
    let mut peers: Vec<Peer> =
        (0..n).map(|i| peer(npaths, SocketAddr::new(IpAddr::V4(nth_addr(from, i)), port), shared.as_ref())).collect();
    let mut buf = vec![0u8; size];
    for p in &mut peers {
        data(&mut buf, p.seq);
        p.sock.send_to(&buf[..9], server).unwrap_or_else(|e| fail(&format!("send: {e}")));
        p.seq += 1;
    }
    for p in &peers {
        if !p.sock.flush(Duration::from_secs(60)) {
            fail("a peer's first message was not acknowledged within 60 s");
        }
    }
    let setup = t0.elapsed();
    std::thread::sleep(settle);
    let idle = get("idle");
    let kb = |s: &Stat, k: &str| stat_u64(s, k) as f64;
    let per_peer = |k: &str| (kb(&idle, k) - kb(&before, k)) / n as f64;
    println!("R scale_peers {n}");
    println!("R scale_npaths {npaths}");
    println!("R scale_peer_engines {}", if shared.is_some() { 1 } else { n });
    println!("R scale_setup {:.2} s", setup.as_secs_f64());
    println!("R scale_flows {}", stat_u64(&idle, "flows"));
    println!("R scale_server_threads_before {}", stat_u64(&before, "threads"));
    println!("R scale_server_threads {}", stat_u64(&idle, "threads"));
    println!("R scale_server_tcp_conns {}", stat_u64(&idle, "tcp_conns"));
    println!("R scale_server_conns {}", stat_u64(&idle, "conns"));
    println!("R scale_server_paths_up {}", stat_u64(&idle, "paths_up"));
    println!("R scale_rss_before {} kB", stat_u64(&before, "rss_kb"));
    println!("R scale_rss_idle {} kB", stat_u64(&idle, "rss_kb"));
    println!("R scale_pss_before {} kB", stat_u64(&before, "pss_kb"));
    println!("R scale_pss_idle {} kB", stat_u64(&idle, "pss_kb"));
    println!("R scale_rss_per_peer {:.1} KiB", per_peer("rss_kb"));
    println!("R scale_pss_per_peer {:.1} KiB", per_peer("pss_kb"));

    // Throughput: one active peer, then all, `rounds` times, after a
    // warm-up of each (a quarter of the volume, not reported: the first
    // bulk transfer on a connection is slower).
    let mut sent = n as u64;
    // Before each transfer the serving node has taken every message sent
    // so far: a flush ends when its TCP acked them, while its receiving
    // threads may still be reading a burst's backlog (its sockets hold
    // 16 MiB), which the next transfer measured as its own slowness.
    // The same wait ends the run (the serving node's final count), within
    // 20 s either way; returns the last answer.
    let settled = |sent: u64| {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = get("drain");
        while stat_u64(&last, "msgs") < sent && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            last = get("drain");
        }
        last
    };
    for active in [1, n] {
        settled(sent);
        sent += blast(&mut peers[..active], server, size, total / 4, burst, &mut buf).msgs;
    }
    // Each round measures both, in turns (one peer first in the even
    // rounds, all first in the odd ones), so that neither side of a
    // round's ratio always runs in the other's wake.
    for r in 0..rounds {
        let order = if r % 2 == 0 { [1, n] } else { [n, 1] };
        for active in order {
            let k = if active == 1 { "1" } else { "n" };
            settled(sent);
            let st0 = get("round");
            let srv0 = stat_u64(&st0, "cpu_ms");
            let (me0, th0) = (crate::proc::process_cpu_ms(), crate::proc::thread_cpu_ms());
            let coalesced0 = coalesced(&peers[..active], shared.as_ref());
            let round = blast(&mut peers[..active], server, size, total, burst, &mut buf);
            let (me1, th1) = (crate::proc::process_cpu_ms(), crate::proc::thread_cpu_ms());
            let coalesced1 = coalesced(&peers[..active], shared.as_ref());
            let st1 = get("round");
            let srv1 = stat_u64(&st1, "cpu_ms");
            sent += round.msgs;
            let pct = |a: u64, b: u64| b.saturating_sub(a) as f64 * 100.0 / round.wall_ms.max(1) as f64;
            println!("R scale_bw_{k} {:.1} MB/sec", round.mbps);
            // CPU of the serving node and of the peers' process over the
            // round, in percent of one core.
            println!("R scale_bw_{k}_server_cpu {:.0} %", pct(srv0, srv1));
            println!("R scale_bw_{k}_peers_cpu {:.0} %", pct(me0, me1));
            // The sending thread (this one), which sends for every peer:
            // its CPU over the round and how long it waited for a socket
            // to take more (every active peer's send buffer full).
            println!("R scale_bw_{k}_sender_cpu {:.0} %", pct(th0, th1));
            println!("R scale_bw_{k}_sender_waited {} ms", round.waited_ms);
            // Its CPU time per message, and the share of the sends that
            // left their message to a batched write (`tcp_tx_coalesced`
            // of the active peers' engines): what a message cost it.
            let per_msg = |x: u64| x as f64 / round.msgs.max(1) as f64;
            println!("R scale_bw_{k}_sender_us_per_msg {:.2} us", per_msg(th1.saturating_sub(th0) * 1000));
            println!("R scale_bw_{k}_coalesced {:.0} %", 100.0 * per_msg(coalesced1.saturating_sub(coalesced0)));
            // The serving node's one node lock, every peer's messages
            // through it, between the round's two stat answers.
            crate::print_lock(
                &format!("scale_bw_{k}_server"),
                crate::stat_lock(&st0),
                crate::stat_lock(&st1),
                round.wall_ms,
            );
            eprintln!("rds-scale: round {}: {active} active peer(s): {:.1} MB/s", r + 1, round.mbps);
        }
    }
    println!("R scale_msg_size {size}");
    println!("R scale_burst {burst}");
    println!("R scale_total {total}");
    // Every message arrived once, in order: the serving node's count.
    let last = settled(sent);
    let (got, dups, gaps) = (stat_u64(&last, "msgs"), stat_u64(&last, "dups"), stat_u64(&last, "gaps"));
    println!("R scale_msgs_sent {sent}");
    println!("R scale_msgs_received {got}");
    println!("R scale_dups {dups}");
    println!("R scale_gaps {gaps}");
    if args.has("quit") {
        let _ = request(&ctl, server, QUIT);
    }
    for e in peers.iter().filter_map(|p| p.engine.as_ref()).chain(shared.as_ref()) {
        e.shutdown(Duration::from_millis(100));
    }
    ctl_engine.shutdown(Duration::from_millis(100));
    got == sent && dups == 0 && gaps == 0
}

/// Sends of `peers` left queued for a batched write so far (the engines'
/// `tcp_tx_coalesced`: their own, or the `shared` one's, which only the
/// active peers send on during a round).
fn coalesced(peers: &[Peer], shared: Option<&Engine>) -> u64 {
    let of = |e: &Engine| e.counters().into_iter().find(|(k, _)| k == "tcp_tx_coalesced").map_or(0, |(_, v)| v);
    match shared {
        Some(e) => of(e),
        None => peers.iter().filter_map(|p| p.engine.as_ref()).map(of).sum(),
    }
}

/// Every peer of `peers` sends its share of `total` bytes in `size`
/// messages to `server`, from this thread, round robin without blocking,
/// up to `burst_max` messages to one peer before the next (poll when every
/// socket is full); returns what it measured ([`Blast`]).
fn blast(peers: &mut [Peer], server: SocketAddr, size: usize, total: u64, burst_max: u64, buf: &mut [u8]) -> Blast {
    let per = (total / peers.len() as u64).div_ceil(size as u64).max(1);
    let mut left: Vec<u64> = vec![per; peers.len()];
    for p in peers.iter() {
        p.sock.set_nonblocking(true).unwrap();
    }
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(120);
    let mut remaining = per * peers.len() as u64;
    let mut waited = Duration::ZERO;
    while remaining > 0 {
        if Instant::now() > deadline {
            fail("a throughput round took over 120 s");
        }
        let mut progressed = false;
        for (p, l) in peers.iter_mut().zip(left.iter_mut()) {
            let mut burst = 0;
            while *l > 0 && burst < burst_max {
                data(buf, p.seq);
                match p.sock.send_to(&buf[..size], server) {
                    Ok(_) => {
                        p.seq += 1;
                        *l -= 1;
                        remaining -= 1;
                        burst += 1;
                        progressed = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) => break,
                    Err(e) => fail(&format!("send: {e}")),
                }
            }
        }
        if !progressed {
            let t = Instant::now();
            wait_writable(peers, &left);
            waited += t.elapsed();
        }
    }
    for p in peers.iter() {
        if !p.sock.flush(Duration::from_secs(60)) {
            fail("not everything was acknowledged within 60 s");
        }
        p.sock.set_nonblocking(false).unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    let msgs = per * peers.len() as u64;
    Blast {
        mbps: msgs as f64 * size as f64 / secs / 1e6,
        msgs,
        wall_ms: (secs * 1e3) as u64,
        waited_ms: waited.as_millis() as u64,
    }
}

/// What one [`blast`] measured.
struct Blast {
    /// Throughput, the whole transfer timed until everything was
    /// acknowledged.
    mbps: f64,
    msgs: u64,
    wall_ms: u64,
    /// Time the sending thread spent waiting for room (in `poll`).
    waited_ms: u64,
}

/// Waits (at most 10 ms) until a socket with messages left is writable.
fn wait_writable(peers: &[Peer], left: &[u64]) {
    let mut fds: Vec<libc::pollfd> = peers
        .iter()
        .zip(left)
        .filter(|(_, l)| **l > 0)
        .map(|(p, _)| libc::pollfd { fd: p.sock.as_raw_fd(), events: libc::POLLOUT, revents: 0 })
        .collect();
    // SAFETY: fds is a valid array of fds.len() pollfd structs that poll
    // may write revents into; it outlives the call.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 10) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_skip_network_and_broadcast_octets() {
        let b = Ipv4Addr::new(127, 0, 1, 1);
        assert_eq!(nth_addr(b, 0), Ipv4Addr::new(127, 0, 1, 1));
        assert_eq!(nth_addr(b, 253), Ipv4Addr::new(127, 0, 1, 254));
        assert_eq!(nth_addr(b, 254), Ipv4Addr::new(127, 0, 2, 1));
        assert_eq!(nth_addr(b, 255), Ipv4Addr::new(127, 0, 2, 2));
        let all: std::collections::HashSet<_> = (0..600).map(|i| nth_addr(b, i)).collect();
        assert_eq!(all.len(), 600);
        assert!(all.iter().all(|a| a.octets()[3] != 0 && a.octets()[3] != 255));
    }
}
