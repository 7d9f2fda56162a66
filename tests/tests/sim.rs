//! The deterministic fault simulator of rds-core (`tests/src/sim`):
//! 10,000 seeds in release builds (about a minute on two cores), 200 in
//! debug builds. `RDS_SIM_SEEDS` and `RDS_SIM_FROM` choose other seeds. A
//! failure names each failing seed and the command that replays it with a
//! trace of every event.
//!
//! Besides those fixed seeds, each commit runs 5,000 more (100 in debug
//! builds; `RDS_SIM_WINDOW_SEEDS`) from a window its hash chooses among
//! seeds 1,000,000 and up: the same seeds every run of one commit, other
//! seeds at the next. Failures one seed in 100,000 hides (long runs found
//! four such) then turn up over the commits, not only in a long run by
//! hand.

use rds_tests::sim;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn every_seed_holds_the_delivery_invariant() {
    let seeds = env("RDS_SIM_SEEDS").unwrap_or(if cfg!(debug_assertions) { 200 } else { 10_000 });
    let from = env("RDS_SIM_FROM").unwrap_or(0);
    check(from, seeds, "");
}

#[test]
fn the_commits_window_of_seeds_holds_it_too() {
    let seeds = env("RDS_SIM_WINDOW_SEEDS").unwrap_or(if cfg!(debug_assertions) { 100 } else { 5_000 });
    let Some(commit) = head_commit() else {
        eprintln!("rds-sim: SKIP the commit's window of seeds: no git commit here (not a clone)");
        return;
    };
    let from = window_start(&commit);
    check(from, seeds, &format!(" (the window of commit {})", &commit[..12]));
}

/// The commit checked out here, from `git rev-parse HEAD` in this crate's
/// directory; None outside a git clone.
fn head_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let h = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && h.len() >= 12 && h.bytes().all(|b| b.is_ascii_hexdigit())).then_some(h)
}

/// The first seed of a commit's window: 1,000,000 plus its hash's first
/// 12 hex digits modulo 10^9, in thousands (a window never overlaps the
/// fixed seeds, and two commits' windows of 5,000 seldom overlap).
fn window_start(commit: &str) -> u64 {
    let h = u64::from_str_radix(&commit[..12], 16).unwrap_or(0);
    1_000_000 + h % 1_000_000_000 / 1000 * 1000
}

#[test]
fn windows_differ_between_commits_and_miss_the_fixed_seeds() {
    let a = window_start("1782bf8c0ffee0000000000000000000000000000");
    let b = window_start("9917f5c0ffee00000000000000000000000000000");
    assert_ne!(a, b);
    assert!(a >= 1_000_000 && b >= 1_000_000 && a % 1000 == 0);
    assert_eq!(a, window_start("1782bf8c0ffee0000000000000000000000000000"));
}

/// Runs seeds `from..from + seeds` and fails with every failing seed and
/// its replay command.
fn check(from: u64, seeds: u64, what: &str) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    let t0 = std::time::Instant::now();
    let b = sim::run_range(from, from + seeds, threads, 10);
    eprintln!(
        "rds-sim: {} seeds from {from}{what} in {:.1} s on {threads} threads: {} messages accepted, {} delivered, {} flushed, {} resets, {} restarts",
        b.seeds,
        t0.elapsed().as_secs_f64(),
        b.accepted,
        b.delivered,
        b.flushed,
        b.resets,
        b.restarts
    );
    if !b.failures.is_empty() {
        let mut msg = String::new();
        for (seed, e) in &b.failures {
            msg +=
                &format!("seed {seed}: {}\n  replay: {}\n", e.lines().next().unwrap_or(""), sim::replay_command(*seed));
        }
        panic!("{} seed(s) failed{what}:\n{msg}", b.failures.len());
    }
    assert_eq!(b.seeds, seeds);
    // The runs did something: messages, faults, restarts.
    assert!(b.accepted > 100 * seeds, "{} messages for {seeds} seeds", b.accepted);
    assert!(b.resets > seeds && b.restarts > seeds / 4, "{} resets, {} restarts", b.resets, b.restarts);
    assert!(b.delivered * 100 > b.accepted * 95, "{} of {} delivered", b.delivered, b.accepted);
}

#[test]
fn a_seed_replays_event_for_event() {
    let a = sim::run_seed(7, false).unwrap();
    let b = sim::run_seed(7, false).unwrap();
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    assert!(a.events > 1000 && a.accepted > 100, "{a:?}");
    let c = sim::run_seed(8, false).unwrap();
    assert_ne!(format!("{a:?}"), format!("{c:?}"), "seeds differ");
}
