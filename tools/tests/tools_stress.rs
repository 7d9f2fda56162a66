//! rds-stress end to end: a passive and an active process on two loopback
//! addresses, their output parsed; a fake active side (this test, speaking
//! the control protocol and RDS itself) to check the passive side's -v and
//! RDMA refusal; the refusals of the active side.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use common::{Proc, ip, run};
use rds_sock::{Engine, EngineConfig, RdsSocket};
use rds_tools::stress::{HEADER_SIZE, Header, OP_ACK, OP_REQ, WireOptions, pattern};

const LONG: Duration = Duration::from_secs(60);
const HEADER: &str = "tsks   tx/s   rx/s  tx+rx K/s    mbi K/s    mbo K/s tx us/c   rtt us cpu %";
const DASHES: &str = "---------------------------------------------";

/// One statistics line.
#[derive(Debug)]
struct Stats {
    tasks: u32,
    tx: u64,
    rx: u64,
    kbs: f64,
    mbi: f64,
    mbo: f64,
    tx_us: f64,
    rtt_us: f64,
    cpu: f64,
}

fn parse_stats(line: &str) -> Option<Stats> {
    let body = line.strip_suffix("  (average)").unwrap_or(line);
    let f: Vec<&str> = body.split_whitespace().collect();
    if f.len() != 9 {
        return None;
    }
    Some(Stats {
        tasks: f[0].parse().ok()?,
        tx: f[1].parse().ok()?,
        rx: f[2].parse().ok()?,
        kbs: f[3].parse().ok()?,
        mbi: f[4].parse().ok()?,
        mbo: f[5].parse().ok()?,
        tx_us: f[6].parse().ok()?,
        rtt_us: f[7].parse().ok()?,
        cpu: f[8].parse().ok()?,
    })
}

/// (per-second lines, the average line) of an rds-stress output.
fn stats(out: &[String]) -> (Vec<Stats>, Stats) {
    let per_sec: Vec<Stats> = out.iter().filter(|l| !l.ends_with("(average)")).filter_map(|l| parse_stats(l)).collect();
    let avg: Vec<&String> = out.iter().filter(|l| l.ends_with("  (average)")).collect();
    assert_eq!(avg.len(), 1, "one (average) line: {out:#?}");
    let a = parse_stats(avg[0]).unwrap_or_else(|| panic!("bad average line {:?}", avg[0]));
    (per_sec, a)
}

fn passive(test: u8, port: u16) -> Proc {
    let addr = ip(test, 1).to_string();
    let mut p = Proc::spawn("rds-stress", &["-r", &addr, "-p", &port.to_string()]);
    p.wait_line(false, LONG, |l| l.starts_with("waiting for incoming connection on"));
    p
}

/// Column widths and fixed fields of a line in the original's format.
fn check_columns(line: &str) {
    let body = line.strip_suffix("  (average)").unwrap_or(line);
    // %4u %6u %6u %10.2f %10.2f %10.2f %7.2f %8.2f %5.2f, right aligned
    let widths = [4, 6, 6, 10, 10, 10, 7, 8, 5];
    let mut pos = 0;
    for (i, w) in widths.iter().enumerate() {
        let field = body[pos..pos + w].trim_start();
        assert!(!field.is_empty(), "column {i} of {line:?}");
        assert!(field.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '-'), "column {i} of {line:?}");
        pos += w;
        if i < 8 {
            assert_eq!(&body[pos..pos + 1], " ", "{line:?}");
            pos += 1;
        }
    }
    assert_eq!(pos, body.len(), "{line:?}");
}

#[test]
fn passive_and_active_stop_after_t_seconds() {
    let (t, port) = (1, 4101);
    let mut pas = passive(t, port);
    let start = Instant::now();
    let mut act = Proc::spawn(
        "rds-stress",
        &[
            "-r",
            &ip(t, 2).to_string(),
            "-s",
            &ip(t, 1).to_string(),
            "-p",
            &port.to_string(),
            "-T",
            "3",
            "-d",
            "2",
            "--show-histogram",
        ],
    );
    assert_eq!(act.code(LONG), 0, "{}", act.dump());
    let took = start.elapsed();
    // Both sides stop: the passive side when the active side closes the
    // control connection.
    assert_eq!(pas.code(Duration::from_secs(20)), 0, "{}", pas.dump());

    let out = act.stdout();
    assert!(out.iter().any(|l| l == "connecting to 127.88.1.1:4101"), "{}", act.dump());
    assert!(out.iter().any(|l| l == "negotiated options, tasks will start in 2 seconds"), "{}", act.dump());
    assert!(out.iter().any(|l| l == "Starting up...."), "{}", act.dump());
    assert!(out.iter().any(|l| l == HEADER), "{}", act.dump());
    let dash = out.iter().position(|l| l == DASHES).unwrap_or_else(|| panic!("dashes\n{}", act.dump()));
    assert!(out[dash + 1].ends_with("  (average)"), "{}", act.dump());
    let (per_sec, avg) = stats(&out);
    // -T 3: about three per-second lines, after 4 s of start-up.
    assert!((2..=4).contains(&per_sec.len()), "{}", act.dump());
    assert!(took >= Duration::from_secs(7), "{took:?}");
    assert!(
        per_sec.iter().any(|s| s.tx > 0 && s.rx > 0 && s.kbs > 0.0),
        "a second with traffic both ways\n{}",
        act.dump()
    );
    for s in per_sec.iter().chain([&avg]) {
        assert_eq!(s.tasks, 1);
        assert_eq!((s.mbi, s.mbo, s.cpu), (0.0, 0.0, -1.0), "no RDMA over TCP, no -c: {s:?}");
    }
    assert!(avg.tx > 0 && avg.rx > 0 && avg.kbs > 0.0 && avg.rtt_us > 0.0 && avg.tx_us > 0.0, "{avg:?}");
    for l in out.iter().filter(|l| parse_stats(l).is_some()) {
        check_columns(l);
    }
    // The RTT histogram: 16 power-of-two buckets counting the acks.
    let h = out.iter().position(|l| l == "RTT histogram").unwrap_or_else(|| panic!("histogram\n{}", act.dump()));
    assert_eq!(out[h + 1], "RTT (us)        \t\t    Count");
    let mut total = 0u64;
    for (i, l) in out[h + 2..h + 18].iter().enumerate() {
        let want = format!("[{:>6} - {:>6}] \t\t ", 1u64 << i, 1u64 << (i + 1));
        assert!(l.starts_with(&want), "{l:?}");
        total += l[want.len()..].split_whitespace().next().unwrap().parse::<u64>().unwrap();
    }
    assert!(total > 0, "{}", act.dump());

    let pout = pas.stdout();
    assert!(pout.iter().any(|l| l.starts_with("accepted connection from 127.88.1.2:")), "{}", pas.dump());
    assert!(pout.iter().any(|l| l == HEADER), "{}", pas.dump());
    let (_, pavg) = stats(&pout);
    assert!(pavg.tx > 0 && pavg.rx > 0, "{}", pas.dump());
}

#[test]
fn verify_with_megabyte_requests_summary_only_and_cpu() {
    let (t, port) = (2, 4102);
    let mut pas = passive(t, port);
    let mut act = Proc::spawn(
        "rds-stress",
        &[
            "-r",
            &ip(t, 2).to_string(),
            "-s",
            &ip(t, 1).to_string(),
            "-p",
            &port.to_string(),
            "-T",
            "2",
            "-v",
            "-q",
            "1M",
            "-t",
            "2",
            "-d",
            "2",
            "-z",
            "-c",
        ],
    );
    assert_eq!(act.code(LONG), 0, "{}", act.dump());
    assert_eq!(pas.code(Duration::from_secs(20)), 0, "{}", pas.dump());
    // -c (local to the active side): soak threads measure the CPU use.
    let out = act.stdout();
    assert!(out[0].starts_with("started ") && out[0].ends_with(" cycle soaking threads"), "{}", act.dump());
    let (_, a) = stats(&out);
    assert!((0.0..=100.0).contains(&a.cpu), "{}", act.dump());
    let (_, p) = stats(&pas.stdout());
    assert_eq!(p.cpu, -1.0, "{}", pas.dump());
    for p in [&act, &pas] {
        let out = p.stdout();
        // -z (also for the passive side: it runs with the active side's
        // options): no per-second lines, no dashes, the summary only.
        let (per_sec, avg) = stats(&out);
        assert!(per_sec.is_empty(), "{}", p.dump());
        assert!(!out.iter().any(|l| l == DASHES), "{}", p.dump());
        assert_eq!(avg.tasks, 2);
        assert!(avg.tx > 0 && avg.rx > 0, "{}", p.dump());
        // 1 MiB requests both ways: well above 1 MiB/s.
        assert!(avg.kbs > 1024.0, "{}", p.dump());
        assert!(!p.stdout().iter().any(|l| l.contains("corrupted")), "{}", p.dump());
    }
}

/// Also -Q: a TOS makes the active side send the second version of the
/// options block (with a version string), which the passive side reads.
#[test]
fn one_way_with_perfdata_and_tos() {
    let (t, port) = (3, 4103);
    let mut pas = passive(t, port);
    let mut act = Proc::spawn(
        "rds-stress",
        &[
            "-r",
            &ip(t, 2).to_string(),
            "-s",
            &ip(t, 1).to_string(),
            "-p",
            &port.to_string(),
            "-T",
            "2",
            "-o",
            "-d",
            "4",
            "--show-perfdata",
            "-Q",
            "1",
        ],
    );
    assert_eq!(act.code(LONG), 0, "{}", act.dump());
    assert_eq!(pas.code(Duration::from_secs(20)), 0, "{}", pas.dump());
    let out = act.stdout();
    let head = out.iter().find(|l| l.starts_with("::nr_tasks:count")).unwrap_or_else(|| panic!("{}", act.dump()));
    assert!(head.starts_with(
        "::nr_tasks:count,req_size:bytes,ack_size:bytes,rdma_size:bytes,req_sent:count,thruput:kB/s,\
         thruput_rdma:kB/s,tx_delay:microseconds,rtt:microseconds,cpu:percent,"
    ));
    assert!(head.ends_with(",user:percent,system:percent,idle:percent,irq:percent,intr:count"), "{head}");
    let data: Vec<&String> = out.iter().filter(|l| l.starts_with("::") && !l.starts_with("::nr_tasks")).collect();
    assert!(!data.is_empty(), "{}", act.dump());
    for d in &data {
        let f: Vec<&str> = d[2..].split(',').collect();
        assert_eq!(&f[..4], &["1", "1024", "63", "0"], "{d}");
        assert!(f[4].parse::<u64>().is_ok() && f[5].parse::<f64>().is_ok(), "{d}");
        // The original's data lines carry one more value than its header
        // (RDMA in and out under one title).
        assert_eq!(f.len(), head[2..].split(',').count() + 1, "{d}");
    }
    assert!(data.iter().any(|d| d[2..].split(',').nth(4).unwrap() != "0"), "requests sent");
    // One way: only the active side sends requests.
    let (_, a) = stats(&out);
    assert!(a.tx > 0 && a.rx == 0, "{}", act.dump());
    let (_, p) = stats(&pas.stdout());
    assert!(p.tx == 0 && p.rx > 0, "{}", pas.dump());
}

#[test]
fn active_side_fails_when_the_passive_side_goes_away() {
    let (t, port) = (6, 4106);
    let mut pas = passive(t, port);
    let mut act = Proc::spawn(
        "rds-stress",
        &["-r", &ip(t, 2).to_string(), "-s", &ip(t, 1).to_string(), "-p", &port.to_string(), "-T", "60"],
    );
    act.wait_line(false, LONG, |l| l == HEADER);
    pas.kill();
    assert_eq!(act.code(Duration::from_secs(20)), 1, "{}", act.dump());
    assert!(act.stderr().iter().any(|l| l.contains("passive side closed the control connection")), "{}", act.dump());
    assert!(act.stdout().iter().any(|l| l.ends_with("(average)")), "{}", act.dump());
}

#[test]
fn rdma_and_unavailable_options_are_rejected() {
    let t = 7;
    let dst = ip(t, 1).to_string();
    for args in [
        vec!["-s", &dst, "-D", "4096"],
        vec!["-s", &dst, "-M", "1"],
        vec!["-s", &dst, "-I", "2"],
        vec!["--rdma-use-once", "1"],
        vec!["-s", &dst, "--rdma-key-o-meter"],
    ] {
        let (code, out, err) = run("rds-stress", &args, LONG);
        assert_eq!(code, 1, "{args:?}");
        assert!(out.is_empty(), "{args:?}: nothing started: {out:?}");
        assert!(err.iter().any(|l| l.contains("RDMA needs the IB transport")), "{args:?}: {err:?}");
    }
    for (opt, what) in [("--reset", "RDS_CONN_RESET"), ("--async", "--async")] {
        let (code, _, err) = run("rds-stress", &["-s", &dst, opt], LONG);
        assert_eq!(code, 1);
        assert!(err.iter().any(|l| l.contains(what) && l.contains("not available")), "{err:?}");
    }
    let (code, _, err) = run("rds-stress", &["-s", &dst, "-q", "62"], LONG);
    assert_eq!(code, 1);
    assert!(err.iter().any(|l| l.contains("req size must be at least 63 bytes")), "{err:?}");
    let (code, _, _) = run("rds-stress", &["--no-such-option"], LONG);
    assert_eq!(code, 2);
    // Nobody listens: one retry a second, then a clear failure.
    let (code, out, err) =
        run("rds-stress", &["-r", &ip(t, 2).to_string(), "-s", &dst, "-p", "4107", "--connect-retries", "1"], LONG);
    assert_eq!(code, 1);
    assert_eq!(out, vec!["connecting to 127.88.7.1:4107: Connection refused - retrying."], "{err:?}");
    assert!(err.iter().any(|l| l.contains("connect(127.88.7.1) failed")), "{err:?}");
}

/// The active side of the control protocol, played by this test: connect,
/// send the options (the original's first version), exchange the go bytes.
fn fake_active(test: u8, port: u16, o: &WireOptions) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from(SocketAddrV4::new(ip(test, 2), 0)).into()).unwrap();
    s.connect(&SocketAddr::from(SocketAddrV4::new(ip(test, 1), port)).into()).unwrap();
    let mut c = TcpStream::from(s);
    c.write_all(&o.encode_v1()).unwrap();
    c.write_all(&[0]).unwrap();
    c
}

fn options(test: u8, port: u16) -> WireOptions {
    WireOptions {
        req_depth: 1,
        req_size: 256,
        ack_size: HEADER_SIZE as u32,
        send_addr: ip(test, 1),
        receive_addr: ip(test, 2),
        starting_port: port,
        nr_tasks: 1,
        verify: 1,
        use_cong_monitor: 1,
        rdma_use_fence: 1,
        rdma_vector: 1,
        ..WireOptions::default()
    }
}

#[test]
fn passive_side_verifies_payloads_and_names_the_corruption() {
    let (t, port) = (4, 4104);
    let mut pas = passive(t, port);
    let o = options(t, port);
    let mut ctl = fake_active(t, port, &o);
    let mut ok = [9u8];
    ctl.set_read_timeout(Some(LONG)).unwrap();
    ctl.read_exact(&mut ok).unwrap();
    assert_eq!(ok, [0]);

    // Our task 0 at 127.88.4.2:4105 talks to the passive task 0.
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let sock: RdsSocket = engine.socket().unwrap();
    let me = SocketAddrV4::new(ip(t, 2), port + 1);
    let peer = SocketAddrV4::new(ip(t, 1), port + 1);
    sock.bind(me.into()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let pat = pattern(256 - HEADER_SIZE);
    let request = |seq: u32, corrupt: Option<usize>| {
        let mut m = vec![0u8; 256];
        Header {
            seq,
            from_addr: *me.ip(),
            from_port: me.port(),
            to_addr: *peer.ip(),
            to_port: peer.port(),
            index: 0,
            op: OP_REQ,
            ..Header::default()
        }
        .encode(&mut m);
        m[HEADER_SIZE..].copy_from_slice(&pat);
        if let Some(off) = corrupt {
            m[HEADER_SIZE + off] ^= 0x40;
        }
        m
    };
    // A good request is acked, with the original's header.
    sock.send_to(&request(0, None), peer.into()).unwrap();
    let mut buf = vec![0u8; 4096];
    let ack = loop {
        let (n, from) = sock.recv_from(&mut buf).expect("the passive side answers");
        assert_eq!(from, SocketAddr::from(peer));
        let h = Header::decode(&buf[..n]).unwrap();
        if h.op == OP_ACK {
            assert_eq!(n, HEADER_SIZE);
            break h;
        }
        // Its own requests to us (not one-way), pattern filled.
        assert_eq!((h.op, n), (OP_REQ, 256));
        assert_eq!(&buf[HEADER_SIZE..n], &pat[..]);
    };
    assert_eq!(
        (ack.from_addr, ack.from_port, ack.to_addr, ack.to_port, ack.index),
        (*peer.ip(), peer.port(), *me.ip(), me.port(), 0)
    );
    // A corrupted one kills it, naming the flow and the offset.
    sock.send_to(&request(1, Some(100)), peer.into()).unwrap();
    assert_eq!(pas.code(Duration::from_secs(20)), 1, "{}", pas.dump());
    let out = pas.stdout();
    assert!(
        // (It may share a line with the dots of "Starting up", as in the original.)
        out.iter()
            .any(|l| l
                .ends_with("An incoming message has a corrupted payload at offset 100; 1 out of 193 bytes corrupted")),
        "{}",
        pas.dump()
    );
    let err = pas.stderr().join("\n");
    assert!(err.contains("request seq 1 from 127.88.4.2:4105 to 127.88.4.1:4105"), "{err}");
    assert!(err.contains("payload offset 100 (message offset 163)"), "{err}");
    drop(ctl);
    engine.shutdown(Duration::ZERO);
}

#[test]
fn passive_side_refuses_an_rdma_run() {
    let (t, port) = (5, 4105);
    let mut pas = passive(t, port);
    let mut o = options(t, port);
    o.rdma_size = 4096;
    let _ctl = fake_active(t, port, &o);
    assert_eq!(pas.code(Duration::from_secs(20)), 1, "{}", pas.dump());
    assert!(pas.stderr().iter().any(|l| l.contains("RDMA needs the IB transport")), "{}", pas.dump());
}
