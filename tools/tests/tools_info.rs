//! rds-info against live nodes: an rds-sink process and engines of this
//! test process. The tables are parsed and checked row by row against what
//! was sent and against the in-process engine's own snapshot.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Proc, ip, run};
use rds_core::stats::Counters;
use rds_sock::{Engine, EngineConfig};

const LONG: Duration = Duration::from_secs(30);

/// rds-info's output split into node blocks: (pid, engine, command, lines).
fn blocks(out: &[String]) -> Vec<(u32, u32, String, Vec<String>)> {
    let mut v: Vec<(u32, u32, String, Vec<String>)> = Vec::new();
    for l in out {
        if let Some(rest) = l.strip_prefix("RDS node: pid ") {
            let w: Vec<&str> = rest.split_whitespace().collect();
            assert_eq!(w[1], "engine", "{l}");
            assert_eq!(w[4], "addresses", "{l}");
            v.push((
                w[0].parse().unwrap(),
                w[2].parse().unwrap(),
                w[3].trim_matches(['(', ')']).to_string(),
                vec![l.clone()],
            ));
        } else {
            v.last_mut().unwrap_or_else(|| panic!("output before a node line: {l}")).3.push(l.clone());
        }
    }
    v
}

/// The lines of the block of engine `engine` of process `pid`.
fn block(out: &[String], pid: u32, engine: u32) -> Vec<String> {
    let b = blocks(out);
    let found: Vec<_> = b.iter().filter(|(p, e, _, _)| *p == pid && *e == engine).collect();
    assert_eq!(found.len(), 1, "node {pid}/{engine} in\n{}", out.join("\n"));
    found[0].3.clone()
}

/// Rows of the table titled `title`, after checking its header; each row
/// split into words.
fn table(block: &[String], title: &str, header: &[&str]) -> Vec<Vec<String>> {
    let at = block.iter().position(|l| l == title).unwrap_or_else(|| panic!("no '{title}' in\n{}", block.join("\n")));
    let head: Vec<&str> = block[at + 1].split_whitespace().collect();
    assert_eq!(head, header, "header of {title}");
    block[at + 2..]
        .iter()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

fn info(args: &[&str]) -> Vec<String> {
    let (code, out, err) = run("rds-info", args, LONG);
    assert_eq!(code, 0, "rds-info {args:?}: {err:?}");
    out
}

fn counters(block: &[String]) -> Vec<(String, u64)> {
    table(block, "Counters:", &["CounterName", "Value"])
        .into_iter()
        .map(|r| {
            assert_eq!(r.len(), 2, "{r:?}");
            (r[0].clone(), r[1].parse().unwrap())
        })
        .collect()
}

fn counter(c: &[(String, u64)], name: &str) -> u64 {
    c.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no counter {name}")).1
}

fn sysctl(name: &str) -> u32 {
    std::fs::read_to_string(format!("/proc/sys/net/core/{name}")).map_or(212_992, |s| s.trim().parse().unwrap())
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + LONG;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const CONN_HDR: &[&str] = &["LocalAddr", "RemoteAddr", "NextTX", "NextRX", "Flg"];
const MSG_HDR: &[&str] = &["LocalAddr", "LPort", "RemoteAddr", "RPort", "Seq", "Bytes"];
const TCP_HDR: &[&str] =
    &["LocalAddr", "LPort", "RemoteAddr", "RPort", "HdrRemain", "DataRemain", "SentNxt", "ExpectUna", "SeenUna"];
const SOCK_HDR: &[&str] = &["BoundAddr", "BPort", "ConnAddr", "CPort", "SndBuf", "RcvBuf", "Inode"];

#[test]
fn every_table_of_a_live_rds_sink_and_of_this_process() {
    let t = 60;
    let (me_ip, sink_ip) = (ip(t, 1), ip(t, 2));
    let sink_at = format!("{sink_ip}:4000");
    let mut sink = Proc::spawn("rds-sink", &["-s", &sink_at]);
    sink.wait_line(true, LONG, |l| l.starts_with("rds-sink: receiving on"));
    let spid = sink.pid().to_string();

    let cfg = EngineConfig::default();
    let tcp_port = cfg.tcp.port;
    let engine = Engine::new(cfg).unwrap();
    let a = engine.socket().unwrap();
    a.bind(SocketAddr::new(me_ip.into(), 5000)).unwrap();
    let dst: SocketAddr = sink_at.parse().unwrap();
    for i in 0..50u8 {
        a.send_to(&[i; 100], dst).unwrap();
    }
    assert!(a.flush(LONG), "acked");
    wait_for("the sink to read 50 messages", || {
        let out = info(&["-c", "--pid", &spid]);
        counter(&counters(&block(&out, sink.pid(), 0)), "recv_delivered") == 50
    });

    // Our view of the connection, to compare with the sink's.
    let ours = || engine.connections().into_iter().find(|c| c.faddr == sink_ip).expect("our connection");
    let mut out = Vec::new();
    wait_for("both sides to agree on sequence numbers", || {
        out = info(&["--pid", &spid]);
        let b = block(&out, sink.pid(), 0);
        let rows = table(&b, "RDS Connections:", CONN_HDR);
        let o = ours();
        rows.len() == 1
            && rows[0][2] == o.path0().next_rx_seq.to_string()
            && rows[0][3] == o.path0().next_tx_seq.to_string()
    });
    let b = block(&out, sink.pid(), 0);
    assert_eq!(b[0], format!("RDS node: pid {} engine 0 (rds-sink) addresses {sink_ip}", sink.pid()));

    // Tables in the original's order.
    let titles: Vec<&String> = b.iter().filter(|l| l.ends_with(':') && !l.starts_with(' ')).collect();
    assert_eq!(
        titles,
        [
            "RDS IB Connections:",
            "TCP Connections:",
            "Counters:",
            "RDS Sockets:",
            "RDS Connections:",
            "Receive Message Queue:",
            "Send Message Queue:",
            "Retransmit Message Queue:"
        ]
    );
    assert!(table(&b, "RDS IB Connections:", &["LocalAddr", "RemoteAddr", "LocalDev", "RemoteDev"]).is_empty());

    // Connections: one, connected, path 0's sequence numbers mirror ours.
    let o = ours();
    let rows = table(&b, "RDS Connections:", CONN_HDR);
    assert_eq!(
        rows,
        vec![vec![
            sink_ip.to_string(),
            me_ip.to_string(),
            o.path0().next_rx_seq.to_string(),
            o.path0().next_tx_seq.to_string(),
            "--C".to_string()
        ]]
    );
    // Port 5000 is lane 0 of 8: every datagram went on path 0, after the
    // probe (ours) and the pong to the sink's probe.
    assert!(o.path0().next_tx_seq >= 52, "{o:?}");

    // Counters: the kernel's core counters in order, TCP's, then ours.
    let c = counters(&b);
    let names: Vec<&str> = c.iter().map(|(n, _)| n.as_str()).collect();
    let mut want: Vec<&str> = Counters::NAMES[..36].to_vec();
    want.extend(rds_core::info::KERNEL_TCP_COUNTERS);
    want.extend(&Counters::NAMES[36..]);
    assert_eq!(names[..want.len()], want);
    // The TCP transport's own counters, then the engine's node lock's and
    // readiness descriptors', close the list.
    let lock = [
        "engine_node_lock_taken",
        "engine_node_lock_waited",
        "engine_node_lock_wait_us",
        "engine_fd_raised",
        "engine_fd_owed",
        "engine_fd_owed_ticked",
    ];
    let (tcp_own, engine_own) = names[want.len()..].split_at(names.len() - want.len() - lock.len());
    assert!(tcp_own.iter().all(|n| n.starts_with("tcp_") && !want.contains(n)), "{names:?}");
    assert_eq!(engine_own, lock);
    assert!(counter(&c, "engine_node_lock_taken") > 0);
    assert_eq!(counter(&c, "recv_queued"), 50);
    assert_eq!(counter(&c, "recv_delivered"), 50);
    assert_eq!(counter(&c, "recv_bytes_added_to_sock"), 5000);
    assert_eq!(counter(&c, "recv_bytes_freed_fromsock"), 5000);
    assert_eq!(counter(&c, "recv_drop_no_sock"), 0);

    // Sockets: the sink's one socket, buffers as RDS uses them (halved).
    let rows = table(&b, "RDS Sockets:", SOCK_HDR);
    let half = |v: u32| (v / 2).to_string();
    assert_eq!(
        rows,
        vec![vec![
            sink_ip.to_string(),
            "4000".into(),
            "0.0.0.0".into(),
            "0".into(),
            half(sysctl("wmem_default")),
            half(sysctl("rmem_default")),
            "1".into()
        ]]
    );

    // TCP: one accepted socket per path, idle (a whole header expected).
    let rows = table(&b, "TCP Connections:", TCP_HDR);
    assert_eq!(rows.len(), 8, "{rows:?}");
    let mut peer_ports: Vec<String> = Vec::new();
    for r in &rows {
        assert_eq!((&r[0], &r[1], &r[2]), (&sink_ip.to_string(), &tcp_port.to_string(), &me_ip.to_string()), "{r:?}");
        assert_eq!((&r[4], &r[5]), (&"48".to_string(), &"0".to_string()), "{r:?}");
        peer_ports.push(r[3].clone());
    }
    let mut our_ports: Vec<String> =
        engine.tcp_connections().iter().filter_map(|t| t.local.map(|l| l.port().to_string())).collect();
    peer_ports.sort();
    our_ports.sort();
    assert_eq!(peer_ports, our_ports, "the sink's peers are our 8 sockets");

    // Queues: everything was read and acked.
    for title in ["Receive Message Queue:", "Send Message Queue:", "Retransmit Message Queue:"] {
        assert!(table(&b, title, MSG_HDR).is_empty(), "{title}");
    }

    // -v: every path, all up.
    let out = info(&["-n", "-v", "--pid", &spid]);
    let b = block(&out, sink.pid(), 0);
    let paths: Vec<Vec<&str>> =
        b.iter().filter(|l| l.trim_start().starts_with("path ")).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(paths.len(), 8, "{}", b.join("\n"));
    for (i, p) in paths.iter().enumerate() {
        assert_eq!((p[1], p[2]), (i.to_string().as_str(), "Up"), "{p:?}");
    }
    // The default HandshakeExts::Full sends our generation (non-zero) on the
    // probe, so the sink knows it.
    let gens: Vec<u64> = b
        .iter()
        .filter_map(|l| l.trim().strip_prefix("transport tcp tos 0 npaths 8 peer_gen "))
        .map(|g| g.parse().unwrap())
        .collect();
    assert!(gens.len() == 1 && gens[0] != 0, "{}", b.join("\n"));

    // This process: our engine's row.
    let me = std::process::id();
    let out = info(&["-n", "--pid", &me.to_string()]);
    let rows = table(&block(&out, me, engine.number()), "RDS Connections:", CONN_HDR);
    let o = ours();
    assert_eq!(
        rows,
        vec![vec![
            me_ip.to_string(),
            sink_ip.to_string(),
            o.path0().next_tx_seq.to_string(),
            o.path0().next_rx_seq.to_string(),
            "--C".to_string()
        ]]
    );
    engine.shutdown(Duration::ZERO);
    sink.kill();
}

#[test]
fn queued_messages_are_listed_in_order() {
    let t = 61;
    let (e1, e2) = (Engine::new(EngineConfig::default()).unwrap(), Engine::new(EngineConfig::default()).unwrap());
    let a = e1.socket().unwrap();
    let b = e2.socket().unwrap();
    a.bind(SocketAddr::new(ip(t, 1).into(), 5000)).unwrap();
    b.bind(SocketAddr::new(ip(t, 2).into(), 4000)).unwrap();
    // b never reads: three datagrams stay on its receive queue.
    for len in [10, 20, 30] {
        a.send_to(&vec![1u8; len], SocketAddr::new(ip(t, 2).into(), 4000)).unwrap();
    }
    wait_for("three queued datagrams", || e2.messages(rds_core::Queue::Recv).len() == 3);
    // Nobody serves ip(t, 9): the probe and two datagrams stay on the send queue.
    let nowhere = SocketAddr::new(ip(t, 9).into(), 4000);
    a.send_to(&[2u8; 7], nowhere).unwrap();
    a.send_to(&[3u8; 8], nowhere).unwrap();

    let me = std::process::id();
    let out = info(&["-r", "-s", "-t", "--pid", &me.to_string()]);
    let row = |l: std::net::Ipv4Addr, lp: u16, f: std::net::Ipv4Addr, fp: u16, seq: u64, len: usize| {
        vec![l.to_string(), lp.to_string(), f.to_string(), fp.to_string(), seq.to_string(), len.to_string()]
    };

    let b2 = block(&out, me, e2.number());
    let seqs: Vec<u64> = e2.messages(rds_core::Queue::Recv).iter().map(|m| m.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(
        table(&b2, "Receive Message Queue:", MSG_HDR),
        vec![
            row(ip(t, 2), 4000, ip(t, 1), 5000, seqs[0], 10),
            row(ip(t, 2), 4000, ip(t, 1), 5000, seqs[1], 20),
            row(ip(t, 2), 4000, ip(t, 1), 5000, seqs[2], 30)
        ]
    );
    assert!(table(&b2, "Send Message Queue:", MSG_HDR).is_empty());

    let b1 = block(&out, me, e1.number());
    assert!(table(&b1, "Receive Message Queue:", MSG_HDR).is_empty());
    // The multipath probe (port 1 to port 0, empty) was queued first.
    let send: Vec<Vec<String>> =
        table(&b1, "Send Message Queue:", MSG_HDR).into_iter().filter(|r| r[2] == ip(t, 9).to_string()).collect();
    assert_eq!(
        send,
        vec![
            row(ip(t, 1), 1, ip(t, 9), 0, 1, 0),
            row(ip(t, 1), 5000, ip(t, 9), 4000, 2, 7),
            row(ip(t, 1), 5000, ip(t, 9), 4000, 3, 8)
        ]
    );
    assert!(table(&b1, "Retransmit Message Queue:", MSG_HDR).is_empty());
    e1.shutdown(Duration::ZERO);
    e2.shutdown(Duration::ZERO);
}

#[test]
fn a_pid_without_a_node_is_reported() {
    // No process has pid 4194304 (above Linux's pid_max).
    let (code, out, err) = run("rds-info", &["--pid", "4194304"], LONG);
    assert_eq!(code, 0);
    assert!(out.is_empty(), "{out:?}");
    assert!(err.iter().any(|l| l.starts_with("rds-info: no RDS node of process 4194304 found")), "{err:?}");
    let (code, _, err) = run("rds-info", &["-c", "extra"], LONG);
    assert_eq!(code, 2, "{err:?}");
}

/// Root sees every user's nodes: an rds-sink running as another uid
/// (its sockets in /tmp/rds-rs-<uid>) is listed by rds-info run as root,
/// with its counters, and only root's rds-info does so. Needs root and
/// `setpriv` (util-linux); prints SKIP otherwise.
#[test]
fn root_sees_the_nodes_of_other_users() {
    const UID: u32 = 54_321;
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/usr/bin/setpriv").exists() {
        eprintln!("SKIP root_sees_the_nodes_of_other_users: needs root and /usr/bin/setpriv");
        return;
    }
    let t = 62;
    let sink_at = format!("{}:4000", ip(t, 2));
    let uid = UID.to_string();
    let mut child = std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid", &uid, "--regid", &uid, "--clear-groups", "--", common::bin("rds-sink"), "-s", &sink_at])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("RDS_INFO_DIR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("setpriv rds-sink");
    let pid = child.id();
    let dir = std::path::PathBuf::from(format!("/tmp/rds-rs-{UID}"));
    // The sink's info socket appears once its engine runs.
    let until = Instant::now() + LONG;
    let found = loop {
        let there = std::fs::read_dir(&dir)
            .map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{pid}."))))
            .unwrap_or(false);
        if there || Instant::now() > until {
            break there;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = if found {
        let o = std::process::Command::new(common::bin("rds-info"))
            .args(["-c", "--pid", &pid.to_string()])
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("RDS_INFO_DIR")
            .output()
            .expect("rds-info");
        assert!(o.status.success(), "rds-info as root: {o:?}");
        Some(String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect::<Vec<_>>())
    } else {
        None
    };
    let _ = child.kill();
    let _ = child.wait();
    let out = out.unwrap_or_else(|| panic!("the sink running as uid {UID} made no socket in {}", dir.display()));
    let b = block(&out, pid, 0);
    assert!(b[0].contains(&ip(t, 2).to_string()), "the node line names its address: {}", b[0]);
    assert!(counters(&b).iter().any(|(n, _)| n == "conn_reset"), "its counters are printed:\n{}", b.join("\n"));
}

/// Output into a pipe whose reader is gone ends rds-info as it ends a C
/// tool, by SIGPIPE, with nothing on stderr (it panicked in `println!`).
#[test]
fn output_into_a_closed_pipe_ends_by_sigpipe_not_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let a = engine.socket().unwrap();
    a.bind(SocketAddr::new(ip(63, 1).into(), 5000)).unwrap();
    let mut child = Command::new(common::bin("rds-info"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed long before rds-info has asked the nodes and writes.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "status {:?}, stderr {err}", out.status);
    assert!(err.is_empty(), "stderr: {err}");
}
