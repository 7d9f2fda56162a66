//! The RDS-TCP stream framing: `[48-byte header][h_len bytes]` repeated,
//! split into messages whatever the segmentation.

use super::*;

/// Result of feeding bytes to a [`FrameDecoder`].
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub payload: Vec<u8>,
}

/// Splits an RDS-TCP byte stream into messages (`[48-byte header][h_len bytes]`
/// repeated). A message may span any number of reads and a read may hold any
/// number of messages.
///
/// Memory is bounded by the data actually received: the payload buffer grows
/// with the bytes that arrive, never to a hostile `h_len` up front, and `h_len`
/// above the limit is an error before any payload is buffered. A partial
/// payload holds at most about twice the bytes received plus
/// [`PAYLOAD_WINDOW_MIN`] (see [`FrameDecoder::payload_capacity`]), whether it
/// was fed ([`FrameDecoder::feed`]) or read in place
/// ([`FrameDecoder::read_direct`]), and every byte is zero-filled at most once.
#[derive(Debug)]
pub struct FrameDecoder {
    hdr: [u8; HEADER_LEN],
    hdr_have: usize,
    cur: Option<Partial>,
    max_len: u32,
    /// Bytes of the stream consumed so far (for introspection).
    consumed: u64,
}

/// A message whose payload is being received.
#[derive(Debug)]
struct Partial {
    header: Header,
    /// `buf[..have]` is the payload received so far; `buf[have..]` is
    /// zero-filled room offered to direct reads and not yet filled.
    buf: Vec<u8>,
    have: usize,
}

/// The first allocation of a payload, and the smallest direct-read window:
/// a payload's buffer then grows with what arrived (it at most doubles).
pub const PAYLOAD_WINDOW_MIN: usize = 16 * 1024;

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(MAX_MSG_SIZE as u32)
    }
}

impl FrameDecoder {
    /// A decoder that rejects `h_len` above `max_len`.
    pub fn new(max_len: u32) -> FrameDecoder {
        FrameDecoder { hdr: [0; HEADER_LEN], hdr_have: 0, cur: None, max_len, consumed: 0 }
    }

    /// Header bytes still missing before the next header is complete (0 while
    /// inside a payload).
    pub fn header_remaining(&self) -> usize {
        if self.cur.is_some() { 0 } else { HEADER_LEN - self.hdr_have }
    }

    /// Payload bytes still missing of the current message (0 between messages).
    pub fn payload_remaining(&self) -> usize {
        match &self.cur {
            Some(p) => p.header.len as usize - p.have,
            None => 0,
        }
    }

    /// Payload bytes received of the current message (0 between messages).
    pub fn payload_received(&self) -> usize {
        self.cur.as_ref().map_or(0, |p| p.have)
    }

    /// Bytes allocated for the current message's payload (0 between
    /// messages): at most `2 * payload_received() + PAYLOAD_WINDOW_MIN`.
    pub fn payload_capacity(&self) -> usize {
        self.cur.as_ref().map_or(0, |p| p.buf.capacity())
    }

    /// Total stream bytes consumed.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }

    /// True when the decoder is between messages (no partial header or payload).
    pub fn is_idle(&self) -> bool {
        self.cur.is_none() && self.hdr_have == 0
    }

    /// Feeds bytes; calls `on_frame` for every complete message in order.
    /// On error the stream is unusable (the connection must be reset); frames
    /// completed before the error have already been passed to `on_frame`.
    pub fn feed(&mut self, mut data: &[u8], on_frame: &mut dyn FnMut(Frame)) -> Result<(), WireError> {
        while !data.is_empty() {
            if let Some(p) = &mut self.cur {
                let take = (p.header.len as usize - p.have).min(data.len());
                // Into the zero-filled room a direct read left, then beyond.
                let room = (p.buf.len() - p.have).min(take);
                p.buf[p.have..p.have + room].copy_from_slice(&data[..room]);
                p.buf.extend_from_slice(&data[room..take]);
                p.have += take;
                data = &data[take..];
                self.consumed += take as u64;
                if let Some(f) = self.complete() {
                    on_frame(f);
                }
                continue;
            }
            let take = (HEADER_LEN - self.hdr_have).min(data.len());
            self.hdr[self.hdr_have..self.hdr_have + take].copy_from_slice(&data[..take]);
            self.hdr_have += take;
            self.consumed += take as u64;
            data = &data[take..];
            if self.hdr_have == HEADER_LEN {
                self.hdr_have = 0;
                let header = Header::from_bytes(&self.hdr);
                if header.len > self.max_len {
                    return Err(WireError::TooLong { len: header.len, max: self.max_len });
                }
                if header.len == 0 {
                    on_frame(Frame { header, payload: Vec::new() });
                } else {
                    // A payload up to the minimal window gets a buffer of
                    // the payload pool (its size class, at most the window),
                    // which comes back when the message is consumed:
                    // `RxMessage::from` adopts it. A larger one grows with
                    // what arrives, from the window up.
                    let len = header.len as usize;
                    let buf = if len <= PAYLOAD_WINDOW_MIN {
                        crate::payload::PayloadPool::global().take_vec(len)
                    } else {
                        Vec::with_capacity(PAYLOAD_WINDOW_MIN)
                    };
                    self.cur = Some(Partial { header, buf, have: 0 });
                }
            }
        }
        Ok(())
    }

    /// The current message, if its payload is complete.
    fn complete(&mut self) -> Option<Frame> {
        let p = self.cur.as_ref()?;
        if p.have != p.header.len as usize {
            return None;
        }
        let Partial { header, mut buf, have } = self.cur.take()?;
        buf.truncate(have);
        Some(Frame { header, payload: buf })
    }

    /// For large payloads: `read` fills the next payload bytes straight into
    /// the message's buffer (no copy through an intermediate buffer) and
    /// returns how many it wrote. The window it gets holds at most `max`
    /// bytes, never more than the payload still missing, and never more
    /// than what was already received or [`PAYLOAD_WINDOW_MIN`] (so the
    /// buffer grows with what arrives: a 1 MiB `h_len` followed by a
    /// trickle costs what the trickle brought, not 1 MiB). Room offered
    /// and not filled is kept for the next read: each byte is zero-filled
    /// once.
    ///
    /// Returns the bytes read and the message if it is now complete.
    /// `read`'s error is passed through (nothing is committed). Fails with
    /// `InvalidInput` when no payload is in progress (see
    /// [`FrameDecoder::payload_remaining`]) or `read` claims more bytes than
    /// its window (nothing is committed either: the decoder never trusts a
    /// count it did not offer).
    pub fn read_direct(
        &mut self,
        max: usize,
        read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
    ) -> std::io::Result<(usize, Option<Frame>)> {
        let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
        let Some(p) = self.cur.as_mut() else { return Err(invalid("no payload in progress")) };
        let want = (p.header.len as usize - p.have).min(max.max(1)).min(p.have.max(PAYLOAD_WINDOW_MIN));
        let end = p.have + want;
        if p.buf.len() < end {
            p.buf.reserve_exact(end - p.buf.len());
            p.buf.resize(end, 0);
        }
        let n = read(&mut p.buf[p.have..end])?;
        if n > want {
            return Err(invalid("read_direct: more bytes reported than offered"));
        }
        p.have += n;
        self.consumed += n as u64;
        Ok((n, self.complete()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoder_splits_any_segmentation() {
        let mut stream = Vec::new();
        let mut expect = Vec::new();
        for (i, len) in [0usize, 1, 47, 48, 49, 5000, 0, 3].iter().enumerate() {
            let mut h = Header::data(100 + i as u16, 200, *len as u32);
            h.sequence = i as u64 + 1;
            let payload: Vec<u8> = (0..*len).map(|j| (i * 31 + j) as u8).collect();
            stream.extend_from_slice(&h.to_bytes());
            stream.extend_from_slice(&payload);
            expect.push((h, payload));
        }
        for chunk in [1, 2, 7, 48, 49, 1000, stream.len()] {
            let mut d = FrameDecoder::default();
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                d.feed(c, &mut |f| got.push((f.header, f.payload))).unwrap();
            }
            assert!(d.is_idle());
            assert_eq!(got, expect, "chunk size {chunk}");
        }
    }

    #[test]
    fn decoder_rejects_oversized_len_before_buffering() {
        let h = Header::data(1, 2, (MAX_MSG_SIZE + 1) as u32);
        let mut d = FrameDecoder::default();
        let err = d.feed(&h.to_bytes(), &mut |_| panic!("no frame")).unwrap_err();
        assert_eq!(err, WireError::TooLong { len: MAX_MSG_SIZE as u32 + 1, max: MAX_MSG_SIZE as u32 });
    }

    #[test]
    fn direct_reads_complete_a_frame() {
        let h = Header::data(1, 2, 10);
        let mut d = FrameDecoder::default();
        d.feed(&h.to_bytes(), &mut |_| panic!()).unwrap();
        let (n, f) = d
            .read_direct(100, |buf| {
                assert_eq!(buf.len(), 10);
                buf[..4].copy_from_slice(b"abcd");
                Ok(4)
            })
            .unwrap();
        assert_eq!((n, f.is_none()), (4, true));
        assert_eq!(d.payload_remaining(), 6);
        let (n, f) = d
            .read_direct(100, |buf| {
                assert_eq!(buf.len(), 6);
                buf.copy_from_slice(b"efghij");
                Ok(6)
            })
            .unwrap();
        assert_eq!(n, 6);
        assert_eq!(f.unwrap().payload, b"abcdefghij");
        assert!(d.is_idle());
    }

    /// A read that claims more than its window, or a direct read with no
    /// payload in progress, is an error that commits nothing (it was an
    /// arithmetic underflow in `commit_direct`).
    #[test]
    fn direct_read_mismatch_is_an_error() {
        let mut d = FrameDecoder::default();
        let e = d.read_direct(100, |_| Ok(5)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        d.feed(&Header::data(1, 2, 10).to_bytes(), &mut |_| panic!()).unwrap();
        let e = d.read_direct(4, |b| Ok(b.len() + 1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!((d.payload_remaining(), d.consumed()), (10, 48));
        let e = d.read_direct(4, |_| Err(std::io::ErrorKind::WouldBlock.into())).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        let (n, f) = d
            .read_direct(100, |b| {
                b.copy_from_slice(b"0123456789");
                Ok(10)
            })
            .unwrap();
        assert_eq!((n, f.unwrap().payload), (10, b"0123456789".to_vec()));
    }

    /// A 1 MiB `h_len` followed by a trickle: the buffer grows with what
    /// arrived (at most twice it plus the minimal window), each direct read
    /// is offered a bounded window, and no byte is zero-filled twice.
    #[test]
    fn payload_memory_grows_with_arrivals() {
        let len = MAX_MSG_SIZE;
        let payload: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        for step in [1usize, 100, 5000, 70_000] {
            let mut d = FrameDecoder::default();
            d.feed(&Header::data(1, 2, len as u32).to_bytes(), &mut |_| panic!()).unwrap();
            assert!(d.payload_capacity() <= PAYLOAD_WINDOW_MIN, "{}", d.payload_capacity());
            let (mut pos, mut reads, mut offered_new) = (0usize, 0usize, 0usize);
            let mut done = None;
            while done.is_none() {
                let before = d.payload_capacity();
                let mut window = 0;
                let (n, f) = d
                    .read_direct(MAX_MSG_SIZE, |buf| {
                        window = buf.len();
                        let n = step.min(buf.len());
                        buf[..n].copy_from_slice(&payload[pos..pos + n]);
                        Ok(n)
                    })
                    .unwrap();
                assert!(window <= pos.max(PAYLOAD_WINDOW_MIN), "window {window} after {pos} bytes");
                offered_new += d.payload_capacity().saturating_sub(before);
                pos += n;
                reads += 1;
                assert!(reads <= len, "bounded");
                if f.is_none() {
                    assert!(
                        d.payload_capacity() <= 2 * d.payload_received() + PAYLOAD_WINDOW_MIN,
                        "step {step}: {} bytes held for {} received",
                        d.payload_capacity(),
                        d.payload_received()
                    );
                }
                done = f;
            }
            let f = done.unwrap();
            assert!(f.payload == payload, "step {step}: payload differs");
            assert_eq!(pos, len);
            // Zero-filled (allocated) bytes in total: about the payload, not
            // the payload per read.
            assert!(offered_new <= 2 * len, "step {step}: {offered_new} bytes zero-filled");
        }
    }

    /// Fed in small pieces (the reactor's buffered path), a hostile 1 MiB
    /// `h_len` also holds only about what arrived.
    #[test]
    fn fed_payload_memory_grows_with_arrivals() {
        let mut d = FrameDecoder::default();
        d.feed(&Header::data(1, 2, MAX_MSG_SIZE as u32).to_bytes(), &mut |_| panic!()).unwrap();
        for i in 0..100_000usize {
            d.feed(&[i as u8], &mut |_| panic!()).unwrap();
            assert!(d.payload_capacity() <= 2 * d.payload_received() + PAYLOAD_WINDOW_MIN);
        }
        assert_eq!(d.payload_received(), 100_000);
    }

    /// A small payload's buffer comes from the payload pool and goes back
    /// when the received message is consumed: the next message of its size
    /// class is read into the same buffer, with its own bytes.
    #[test]
    fn small_payload_buffers_go_round_through_the_pool() {
        std::thread::spawn(|| {
            let mut d = FrameDecoder::default();
            let mut stream = Vec::new();
            for i in 0..3u8 {
                stream.extend_from_slice(&Header::data(1, 2, 100).to_bytes());
                stream.extend_from_slice(&[i; 100]);
            }
            let mut ptrs = Vec::new();
            for chunk in stream.chunks(148) {
                let mut got = Vec::new();
                d.feed(chunk, &mut |f| got.push(f)).unwrap();
                assert_eq!(got.len(), 1);
                let f = got.pop().unwrap();
                assert_eq!(f.payload.capacity(), 128, "the size class of 100 bytes");
                let m = crate::RxMessage::from(f);
                assert_eq!(&*m.payload, &[chunk[HEADER_LEN]; 100][..]);
                ptrs.push(m.payload.as_ptr());
                // The application consumes it: the buffer goes back.
            }
            assert!(ptrs.windows(2).all(|w| w[0] == w[1]), "one buffer for all three: {ptrs:?}");
        })
        .join()
        .unwrap();
    }
}
