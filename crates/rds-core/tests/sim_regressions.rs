//! Regressions found by the fault simulator (`crates/tests/src/sim`,
//! `rds-sim --replay SEED -v` shows the original failure). Each test
//! rebuilds the failing interleaving by hand with the in-memory driver.

mod common;

use common::{sa, Net};

/// rds-sim seed 20: a socket's message waiting on its lane (path 1) when
/// every path went down was overtaken by the socket's next message, which
/// went out on path 0 while the path count was being negotiated again.
#[test]
fn messages_keep_their_lane_while_the_path_count_is_renegotiated() {
    let mut net = Net::new(2);
    let a = net.bound(0, 5001); // lane 1 of 8
    let b = net.bound(1, 4000);
    net.send(0, a, sa(2, 4000), b"hello").unwrap();
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"hello".to_vec()]);
    // m1 waits on path 1, which does not transmit.
    net.frozen.insert((0, 1));
    net.send(0, a, sa(2, 4000), b"m1").unwrap();
    net.run();
    // Every connection breaks: the path count is negotiated again.
    net.cut_all(0);
    net.frozen.remove(&(0, 1));
    net.send(0, a, sa(2, 4000), b"m2").unwrap();
    net.advance(0);
    net.run();
    assert_eq!(net.drain_payloads(1, b), [b"m1".to_vec(), b"m2".to_vec()]);
    let lanes: Vec<u8> = net.data_sent_by(0).iter().filter(|m| m.header.sport == 5001).map(|m| m.path.index).collect();
    assert_eq!(lanes, [0, 1, 1], "hello before the handshake on path 0, then m1 and m2 on path 1");
}
