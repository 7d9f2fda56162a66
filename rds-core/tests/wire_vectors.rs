//! Byte-exact wire tests against the capture of the real kernel
//! (Debian 12, 6.1.0-56-amd64, rds_tcp; shared/vmrig/notes/rds-tcp-capture.txt).
//! The header bytes below are copied from that capture's hex dumps.

use rds_core::cong::CongMap;
use rds_core::wire::{
    self, CONG_MAP_BYTES, Ext, FrameDecoder, HEADER_LEN, Header, Kind, checksum, ext_type, flags, verify_checksum,
};

/// Parses "00 01 .."-style hex (whitespace ignored).
fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| b.is_ascii_hexdigit()).collect();
    assert!(digits.len() % 2 == 0, "odd number of hex digits");
    digits.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
}

fn hdr48(s: &str) -> [u8; HEADER_LEN] {
    hex(s).try_into().expect("48 bytes")
}

/// Congestion map (every stream, both runs): seq 0, len 8192, flags 0x01.
const CONG_MAP: &str = "
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    00 00 20 00 00 00 00 00 01 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Data 10.99.0.1:5000 -> 10.99.0.2:4000, run A stream 51609, msg 1 (seq 1).
const DATA_SEQ1: &str = "
    00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00
    00 00 00 10 13 88 0f a0 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Run A stream 51609 msg 4 (seq 3).
const DATA_SEQ3: &str = "
    00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 00
    00 00 00 10 13 88 0f a0 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Run A stream 51609 msg 5 (seq 4).
const DATA_SEQ4: &str = "
    00 00 00 00 00 00 00 04 00 00 00 00 00 00 00 00
    00 00 00 10 13 88 0f a0 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Echo 10.99.0.2:4000 -> 10.99.0.1:5000, run A stream 60081, msg 1 (seq 2).
const ECHO_SEQ2: &str = "
    00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 00
    00 00 00 10 0f a0 13 88 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Probe ping sport 1 -> dport 0, NPATHS 8: run B stream 53853 msg 2 (seq 2).
const PROBE_PING_SEQ2: &str = "
    00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 00
    00 00 00 00 00 01 00 00 00 00 00 00 00 00 00 00
    05 00 08 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Probe ping, run A reverse stream (10.99.0.2 -> 10.99.0.1) msg 1 (seq 1).
const PROBE_PING_SEQ1: &str = "
    00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00
    00 00 00 00 00 01 00 00 00 00 00 00 00 00 00 00
    05 00 08 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Pong sport 0 -> dport 1, NPATHS 8: run A stream 51609 msg 2 (seq 2).
const PROBE_PONG_SEQ2: &str = "
    00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00
    05 00 08 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// Pong, run B stream 53853 (10.99.0.1 -> 10.99.0.2) msg 1 (seq 1).
const PROBE_PONG_SEQ1: &str = "
    00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00
    00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00
    05 00 08 00 00 00 00 00 00 00 00 00 00 00 00 00";

/// The 16-byte payloads of the capture: "RDS-msg-N" 00 01 02 03 04 05 06.
fn capture_payload(n: u8) -> Vec<u8> {
    let mut p = b"RDS-msg-".to_vec();
    p.push(b'0' + n);
    p.extend_from_slice(&[0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(p.len(), 16);
    p
}

#[track_caller]
fn check_fields(h: &Header, seq: u64, len: u32, sport: u16, dport: u16, fl: u8) {
    assert_eq!(h.sequence, seq, "h_sequence");
    assert_eq!(h.ack, 0, "h_ack");
    assert_eq!(h.len, len, "h_len");
    assert_eq!(h.sport, sport, "h_sport");
    assert_eq!(h.dport, dport, "h_dport");
    assert_eq!(h.flags, fl, "h_flags");
    assert_eq!(h.credit, 0, "h_credit");
    assert_eq!(h.padding, [0; 4], "h_padding");
    assert_eq!(h.csum, 0, "h_csum (TCP never sets it)");
}

#[test]
fn capture_congestion_map_header() {
    let raw = hdr48(CONG_MAP);
    let h = Header::from_bytes(&raw);
    check_fields(&h, 0, 8192, 0, 0, flags::CONG_BITMAP);
    assert_eq!(h.exthdr, [0; 16]);
    assert_eq!(h.extensions().count(), 0);
    assert_eq!(h.kind(), Kind::CongMap);
    assert_eq!(h.to_bytes(), raw);
    assert_eq!(Header::decode(&raw).unwrap(), h);
    // What we build for a map update is exactly the kernel's header.
    assert_eq!(Header::cong_map().to_bytes(), raw);
    // A zero h_csum verifies.
    assert!(verify_checksum(&raw));
}

#[test]
fn capture_data_headers() {
    for (text, seq, sport, dport) in
        [(DATA_SEQ1, 1, 5000, 4000), (DATA_SEQ3, 3, 5000, 4000), (DATA_SEQ4, 4, 5000, 4000), (ECHO_SEQ2, 2, 4000, 5000)]
    {
        let raw = hdr48(text);
        let h = Header::from_bytes(&raw);
        check_fields(&h, seq, 16, sport, dport, 0);
        assert_eq!(h.extensions().count(), 0);
        assert_eq!(h.kind(), Kind::Data);
        assert!(!h.is_retransmitted());
        assert_eq!(h.to_bytes(), raw, "round trip of seq {seq}");
        // Header::data plus the sequence number the path assigns.
        let mut ours = Header::data(sport, dport, 16);
        ours.sequence = seq;
        assert_eq!(ours.to_bytes(), raw, "our encoding of seq {seq}");
    }
}

#[test]
fn capture_probe_ping_and_pong() {
    for (text, seq, sport, dport, kind) in [
        (PROBE_PING_SEQ1, 1, 1, 0, Kind::ProbePing),
        (PROBE_PING_SEQ2, 2, 1, 0, Kind::ProbePing),
        (PROBE_PONG_SEQ1, 1, 0, 1, Kind::ProbePong),
        (PROBE_PONG_SEQ2, 2, 0, 1, Kind::ProbePong),
    ] {
        let raw = hdr48(text);
        let h = Header::from_bytes(&raw);
        check_fields(&h, seq, 0, sport, dport, 0);
        assert_eq!(h.exthdr[..3], [ext_type::NPATHS, 0x00, 0x08]);
        assert_eq!(h.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8)]);
        assert_eq!(h.kind(), kind);
        assert_eq!(h.to_bytes(), raw);
        // Our probe: a zero-length message with NPATHS 8; mainline refuses
        // a second extension, so GEN_NUM is silently not added.
        let mut ours = Header::data(sport, dport, 0);
        ours.sequence = seq;
        assert!(ours.push_extension_limited(Ext::Npaths(8), 1).unwrap());
        assert!(!ours.push_extension_limited(Ext::GenNum(0x1234_5678), 1).unwrap());
        assert_eq!(ours.to_bytes(), raw);
        // push_extension on an empty area gives the same bytes.
        let mut ours2 = Header::data(sport, dport, 0);
        ours2.sequence = seq;
        ours2.push_extension(Ext::Npaths(8)).unwrap();
        assert_eq!(ours2.to_bytes(), raw);
    }
}

#[test]
fn kind_classification_rules() {
    let k = |sport, dport, fl| Header { sport, dport, flags: fl, ..Header::default() }.kind();
    assert_eq!(k(0, 0, 0x01), Kind::CongMap);
    // The map test is an equality test: any other bit makes it a non-map.
    assert_eq!(k(0, 0, 0x01 | 0x04), Kind::Null);
    assert_eq!(k(5000, 4000, 0x03), Kind::Data);
    assert_eq!(k(1, 0, 0), Kind::ProbePing);
    assert_eq!(k(0, 1, 0), Kind::ProbePong);
    assert_eq!(k(0, 0, 0), Kind::Null);
    assert_eq!(k(7, 0, 0), Kind::Ping);
    assert_eq!(k(0, 7, 0), Kind::Data, "a pong to port 7 is data for port 7");
    assert_eq!(k(2, 1, 0), Kind::Data);
}

#[test]
fn internet_checksum_hand_computed() {
    // RFC 1071 section 3 example: bytes 00 01 f2 03 f4 f5 f6 f7 sum to
    // 0x2ddf0, folded 0xddf2, complemented 0x220d. Put them at offset 0
    // (h_sequence), everything else zero.
    let mut b = [0u8; HEADER_LEN];
    b[..8].copy_from_slice(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]);
    assert_eq!(checksum(&b), 0x220d);
    b[30..32].copy_from_slice(&0x220du16.to_be_bytes());
    assert!(verify_checksum(&b));
    assert_eq!(checksum(&b), 0, "a header including its checksum folds to 0");

    // The capture's first data header: 0x0001 + 0x0010 + 0x1388 + 0x0fa0 =
    // 0x2339, complemented 0xdcc6.
    let h = Header::from_bytes(&hdr48(DATA_SEQ1));
    let c = h.to_bytes_checksummed();
    assert_eq!(u16::from_be_bytes([c[30], c[31]]), 0xdcc6);
    assert_eq!(c[..30], hdr48(DATA_SEQ1)[..30]);
    assert_eq!(c[32..], hdr48(DATA_SEQ1)[32..]);
    assert!(verify_checksum(&c));

    // Carries fold back in, twice: four 0xffff words and a 0x0003 sum to
    // 0x3ffff, folded 0x10002, folded again 0x0003, complemented 0xfffc.
    let mut d = [0u8; HEADER_LEN];
    d[..8].fill(0xff);
    d[16..20].copy_from_slice(&3u32.to_be_bytes());
    assert_eq!(checksum(&d), 0xfffc);

    // Any header with h_csum 0 is accepted; a wrong non-zero one is not.
    let mut any = [0u8; HEADER_LEN];
    for (i, x) in any.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(73).wrapping_add(5);
    }
    any[30] = 0;
    any[31] = 0;
    assert!(verify_checksum(&any));
    let mut bad = c;
    bad[31] ^= 0x01;
    assert!(!verify_checksum(&bad));
    let mut bad2 = c;
    bad2[23] ^= 0x80; // dport changed after checksumming
    assert!(!verify_checksum(&bad2));
}

fn exts(area: [u8; 16]) -> Vec<Ext> {
    Header { exthdr: area, ..Header::default() }.extensions().collect()
}

#[test]
fn extension_parsing_rules() {
    // Stops at type 0 even if more follows.
    assert_eq!(exts([5, 0, 8, 0, 6, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]), vec![Ext::Npaths(8)]);
    assert_eq!(exts([0, 5, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), vec![]);
    // Stops at a type >= 16.
    assert_eq!(exts([16, 5, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), vec![]);
    assert_eq!(exts([5, 0, 4, 16, 6, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]), vec![Ext::Npaths(4)]);
    assert_eq!(exts([5, 0, 4, 255, 5, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]), vec![Ext::Npaths(4)]);
    // Stops when a body would run past the 16 bytes.
    assert_eq!(
        exts([1, 0, 0, 3, 1, 1, 0, 0, 3, 2, 1, 0, 0, 3, 3, 6]),
        vec![Ext::Version(0x0301), Ext::Version(0x0302), Ext::Version(0x0303)],
        "GEN_NUM at offset 15 needs 4 more bytes"
    );
    assert_eq!(
        exts([5, 0, 8, 6, 0, 0, 0, 9, 3, 0, 0, 0, 1, 0, 0, 0]),
        vec![Ext::Npaths(8), Ext::GenNum(9)],
        "RDMA_DEST at offset 8 needs 8 more bytes, 7 are left"
    );
    // Types below 16 without a size in the table have size 0.
    assert_eq!(
        exts([10, 11, 15, 5, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        vec![Ext::Unknown(10), Ext::Unknown(11), Ext::Unknown(15), Ext::Npaths(2)]
    );
    for t in 10..16u8 {
        assert_eq!(wire::ext_body_len(t), 0, "type {t}");
    }
    // Sizes of the kernel's table.
    assert_eq!(wire::ext_body_len(ext_type::VERSION), 4);
    assert_eq!(wire::ext_body_len(ext_type::RDMA), 4);
    assert_eq!(wire::ext_body_len(ext_type::RDMA_DEST), 8);
    assert_eq!(wire::ext_body_len(ext_type::NPATHS), 2);
    assert_eq!(wire::ext_body_len(ext_type::GEN_NUM), 4);
}

#[test]
fn several_extensions_in_one_header() {
    // NPATHS, GEN_NUM, SPORT_IDX as the 2026 kernels send them.
    let area = [5, 0, 8, 6, 0xde, 0xad, 0xbe, 0xef, 8, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(exts(area), vec![Ext::Npaths(8), Ext::GenNum(0xdead_beef), Ext::SportIdx]);
    let mut h = Header::data(1, 0, 0);
    h.push_extension(Ext::Npaths(8)).unwrap();
    h.push_extension(Ext::GenNum(0xdead_beef)).unwrap();
    h.push_extension(Ext::SportIdx).unwrap();
    assert_eq!(h.exthdr, area);
    // RDMA_DEST and RDMA: 9 + 5 = 14 bytes, then a terminator fits.
    let mut r = Header::data(10, 20, 100);
    r.push_extension(Ext::RdmaDest { rkey: 0x0102_0304, offset: 0x0506_0708 }).unwrap();
    r.push_extension(Ext::Rdma { rkey: 0x0a0b_0c0d }).unwrap();
    assert_eq!(r.exthdr, [3, 1, 2, 3, 4, 5, 6, 7, 8, 2, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0]);
    assert_eq!(
        r.extensions().collect::<Vec<_>>(),
        vec![Ext::RdmaDest { rkey: 0x0102_0304, offset: 0x0506_0708 }, Ext::Rdma { rkey: 0x0a0b_0c0d }]
    );
    // A 1-byte body would fit in the 2 left, a 2-byte one would not.
    assert_eq!(r.clone().push_extension(Ext::Npaths(1)), Err(wire::WireError::ExtSpaceFull));
    assert!(r.push_extension(Ext::SportIdx).is_ok());
    // Round trip through bytes keeps everything.
    assert_eq!(Header::from_bytes(&r.to_bytes()), r);
}

/// The run A stream 10.99.0.1 -> 10.99.0.2 (16720 bytes), rebuilt from the
/// capture: map, data seq 1, pong seq 2, map, data seq 3, data seq 4.
fn capture_stream() -> (Vec<u8>, Vec<(Header, Vec<u8>)>) {
    let msgs: Vec<([u8; 48], Vec<u8>)> = vec![
        (hdr48(CONG_MAP), vec![0; CONG_MAP_BYTES]),
        (hdr48(DATA_SEQ1), capture_payload(0)),
        (hdr48(PROBE_PONG_SEQ2), vec![]),
        (hdr48(CONG_MAP), vec![0; CONG_MAP_BYTES]),
        (hdr48(DATA_SEQ3), capture_payload(1)),
        (hdr48(DATA_SEQ4), capture_payload(2)),
    ];
    let mut stream = Vec::new();
    let mut expect = Vec::new();
    for (h, p) in msgs {
        stream.extend_from_slice(&h);
        stream.extend_from_slice(&p);
        expect.push((Header::from_bytes(&h), p));
    }
    (stream, expect)
}

#[test]
fn frame_decoder_capture_stream_split_everywhere() {
    let (stream, expect) = capture_stream();
    assert_eq!(stream.len(), 16720, "the capture's stream length");
    // Two reads, split at every possible offset.
    for cut in 0..=stream.len() {
        let mut d = FrameDecoder::default();
        let mut got = Vec::new();
        d.feed(&stream[..cut], &mut |f| got.push((f.header, f.payload))).unwrap();
        d.feed(&stream[cut..], &mut |f| got.push((f.header, f.payload))).unwrap();
        assert!(d.is_idle(), "cut {cut}");
        assert_eq!(d.consumed(), stream.len() as u64);
        assert!(got == expect, "cut at {cut}");
    }
    // One byte at a time, checking the progress counters on the way.
    let mut d = FrameDecoder::default();
    let mut got = Vec::new();
    for (i, b) in stream.iter().enumerate() {
        d.feed(std::slice::from_ref(b), &mut |f| got.push((f.header, f.payload))).unwrap();
        if i == 0 {
            assert_eq!(d.header_remaining(), 47);
        }
        if i == 47 {
            assert_eq!(d.payload_remaining(), 8192);
            assert_eq!(d.header_remaining(), 0);
        }
    }
    assert!(got == expect);
    // The frames are what the kernel meant: kinds in order.
    let kinds: Vec<Kind> = got.iter().map(|(h, _)| h.kind()).collect();
    assert_eq!(kinds, [Kind::CongMap, Kind::Data, Kind::ProbePong, Kind::CongMap, Kind::Data, Kind::Data]);
    assert_eq!(got[1].1, b"RDS-msg-0\x00\x01\x02\x03\x04\x05\x06");
}

#[test]
fn congestion_map_payload_bits() {
    let ports = [0u16, 1, 7, 8, 4000, 4003, 5000, 32767, 32768, 40001, 65535];
    let mut m = CongMap::new();
    for p in ports {
        m.set(p);
    }
    let b = m.as_bytes();
    let mut expect = vec![0u8; CONG_MAP_BYTES];
    for p in ports {
        expect[usize::from(p / 8)] |= 1 << (p % 8);
    }
    assert_eq!(&b[..], &expect[..]);
    // Spelled out: port 0,1,7 -> byte 0 = 0x83; 8 -> byte 1 bit 0;
    // 4000 = 500*8 + 0 and 4003 = 500*8 + 3 -> byte 500 = 0x09;
    // 5000 -> byte 625 bit 0; 32767 -> byte 4095 bit 7; 32768 -> byte 4096
    // bit 0 (second page); 40001 = 5000*8+1 -> byte 5000 = 0x02; 65535 ->
    // byte 8191 bit 7.
    assert_eq!(b[0], 0x83);
    assert_eq!(b[1], 0x01);
    assert_eq!(b[500], 0x09);
    assert_eq!(b[625], 0x01);
    assert_eq!(b[4095], 0x80);
    assert_eq!(b[4096], 0x01);
    assert_eq!(b[5000], 0x02);
    assert_eq!(b[8191], 0x80);
    assert_eq!(b.iter().filter(|x| **x != 0).count(), 8);
    // Parsing the wire form gives the same set back.
    let parsed = CongMap::from_wire(&expect).unwrap();
    assert_eq!(parsed.congested_ports().collect::<Vec<_>>(), ports.to_vec());
    for p in [2u16, 4001, 4999, 32766, 65534] {
        assert!(!parsed.test(p), "port {p}");
    }
    // A whole map message: kernel header + 8192 bytes, decoded as one frame.
    let mut stream = Header::cong_map().to_bytes().to_vec();
    stream.extend_from_slice(b);
    let mut frames = Vec::new();
    FrameDecoder::default().feed(&stream, &mut |f| frames.push(f)).unwrap();
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].header.kind(), Kind::CongMap);
    assert_eq!(CongMap::from_wire(&frames[0].payload).unwrap(), m);
}

/// Cross-check against the capture file itself when it is there: every
/// "header:" hex block decodes to the fields printed on its summary line
/// and re-encodes to the same bytes.
#[test]
fn capture_file_headers_round_trip() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vmrig/notes/rds-tcp-capture.txt");
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!("capture file not found at {path}; skipped");
        return;
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut checked = 0;
    for (i, line) in lines.iter().enumerate() {
        let l = line.trim_start();
        if !l.starts_with("msg ") || !l.contains("h_sequence=") {
            continue;
        }
        let field = |name: &str| -> u64 {
            let s = l.split_whitespace().find_map(|w| w.strip_prefix(name)).unwrap();
            let s = s.split('(').next().unwrap();
            if let Some(h) = s.strip_prefix("0x") { u64::from_str_radix(h, 16).unwrap() } else { s.parse().unwrap() }
        };
        // The hex block follows "header:" within the next lines.
        let start = (i..i + 4).find(|k| lines[*k].trim() == "header:").expect("header block") + 1;
        let mut bytes = Vec::new();
        for row in &lines[start..start + 3] {
            let row = row.trim();
            let hexpart: String = row[4..].chars().take(50).collect();
            bytes.extend(hex(&hexpart));
        }
        let raw: [u8; 48] = bytes.try_into().unwrap();
        let h = Header::from_bytes(&raw);
        assert_eq!(h.sequence, field("h_sequence="), "{l}");
        assert_eq!(u64::from(h.len), field("h_len="), "{l}");
        assert_eq!(u64::from(h.sport), field("sport="), "{l}");
        assert_eq!(u64::from(h.dport), field("dport="), "{l}");
        assert_eq!(u64::from(h.flags), field("flags="), "{l}");
        assert_eq!(h.to_bytes(), raw);
        let ext_line = lines[i + 1];
        if ext_line.contains("NPATHS=8") {
            assert_eq!(h.extensions().collect::<Vec<_>>(), vec![Ext::Npaths(8)]);
            assert!(matches!(h.kind(), Kind::ProbePing | Kind::ProbePong));
        } else {
            assert!(ext_line.contains("exthdr: none"));
            assert_eq!(h.extensions().count(), 0);
        }
        checked += 1;
    }
    assert!(checked >= 20, "found {checked} headers in the capture");
}
