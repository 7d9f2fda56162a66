//! The fault injector around the in-memory link: whatever it drops, delays,
//! duplicates, reorders across paths or cuts, every message of a flow
//! arrives exactly once and in order once the link is ideal again, and the
//! same seed injects the same faults.

use rds_core::{Errno, HandshakeExts, NodeConfig, Received, TransportKind};
use rds_testkit::faults::{FaultInjector, FaultRates, FaultStats, Ideal};
use rds_testkit::net::{Net, config, sa};

const N: u64 = 400;
/// Rounds (1 ms each) with the faulty link; then it heals.
const FAULTY: u32 = 2_000;

/// Node 0 sends `N` numbered messages from each of two sockets to node 1
/// through a faulty link, then the link heals; checks that each socket's
/// messages arrived once, in order; returns what the injector did and how
/// many messages crossed the wire.
fn run(seed: u64, handshake: HandshakeExts) -> (FaultStats, usize) {
    let cfgs: Vec<NodeConfig> = (0..2).map(|i| NodeConfig { handshake_exts: handshake, ..config(i) }).collect();
    let mut net = Net::with_configs(cfgs, TransportKind::Tcp);
    let rates = FaultRates { drop: 15, delay: 40, duplicate: 20, cut: 15 };
    net.link = Box::new(FaultInjector::new(Ideal, seed, rates));
    let tx = [net.bound(0, 5000), net.bound(0, 5001)];
    let rx = net.bound(1, 4000);
    let mut next = [0u64; 2];
    let mut got = [Vec::new(), Vec::new()];
    let mut stats = None;
    for round in 0..20_000u32 {
        if round == FAULTY {
            // The link heals; what it delayed still arrives.
            stats = std::mem::replace(&mut net.link, Box::new(Ideal)).stats();
        }
        for (k, s) in tx.iter().enumerate() {
            if next[k] < N {
                match net.send(0, *s, sa(2, 4000), &next[k].to_be_bytes()) {
                    Ok(_) => next[k] += 1,
                    Err(Errno::EAGAIN) | Err(Errno::ENOBUFS) => {}
                    Err(e) => panic!("send: {e}"),
                }
            }
        }
        net.run();
        for r in net.drain(1, rx) {
            let Received::Data(m) = r else { continue };
            let k = usize::from(m.from.port() - 5000);
            got[k].push(u64::from_be_bytes(m.payload[..8].try_into().unwrap()));
        }
        if round > FAULTY && next == [N, N] && got.iter().all(|g| g.len() as u64 >= N) {
            break;
        }
        net.advance(1);
    }
    for (k, g) in got.iter().enumerate() {
        assert_eq!(*g, (0..N).collect::<Vec<_>>(), "socket {k}: every message once, in order ({handshake:?})");
    }
    (stats.expect("the injector's stats"), net.wire.len())
}

#[test]
fn every_message_arrives_once_in_order_through_a_faulty_link() {
    for seed in 0..4 {
        for handshake in [HandshakeExts::Full, HandshakeExts::Mainline] {
            let (s, w) = run(seed, handshake);
            eprintln!("{seed} {handshake:?}: {s:?}, {w} on the wire");
            assert!(s.delivered > 0 && s.dropped + s.cut > 0 && s.delayed > 0 && s.duplicated > 0, "{s:?}");
        }
    }
}

#[test]
fn the_same_seed_injects_the_same_faults() {
    assert_eq!(run(7, HandshakeExts::Full), run(7, HandshakeExts::Full));
    assert_ne!(run(7, HandshakeExts::Full).0, run(8, HandshakeExts::Full).0);
}
