//! Send-buffer accounting (`rds_send_queue_rm`, `rds_sk_sndbuf`,
//! `sock_setsockopt` SO_SNDBUF / SO_SNDBUFFORCE) and ACK_REQUIRED pacing.

use rds_core::message::RdmaOp;
use rds_core::sock::bufs::{DEFAULT_BUF, SOCK_MIN_RCVBUF, SOCK_MIN_SNDBUF};
use rds_core::*;
use rds_testkit::net::{Net, config, sa};

const LIMIT: usize = DEFAULT_BUF as usize / 2; // rds_sk_sndbuf = sk_sndbuf / 2 = 106496

#[test]
fn accepted_while_old_byte_count_is_below_half_sndbuf_then_eagain() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    let b = net.bound(1, 4000);
    assert_eq!(net.nodes[0].getsockopt(a, SockOpt::SndBuf(0)).unwrap(), u64::from(DEFAULT_BUF));
    // Keep everything queued: path 0 of node 0 is not served yet.
    net.frozen.insert((0, 0));
    let msg = vec![7u8; 40_000];
    // 0 -> 40000 -> 80000 -> 120000: the third is accepted because the old
    // count (80000) is below 106496, and overshoots the limit.
    for k in 0..3 {
        assert_eq!(net.send(0, a, sa(2, 4000), &msg), Ok(40_000), "message {k}");
    }
    assert_eq!(net.nodes[0].snd_bytes(a), 120_000);
    assert!(!net.nodes[0].readiness(a).writable);
    assert_eq!(net.send(0, a, sa(2, 4000), &[1]), Err(Errno::EAGAIN));
    assert_eq!(net.send(0, a, sa(2, 4000), &[]), Err(Errno::EAGAIN), "even a 0-byte message");
    assert_eq!(net.nodes[0].counters().send_queue_full, 2);
    assert_eq!(net.nodes[0].counters().send_queued, 4, "3 messages and the probe");
    assert_eq!(net.nodes[0].snd_bytes(a), 120_000);
    assert_eq!(net.nodes[0].pending_messages(a), 3);
    net.run();
    net.wakes.clear();
    // The acks free the bytes and wake the blocked sender.
    net.thaw(0, 0);
    net.run();
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    assert!(net.wakes.contains(&(0, a)), "wakes: {:?}", net.wakes);
    assert!(net.nodes[0].readiness(a).writable);
    // The 3 messages, our probe and our pong to the peer's probe.
    assert_eq!(net.nodes[0].counters().send_drop_acked, 5);
    // ACK_REQUIRED was set on the messages queued while the count was at
    // least half the limit (40000 < 53248, 80000 and 120000 >= 53248).
    let sent: Vec<bool> = net.data_sent_by(0).iter().map(|m| m.ack_required).collect();
    assert_eq!(sent, [false, true, true]);
    // 120000 bytes made b congested; draining it sends the update that
    // lets a send again.
    assert_eq!(net.send(0, a, sa(2, 4000), &msg), Err(Errno::ENOBUFS));
    assert_eq!(net.drain_payloads(1, b).len(), 3);
    net.run();
    assert_eq!(net.send(0, a, sa(2, 4000), &msg), Ok(40_000));
}

#[test]
fn acks_free_bytes_one_message_at_a_time() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    net.bound(1, 4000);
    net.hold_acks = true;
    for len in [100usize, 2000, 30] {
        net.send(0, a, sa(2, 4000), &vec![0; len]).unwrap();
    }
    net.run();
    assert_eq!(net.nodes[0].snd_bytes(a), 2130);
    // Acks arrive one by one (the probe's ack frees nothing).
    let acks: Vec<_> =
        std::mem::take(&mut net.pending_acks).into_iter().filter(|(i, _, _, seq)| *i == 0 && *seq <= 4).collect();
    let seqs: Vec<u64> = acks.iter().map(|a| a.3).collect();
    assert_eq!(seqs, [1, 2, 3, 4], "probe, then the three messages");
    let mut left = Vec::new();
    for (i, p, inst, seq) in acks {
        net.nodes[i].acked(p, inst, seq);
        left.push(net.nodes[0].snd_bytes(a));
    }
    assert_eq!(left, [2130, 2030, 30, 0]);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    // An ack for an old instance of the path changes nothing.
    let p0 = net.path(0, 1, 0);
    net.hold_acks = false;
    net.send(0, a, sa(2, 4000), &[1; 10]).unwrap();
    net.frozen.insert((0, 0));
    net.run();
    assert_eq!(net.nodes[0].snd_bytes(a), 10);
    let inst = net.links[&(0, p0)].inst;
    net.nodes[0].acked(p0, inst + 1, u64::MAX);
    net.nodes[0].acked(p0, inst - 1, u64::MAX);
    assert_eq!(net.nodes[0].snd_bytes(a), 10);
    net.thaw(0, 0);
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
}

#[test]
fn emsgsize_above_half_sndbuf_and_above_one_mib() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    net.frozen.insert((0, 0));
    assert_eq!(net.send(0, a, sa(2, 4000), &vec![0; LIMIT + 1]), Err(Errno::EMSGSIZE));
    assert_eq!(net.nodes[0].snd_bytes(a), 0);
    assert_eq!(net.send(0, a, sa(2, 4000), &vec![0; LIMIT]), Ok(LIMIT));
    // A larger buffer allows up to 1 MiB, never more.
    let big = net.bound(0, 5001);
    net.nodes[0].setsockopt(big, SockOpt::SndBufForce(4 << 20)).unwrap();
    assert_eq!(net.nodes[0].getsockopt(big, SockOpt::SndBuf(0)).unwrap(), 8 << 20);
    assert_eq!(net.send(0, big, sa(2, 4000), &vec![0; (1 << 20) + 1]), Err(Errno::EMSGSIZE));
    assert_eq!(net.send(0, big, sa(2, 4000), &vec![0; 1 << 20]), Ok(1 << 20));
    // The RDMA length counts too (rds_rdma_bytes sums the remote vector):
    // EMSGSIZE is reported before the transport's lack of RDMA.
    let rdma = RdmaOp {
        remote_cookie: 1,
        remote_addr: 0,
        remote_len: (1 << 20) + 1,
        local: vec![rds_core::RdmaBuf::new(4096).all()],
        flags: 0,
        user_token: 0,
    };
    let o = SendOptions { rdma: Some(rdma.clone()), ..SendOptions::default() };
    assert_eq!(net.nodes[0].send(big, Some(sa(2, 4000)), &Payload::empty(), &o), Err(Errno::EMSGSIZE));
    let small = RdmaOp { remote_len: 4096, local: vec![rds_core::RdmaBuf::new(4096).all()], ..rdma };
    let o = SendOptions { rdma: Some(small), ..SendOptions::default() };
    assert_eq!(net.nodes[0].send(big, Some(sa(2, 4000)), &Payload::empty(), &o), Err(Errno::EOPNOTSUPP));
}

#[test]
fn so_sndbuf_doubles_caps_at_wmem_max_and_has_a_minimum() {
    let mut net = Net::new(1);
    let s = net.nodes[0].socket();
    let get = |net: &Net, s| net.nodes[0].getsockopt(s, SockOpt::SndBuf(0)).unwrap();
    net.nodes[0].setsockopt(s, SockOpt::SndBuf(10_000)).unwrap();
    assert_eq!(get(&net, s), 20_000);
    net.nodes[0].setsockopt(s, SockOpt::SndBuf(1 << 30)).unwrap();
    assert_eq!(get(&net, s), 2 * u64::from(DEFAULT_BUF), "capped at wmem_max, then doubled");
    net.nodes[0].setsockopt(s, SockOpt::SndBuf(100)).unwrap();
    assert_eq!(get(&net, s), u64::from(SOCK_MIN_SNDBUF));
    net.nodes[0].setsockopt(s, SockOpt::SndBuf(SOCK_MIN_SNDBUF / 2)).unwrap();
    assert_eq!(get(&net, s), u64::from(SOCK_MIN_SNDBUF));
    net.nodes[0].setsockopt(s, SockOpt::SndBuf(SOCK_MIN_SNDBUF / 2 + 1)).unwrap();
    assert_eq!(get(&net, s), u64::from(SOCK_MIN_SNDBUF) + 2);
    // A negative int (as the socket layer passes it) is capped like any
    // large value by SO_SNDBUF (min_t(u32, val, wmem_max)).
    net.nodes[0].setsockopt(s, SockOpt::SndBuf(-1i32 as u32)).unwrap();
    assert_eq!(get(&net, s), 2 * u64::from(DEFAULT_BUF));

    // SO_SNDBUFFORCE is not capped by wmem_max, only at INT_MAX / 2.
    net.nodes[0].setsockopt(s, SockOpt::SndBufForce(1 << 20)).unwrap();
    assert_eq!(get(&net, s), 2 << 20);
    net.nodes[0].setsockopt(s, SockOpt::SndBufForce(i32::MAX as u32)).unwrap();
    assert_eq!(get(&net, s), u64::from(i32::MAX as u32 / 2 * 2));
    net.nodes[0].setsockopt(s, SockOpt::SndBufForce(1)).unwrap();
    assert_eq!(get(&net, s), u64::from(SOCK_MIN_SNDBUF));
    // A negative value is taken as 0, giving the minimum.
    net.nodes[0].setsockopt(s, SockOpt::SndBufForce(-5i32 as u32)).unwrap();
    assert_eq!(get(&net, s), u64::from(SOCK_MIN_SNDBUF));

    // The receive side has the same rules with rmem_max and SOCK_MIN_RCVBUF.
    let getr = |net: &Net, s| net.nodes[0].getsockopt(s, SockOpt::RcvBuf(0)).unwrap();
    assert_eq!(getr(&net, s), u64::from(DEFAULT_BUF));
    net.nodes[0].setsockopt(s, SockOpt::RcvBuf(7000)).unwrap();
    assert_eq!(getr(&net, s), 14_000);
    net.nodes[0].setsockopt(s, SockOpt::RcvBuf(u32::MAX)).unwrap();
    assert_eq!(getr(&net, s), 2 * u64::from(DEFAULT_BUF));
    net.nodes[0].setsockopt(s, SockOpt::RcvBuf(1)).unwrap();
    assert_eq!(getr(&net, s), u64::from(SOCK_MIN_RCVBUF));
    net.nodes[0].setsockopt(s, SockOpt::RcvBufForce(3 << 20)).unwrap();
    assert_eq!(getr(&net, s), 6 << 20);
    net.nodes[0].setsockopt(s, SockOpt::RcvBufForce(-1i32 as u32)).unwrap();
    assert_eq!(getr(&net, s), u64::from(SOCK_MIN_RCVBUF));
}

#[test]
fn wmem_max_from_the_config() {
    let mut cfg = config(0);
    cfg.wmem_default = 50_000;
    cfg.wmem_max = 1 << 20;
    let mut net = Net::with_configs(vec![cfg, config(1)], TransportKind::Tcp);
    let s = net.bound(0, 5000);
    assert_eq!(net.nodes[0].getsockopt(s, SockOpt::SndBuf(0)).unwrap(), 50_000, "wmem_default as is");
    assert_eq!(net.send(0, s, sa(2, 4000), &[0; 25_001]), Err(Errno::EMSGSIZE));
    net.nodes[0].setsockopt(s, SockOpt::SndBuf(u32::MAX)).unwrap();
    assert_eq!(net.nodes[0].getsockopt(s, SockOpt::SndBuf(0)).unwrap(), 2 << 20);
}

#[test]
fn raising_sndbuf_wakes_a_blocked_sender() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000);
    net.frozen.insert((0, 0));
    net.nodes[0].setsockopt(a, SockOpt::SndBuf(5000)).unwrap(); // limit 5000
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 5000]), Ok(5000));
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 10]), Err(Errno::EAGAIN));
    net.run();
    net.wakes.clear();
    net.nodes[0].setsockopt(a, SockOpt::SndBuf(6000)).unwrap(); // limit 6000
    net.run();
    assert!(net.wakes.contains(&(0, a)));
    assert!(net.nodes[0].readiness(a).writable);
    assert_eq!(net.send(0, a, sa(2, 4000), &[0; 10]), Ok(10));
}

#[test]
fn ack_required_every_max_unacked_packets() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5000); // 5000 % 8 == 0: path 0
    net.bound(1, 4000);
    for _ in 0..30 {
        net.send(0, a, sa(2, 4000), &[1; 10]).unwrap();
        net.run();
    }
    // On path 0: our probe, our pong to the peer's probe, and the 30
    // messages, numbered 1..=32 (the order of the first three depends on
    // the driver). A new path's counter starts at 0 (the kernel's zeroed
    // allocation), so the first message is ACK_REQUIRED and resets it to 8
    // without being counted; each later message counts it down, and at 0
    // the next one is ACK_REQUIRED again: messages 1, 10, 19, 28.
    let p0: Vec<(u64, bool)> = net
        .sent_by(0)
        .iter()
        .filter(|m| m.path.index == 0 && !m.header.kind().eq(&wire::Kind::CongMap))
        .map(|m| (m.header.sequence, m.ack_required))
        .collect();
    assert_eq!(p0.len(), 32);
    let flagged: Vec<u64> = p0.iter().filter(|(_, f)| *f).map(|(s, _)| *s).collect();
    assert_eq!(flagged, [1, 10, 19, 28]);
    assert_eq!(net.nodes[0].counters().send_ack_required, 4);
}

#[test]
fn ack_required_by_unacked_bytes() {
    let mut cfg = config(0);
    cfg.max_unacked_bytes = 1000;
    let mut net = Net::with_configs(vec![cfg, config(1)], TransportKind::Tcp);
    let a = net.bound(0, 5000);
    net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), &[]).unwrap();
    net.run();
    net.wire.clear();
    for _ in 0..8 {
        net.send(0, a, sa(2, 4000), &[1; 300]).unwrap();
    }
    net.run();
    // 1000 - 300 - 300 - 300 = 100 < 300: the 4th needs an ack and resets
    // the budget to 1000 without using it; then the 8th.
    let flags: Vec<bool> = net.data_sent_by(0).iter().map(|m| m.ack_required).collect();
    assert_eq!(flags, [false, false, false, true, false, false, false, true]);
}
