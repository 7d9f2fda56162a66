//! rds-bench: datagram throughput of the userspace RDS over loopback TCP,
//! against a raw TCP stream carrying the same bytes, measured in one run;
//! or (`--sockets N --paths LIST`) N sockets streaming over each number of
//! paths in the list, measured in one run.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rds_sock::{Engine, EngineConfig};
use rds_tools::{parse, parse_size};

const HELP: &str = "\
usage: rds-bench [options]

Streams datagrams from one node to another over TCP on this host and
prints messages/s, MB/s and the ratio to a raw TCP stream of the same
bytes, measured in the same run (raw TCP first, then RDS, per size).

  -s, --sizes LIST     message sizes, comma separated (default 1K,8K)
  -t, --seconds N      seconds per measurement (default 3)
  -b, --sndbuf SIZE    RDS SO_SNDBUF/SO_RCVBUF (forced; default 4M)
  -a, --from ADDR      sending node address (default 127.0.0.1)
  -d, --to ADDR        receiving node address (default 127.0.0.2)
  -p, --port N         RDS-TCP port of both nodes (default 16385)
  -r, --repeat N       repeat each measurement N times, report the best (default 1)
      --only rds|raw   measure only one side (for profiling)
      --sockets N      multipath mode: N sender sockets (ports 4000..) each
                       streaming to its own receiver socket, one thread each,
                       for every path count of --paths (no raw TCP run;
                       sizes default to 8K)
      --paths LIST     path counts for --sockets, comma separated (NodeConfig
                       npaths of both nodes; default 1,8)
  -h, --help           this text
";

struct Result {
    msgs: u64,
    bytes: u64,
    secs: f64,
}

impl Result {
    fn mbps(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.secs
    }
    fn mps(&self) -> f64 {
        self.msgs as f64 / self.secs
    }
}

/// A raw TCP stream: the sender writes `size`-byte chunks, the receiver
/// reads into a 256 KiB buffer.
fn raw_tcp(from: IpAddr, to: IpAddr, size: usize, secs: f64) -> std::io::Result<Result> {
    let l = TcpListener::bind(SocketAddr::new(to, 0))?;
    let target = l.local_addr()?;
    let rx = std::thread::spawn(move || -> std::io::Result<(u64, Instant)> {
        let (mut s, _) = l.accept()?;
        let mut buf = vec![0u8; 256 << 10];
        let mut total = 0u64;
        loop {
            let n = s.read(&mut buf)?;
            if n == 0 {
                return Ok((total, Instant::now()));
            }
            total += n as u64;
        }
    });
    let sock = socket2::Socket::new(socket2::Domain::for_address(target), socket2::Type::STREAM, None)?;
    sock.bind(&SocketAddr::new(from, 0).into())?;
    sock.connect(&target.into())?;
    sock.set_nodelay(true)?;
    let mut s: TcpStream = sock.into();
    let msg = vec![0x5au8; size];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut msgs = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            s.write_all(&msg)?;
        }
        msgs += 64;
    }
    drop(s);
    let (bytes, done) = rx.join().unwrap()?;
    assert_eq!(bytes, msgs * size as u64);
    Ok(Result { msgs, bytes, secs: (done - start).as_secs_f64() })
}

/// RDS: two engines (nodes) in this process, one socket each; a blocking
/// sender and a receiver copying each datagram into its buffer.
fn rds(from: IpAddr, to: IpAddr, port: u16, size: usize, secs: f64, buf: usize) -> std::io::Result<Result> {
    let mut cfg = EngineConfig::default();
    cfg.tcp.port = port;
    let ea = Engine::new(cfg.clone())?;
    let eb = Engine::new(cfg)?;
    let a = ea.socket()?;
    let b = eb.socket()?;
    a.bind(SocketAddr::new(from, 4000))?;
    b.bind(SocketAddr::new(to, 4000))?;
    for s in [&a, &b] {
        s.set_send_buffer_size_force(buf)?;
        s.set_recv_buffer_size_force(buf)?;
    }
    let dst = SocketAddr::new(to, 4000);
    // Warm up: connection, handshake and paths.
    a.send_to(b"warm", dst)?;
    let mut rbuf = vec![0u8; size.max(16)];
    b.recv_from(&mut rbuf)?;

    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let b = Arc::new(b);
    let rx = {
        let (b, done, sent) = (b.clone(), done.clone(), sent.clone());
        std::thread::spawn(move || -> std::io::Result<(u64, u64, Instant)> {
            let mut buf = vec![0u8; size.max(16)];
            let (mut msgs, mut bytes) = (0u64, 0u64);
            loop {
                if done.load(Ordering::Acquire) && msgs == sent.load(Ordering::Acquire) {
                    return Ok((msgs, bytes, Instant::now()));
                }
                b.set_read_timeout(Some(Duration::from_millis(200)))?;
                match b.recv_from(&mut buf) {
                    Ok((n, _)) => {
                        msgs += 1;
                        bytes += n as u64;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => continue,
                    Err(e) => return Err(e),
                }
            }
        })
    };
    // A stall (no datagram sent for 5 s) is a bug: dump both nodes.
    let progress = Arc::new(AtomicU64::new(0));
    let watchdog = {
        let (progress, done, ea, eb) = (progress.clone(), done.clone(), ea.clone(), eb.clone());
        std::thread::spawn(move || {
            let mut last = u64::MAX;
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_secs(5));
                let now = progress.load(Ordering::Relaxed);
                if now == last && !done.load(Ordering::Acquire) {
                    eprintln!("rds-bench: STALL after {now} datagrams");
                    for (name, e) in [("sender", &ea), ("receiver", &eb)] {
                        eprintln!("--- {name}\n{}", e.with_node(|n| n.dump()));
                        for c in e.tcp_connections() {
                            eprintln!("  tcp {:?} -> {:?} {}", c.local, c.peer, c.detail);
                        }
                    }
                }
                last = now;
            }
        })
    };
    let msg = vec![0x5au8; size];
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut n = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            a.send_to(&msg, dst)?;
        }
        n += 64;
        progress.store(n, Ordering::Relaxed);
    }
    sent.store(n, Ordering::Release);
    done.store(true, Ordering::Release);
    let (msgs, bytes, t) = rx.join().unwrap()?;
    let _ = watchdog.join();
    assert_eq!(msgs, n, "every datagram arrives");
    if std::env::var_os("RDS_BENCH_COUNTERS").is_some() {
        for (name, e) in [("sender", &ea), ("receiver", &eb)] {
            let c: Vec<_> = e.counters().into_iter().filter(|(_, v)| *v != 0).collect();
            eprintln!("{name}: {c:?}");
        }
    }
    ea.shutdown(Duration::from_secs(1));
    eb.shutdown(Duration::from_secs(1));
    Ok(Result { msgs, bytes, secs: (t - start).as_secs_f64() })
}

/// Settings of the multipath mode.
#[derive(Clone, Copy)]
struct Multi {
    from: IpAddr,
    to: IpAddr,
    port: u16,
    secs: f64,
    buf: usize,
    sockets: u16,
}

/// Multipath mode: two engines with `paths` paths each; `sockets` sender
/// sockets on ports 4000.. (lanes port % paths) each stream to the
/// receiver socket on the same port, one blocking sender and one receiver
/// thread per socket. Returns the total and the paths that were up.
fn rds_multi(m: &Multi, size: usize, paths: u8) -> std::io::Result<(Result, usize)> {
    let Multi { from, to, port, secs, buf, sockets } = *m;
    let mut cfg = EngineConfig::default();
    cfg.tcp.port = port;
    cfg.node.npaths = paths;
    let ea = Engine::new(cfg.clone())?;
    let eb = Engine::new(cfg)?;
    let mut tx = Vec::new();
    let mut rx = Vec::new();
    for i in 0..sockets {
        let a = ea.socket()?;
        let b = eb.socket()?;
        a.bind(SocketAddr::new(from, 4000 + i))?;
        b.bind(SocketAddr::new(to, 4000 + i))?;
        for s in [&a, &b] {
            s.set_send_buffer_size_force(buf)?;
            s.set_recv_buffer_size_force(buf)?;
        }
        tx.push(a);
        rx.push(Arc::new(b));
    }
    // Warm up: connection, handshake, every path.
    let mut rbuf = vec![0u8; size.max(16)];
    for (a, b) in tx.iter().zip(&rx) {
        a.send_to(b"warm", b.local_addr()?)?;
        b.recv_from(&mut rbuf)?;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let up = loop {
        let up = ea.connections().iter().find(|c| c.faddr == to).map_or(0, |c| c.paths_up());
        if up >= usize::from(paths) || Instant::now() > deadline {
            break up;
        }
        std::thread::sleep(Duration::from_millis(1));
    };

    let done = Arc::new(AtomicBool::new(false));
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..sockets).map(|_| AtomicU64::new(0)).collect());
    let receivers: Vec<_> = rx
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let (b, done, sent) = (b.clone(), done.clone(), sent.clone());
            std::thread::spawn(move || -> std::io::Result<(u64, u64, Instant)> {
                let mut buf = vec![0u8; size.max(16)];
                let (mut msgs, mut bytes) = (0u64, 0u64);
                b.set_read_timeout(Some(Duration::from_millis(200)))?;
                loop {
                    if done.load(Ordering::Acquire) && msgs == sent[i].load(Ordering::Acquire) {
                        return Ok((msgs, bytes, Instant::now()));
                    }
                    match b.recv_from(&mut buf) {
                        Ok((n, _)) => {
                            msgs += 1;
                            bytes += n as u64;
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => continue,
                        Err(e) => return Err(e),
                    }
                }
            })
        })
        .collect();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let senders: Vec<_> = tx
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let sent = sent.clone();
            let dst = SocketAddr::new(to, 4000 + i as u16);
            std::thread::spawn(move || -> std::io::Result<()> {
                let msg = vec![0x5au8; size];
                let mut n = 0u64;
                while Instant::now() < end {
                    for _ in 0..16 {
                        a.send_to(&msg, dst)?;
                    }
                    n += 16;
                }
                sent[i].store(n, Ordering::Release);
                // Closing a socket drops what it has not yet had acked.
                a.flush(Duration::from_secs(10));
                Ok(())
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap()?;
    }
    done.store(true, Ordering::Release);
    let (mut msgs, mut bytes, mut last) = (0u64, 0u64, start);
    for (i, r) in receivers.into_iter().enumerate() {
        let (m, b, t) = r.join().unwrap()?;
        assert_eq!(m, sent[i].load(Ordering::Acquire), "every datagram of socket {i} arrives");
        msgs += m;
        bytes += b;
        last = last.max(t);
    }
    ea.shutdown(Duration::from_secs(1));
    eb.shutdown(Duration::from_secs(1));
    Ok((Result { msgs, bytes, secs: (last - start).as_secs_f64() }, up))
}

fn main() {
    rds_tools::default_sigpipe();
    let args = match parse(
        std::env::args().skip(1),
        &[
            "s", "sizes", "t", "seconds", "b", "sndbuf", "a", "from", "d", "to", "p", "port", "r", "repeat", "only",
            "sockets", "paths",
        ],
    ) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rds-bench: {e}\n{HELP}");
            std::process::exit(2);
        }
    };
    if args.has("h") || args.has("help") {
        print!("{HELP}");
        return;
    }
    if let Err(e) = args.check(&[
        "s", "sizes", "t", "seconds", "b", "sndbuf", "a", "from", "d", "to", "p", "port", "r", "repeat", "only",
        "sockets", "paths", "h", "help",
    ]) {
        eprintln!("rds-bench: {e}\n{HELP}");
        std::process::exit(2);
    }
    let get = |s: &str, l: &str| args.get(s).or(args.get(l));
    let run = || -> std::result::Result<(), String> {
        let sizes: Vec<usize> = get("s", "sizes")
            .unwrap_or(if args.has("sockets") { "8K" } else { "1K,8K" })
            .split(',')
            .map(|s| parse_size(s).map(|v| v as usize))
            .collect::<std::result::Result<_, _>>()?;
        let secs: f64 = get("t", "seconds").unwrap_or("3").parse().map_err(|_| "bad --seconds")?;
        let buf = parse_size(get("b", "sndbuf").unwrap_or("4M"))? as usize;
        let from: IpAddr = get("a", "from").unwrap_or("127.0.0.1").parse().map_err(|_| "bad --from")?;
        let to: IpAddr = get("d", "to").unwrap_or("127.0.0.2").parse().map_err(|_| "bad --to")?;
        let port: u16 = get("p", "port").unwrap_or("16385").parse().map_err(|_| "bad --port")?;
        let repeat: usize = get("r", "repeat").unwrap_or("1").parse().map_err(|_| "bad --repeat")?;
        let only = args.get("only");
        if only.is_some_and(|o| o != "rds" && o != "raw") {
            return Err("--only takes rds or raw".into());
        }
        if let Some(n) = args.get("sockets") {
            let sockets: u16 = n.parse().ok().filter(|n| (1..=1000).contains(n)).ok_or("bad --sockets")?;
            let paths: Vec<u8> = args
                .get("paths")
                .unwrap_or("1,8")
                .split(',')
                .map(|p| p.trim().parse().ok().filter(|p| (1..=8).contains(p)))
                .collect::<Option<_>>()
                .ok_or("bad --paths (1 to 8, comma separated)")?;
            println!("{:>8} {:>7} {:>8} {:>12} {:>10} {:>9}", "sockets", "paths", "size", "msgs/s", "MB/s", "vs first");
            for &size in &sizes {
                let mut first: Option<f64> = None;
                for &p in &paths {
                    let mut best: Option<(Result, usize)> = None;
                    for _ in 0..repeat.max(1) {
                        let m = Multi { from, to, port, secs, buf, sockets };
                        let r = rds_multi(&m, size, p).map_err(|e| e.to_string())?;
                        if best.as_ref().is_none_or(|b| r.0.mbps() > b.0.mbps()) {
                            best = Some(r);
                        }
                    }
                    let (r, up) = best.unwrap();
                    let base = *first.get_or_insert(r.mbps());
                    println!(
                        "{:>8} {:>7} {:>8} {:>12.0} {:>10.1} {:>8.0}%",
                        sockets,
                        if up == usize::from(p) { p.to_string() } else { format!("{up}/{p}") },
                        size,
                        r.mps(),
                        r.mbps(),
                        100.0 * r.mbps() / base
                    );
                }
            }
            return Ok(());
        }
        println!(
            "{:>8} {:>10} {:>12} {:>10} {:>12} {:>10} {:>7}",
            "size", "transport", "msgs/s", "MB/s", "raw msgs/s", "raw MB/s", "ratio"
        );
        for &size in &sizes {
            let best = |f: &dyn Fn() -> std::io::Result<Result>| -> std::result::Result<Result, String> {
                let mut best: Option<Result> = None;
                for _ in 0..repeat.max(1) {
                    let r = f().map_err(|e| e.to_string())?;
                    if best.as_ref().is_none_or(|b| r.mbps() > b.mbps()) {
                        best = Some(r);
                    }
                }
                Ok(best.unwrap())
            };
            let skip = || Ok::<Result, String>(Result { msgs: 0, bytes: 0, secs: 1.0 });
            let raw = if only == Some("rds") { skip()? } else { best(&|| raw_tcp(from, to, size, secs))? };
            let r = if only == Some("raw") { skip()? } else { best(&|| rds(from, to, port, size, secs, buf))? };
            println!(
                "{:>8} {:>10} {:>12.0} {:>10.1} {:>12.0} {:>10.1} {:>6.1}%",
                size,
                "rds-tcp",
                r.mps(),
                r.mbps(),
                raw.mps(),
                raw.mbps(),
                100.0 * r.mbps() / raw.mbps()
            );
        }
        Ok(())
    };
    if let Err(e) = run() {
        eprintln!("rds-bench: {e}");
        std::process::exit(1);
    }
}
