//! Wake outputs: every change of a socket's readiness is reported, so a
//! blocked receiver or sender is never left waiting.

use rds_core::*;
use rds_testkit::net::*;

/// Regression: a socket that hit congestion as a sender becomes readable on
/// the next map update (the kernel's "historical" POLLIN). A recv that finds
/// nothing clears that; it must report the change, or the next datagram's
/// arrival would look like no change and a blocked receiver would sleep on.
#[test]
fn data_after_a_consumed_congestion_update_wakes_the_receiver() {
    let mut net = Net::new(2);
    let a = net.bound(0, 4000);
    let b = net.bound(1, 4000);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap(); // congested above 2000
    // The second goes over; the third arrives while b is congested, which
    // announces it to node 0.
    for _ in 0..3 {
        net.send(0, a, sa(2, 4000), &[1; 1500]).unwrap();
        net.run();
    }
    assert_eq!(net.send(0, a, sa(2, 4000), &[1; 1500]), Err(Errno::ENOBUFS));
    // b drains: the map update makes a readable without data.
    net.drain(1, b);
    net.run();
    assert!(net.nodes[0].readiness(a).readable, "congestion update is readable");
    assert_eq!(net.nodes[0].recv(a, false).unwrap_err(), Errno::EAGAIN);
    net.run();
    assert!(!net.nodes[0].readiness(a).readable);
    net.wakes.clear();
    // Now a datagram for a must produce a Wake of a.
    let b2 = net.bound(1, 4001);
    net.send(1, b2, sa(1, 4000), b"data").unwrap();
    net.run();
    assert!(net.wakes.contains(&(0, a)), "no Wake for the arriving datagram: {:?}", net.wakes);
    assert_eq!(&data(net.nodes[0].recv(a, false).unwrap()).payload[..], b"data");
}

/// The sockets a map update makes readable are those whose sends met
/// congestion (the node keeps a list of them, not a walk of every socket):
/// a socket opened in the slot of one closed after it met congestion is
/// not made readable by the update (the list still names the closed one,
/// by its generation); one that met congestion too is, once, however often
/// it met it.
#[test]
fn a_map_update_wakes_only_the_live_sockets_that_met_congestion() {
    let mut net = Net::new(2);
    let gone = net.bound(0, 4000);
    let kept = net.bound(0, 4002);
    let b = net.bound(1, 4000);
    net.nodes[1].setsockopt(b, SockOpt::RcvBuf(2000)).unwrap();
    for _ in 0..3 {
        net.send(0, kept, sa(2, 4000), &[1; 1500]).unwrap();
        net.run();
    }
    for s in [gone, kept, kept] {
        assert_eq!(net.send(0, s, sa(2, 4000), &[1; 10]), Err(Errno::ENOBUFS));
    }
    assert_eq!(net.nodes[0].close(gone), 0);
    let fresh = net.bound(0, 4001);
    assert_eq!(fresh.number() as u32, gone.number() as u32, "the closed socket's slot is reused");
    net.wakes.clear();
    net.drain(1, b);
    net.run();
    assert!(net.nodes[0].readiness(kept).readable, "the update is readable where a send met congestion");
    assert!(!net.nodes[0].readiness(fresh).readable, "not for a socket that never sent");
    assert_eq!(net.wakes.iter().filter(|w| **w == (0, kept)).count(), 1, "{:?}", net.wakes);
    assert!(!net.wakes.contains(&(0, fresh)), "{:?}", net.wakes);
    assert_eq!(net.nodes[0].recv(fresh, false).unwrap_err(), Errno::EAGAIN);
}
