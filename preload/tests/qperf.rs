//! Unmodified Debian `qperf`, client and server both under the shim:
//! `rds_bw` and `rds_lat` between 127.0.0.1 (client) and 127.0.0.2
//! (server), in a private network namespace. qperf's control connection is
//! plain TCP (passed through untouched); its server forks per test and the
//! child opens the RDS socket (the fork handler); each test ends with
//! SIGALRM interrupting a blocking read (EINTR). The figures are parsed and
//! checked non-zero and sane: bandwidth above 1 MB/s, latency below 10 ms.
//! Skips (SKIP line) only when qperf is missing; scripts/setup.sh installs it.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Proc, preloaded, private_net, program};

/// Bytes per second from qperf's `bw = 12.3 MB/sec`.
fn bandwidth(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.trim_start().starts_with("bw"))?;
    let mut f = line.split('=').nth(1)?.split_whitespace();
    let v: f64 = f.next()?.parse().ok()?;
    let scale = match f.next()? {
        "bytes/sec" => 1.0,
        "KB/sec" => 1e3,
        "MB/sec" => 1e6,
        "GB/sec" => 1e9,
        _ => return None,
    };
    Some(v * scale)
}

/// Seconds from qperf's `latency = 45.6 us`.
fn latency(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.trim_start().starts_with("latency"))?;
    let mut f = line.split('=').nth(1)?.split_whitespace();
    let v: f64 = f.next()?.parse().ok()?;
    let scale = match f.next()? {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "sec" => 1.0,
        _ => return None,
    };
    Some(v * scale)
}

/// `a` is within a millionth of `b`.
fn close_to(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() <= b.abs() * 1e-6)
}

#[test]
fn parses_qperf_figures() {
    assert!(close_to(bandwidth("rds_bw:\n    bw  =  123 MB/sec\n"), 123e6));
    assert!(close_to(bandwidth("    bw  =  1.5 GB/sec\n"), 1.5e9));
    assert!(close_to(bandwidth("    bw  =  900 KB/sec\n"), 9e5));
    assert!(close_to(latency("rds_lat:\n    latency  =  45.5 us\n"), 45.5e-6));
    assert!(close_to(latency("    latency  =  2 ms\n"), 2e-3));
    assert!(close_to(latency("    latency  =  800 ns\n"), 8e-7));
    assert_eq!(bandwidth("    bw  =  12 furlongs\n"), None);
    assert_eq!(latency("nothing here"), None);
}

/// Runs `qperf <test>` against a qperf server, both preloaded; returns the
/// client's output.
///
/// qperf's server sends the client the port of its second TCP connection
/// (the one that tells each side the other's RDS address) before it calls
/// `listen` on it. The client, woken by that port, connects at once; when
/// the scheduler wakes it on the server's CPU it preempts the server between
/// the two calls and is refused ("connect failed: Connection refused"),
/// before any RDS socket exists. With both pinned to one CPU that is every
/// run (20 of 20 on the host); unpinned, 2 to 5 of 20, and all of CI's three
/// tries once. The client therefore runs as `SCHED_BATCH` ([`batch`]), which
/// takes wake-up preemption away from it: 0 of 20 refused, pinned to one
/// CPU or not. A refused run is still repeated (at most five tries);
/// anything else fails at once.
fn run(qperf: &Path, test: &str, extra: &[&str]) -> String {
    let port = "19766";
    let server = Proc::spawn("qperf server", preloaded(qperf).args(["-lp", port]));
    std::thread::sleep(Duration::from_millis(300));
    let mut last = String::new();
    for attempt in 1..=5 {
        let mut cmd = preloaded(qperf);
        batch(&mut cmd);
        cmd.args(["127.0.0.2", "-lp", port, "-t", "2", "-to", "10"]).args(extra).arg(test);
        let (code, out, err) = Proc::spawn("qperf client", &mut cmd).finish(Duration::from_secs(40));
        println!("client, try {attempt}: exit {code:?}\n{out}{err}");
        if code == Some(0) {
            let (sout, serr) = server.kill();
            println!("server:\n{sout}{serr}");
            return out;
        }
        last = format!("exit {code:?} (None: killed after 40 s): {out}{err}");
        if !format!("{out}{err}").contains("connect failed: Connection refused") {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let (sout, serr) = server.kill();
    panic!("qperf {test} failed: {last}\nserver:\n{sout}{serr}");
}

/// Starts `cmd` under `SCHED_BATCH` (see [`run`]): a woken batch task does
/// not preempt the one running on its CPU.
fn batch(cmd: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec and makes
    // one system call (sched_setscheduler, async-signal-safe) on a local.
    unsafe {
        cmd.pre_exec(|| {
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn qperf_rds_bw_and_rds_lat_under_the_shim() {
    let Some(qperf) = program("/usr/bin/qperf", "qperf_rds_bw_and_rds_lat_under_the_shim") else { return };
    private_net();
    let out = run(&qperf, "rds_bw", &["-m", "8192"]);
    let bw = bandwidth(&out).unwrap_or_else(|| panic!("no bandwidth in {out:?}"));
    assert!(bw > 1e6, "rds_bw {bw} B/s, want above 1 MB/s");
    let out = run(&qperf, "rds_lat", &[]);
    let lat = latency(&out).unwrap_or_else(|| panic!("no latency in {out:?}"));
    assert!(lat > 0.0 && lat < 10e-3, "rds_lat {lat} s, want below 10 ms");
    println!("rds_bw {:.1} MB/s, rds_lat {:.1} us", bw / 1e6, lat * 1e6);
}
