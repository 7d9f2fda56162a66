//! Malformed frames and byte streams from the hostile peer.

use std::net::Shutdown;
use std::time::{Duration, Instant};

use rds_core::wire::{HEADER_LEN, Header, MAX_MSG_SIZE, ext_type, flags};
use rds_sock::RecvFlags;
use rds_tests::*;

use super::bed::*;

/// `h_len` above 1 MiB: the node resets the connection as soon as it has
/// the header, without buffering anything for the message.
#[test]
fn oversized_h_len_resets_the_connection() {
    let _g = serial();
    let bed = Bed::new("oversized h_len");
    for len in [MAX_MSG_SIZE as u32 + 1, u32::MAX] {
        let before = bed.counts();
        let rss0 = rss();
        let mut raw = bed.raw();
        // The header, then 256 KiB of what would be its payload.
        let mut bytes = frame(Header::data(SPORT, TARGET, len), 1, &[]);
        bytes.resize(HEADER_LEN + (256 << 10), 0xa5);
        // The node may reset the connection before it took everything.
        let _ = raw.write(&bytes);
        let end = raw.ended(WAIT).unwrap_or_else(|| panic!("h_len {len}: the connection is still open after {WAIT:?}"));
        assert!(matches!(end, End::Eof | End::Reset), "h_len {len}: {end:?}");
        println!("h_len {len}: the hostile peer saw {end:?}");
        assert_eq!(wait_delta(&bed.node, &before, "recv_drop_bad_frame", 1), 1, "h_len {len}");
        assert_eq!(wait_delta(&bed.node, &before, "conn_reset", 1), 1, "h_len {len}");
        let after = bed.counts();
        assert_eq!(after.delta(&before, "tcp_rx_partial_discarded"), 0, "h_len {len}: nothing was buffered");
        assert_eq!(after.delta(&before, "tcp_listen_closed_stale"), 0, "h_len {len}: the connection was accepted");
        assert_eq!(bed.queued(TARGET), (0, 0), "h_len {len}: nothing is delivered");
        assert!(bed.node.tcp_connections().iter().all(|c| c.peer != Some(raw.local())), "h_len {len}: connection kept");
        let grew = rss().saturating_sub(rss0);
        assert!(grew < 64 << 20, "h_len {len}: memory grew by {grew} bytes");
        drop(raw);
        bed.valid_again(u64::from(len));
    }
    bed.finish();
}

/// A truncated header (or payload), then silence: nothing is delivered,
/// the connection waits with the partial message; when the peer closes,
/// the partial message is discarded and counted.
#[test]
fn truncated_header_or_payload_is_discarded_at_the_close() {
    let _g = serial();
    let bed = Bed::new("truncated header");
    let full = frame(Header::data(SPORT, TARGET, 100), 1, &[0x5a; 100]);
    // (bytes written, header bytes still missing, payload bytes still missing)
    for (n, hdr_rem, data_rem) in [(20usize, 28u64, 0u64), (1, 47, 0), (47, 1, 0), (HEADER_LEN + 50, 0, 50)] {
        let before = bed.counts();
        let mut raw = bed.raw();
        raw.write(&full[..n]).unwrap();
        // The node's decoder holds the partial message.
        let until = Instant::now() + WAIT;
        let state = loop {
            let row = bed.node.tcp_connections().into_iter().find(|c| c.peer == Some(raw.local()));
            let state = row.map(|c| (c.hdr_rem, c.data_rem));
            if state == Some((hdr_rem, data_rem)) || Instant::now() >= until {
                break state;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(state, Some((hdr_rem, data_rem)), "{n} bytes: the node's decoder state");
        // Stall: the connection is kept, nothing is delivered.
        assert_eq!(raw.ended(Duration::from_millis(700)), None, "{n} bytes: closed while waiting for the rest");
        assert_eq!(bed.queued(TARGET), (0, 0), "{n} bytes: something was delivered");
        // Half-close: the node closes too and discards the partial message.
        raw.s.shutdown(Shutdown::Write).unwrap();
        let end = raw.ended(WAIT).unwrap_or_else(|| panic!("{n} bytes: not closed after our FIN"));
        assert_eq!(*end, End::Eof, "{n} bytes");
        assert_eq!(wait_delta(&bed.node, &before, "conn_reset", 1), 1, "{n} bytes");
        assert_eq!(wait_delta(&bed.node, &before, "tcp_rx_partial_discarded", 1), 1, "{n} bytes");
        let after = bed.counts();
        assert_eq!(after.delta(&before, "recv_drop_bad_frame"), 0, "{n} bytes: not a protocol error");
        assert_eq!(bed.queued(TARGET), (0, 0), "{n} bytes: something was delivered");
        drop(raw);
        bed.valid_again(n as u64);
    }
    bed.finish();
}

/// The RDMA_DEST cookie a receiver derives from an extension area, by the
/// kernel's parsing rule (`rds_message_next_extension`: stop at NONE, at a
/// type >= 16, or when a body would run past the 16 bytes; the newest size
/// table), written here independently of rds-core. The last RDMA_DEST
/// wins (`rds_recv_incoming_exthdrs`).
fn kernel_cookie(area: &[u8; 16]) -> Option<u64> {
    let size = |t: u8| match t {
        1 | 2 | 6 | 7 => 4,
        3 | 4 | 9 => 8,
        5 => 2,
        8 => 1,
        _ => 0,
    };
    let mut pos = 0;
    let mut cookie = None;
    while pos < 16 {
        let t = area[pos];
        if t == 0 || t >= 16 || pos + 1 + size(t) > 16 {
            break;
        }
        if t == 3 {
            let b = &area[pos + 1..pos + 9];
            let rkey = u32::from_be_bytes(b[..4].try_into().unwrap());
            let offset = u32::from_be_bytes(b[4..].try_into().unwrap());
            cookie = Some(u64::from(rkey) | u64::from(offset) << 32);
        }
        pos += 1 + size(t);
    }
    cookie
}

/// Garbage in the extension area of valid data messages: parsing stops
/// where the kernel's stops, and the messages are delivered exact, in
/// order (with the RDMA_DEST cookie where a well-formed one came before the
/// garbage). Garbage in h_ack, h_credit, h_padding, h_csum and unknown
/// flag bits is ignored too, as the kernel ignores it on TCP.
#[test]
fn garbage_extension_headers_are_skipped_and_messages_delivered() {
    let _g = serial();
    let bed = Bed::new("garbage extension headers");
    let r = [0x11, 0x22, 0x33, 0x44];
    let o = [0x00, 0x00, 0x10, 0x00];
    let cookie = Some(0x1122_3344u64 | 0x1000u64 << 32);
    let cat = |parts: &[&[u8]]| -> [u8; 16] {
        let mut a = [0xeeu8; 16];
        let v: Vec<u8> = parts.concat();
        a[..v.len()].copy_from_slice(&v);
        a
    };
    let dest = ext_type::RDMA_DEST;
    let mut cases: Vec<(String, [u8; 16], Option<u64>)> = vec![
        ("a type >= 16 first, an RDMA_DEST after it".into(), cat(&[&[17, dest], &r, &o]), None),
        ("type 255 everywhere".into(), [0xff; 16], None),
        ("NONE first, an RDMA_DEST after it".into(), cat(&[&[0, dest], &r, &o]), None),
        ("VERSION, NONE, then an RDMA_DEST".into(), cat(&[&[1, 0, 0, 3, 1, 0, dest], &r, &o]), None),
        ("NPATHS then an RDMA_DEST".into(), cat(&[&[5, 0, 8, dest], &r, &o, &[0xff; 4]]), cookie),
        (
            "RDMA_DEST then one that overruns the area".into(),
            cat(&[&[dest], &r, &o, &[dest, 1, 2, 3, 4, 5, 6]]),
            cookie,
        ),
        ("RDMA then RDMA_DEST".into(), cat(&[&[2, 9, 9, 9, 9, dest], &r, &o, &[0, 0]]), cookie),
        (
            "a GEN_NUM on a data message, then types 15..13 and garbage".into(),
            cat(&[&[6, 0xde, 0xad, 0xbe, 0xef, 15, 14, 13, 200]]),
            None,
        ),
        ("an RDMA_DEST cut by the end of the area".into(), cat(&[&[8, 0, 10, 10, 10, 10, 10, 10, dest], &r]), None),
    ];
    let mut rng = Rng::new(48);
    for k in 0..24 {
        let mut a = [0u8; 16];
        for b in a.iter_mut() {
            // Mostly small types so that parsing goes on for a while.
            *b = if rng.below(2) == 0 { rng.below(18) as u8 } else { rng.next_u64() as u8 };
        }
        cases.push((format!("random area {k}"), a, kernel_cookie(&a)));
    }
    for (what, area, want) in &cases[..9] {
        assert_eq!(kernel_cookie(area), *want, "the test's own parser on: {what}");
    }
    assert!(cases.iter().any(|c| c.2.is_some()) && cases.iter().any(|c| c.2.is_none()));

    let before = bed.counts();
    let mut raw = bed.raw();
    let mut stream = Vec::new();
    let mut sent = Vec::new();
    for (i, (_, area, _)) in cases.iter().enumerate() {
        let p = payload(3, i as u64, [0, 1, 47, 300, 20_000][i % 5]);
        let mut h = Header::data(SPORT, TARGET, p.len() as u32);
        h.exthdr = *area;
        h.ack = rng.next_u64();
        h.credit = rng.next_u64() as u8;
        h.padding = (rng.next_u64() as u32).to_be_bytes();
        h.csum = rng.next_u64() as u16 | 1;
        // Unknown and IB-only flag bits (never RETRANSMITTED, never a map).
        h.flags = [0, flags::ACK_REQUIRED, 0x40, 0x80 | flags::ACK_REQUIRED][i % 4];
        stream.extend_from_slice(&frame(h, i as u64 + 1, &p));
        sent.push(p);
    }
    // In pieces of every size, as a peer may write them.
    for piece in stream.chunks(4093) {
        raw.write(piece).unwrap();
    }
    bed.target.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    for (i, (what, _, want)) in cases.iter().enumerate() {
        let m = bed
            .target
            .recv_msg(&mut buf, RecvFlags::default())
            .unwrap_or_else(|e| panic!("message {i} ({what}) not delivered: {e}"));
        assert_eq!(m.from, Some(sa(bed.hostile, SPORT)), "{what}");
        assert_eq!(m.len, sent[i].len(), "{what}: length (or order)");
        check_payload(3, i as u64, &buf[..m.len]).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(m.rdma_dest, *want, "{what}: RDMA_DEST cookie");
    }
    std::thread::sleep(Duration::from_millis(200));
    let more = bed.target.recv_msg(&mut buf, RecvFlags { dontwait: true, ..RecvFlags::default() });
    assert_eq!(more.map(|m| m.len).unwrap_err().raw_os_error(), Some(libc::EAGAIN), "more messages than sent");
    let after = bed.counts();
    assert_eq!(after.delta(&before, "recv_drop_bad_frame"), 0);
    assert_eq!(after.delta(&before, "conn_reset"), 0, "the connection was reset");
    assert_eq!(raw.ended(Duration::ZERO), None, "the connection was closed");
    bed.close(raw);
    bed.valid_again(1);
    bed.finish();
}

/// A congestion map (h_flags 0x01) whose length is not 8192: the node
/// shuts the connection down and counts it; the map is not applied.
#[test]
fn congestion_map_of_the_wrong_length_closes_the_connection() {
    let _g = serial();
    let bed = Bed::new("bad congestion map");
    for len in [0u32, 100, 8191, 8193] {
        let before = bed.counts();
        let mut raw = bed.raw();
        let mut h = Header::cong_map();
        h.len = len;
        raw.write(&frame(h, 0, &vec![0xff; len as usize])).unwrap();
        let end = raw.ended(WAIT).unwrap_or_else(|| panic!("map of {len} bytes: the connection is still open"));
        assert!(matches!(end, End::Eof | End::Reset), "map of {len} bytes: {end:?}");
        assert_eq!(wait_delta(&bed.node, &before, "recv_drop_bad_frame", 1), 1, "map of {len} bytes");
        // The node waits for our FIN (its shutdown is graceful).
        bed.close(raw);
        let after = bed.counts();
        assert_eq!(after.delta(&before, "recv_drop_bad_frame"), 1, "map of {len} bytes: counted once");
        assert_eq!(after.delta(&before, "conn_reset"), 1, "map of {len} bytes");
        assert_eq!(bed.queued(TARGET), (0, 0), "map of {len} bytes: something was delivered");
        bed.valid_again(u64::from(len));
    }
    bed.finish();
}

/// Streams of random bytes (16 seeds, 64 KiB each): the node resets each
/// connection at its first header (a random `h_len` is above 1 MiB but for
/// one chance in 4096; seeds where it is not are skipped, so the count is
/// exact), counts it in `recv_drop_bad_frame`, delivers nothing, keeps its
/// memory bounded, and keeps serving the honest peer and valid connections
/// from the same address.
#[test]
fn random_byte_streams_reset_their_connections() {
    let _g = serial();
    let bed = Bed::new("random bytes");
    let rss0 = rss();
    let mut streams = 0u64;
    for seed in 1..100u64 {
        if streams == 16 {
            break;
        }
        let mut bytes = vec![0u8; 64 << 10];
        fill(0x5eed_0000 + seed, &mut bytes);
        let h = Header::from_bytes(bytes[..HEADER_LEN].try_into().unwrap());
        if h.len as usize <= MAX_MSG_SIZE {
            continue;
        }
        streams += 1;
        let before = bed.counts();
        let mut raw = bed.raw();
        // The node may reset the connection before it took everything.
        let _ = raw.write(&bytes);
        let end = raw.ended(WAIT).unwrap_or_else(|| panic!("seed {seed}: the connection is still open after {WAIT:?}"));
        assert!(matches!(end, End::Eof | End::Reset), "seed {seed}: {end:?}");
        assert_eq!(wait_delta(&bed.node, &before, "conn_reset", 1), 1, "seed {seed}");
        let after = bed.counts();
        assert_eq!(after.delta(&before, "recv_drop_bad_frame"), 1, "seed {seed}: the reason is counted once");
        assert_eq!((bed.queued(TARGET), bed.queued(CHECK)), ((0, 0), (0, 0)), "seed {seed}: nothing was delivered");
        assert!(bed.node.tcp_connections().iter().all(|c| c.peer != Some(raw.local())), "seed {seed}: connection kept");
        drop(raw);
        if streams % 4 == 0 {
            bed.valid_again(seed);
        }
    }
    assert_eq!(streams, 16, "16 seeds with a random h_len above 1 MiB");
    assert_eq!(bed.queued(TARGET), (0, 0), "nothing is delivered");
    let grew = rss().saturating_sub(rss0);
    assert!(grew < 64 << 20, "memory grew by {grew} bytes");
    println!("random bytes: {streams} connections reset, memory grew by {} KiB", grew >> 10);
    bed.finish();
}
