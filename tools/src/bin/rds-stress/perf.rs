//! `--show-perfdata`: rates of the engine's counters and the host's CPU
//! use.

use std::time::Instant;

use rds_sock::Engine;

/// Rates of the engine's counters (the original reads RDS_INFO_COUNTERS)
/// and the host's CPU use from /proc/stat.
pub struct Perf {
    engine: Option<Engine>,
    prev: Vec<(String, u64)>,
    last: Instant,
    cpu_prev: Option<([u64; 8], u64, u64)>,
}

impl Perf {
    pub fn new() -> Perf {
        Perf { engine: Engine::global().ok(), prev: Vec::new(), last: Instant::now(), cpu_prev: None }
    }

    /// The header's names (`init`) or the values since the last call.
    pub fn sample(&mut self, init: bool) -> String {
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
