//! RDMA completion notifications (`RDS_CMSG_RDMA_STATUS`) over an IB-like
//! transport: the transport's report (`Node::rdma_complete`) queues the
//! notification with its status, exactly once per op, whatever the ack or
//! a later drop says; without a report the ack notifies SUCCESS.

use rds_core::message::{rdma_flags, rdma_status};
use rds_core::*;
use rds_testkit::net::*;

fn op(flags: u32, token: u64) -> RdmaOp {
    RdmaOp {
        remote_cookie: 0x64_0000_0123,
        remote_addr: 0,
        remote_len: 8,
        local: vec![rds_core::RdmaBuf::new(8).all()],
        flags,
        user_token: token,
    }
}

fn send_op(net: &mut Net, s: SockId, o: RdmaOp) -> u64 {
    let opts = SendOptions { rdma: Some(o), ..SendOptions::default() };
    net.nodes[0].send(s, Some(sa(2, 4000)), &Payload::copy_from(b"with op"), &opts).unwrap();
    net.run();
    net.data_sent_by(0).last().expect("sent").header.sequence
}

fn statuses(r: Vec<Received>) -> Vec<(u64, i32)> {
    r.into_iter()
        .filter_map(|r| match r {
            Received::RdmaStatus { user_token, status } => Some((user_token, status)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_transports_status_is_notified_once() {
    let mut net = Net::with_configs(vec![config(0), config(1)], TransportKind::Ib);
    net.hold_acks = true;
    let a = net.bound(0, 4000);
    let _b = net.bound(1, 4000);
    let seq = send_op(&mut net, a, op(rdma_flags::NOTIFY_ME | rdma_flags::READWRITE, 7));
    let pid = net.path(0, 1, 0);
    let inst = net.links[&(0, pid)].inst;
    // Nothing before the transport reports.
    assert!(statuses(net.drain(0, a)).is_empty());
    net.nodes[0].rdma_complete(pid, inst, seq, rdma_status::REMOTE_ERROR);
    // A second report, an older instance's, and the ack add nothing.
    net.nodes[0].rdma_complete(pid, inst, seq, rdma_status::SUCCESS);
    net.nodes[0].rdma_complete(pid, inst.wrapping_sub(1), seq, rdma_status::OTHER_ERROR);
    net.flush_acks();
    net.run();
    assert_eq!(statuses(net.drain(0, a)), vec![(7, rdma_status::REMOTE_ERROR)]);
    assert_eq!(net.nodes[0].pending_messages(a), 0, "the message itself was acked");
}

#[test]
fn without_a_report_the_ack_notifies_success() {
    let mut net = Net::with_configs(vec![config(0), config(1)], TransportKind::Ib);
    let a = net.bound(0, 4000);
    let _b = net.bound(1, 4000);
    send_op(&mut net, a, op(rdma_flags::NOTIFY_ME, 9));
    assert_eq!(statuses(net.drain(0, a)), vec![(9, rdma_status::SUCCESS)]);
}

#[test]
fn a_failure_without_notify_me_is_reported_only_with_recverr() {
    let mut net = Net::with_configs(vec![config(0), config(1)], TransportKind::Ib);
    net.hold_acks = true;
    let a = net.bound(0, 4000);
    let _b = net.bound(1, 4000);
    let pid_inst = |net: &Net| {
        let pid = net.path(0, 1, 0);
        (pid, net.links[&(0, pid)].inst)
    };
    // No NOTIFY_ME, no RECVERR: a failed op is silent.
    let seq = send_op(&mut net, a, op(0, 1));
    let (pid, inst) = pid_inst(&net);
    net.nodes[0].rdma_complete(pid, inst, seq, rdma_status::OTHER_ERROR);
    assert!(statuses(net.drain(0, a)).is_empty());
    // With RECVERR it is reported; a success is not.
    net.nodes[0].setsockopt(a, SockOpt::RecvErr(true)).unwrap();
    let seq = send_op(&mut net, a, op(0, 2));
    net.nodes[0].rdma_complete(pid, inst, seq, rdma_status::OTHER_ERROR);
    let seq = send_op(&mut net, a, op(0, 3));
    net.nodes[0].rdma_complete(pid, inst, seq, rdma_status::SUCCESS);
    net.flush_acks();
    net.run();
    assert_eq!(statuses(net.drain(0, a)), vec![(2, rdma_status::OTHER_ERROR)]);
}

/// An op's local buffers are `RdmaBuf` segments, never raw addresses: the
/// queued message holds a handle to each buffer (so the caller may drop
/// its own at once and the memory still lives while the transport may use
/// it), and every way out of the queues lets go: the ack, a cancel, the
/// socket's close, the node's end.
#[test]
fn queued_ops_hold_their_buffers_until_acked_cancelled_or_closed() {
    let mut net = Net::with_configs(vec![config(0), config(1)], TransportKind::Ib);
    net.hold_acks = true;
    let a = net.bound(0, 4000);
    let _b = net.bound(1, 4000);
    let buf = RdmaBuf::from_slice(&[5u8; 64]);
    let with = |flags| RdmaOp { local: vec![buf.seg(0, 32).unwrap(), buf.seg(32, 32).unwrap()], ..op(flags, 3) };
    // Acked.
    send_op(&mut net, a, with(rdma_flags::NOTIFY_ME));
    assert_eq!(buf.handles(), 3, "the unacked message holds both segments");
    net.flush_acks();
    net.run();
    assert_eq!(statuses(net.drain(0, a)), vec![(3, rdma_status::SUCCESS)]);
    assert_eq!(buf.handles(), 1, "acked: released");
    // Cancelled (RDS_CANCEL_SENT_TO).
    send_op(&mut net, a, with(rdma_flags::NOTIFY_ME));
    send_op(&mut net, a, with(0));
    assert_eq!(buf.handles(), 5);
    assert_eq!(net.nodes[0].drop_messages(a, Some(sa(2, 4000))), 2);
    assert_eq!(buf.handles(), 1, "cancelled: released");
    assert_eq!(statuses(net.drain(0, a)), vec![(3, rdma_status::CANCELED)]);
    // Closed with the op unacked.
    send_op(&mut net, a, with(rdma_flags::NOTIFY_ME));
    assert_eq!(buf.handles(), 3);
    assert_eq!(net.nodes[0].close(a), 1);
    assert_eq!(buf.handles(), 1, "closed: released");
    // The node goes (engine shutdown) with an op unacked.
    let a = net.bound(0, 4001);
    send_op(&mut net, a, with(rdma_flags::NOTIFY_ME));
    assert_eq!(buf.handles(), 3);
    drop(net);
    assert_eq!(buf.handles(), 1, "node dropped: released");
    // The bytes are the caller's, untouched by all this.
    assert_eq!(buf.to_vec(), vec![5u8; 64]);
}
