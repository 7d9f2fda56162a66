//! rds-sim: runs the deterministic fault simulator of rds-core.
//!
//!     rds-sim --seeds N [--from S] [--threads T]   run seeds S..S+N
//!     rds-sim --replay SEED [-v]                   one seed, -v traces every event
//!
//! Exits 1 if any seed breaks an invariant, printing the seed and the
//! command that replays it.

use std::process::ExitCode;
use std::time::Instant;

use rds_tests::sim::{self, Params};

fn usage() -> ExitCode {
    eprintln!("usage: rds-sim --seeds N [--from S] [--threads T] | --replay SEED [-v]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds = None;
    let mut from = 0u64;
    let mut threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut replay = None;
    let mut verbose = false;
    let mut i = 0;
    while i < args.len() {
        let val = |i: usize| args.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match args[i].as_str() {
            "--seeds" => match val(i) {
                Some(v) => seeds = Some(v),
                None => return usage(),
            },
            "--from" => match val(i) {
                Some(v) => from = v,
                None => return usage(),
            },
            "--threads" => match val(i) {
                Some(v) => threads = v as usize,
                None => return usage(),
            },
            "--replay" => match val(i) {
                Some(v) => replay = Some(v),
                None => return usage(),
            },
            "-v" | "--verbose" => {
                verbose = true;
                i += 1;
                continue;
            }
            "-h" | "--help" => {
                let _ = usage();
                return ExitCode::SUCCESS;
            }
            _ => return usage(),
        }
        i += 2;
    }
    if let Some(seed) = replay {
        eprintln!("seed {seed}: {:?}", Params::from_seed(seed));
        return match sim::run_seed(seed, verbose) {
            Ok(r) => {
                println!("seed {seed}: ok {r:?}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("seed {seed} FAILED: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let Some(n) = seeds else { return usage() };
    let t0 = Instant::now();
    let b = sim::run_range(from, from + n, threads, 20);
    let dt = t0.elapsed();
    println!(
        "{} seeds in {:.1} s ({:.2} ms/seed on {threads} threads): {} messages accepted, {} delivered, {} flushed, {} resets, {} restarts, {} events",
        b.seeds,
        dt.as_secs_f64(),
        dt.as_secs_f64() * 1000.0 * threads as f64 / b.seeds.max(1) as f64,
        b.accepted,
        b.delivered,
        b.flushed,
        b.resets,
        b.restarts,
        b.events
    );
    for (seed, e) in &b.failures {
        println!("seed {seed} FAILED: {}", e.lines().next().unwrap_or(""));
        println!("  replay: {}", sim::replay_command(*seed));
    }
    if b.failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
