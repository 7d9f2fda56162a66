//! The command line: --help, the options rds-tools' rds-stress takes (and
//! those refused here), their values, the checks of the sizes, and the
//! error exits.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use rds_tools::stress::{HEADER_SIZE, MAX_MSG_SIZE, WireOptions};
use rds_tools::{Args, errstr, parse_size};

pub const HELP: &str = "\
usage: rds-stress [-r addr] [-p port] [-c]                       (passive side)
       rds-stress -s addr [-r addr] [-p port] [options]          (active side)

Stress test and benchmark of RDS, after rds-tools' rds-stress, running on
this userspace RDS (RDS over TCP). The passive side waits on a TCP control
connection at addr:port; the active side connects and sends its options,
and both sides start -t tasks, each an RDS socket bound to (own address,
port+1+i). Every task keeps -d requests in flight to every task of the other
side, and answers every request with an ack. Tasks are threads of one
process (the original forks a process per task); each task polls its
socket's readiness descriptor, as the original polls its non-blocking socket
(with the socket's own poll, which reads the connection the answers come on
while it waits, as a blocking receive does).

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
pub const WITH_VALUE: &[&str] = &[
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
pub static TRANSPORT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// Flags.
pub const FLAGS: &[&str] = &[
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

pub const RDMA_ERROR: &str = "RDMA needs the IB transport (--transport ib, or an address of an RDMA device, with \
                          rds-tools built with feature ib); RDS-TCP has no RDMA (drop -D/-I/-M/--rdma-* to test datagrams)";

/// The RDMA options: refused by a build without IB.
pub const RDMA_OPTS: &[&str] = &[
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
pub const MAX_RDMA_VECTOR: u32 = 64;

pub fn usage(msg: &str) -> ! {
    eprintln!("rds-stress: {msg}\n\n{HELP}");
    std::process::exit(2)
}

pub fn die(msg: &str) -> ! {
    let _ = std::io::stdout().flush();
    eprintln!("rds-stress: {msg}");
    std::process::exit(1)
}

pub fn die_errno(what: &str, e: &std::io::Error) -> ! {
    die(&format!("{what}, errno: {} ({})", e.raw_os_error().unwrap_or(0), errstr(e)))
}

/// The last value of any of `names`.
pub fn val<'a>(a: &'a Args, names: &[&str]) -> Option<&'a str> {
    a.opts.iter().rev().find(|(n, _)| names.contains(&n.as_str())).and_then(|(_, v)| v.as_deref())
}

pub fn flag(a: &Args, names: &[&str]) -> bool {
    names.iter().any(|n| a.has(n))
}

/// A number with K/M/G suffix (or 0x hex), at most `max`.
pub fn num(a: &Args, names: &[&str], max: u64) -> Option<u64> {
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
pub fn parse_addr(s: &str) -> Ipv4Addr {
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
pub struct Local {
    pub show_histogram: bool,
    pub rtt_threshold: Option<u64>,
    pub cancel_sent_to: bool,
}

/// What the active side checks before it sends its options (the passive
/// side checks the same on what it received).
pub fn check_sizes(o: &WireOptions) {
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
