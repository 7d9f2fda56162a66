//! A socket receives only over its own transport: on an address served by
//! both TCP and IB, what arrives on a TCP connection never reaches a socket
//! bound with transport IB (and the other way round), is counted as
//! `recv_drop_no_sock`, and the same message over the socket's own
//! transport, or from a socket of the same node (loopback), is delivered.
//! Without this, anyone reaching a node's RDS-TCP port reaches its IB
//! sockets, and the verbs-only setup's pre-shared key protects nothing.

use std::time::Instant;

use rds_core::driver;
use rds_core::wire::Header;
use rds_core::*;
use rds_testkit::net::{config, data, ip, sa};

/// Node 127.0.0.2 with TCP, IB and loopback registered and its address
/// served by IB and TCP (as the engine serves an address of an RDMA
/// device), socket `ib_sock` bound to port 4000 with the preferred
/// transport (IB), `tcp_sock` to port 4001 with SO_RDS_TRANSPORT = TCP,
/// and a TCP and an IB connection accepted from a peer at 127.0.0.1.
struct Setup {
    node: Node,
    ib_sock: SockId,
    tcp_sock: SockId,
    tcp_path: PathInfo,
    ib_path: PathInfo,
    seq: u64,
}

fn setup() -> Setup {
    let mut node = Node::new(config(2));
    node.register_transport(TransportCaps::tcp());
    node.register_transport(TransportCaps::ib());
    node.register_transport(TransportCaps::loopback());
    node.add_local(ip(2), TransportKind::Ib);
    node.add_local(ip(2), TransportKind::Tcp);
    let ib_sock = node.socket();
    node.bind(ib_sock, sa(2, 4000)).unwrap();
    assert_eq!(node.getsockopt(ib_sock, SockOpt::Transport(0)), Ok(u64::from(TransportKind::Ib.uapi())));
    let tcp_sock = node.socket();
    node.setsockopt(tcp_sock, SockOpt::Transport(TransportKind::Tcp.uapi() as i32)).unwrap();
    node.bind(tcp_sock, sa(2, 4001)).unwrap();
    assert_eq!(node.getsockopt(tcp_sock, SockOpt::Transport(0)), Ok(u64::from(TransportKind::Tcp.uapi())));
    let Accept::Path(tcp_path) = node.accept(TransportKind::Tcp, ip(2), ip(1), 40000, Instant::now()) else {
        panic!("TCP not accepted")
    };
    let Accept::Path(ib_path) = node.accept(TransportKind::Ib, ip(2), ip(1), 0, Instant::now()) else {
        panic!("IB not accepted")
    };
    assert_eq!((tcp_path.kind, ib_path.kind), (TransportKind::Tcp, TransportKind::Ib));
    node.path_up(tcp_path.id, tcp_path.inst, Instant::now());
    node.path_up(ib_path.id, ib_path.inst, Instant::now());
    driver::outputs(&mut node);
    Setup { node, ib_sock, tcp_sock, tcp_path, ib_path, seq: 0 }
}

impl Setup {
    /// A data message from 127.0.0.1:`sport` to our `dport` on `path`.
    fn arrive(&mut self, path: PathInfo, sport: u16, dport: u16, body: &[u8]) -> RecvOutcome {
        self.seq += 1;
        let mut h = Header::data(sport, dport, body.len() as u32);
        h.sequence = self.seq;
        let m = RxMessage::new(h, Payload::new(body.to_vec()));
        self.node.received(path.id, path.inst, m)
    }

    /// Everything queued on `s`: (source, payload), in order.
    fn drain(&mut self, s: SockId) -> Vec<(std::net::SocketAddr, Vec<u8>)> {
        let mut v = Vec::new();
        while let Ok(r) = self.node.recv(s, false) {
            let i = data(r);
            v.push((i.from, i.payload.to_vec()));
        }
        v
    }
}

#[test]
fn tcp_does_not_reach_a_socket_bound_with_transport_ib() {
    let mut t = setup();
    let (tcp, ib) = (t.tcp_path, t.ib_path);
    // Over TCP to the IB socket: dropped and counted, three times.
    for k in 0..3u8 {
        assert_eq!(t.arrive(tcp, 5000, 4000, &[0xa0 + k; 10]), RecvOutcome::NoSocket, "message {k}");
    }
    assert_eq!(t.node.counters().recv_drop_no_sock, 3);
    assert_eq!(t.node.counters().recv_queued, 0);
    assert!(t.drain(t.ib_sock).is_empty());
    // The same over IB: delivered, in order.
    assert_eq!(t.arrive(ib, 5000, 4000, b"ib one"), RecvOutcome::Delivered);
    assert_eq!(t.arrive(ib, 5000, 4000, b"ib two"), RecvOutcome::Delivered);
    // Over TCP to the TCP socket: delivered; over IB to it: dropped.
    assert_eq!(t.arrive(tcp, 5001, 4001, b"tcp one"), RecvOutcome::Delivered);
    assert_eq!(t.arrive(ib, 5001, 4001, b"ib to tcp"), RecvOutcome::NoSocket);
    assert_eq!(t.node.counters().recv_drop_no_sock, 4);
    assert_eq!(t.node.counters().recv_queued, 3);
    let ib_sock = t.ib_sock;
    let tcp_sock = t.tcp_sock;
    assert_eq!(t.drain(ib_sock), vec![(sa(1, 5000), b"ib one".to_vec()), (sa(1, 5000), b"ib two".to_vec())]);
    assert_eq!(t.drain(tcp_sock), vec![(sa(1, 5001), b"tcp one".to_vec())]);
    // A port nobody bound is still the plain no-socket drop.
    assert_eq!(t.arrive(tcp, 5000, 4999, b"x"), RecvOutcome::NoSocket);
    assert_eq!(t.node.counters().recv_drop_no_sock, 5);
}

#[test]
fn a_socket_of_the_same_node_reaches_it_whatever_the_transports() {
    let mut t = setup();
    // 127.0.0.3 is ours too: its sockets reach ours over the loopback
    // connection, whichever transport either side was bound with.
    t.node.add_local(ip(3), TransportKind::Tcp);
    let local = t.node.socket();
    t.node.bind(local, sa(3, 6000)).unwrap();
    let (ib_sock, tcp_sock) = (t.ib_sock, t.tcp_sock);
    t.node.send(local, Some(sa(2, 4000)), &Payload::new(b"to ib".to_vec()), &SendOptions::default()).unwrap();
    t.node.send(local, Some(sa(2, 4001)), &Payload::new(b"to tcp".to_vec()), &SendOptions::default()).unwrap();
    t.node.send(ib_sock, Some(sa(3, 6000)), &Payload::new(b"from ib".to_vec()), &SendOptions::default()).unwrap();
    // The driver's part: loopback kicks are served on the node itself.
    let mut loops = 0;
    driver::for_each(&mut t.node, |node, o| {
        if let Output::Kick(info) = o {
            if info.kind != TransportKind::Loop {
                return;
            }
            loops += 1;
            assert!(loops < 100, "loopback kicks do not end");
            let mut out = Vec::new();
            node.pull(info.id, info.inst, 1 << 20, &mut out);
            for m in out {
                let seq = m.header.sequence;
                let rx = RxMessage::new(m.header, m.payload);
                assert_eq!(node.received(info.id, info.inst, rx), RecvOutcome::Delivered);
                node.acked(info.id, info.inst, seq);
            }
        }
    });
    assert_eq!(t.drain(ib_sock), vec![(sa(3, 6000), b"to ib".to_vec())]);
    assert_eq!(t.drain(tcp_sock), vec![(sa(3, 6000), b"to tcp".to_vec())]);
    assert_eq!(t.drain(local), vec![(sa(2, 4000), b"from ib".to_vec())]);
    assert_eq!(t.node.counters().recv_drop_no_sock, 0);
}
