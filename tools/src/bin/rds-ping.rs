//! rds-ping: sends 0-byte RDS messages to port 0 of a node and times the
//! pongs, as rds-tools' rds-ping does.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rds_sock::{RdsSocket, RecvFlags};
use rds_tools::{STOP, bind_error, catch_signals, parse, parse_interval, source_for};

const HELP: &str = "\
usage: rds-ping [-c count] [-i interval] [-I local_addr] [-Q tos] [--transport tcp|ib] dst

Sends 0-byte RDS messages to port 0 of dst, over 8 sockets in turn (a
socket is reused only after its pong arrived), and prints one line per
reply: its number and the round trip time in microseconds. Works against
nodes of this userspace RDS and Linux kernel RDS nodes.

  -c count       stop after count pings (default: until interrupted)
  -i interval    between pings: seconds (fractions allowed), or with an
                 msec/usec suffix (default 1)
  -I local_addr  the local address to ping from (default: the address the
                 host routes dst from); this process serves it as an RDS node
  -Q tos         type of service of the connection (0-255)
  --transport tcp|ib  force a transport (SO_RDS_TRANSPORT); ib needs a build
                 with --features ib
  -h, --help     this text

Exit status 0 if at least one reply arrived, 1 otherwise, 2 on bad usage.
";

const NSOCKETS: usize = 8;

fn main() {
    rds_tools::default_sigpipe();
    let args = match parse(std::env::args().skip(1), &["c", "i", "I", "Q", "transport"]) {
        Ok(a) => a,
        Err(e) => usage(&e),
    };
    if args.has("h") || args.has("help") {
        print!("{HELP}");
        return;
    }
    if let Err(e) = args.check(&["c", "i", "I", "Q", "transport", "h", "help"]) {
        usage(&e);
    }
    let [dst] = args.operands.as_slice() else { usage("one destination address expected") };
    let dst: IpAddr = dst.parse().unwrap_or_else(|_| usage(&format!("bad address '{dst}'")));
    let count: Option<u64> = args.get("c").map(|c| c.parse().unwrap_or_else(|_| usage(&format!("bad count '{c}'"))));
    let interval = args.get("i").map_or(Ok(Duration::from_secs(1)), parse_interval).unwrap_or_else(|e| usage(&e));
    let tos: Option<u8> = args.get("Q").map(|q| q.parse().unwrap_or_else(|_| usage(&format!("bad tos '{q}'"))));
    let src: IpAddr = match args.get("I") {
        Some(a) => a.parse().unwrap_or_else(|_| usage(&format!("bad address '{a}'"))),
        None => source_for(dst).unwrap_or_else(|e| fail(&format!("no route to {dst}: {e}"))),
    };
    catch_signals();
    std::process::exit(run(src, dst, count, interval, tos, args.get("transport")));
}

fn usage(msg: &str) -> ! {
    eprintln!("rds-ping: {msg}\n\n{HELP}");
    std::process::exit(2)
}

fn fail(msg: &str) -> ! {
    eprintln!("rds-ping: {msg}");
    std::process::exit(1)
}

struct Slot {
    sock: RdsSocket,
    /// (ping number, send time) awaiting its pong.
    pending: Option<(u64, Instant)>,
    /// The last ping sent on this socket (for duplicate replies).
    last: Option<(u64, Instant)>,
}

fn run(
    src: IpAddr,
    dst: IpAddr,
    count: Option<u64>,
    interval: Duration,
    tos: Option<u8>,
    transport: Option<&str>,
) -> i32 {
    let mut slots = Vec::new();
    for _ in 0..NSOCKETS {
        let sock = RdsSocket::new().unwrap_or_else(|e| fail(&format!("socket: {e}")));
        if let Some(t) = tos {
            sock.set_tos(t).unwrap_or_else(|e| fail(&format!("set tos: {e}")));
        }
        rds_tools::apply_transport(&sock, transport).unwrap_or_else(|e| fail(&e));
        let a = SocketAddr::new(src, 0);
        sock.bind(a).unwrap_or_else(|e| fail(&bind_error(a, &e)));
        sock.set_nonblocking(true).unwrap();
        slots.push(Slot { sock, pending: None, last: None });
    }
    let target = SocketAddr::new(dst, 0);
    let mut sent = 0u64;
    let mut replies = 0u64;
    let mut next = 0usize;
    let mut next_send = Instant::now();
    let mut last_send = None::<Instant>;
    let mut buf = [0u8; 64];
    let mut first_error = true;
    loop {
        if STOP.load(std::sync::atomic::Ordering::SeqCst) {
            break;
        }
        let now = Instant::now();
        let done_sending = count.is_some_and(|c| sent >= c);
        if done_sending {
            let waiting = slots.iter().any(|s| s.pending.is_some());
            let grace = interval.max(Duration::from_secs(1));
            if !waiting || last_send.is_some_and(|t| now >= t + grace) {
                break;
            }
        } else if now >= next_send {
            // The next socket whose previous ping was answered.
            if let Some(k) = (0..NSOCKETS).map(|i| (next + i) % NSOCKETS).find(|k| slots[*k].pending.is_none()) {
                sent += 1;
                match slots[k].sock.send_to(&[], target) {
                    Ok(_) => {
                        slots[k].pending = Some((sent, Instant::now()));
                        slots[k].last = slots[k].pending;
                    }
                    Err(e) => {
                        println!(" {sent:>3}: ERROR: {}", rds_tools::errstr(&e));
                        if first_error && e.raw_os_error() == Some(libc::EINVAL) {
                            println!("      Maybe your kernel does not support rds ping yet");
                        }
                        first_error = false;
                    }
                }
                next = (k + 1) % NSOCKETS;
                last_send = Some(Instant::now());
            }
            next_send += interval;
            if next_send < now {
                next_send = now + interval;
            }
        }
        // Wait for a pong or the next send.
        let wait =
            if done_sending { Duration::from_millis(50) } else { next_send.saturating_duration_since(Instant::now()) };
        let mut fds: Vec<libc::pollfd> =
            slots.iter().map(|s| libc::pollfd { fd: s.sock.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
        let ms = wait.as_millis().min(1000) as libc::c_int;
        // SAFETY: fds is a valid array of pollfd of the given length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        for (k, slot) in slots.iter_mut().enumerate() {
            if fds[k].revents == 0 {
                continue;
            }
            while let Ok(m) = slot.sock.recv_msg(&mut buf, RecvFlags::default()) {
                let Some(from) = m.from else { continue };
                if from.port() != 0 {
                    continue;
                }
                let other = if from.ip() != dst { format!(" ({})", from.ip()) } else { String::new() };
                match slot.pending.take() {
                    Some((n, t)) => {
                        replies += 1;
                        println!(" {n:>3}: {} usec{other}", t.elapsed().as_micros());
                    }
                    None => match slot.last {
                        Some((n, t)) => println!(" {n:>3}: {} usec{other} DUP!", t.elapsed().as_micros()),
                        None => println!(" {sent:>3}: DUP!{other}"),
                    },
                }
            }
        }
    }
    if replies > 0 { 0 } else { 1 }
}
