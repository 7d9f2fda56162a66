//! rds-sink: receives RDS datagrams on one address and port and prints,
//! per source, how many messages and bytes arrived and their SHA-256.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use rds_sock::RdsSocket;
use rds_tools::{FlowDigest, STOP, bind_error, catch_signals, parse, stop_signal};

const HELP: &str = "\
usage: rds-sink -s addr:port [--digest] [-l count] [-t seconds] [--transport tcp|ib]

Binds an RDS socket to addr:port and receives datagrams. On exit (SIGINT,
SIGTERM, after -l messages or -t seconds without any) it prints one line per
source:

    <addr>:<port> <messages> <bytes> <sha256 of the concatenated payloads>

(the digest column is '-' without --digest). rds-gen prints the same line
for what it sent, so the two can be compared by a script. On stderr it
says why it stopped (the signal, -l or -t) and how many messages from how
many sources it received; any other end is an error message and status 1.

  -s addr:port   where to receive (this process serves addr as an RDS node)
  --digest       compute the SHA-256 of each source's payloads
  -l count       exit after count messages
  -t seconds     exit after this long without a message (default: never)
  -b size        SO_RCVBUF (forced; K/M suffixes)
  --transport tcp|ib  force a transport (SO_RDS_TRANSPORT); ib needs a build
                 with --features ib
  -h, --help     this text
";

fn main() {
    rds_tools::default_sigpipe();
    let args = match parse(std::env::args().skip(1), &["s", "l", "t", "b", "transport"]) {
        Ok(a) => a,
        Err(e) => usage(&e),
    };
    if args.has("h") || args.has("help") {
        print!("{HELP}");
        return;
    }
    if let Err(e) = args.check(&["s", "l", "t", "b", "digest", "transport", "h", "help"]) {
        usage(&e);
    }
    let addr: SocketAddr = args
        .get("s")
        .unwrap_or_else(|| usage("-s addr:port is required"))
        .parse()
        .unwrap_or_else(|_| usage("bad -s addr:port"));
    let limit: Option<u64> = args.get("l").map(|v| v.parse().unwrap_or_else(|_| usage("bad -l count")));
    let idle: Option<Duration> =
        args.get("t").map(|v| Duration::from_secs_f64(v.parse().unwrap_or_else(|_| usage("bad -t seconds"))));
    let digest = args.has("digest");
    catch_signals();

    let sock = RdsSocket::new().unwrap_or_else(|e| fail(&format!("socket: {e}")));
    if let Some(b) = args.get("b") {
        let n = rds_tools::parse_size(b).unwrap_or_else(|e| usage(&e));
        sock.set_recv_buffer_size_force(n as usize).unwrap_or_else(|e| fail(&format!("SO_RCVBUF: {e}")));
    }
    rds_tools::apply_transport(&sock, args.get("transport")).unwrap_or_else(|e| fail(&e));
    sock.bind(addr).unwrap_or_else(|e| fail(&bind_error(addr, &e)));
    // Poll for signals and the idle limit.
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    eprintln!("rds-sink: receiving on {addr}");
    let mut flows: BTreeMap<SocketAddr, FlowDigest> = BTreeMap::new();
    let mut total = 0u64;
    let mut quiet = Duration::ZERO;
    let mut idle_out = false;
    while !STOP.load(std::sync::atomic::Ordering::SeqCst) && limit.is_none_or(|l| total < l) {
        match sock.recv_payload() {
            Ok((p, from)) => {
                flows.entry(from).or_insert_with(|| FlowDigest::new(digest)).add(&p);
                total += 1;
                quiet = Duration::ZERO;
            }
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {
                quiet += Duration::from_millis(100);
                if idle.is_some_and(|i| quiet >= i) {
                    idle_out = true;
                    break;
                }
            }
            Err(e) => fail(&format!("recv: {e}")),
        }
    }
    for (from, d) in &flows {
        println!("{}", d.line(*from));
    }
    // Every way out says why on stderr: an exit that looks like a crash
    // (no output: no message arrived) must be told from one.
    let why = match (stop_signal(), idle_out) {
        (Some(sig), _) => format!("stopped by {sig}"),
        (None, true) => format!("no message for {:.1} s (-t)", quiet.as_secs_f64()),
        (None, false) => format!("{total} messages received (-l)"),
    };
    eprintln!("rds-sink: {why}: {total} messages from {} sources", flows.len());
    // This process is the RDS node: end its connections cleanly, so that
    // the senders' TCP sees everything we read acknowledged (an exit with
    // bytes in flight would reset the connections and leave the senders'
    // last messages unacked).
    sock.engine().shutdown(Duration::from_secs(1));
}

fn usage(msg: &str) -> ! {
    eprintln!("rds-sink: {msg}\n\n{HELP}");
    std::process::exit(2)
}

fn fail(msg: &str) -> ! {
    eprintln!("rds-sink: {msg}");
    std::process::exit(1)
}
