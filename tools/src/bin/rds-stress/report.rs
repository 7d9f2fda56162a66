//! Reporting: the statistics cells every task counts into, and the run as
//! the reporting thread sees it ([`release_children_and_wait`]): start-up
//! and burn-in, the per-second and summary lines, the end of the run over
//! the control connection, the histogram of `--show-histogram`.

use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use rds_tools::STOP;
use rds_tools::stress::{MAX_BUCKETS, stats_header, stats_line};

use crate::control::poll_in;
use crate::flush;
use crate::options::die_errno;
use crate::perf::Perf;
use crate::soak::{Soak, cpu_use};
use crate::task::Run;

// Statistics cells, as the original's.
pub const S_REQ_TX: usize = 0;
pub const S_REQ_RX: usize = 1;
pub const S_ACK_TX: usize = 2;
pub const S_ACK_RX: usize = 3;
pub const S_MBI: usize = 4;
pub const S_MBO: usize = 5;
/// Nanoseconds per send call (shown as microseconds).
pub const S_SEND_NS: usize = 6;
/// Nanoseconds from request to ack (shown as microseconds).
pub const S_RTT_NS: usize = 7;
pub const NSTATS: usize = 8;

pub type Cells = [(u64, u64); NSTATS];

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

pub fn release_children_and_wait(run: Arc<Run>, mut soak: Option<Soak>, control: TcpStream) -> i32 {
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
