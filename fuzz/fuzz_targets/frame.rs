//! The TCP stream framing (`FrameDecoder::feed`, and the direct reads of
//! `read_direct` and guessed reads of `read_guessed` that rds-tcp uses for
//! large payloads) on
//! arbitrary streams cut at arbitrary places: every way of feeding the
//! same bytes yields the same frames, the same error at the same offset,
//! and matches a straightforward reference parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rds_core::wire::{FrameDecoder, HEADER_LEN, Header, PAYLOAD_WINDOW_MIN, WireError};

#[derive(Debug, PartialEq)]
struct Outcome {
    frames: Vec<(Header, Vec<u8>)>,
    error: Option<WireError>,
    consumed: u64,
    hdr_rem: usize,
    data_rem: usize,
}

/// The reference: parse the whole stream at once, by the definition.
fn reference(stream: &[u8], max: u32) -> Outcome {
    let mut frames = Vec::new();
    let mut pos = 0usize;
    loop {
        let rest = &stream[pos..];
        if rest.len() < HEADER_LEN {
            let hdr_rem = HEADER_LEN - rest.len();
            return Outcome { frames, error: None, consumed: stream.len() as u64, hdr_rem, data_rem: 0 };
        }
        let h = Header::decode(rest).unwrap();
        if h.len > max {
            let error = Some(WireError::TooLong { len: h.len, max });
            return Outcome { frames, error, consumed: (pos + HEADER_LEN) as u64, hdr_rem: 48, data_rem: 0 };
        }
        let end = HEADER_LEN + h.len as usize;
        if rest.len() < end {
            let data_rem = end - rest.len();
            return Outcome { frames, error: None, consumed: stream.len() as u64, hdr_rem: 0, data_rem };
        }
        frames.push((h, rest[HEADER_LEN..end].to_vec()));
        pos += end;
    }
}

/// Feeds `stream` in chunks whose sizes come from `cuts`; where a payload
/// of at least `direct_min` bytes is missing and `direct` is set, reads
/// go straight into the decoder's buffer, offering at most `offer` bytes
/// and sometimes reading nothing (EAGAIN).
fn chunked(stream: &[u8], max: u32, cuts: &[u8], direct: bool, direct_min: usize, offer: usize) -> Outcome {
    let mut d = FrameDecoder::new(max);
    let mut frames = Vec::new();
    let mut pos = 0usize;
    let mut i = 0usize;
    let mut error = None;
    let mut blocked = false;
    while pos < stream.len() {
        let c = cuts.get(i % cuts.len().max(1)).copied().unwrap_or(255);
        i += 1;
        let chunk = (usize::from(c) * 37 % 4099 + 1).min(stream.len() - pos);
        if direct && d.is_idle() && d.last_len() >= direct_min {
            // rds-tcp's guessed read: header and a payload of the last
            // length in one readv of at most `chunk` bytes.
            let guess = d.last_len();
            let mut n = 0;
            let r = d.read_guessed(
                guess,
                |bufs| {
                    let offered: usize = bufs.iter().map(|b| b.len()).sum();
                    assert_eq!(offered, HEADER_LEN + guess.min(max.max(1) as usize));
                    for b in bufs.iter_mut() {
                        let take = b.len().min(chunk - n);
                        b[..take].copy_from_slice(&stream[pos + n..pos + n + take]);
                        n += take;
                    }
                    Ok(n)
                },
                &mut |f| {
                    assert_eq!(f.payload.len(), f.header.len as usize);
                    frames.push((f.header, f.payload));
                },
            );
            match r {
                Ok(m) => assert_eq!(m, n),
                Err(e) => {
                    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
                    // The header at `pos` was too long, or one fed after it.
                    error = Some(WireError::TooLong { len: 0, max });
                    pos += n;
                    break;
                }
            }
            assert!(d.payload_capacity() <= 2 * d.payload_received() + PAYLOAD_WINDOW_MIN);
            pos += n;
        } else if direct && d.payload_remaining() >= direct_min {
            // c % 7 == 0: the read would block and returns nothing (never
            // twice in a row, so the loop ends).
            blocked = c % 7 == 0 && !blocked;
            let r = d.read_direct(offer, |buf| {
                let offered = buf.len();
                assert!(offered > 0 && offered <= offer);
                if blocked {
                    // Room offered and not filled must not leak into the payload.
                    buf.fill(0xa5);
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                let n = chunk.min(offered);
                buf[..n].copy_from_slice(&stream[pos..pos + n]);
                for b in buf[n..].iter_mut() {
                    *b = 0xa5;
                }
                Ok(n)
            });
            let n = match r {
                Ok((n, f)) => {
                    if let Some(f) = f {
                        assert_eq!(f.payload.len(), f.header.len as usize);
                        frames.push((f.header, f.payload));
                    }
                    n
                }
                Err(e) => {
                    assert!(blocked && e.kind() == std::io::ErrorKind::WouldBlock);
                    0
                }
            };
            // Memory grows with what arrived.
            assert!(d.payload_capacity() <= 2 * d.payload_received() + PAYLOAD_WINDOW_MIN);
            pos += n;
        } else {
            let r = d.feed(&stream[pos..pos + chunk], &mut |f| {
                assert_eq!(f.payload.len(), f.header.len as usize);
                frames.push((f.header, f.payload));
            });
            if let Err(e) = r {
                error = Some(e);
                break;
            }
            pos += chunk;
        }
        assert_eq!(d.consumed(), pos as u64, "consumed counts exactly what was fed");
    }
    if let Some(WireError::TooLong { len: 0, max: m }) = error {
        // From a guessed read: the length is the header's the decoder
        // stopped at, the one ending at `consumed`.
        let at = d.consumed() as usize - HEADER_LEN;
        let len = Header::decode(&stream[at..]).map_or(0, |h| h.len);
        error = Some(WireError::TooLong { len, max: m });
    }
    let (hdr_rem, data_rem) = if error.is_some() { (48, 0) } else { (d.header_remaining(), d.payload_remaining()) };
    if error.is_none() {
        assert_eq!(d.is_idle(), hdr_rem == HEADER_LEN && data_rem == 0);
    }
    Outcome { frames, error, consumed: d.consumed(), hdr_rem, data_rem }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let max = match data[0] % 4 {
        0 => 1 << 20,
        1 => 0,
        _ => u32::from(data[1]) * 64,
    };
    let ncuts = usize::from(data[2] % 16) + 1;
    let direct_min = usize::from(data[3]) * 8 + 1;
    let offer = usize::from(data[4]).max(1) * 16;
    let rest = &data[5..];
    let (cuts, stream) = rest.split_at(ncuts.min(rest.len()));
    let want = reference(stream, max);
    let whole = chunked(stream, max, &[255; 1], false, 0, 1);
    let one = {
        // Everything in one feed call.
        let mut d = FrameDecoder::new(max);
        let mut frames = Vec::new();
        let r = d.feed(stream, &mut |f| frames.push((f.header, f.payload)));
        let (hdr_rem, data_rem) = if r.is_err() { (48, 0) } else { (d.header_remaining(), d.payload_remaining()) };
        Outcome { frames, error: r.err(), consumed: d.consumed(), hdr_rem, data_rem }
    };
    assert_eq!(one, want, "one feed");
    assert_eq!(whole, want, "fixed chunks");
    assert_eq!(chunked(stream, max, cuts, false, 0, 1), want, "chunks {cuts:?}");
    assert_eq!(chunked(stream, max, cuts, true, direct_min, offer), want, "direct reads {cuts:?}");
});
