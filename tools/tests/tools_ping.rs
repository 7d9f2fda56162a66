//! rds-ping against nodes of ours (a waiting passive rds-stress, an
//! rds-sink) and against an address nobody serves.

mod common;

use std::time::Duration;

use common::{Proc, ip, run};

const LONG: Duration = Duration::from_secs(60);

/// `^\s*\d+: \d+ usec$`
fn is_reply(l: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let Some((n, rest)) = l.trim_start().split_once(": ") else { return false };
    digits(n) && rest.strip_suffix(" usec").is_some_and(digits)
}

fn ping(from: &str, to: &str, count: &str) -> (i32, Vec<String>, Vec<String>) {
    run("rds-ping", &["-c", count, "-i", "0.2", "-I", from, to], LONG)
}

#[test]
fn reply_line_format() {
    assert!(is_reply("   1: 60 usec"));
    assert!(is_reply("1234: 7 usec"));
    assert!(!is_reply("   1: 60 usec (127.0.0.1)"));
    assert!(!is_reply("   1: DUP!"));
    assert!(!is_reply("   1: ERROR: Connection refused"));
}

#[test]
fn ping_a_waiting_passive_rds_stress() {
    let t = 10;
    let mut node = Proc::spawn("rds-stress", &["-r", &ip(t, 1).to_string(), "-p", "4110"]);
    node.wait_line(false, LONG, |l| l.starts_with("waiting for incoming connection on 127.88.10.1:4110"));
    let (code, out, err) = ping(&ip(t, 2).to_string(), &ip(t, 1).to_string(), "3");
    assert_eq!(code, 0, "{out:?} {err:?}");
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(out.iter().all(|l| is_reply(l)), "{out:?}");
    let numbers: Vec<&str> = out.iter().map(|l| l.trim_start().split(':').next().unwrap()).collect();
    assert_eq!(numbers, ["1", "2", "3"]);
    node.kill();
}

#[test]
fn ping_an_rds_sink() {
    let t = 11;
    let at = format!("{}:4000", ip(t, 1));
    let mut node = Proc::spawn("rds-sink", &["-s", &at]);
    node.wait_line(true, LONG, |l| l.starts_with("rds-sink: receiving on"));
    let (code, out, err) = ping(&ip(t, 2).to_string(), &ip(t, 1).to_string(), "3");
    assert_eq!(code, 0, "{out:?} {err:?}");
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(out.iter().all(|l| is_reply(l)), "{out:?}");
    // Pings are not datagrams of the sink's socket: it saw no flow.
    node.signal(libc::SIGTERM);
    assert_eq!(node.code(LONG), 0, "{}", node.dump());
    assert!(node.stdout().is_empty(), "{}", node.dump());
}

#[test]
fn ping_nobody() {
    let t = 12;
    let (code, out, err) = ping(&ip(t, 2).to_string(), &ip(t, 1).to_string(), "2");
    assert_eq!(code, 1, "{out:?} {err:?}");
    assert!(!out.iter().any(|l| is_reply(l) || l.contains("usec")), "{out:?}");
}
