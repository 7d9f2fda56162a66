//! tests/c/api.c: the C ABI from C programs, one process per scenario
//! (so each has an engine of its own): poll, select, epoll level and edge,
//! EINTR on SIGALRM, EAGAIN and a send timeout, fork (with a socket open,
//! and before any as qperf's server does).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

fn exe() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| common::cc(&common::repo().join("capi/tests/c/api.c"), "api", &["-pthread"]))
}

/// Runs a scenario on 127.0.`net`.x (each test its own addresses: an
/// address is served by one process at a time).
fn run(scenario: &str, port: u16, net: u8) -> String {
    let o = Command::new(exe())
        .args([scenario, &port.to_string(), &net.to_string()])
        .env("RDS_INFO_DIR", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{scenario}: {out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.ends_with(&format!("ok {scenario}\n")), "{scenario}: {out}");
    out
}

#[test]
fn poll_on_rds_descriptors() {
    run("poll", 4800, 11);
}

#[test]
fn select_on_rds_descriptors() {
    run("select", 4810, 12);
}

#[test]
fn epoll_level_triggered() {
    run("epoll-lt", 4820, 13);
}

#[test]
fn epoll_edge_triggered() {
    run("epoll-et", 4830, 14);
}

#[test]
fn sigalrm_interrupts_a_blocking_receive_unless_sa_restart() {
    run("eintr", 4840, 15);
}

#[test]
fn nonblocking_send_eagain_and_send_timeout() {
    let out = run("eagain", 4850, 16);
    let n: usize = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(n >= 2, "a few 4 KiB datagrams fit in the buffer before EAGAIN: {n}");
}

#[test]
fn fork_before_any_socket_as_qperf_server() {
    run("fork-fresh", 4870, 18);
}

#[test]
fn fork_child_opens_its_own_socket() {
    run("fork", 4860, 17);
}
