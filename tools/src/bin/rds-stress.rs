//! rds-stress: the stress test and benchmark of rds-tools, on this
//! userspace RDS. Same model, options, header, pattern and output as the
//! original; tasks are threads instead of forked processes.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rds_core::message::rdma_flags;
use rds_sock::{Engine, RdmaBuf, RdmaOp, RdmaSeg, RdsSocket, RecvFlags, SendFlags};
use rds_tools::stress::{
    HEADER_SIZE, Header, MAX_BUCKETS, MAX_MSG_SIZE, OP_ACK, OP_REQ, OPTIONS_V1_SIZE, OPTIONS_V2_SIZE, RDMA_OP_READ,
    RDMA_OP_WRITE, VERSION_LEN, WireOptions, bucket, check_pattern, is_version_string, pattern, stats_header,
    stats_line,
};
use rds_tools::{Args, STOP, bind_error, catch_signals, errstr, parse, parse_size};

const HELP: &str = "\
usage: rds-stress [-r addr] [-p port] [-c]                       (passive side)
       rds-stress -s addr [-r addr] [-p port] [options]          (active side)

Stress test and benchmark of RDS, after rds-tools' rds-stress, running on
this userspace RDS (RDS over TCP). The passive side waits on a TCP control
connection at addr:port; the active side connects and sends its options,
and both sides start -t tasks, each an RDS socket bound to (own address,
port+1+i). Every task keeps -d requests in flight to every task of the other
side, and answers every request with an ack. Tasks are threads of one
process (the original forks a process per task); each task polls its
socket's readiness descriptor, as the original polls its non-blocking socket.

Every second one line, then a dashed line and the average of the run:
  tsks          tasks running
  tx/s, rx/s    requests sent / received in that second
  tx+rx K/s     KiB/s of all payload sent and received (requests and acks)
  mbi/mbo K/s   RDMA KiB/s into / out of the requesters' buffers (-D)
  tx us/c       average microseconds per send call
  rtt us        average microseconds from a request to its ack
  cpu %         CPU use measured by -c; -1 without -c

Both sides:
  -r, --recv-addr ADDR      local address (default: the control connection's);
                            this process serves it as an RDS node, so it also
                            answers rds-ping
  -p, --port PORT           control port; tasks use PORT+1... (default 4000)
  -c, --report-cpu          measure CPU use with one lowest-priority soak thread
                            per CPU (the original uses soak processes)
      --show-histogram      print a power-of-two RTT histogram at the end
      --show-outliers USEC  report every RTT above USEC on stderr
      --cancel-sent-to      on SIGINT/SIGTERM every task issues RDS_CANCEL_SENT_TO
                            for every peer task and reports how long it took
      --abort-after SECONDS terminate (SIGALRM) after SECONDS
      --disable-inq         accepted for compatibility; no effect (no RDS_INQ)
      --transport tcp|ib    force this side's transport (SO_RDS_TRANSPORT); ib
                            needs a build with --features ib
  -h, --help                this text

Active side (the passive side runs with the active side's settings):
  -s, --send-addr ADDR      the passive side's address; makes this the active side
  -q, --req-bytes BYTES     request size (default 1024; K/M suffixes; 63 to 1M)
  -a, --ack-bytes BYTES     ack size (default 63, the test header; up to 1M)
  -d, --depth N             requests in flight per pair of tasks (default 1)
  -t, --tasks N             tasks per side (default 1)
  -T, --time SECONDS        run time; 0 runs until interrupted (default 0);
                            both sides stop
  -o, --one-way             only the active side sends requests
  -Q, --tos TOS             type of service (RDS over TCP maps it to 0)
  -v, --verify              fill payloads with the original's pattern and check
                            every message; a mismatch names the flow and the
                            offset and exits 1
  -z, --report-summary      print only the final summary
  -V, --trace               trace every message on stderr
  -R, --rtprio              run the reporting thread SCHED_RR
      --connect-retries N   retry a refused control connection N times, 1 s apart
      --use-cong-monitor 0|1  RDS_CONG_MONITOR (default 1)
      --show-params         print the job parameters first
      --show-perfdata       print machine-readable \"::\" lines instead of the
                            table: rates, RDS counters and /proc/stat CPU use

RDMA (IB transport only; refused by a build without --features ib, and
with --transport tcp):
  -D, --rdma-bytes BYTES    with every request the requester offers a buffer
                            of BYTES (times -I) and the other side RDMA-reads
                            or -writes it before sending the ack (RDMA_ARGS
                            with NOTIFY_ME on the ack); multiple of 8, at most
                            1M in all
  -I, --rdma-buffers N      local buffers per RDMA op (default 1, at most 64)
  -M, --rdma-mode 0|1|2     0: alternate READ and WRITE (default), 1: READ
                            only, 2: WRITE only
      --rdma-use-get-mr 0|1 register with RDS_GET_MR and announce the cookie
                            with RDMA_DEST (default 0: RDMA_MAP on the request)
      --rdma-use-once 0|1   USE_ONCE MRs, released by the ack (default 0:
                            FREE_MR on the ack)
      --rdma-use-fence 0|1  FENCE the ack after an RDMA READ (default 1)
      --rdma-use-notify 0|1 accepted; notifications are always asked for
  With -v the RDMA buffers carry the original's 64-bit pattern and both
  directions are checked (the READ by the reader, the WRITE by the owner).

Rejected with an error:
  --rdma-cache-mrs, --rdma-alignment, --rdma-key-o-meter: not implemented;
  --reset (RDS_CONN_RESET), --async, --always-bursty, --sync-always-bursty:
  not available in this userspace RDS.

Example:
  recv$ rds-stress -r 10.0.0.1
  send$ rds-stress -r 10.0.0.2 -s 10.0.0.1 -q 4096 -t 2 -d 2 -T 10

Exit status 0 on success, 1 on errors (a failed -v check, a peer that went
away, ...), 2 on bad usage.
";

/// Options that take a value.
const WITH_VALUE: &[&str] = &[
    "a",
    "ack-bytes",
    "q",
    "req-bytes",
    "d",
    "depth",
    "t",
    "tasks",
    "r",
    "recv-addr",
    "s",
    "send-addr",
    "p",
    "port",
    "T",
    "time",
    "Q",
    "tos",
    "connect-retries",
    "use-cong-monitor",
    "show-outliers",
    "abort-after",
    "D",
    "rdma-bytes",
    "I",
    "rdma-buffers",
    "M",
    "rdma-mode",
    "rdma-use-once",
    "rdma-use-get-mr",
    "rdma-use-fence",
    "rdma-use-notify",
    "rdma-cache-mrs",
    "rdma-alignment",
    "transport",
];

/// `--transport`: this side's SO_RDS_TRANSPORT for every task's socket.
static TRANSPORT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Flags.
const FLAGS: &[&str] = &[
    "c",
    "report-cpu",
    "z",
    "report-summary",
    "R",
    "rtprio",
    "v",
    "verify",
    "V",
    "trace",
    "o",
    "one-way",
    "show-params",
    "show-perfdata",
    "show-histogram",
    "cancel-sent-to",
    "disable-inq",
    "rdma-key-o-meter",
    "reset",
    "async",
    "always-bursty",
    "sync-always-bursty",
    "h",
    "help",
];

const RDMA_ERROR: &str = "RDMA needs the IB transport (--transport ib, or an address of an RDMA device, with \
                          rds-tools built with feature ib); RDS-TCP has no RDMA (drop -D/-I/-M/--rdma-* to test datagrams)";

/// The RDMA options: refused by a build without IB.
const RDMA_OPTS: &[&str] = &[
    "D",
    "rdma-bytes",
    "I",
    "rdma-buffers",
    "M",
    "rdma-mode",
    "rdma-use-once",
    "rdma-use-get-mr",
    "rdma-use-fence",
    "rdma-use-notify",
    "rdma-cache-mrs",
    "rdma-alignment",
    "rdma-key-o-meter",
];

/// Most local buffers of one RDMA op (`-I`; rds-ib's limit, the kernel's is 1024).
const MAX_RDMA_VECTOR: u32 = 64;

// Statistics cells, as the original's.
const S_REQ_TX: usize = 0;
const S_REQ_RX: usize = 1;
const S_ACK_TX: usize = 2;
const S_ACK_RX: usize = 3;
const S_MBI: usize = 4;
const S_MBO: usize = 5;
/// Nanoseconds per send call (shown as microseconds).
const S_SEND_NS: usize = 6;
/// Nanoseconds from request to ack (shown as microseconds).
const S_RTT_NS: usize = 7;
const NSTATS: usize = 8;

type Cells = [(u64, u64); NSTATS];

fn usage(msg: &str) -> ! {
    eprintln!("rds-stress: {msg}\n\n{HELP}");
    std::process::exit(2)
}

fn die(msg: &str) -> ! {
    let _ = std::io::stdout().flush();
    eprintln!("rds-stress: {msg}");
    std::process::exit(1)
}

fn die_errno(what: &str, e: &std::io::Error) -> ! {
    die(&format!("{what}, errno: {} ({})", e.raw_os_error().unwrap_or(0), errstr(e)))
}

/// The last value of any of `names`.
fn val<'a>(a: &'a Args, names: &[&str]) -> Option<&'a str> {
    a.opts.iter().rev().find(|(n, _)| names.contains(&n.as_str())).and_then(|(_, v)| v.as_deref())
}

fn flag(a: &Args, names: &[&str]) -> bool {
    names.iter().any(|n| a.has(n))
}

/// A number with K/M/G suffix (or 0x hex), at most `max`.
fn num(a: &Args, names: &[&str], max: u64) -> Option<u64> {
    val(a, names).map(|s| {
        let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
            Some(h) => u64::from_str_radix(h, 16).ok(),
            None => parse_size(s).ok(),
        };
        match v {
            Some(v) if v <= max => v,
            _ => die(&format!("invalid number '{s}'")),
        }
    })
}

/// A host name or dotted quad (IPv4 only).
fn parse_addr(s: &str) -> Ipv4Addr {
    match s.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => return a,
        Ok(IpAddr::V6(_)) => die(&format!("'{s}': IPv6 is not supported by this rds-stress yet")),
        Err(_) => {}
    }
    let found = (s, 0).to_socket_addrs().ok().and_then(|mut it| {
        it.find_map(|a| match a {
            SocketAddr::V4(v) => Some(*v.ip()),
            SocketAddr::V6(_) => None,
        })
    });
    found.unwrap_or_else(|| die(&format!("invalid host name or dotted quad '{s}'")))
}

/// What only this side uses (never sent to the peer).
#[derive(Clone, Default)]
struct Local {
    show_histogram: bool,
    rtt_threshold: Option<u64>,
    cancel_sent_to: bool,
}

fn main() {
    let mut all: Vec<&str> = WITH_VALUE.to_vec();
    all.extend_from_slice(FLAGS);
    let args = parse(std::env::args().skip(1), WITH_VALUE).unwrap_or_else(|e| usage(&e));
    let _ = TRANSPORT.set(args.get("transport").map(str::to_string));
    if flag(&args, &["h", "help"]) {
        print!("{HELP}");
        return;
    }
    if let Err(e) = args.check(&all) {
        usage(&e);
    }
    if let Some(o) = args.operands.first() {
        usage(&format!("unexpected argument '{o}'"));
    }
    let tcp_only = !cfg!(feature = "ib") || TRANSPORT.get().and_then(|t| t.as_deref()) == Some("tcp");
    if let Some((n, _)) = args.opts.iter().find(|(n, _)| RDMA_OPTS.contains(&n.as_str())).filter(|_| tcp_only) {
        let dash = if n.len() == 1 { "-" } else { "--" };
        die(&format!("{dash}{n}: {RDMA_ERROR}"));
    }
    for (opt, what) in [
        ("rdma-cache-mrs", "--rdma-cache-mrs is not implemented by this rds-stress"),
        ("rdma-alignment", "--rdma-alignment is not implemented by this rds-stress"),
        ("rdma-key-o-meter", "--rdma-key-o-meter is not implemented by this rds-stress"),
        ("reset", "--reset (RDS_CONN_RESET) is not available in this userspace RDS"),
        ("async", "--async (asynchronous sends, an Oracle RDS extension) is not available in this userspace RDS"),
        ("always-bursty", "--always-bursty is not implemented by this rds-stress"),
        ("sync-always-bursty", "--sync-always-bursty is not implemented by this rds-stress"),
    ] {
        if args.has(opt) {
            die(what);
        }
    }

    let mut o = WireOptions {
        req_depth: num(&args, &["d", "depth"], u32::MAX.into()).unwrap_or(1) as u32,
        req_size: num(&args, &["q", "req-bytes"], u32::MAX.into()).unwrap_or(1024) as u32,
        ack_size: num(&args, &["a", "ack-bytes"], u32::MAX.into()).unwrap_or(HEADER_SIZE as u64) as u32,
        rdma_size: num(&args, &["D", "rdma-bytes"], MAX_MSG_SIZE as u64).unwrap_or(0) as u32,
        rdma_vector: num(&args, &["I", "rdma-buffers"], MAX_RDMA_VECTOR.into()).unwrap_or(1) as u32,
        rw_mode: num(&args, &["M", "rdma-mode"], 2).unwrap_or(0) as u8,
        rdma_use_once: num(&args, &["rdma-use-once"], 1).unwrap_or(0) as u8,
        rdma_use_get_mr: num(&args, &["rdma-use-get-mr"], 1).unwrap_or(0) as u8,
        rdma_use_fence: num(&args, &["rdma-use-fence"], 1).unwrap_or(1) as u8,
        send_addr: Ipv4Addr::UNSPECIFIED,
        receive_addr: val(&args, &["r", "recv-addr"]).map_or(Ipv4Addr::UNSPECIFIED, parse_addr),
        starting_port: num(&args, &["p", "port"], u16::MAX.into()).unwrap_or(4000) as u16,
        nr_tasks: num(&args, &["t", "tasks"], u16::MAX.into()).unwrap_or(1) as u16,
        run_time: num(&args, &["T", "time"], u32::MAX.into()).unwrap_or(0) as u32,
        summary_only: flag(&args, &["z", "report-summary"]).into(),
        rtprio: flag(&args, &["R", "rtprio"]).into(),
        tracing: flag(&args, &["V", "trace"]).into(),
        verify: flag(&args, &["v", "verify"]).into(),
        show_params: args.has("show-params").into(),
        show_perfdata: args.has("show-perfdata").into(),
        use_cong_monitor: num(&args, &["use-cong-monitor"], 1).unwrap_or(1) as u8,
        simplex: flag(&args, &["o", "one-way"]).into(),
        connect_retries: num(&args, &["connect-retries"], u32::MAX.into()).unwrap_or(0) as u32,
        tos: num(&args, &["Q", "tos"], u8::MAX.into()).unwrap_or(0) as u8,
        ..WireOptions::default()
    };
    let local = Local {
        show_histogram: args.has("show-histogram"),
        rtt_threshold: num(&args, &["show-outliers"], u64::MAX),
        cancel_sent_to: args.has("cancel-sent-to"),
    };
    catch_signals();
    let soak = flag(&args, &["c", "report-cpu"]).then(start_soakers);
    if let Some(secs) = num(&args, &["abort-after"], u32::MAX.into()).filter(|s| *s > 0) {
        // SAFETY: alarm only arms a timer; SIGALRM's default action ends the process.
        unsafe { libc::alarm(secs as libc::c_uint) };
    }

    let code = match val(&args, &["s", "send-addr"]) {
        None => passive(o.receive_addr, o.starting_port, local, soak),
        Some(s) => {
            o.send_addr = parse_addr(s);
            check_sizes(&o);
            active(o, local, soak)
        }
    };
    std::process::exit(code);
}

/// What the active side checks before it sends its options (the passive
/// side checks the same on what it received).
fn check_sizes(o: &WireOptions) {
    for (what, opt, v) in [("ack size", "-a", o.ack_size), ("req size", "-q", o.req_size)] {
        if (v as usize) < HEADER_SIZE {
            die(&format!("{what} must be at least {HEADER_SIZE} bytes"));
        }
        if v as usize > MAX_MSG_SIZE {
            die(&format!("{what} must be at most {MAX_MSG_SIZE} bytes, the largest RDS message ({opt})"));
        }
    }
    if o.req_depth == 0 || o.req_depth > u32::from(u16::MAX) {
        die("depth must be 1 to 65535 (-d)");
    }
    if o.nr_tasks == 0 {
        die("at least one task is needed (-t)");
    }
    if o.rdma_size != 0 {
        if o.rdma_vector == 0 || o.rdma_vector > MAX_RDMA_VECTOR {
            die(&format!("RDMA buffers must be 1 to {MAX_RDMA_VECTOR} (-I)"));
        }
        if u64::from(o.rdma_size) * u64::from(o.rdma_vector) > MAX_MSG_SIZE as u64 {
            die(&format!("RDMA size times buffers must be at most {MAX_MSG_SIZE} bytes (-D, -I)"));
        }
        if o.rdma_size % 8 != 0 {
            die("RDMA size must be a multiple of 8 bytes (-D)");
        }
        if o.rw_mode > 2 {
            die("RDMA mode must be 0 (read and write), 1 (read) or 2 (write) (-M)");
        }
    }
    if u32::from(o.starting_port) + u32::from(o.nr_tasks) > u32::from(u16::MAX) {
        die(&format!(
            "ports {} to {} do not fit (-p, -t)",
            o.starting_port + 1,
            u32::from(o.starting_port) + u32::from(o.nr_tasks)
        ));
    }
}

fn flush() {
    let _ = std::io::stdout().flush();
}

// ---------------------------------------------------------------------------
// Control connection

fn active(mut o: WireOptions, local: Local, soak: Option<Soak>) -> i32 {
    if o.show_params != 0 {
        println!("Options:");
        println!("  {:<10} {:<7}", "Tasks", o.nr_tasks);
        println!("  {:<10} {:<7}", "Req size", o.req_size);
        println!("  {:<10} {:<7}", "ACK size", o.ack_size);
        println!("  {:<10} {:<7}", "RDMA size", o.rdma_size);
        let mut opts = Vec::new();
        for (on, name) in
            [(o.rdma_use_once, "use_once"), (o.rdma_use_get_mr, "use_get_mr"), (o.rdma_use_fence, "use_fence")]
        {
            if on != 0 {
                opts.push(name);
            }
        }
        println!("  {:<10} {}", "RDMA opts", if opts.is_empty() { " (defaults)".to_string() } else { opts.join(" ") });
        println!();
    }
    let target = SocketAddrV4::new(o.send_addr, o.starting_port);
    print!("connecting to {target}");
    flush();
    let mut retries = 0u32;
    let mut stream = loop {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
            .unwrap_or_else(|e| die_errno("socket(PF_INET, SOCK_STREAM) failed", &e));
        let _ = s.set_reuse_address(true);
        if let Err(e) = s.bind(&SocketAddr::from(SocketAddrV4::new(o.receive_addr, 0)).into()) {
            println!();
            die_errno("bind() failed", &e);
        }
        match s.connect(&SocketAddr::from(target).into()) {
            Ok(()) => break TcpStream::from(s),
            Err(e) => {
                if retries == 0 {
                    print!(": {}", errstr(&e));
                }
                let retry =
                    matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH));
                if retry && retries < o.connect_retries && !STOP.load(Relaxed) {
                    if retries == 0 {
                        print!(" - retrying");
                    }
                    retries += 1;
                    print!(".");
                    flush();
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
                println!();
                die(&format!("connect({}) failed", o.send_addr));
            }
        }
    };
    println!();
    if o.receive_addr.is_unspecified() {
        o.receive_addr = match stream.local_addr() {
            Ok(SocketAddr::V4(a)) => *a.ip(),
            _ => die("getsockname failed"),
        };
    }
    let _ = stream.set_nodelay(true);
    // No TOS: the first version of the options block, which every passive
    // side understands; else the second, which carries the TOS.
    let block = if o.tos != 0 { o.encode_v2() } else { o.encode_v1().to_vec() };
    peer_send(&mut stream, &block);
    let run = start_children(o, true, local);
    peer_send(&mut stream, &[0u8]);
    let mut ok = [0u8];
    peer_recv(&mut stream, &mut ok);
    println!("negotiated options, tasks will start in 2 seconds");
    release_children_and_wait(run, soak, stream)
}

fn passive(mut addr: Ipv4Addr, port: u16, local: Local, soak: Option<Soak>) -> i32 {
    if !addr.is_unspecified() {
        // Serve the address now: a waiting passive side answers rds-ping.
        let engine = Engine::global().unwrap_or_else(|e| die_errno("starting the RDS engine failed", &e));
        if let Err(e) = engine.serve(IpAddr::V4(addr)) {
            die(&bind_error(SocketAddr::new(IpAddr::V4(addr), port), &e));
        }
    }
    let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .unwrap_or_else(|e| die_errno("socket(PF_INET, SOCK_STREAM) failed", &e));
    let _ = l.set_reuse_address(true);
    if let Err(e) = l.bind(&SocketAddr::from(SocketAddrV4::new(addr, port)).into()) {
        die_errno("bind() failed", &e);
    }
    println!("waiting for incoming connection on {addr}:{port}");
    if let Err(e) = l.listen(255) {
        die_errno("listen() failed", &e);
    }
    // Wait in slices so SIGINT/SIGTERM end the wait.
    loop {
        if STOP.load(Relaxed) {
            die("interrupted while waiting for the active side");
        }
        if poll_in(l.as_raw_fd(), 200) {
            break;
        }
    }
    let (s, from) = l.accept().unwrap_or_else(|e| die_errno("accept() failed", &e));
    drop(l);
    let mut stream = TcpStream::from(s);
    let _ = stream.set_nodelay(true);
    print!("accepted connection from {}", from.as_socket().map_or("?".into(), |a| a.to_string()));
    if addr.is_unspecified() {
        match stream.local_addr() {
            Ok(SocketAddr::V4(a)) => {
                print!(" on {a}");
                addr = *a.ip();
            }
            _ => die("getsockname failed"),
        }
    }
    println!();
    // The options block: V2 starts with a version string, V1 with the depth.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut first = [0u8; VERSION_LEN];
    peer_recv(&mut stream, &mut first);
    let mut o = if is_version_string(&first) {
        let mut rest = [0u8; OPTIONS_V2_SIZE - VERSION_LEN];
        peer_recv(&mut stream, &mut rest);
        let mut v1 = [0u8; OPTIONS_V1_SIZE];
        v1.copy_from_slice(&rest[..OPTIONS_V1_SIZE]);
        let mut o = WireOptions::decode_v1(&v1);
        o.tos = rest[OPTIONS_V1_SIZE];
        o.async_send = rest[OPTIONS_V1_SIZE + 1];
        o
    } else {
        let mut v1 = [0u8; OPTIONS_V1_SIZE];
        v1[..VERSION_LEN].copy_from_slice(&first);
        peer_recv(&mut stream, &mut v1[VERSION_LEN..]);
        WireOptions::decode_v1(&v1)
    };
    if o.rdma_size != 0 && !cfg!(feature = "ib") {
        die(&format!("the active side asked for RDMA (-D {}): {RDMA_ERROR}", o.rdma_size));
    }
    if o.async_send != 0 {
        die("the active side asked for --async, which this userspace RDS does not have");
    }
    check_sizes(&o);
    // The sender gave us its send and receive addresses: swap them.
    o.send_addr = o.receive_addr;
    o.receive_addr = addr;
    let mut ok = [0u8];
    peer_recv(&mut stream, &mut ok);
    let run = start_children(o, false, local);
    peer_send(&mut stream, &[0u8]);
    let _ = stream.set_read_timeout(None);
    println!("negotiated options, tasks will start in 2 seconds");
    release_children_and_wait(run, soak, stream)
}

fn peer_send(s: &mut TcpStream, b: &[u8]) {
    if let Err(e) = s.write_all(b) {
        die_errno("Cannot send to peer", &e);
    }
}

fn peer_recv(s: &mut TcpStream, b: &mut [u8]) {
    if let Err(e) = s.read_exact(b) {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            die("Peer unexpectedly closed connection");
        }
        die_errno("Cannot recv from peer", &e);
    }
}

/// Whether `fd` became readable (or hung up) within `ms`.
fn poll_in(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0 && p.revents != 0
}

// ---------------------------------------------------------------------------
// Tasks

/// Counters one task shares with the reporting thread: per cell a number of
/// events and a sum.
struct TaskCtl {
    cur: [[AtomicU64; 2]; NSTATS],
    hist: [AtomicU64; MAX_BUCKETS],
    ready: AtomicBool,
}

impl TaskCtl {
    fn new() -> TaskCtl {
        TaskCtl {
            cur: std::array::from_fn(|_| [AtomicU64::new(0), AtomicU64::new(0)]),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
            ready: AtomicBool::new(false),
        }
    }

    fn inc(&self, cell: usize, v: u64) {
        self.cur[cell][0].fetch_add(1, Relaxed);
        self.cur[cell][1].fetch_add(v, Relaxed);
    }

    fn read(&self) -> Cells {
        std::array::from_fn(|i| (self.cur[i][0].load(Relaxed), self.cur[i][1].load(Relaxed)))
    }
}

/// What all tasks of this side share.
struct Run {
    /// The options as this side sees them: `receive_addr` ours,
    /// `send_addr` the peer's.
    o: WireOptions,
    local: Local,
    active: bool,
    /// The `-v` pattern, as long as the longest payload.
    pattern: Vec<u8>,
    ctl: Vec<TaskCtl>,
    start: OnceLock<Instant>,
    /// Stop sending (end of the run).
    stopping: AtomicBool,
    /// Leave.
    exit: AtomicBool,
    threads: std::sync::Mutex<Vec<JoinHandle<()>>>,
}

fn start_children(o: WireOptions, active: bool, local: Local) -> Arc<Run> {
    let max = o.req_size.max(o.ack_size) as usize;
    let run = Arc::new(Run {
        pattern: pattern(max - HEADER_SIZE),
        ctl: (0..o.nr_tasks).map(|_| TaskCtl::new()).collect(),
        o,
        local,
        active,
        start: OnceLock::new(),
        stopping: AtomicBool::new(false),
        exit: AtomicBool::new(false),
        threads: std::sync::Mutex::new(Vec::new()),
    });
    for i in 0..run.o.nr_tasks {
        let r = run.clone();
        let h = std::thread::Builder::new()
            .name(format!("rds-stress-{i}"))
            .spawn(move || Task::setup(r, i).run())
            .unwrap_or_else(|e| die_errno(&format!("starting task {i} failed"), &e));
        run.threads.lock().unwrap().push(h);
    }
    // A task that fails to set up ends the process with its reason.
    while !run.ctl.iter().all(|c| c.ready.load(Relaxed)) {
        std::thread::sleep(Duration::from_millis(5));
    }
    run
}

/// One peer task, as seen by one of our tasks.
struct Peer {
    dst: SocketAddrV4,
    /// Requests sent and not yet acked.
    pending: u32,
    /// Requests received and not yet acked.
    unacked: u32,
    /// Sends failed with ENOBUFS; wait for a congestion update.
    congested: bool,
    send_seq: u32,
    recv_seq: u32,
    send_index: u32,
    recv_index: u32,
    send_time: Vec<Instant>,
    ack_header: Vec<Header>,
    /// `-D`: the RDMA buffers of every pipeline slot.
    rdma: Option<RdmaSlots>,
}

/// RDMA state of one peer, per pipeline slot (`-D`).
struct RdmaSlots {
    /// As requester: the buffer the peer reads or writes, and its cookie
    /// (0 when none is registered).
    buf: Vec<RdmaBuf>,
    cookie: Vec<u64>,
    /// As responder: the local buffer of the op we run, whether it is in
    /// flight, and (op, pattern) to check a READ with `-v`.
    local: Vec<RdmaBuf>,
    inflight: Vec<bool>,
    issued: Vec<(u8, u64)>,
    next_op: u8,
}

/// Fills `buf` with the original's 64-bit RDMA pattern.
fn rdma_fill(buf: &RdmaBuf, pattern: u64) {
    let words: Vec<u8> = pattern.to_ne_bytes().iter().copied().cycle().take(buf.len() / 8 * 8).collect();
    buf.write_at(0, &words).expect("in range");
}

/// The offset of the first word of `buf` that is not `pattern`.
fn rdma_check(buf: &RdmaBuf, pattern: u64) -> Option<usize> {
    buf.to_vec().chunks_exact(8).position(|w| w != pattern.to_ne_bytes()).map(|i| i * 8)
}

/// Ancillary data of one send.
enum Extra {
    None,
    /// RDMA_MAP of a buffer, with its flags.
    Map(RdmaSeg, u32),
    /// RDMA_DEST cookie.
    Dest(u64),
    /// RDMA_ARGS.
    Op(RdmaOp),
}

struct Task {
    run: Arc<Run>,
    id: u16,
    me: SocketAddrV4,
    sock: RdsSocket,
    fd: RawFd,
    peers: Vec<Peer>,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    cong_monitor: bool,
}

macro_rules! trace {
    ($t:expr, $($a:tt)*) => {
        if $t.run.o.tracing != 0 {
            eprintln!($($a)*);
        }
    };
}

fn is_again(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOBUFS))
}

impl Task {
    /// The original's `rds_socket`: bind, buffers, congestion monitor,
    /// non-blocking, TOS.
    fn setup(run: Arc<Run>, id: u16) -> Task {
        let o = &run.o;
        let me = SocketAddrV4::new(o.receive_addr, o.starting_port + 1 + id);
        let sock = Engine::global()
            .and_then(|e| e.socket())
            .unwrap_or_else(|e| die_errno("socket(PF_RDS, SOCK_SEQPACKET) failed", &e));
        rds_tools::apply_transport(&sock, TRANSPORT.get().and_then(|t| t.as_deref())).unwrap_or_else(|e| die(&e));
        sock.bind(me.into()).unwrap_or_else(|e| die(&bind_error(me.into(), &e)));
        let warn = id == 0;
        let want = u64::from(o.nr_tasks) * u64::from(o.req_depth) * (u64::from(o.req_size) + u64::from(o.ack_size)) * 2;
        let bytes = want.min(i32::MAX as u64 / 2) as usize;
        sock.set_send_buffer_size_force(bytes)
            .unwrap_or_else(|e| die_errno(&format!("setsockopt(SNDBUF, {bytes}) failed"), &e));
        sock.set_recv_buffer_size_force(bytes)
            .unwrap_or_else(|e| die_errno(&format!("setsockopt(RCVBUF, {bytes}) failed"), &e));
        let snd = sock.send_buffer_size().unwrap_or_else(|e| die_errno("getsockopt(SNDBUF) failed", &e));
        if (snd as u64) / 2 < want && warn {
            eprintln!("getsockopt(SNDBUF) returned {snd}, we wanted {want} * 2");
        }
        let rcv = sock.recv_buffer_size().unwrap_or_else(|e| die_errno("getsockopt(RCVBUF) failed", &e));
        if (rcv as u64) / 2 < want && warn {
            eprintln!("getsockopt(RCVBUF) returned {rcv}, we need {want} * 2");
        }
        let mut cong_monitor = o.use_cong_monitor != 0;
        if cong_monitor {
            if let Err(e) = sock.set_cong_monitor(true) {
                if e.raw_os_error() != Some(libc::ENOPROTOOPT) {
                    die_errno("setsockopt(RDS_CONG_MONITOR) failed", &e);
                }
                if warn {
                    println!("Kernel does not support congestion monitoring; disabled");
                }
                cong_monitor = false;
            }
        }
        sock.set_nonblocking(true).unwrap_or_else(|e| die_errno("O_NONBLOCK failed", &e));
        if o.tos != 0 {
            sock.set_tos(o.tos).unwrap_or_else(|e| die_errno("ERROR: failed to set TOS", &e));
        }
        let fd = sock.as_raw_fd();
        let depth = o.req_depth as usize;
        let peers = (0..o.nr_tasks)
            .map(|j| Peer {
                dst: SocketAddrV4::new(o.send_addr, o.starting_port + 1 + j),
                pending: 0,
                unacked: 0,
                congested: false,
                send_seq: 0,
                recv_seq: 0,
                send_index: 0,
                recv_index: 0,
                send_time: vec![Instant::now(); depth],
                ack_header: vec![Header::default(); depth],
                rdma: (o.rdma_size != 0).then(|| {
                    let len = o.rdma_size as usize * o.rdma_vector as usize;
                    RdmaSlots {
                        buf: (0..depth).map(|_| RdmaBuf::new(len)).collect(),
                        cookie: vec![0; depth],
                        local: (0..depth).map(|_| RdmaBuf::new(len)).collect(),
                        inflight: vec![false; depth],
                        issued: vec![(0, 0); depth],
                        next_op: if o.rw_mode == 2 { RDMA_OP_WRITE } else { RDMA_OP_READ },
                    }
                }),
            })
            .collect();
        let max = o.req_size.max(o.ack_size) as usize;
        let mut sbuf = vec![0u8; max];
        if o.verify != 0 {
            sbuf[HEADER_SIZE..].copy_from_slice(&run.pattern);
        }
        let rbuf = vec![0u8; max];
        run.ctl[id as usize].ready.store(true, Relaxed);
        Task { id, me, sock, fd, peers, sbuf, rbuf, cong_monitor, run }
    }

    fn ctl(&self) -> &TaskCtl {
        &self.run.ctl[self.id as usize]
    }

    fn run(mut self) {
        // Sleep until we are supposed to start.
        let start = loop {
            if let Some(s) = self.run.start.get() {
                break *s;
            }
            if self.run.exit.load(Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let do_work = self.run.o.simplex == 0 || self.run.active;
        let mut events = libc::POLLIN | libc::POLLOUT;
        let mut cancelled = false;
        while !self.run.exit.load(Relaxed) {
            let mut pfd = libc::pollfd { fd: self.fd, events, revents: 0 };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 100) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                die_errno("poll failed", &e);
            }
            if r == 0 {
                // Nothing for a while: retry congested destinations in case
                // their update went by.
                for p in &mut self.peers {
                    p.congested = false;
                }
            }
            events = libc::POLLIN;
            if pfd.revents & libc::POLLIN != 0 {
                while self.recv_one() {}
            }
            if self.run.stopping.load(Relaxed) {
                if self.run.local.cancel_sent_to && STOP.load(Relaxed) && !cancelled {
                    cancelled = true;
                    self.cancel_sent_to();
                }
                continue;
            }
            // Keep the pipeline full.
            let can_send = pfd.revents & libc::POLLOUT != 0;
            for i in 0..self.peers.len() {
                if self.cong_monitor && self.peers[i].congested {
                    continue;
                }
                if let Err(e) = self.send_anything(i, can_send, do_work) {
                    events |= libc::POLLOUT;
                    // EAGAIN: our send buffer is full; ENOBUFS: this
                    // destination is congested, others may not be.
                    if e == libc::ENOBUFS {
                        self.peers[i].congested = true;
                    }
                }
            }
        }
    }

    fn cancel_sent_to(&self) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        for p in &self.peers {
            let t0 = Instant::now();
            if let Err(e) = self.sock.cancel_sent_to(p.dst.into()) {
                die_errno(&format!("RDS_CANCEL_SENT_TO[{}] failed", p.dst.port() - self.run.o.starting_port - 1), &e);
            }
            println!("RDS_CANCEL_SENT_TO({})[{tid}] took {} msec", p.dst, t0.elapsed().as_millis());
        }
    }

    /// Acks what we owe, then requests up to the depth. Err(errno) when a
    /// send would block (EAGAIN, ENOBUFS) or `can_send` is false.
    fn send_anything(&mut self, i: usize, can_send: bool, do_work: bool) -> Result<(), i32> {
        let depth = self.run.o.req_depth;
        while self.peers[i].unacked > 0 {
            if !can_send {
                return Err(libc::EAGAIN);
            }
            let p = &self.peers[i];
            let q = ((p.recv_index + depth - p.unacked) % depth) as usize;
            let mut h = p.ack_header[q];
            let extra = if h.rdma_op != 0 { self.rdma_ack_op(i, q, &h)? } else { Extra::None };
            self.send_packet(i, &mut h, self.run.o.ack_size as usize, extra)?;
            if h.rdma_op != 0 {
                if let Some(r) = self.peers[i].rdma.as_mut() {
                    r.inflight[q] = true;
                }
            }
            self.ctl().inc(S_ACK_TX, u64::from(self.run.o.ack_size));
            trace!(self, "ACK: {} -> {} seq {} index {}", self.me, self.peers[i].dst, h.seq, h.index);
            self.peers[i].unacked -= 1;
        }
        while do_work && self.peers[i].pending < depth {
            if !can_send {
                return Err(libc::EAGAIN);
            }
            let p = &self.peers[i];
            let mut h = Header {
                op: OP_REQ,
                from_addr: *self.me.ip(),
                from_port: self.me.port(),
                to_addr: *p.dst.ip(),
                to_port: p.dst.port(),
                index: p.send_index as u16,
                ..Header::default()
            };
            let extra = self.rdma_req(i, &mut h);
            let start = Instant::now();
            let n = self.send_packet(i, &mut h, self.run.o.req_size as usize, extra)?;
            let took = start.elapsed();
            let p = &mut self.peers[i];
            p.send_time[p.send_index as usize] = start;
            p.send_index = (p.send_index + 1) % depth;
            p.pending += 1;
            self.ctl().inc(S_REQ_TX, n as u64);
            self.ctl().inc(S_SEND_NS, took.as_nanos() as u64);
            trace!(self, "REQ: {} -> {} seq {} index {}", self.me, self.peers[i].dst, h.seq, h.index);
        }
        Ok(())
    }

    /// `-D`, requester: the RDMA fields of request `h` (`rdma_build_req`),
    /// its buffer prepared for `-v`, and how the cookie goes along.
    fn rdma_req(&mut self, i: usize, h: &mut Header) -> Extra {
        let o = &self.run.o;
        let (size, vector, mode, verify) = (o.rdma_size, o.rdma_vector, o.rw_mode, o.verify != 0);
        let (get_mr, use_once) = (o.rdma_use_get_mr != 0, o.rdma_use_once != 0);
        let p = &mut self.peers[i];
        let seq = p.send_seq;
        let Some(r) = p.rdma.as_mut() else { return Extra::None };
        let q = h.index as usize;
        h.rdma_op = r.next_op;
        r.next_op = match mode {
            0 => 3 - r.next_op,
            1 => RDMA_OP_READ,
            _ => RDMA_OP_WRITE,
        };
        h.rdma_pattern = (u64::from(seq) << 32) | u64::from(std::process::id());
        h.rdma_addr = r.buf[q].addr();
        h.rdma_size = size;
        h.rdma_vector = vector;
        if verify {
            let fill = if h.rdma_op == RDMA_OP_READ { h.rdma_pattern } else { 0 };
            rdma_fill(&r.buf[q], fill);
        }
        let len = r.buf[q].len() as u64;
        let flags = rdma_flags::READWRITE | if use_once { rdma_flags::USE_ONCE } else { 0 };
        let _ = len;
        if !get_mr {
            return Extra::Map(r.buf[q].all(), flags);
        }
        if r.cookie[q] == 0 {
            // The MR keeps the slot's buffer alive until it is released.
            r.cookie[q] = self
                .sock
                .get_mr(&r.buf[q].all(), flags)
                .unwrap_or_else(|e| rdma_die("setsockopt(RDS_GET_MR) failed", &e));
        }
        Extra::Dest(r.cookie[q])
    }

    /// `-D`, responder: the RDMA op that goes with the ack of slot `q`
    /// (`rdma_build_cmsg_xfer`); EAGAIN while the slot's previous op has
    /// not completed.
    fn rdma_ack_op(&mut self, i: usize, q: usize, h: &Header) -> Result<Extra, i32> {
        let o = &self.run.o;
        let (verify, fence, depth) = (o.verify != 0, o.rdma_use_fence != 0, o.req_depth as usize);
        let Some(r) = self.peers[i].rdma.as_mut() else { return Ok(Extra::None) };
        if r.inflight[q] {
            return Err(libc::EAGAIN);
        }
        let size = u64::from(h.rdma_size);
        // The peer's header sizes our vector: a vector beyond the slot's
        // buffer (both sides were given the same -D and -I) is the peer's
        // bug, never memory outside the buffer.
        let local = (0..h.rdma_vector as usize)
            .map(|v| r.local[q].seg(size as usize * v, size as usize))
            .collect::<Result<Vec<RdmaSeg>, _>>()
            .unwrap_or_else(|_| {
                die(&format!(
                    "a request asks for an RDMA of {} x {size} bytes, beyond the slot's {} (-D / -I differ?)",
                    h.rdma_vector,
                    r.local[q].len()
                ))
            });
        let mut flags = rdma_flags::NOTIFY_ME;
        if h.rdma_op == RDMA_OP_WRITE {
            flags |= rdma_flags::READWRITE;
            if verify {
                rdma_fill(&r.local[q], h.rdma_pattern);
            }
        } else if fence {
            flags |= rdma_flags::FENCE;
        }
        r.issued[q] = (h.rdma_op, h.rdma_pattern);
        Ok(Extra::Op(RdmaOp {
            remote_cookie: h.rdma_key,
            remote_addr: h.rdma_phyaddr,
            remote_len: size * u64::from(h.rdma_vector),
            local,
            flags,
            user_token: (i * depth + q) as u64,
        }))
    }

    /// Sends one message of `size` bytes with header `h` (its seq filled
    /// in here) to peer `i`, with `extra` as ancillary data.
    fn send_packet(&mut self, i: usize, h: &mut Header, size: usize, extra: Extra) -> Result<usize, i32> {
        let p = &mut self.peers[i];
        h.seq = p.send_seq;
        h.encode(&mut self.sbuf);
        let dst = p.dst.into();
        let q = h.index as usize;
        let res = match extra {
            Extra::None => self.sock.send_to(&self.sbuf[..size], dst),
            Extra::Dest(c) => self.sock.send_msg(
                &self.sbuf[..size],
                Some(dst),
                &SendFlags { rdma_dest: Some(c), ..SendFlags::default() },
            ),
            Extra::Op(op) => {
                self.sock.send_msg(&self.sbuf[..size], Some(dst), &SendFlags { rdma: Some(op), ..SendFlags::default() })
            }
            Extra::Map(seg, flags) => {
                match self.sock.send_rdma_map(&self.sbuf[..size], Some(dst), &seg, flags, &SendFlags::default()) {
                    Ok((n, cookie)) => {
                        if let Some(r) = p.rdma.as_mut() {
                            r.cookie[q] = cookie;
                        }
                        Ok(n)
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match res {
            Ok(n) if n == size => {
                p.send_seq = p.send_seq.wrapping_add(1);
                Ok(n)
            }
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => rdma_die(&format!("sendmsg({})", p.dst), &e),
            Ok(n) => die(&format!("sendto() truncated - {n}")),
            Err(e) if is_again(&e) => Err(e.raw_os_error().unwrap_or(libc::EAGAIN)),
            Err(e) => die_errno(&format!("sendto({}) failed", p.dst), &e),
        }
    }

    /// Receives one message or notification; false when there is none.
    fn recv_one(&mut self) -> bool {
        let m = match self.sock.recv_msg(&mut self.rbuf, RecvFlags::default()) {
            Ok(m) => m,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return false,
            Err(e) => die_errno("recvmsg() failed", &e),
        };
        let now = Instant::now();
        if let Some((token, status)) = m.rdma_status {
            self.rdma_completed(token, status);
            return true;
        }
        if let Some(mask) = m.cong_update {
            for p in &mut self.peers {
                if mask & (1u64 << (p.dst.port() % 64)) != 0 {
                    p.congested = false;
                }
            }
        }
        let Some(from) = m.from else { return true };
        let len = m.len;
        if len < HEADER_SIZE {
            die(&format!("recvmsg() returned short data: {len} (from {from})"));
        }
        let SocketAddr::V4(from) = from else { die(&format!("message from an IPv6 address {from}")) };
        let o = &self.run.o;
        let ti = i64::from(from.port()) - i64::from(o.starting_port) - 1;
        if ti < 0 || ti >= i64::from(o.nr_tasks) {
            die(&format!("received bad task index {ti} (a message from {from})"));
        }
        let ti = ti as usize;
        let depth = o.req_depth;
        let got = Header::decode(&self.rbuf[..len]).unwrap();
        let p = &self.peers[ti];
        let expect_index = match got.op {
            OP_REQ => {
                self.run.ctl[self.id as usize].inc(S_REQ_RX, len as u64);
                if len != o.req_size as usize {
                    die(&format!("req size {len}, not {} (from {from})", o.req_size));
                }
                p.recv_index
            }
            OP_ACK => {
                self.run.ctl[self.id as usize].inc(S_ACK_RX, len as u64);
                if len != o.ack_size as usize {
                    die(&format!("ack size {len}, not {} (from {from})", o.ack_size));
                }
                // The ack of the oldest outstanding request.
                (p.send_index + depth - p.pending) % depth
            }
            op => die(&format!("unknown op {op} (from {from})")),
        };
        let expected = Header {
            op: got.op,
            seq: p.recv_seq,
            from_addr: *from.ip(),
            from_port: from.port(),
            to_addr: *self.me.ip(),
            to_port: self.me.port(),
            index: expect_index as u16,
            ..Header::default()
        };
        if !expected.basic_eq(&got) {
            print!("{}", Header::mismatch_report(&expected, &got));
            die(&format!("header from {from} to id {} bogus", self.me.port()));
        }
        if got.rdma_op != 0 {
            if o.rdma_size == 0 {
                die(&format!("a message from {from} asks for RDMA: {RDMA_ERROR}"));
            }
            if got.rdma_size != o.rdma_size || got.rdma_vector != o.rdma_vector {
                die(&format!("Unexpected RDMA size {} x {} in a message from {from}", got.rdma_size, got.rdma_vector));
            }
            if got.rdma_op != RDMA_OP_READ && got.rdma_op != RDMA_OP_WRITE {
                die(&format!("Unexpected RDMA op {} in a message from {from}", got.rdma_op));
            }
            if got.op == OP_REQ && m.rdma_dest.is_none() {
                die(&format!("an RDMA request from {from} without a cookie (RDMA_DEST)"));
            }
        }
        if o.verify != 0 {
            let payload = &self.rbuf[HEADER_SIZE..len];
            if let Some((off, count)) = check_pattern(payload, &self.run.pattern) {
                let total = payload.len();
                println!(
                    "An incoming message has a corrupted payload at offset {off}; {count} out of {total} bytes corrupted"
                );
                let what = if got.op == OP_REQ { "request" } else { "ack" };
                die(&format!(
                    "-v: the {what} seq {} from {from} to {} is corrupted at payload offset {off} \
                     (message offset {}): {count} of {total} payload bytes differ from the pattern",
                    got.seq,
                    self.me,
                    off + HEADER_SIZE
                ));
            }
        }
        trace!(
            self,
            "recv {}: {} <- {from} seq {} index {}",
            if got.op == OP_REQ { "REQ" } else { "ACK" },
            self.me,
            got.seq,
            got.index
        );
        let me = self.me;
        let threshold = self.run.local.rtt_threshold;
        let histogram = self.run.local.show_histogram;
        let ctl = &self.run.ctl[self.id as usize];
        let p = &mut self.peers[ti];
        if got.op == OP_ACK {
            let rtt = now.saturating_duration_since(p.send_time[expect_index as usize]);
            ctl.inc(S_RTT_NS, rtt.as_nanos() as u64);
            let us = rtt.as_micros() as u64;
            if threshold.is_some_and(|t| us > t) {
                eprintln!("Found RTT = {us:#x}");
            }
            if histogram {
                ctl.hist[bucket(us)].fetch_add(1, Relaxed);
            }
            p.pending = p.pending.saturating_sub(1);
            if got.rdma_op != 0 {
                let q = expect_index as usize;
                let len = u64::from(got.rdma_size) * u64::from(got.rdma_vector);
                // WRITE: the peer wrote our buffer (RDMA in); READ: it read it.
                ctl.inc(if got.rdma_op == RDMA_OP_WRITE { S_MBI } else { S_MBO }, len);
                let (use_once, verify) = (self.run.o.rdma_use_once != 0, self.run.o.verify != 0);
                if let Some(r) = p.rdma.as_mut() {
                    if verify && got.rdma_op == RDMA_OP_WRITE {
                        if let Some(off) = rdma_check(&r.buf[q], got.rdma_pattern) {
                            die(&format!(
                                "-v: the RDMA WRITE of {from} into slot {q} differs from the pattern at offset {off}"
                            ));
                        }
                    }
                    if !use_once && r.cookie[q] != 0 {
                        self.sock
                            .free_mr(r.cookie[q], 0)
                            .unwrap_or_else(|e| die_errno("setsockopt(RDS_FREE_MR) failed", &e));
                    }
                    r.cookie[q] = 0;
                }
            }
        } else {
            // Build the ack right away; it is sent when the socket has room.
            let mut ack = Header {
                op: OP_ACK,
                from_addr: *me.ip(),
                from_port: me.port(),
                to_addr: *p.dst.ip(),
                to_port: p.dst.port(),
                index: p.recv_index as u16,
                ..Header::default()
            };
            if got.rdma_op != 0 {
                // rdma_build_ack: echo the request's RDMA fields; the
                // cookie came as RDMA_DEST.
                ack.rdma_op = got.rdma_op;
                ack.rdma_size = got.rdma_size;
                ack.rdma_vector = got.rdma_vector;
                ack.rdma_addr = got.rdma_addr;
                ack.rdma_phyaddr = got.rdma_phyaddr;
                ack.rdma_pattern = got.rdma_pattern;
                ack.rdma_key = m.rdma_dest.unwrap_or(0);
            }
            p.ack_header[p.recv_index as usize] = ack;
            p.unacked += 1;
            p.recv_index = (p.recv_index + 1) % depth;
        }
        p.recv_seq = p.recv_seq.wrapping_add(1);
        true
    }
}

impl Task {
    /// An RDMA notification (`rdma_mark_completed`): the slot is free again;
    /// with `-v` a READ's bytes are checked.
    fn rdma_completed(&mut self, token: u64, status: i32) {
        let depth = u64::from(self.run.o.req_depth);
        let (i, q) = ((token / depth) as usize, (token % depth) as usize);
        let verify = self.run.o.verify != 0;
        let Some(p) = self.peers.get_mut(i) else { die(&format!("RDMA notification with a bad token {token}")) };
        let Some(r) = p.rdma.as_mut() else { die("an RDMA notification without -D") };
        if status != 0 {
            let what = match status {
                1 => "remote error",
                2 => "operation was cancelled",
                3 => "operation was dropped",
                4 => "other error",
                _ => "unknown error",
            };
            println!("{}: RDMA op {q} failed: {what}", p.dst);
        } else if verify && r.issued[q].0 == RDMA_OP_READ {
            if let Some(off) = rdma_check(&r.local[q], r.issued[q].1) {
                die(&format!("-v: the RDMA READ from {} (slot {q}) differs from the pattern at offset {off}", p.dst));
            }
        }
        r.inflight[q] = false;
    }
}

fn rdma_die(what: &str, e: &std::io::Error) -> ! {
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        die(&format!("{what}: {}: {RDMA_ERROR}", errstr(e)));
    }
    die_errno(what, e)
}

// ---------------------------------------------------------------------------
// Reporting

fn sub(a: &Cells, b: &Cells) -> Cells {
    std::array::from_fn(|i| (a[i].0 - b[i].0, a[i].1 - b[i].1))
}

fn add(a: &mut Cells, b: &Cells) {
    for i in 0..NSTATS {
        a[i].0 += b[i].0;
        a[i].1 += b[i].1;
    }
}

/// What happened since the last snapshot, summed over the tasks.
fn snapshot(run: &Run, last: &mut [Cells]) -> Cells {
    let mut disp = [(0, 0); NSTATS];
    for (c, l) in run.ctl.iter().zip(last.iter_mut()) {
        let cur = c.read();
        add(&mut disp, &sub(&cur, l));
        *l = cur;
    }
    disp
}

fn throughput(d: &Cells) -> f64 {
    (d[S_REQ_TX].1 + d[S_REQ_RX].1 + d[S_ACK_TX].1 + d[S_ACK_RX].1) as f64
}

/// Average of a nanosecond cell, in microseconds.
fn avg_us(c: (u64, u64)) -> f64 {
    if c.0 == 0 { 0.0 } else { c.1 as f64 / c.0 as f64 / 1000.0 }
}

fn release_children_and_wait(run: Arc<Run>, mut soak: Option<Soak>, control: TcpStream) -> i32 {
    let o = run.o.clone();
    let tasks = u32::from(o.nr_tasks);
    let _ = run.start.set(Instant::now() + Duration::from_secs(2));
    // Two seconds for the tasks to come up, two more of burn-in.
    print!("Starting up");
    flush();
    let mut last = vec![[(0u64, 0u64); NSTATS]; run.ctl.len()];
    for _ in 0..4 {
        if STOP.load(Relaxed) {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        snapshot(&run, &mut last);
        cpu_use(&mut soak);
        print!(".");
        flush();
    }
    println!();
    let first_ts = Instant::now();
    let end = (o.run_time != 0 && run.active).then(|| first_ts + Duration::from_secs(o.run_time.into()));
    if o.rtprio != 0 {
        set_rt_priority();
    }
    let mut perf = (o.show_perfdata != 0).then(Perf::new);
    match &mut perf {
        Some(p) => println!(
            "::nr_tasks:count,req_size:bytes,ack_size:bytes,rdma_size:bytes,req_sent:count,thruput:kB/s,\
             thruput_rdma:kB/s,tx_delay:microseconds,rtt:microseconds,cpu:percent{}",
            p.sample(true)
        ),
        None => println!("{}", stats_header()),
    }
    let mut summary = [(0u64, 0u64); NSTATS];
    let mut cpu_total = 0.0;
    let mut last_ts = first_ts;
    let mut peer_gone = false;
    let fd = control.as_raw_fd();
    'run: loop {
        // One second, or until the control connection has news (the passive
        // side stops when the active side closes it; for the active side it
        // means the passive side went away).
        let until = Instant::now() + Duration::from_secs(1);
        loop {
            if STOP.load(Relaxed) {
                break 'run;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if poll_in(fd, (left.as_millis() as i32).clamp(1, 100)) {
                peer_gone = run.active;
                break 'run;
            }
        }
        let disp = snapshot(&run, &mut last);
        let now = Instant::now();
        let cpu = cpu_use(&mut soak);
        if o.summary_only == 0 {
            // Every loop takes a little more than a second: scale the rates
            // by the time that really passed.
            let scale = 1.0 / (now - last_ts).as_secs_f64();
            match &mut perf {
                None => println!(
                    "{}",
                    stats_line(
                        tasks,
                        disp[S_REQ_TX].0,
                        disp[S_REQ_RX].0,
                        scale * throughput(&disp) / 1024.0,
                        scale * disp[S_MBI].1 as f64 / 1024.0,
                        scale * disp[S_MBO].1 as f64 / 1024.0,
                        avg_us(disp[S_SEND_NS]),
                        avg_us(disp[S_RTT_NS]),
                        cpu,
                    )
                ),
                Some(p) => println!(
                    "::{},{},{},{},{},{:.6},{:.6},{:.6},{:.6},{:.6},{:.6}{}",
                    o.nr_tasks,
                    o.req_size,
                    o.ack_size,
                    o.rdma_size,
                    disp[S_REQ_TX].0,
                    scale * throughput(&disp) / 1024.0,
                    scale * disp[S_MBI].1 as f64 / 1024.0,
                    scale * disp[S_MBO].1 as f64 / 1024.0,
                    avg_us(disp[S_SEND_NS]),
                    avg_us(disp[S_RTT_NS]),
                    cpu.max(0.0),
                    p.sample(false)
                ),
            }
        }
        add(&mut summary, &disp);
        cpu_total += cpu;
        last_ts = now;
        if end.is_some_and(|e| now >= e) {
            break;
        }
    }
    drop(control);
    // Let everything stop sending, then end the tasks.
    run.stopping.store(true, Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    run.exit.store(true, Relaxed);
    for h in run.threads.lock().unwrap().drain(..) {
        let _ = h.join();
    }
    if o.summary_only == 0 {
        println!("---------------------------------------------");
    }
    let secs = (last_ts - first_ts).as_secs_f64();
    let scale = if secs > 0.0 { 1.0 / secs } else { 0.0 };
    println!(
        "{}  (average)",
        stats_line(
            tasks,
            (scale * summary[S_REQ_TX].0 as f64) as u64,
            (scale * summary[S_REQ_RX].0 as f64) as u64,
            scale * throughput(&summary) / 1024.0,
            scale * summary[S_MBI].1 as f64 / 1024.0,
            scale * summary[S_MBO].1 as f64 / 1024.0,
            avg_us(summary[S_SEND_NS]),
            avg_us(summary[S_RTT_NS]),
            if soak.is_some() { scale * cpu_total } else { -1.0 },
        )
    );
    if run.local.show_histogram {
        let mut h = [0u64; MAX_BUCKETS];
        for c in &run.ctl {
            for (b, v) in h.iter_mut().zip(c.hist.iter()) {
                *b += v.load(Relaxed);
            }
        }
        let total: u64 = h.iter().sum();
        println!("\nRTT histogram");
        println!("RTT (us)        \t\t    Count");
        for (i, n) in h.iter().enumerate() {
            let pct = if total > 0 { *n as f64 / total as f64 * 100.0 } else { 0.0 };
            println!("[{:>6} - {:>6}] \t\t {n:>8} \t\t ({pct:.2}%)", 1u64 << i, 1u64 << (i + 1));
        }
    }
    if peer_gone {
        eprintln!("rds-stress: the passive side closed the control connection before the end of the run");
        return 1;
    }
    0
}

fn set_rt_priority() {
    let p = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler reads one valid sched_param; 0 is this thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &p) } < 0 {
        die_errno("sched_setscheduler(SCHED_RR) failed", &std::io::Error::last_os_error());
    }
}

// ---------------------------------------------------------------------------
// CPU soak (-c)

/// One busy thread per CPU at the lowest priority, counting system calls:
/// what they did not get is what the rest of the host used.
struct Soaker {
    per_sec: AtomicU64,
    counter: AtomicU64,
}

struct Soak {
    soakers: Vec<Arc<Soaker>>,
    last: Vec<u64>,
}

fn start_soakers() -> Soak {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("started {n} cycle soaking threads");
    let soakers: Vec<Arc<Soaker>> =
        (0..n).map(|_| Arc::new(Soaker { per_sec: AtomicU64::new(1000), counter: AtomicU64::new(0) })).collect();
    for (i, s) in soakers.iter().enumerate() {
        let s = s.clone();
        let spawned = std::thread::Builder::new().name(format!("rds-stress-soak-{i}")).spawn(move || {
            // SAFETY: setpriority on our own thread id; gettid has no preconditions.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
            loop {
                let per_sec = s.per_sec.load(Relaxed);
                let t0 = Instant::now();
                for _ in 0..per_sec {
                    std::hint::black_box(std::process::id());
                    s.counter.fetch_add(1, Relaxed);
                }
                let rate = (per_sec as f64 / t0.elapsed().as_secs_f64().max(1e-9)) as u64;
                if rate > per_sec {
                    s.per_sec.store(rate, Relaxed);
                }
            }
        });
        if let Err(e) = spawned {
            die_errno("starting a soak thread failed", &e);
        }
    }
    let last = vec![0; n];
    Soak { soakers, last }
}

/// Percent of the host's CPU the soakers did not get since the last call;
/// -1 without -c.
fn cpu_use(soak: &mut Option<Soak>) -> f64 {
    let Some(s) = soak else { return -1.0 };
    let (mut capacity, mut soaked) = (0u64, 0u64);
    for (k, l) in s.soakers.iter().zip(s.last.iter_mut()) {
        let per_sec = k.per_sec.load(Relaxed);
        let now = k.counter.load(Relaxed);
        capacity += per_sec;
        soaked += per_sec.min(now - *l);
        *l = now;
    }
    if capacity == 0 { 0.0 } else { (capacity - soaked) as f64 * 100.0 / capacity as f64 }
}

// ---------------------------------------------------------------------------
// --show-perfdata

/// Rates of the engine's counters (the original reads RDS_INFO_COUNTERS)
/// and the host's CPU use from /proc/stat.
struct Perf {
    engine: Option<Engine>,
    prev: Vec<(String, u64)>,
    last: Instant,
    cpu_prev: Option<([u64; 8], u64, u64)>,
}

impl Perf {
    fn new() -> Perf {
        Perf { engine: Engine::global().ok(), prev: Vec::new(), last: Instant::now(), cpu_prev: None }
    }

    /// The header's names (`init`) or the values since the last call.
    fn sample(&mut self, init: bool) -> String {
        let cur = self.engine.as_ref().map(|e| e.counters()).unwrap_or_default();
        let now = Instant::now();
        let scale = 1.0 / (now - self.last).as_secs_f64().max(1e-9);
        let mut s = String::new();
        for (i, (name, v)) in cur.iter().enumerate() {
            if init {
                s += &format!(",{name}:{}", if name.contains("_bytes") { "bytes" } else { "count" });
            } else {
                let p = self.prev.get(i).map_or(0, |p| p.1);
                s += &format!(",{:.6}", v.saturating_sub(p) as f64 * scale);
            }
        }
        self.prev = cur;
        self.last = now;
        s += &self.sys_stats(init);
        s
    }

    /// user, system, idle, irq percent and interrupts since the last call.
    fn sys_stats(&mut self, init: bool) -> String {
        let Ok(stat) = std::fs::read_to_string("/proc/stat") else { return String::new() };
        let mut times = [0u64; 8];
        let mut other = 0u64;
        let mut intr = 0u64;
        for line in stat.lines() {
            if let Some(rest) = line.strip_prefix("cpu ") {
                for (j, v) in rest.split_whitespace().filter_map(|v| v.parse::<u64>().ok()).enumerate() {
                    if j < 8 {
                        times[j] = v;
                    } else {
                        other += v;
                    }
                }
            } else if let Some(rest) = line.strip_prefix("intr ") {
                intr = rest.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0);
            }
        }
        let prev = self.cpu_prev.replace((times, other, intr));
        if init {
            return ",user:percent,system:percent,idle:percent,irq:percent,intr:count".into();
        }
        let (pt, po, pi) = prev.unwrap_or(([0; 8], 0, 0));
        let d: Vec<u64> = (0..8).map(|j| times[j].saturating_sub(pt[j])).collect();
        let sum: u64 = d.iter().sum::<u64>() + other.saturating_sub(po);
        let scale = if sum > 0 { 100.0 / sum as f64 } else { 0.0 };
        format!(
            ",{:.6},{:.6},{:.6},{:.6},{}",
            (d[0] + d[1]) as f64 * scale,
            d[2] as f64 * scale,
            (d[3] + d[4]) as f64 * scale,
            (d[5] + d[6]) as f64 * scale,
            intr.saturating_sub(pi)
        )
    }
}
