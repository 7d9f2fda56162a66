//! rds-sock's rds-info exchange over its Unix-domain socket (`info::ipc`),
//! both ends fed by a hostile peer: a local client sending arbitrary bytes
//! to a node (`serve_request`), and a node answering a client's request
//! with arbitrary bytes (`exchange`), each read in pieces of sizes the
//! input chooses.
//!
//! Checked: the node reads exactly one 12-byte request and answers it with
//! the status the request deserves or with exactly the wanted sections; the
//! client sends exactly its request and returns what the answer's header and
//! body say (an answer cut short is a node gone away), and the memory an
//! answer costs the client grows with the bytes that arrived, not with the
//! length its header claims.
#![no_main]

use std::io::{self, Read, Write};
use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use rds_fuzz::{Counting, Input, peak_during};
use rds_sock::info::codec::{self, HEADER_LEN, Status};
use rds_sock::info::ipc::{QueryError, exchange, serve_request};
use rds_sock::info::{NodeIdent, Snapshot, sections};

#[global_allocator]
static ALLOC: Counting = Counting;

/// A socket: reads come from `input` in pieces of the sizes `cuts` gives
/// (cycled), writes go to `out`.
struct Peer<'a> {
    input: &'a [u8],
    cuts: &'a [u8],
    reads: usize,
    out: Vec<u8>,
}

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let cut = self.cuts.get(self.reads % self.cuts.len().max(1)).copied().unwrap_or(255);
        self.reads += 1;
        let n = buf.len().min(self.input.len()).min(usize::from(cut) * 97 + 1);
        buf[..n].copy_from_slice(&self.input[..n]);
        self.input = &self.input[n..];
        Ok(n)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.out.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn sample() -> Snapshot {
    let a: IpAddr = "127.0.0.1".parse().unwrap();
    Snapshot {
        node: NodeIdent {
            pid: 7,
            engine: 1,
            uid: 1000,
            command: "node".into(),
            addresses: vec![a],
            gen_num: 3,
            npaths: 8,
            tcp_port: 16385,
        },
        counters: vec![("conn_reset".into(), 2), ("tcp_sndbuf_full".into(), u64::MAX)],
        ..Snapshot::default()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let setup = inp.u8();
    let cuts = inp.bytes(usize::from(setup % 8));
    let input = inp.rest();

    if setup & 0x80 == 0 {
        // A hostile client asks a node.
        let gone = setup & 0x40 != 0;
        let s = sample();
        let answer = |want: u32| if gone { None } else { Some(codec::encode_snapshot(&s, want)) };
        let mut p = Peer { input, cuts, reads: 0, out: Vec::new() };
        let r = serve_request(&mut p, &answer);
        let Some(req) = input.get(..HEADER_LEN) else {
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
            assert!(p.out.is_empty(), "nothing answered to a partial request");
            return;
        };
        r.unwrap();
        assert_eq!(p.input.len(), input.len() - HEADER_LEN, "exactly one request is read");
        let mut want = Vec::new();
        match codec::decode_request(req.try_into().unwrap()) {
            Ok(w) => {
                if let Some(body) = answer(w) {
                    want.extend_from_slice(&codec::encode_response_header(Status::Ok, body.len()));
                    want.extend_from_slice(&body);
                }
            }
            Err(st) => want.extend_from_slice(&codec::encode_response_header(st, 0)),
        }
        assert_eq!(p.out, want);
        return;
    }

    // A hostile node answers a client.
    let wanted = u32::from(setup & 0x3f) << 2 | sections::NODE;
    let mut p = Peer { input, cuts, reads: 0, out: Vec::new() };
    let (r, peak) = peak_during(|| exchange(&mut p, wanted));
    assert_eq!(p.out, codec::encode_request(wanted), "exactly the request is sent");
    assert!(peak <= 16 * input.len() + (64 << 10), "an answer of {} bytes cost {peak} bytes", input.len());
    let Some(hdr) = input.get(..HEADER_LEN) else {
        assert!(matches!(r, Err(QueryError::Gone)), "{r:?}");
        return;
    };
    let (version, status, len) = match codec::decode_response_header(hdr.try_into().unwrap()) {
        Ok(h) => h,
        Err(e) => {
            assert!(matches!(&r, Err(QueryError::Decode(d)) if *d == e), "{r:?}");
            return;
        }
    };
    match status {
        Status::Denied => assert!(matches!(r, Err(QueryError::Denied))),
        Status::Version => assert!(matches!(r, Err(QueryError::Version(v)) if v == version)),
        Status::BadRequest => assert!(matches!(r, Err(QueryError::Decode(_)))),
        Status::Ok => match input[HEADER_LEN..].get(..len) {
            None => assert!(matches!(r, Err(QueryError::Gone)), "{len}-byte answer cut short: {r:?}"),
            Some(body) => match (r, codec::decode_snapshot(body)) {
                (Ok(got), Ok(want)) => assert_eq!(got, want),
                (Err(QueryError::Decode(got)), Err(want)) => assert_eq!(got, want),
                (r, d) => panic!("exchange gave {r:?}, the body decodes to {d:?}"),
            },
        },
    }
});
