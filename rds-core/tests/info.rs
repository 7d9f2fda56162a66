//! Introspection snapshots (`Node::info_*`): connections with every path,
//! sockets, and the send, retransmit and receive queues, with exact content.

use rds_core::info::conn_flags;
use rds_core::*;
use rds_testkit::net::{Net, ip, sa};

#[test]
fn connections_list_every_path_with_states_flags_and_sequences() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let _b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    net.run();
    let conns = net.nodes[0].info_connections();
    assert_eq!(conns.len(), 1, "{conns:?}");
    let c = &conns[0];
    assert_eq!((c.laddr, c.faddr, c.transport, c.tos, c.npaths), (ip(1), ip(2), TransportKind::Tcp, 0, 8));
    assert_eq!(c.paths.len(), 8);
    assert_eq!(c.paths_up(), 8);
    for (i, p) in c.paths.iter().enumerate() {
        assert_eq!(p.index as usize, i);
        assert_eq!((p.state, p.flags), (PathState::Up, conn_flags::CONNECTED));
        assert_eq!((p.send_queue, p.retrans, p.queued_bytes), (0, 0, 0));
        assert_eq!(p.connects, 1);
    }
    // Both sides probe (the accepting side too): on path 0 we sent our
    // probe (1), the data (2) and the pong to the peer's probe (3), and
    // received the peer's probe (1) and its pong (2).
    assert_eq!((c.path0().next_tx_seq, c.path0().next_rx_seq), (4, 3));
    assert_eq!(c.paths[1].next_tx_seq, 1);
    // The peer's view of the same connection.
    let peer = &net.nodes[1].info_connections()[0];
    assert_eq!((peer.laddr, peer.faddr, peer.npaths, peer.paths_up()), (ip(2), ip(1), 8, 8));
    assert_eq!((peer.path0().next_tx_seq, peer.path0().next_rx_seq), (3, 4));
}

#[test]
fn a_connection_still_connecting_is_flagged_so() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    net.send(0, a, sa(2, 4000), b"x").unwrap();
    // The connect is requested but not answered yet.
    let c = &net.nodes[0].info_connections()[0];
    assert_eq!((c.path0().state, c.path0().flags), (PathState::Connecting, conn_flags::CONNECTING));
    assert_eq!(c.npaths, 0, "handshake pending");
    assert_eq!((c.path0().send_queue, c.path0().queued_bytes), (2, 1), "probe and data queued");
    assert!(c.paths[1..].iter().all(|p| p.state == PathState::Down && p.flags == 0));
}

#[test]
fn sockets_show_halved_buffers_addresses_and_queue_sizes() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    let unbound = net.nodes[0].socket();
    net.nodes[0].connect(a, sa(2, 4000)).unwrap();
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(10_000)).unwrap();
    for i in 0..3u8 {
        net.send(0, a, sa(2, 4000), &[i; 700]).unwrap();
    }
    net.run();
    let socks = net.nodes[0].info_sockets();
    assert_eq!(socks.len(), 2);
    let sa_ = socks.iter().find(|s| s.bound == Some(sa(1, 5000))).unwrap();
    assert_eq!(sa_.connected, Some(sa(2, 4000)));
    assert_eq!((sa_.sndbuf, sa_.rcvbuf), (212_992 / 2, 212_992 / 2));
    assert_eq!(sa_.snd_bytes, 0, "everything acked");
    assert_eq!(sa_.transport, Some(TransportKind::Tcp));
    let un = socks.iter().find(|s| s.bound.is_none()).unwrap();
    assert_eq!((un.connected, un.transport), (None, None));
    assert_ne!(un.inum, sa_.inum);
    assert_eq!(un.inum, info::inum_of(unbound));
    assert_eq!(sa_.inum, info::inum_of(a));
    let sb = &net.nodes[1].info_sockets()[0];
    assert_eq!((sb.sndbuf, sb.rcvbuf), (212_992 / 2, 20_000 / 2));
    assert_eq!((sb.recv_queue, sb.rcv_bytes), (3, 2100));
}

#[test]
fn queues_list_each_message_in_order_with_addresses_ports_and_lengths() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000); // lane 0
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"hello").unwrap();
    net.run();
    net.drain(1, b);
    let seq0 = net.nodes[0].info_connections()[0].path0().next_tx_seq;

    // Two transmitted but unacked, then two never transmitted.
    net.hold_acks = true;
    net.send(0, a, sa(2, 4000), &[1; 10]).unwrap();
    net.send(0, a, sa(2, 4001), &[2; 20]).unwrap();
    net.run();
    net.frozen.insert((0, 0));
    net.send(0, a, sa(2, 4000), &[3; 30]).unwrap();
    net.send(0, a, sa(2, 4000), &[4; 40]).unwrap();
    net.run();

    let n = &net.nodes[0];
    let row = |seq: u64, len: u32, fport: u16| MsgSnapshot {
        seq,
        len,
        laddr: ip(1),
        lport: 5000,
        faddr: ip(2),
        fport,
        tos: 0,
        path: Some(0),
    };
    assert_eq!(n.info_messages(Queue::Retrans), vec![row(seq0, 10, 4000), row(seq0 + 1, 20, 4001)]);
    assert_eq!(n.info_messages(Queue::Send), vec![row(seq0 + 2, 30, 4000), row(seq0 + 3, 40, 4000)]);
    assert!(n.info_messages(Queue::Recv).is_empty());

    // The receiver: the first two are on its socket's queue (port 4001 has
    // no socket), addressed from the receiver's side.
    let r = net.nodes[1].info_messages(Queue::Recv);
    assert_eq!(
        r,
        vec![MsgSnapshot {
            seq: seq0,
            len: 10,
            laddr: ip(2),
            lport: 4000,
            faddr: ip(1),
            fport: 5000,
            tos: 0,
            path: None
        }]
    );
    assert!(net.nodes[1].info_messages(Queue::Send).is_empty());

    // Cancel empties both queues of that destination.
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(2, 4000))), 3);
    assert_eq!(net.nodes[0].info_messages(Queue::Retrans), vec![row(seq0 + 1, 20, 4001)]);
    assert!(net.nodes[0].info_messages(Queue::Send).is_empty());
}
