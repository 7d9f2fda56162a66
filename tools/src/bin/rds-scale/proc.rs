//! What /proc says of this process: memory, threads, CPU time per thread.

/// A `Key:  value kB` line of /proc/self/status or smaps_rollup.
fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
}

/// Resident set size, kB (VmRSS).
pub fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|t| field(&t, "VmRSS")).unwrap_or(0)
}

/// Proportional set size, kB (Pss of /proc/self/smaps_rollup).
pub fn pss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup").ok().and_then(|t| field(&t, "Pss")).unwrap_or(0)
}

/// The thread count of /proc/self/status.
pub fn threads() -> u64 {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|t| field(&t, "Threads")).unwrap_or(0)
}

/// Clock ticks per second of /proc's CPU times.
fn clk_tck() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// (name, utime + stime) of one /proc/.../stat line, in ticks.
fn task_times(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat[open + 1..close].to_string();
    // After ") ": state is field 3; utime and stime are fields 14 and 15.
    let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let ut: u64 = rest.get(11)?.parse().ok()?;
    let st: u64 = rest.get(12)?.parse().ok()?;
    Some((name, ut + st))
}

/// (name, CPU time in ms) of the /proc stat file at `path`.
fn stat_cpu_ms(path: impl AsRef<std::path::Path>) -> Option<(String, u64)> {
    let (name, ticks) = task_times(&std::fs::read_to_string(path).ok()?)?;
    Some((name, ticks * 1000 / clk_tck()))
}

/// CPU time of the whole process (threads that ended included), ms.
pub fn process_cpu_ms() -> u64 {
    stat_cpu_ms("/proc/self/stat").map_or(0, |(_, ms)| ms)
}

/// CPU time of the calling thread, ms.
pub fn thread_cpu_ms() -> u64 {
    stat_cpu_ms("/proc/thread-self/stat").map_or(0, |(_, ms)| ms)
}

/// CPU time of each thread of this process, milliseconds, by thread id.
pub fn task_cpu_ms() -> Vec<(u32, String, u64)> {
    let mut v = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for e in dir.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some((name, ms)) = stat_cpu_ms(e.path().join("stat")) {
                v.push((tid, name, ms));
            }
        }
    }
    v.sort();
    v
}

/// `name:ms,name:ms,...` of the threads, for a stat answer (names have no
/// spaces: ours are rds-tcp-N, rds-timer, rds-info, scale-rx-N, rds-scale).
pub fn tasks_word() -> String {
    task_cpu_ms()
        .iter()
        .map(|(tid, n, ms)| format!("{}#{tid}:{ms}", n.replace([' ', ',', ':', '#'], "_")))
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses [`tasks_word`]: (name#tid, ms).
pub fn parse_tasks(w: &str) -> Vec<(String, u64)> {
    w.split(',')
        .filter_map(|t| t.rsplit_once(':'))
        .filter_map(|(n, ms)| Some((n.to_string(), ms.parse().ok()?)))
        .collect()
}

/// Per-thread CPU between two [`parse_tasks`] (threads of `after` only),
/// as `name:percent of the wall time` words, busiest first, and the sum in
/// percent.
pub fn cpu_between(before: &[(String, u64)], after: &[(String, u64)], wall_ms: u64) -> (String, f64) {
    let wall = wall_ms.max(1) as f64;
    let mut d: Vec<(String, u64)> = after
        .iter()
        .map(|(n, ms)| (n.clone(), ms - before.iter().find(|(b, _)| b == n).map_or(0, |(_, b)| *b).min(*ms)))
        .collect();
    d.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let total: u64 = d.iter().map(|(_, ms)| ms).sum();
    let words: Vec<String> = d
        .iter()
        .filter(|(_, ms)| *ms > 0)
        .map(|(n, ms)| format!("{}:{:.0}%", n.split('#').next().unwrap_or(n), *ms as f64 * 100.0 / wall))
        .collect();
    (if words.is_empty() { "-".to_string() } else { words.join(",") }, total as f64 * 100.0 / wall)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_status_fields() {
        let t = "Name:\trds-scale\nVmRSS:\t   12345 kB\nThreads:\t7\n";
        assert_eq!(field(t, "VmRSS"), Some(12345));
        assert_eq!(field(t, "Threads"), Some(7));
        assert_eq!(field(t, "Pss"), None);
        assert!(rss_kb() > 0);
        assert!(threads() >= 1);
    }

    #[test]
    fn reads_task_times_with_odd_names() {
        let line = "4242 (rds tcp) 0) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(task_times(line), Some(("rds tcp) 0".to_string(), 300)));
        let me = task_cpu_ms();
        assert!(!me.is_empty());
        // Spin until this thread has been charged some CPU time.
        let t0 = std::time::Instant::now();
        while thread_cpu_ms() == 0 && t0.elapsed() < std::time::Duration::from_secs(5) {}
        let thread = thread_cpu_ms();
        assert!(thread > 0);
        // The process's time is read after the thread's (it only grows);
        // the kernel converts user and system time to ticks separately,
        // so each side may be short by up to a tick of each.
        let process = process_cpu_ms();
        let tick_ms = 1000 / clk_tck();
        assert!(process + 2 * tick_ms >= thread, "process {process} ms, thread {thread} ms");
    }

    #[test]
    fn cpu_between_counts_deltas_busiest_first() {
        let before = vec![("rds-tcp-0#1".to_string(), 100), ("main#2".to_string(), 50)];
        let after =
            vec![("rds-tcp-0#1".to_string(), 600), ("main#2".to_string(), 50), ("scale-tx-0#3".to_string(), 800)];
        let (words, total) = cpu_between(&before, &after, 1000);
        assert_eq!(words, "scale-tx-0:80%,rds-tcp-0:50%");
        assert!((total - 130.0).abs() < 1e-9);
        assert_eq!(parse_tasks("a#1:10,b_c#2:0"), vec![("a#1".to_string(), 10), ("b_c#2".to_string(), 0)]);
    }
}
