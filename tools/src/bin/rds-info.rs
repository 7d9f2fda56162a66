//! rds-info: the original's tables (counters, sockets, connections, message
//! queues, TCP sockets) for every RDS node of this user on this host.
//!
//! The kernel's rds-info reads `RDS_INFO_*` with getsockopt; our nodes are
//! processes, so it asks each of them on its info socket
//! (`rds_sock::info::ipc`) and prints one block per node.

use std::net::{IpAddr, SocketAddr};

use rds_sock::info::{Snapshot, ipc, sections};
use rds_tools::parse;

const HELP: &str = "\
usage: rds-info [-cknrstIT] [-v] [--pid PID]

Prints the state of every RDS node (engine) of this user running on this
host (run as root: of every user): a line naming the node (process id, engine number, command,
addresses), then the tables of the original rds-info.

The following options limit output to the given sources:
    -I IB transport connections
    -T TCP transport sockets
    -c statistic counters
    -k sockets
    -n connections
    -r recv queue messages
    -s send queue messages
    -t retransmit queue messages

If no options are given then all sources are used.

  -v          more detail: every path of a connection (we have up to 8),
              and the transmit state of each TCP socket
  --pid PID   only the nodes of process PID
  -h, --help  this text

Nodes answer on Unix-domain sockets in $RDS_INFO_DIR, else
$XDG_RUNTIME_DIR/rds-rs, else /tmp/rds-rs-<uid>; only processes of the same
user (or root) may ask. Root also reads every user's /tmp/rds-rs-<uid> and
/run/user/<uid>/rds-rs (unless $RDS_INFO_DIR is set). Connection flags: s sending, c connecting,
C connected.
";

/// The info sources in the order the original prints them.
const SOURCES: &[(char, u32)] = &[
    ('I', 0),
    ('T', sections::TCP),
    ('c', sections::COUNTERS),
    ('k', sections::SOCKETS),
    ('n', sections::CONNECTIONS),
    ('r', sections::RECV),
    ('s', sections::SEND),
    ('t', sections::RETRANS),
];

fn main() {
    rds_tools::default_sigpipe();
    let args = match parse(std::env::args().skip(1), &["pid"]) {
        Ok(a) => a,
        Err(e) => usage(&e),
    };
    if args.has("h") || args.has("help") {
        print!("{HELP}");
        return;
    }
    if let Err(e) = args.check(&["c", "k", "n", "r", "s", "t", "I", "T", "v", "pid", "h", "help"]) {
        usage(&e);
    }
    if let Some(op) = args.operands.first() {
        usage(&format!("unexpected argument '{op}'"));
    }
    let pid: Option<u32> = args.get("pid").map(|p| p.parse().unwrap_or_else(|_| usage("bad --pid")));
    let verbose = args.opts.iter().filter(|(n, _)| n == "v").count();
    let given: Vec<char> = SOURCES.iter().map(|(c, _)| *c).filter(|c| args.has(&c.to_string())).collect();
    let chosen: Vec<char> = if given.is_empty() { SOURCES.iter().map(|(c, _)| *c).collect() } else { given };
    let mut want = sections::NODE;
    for (c, bits) in SOURCES {
        if chosen.contains(c) {
            want |= bits;
        }
    }

    let dirs = ipc::client_dirs();
    let mut nodes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        match ipc::list(dir) {
            Ok(n) => nodes.extend(n),
            // Our own directory must be readable; another user's (root
            // looks at everyone's) that is not is named and skipped.
            Err(e) => {
                eprintln!("rds-info: {}: {}", dir.display(), rds_tools::errstr(&e));
                if i == 0 {
                    std::process::exit(1);
                }
            }
        }
    }
    let mut shown = 0;
    for entry in nodes.into_iter().filter(|e| pid.is_none_or(|p| p == e.pid)) {
        match ipc::query_entry(&entry, want) {
            Ok(snap) => {
                if shown > 0 {
                    println!();
                }
                shown += 1;
                print_node(&snap, &chosen, verbose);
            }
            // Shut down (or died) since the directory was read.
            Err(ipc::QueryError::Gone) => {}
            Err(e) => eprintln!("rds-info: node pid {} engine {}: {e}", entry.pid, entry.engine),
        }
    }
    if shown == 0 {
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        let dirs = dirs.join(", ");
        match pid {
            Some(p) => eprintln!("rds-info: no RDS node of process {p} found (in {dirs})"),
            None if ipc::euid() == 0 => eprintln!("rds-info: no RDS node is running on this host (in {dirs})"),
            None => eprintln!("rds-info: no RDS node of this user is running on this host (in {dirs})"),
        }
    }
}

fn usage(msg: &str) -> ! {
    eprintln!("rds-info: {msg}\n\n{HELP}");
    std::process::exit(2)
}

fn addr(a: IpAddr) -> String {
    a.to_string()
}

fn flags(f: u8) -> String {
    use rds_core::info::conn_flags::*;
    let bit = |b: u8, c: char| if f & b != 0 { c } else { '-' };
    [bit(SENDING, 's'), bit(CONNECTING, 'c'), bit(CONNECTED, 'C')].iter().collect()
}

fn print_node(s: &Snapshot, chosen: &[char], verbose: usize) {
    let n = &s.node;
    let addrs: Vec<String> = n.addresses.iter().map(|a| a.to_string()).collect();
    println!(
        "RDS node: pid {} engine {} ({}) addresses {}",
        n.pid,
        n.engine,
        n.command,
        if addrs.is_empty() { "none".to_string() } else { addrs.join(" ") }
    );
    for (c, _) in SOURCES.iter().filter(|(c, _)| chosen.contains(c)) {
        match c {
            'I' => {
                println!(
                    "\nRDS IB Connections:\n{:>15} {:>15} {:>32} {:>32}",
                    "LocalAddr", "RemoteAddr", "LocalDev", "RemoteDev"
                );
            }
            'T' => {
                println!(
                    "\nTCP Connections:\n{:>15} {:>5} {:>15} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}",
                    "LocalAddr",
                    "LPort",
                    "RemoteAddr",
                    "RPort",
                    "HdrRemain",
                    "DataRemain",
                    "SentNxt",
                    "ExpectUna",
                    "SeenUna"
                );
                let unspec = SocketAddr::from(([0, 0, 0, 0], 0));
                for t in &s.tcp {
                    let (l, p) = (t.local.unwrap_or(unspec), t.peer.unwrap_or(unspec));
                    print!(
                        "{:>15} {:>5} {:>15} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}",
                        addr(l.ip()),
                        l.port(),
                        addr(p.ip()),
                        p.port(),
                        t.hdr_rem,
                        t.data_rem,
                        t.last_sent_nxt,
                        t.last_expected_una,
                        t.last_seen_una
                    );
                    if verbose > 0 {
                        let path = t.path.map_or("-".to_string(), |p| p.index.to_string());
                        print!("  path={path} {}", t.detail);
                    }
                    println!();
                }
            }
            'c' => {
                println!("\nCounters:\n{:>25} {:>16}", "CounterName", "Value");
                for (name, v) in &s.counters {
                    println!("{name:>25} {v:>16}");
                }
            }
            'k' => {
                println!(
                    "\nRDS Sockets:\n{:>15} {:>5} {:>15} {:>5} {:>10} {:>10} {:>8}",
                    "BoundAddr", "BPort", "ConnAddr", "CPort", "SndBuf", "RcvBuf", "Inode"
                );
                let unspec = SocketAddr::from(([0, 0, 0, 0], 0));
                // As the kernel's RDS_INFO_SOCKETS: bound sockets only.
                for k in s.sockets.iter().filter(|k| k.bound.is_some()) {
                    let (b, c) = (k.bound.unwrap(), k.connected.unwrap_or(unspec));
                    println!(
                        "{:>15} {:>5} {:>15} {:>5} {:>10} {:>10} {:>8}",
                        addr(b.ip()),
                        b.port(),
                        addr(c.ip()),
                        c.port(),
                        k.sndbuf,
                        k.rcvbuf,
                        k.inum
                    );
                }
            }
            'n' => {
                println!(
                    "\nRDS Connections:\n{:>15} {:>15} {:>16} {:>16} {:>3}",
                    "LocalAddr", "RemoteAddr", "NextTX", "NextRX", "Flg"
                );
                for c in &s.connections {
                    let p0 = c.path0();
                    println!(
                        "{:>15} {:>15} {:>16} {:>16} {}",
                        addr(c.laddr),
                        addr(c.faddr),
                        p0.next_tx_seq,
                        p0.next_rx_seq,
                        flags(p0.flags)
                    );
                    if verbose > 0 {
                        println!(
                            "      transport {} tos {} npaths {} peer_gen {}",
                            c.transport.name(),
                            c.tos,
                            c.npaths,
                            c.peer_gen
                        );
                        for p in &c.paths {
                            println!(
                                "      path {} {:<13} {:>16} {:>16} {} sendq {} retrans {} bytes {} connects {}",
                                p.index,
                                format!("{:?}", p.state),
                                p.next_tx_seq,
                                p.next_rx_seq,
                                flags(p.flags),
                                p.send_queue,
                                p.retrans,
                                p.queued_bytes,
                                p.connects
                            );
                        }
                    }
                }
            }
            'r' | 's' | 't' => {
                let (title, list) = match c {
                    'r' => ("Receive", &s.recv),
                    's' => ("Send", &s.send),
                    _ => ("Retransmit", &s.retrans),
                };
                println!(
                    "\n{title} Message Queue:\n{:>15} {:>5} {:>15} {:>5} {:>16} {:>10}",
                    "LocalAddr", "LPort", "RemoteAddr", "RPort", "Seq", "Bytes"
                );
                for m in list {
                    println!(
                        "{:>15} {:>5} {:>15} {:>5} {:>16} {:>10}",
                        addr(m.laddr),
                        m.lport,
                        addr(m.faddr),
                        m.fport,
                        m.seq,
                        m.len
                    );
                }
            }
            _ => unreachable!(),
        }
    }
}
