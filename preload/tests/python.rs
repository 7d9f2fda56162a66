//! Python's `socket`, `select`, `fcntl`, `os` and `signal` modules,
//! unmodified, on AF_RDS sockets under the shim (py/readiness.py): poll,
//! select and epoll (level and edge), non-blocking EAGAIN, MSG_TRUNC, EINTR
//! from a SIGALRM handler, errno as the kernel, dup, and a forked child that
//! opens its own RDS socket and exchanges datagrams with its parent over
//! RDS-TCP; then, through os, fcntl and ctypes, the calls Python's socket
//! methods do not make (readv, writev, sendmmsg, recvmmsg, __read_chk,
//! F_DUPFD, dup2 onto an RDS socket, shutdown / accept / socketpair).
//! And a program that waits in `poll` and receives without blocking
//! (py/poll_assist.py). Both print their checks through py/checks.py.
//! Skips (SKIP line) only when python3 is missing.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Proc, preloaded, private_net, program};

/// The checks py/readiness.py prints, in its order.
const CHECKS: &[&str] = &[
    "socket_dgram_esocktnosupport",
    "sendto_unbound_enotconn",
    "getsockname",
    "getpeername_unconnected_enotconn",
    "send_unconnected_enotconn",
    "listen_eopnotsupp",
    "write_eopnotsupp",
    "poll_empty",
    "poll_pollout",
    "epoll_empty",
    "poll_pollin",
    "select_readable",
    "epoll_level",
    "epoll_edge_once",
    "recvfrom",
    "read",
    "poll_drained",
    "epoll_edge_after_drain",
    "recv",
    "msg_dontwait_eagain",
    "nonblocking_blockingioerror",
    "fcntl_o_nonblock",
    "fcntl_getfl",
    "msg_trunc_flag",
    "msg_trunc_length",
    "getpeername",
    "send_connected",
    "dup_read",
    "dup_survives_close",
    "eintr",
    "fork_child_exit",
    "fork_exchange",
    "writev_eopnotsupp",
    "shutdown_eopnotsupp",
    "accept_eopnotsupp",
    "socketpair_eopnotsupp",
    "read_zero",
    "readv",
    "fcntl_f_dupfd",
    "sendmmsg",
    "recvmmsg",
    "read_chk",
    "dup2_onto_rds",
    "dup2_rds_port_free",
    "passthrough_socketpair",
];

#[test]
fn python_socket_module_under_the_shim() {
    run_script("python_socket_module_under_the_shim", "readiness.py", CHECKS);
}

/// Runs tests/py/SCRIPT under the shim in a private network namespace and
/// wants every one of `checks` OK, in that order, no FAIL line, DONE and
/// exit status 0 (a SKIP line when python3 is missing).
fn run_script(test: &str, script: &str, checks: &[&str]) {
    let Some(py) = program("python3", test) else { return };
    private_net();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py").join(script);
    let mut cmd = preloaded(&py);
    cmd.arg(&script);
    let (code, out, err) = Proc::spawn("python3", &mut cmd).finish(Duration::from_secs(90));
    println!("{out}");
    eprintln!("{err}");
    let oks: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("OK ")).collect();
    let fails: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(fails.is_empty(), "failed checks: {fails:#?}");
    assert_eq!(oks, checks, "checks passed, in order");
    assert!(out.lines().any(|l| l == "DONE"), "the script did not finish");
    assert_eq!(code, Some(0), "python3 exit status (None: killed after 90 s)");
}

/// The checks py/poll_assist.py prints, in its order.
const POLL_CHECKS: &[&str] = &[
    "counter_listed",
    "echo_in_order",
    "nothing_left",
    "poll_read_the_connection",
    "poll_left_the_descriptor",
    "owed_descriptor_catches_up",
    "pipe_in_the_set",
    "timeout",
    "poll_zero",
    "child_exit",
];

/// A program that waits in `poll` and then receives without blocking
/// (py/poll_assist.py): 300 answers from a forked echo child, each once, in
/// order and intact; the polls read the connection themselves (the
/// parent's `tcp_rx_assist_reads`, from RDS_INFO_COUNTERS, counts at least
/// one read per two answers: without the shim's `poll` it stays 0), and
/// did not raise the socket's descriptor for the answers they read
/// (`engine_fd_owed`, `engine_fd_raised`); a message a poll reported
/// without raising it is seen by `epoll` (not interposed) once the linger
/// tick settled it, and by a second poll at once; a pipe in the same set,
/// the timeout and a zero timeout behave as `poll`'s.
#[test]
fn python_poll_reads_the_connection_under_the_shim() {
    run_script("python_poll_reads_the_connection_under_the_shim", "poll_assist.py", POLL_CHECKS);
}
