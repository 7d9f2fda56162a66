//! rds-stress: the stress test and benchmark of rds-tools, on this
//! userspace RDS. Same model, options, header, pattern and output as the
//! original; tasks are threads instead of forked processes.
//!
//! Its parts: `options` (--help, the options and their checks, the error
//! exits), `control` (the TCP control connection between the active and
//! the passive side), `task` (the tasks: requests and acks over RDS, and
//! `task::rdma` for `-D`), `report` (the statistics and the output lines),
//! `soak` (`-c`) and `perf` (`--show-perfdata`); the wire formats and the
//! arithmetic are in the library (`rds_tools::stress`). `main` parses the
//! command line and runs the passive or the active side.

mod control;
mod options;
mod perf;
mod report;
mod soak;
mod task;

use std::io::Write;
use std::net::Ipv4Addr;

use rds_tools::stress::{HEADER_SIZE, MAX_MSG_SIZE, WireOptions};
use rds_tools::{catch_signals, parse};

use control::{active, passive};
use options::{
    FLAGS, HELP, Local, MAX_RDMA_VECTOR, RDMA_ERROR, RDMA_OPTS, TRANSPORT, WITH_VALUE, check_sizes, die, flag, num,
    parse_addr, usage, val,
};
use soak::start_soakers;

fn main() {
    rds_tools::default_sigpipe();
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

fn flush() {
    let _ = std::io::stdout().flush();
}
