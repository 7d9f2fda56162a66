//! RDS_CANCEL_SENT_TO (`rds_send_drop_to`) and socket close (`rds_release`).

use rds_core::*;
use rds_testkit::net::{Net, sa};

fn texts(v: Vec<Vec<u8>>) -> Vec<String> {
    v.into_iter().map(|p| String::from_utf8(p).unwrap()).collect()
}

#[test]
fn cancel_drops_exactly_that_sockets_messages_to_that_destination() {
    let mut net = Net::new(3);
    let a = net.bound(0, 5000); // lane 0 of 8
    let a2 = net.bound(0, 5008); // lane 0 of 8
    let b1 = net.bound(1, 4000);
    let b2 = net.bound(1, 4001);
    let c = net.bound(2, 4000);
    // Connections and handshakes first.
    for (s, d) in [(a, sa(2, 4000)), (a, sa(3, 4000))] {
        net.send(0, s, d, b"hello").unwrap();
    }
    net.run();
    assert_eq!(texts(net.drain_payloads(1, b1)), ["hello"]);
    assert_eq!(texts(net.drain_payloads(2, c)), ["hello"]);

    // Transmitted (and delivered) but not acked.
    net.hold_acks = true;
    net.send(0, a, sa(2, 4000), b"u1").unwrap();
    net.send(0, a, sa(2, 4001), b"u2").unwrap();
    net.send(0, a, sa(3, 4000), b"u3").unwrap();
    net.send(0, a2, sa(2, 4000), b"v1").unwrap();
    net.run();
    // Still queued.
    net.frozen.insert((0, 0));
    net.send(0, a, sa(2, 4000), b"q1-long").unwrap();
    net.send(0, a, sa(2, 4001), b"q2").unwrap();
    net.send(0, a, sa(3, 4000), b"q3").unwrap();
    net.send(0, a2, sa(2, 4000), b"w1").unwrap();
    net.run();
    assert_eq!(net.nodes[0].pending_messages(a), 6);
    assert_eq!(net.nodes[0].snd_bytes(a), 2 + 2 + 2 + 7 + 2 + 2);

    // Cancel a -> 127.0.0.2:4000: u1 (unacked) and q1 (queued).
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(2, 4000))), 2);
    assert_eq!(net.nodes[0].counters().send_drop_cancelled, 2);
    assert_eq!(net.nodes[0].pending_messages(a), 4);
    assert_eq!(net.nodes[0].snd_bytes(a), 2 + 2 + 2 + 2);
    assert_eq!(net.nodes[0].pending_messages(a2), 2, "the other socket keeps its messages");
    // Cancelling again finds nothing.
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(2, 4000))), 0);

    net.hold_acks = false;
    net.flush_acks();
    net.thaw(0, 0);
    net.run();
    // u1 had already been delivered when it was cancelled; q1 never goes out.
    assert_eq!(texts(net.drain_payloads(1, b1)), ["u1", "v1", "w1"]);
    assert_eq!(texts(net.drain_payloads(1, b2)), ["u2", "q2"]);
    assert_eq!(texts(net.drain_payloads(2, c)), ["u3", "q3"]);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    assert_eq!(net.nodes[0].snd_bytes(a2), 0);
    // The receiver saw a gap in the sequence numbers and accepted it.
    let seqs: Vec<u64> = net
        .data_sent_by(0)
        .iter()
        .filter(|m| net.nodes[0].path_info(m.path).unwrap().faddr == net.addrs[1])
        .filter(|m| m.header.sequence > 0)
        .map(|m| m.header.sequence)
        .collect();
    assert!(seqs.windows(2).any(|w| w[1] > w[0] + 1), "a gap: {seqs:?}");
    assert_eq!(net.nodes[1].counters().recv_drop_old_seq, 0);
    assert!(!net.wire.iter().any(|m| &m.payload[..] == b"q1-long"));
}

#[test]
fn cancel_is_per_destination_address_and_port() {
    let mut net = Net::new(3);
    let a = net.bound(0, 5000);
    net.frozen.insert((0, 0));
    for d in [sa(2, 4000), sa(2, 4001), sa(3, 4000), sa(2, 4000)] {
        net.send(0, a, d, b"m").unwrap();
    }
    net.run();
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(3, 4001))), 0);
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(3, 4000))), 1);
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(2, 4000))), 2);
    assert_eq!(net.nodes[0].pending_messages(a), 1);
    // With no destination, everything of the socket goes.
    assert_eq!(net.nodes[0].drop_messages(a, None), 1);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    // An unbound socket has nothing to cancel.
    let u = net.nodes[0].socket();
    assert_eq!(net.nodes[0].drop_messages(u, Some(sa(2, 4000))), 0);
}

#[test]
fn cancel_wakes_a_sender_blocked_on_the_send_buffer() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    net.frozen.insert((0, 0));
    net.nodes[0].setsockopt(a, SockOpt::SndBuf(5000)).unwrap();
    net.send(0, a, sa(2, 4000), &[0; 5000]).unwrap();
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 1]), Err(Errno::EAGAIN));
    net.run();
    net.wakes.clear();
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(2, 4000))), 1);
    net.run();
    assert!(net.wakes.contains(&(0, a)));
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 1]), Ok(1));
}

#[test]
fn close_drops_the_sockets_messages_and_frees_its_port() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let a2 = net.bound(0, 5008);
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"first").unwrap();
    net.run();
    assert_eq!(texts(net.drain_payloads(1, b)), ["first"]);
    net.hold_acks = true;
    net.send(0, a, sa(2, 4000), b"unacked").unwrap();
    net.run();
    net.frozen.insert((0, 0));
    net.send(0, a, sa(2, 4000), b"queued-1").unwrap();
    net.send(0, a, sa(2, 4000), b"queued-2").unwrap();
    net.send(0, a2, sa(2, 4000), b"other").unwrap();
    net.run();
    assert_eq!(net.nodes[0].close(a), 3);
    assert_eq!(net.nodes[0].counters().send_drop_cancelled, 3);
    assert_eq!(net.nodes[0].local_addr(a), None);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    net.hold_acks = false;
    net.flush_acks();
    net.thaw(0, 0);
    net.run();
    assert_eq!(texts(net.drain_payloads(1, b)), ["unacked", "other"]);
    // The port is free again, and the old id names nothing.
    let again = net.bound(0, 5000);
    assert_ne!(again, a);
    assert_eq!(net.nodes[0].send(a, Some(sa(2, 4000)), &Payload::empty(), &SendOptions::default()), Err(Errno::EINVAL));
    // Messages for the closed port are dropped at the receiver.
    net.nodes[1].close(b);
    net.send(0, a2, sa(2, 4000), b"nobody").unwrap();
    net.run();
    assert_eq!(net.nodes[1].counters().recv_drop_no_sock, 1);
}

#[test]
fn closing_a_congested_socket_clears_its_bit() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    net.send(0, a, sa(2, 4000), &[0; 2001]).unwrap();
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 1]), Err(Errno::ENOBUFS));
    net.nodes[1].close(b);
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 1]), Ok(1));
}
