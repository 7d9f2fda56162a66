//! rds-gen: sends a stream of RDS datagrams (a file, or a generated
//! pattern) from one address and port to another and prints what it sent.

use std::io::Read;
use std::net::SocketAddr;
use std::time::Duration;

use rds_sock::RdsSocket;
use rds_tools::{FlowDigest, STOP, bind_error, catch_signals, parse, parse_interval, parse_size};

const HELP: &str = "\
usage: rds-gen -s addr:port -d addr:port [-m size] [-l total] [-f file] [-i interval] [--no-digest] [--transport tcp|ib]

Sends datagrams from an RDS socket bound to -s to the RDS socket -d: the
contents of a file cut into -m sized messages, or a generated pattern.
Waits until the peer acknowledged everything, then prints

    <addr>:<port> <messages> <bytes> <sha256 of the concatenated payloads>

for what it sent (the line rds-sink --digest prints for this source).

  -s addr:port   local address and port (this process serves addr)
  -d addr:port   destination
  -m size        message size (default 4K; K/M suffixes; at most 1M)
  -l total       total bytes to send (default: the whole file with -f,
                 otherwise 1M); the last message may be shorter
  -f file        send this file ('-' for standard input)
  -i interval    pause between messages (seconds, or msec/usec suffix)
  -b size        SO_SNDBUF (forced; default 4M)
  --no-digest    no SHA-256 of what is sent (the digest column is '-'): a
                 benchmark then times the sending alone
  --transport tcp|ib  force a transport (SO_RDS_TRANSPORT); ib needs a build
                 with --features ib
  -h, --help     this text

Exit status 0 when everything was acknowledged, 1 otherwise.
";

fn main() {
    rds_tools::default_sigpipe();
    let args = match parse(std::env::args().skip(1), &["s", "d", "m", "l", "f", "i", "b", "transport"]) {
        Ok(a) => a,
        Err(e) => usage(&e),
    };
    if args.has("h") || args.has("help") {
        print!("{HELP}");
        return;
    }
    if let Err(e) = args.check(&["s", "d", "m", "l", "f", "i", "b", "transport", "no-digest", "h", "help"]) {
        usage(&e);
    }
    let addr = |o: &str| -> SocketAddr {
        args.get(o)
            .unwrap_or_else(|| usage(&format!("-{o} addr:port is required")))
            .parse()
            .unwrap_or_else(|_| usage(&format!("bad -{o} addr:port")))
    };
    let (src, dst) = (addr("s"), addr("d"));
    let size = parse_size(args.get("m").unwrap_or("4K")).unwrap_or_else(|e| usage(&e)) as usize;
    if size > 1 << 20 {
        usage("-m: at most 1M");
    }
    let interval = args.get("i").map(|i| parse_interval(i).unwrap_or_else(|e| usage(&e)));
    let sndbuf = parse_size(args.get("b").unwrap_or("4M")).unwrap_or_else(|e| usage(&e)) as usize;
    let mut data: Box<dyn Read> = match args.get("f") {
        Some("-") => Box::new(std::io::stdin()),
        Some(f) => Box::new(std::fs::File::open(f).unwrap_or_else(|e| fail(&format!("{f}: {e}")))),
        None => Box::new(Pattern(0)),
    };
    let total: Option<u64> = match (args.get("l"), args.get("f")) {
        (Some(l), _) => Some(parse_size(l).unwrap_or_else(|e| usage(&e))),
        (None, Some(_)) => None,
        (None, None) => Some(1 << 20),
    };
    catch_signals();

    let sock = RdsSocket::new().unwrap_or_else(|e| fail(&format!("socket: {e}")));
    sock.set_send_buffer_size_force(sndbuf).unwrap_or_else(|e| fail(&format!("SO_SNDBUF: {e}")));
    rds_tools::apply_transport(&sock, args.get("transport")).unwrap_or_else(|e| fail(&e));
    sock.bind(src).unwrap_or_else(|e| fail(&bind_error(src, &e)));
    let src = sock.local_addr().unwrap();
    let mut sent = FlowDigest::new(!args.has("no-digest"));
    let mut buf = vec![0u8; size];
    loop {
        if STOP.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let want = match total {
            Some(t) => (t - sent.bytes).min(size as u64) as usize,
            None => size,
        };
        if total.is_some_and(|t| sent.bytes >= t) {
            break;
        }
        let n = read_full(&mut data, &mut buf[..want]).unwrap_or_else(|e| fail(&format!("read: {e}")));
        if n == 0 && (want > 0 || total.is_none()) {
            break;
        }
        sock.send_to(&buf[..n], dst).unwrap_or_else(|e| fail(&format!("send to {dst}: {e}")));
        sent.add(&buf[..n]);
        if let Some(i) = interval {
            std::thread::sleep(i);
        }
        if want == 0 {
            break;
        }
    }
    // Closing the socket would drop what the peer has not acknowledged.
    let acked = sock.flush(Duration::from_secs(30));
    println!("{}", sent.line(src));
    if !acked {
        eprintln!("rds-gen: not everything was acknowledged by {dst} within 30 s");
        std::process::exit(1);
    }
}

/// Reads until `buf` is full or the input ends.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// An endless deterministic byte pattern.
struct Pattern(u64);

impl Read for Pattern {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        for b in buf.iter_mut() {
            *b = (self.0.wrapping_mul(131) ^ (self.0 >> 8)) as u8;
            self.0 += 1;
        }
        Ok(buf.len())
    }
}

fn usage(msg: &str) -> ! {
    eprintln!("rds-gen: {msg}\n\n{HELP}");
    std::process::exit(2)
}

fn fail(msg: &str) -> ! {
    eprintln!("rds-gen: {msg}");
    std::process::exit(1)
}
