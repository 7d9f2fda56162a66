//! `rds-scale serve`: the serving node (see main.rs).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rds_sock::{Engine, EngineConfig, RdsSocket};

use crate::{DATA, QUIT, STAT, addr_of, fail, num_of, proc};

/// What the receiving threads counted.
#[derive(Default)]
struct Totals {
    msgs: AtomicU64,
    bytes: AtomicU64,
    /// Messages of a flow whose sequence number was already seen.
    dups: AtomicU64,
    /// Sequence numbers skipped (messages lost).
    gaps: AtomicU64,
    /// Distinct (receiving socket, source) pairs.
    flows: AtomicU64,
}

pub fn run(args: &rds_tools::Args) -> bool {
    let at = addr_of(args, "s");
    let nsock = num_of(args, "sockets", 1).clamp(1, 64) as u16;
    let mut cfg = EngineConfig::default();
    cfg.tcp.threads = num_of(args, "threads", 2).clamp(1, 64) as usize;
    cfg.node.npaths = num_of(args, "npaths", 8).clamp(1, 8) as u8;
    let limit = Duration::from_secs(num_of(args, "t", 600));
    let nofile = rds_sock::nofile_limit();
    if cfg.node.max_peers < 300 {
        eprintln!(
            "rds-scale: WARNING: {} descriptors allow {} peers (raise ulimit -n for more)",
            nofile, cfg.node.max_peers
        );
    }
    let engine = Engine::new(cfg.clone()).unwrap_or_else(|e| fail(&format!("engine: {e}")));
    let totals = Arc::new(Totals::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut socks = Vec::new();
    for i in 0..nsock {
        let a = SocketAddr::new(at.ip(), at.port() + i);
        let s = engine.socket().unwrap_or_else(|e| fail(&format!("socket: {e}")));
        s.set_recv_buffer_size_force(16 << 20).unwrap_or_else(|e| fail(&format!("SO_RCVBUF: {e}")));
        s.bind(a).unwrap_or_else(|e| fail(&rds_tools::bind_error(a, &e)));
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        socks.push(Arc::new(s));
    }
    let mut threads = Vec::new();
    for (i, s) in socks.iter().enumerate() {
        let (s, e, t, stop) = (s.clone(), engine.clone(), totals.clone(), stop.clone());
        let h = std::thread::Builder::new()
            .name(format!("scale-rx-{i}"))
            .spawn(move || receive(&s, &e, &t, &stop))
            .unwrap_or_else(|e| fail(&format!("thread: {e}")));
        threads.push(h);
    }
    eprintln!(
        "rds-scale: serving {}:{}..{} pid {} ({} reactor threads, {} paths per peer, {} threads in all)",
        at.ip(),
        at.port(),
        at.port() + nsock - 1,
        std::process::id(),
        cfg.tcp.threads,
        cfg.node.npaths,
        proc::threads()
    );
    let end = Instant::now() + limit;
    while !stop.load(Ordering::SeqCst) && Instant::now() < end && !rds_tools::STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for h in threads {
        let _ = h.join();
    }
    let line = stat_line(&engine, &totals, None);
    engine.shutdown(Duration::from_secs(1));
    println!("{line}");
    totals.dups.load(Ordering::SeqCst) == 0 && totals.gaps.load(Ordering::SeqCst) == 0
}

/// One receiving socket's loop until `stop`.
fn receive(s: &RdsSocket, engine: &Engine, t: &Totals, stop: &AtomicBool) {
    let mut buf = vec![0u8; 1 << 20];
    // Next sequence number expected of each source.
    let mut next: HashMap<SocketAddr, u64> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        let (n, from) = match s.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => continue,
            Err(e) => fail(&format!("recv: {e}")),
        };
        match buf.first() {
            Some(&DATA) if n >= 9 => {
                let seq = u64::from_le_bytes(buf[1..9].try_into().unwrap());
                let want = next.entry(from).or_insert_with(|| {
                    t.flows.fetch_add(1, Ordering::SeqCst);
                    0
                });
                if seq < *want {
                    t.dups.fetch_add(1, Ordering::SeqCst);
                } else {
                    t.gaps.fetch_add(seq - *want, Ordering::SeqCst);
                    *want = seq + 1;
                }
                t.bytes.fetch_add(n as u64, Ordering::SeqCst);
                t.msgs.fetch_add(1, Ordering::SeqCst);
            }
            Some(&STAT) => {
                let line = stat_line(engine, t, Some(from.ip()));
                let _ = s.send_to(line.as_bytes(), from);
            }
            Some(&QUIT) => {
                let _ = s.send_to(b"bye=1", from);
                s.flush(Duration::from_secs(2));
                stop.store(true, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

/// The stat answer: totals, memory, threads, CPU per thread, connections,
/// the messages received on each path of `peer`'s connection, and how the
/// node lock was taken ([`Engine::node_lock_stats`]).
fn stat_line(engine: &Engine, t: &Totals, peer: Option<IpAddr>) -> String {
    let conns = engine.connections();
    let paths_up: usize = conns.iter().map(|c| c.paths_up()).sum();
    let peer_paths = peer
        .and_then(|ip| conns.iter().find(|c| c.faddr == ip))
        .map(|c| c.paths.iter().map(|p| p.next_rx_seq.to_string()).collect::<Vec<_>>().join("/"))
        .unwrap_or_else(|| "-".into());
    let npaths = peer.and_then(|ip| conns.iter().find(|c| c.faddr == ip)).map_or(0, |c| c.npaths);
    let lock = engine.node_lock_stats();
    format!(
        "msgs={} bytes={} dups={} gaps={} flows={} rss_kb={} pss_kb={} threads={} tcp_conns={} conns={} paths_up={} \
         peer_npaths={} peer_path_rx={} cpu_ms={} tasks={} lock_taken={} lock_waited={} lock_wait_us={}",
        t.msgs.load(Ordering::SeqCst),
        t.bytes.load(Ordering::SeqCst),
        t.dups.load(Ordering::SeqCst),
        t.gaps.load(Ordering::SeqCst),
        t.flows.load(Ordering::SeqCst),
        proc::rss_kb(),
        proc::pss_kb(),
        proc::threads(),
        engine.tcp_connections().len(),
        conns.len(),
        paths_up,
        npaths,
        peer_paths,
        proc::process_cpu_ms(),
        proc::tasks_word(),
        lock.taken,
        lock.waited,
        lock.wait_us
    )
}
