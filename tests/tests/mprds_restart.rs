//! A peer process that dies and comes back while the survivor, the smaller
//! address, uses 8 paths and queues on lanes above 0 (found running
//! tests/kernel/conform.py under the LD_PRELOAD shim: the node with the
//! smaller address never reconnected, 8 paths down, messages waiting on
//! path 7 for ever).
//!
//! A (this process, 127.0.x.1, 8 paths) streams from 8 sockets, one per
//! lane (ports 6000..6008: lane = port % 8), to B (`rds-node`, 127.0.x.2,
//! its own process, receive only: it never sends to A, so it never pokes A
//! into reconnecting). Each round: every lane's messages reach B and are
//! acked; B is killed (SIGKILL: no shutdown, the kernel resets or closes
//! its connections), or its process exits by itself (end of its stdin);
//! once A sees every path down (its path 0 reconnect
//! attempts fail while the port is closed), A queues messages on every
//! lane; a new B starts at the same address. Every message queued while B
//! was dead must reach the new B, once, in order per lane, within a bound;
//! so must those sent after it started. Three rounds: the bug needed path
//! 0's reconnect to be under way when the dead peer's last path was
//! reported down, which depends on the order in which the reactor reports
//! them (here it usually reports all 8 before the reconnect starts: these
//! tests passed with the old rule too; rds-core's `path/tests.rs` and
//! rds-sim's receive-only node reproduce the order deterministically, and
//! rds-preload's conform_host "tools" with 8 paths failed in both runs).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rds_core::{PathState, TransportKind};
use rds_sock::{Engine, EngineConfig, RdsSocket};
use rds_tests::*;

const A: u8 = 1;
const B: u8 = 2;
const PORT_B: u16 = 7000;
const LANES: u16 = 8;
/// Messages per lane per batch.
const PER: u64 = 20;
const ROUNDS: u64 = 3;
/// Every wait is bounded by this.
const WAIT: Duration = Duration::from_secs(30);

/// Node `n`'s address in test network `net` (each test its own: the
/// tests of this file run in parallel in one process).
fn ip(net: u8, n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, net, n))
}

/// The flow id of lane `lane`'s stream (as rds-node reads it).
fn flow(lane: u16) -> u32 {
    u32::from(A) << 8 | u32::from(B) << 4 | u32::from(lane)
}

fn len_of(index: u64) -> usize {
    16 + (index.wrapping_mul(7919) % 1500) as usize
}

/// What a B process received: per flow, the indexes in arrival order.
#[derive(Default)]
struct Seen {
    ready: bool,
    flows: HashMap<u32, Vec<u64>>,
    bad: Vec<String>,
}

/// A B process. Dropping it kills it (SIGKILL) and reaps it.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    seen: Arc<Mutex<Seen>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn start(net: u8, instance: u8) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rds-node"))
            .args(["--ip", &ip(net, B).to_string(), "--port", &PORT_B.to_string()])
            .args(["--instance", &instance.to_string(), "--exts", "full"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start rds-node");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let mut s = s.lock().unwrap();
                let w: Vec<&str> = line.split_whitespace().collect();
                match w.as_slice() {
                    ["READY", _] => s.ready = true,
                    ["R", _from, f, i, _len] => match (f.parse(), i.parse()) {
                        (Ok(f), Ok(i)) => s.flows.entry(f).or_default().push(i),
                        _ => s.bad.push(line.clone()),
                    },
                    _ => s.bad.push(line.clone()),
                }
            }
        });
        let p = Proc { child, stdin, seen };
        wait_for("B ready", &|| String::new(), || p.seen.lock().unwrap().ready);
        p
    }

    /// Ends the process as B's own exit would (end of its stdin: rds-node
    /// returns from main), as rds-gen's process ended in the conformance
    /// run that found the bug; waits until it is gone.
    fn exit(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + WAIT;
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "B did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lane `lane`'s indexes received so far.
    fn got(&self, lane: u16) -> Vec<u64> {
        self.seen.lock().unwrap().flows.get(&flow(lane)).cloned().unwrap_or_default()
    }
}

fn wait_for(what: &str, diag: &dyn Fn() -> String, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !ok() {
        if Instant::now() > deadline {
            panic!("timed out after {WAIT:?} waiting for {what}\n{}", diag());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A's paths to B: (up, states and queued messages per path).
fn paths(e: &Engine, net: u8) -> (usize, String) {
    let mut up = 0;
    let mut d = String::new();
    for c in e.connections().iter().filter(|k| k.faddr == ip(net, B) && k.transport == TransportKind::Tcp) {
        d += &format!("npaths {}:", c.npaths);
        for (i, p) in c.paths.iter().enumerate() {
            up += usize::from(p.state == PathState::Up);
            d += &format!(" [{i} {:?} connects {} queued {}+{}]", p.state, p.connects, p.send_queue, p.retrans);
        }
    }
    (up, d)
}

fn send_batch(socks: &[RdsSocket], net: u8, from: u64) {
    for i in from..from + PER {
        for (lane, s) in socks.iter().enumerate() {
            s.send_to(&payload(flow(lane as u16), i, len_of(i)), sa(ip(net, B), PORT_B)).unwrap();
        }
    }
}

/// B received exactly `want` on every lane, in order, once each.
fn assert_lanes(b: &Proc, want: std::ops::Range<u64>, what: &str) {
    let want: Vec<u64> = want.collect();
    for lane in 0..LANES {
        assert_eq!(b.got(lane), want, "{what}: lane {lane} (in order, no loss, no duplicate)");
    }
    assert!(b.seen.lock().unwrap().bad.is_empty(), "{what}: bad lines {:?}", b.seen.lock().unwrap().bad);
}

/// B is killed (SIGKILL).
#[test]
fn eight_paths_reconnect_to_a_killed_and_restarted_receive_only_peer() {
    run(false);
}

/// B's process exits by itself, as rds-gen's did in the conformance run.
#[test]
fn eight_paths_reconnect_to_a_receive_only_peer_whose_process_exited() {
    run(true);
}

fn run(exits: bool) {
    let net = u8::from(exits);
    let cfg = EngineConfig { info_dir: None, ..EngineConfig::default() };
    assert_eq!(cfg.node.npaths, 8);
    let engine = Engine::new(cfg).unwrap();
    let socks: Vec<RdsSocket> = (0..LANES)
        .map(|lane| {
            let s = engine.socket().unwrap();
            s.bind(sa(ip(net, A), 6000 + lane)).unwrap();
            s.set_send_buffer_size_force(4 << 20).unwrap();
            s.set_write_timeout(Some(WAIT)).unwrap();
            s
        })
        .collect();
    let diag = || paths(&engine, net).1;

    let mut b = Proc::start(net, 1);
    send_batch(&socks, net, 0);
    wait_for("the first batch at B", &diag, || (0..LANES).all(|l| b.got(l).len() as u64 >= PER));
    assert_lanes(&b, 0..PER, "first B");
    wait_for("8 paths up", &diag, || paths(&engine, net).0 == 8);
    for s in &socks {
        assert!(s.flush(WAIT), "first batch acked");
    }

    for round in 1..=ROUNDS {
        // B goes away: killed, or its process exits.
        if exits {
            b.exit();
        } else {
            drop(b);
        }
        wait_for("every path down", &diag, || paths(&engine, net).0 == 0);
        // Path 0's reconnects to the closed port fail meanwhile.
        std::thread::sleep(Duration::from_millis(300));
        // Queued while B is dead, on every lane.
        let dead = round * 2 * PER;
        send_batch(&socks, net, dead);
        std::thread::sleep(Duration::from_millis(200));
        b = Proc::start(net, round as u8 + 1);
        wait_for(
            &format!("round {round}: the batch queued while B was dead"),
            &|| format!("{} / B got {:?}", diag(), (0..LANES).map(|l| b.got(l).len()).collect::<Vec<_>>()),
            || (0..LANES).all(|l| b.got(l).len() as u64 >= PER),
        );
        // And after it came back.
        send_batch(&socks, net, dead + PER);
        wait_for(&format!("round {round}: the batch after the restart"), &diag, || {
            (0..LANES).all(|l| b.got(l).len() as u64 >= 2 * PER)
        });
        for s in &socks {
            assert!(s.flush(WAIT), "round {round}: acked");
        }
        assert_lanes(&b, dead..dead + 2 * PER, &format!("round {round}"));
        wait_for(&format!("round {round}: 8 paths up"), &diag, || paths(&engine, net).0 == 8);
        assert_eq!(socks.iter().map(|s| s.flushed()).sum::<u64>(), 0, "nothing was in doubt: nothing flushed");
    }
}
