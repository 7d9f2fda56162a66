//! rds-conform: our side of the conformance scenarios against the Linux
//! kernel's RDS-TCP (the kernel side is `tests/kernel/conform.py`;
//! `tests/tests/kernel_tcp.rs` runs both in the VM rig).
//!
//! usage: rds-conform SCENARIO --self ADDR --peer ADDR
//!
//! Scenarios: ping, tools, datagrams, batches, congestion, mprds, reconnect, resetall, restart-a,
//! restart-b, selftest. The two sides meet at `barrier NAME` points (the
//! rig's helper) and print
//!
//! ```text
//! RESULT <scenario> <direction> PASS|FAIL <note>
//! INFO <scenario> <text>
//! ```
//!
//! Payloads are deterministic ([`flows::payload`], the same function as the
//! script's), so receivers check content, order and count per flow
//! (source port, destination port) on their own.

mod batches;
mod common;
mod congestion;
mod exchange;
mod flows;
mod kinfo;
mod mprds;
mod reconnect;
mod restart;
mod selftest;

use std::net::IpAddr;

use batches::sc_batches;
use common::{Ctx, barrier};
use congestion::sc_congestion;
use exchange::{sc_datagrams, sc_ping, sc_tools};
use kinfo::kinfo;
use mprds::{lane_ports, sc_mprds};
use reconnect::{Kill, stream_scenario};
use restart::{sc_restart_a, sc_restart_b};
use selftest::sc_selftest;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("kinfo") {
        std::process::exit(kinfo(args.get(1).map_or("", String::as_str)));
    }
    if args.first().map(String::as_str) == Some("barrier") {
        let secs = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(120);
        std::process::exit(if barrier(args.get(1).map_or("x", String::as_str), secs) { 0 } else { 1 });
    }
    let get =
        |k: &str| args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)).and_then(|v| v.parse::<IpAddr>().ok());
    let (Some(scenario), Some(me), Some(peer)) = (args.first(), get("--self"), get("--peer")) else {
        eprintln!("usage: rds-conform SCENARIO --self ADDR --peer ADDR");
        std::process::exit(2);
    };
    let ctx = Ctx { me, peer };
    match scenario.as_str() {
        "ping" => sc_ping(&ctx),
        "tools" => sc_tools(&ctx),
        "datagrams" => sc_datagrams(&ctx),
        "batches" => sc_batches(&ctx),
        "congestion" => sc_congestion(&ctx),
        "mprds" => sc_mprds(&ctx),
        "reconnect" => {
            stream_scenario(&ctx, "reconnect", &(8096..8104).collect::<Vec<u16>>(), &lane_ports(9100), 12.0, Kill::One)
        }
        "resetall" => {
            stream_scenario(&ctx, "resetall", &(8096..8104).collect::<Vec<u16>>(), &lane_ports(9100), 12.0, Kill::All)
        }
        "restart-a" => sc_restart_a(&ctx),
        "restart-b" => sc_restart_b(&ctx),
        "selftest" => sc_selftest(&ctx),
        other => {
            eprintln!("rds-conform: unknown scenario {other}");
            std::process::exit(2);
        }
    }
    // Give the kernel's TCP acks a moment, then leave without closing
    // sockets in an order that could drop anything.
    std::process::exit(0);
}
