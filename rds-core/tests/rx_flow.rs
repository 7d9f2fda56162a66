//! Receive flow control: a socket over its hard cap, or the node over its
//! receive budget, pauses the path that delivered to it (`Output::RxFlow`)
//! instead of dropping what our transport already read (over TCP the peer
//! counts a message delivered once our TCP acked it); the application's
//! reads resume it. Nothing is dropped, nothing is reordered.

use rds_core::driver;
use rds_core::recv::{RCV_HARD_FLOOR, RCV_MSG_OVERHEAD};
use rds_core::wire::{Ext, Header, PROBE_PORT};
use rds_core::*;
use rds_testkit::net::{config, ip, make_node, sa};
use std::time::Instant;

/// A node at 127.0.0.2 with two paths accepted from 127.0.0.1 and a socket
/// bound to port 4000.
fn node(cfg: NodeConfig) -> (Node, Vec<PathInfo>, SockId) {
    let mut node = make_node(cfg, ip(2), TransportKind::Tcp);
    let mut paths = Vec::new();
    for k in 0..2u16 {
        match node.accept(TransportKind::Tcp, ip(2), ip(1), 40000 + k, Instant::now()) {
            Accept::Path(info) => paths.push(info),
            other => panic!("{other:?}"),
        }
        if k == 0 {
            let mut probe = Header::data(PROBE_PORT, 0, 0);
            probe.sequence = 1;
            probe.push_extension(Ext::Npaths(8)).unwrap();
            let m = RxMessage::new(probe, Payload::new(Vec::new()));
            assert_eq!(node.received(paths[0].id, paths[0].inst, m), RecvOutcome::Ping);
        }
    }
    let s = node.socket();
    node.bind(s, sa(2, 4000)).unwrap();
    driver::outputs(&mut node);
    (node, paths, s)
}

fn flows(n: &mut Node) -> Vec<(PathId, bool, u64)> {
    driver::outputs(n)
        .into_iter()
        .filter_map(|o| match o {
            Output::RxFlow { path, paused, seq } => Some((path.id, paused, seq)),
            _ => None,
        })
        .collect()
}

fn data(seq: u64, sport: u16, payload: Payload) -> RxMessage {
    let mut h = Header::data(sport, 4000, payload.len() as u32);
    h.sequence = seq;
    RxMessage::new(h, payload)
}

/// The node budget: the message that crosses it is queued and pauses its
/// path (one RxFlow), the ones the transport had read already are queued
/// too, and reading back under three quarters of the budget resumes it
/// (one RxFlow). Every message arrives once, in order.
#[test]
fn node_budget_pauses_the_path_and_reads_resume_it() {
    const LEN: usize = 64 << 10;
    let budget = 1u64 << 20;
    let (mut n, paths, s) = node(NodeConfig { rcv_budget: budget, ..config(1) });
    let p = paths[0];
    let per = LEN as u64 + RCV_MSG_OVERHEAD;
    let crossing = budget / per + 1; // the first message beyond the budget
    let total = crossing + 10; // what the transport read before it paused
    for i in 1..=total {
        let payload = Payload::new(vec![i as u8; LEN]);
        let r = n.received(p.id, p.inst, data(i + 1, 5000, payload));
        let want = if i < crossing { RecvOutcome::Delivered } else { RecvOutcome::DeliveredPaused };
        assert_eq!(r, want, "message {i}");
        if i == crossing {
            assert_eq!(flows(&mut n), [(p.id, true, 1)]);
            assert!(n.rx_paused(p.id));
        }
    }
    assert_eq!(flows(&mut n), [], "one pause per path");
    assert_eq!(n.rx_held(), total * per);
    assert_eq!((n.counters().recv_queued, n.counters().recv_drop_over_limit), (total, 0));
    assert_eq!((n.counters().recv_pause, n.counters().recv_resume), (1, 0));
    // Read until the resume: under 3/4 of the budget.
    let mut got = 0u64;
    let mut resumed_at = None;
    while let Ok(r) = n.recv(s, false) {
        let Received::Data(inc) = r else { panic!("{r:?}") };
        got += 1;
        assert_eq!((inc.payload.len(), inc.payload[0]), (LEN, got as u8), "content and order");
        let f = flows(&mut n);
        if !f.is_empty() {
            assert_eq!(f, [(p.id, false, 2)]);
            assert!(resumed_at.is_none(), "one resume");
            resumed_at = Some(got);
        }
    }
    assert_eq!(got, total);
    let held_then = (total - resumed_at.unwrap()) * per;
    assert!(held_then <= budget * 3 / 4 && held_then + per > budget * 3 / 4, "resumed at {held_then}");
    assert!(!n.rx_paused(p.id));
    assert_eq!((n.rx_held(), n.counters().recv_resume), (0, 1));
}

/// A socket over its hard cap pauses every path that delivers to it (each
/// once); closing the socket resumes them. Before, messages beyond the cap
/// (plus 1 MiB) were dropped (`recv_drop_over_limit`) after our TCP had
/// acked them.
#[test]
fn socket_cap_pauses_each_delivering_path_and_close_resumes() {
    let (mut n, paths, s) = node(config(1));
    // One shared 1 MiB buffer: the accounting counts it per message.
    let mib = Payload::new(vec![7u8; 1 << 20]);
    let cap = RCV_HARD_FLOOR;
    let crossing = cap / ((1 << 20) + RCV_MSG_OVERHEAD) + 1;
    let mut seq = [1u64, 0];
    for i in 1..=crossing + 5 {
        let k = if i <= crossing { 0 } else { 1 };
        seq[k] += 1;
        let r = n.received(paths[k].id, paths[k].inst, data(seq[k], 5000 + k as u16, mib.clone()));
        assert_eq!(r == RecvOutcome::DeliveredPaused, i >= crossing, "message {i}");
    }
    assert_eq!(flows(&mut n), [(paths[0].id, true, 1), (paths[1].id, true, 2)]);
    assert_eq!((n.counters().recv_queued, n.counters().recv_drop_over_limit), (crossing + 5, 0));
    // A second socket reading does not resume them.
    let s2 = n.socket();
    n.bind(s2, sa(2, 4001)).unwrap();
    assert_eq!(n.recv(s2, false).err(), Some(Errno::EAGAIN));
    assert_eq!(flows(&mut n), []);
    n.close(s);
    let mut f = flows(&mut n);
    f.sort();
    assert_eq!(f, [(paths[0].id, false, 3), (paths[1].id, false, 4)]);
    assert_eq!(n.rx_held(), 0);
}

/// Loopback: the node pauses the path the transport pulls from (a -> b),
/// not the one it delivers on.
#[test]
fn loopback_pauses_the_sending_path() {
    // A receive buffer larger than the budget: congestion does not stop
    // the sender first.
    let cfg = NodeConfig { rcv_budget: 256 << 10, rmem_default: 8 << 20, rmem_max: 8 << 20, ..config(1) };
    let mut n = make_node(cfg, ip(2), TransportKind::Tcp);
    n.add_local(ip(3), TransportKind::Tcp);
    let rx = n.socket();
    n.bind(rx, sa(3, 4000)).unwrap();
    let tx = n.socket();
    n.bind(tx, sa(2, 5000)).unwrap();
    let conn = n.find_conn(ip(2), ip(3), TransportKind::Loop);
    assert!(conn.is_none(), "created by the first send");
    let opts = SendOptions::default();
    let mut paused = None;
    for i in 0..20u8 {
        let r = n.send(tx, Some(sa(3, 4000)), &Payload::new(vec![i; 16 << 10]), &opts);
        assert!(r.is_ok(), "send {i}: {r:?} {}", n.dump());
        driver::for_each(&mut n, |n, o| match o {
            Output::Kick(info) => {
                let mut out = Vec::new();
                n.pull(info.id, info.inst, 1 << 20, &mut out);
                for m in out {
                    let rm = RxMessage::new(m.header, m.payload);
                    n.received(info.id, info.inst, rm);
                    n.acked(info.id, info.inst, m.header.sequence);
                }
            }
            Output::RxFlow { path, paused: true, .. } => paused = Some(path),
            _ => {}
        });
    }
    let via = n.find_conn(ip(2), ip(3), TransportKind::Loop).unwrap();
    assert_eq!(paused.map(|p| p.id), Some(PathId { conn: via, index: 0 }));
    assert_eq!(paused.unwrap().kind, TransportKind::Loop);
}

/// A connection collected while a path of it is paused (every path down,
/// nothing queued to send, idle for `conn_idle_gc`) ends the pause: the
/// transport is told to forget it (an RxFlow resume) and the node keeps no
/// entry for a connection that no longer exists.
#[test]
fn collecting_a_connection_ends_its_pause() {
    use std::time::{Duration, Instant};
    const LEN: usize = 64 << 10;
    let budget = 1u64 << 20;
    let gc = Duration::from_secs(5);
    let (mut n, paths, _s) = node(NodeConfig { rcv_budget: budget, conn_idle_gc: Some(gc), ..config(1) });
    let p = paths[0];
    let mut i = 0u64;
    while !n.rx_paused(p.id) {
        i += 1;
        assert!(i < 1000, "never paused");
        n.received(p.id, p.inst, data(i + 1, 5000, Payload::new(vec![1; LEN])));
    }
    assert_eq!(flows(&mut n), [(p.id, true, 1)]);
    let now = Instant::now();
    for q in &paths {
        n.path_down(q.id, q.inst, DownReason::Closed, now);
    }
    driver::outputs(&mut n);
    let conns = n.conn_count();
    n.handle_timeout(now + gc + Duration::from_secs(1));
    assert_eq!(n.conn_count(), conns - 1, "the idle connection was collected");
    assert_eq!(flows(&mut n), [(p.id, false, 2)], "the transport forgets the pause");
    assert!(!n.rx_paused(p.id));
}
