//! The deterministic fault simulator of rds-core (`tests/src/sim`):
//! 10,000 seeds in release builds (about a minute on two cores), 200 in
//! debug builds. `RDS_SIM_SEEDS` and `RDS_SIM_FROM` choose other seeds. A
//! failure names each failing seed and the command that replays it with a
//! trace of every event.

use rds_tests::sim;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn every_seed_holds_the_delivery_invariant() {
    let seeds = env("RDS_SIM_SEEDS").unwrap_or(if cfg!(debug_assertions) { 200 } else { 10_000 });
    let from = env("RDS_SIM_FROM").unwrap_or(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    let t0 = std::time::Instant::now();
    let b = sim::run_range(from, from + seeds, threads, 10);
    eprintln!(
        "rds-sim: {} seeds from {from} in {:.1} s on {threads} threads: {} messages accepted, {} delivered, {} flushed, {} resets, {} restarts",
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
        panic!("{} seed(s) failed:\n{msg}", b.failures.len());
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
