//! Unit tests of the path state machine: the kernel's table, and every
//! transition the core makes staying inside it.

use super::PathState::*;
use super::{DownReason, Path, PathInfo};
use crate::message::RxMessage;
use crate::node::{Node, NodeConfig, Output};
use crate::transport::{Accept, TransportCaps};
use crate::types::{Payload, TransportKind};
use crate::wire::Header;
use crate::{PathState, SendOptions};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

fn node(addr: &str, npaths: u8) -> (Node, IpAddr) {
    let mut n = Node::new(NodeConfig { npaths, ..NodeConfig::default() });
    n.register_transport(TransportCaps::tcp());
    let ip: IpAddr = addr.parse().unwrap();
    n.add_local(ip, TransportKind::Tcp);
    (n, ip)
}

/// The Connect, Shutdown and Kick outputs queued so far (Wakes and
/// flow control dropped).
fn drain(n: &mut Node) -> Vec<Output> {
    let mut outs = crate::driver::outputs(n);
    outs.retain(|o| !matches!(o, Output::Wake(_) | Output::RxFlow { .. }));
    outs
}

fn connect_of(outs: &[Output]) -> PathInfo {
    outs.iter().find_map(|o| if let Output::Connect(i) = o { Some(*i) } else { None }).expect("a Connect")
}

/// Every path of every connection of the node stayed inside the table.
fn all_legal(n: &Node) {
    for c in &n.conns {
        for (i, p) in c.paths.iter().enumerate() {
            assert_eq!(p.illegal_transitions, 0, "path {i} of {} -> {}", c.laddr, c.faddr);
        }
    }
}

/// Drives paths through every transition the core makes (connect, a
/// failed connect, reconnect, up, reset, shutdown done, a connection
/// closed while connecting, accept from DOWN and from CONNECTING, a
/// protocol error, an accept that finds the path up, eviction,
/// loopback): each one is in the kernel's table.
#[test]
fn every_transition_the_core_makes_is_the_kernels() {
    let t0 = Instant::now();
    // The smaller address connects.
    let (mut a, la) = node("10.0.0.1", 8);
    let s = a.socket();
    a.bind(s, SocketAddr::new(la, 4000)).unwrap();
    let dst: SocketAddr = "10.0.0.2:5000".parse().unwrap();
    a.send(s, Some(dst), &Payload::copy_from(b"x"), &SendOptions::default()).unwrap();
    let info = connect_of(&drain(&mut a));
    let pid = info.id;
    assert_eq!(a.path_state(pid), Some(Connecting));
    // The connect fails: down, and a reconnect for the queued message.
    a.path_down(pid, info.inst, DownReason::ConnectFailed, t0);
    assert_eq!(a.path_state(pid), Some(Down));
    a.handle_timeout(t0 + Duration::from_secs(5));
    let info = connect_of(&drain(&mut a));
    a.path_up(pid, info.inst, Instant::now());
    assert_eq!(a.path_state(pid), Some(Up));
    // Reset (RDS_CONN_RESET): disconnecting until the transport is done.
    a.reset_path(pid);
    assert_eq!(a.path_state(pid), Some(Disconnecting));
    assert!(drain(&mut a).iter().any(|o| matches!(o, Output::Shutdown(_))));
    a.path_down(pid, info.inst, DownReason::ShutdownDone, t0);
    assert_eq!(a.path_state(pid), Some(Down));
    a.handle_timeout(t0 + Duration::from_secs(10));
    let info = connect_of(&drain(&mut a));
    // Closed while connecting.
    a.path_down(pid, info.inst, DownReason::Closed, t0);
    assert_eq!(a.path_state(pid), Some(Down));
    a.handle_timeout(t0 + Duration::from_secs(20));
    let info = connect_of(&drain(&mut a));
    // Dropped while connecting (eviction, a peer restart): the core
    // drops the path, the transport closes it.
    a.drop_path(pid);
    assert_eq!(a.path_state(pid), Some(Disconnecting));
    a.path_down(pid, info.inst, DownReason::ShutdownDone, t0);
    assert_eq!(a.path_state(pid), Some(Down));
    // Loopback: up from the start.
    a.send(s, Some(SocketAddr::new(la, 4001)), &Payload::copy_from(b"y"), &SendOptions::default()).unwrap();
    all_legal(&a);

    // The larger address accepts: DOWN -> UP through CONNECTING. (One
    // path: which slot a second connection takes is then clear.)
    let (mut b, lb) = node("10.0.0.2", 1);
    let Accept::Path(binfo) = b.accept(TransportKind::Tcp, lb, la, 40000, Instant::now()) else { panic!("accepted") };
    assert_eq!(b.path_state(binfo.id), Some(Up));
    // A protocol error (a map of the wrong size): the core drops it.
    let bad = RxMessage::new(Header::cong_map(), Payload::copy_from(&[0; 10]));
    b.received(binfo.id, binfo.inst, bad);
    assert_eq!(b.path_state(binfo.id), Some(Disconnecting));
    b.path_down(binfo.id, binfo.inst, DownReason::ProtocolError, t0);
    assert_eq!(b.path_state(binfo.id), Some(Down));
    // Accepted again, then a second connection for the path while it is
    // up: the one up is dropped, the new one waits.
    let Accept::Path(binfo) = b.accept(TransportKind::Tcp, lb, la, 40001, Instant::now()) else { panic!("accepted") };
    assert_eq!(b.accept(TransportKind::Tcp, lb, la, 40002, Instant::now()), Accept::Defer);
    assert_eq!(b.path_state(binfo.id), Some(Disconnecting));
    b.path_down(binfo.id, binfo.inst, DownReason::Closed, t0);
    assert_eq!(b.path_state(binfo.id), Some(Down));
    // Closed while up.
    let Accept::Path(binfo) = b.accept(TransportKind::Tcp, lb, la, 40003, Instant::now()) else { panic!("accepted") };
    b.path_down(binfo.id, binfo.inst, DownReason::Closed, t0);
    assert_eq!(b.path_state(binfo.id), Some(Down));
    all_legal(&b);

    // Accept while our own connect is under way (IB: either side
    // connects): CONNECTING -> UP.
    let mut c = Node::new(NodeConfig::default());
    c.register_transport(TransportCaps::ib());
    c.add_local(la, TransportKind::Ib);
    let s = c.socket();
    c.bind(s, SocketAddr::new(la, 4000)).unwrap();
    c.send(s, Some(dst), &Payload::copy_from(b"x"), &SendOptions::default()).unwrap();
    let info = connect_of(&drain(&mut c));
    assert_eq!(c.path_state(info.id), Some(Connecting));
    let Accept::Path(cinfo) = c.accept(TransportKind::Ib, la, lb, 0, Instant::now()) else { panic!("accepted") };
    assert_eq!(c.path_state(cinfo.id), Some(Up));
    all_legal(&c);
}

#[test]
fn an_illegal_transition_is_refused() {
    let mut p = Path::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.set_state(PathState::Up)));
    // A debug build panics; a release build refuses and counts.
    assert!(matches!(r, Err(_) | Ok(false)));
    assert_eq!(p.state, Down);
    assert_eq!(p.illegal_transitions, u32::from(r.is_ok()));
    assert!(p.set_state(Connecting) && p.set_state(Up));
}

#[test]
fn kernel_transitions() {
    assert!(Down.can_go(Connecting));
    assert!(Connecting.can_go(Up));
    assert!(Up.can_go(Disconnecting));
    assert!(Error.can_go(Disconnecting));
    assert!(Disconnecting.can_go(Down));
    assert!(Up.can_go(Error) && Down.can_go(Error));
    assert!(!Down.can_go(Up));
    assert!(!Up.can_go(Down));
    assert!(!Connecting.can_go(Down));
}

/// The Connects among `outs`, by path index.
fn connects(outs: &[Output]) -> Vec<PathInfo> {
    outs.iter().filter_map(|o| if let Output::Connect(i) = o { Some(*i) } else { None }).collect()
}

/// The smaller address with 8 paths up to a peer whose process then dies:
/// path 0 is reported gone first and its reconnect is under way (to a
/// closed port) when the other 7 are. That connect fails with nothing
/// queued, so nothing retries it. A message then sent on a lane above 0
/// must still make path 0 connect (paths above 0 connect only after path
/// 0), and path 0 must keep retrying while the message waits: before, the
/// path count stayed 8 (the connection was never all DOWN at once, path 0
/// was CONNECTING), the message went to path 7, which may not connect
/// before path 0, and nothing ever connected path 0 again.
#[test]
fn a_message_on_a_lane_above_0_reconnects_path_0_after_the_peer_died() {
    let t0 = Instant::now();
    let (mut a, la) = node("10.0.0.1", 8);
    let lb: IpAddr = "10.0.0.2".parse().unwrap();
    let c = a.conn_for(la, lb, TransportKind::Tcp, 0);
    let p = |i: u8| crate::types::PathId { conn: c, index: i };
    // Path 0, the handshake (8 paths), then paths 1..8 in order.
    a.connect_if_down(p(0));
    let info = connect_of(&drain(&mut a));
    a.path_up(p(0), info.inst, Instant::now());
    a.conns[c].npaths = 8;
    a.confirm_path(p(0));
    let mut insts = vec![info.inst];
    for i in 1..8u8 {
        let outs = drain(&mut a);
        let got = connects(&outs);
        assert_eq!(got.iter().map(|x| x.id.index).collect::<Vec<_>>(), vec![i], "fan-out in order");
        a.path_up(p(i), got[0].inst, Instant::now());
        a.confirm_path(p(i));
        insts.push(got[0].inst);
    }
    assert!((0..8).all(|i| a.path_state(p(i)) == Some(Up)));
    // Our maps go out.
    let mut out = Vec::new();
    for i in 0..8u8 {
        a.pull(p(i), insts[usize::from(i)], 1 << 20, &mut out);
    }
    assert!(!a.conns[c].map_queued);
    drain(&mut a);

    // The peer dies: path 0 first, its reconnect starts, then the others.
    a.path_down(p(0), insts[0], DownReason::Closed, t0);
    a.handle_timeout(t0);
    let again = connects(&drain(&mut a));
    assert_eq!(again.iter().map(|x| x.id.index).collect::<Vec<_>>(), vec![0], "path 0 reconnects at once");
    for i in 1..8u8 {
        a.path_down(p(i), insts[usize::from(i)], DownReason::Closed, t0);
    }
    a.path_down(p(0), again[0].inst, DownReason::ConnectFailed, t0);
    // Nothing queued: nothing retries (a vanished peer is not retried for ever).
    // (Within the idle collection's minute: the connection stays.)
    a.handle_timeout(t0 + Duration::from_secs(5));
    assert!(connects(&drain(&mut a)).is_empty(), "no connect with nothing queued");
    let states: Vec<_> = (0..8).map(|i| a.path_state(p(i))).collect();
    assert!(states.iter().all(|s| *s == Some(Down)), "{states:?}");

    // A message on lane 7 (port 4007 with 8 paths, or path 0 if the
    // count is to be negotiated again): path 0 connects.
    let s = a.socket();
    a.bind(s, SocketAddr::new(la, 4007)).unwrap();
    let dst = SocketAddr::new(lb, 5000);
    let t1 = t0 + Duration::from_secs(6);
    a.send(s, Some(dst), &Payload::copy_from(b"lane 7"), &SendOptions::default()).unwrap();
    a.handle_timeout(t1);
    let got = connects(&drain(&mut a));
    assert_eq!(got.iter().map(|x| x.id.index).collect::<Vec<_>>(), vec![0], "path 0 connects for the message");
    // The new peer is not up yet: path 0 keeps retrying while the message waits.
    let mut inst = got[0].inst;
    let mut t = t1;
    for round in 0..5 {
        a.path_down(p(0), inst, DownReason::ConnectFailed, t);
        t += Duration::from_secs(2);
        a.handle_timeout(t);
        let got = connects(&drain(&mut a));
        assert_eq!(got.iter().map(|x| x.id.index).collect::<Vec<_>>(), vec![0], "retry {round}");
        inst = got[0].inst;
    }
    // It comes up: the message is on path 0 (the count is negotiated
    // again) or waits on path 7 for the fan-out; either way it is queued once.
    a.path_up(p(0), inst, Instant::now());
    let queued: usize = (0..8).map(|i| a.conns[c].paths[i].queued().0).sum::<usize>();
    assert!(queued >= 1);
    let of_sock: usize =
        a.conns[c].paths.iter().map(|q| q.send_queue.iter().filter(|m| m.sock == Some(s)).count()).sum();
    assert_eq!(of_sock, 1, "the message is queued exactly once");
    all_legal(&a);
}
