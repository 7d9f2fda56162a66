//! `-c`: CPU soak threads, what they did not get is the CPU the rest of
//! the host used.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use crate::options::die_errno;

/// One busy thread per CPU at the lowest priority, counting system calls:
/// what they did not get is what the rest of the host used.
struct Soaker {
    per_sec: AtomicU64,
    counter: AtomicU64,
}

pub struct Soak {
    soakers: Vec<Arc<Soaker>>,
    last: Vec<u64>,
}

pub fn start_soakers() -> Soak {
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
pub fn cpu_use(soak: &mut Option<Soak>) -> f64 {
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
