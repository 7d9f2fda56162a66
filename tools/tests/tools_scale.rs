//! rds-scale: a serving node, peer nodes and a multipath node on 127.87.x
//! (no other test uses that block): every message arrives once and in
//! order (the counts match exactly), the peers connect every path, the
//! serving node's thread count does not grow with its peers, 8 paths all
//! carry messages, and the quit request ends the serving node with its
//! totals. Figures (memory, MB/s, CPU) are printed, never asserted.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_rds-scale");

/// Kills the process when dropped (a failed assertion leaves nothing).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs rds-scale to its end (at most `limit`): (exit code, stdout, stderr).
fn run(args: &[&str], limit: Duration) -> (i32, String, String) {
    let child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rds-scale");
    wait(Reap(child), limit)
}

fn wait(mut c: Reap, limit: Duration) -> (i32, String, String) {
    let end = Instant::now() + limit;
    let code = loop {
        if let Some(s) = c.0.try_wait().unwrap() {
            break s.code().unwrap_or(-1);
        }
        assert!(Instant::now() < end, "rds-scale did not finish within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    c.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    c.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (code, out, err)
}

/// The `R key value` lines: key -> values, in order.
fn figures(out: &str) -> HashMap<String, Vec<String>> {
    let mut m: HashMap<String, Vec<String>> = HashMap::new();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() >= 3 && w[0] == "R" {
            m.entry(w[1].to_string()).or_default().push(w[2].to_string());
        }
    }
    m
}

fn one(f: &HashMap<String, Vec<String>>, k: &str) -> u64 {
    let v = f.get(k).unwrap_or_else(|| panic!("no {k} in {f:?}"));
    assert_eq!(v.len(), 1, "{k}: {v:?}");
    v[0].parse().unwrap_or_else(|_| panic!("{k}: {v:?}"))
}

#[test]
fn peers_then_paths_then_quit() {
    let srv = "127.87.0.1:4000";
    let server = Reap(
        Command::new(BIN)
            .args(["serve", "-s", srv, "--sockets", "8", "--threads", "2", "-t", "120"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));

    // 8 peers of 8 paths, 4 KiB messages, 1 MiB per round, 3 messages to
    // a peer before the next.
    let (code, out, err) = run(
        &[
            "peers",
            "-d",
            srv,
            "--peers",
            "8",
            "--from",
            "127.87.1.1",
            "--control",
            "127.87.0.3",
            "-m",
            "4K",
            "-l",
            "1M",
            "--rounds",
            "1",
            "--burst",
            "3",
            "--settle",
            "0.3",
        ],
        Duration::from_secs(90),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let f = figures(&out);
    assert_eq!(one(&f, "scale_peers"), 8);
    assert_eq!(one(&f, "scale_burst"), 3);
    assert_eq!(one(&f, "scale_npaths"), 8);
    // The peers share one engine (`--engine-per-peer` gives each its own).
    assert_eq!(one(&f, "scale_peer_engines"), 1);
    assert_eq!(one(&f, "scale_flows"), 8);
    // The control node and the 8 peers, each with its 8 paths up.
    assert_eq!(one(&f, "scale_server_conns"), 9);
    assert_eq!(one(&f, "scale_server_tcp_conns"), 72);
    assert_eq!(one(&f, "scale_server_paths_up"), 72);
    // main, 8 receivers, 2 reactors, the timer, rds-info: with 1 peer as with 8.
    assert_eq!(one(&f, "scale_server_threads_before"), 13);
    assert_eq!(one(&f, "scale_server_threads"), 13);
    // 8 first messages; warm-ups of 256 KiB (64 messages from one peer,
    // 8 from each of 8); one round of 1 MiB (256 messages, 32 from each).
    let sent = 8 + 64 + 8 * 8 + 256 + 8 * 32;
    assert_eq!(one(&f, "scale_msgs_sent"), sent);
    assert_eq!(one(&f, "scale_msgs_received"), sent);
    assert_eq!(one(&f, "scale_dups"), 0);
    assert_eq!(one(&f, "scale_gaps"), 0);
    assert_eq!(f["scale_bw_1"].len(), 1);
    assert_eq!(f["scale_bw_n"].len(), 1);
    for k in ["scale_rss_per_peer", "scale_pss_per_peer", "scale_bw_1", "scale_bw_n"] {
        assert!(f[k][0].parse::<f64>().is_ok(), "{k}: {:?}", f[k]);
    }
    // What a message cost the sending thread, and the share of its sends
    // coalesced: one figure per round and side, a share within 0..=100.
    for k in ["scale_bw_1", "scale_bw_n"] {
        let us = &f[&format!("{k}_sender_us_per_msg")];
        assert!(us.len() == 1 && us[0].parse::<f64>().is_ok_and(|x| x >= 0.0), "{k}: {us:?}");
        let co = &f[&format!("{k}_coalesced")];
        assert!(co.len() == 1 && co[0].parse::<f64>().is_ok_and(|x| (0.0..=100.0).contains(&x)), "{k}: {co:?}");
    }

    // 8 paths, 8 sockets, a thread each: every path carries messages.
    let (code, out, err) = run(
        &["paths", "-d", srv, "-s", "127.87.2.1:6000", "--npaths", "8", "-m", "1K", "-T", "0.5"],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let f = figures(&out);
    assert_eq!(one(&f, "scale_mp8_npaths"), 8);
    // "Used" (at least 1% of the messages) is perf.sh's figure: in 0.5 s
    // on 2 CPUs one of 8 sending threads can get less than that (a run in
    // ten, before and after 2db6043). That every path carries messages is
    // the check.
    assert!((1..=8).contains(&one(&f, "scale_mp8_paths_used")));
    let per_path: Vec<u64> = f["scale_mp8_path_msgs"][0].split('/').map(|x| x.parse().unwrap()).collect();
    assert_eq!(per_path.len(), 8);
    assert!(per_path.iter().all(|&m| m > 0), "{per_path:?}");
    let sent = one(&f, "scale_mp8_msgs_sent");
    assert!(sent > 0);
    assert_eq!(one(&f, "scale_mp8_msgs_received"), sent);
    // (The per-path counters are the serving node's next_rx_seq: each
    // path's own sequence, not a count of this run's messages alone.)
    assert_eq!(one(&f, "scale_mp8_dups"), 0);
    assert_eq!(one(&f, "scale_mp8_gaps"), 0);

    // One path, one socket, and the quit request.
    let (code, out, err) = run(
        &["paths", "-d", srv, "-s", "127.87.2.2:6000", "--npaths", "1", "--sockets", "1", "-T", "0.2", "--quit"],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let f = figures(&out);
    assert_eq!(one(&f, "scale_mp1_npaths"), 1);
    assert_eq!(one(&f, "scale_mp1_paths_used"), 1);
    let sent1 = one(&f, "scale_mp1_msgs_sent");
    assert_eq!(one(&f, "scale_mp1_msgs_received"), sent1);

    let (code, out, err) = wait(server, Duration::from_secs(30));
    assert_eq!(code, 0, "{out}\n{err}");
    let totals: HashMap<&str, &str> = out.split_whitespace().filter_map(|w| w.split_once('=')).collect();
    let total = (8 + 64 + 64 + 256 + 256) + sent + sent1;
    assert_eq!(totals["msgs"].parse::<u64>().unwrap(), total, "{out}");
    assert_eq!(totals["dups"], "0");
    assert_eq!(totals["gaps"], "0");
    // The peers' 8 flows, the 8 paths run's 8 sockets, the 1 path run's one.
    assert_eq!(totals["flows"], "17");
    assert!(err.contains("serving 127.87.0.1:4000..4007"), "{err}");
}

#[test]
fn help_and_usage_errors() {
    let (code, out, _) = run(&["--help"], Duration::from_secs(10));
    assert_eq!(code, 0);
    assert!(out.starts_with("usage: rds-scale serve"), "{out}");
    for o in [
        "-s",
        "-d",
        "-p",
        "-m",
        "-l",
        "-t",
        "-T",
        "--sockets",
        "--threads",
        "--npaths",
        "--peers",
        "--from",
        "--control",
        "--rounds",
        "--settle",
        "--engine-per-peer",
        "--quit",
    ] {
        assert!(out.split(|c: char| c.is_whitespace() || c == '[' || c == ']').any(|w| w == o), "--help lacks {o}");
    }
    let (code, _, err) = run(&["serve", "--no-such-option"], Duration::from_secs(10));
    assert_eq!(code, 2);
    assert!(err.contains("unknown option --no-such-option"), "{err}");
    let (code, _, err) = run(&[], Duration::from_secs(10));
    assert_eq!(code, 2);
    assert!(err.contains("a role is required"), "{err}");
    let (code, _, err) = run(&["dance"], Duration::from_secs(10));
    assert_eq!(code, 2);
    assert!(err.contains("unknown role 'dance'"), "{err}");
    let (code, _, err) = run(&["peers"], Duration::from_secs(10));
    assert_eq!(code, 2);
    assert!(err.contains("-d addr:port is required"), "{err}");
}
