//! rds-scale: one node serving many peer nodes, measured (issue 14, item 4;
//! `scripts/perf/scale.sh` runs it from `scripts/perf.sh`).
//!
//! Three roles, each its own process:
//! - `serve`: the serving node, an [`rds_sock::Engine`] with a fixed number
//!   of reactor threads (`TcpConfig::threads`) and N receiving sockets. It
//!   checks every data message's per-flow sequence number (a duplicate or a
//!   gap is counted) and answers a stat request with what it received, its
//!   memory (RSS, PSS), threads, CPU time per thread, TCP connections and
//!   the per-path counters of the requester's connection (`proc.rs`).
//! - `peers`: N peer nodes in one process, on N loopback addresses, a
//!   socket each on one shared Engine (one reactor thread), or an Engine
//!   each with `--engine-per-peer`: the serving node's memory idle with
//!   all N connected, and the aggregate throughput of 1 active peer against
//!   N (`peers.rs`).
//! - `paths`: one node with 8 paths (mprds) to the serving node, a socket
//!   and a sending thread per path: messages per path and CPU per thread
//!   (`paths.rs`).
//!
//! Every line of a measurement is printed as `R key value [unit]` (what
//! `scripts/perf/report.py` reads).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rds_sock::RdsSocket;

mod paths;
mod peers;
mod proc;
mod serve;

const HELP: &str = "\
usage: rds-scale serve -s addr:port [--sockets N] [--threads N] [--npaths N] [-t secs]
       rds-scale peers -d addr:port [--peers N] [--from addr] [--control addr] [-p port]
                       [--npaths N] [-m size] [-l total] [--rounds N] [--burst N] [--settle secs]
                       [--engine-per-peer] [--quit]
       rds-scale paths -d addr:port -s addr:port [--sockets N] [--threads N] [--npaths N]
                       [-m size] [-T secs] [--quit]

serve: the serving node. Binds --sockets sockets (default 1) at addr:port,
  addr:port+1, ...; --threads reactor threads (default 2); --npaths paths
  per peer (default 8, the kernel's); leaves after -t seconds (default 600)
  or when a peer sends it the quit request. Prints its totals at the end.
peers: --peers peer nodes (default 256), a socket each on one shared
  engine (one reactor thread; --engine-per-peer: an engine each, one
  reactor thread each), at --from (default 127.0.1.1) and the following addresses
  (skipping .0 and .255), port -p (default 5000), with a control node at
  --control (default 127.0.0.3). Each peer sends one message and the
  serving node's memory is read after --settle seconds (default 2); then
  --rounds times (default 2) one peer and all (in turns: one peer
  first in the 1st, 3rd, ... round, all first in the others) send -l bytes
  (default 1G) in -m sized messages (default 8K), from one thread, up
  to --burst messages (default 64) to a peer before the next (after a
  warm-up of each with a quarter of -l).
paths: one node at -s with --npaths paths (default 8) and --threads
  reactor threads (default 2) sends for -T seconds (default 4) from
  --sockets sockets (default 8; ports port, port+1, ...: a path each) to
  the serving node's sockets at -d, -d+1, ..., a thread each.
  --quit       ask the serving node to leave at the end
  -h, --help   this text

Measurements are printed as 'R key value [unit]' lines. Exit status 0
when every message arrived exactly once and in order, 1 otherwise.
";

/// First byte of a message: data (then the flow's sequence number, 8
/// bytes little-endian), a stat request, a quit request.
const DATA: u8 = b'D';
const STAT: u8 = b'S';
const QUIT: u8 = b'Q';

/// The serving node's answer to a stat request: `key=value` words.
pub type Stat = HashMap<String, String>;

/// How a node lock was taken between two looks ([`rds_sock::NodeLockStats`]):
/// `R {key}_lock_taken` (acquisitions), `R {key}_lock_waited` (the share of
/// them that found it held, percent) and `R {key}_lock_wait` (their summed
/// wait per second of `wall_ms`, in ms: 1000 is a thread's whole time).
pub fn print_lock(key: &str, before: rds_sock::NodeLockStats, after: rds_sock::NodeLockStats, wall_ms: u64) {
    let taken = after.taken.saturating_sub(before.taken);
    let waited = after.waited.saturating_sub(before.waited);
    let wait_us = after.wait_us.saturating_sub(before.wait_us);
    println!("R {key}_lock_taken {taken}");
    println!("R {key}_lock_waited {:.2} %", waited as f64 * 100.0 / taken.max(1) as f64);
    println!("R {key}_lock_wait {:.1} ms/s", wait_us as f64 / wall_ms.max(1) as f64);
}

/// The serving node's node-lock figures in a stat answer.
pub fn stat_lock(s: &Stat) -> rds_sock::NodeLockStats {
    rds_sock::NodeLockStats {
        taken: stat_u64(s, "lock_taken"),
        waited: stat_u64(s, "lock_waited"),
        wait_us: stat_u64(s, "lock_wait_us"),
    }
}

pub fn stat_u64(s: &Stat, k: &str) -> u64 {
    s.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

pub fn parse_stat(text: &str) -> Stat {
    text.split_whitespace().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Asks the serving node at `to` for its stat from `sock` (which must
/// receive nothing else): up to 3 attempts of 5 s.
pub fn ask(sock: &RdsSocket, to: SocketAddr) -> io::Result<Stat> {
    request(sock, to, STAT)
}

pub fn request(sock: &RdsSocket, to: SocketAddr, what: u8) -> io::Result<Stat> {
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = vec![0u8; 64 << 10];
    for _ in 0..3 {
        sock.send_to(&[what], to)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match sock.recv_from(&mut buf) {
                Ok((n, from)) if from == to => return Ok(parse_stat(&String::from_utf8_lossy(&buf[..n]))),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut => break,
                Err(e) => return Err(e),
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::TimedOut, format!("no answer from {to}")))
}

/// A data message of `size` bytes (at least 9) carrying `seq`.
pub fn data(buf: &mut [u8], seq: u64) {
    buf[0] = DATA;
    buf[1..9].copy_from_slice(&seq.to_le_bytes());
}

fn main() {
    rds_tools::default_sigpipe();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.iter().any(|a| a == "-h" || a == "--help") {
        print!("{HELP}");
        return;
    }
    let with_value = [
        "s", "d", "p", "m", "l", "t", "T", "sockets", "threads", "npaths", "peers", "from", "control", "rounds",
        "burst", "settle",
    ];
    let args = rds_tools::parse(argv, &with_value).unwrap_or_else(|e| usage(&e));
    let mut known: Vec<&str> = with_value.to_vec();
    known.extend(["quit", "engine-per-peer", "h", "help"]);
    if let Err(e) = args.check(&known) {
        usage(&e);
    }
    let ok = match args.operands.first().map(String::as_str) {
        Some("serve") => serve::run(&args),
        Some("peers") => peers::run(&args),
        Some("paths") => paths::run(&args),
        Some(o) => usage(&format!("unknown role '{o}'")),
        None => usage("a role is required: serve, peers or paths"),
    };
    std::process::exit(if ok { 0 } else { 1 });
}

/// `-o addr:port`, required.
pub fn addr_of(args: &rds_tools::Args, o: &str) -> SocketAddr {
    let dash = if o.len() == 1 { "-" } else { "--" };
    args.get(o)
        .unwrap_or_else(|| usage(&format!("{dash}{o} addr:port is required")))
        .parse()
        .unwrap_or_else(|_| usage(&format!("bad {dash}{o} addr:port")))
}

/// A number option with its default.
pub fn num_of(args: &rds_tools::Args, o: &str, dflt: u64) -> u64 {
    match args.get(o) {
        None => dflt,
        Some(v) => rds_tools::parse_size(v).unwrap_or_else(|e| usage(&format!("{o}: {e}"))),
    }
}

/// Seconds (fractions allowed) with their default.
pub fn secs_of(args: &rds_tools::Args, o: &str, dflt: f64) -> Duration {
    match args.get(o) {
        None => Duration::from_secs_f64(dflt),
        Some(v) => rds_tools::parse_interval(v).unwrap_or_else(|e| usage(&format!("{o}: {e}"))),
    }
}

pub fn usage(msg: &str) -> ! {
    eprintln!("rds-scale: {msg}\n\n{HELP}");
    std::process::exit(2)
}

pub fn fail(msg: &str) -> ! {
    eprintln!("rds-scale: {msg}");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_words() {
        let s = parse_stat("msgs=12 rss_kb=3400 tasks=rds-tcp-0:10,main:3 junk");
        assert_eq!(stat_u64(&s, "msgs"), 12);
        assert_eq!(stat_u64(&s, "rss_kb"), 3400);
        assert_eq!(s["tasks"], "rds-tcp-0:10,main:3");
        assert_eq!(stat_u64(&s, "missing"), 0);
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn data_carries_its_sequence_number() {
        let mut b = [0u8; 16];
        data(&mut b, 0x0102_0304_0506_0708);
        assert_eq!(b[0], DATA);
        assert_eq!(u64::from_le_bytes(b[1..9].try_into().unwrap()), 0x0102_0304_0506_0708);
    }
}
