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
    /// Payload length of the last message completed (the guess of
    /// [`FrameDecoder::read_guessed`]).
    last_len: usize,
}

/// A message whose payload is being received.
#[derive(Debug)]
struct Partial {
    header: Header,
    /// `buf[..have]` is the payload received so far; `buf[have..]` is
    /// room offered to reads and not yet filled (zeros, or the old bytes
    /// of a pooled buffer: never part of a payload).
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
        FrameDecoder { hdr: [0; HEADER_LEN], hdr_have: 0, cur: None, max_len, consumed: 0, last_len: 0 }
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

    /// Payload length of the last message completed (0 before any).
    pub fn last_len(&self) -> usize {
        self.last_len
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
                    self.last_len = 0;
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
        self.last_len = have;
        Some(Frame { header, payload: buf })
    }

    /// For a stream of large messages, between two messages: one `read`
    /// takes the next header into a 48-byte buffer and, in the same call,
    /// up to `guess` payload bytes straight into a buffer of the payload
    /// pool (`read` gets the two as `IoSliceMut`s: `readv`). When the
    /// message is `guess` bytes long, which in a stream of one size it is
    /// (the caller guesses [`FrameDecoder::last_len`]), its payload is
    /// never copied in user space: no read buffer in between, and no
    /// growing buffer to reallocate. A message of another length costs a
    /// copy of what the read brought past its end (fed on as by
    /// [`FrameDecoder::feed`]), nothing more.
    ///
    /// Memory stays bounded by what arrived, as with the other reads: a
    /// partial payload, or a shorter message, that fills less than about
    /// half of the guessed buffer is copied into a buffer its size and the
    /// large one goes back to the pool. `guess` is capped at the decoder's
    /// maximum length.
    ///
    /// Calls `on_frame` for every message completed, returns the bytes
    /// read. `read`'s error is passed through (nothing is committed); a
    /// count above what it was offered is `InvalidInput`, a header above
    /// the maximum length `InvalidData` (the stream is then unusable, as
    /// after [`FrameDecoder::feed`]'s error), and so is a call with a
    /// message in progress (`InvalidInput`: see [`FrameDecoder::is_idle`]).
    pub fn read_guessed(
        &mut self,
        guess: usize,
        read: impl FnOnce(&mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize>,
        on_frame: &mut dyn FnMut(Frame),
    ) -> std::io::Result<usize> {
        use std::io::{Error, ErrorKind, IoSliceMut};
        if !self.is_idle() {
            return Err(Error::new(ErrorKind::InvalidInput, "read_guessed: a message is in progress"));
        }
        let guess = guess.clamp(1, self.max_len.max(1) as usize);
        let mut hdr = [0u8; HEADER_LEN];
        let mut buf = crate::payload::PayloadPool::global().take_vec_filled(guess);
        let n = match read(&mut [IoSliceMut::new(&mut hdr), IoSliceMut::new(&mut buf)]) {
            Ok(n) => n,
            Err(e) => {
                // Usually EAGAIN (a reader that found the socket drained):
                // the buffer goes back to the pool. Dropped, it went to the
                // allocator, and the next read allocated and zero-filled a
                // new one (qperf rds_bw 64 KiB on loopback: a third of the
                // receiver's takes missed the pool).
                recycle(buf);
                return Err(e);
            }
        };
        if n > HEADER_LEN + guess {
            return Err(Error::new(ErrorKind::InvalidInput, "read_guessed: more bytes reported than offered"));
        }
        let bad = |e: WireError| Error::new(ErrorKind::InvalidData, e.to_string());
        if n < HEADER_LEN {
            recycle(buf);
            self.feed(&hdr[..n], on_frame).map_err(bad)?;
            return Ok(n);
        }
        let header = Header::from_bytes(&hdr);
        self.consumed += HEADER_LEN as u64;
        if header.len > self.max_len {
            return Err(bad(WireError::TooLong { len: header.len, max: self.max_len }));
        }
        let got = n - HEADER_LEN;
        let len = header.len as usize;
        if len < got {
            // A shorter message: its payload, then the following bytes
            // fed on (copied).
            let tail = buf[len..got].to_vec();
            let payload = if len == 0 {
                recycle(buf);
                Vec::new()
            } else {
                fit(buf, len, len)
            };
            self.consumed += len as u64;
            self.last_len = len;
            on_frame(Frame { header, payload });
            self.feed(&tail, on_frame).map_err(bad)?;
            return Ok(n);
        }
        self.consumed += got as u64;
        // `buf[got..]` stays as room for the rest (as a direct read's),
        // unless a trickle came into a large guess.
        let buf = fit(buf, got, len.min(guess));
        self.cur = Some(Partial { header, buf, have: got });
        if let Some(f) = self.complete() {
            on_frame(f);
        }
        Ok(n)
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

/// Gives `buf` back to the payload pool (a dropped `Vec` would go to the
/// allocator).
fn recycle(buf: Vec<u8>) {
    drop(crate::payload::PayloadPool::global().adopt(buf));
}

/// `buf`, whose first `keep` bytes were read, cut to `len`; or, when its
/// capacity is above `2 * keep + PAYLOAD_WINDOW_MIN` (the bound a partial
/// payload keeps), those `keep` bytes in a pooled buffer of their size and
/// `buf` back to the pool: a trickle or a short message read into a large
/// guess holds about what arrived.
fn fit(mut buf: Vec<u8>, keep: usize, len: usize) -> Vec<u8> {
    if buf.capacity() <= 2 * keep + PAYLOAD_WINDOW_MIN {
        buf.truncate(len);
        return buf;
    }
    let mut small = crate::payload::PayloadPool::global().take_vec(keep);
    small.extend_from_slice(&buf[..keep]);
    recycle(buf);
    small
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

    /// A `readv` over `src` from `*pos`, at most `max` bytes.
    fn readv_from(src: &[u8], pos: &mut usize, max: usize, bufs: &mut [std::io::IoSliceMut<'_>]) -> usize {
        let mut n = 0;
        for b in bufs.iter_mut() {
            let take = b.len().min(src.len() - *pos).min(max - n);
            b[..take].copy_from_slice(&src[*pos..*pos + take]);
            *pos += take;
            n += take;
        }
        n
    }

    fn stream_of(lens: &[usize]) -> (Vec<u8>, Vec<(Header, Vec<u8>)>) {
        let (mut stream, mut expect) = (Vec::new(), Vec::new());
        for (i, len) in lens.iter().enumerate() {
            let mut h = Header::data(7, 9, *len as u32);
            h.sequence = i as u64 + 1;
            let payload: Vec<u8> = (0..*len).map(|j| (i * 131 + j * 7 + j / 253) as u8).collect();
            stream.extend_from_slice(&h.to_bytes());
            stream.extend_from_slice(&payload);
            expect.push((h, payload));
        }
        (stream, expect)
    }

    /// Reads `stream` as rds-tcp does: a guessed read between messages
    /// once a message reached `min`, a direct read inside a large payload,
    /// else a buffered read fed in; at most `max` bytes per read. Returns
    /// the frames and how many reads there were of each kind.
    fn read_like_tcp(stream: &[u8], min: usize, max: usize) -> (Vec<(Header, Vec<u8>)>, [usize; 3]) {
        let mut d = FrameDecoder::default();
        let (mut pos, mut got, mut kinds) = (0usize, Vec::new(), [0usize; 3]);
        while pos < stream.len() {
            let before = pos;
            if d.is_idle() && d.last_len() >= min {
                kinds[0] += 1;
                let guess = d.last_len();
                let n = d
                    .read_guessed(guess, |b| Ok(readv_from(stream, &mut pos, max, b)), &mut |f| {
                        got.push((f.header, f.payload))
                    })
                    .unwrap();
                assert!(n <= HEADER_LEN + guess);
            } else if d.payload_remaining() > 0 && d.payload_received() + d.payload_remaining() >= min {
                kinds[1] += 1;
                let (_, f) = d
                    .read_direct(max, |b| Ok(readv_from(stream, &mut pos, max, &mut [std::io::IoSliceMut::new(b)])))
                    .unwrap();
                got.extend(f.map(|f| (f.header, f.payload)));
            } else {
                kinds[2] += 1;
                let end = (pos + max.min(1000)).min(stream.len());
                d.feed(&stream[pos..end], &mut |f| got.push((f.header, f.payload))).unwrap();
                pos = end;
            }
            assert!(pos > before, "every read makes progress");
            assert!(d.payload_capacity() <= 2 * d.payload_received() + PAYLOAD_WINDOW_MIN);
        }
        assert!(d.is_idle());
        (got, kinds)
    }

    /// A stream of one large size: after the first message, each message
    /// is one guessed read (header and payload in one call), whatever the
    /// sizes around it; any mix of sizes and read limits decodes the same.
    #[test]
    fn guessed_reads_take_a_stream_of_one_size_one_read_each() {
        let (stream, expect) = stream_of(&[20_000; 6]);
        let (got, kinds) = read_like_tcp(&stream, 16 << 10, usize::MAX);
        assert!(got == expect);
        assert_eq!(kinds[0], 5, "one guessed read per message after the first: {kinds:?}");
        let lens = [20_000, 20_000, 30_000, 17_000, 0, 17_000, 5, 17_000, 17_000, 64 << 10, 100, 20_000];
        let (stream, expect) = stream_of(&lens);
        for max in [1, 47, 48, 49, 1000, 16_999, 17_048, 17_049, 40_000, usize::MAX] {
            let (got, kinds) = read_like_tcp(&stream, 16 << 10, max);
            assert!(got == expect, "max {max}: frames differ");
            assert!(kinds[0] > 0, "max {max}: {kinds:?}");
        }
    }

    /// Header and payload land where they belong: a guessed read leaves
    /// no partial message when it read a whole one, its payload the
    /// pooled buffer of the guess; the pool's old bytes never show.
    #[test]
    fn guessed_read_uses_the_pooled_buffer_and_shows_no_old_bytes() {
        std::thread::spawn(|| {
            let (stream, expect) = stream_of(&[20_000, 20_000, 10_000, 20_000]);
            let mut d = FrameDecoder::default();
            let mut pos = 0;
            let mut got = Vec::new();
            d.feed(&stream[..HEADER_LEN + 20_000], &mut |f| got.push(f)).unwrap();
            pos += HEADER_LEN + 20_000;
            // The first payload back to the pool, full of its bytes.
            drop(crate::RxMessage::from(got.pop().unwrap()));
            // Exactly one message offered: one read, one frame.
            let n = d.read_guessed(20_000, |b| Ok(readv_from(&stream, &mut pos, usize::MAX, b)), &mut |f| got.push(f));
            assert_eq!(n.unwrap(), HEADER_LEN + 20_000);
            assert!(d.is_idle());
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].payload.capacity(), 32 << 10, "the guess's size class");
            assert!(got[0].payload == expect[1].1);
            drop(crate::RxMessage::from(got.pop().unwrap()));
            // A shorter message in a guessed buffer that holds the last
            // one's bytes: its payload is its own 10,000 bytes, and the
            // next header read after it is fed on.
            let n = d.read_guessed(20_000, |b| Ok(readv_from(&stream, &mut pos, usize::MAX, b)), &mut |f| got.push(f));
            assert_eq!(n.unwrap(), HEADER_LEN + 20_000);
            assert_eq!(got.len(), 1);
            assert!(got[0].payload == expect[2].1);
            assert_eq!((d.payload_received(), d.last_len()), (20_000 - 10_000 - HEADER_LEN, 10_000));
            d.feed(&stream[pos..], &mut |f| got.push(f)).unwrap();
            assert!(got[1].payload == expect[3].1);
        })
        .join()
        .unwrap();
    }

    /// A hostile peer: one large message, then a header of the largest
    /// length and a trickle. The guessed buffer is not kept for a few
    /// bytes; a count above the offer and a header above the limit are
    /// errors.
    #[test]
    fn guessed_reads_hold_what_arrived_and_check_the_peer() {
        let mut d = FrameDecoder::default();
        let mut h = Header::data(1, 2, MAX_MSG_SIZE as u32).to_bytes().to_vec();
        h.extend_from_slice(&[5u8; 10]);
        let mut pos = 0;
        let n =
            d.read_guessed(MAX_MSG_SIZE, |b| Ok(readv_from(&h, &mut pos, usize::MAX, b)), &mut |_| panic!()).unwrap();
        assert_eq!((n, d.payload_received()), (HEADER_LEN + 10, 10));
        assert!(d.payload_capacity() <= PAYLOAD_WINDOW_MIN, "{} bytes held for 10", d.payload_capacity());

        // A short message read into a large guess keeps a buffer its size.
        let (stream, expect) = stream_of(&[100, 50]);
        let (mut d, mut pos, mut got) = (FrameDecoder::default(), 0, Vec::new());
        d.read_guessed(MAX_MSG_SIZE, |b| Ok(readv_from(&stream, &mut pos, usize::MAX, b)), &mut |f| got.push(f))
            .unwrap();
        assert_eq!(got.len(), 2);
        assert!(
            got.iter().all(|f| f.payload.capacity() <= 128),
            "{:?}",
            got.iter().map(|f| f.payload.capacity()).collect::<Vec<_>>()
        );
        assert!(got[0].payload == expect[0].1 && got[1].payload == expect[1].1);

        let mut d = FrameDecoder::default();
        let e = d.read_guessed(100, |b| Ok(b.iter().map(|b| b.len()).sum::<usize>() + 1), &mut |_| panic!());
        assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
        assert!(d.is_idle());
        let big = Header::data(1, 2, MAX_MSG_SIZE as u32 + 1).to_bytes();
        let mut pos = 0;
        let e = d.read_guessed(100, |b| Ok(readv_from(&big, &mut pos, usize::MAX, b)), &mut |_| panic!());
        assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::InvalidData);
        let mut d = FrameDecoder::default();
        d.feed(&Header::data(1, 2, 10).to_bytes(), &mut |_| panic!()).unwrap();
        let e = d.read_guessed(100, |_| panic!("not called"), &mut |_| panic!());
        assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::InvalidInput);
    }

    /// A guessed read that fails (EAGAIN: the socket was drained) gives its
    /// buffer back to the pool: the next guessed read on this thread gets
    /// the same buffer (a dropped one went to the allocator, and each such
    /// read cost a new buffer, zero-filled). Then a message is read into
    /// it, intact, and the decoder is still idle after the failure.
    #[test]
    fn a_guessed_read_that_fails_returns_its_buffer_to_the_pool() {
        std::thread::spawn(|| {
            const GUESS: usize = 40_000;
            let mut d = FrameDecoder::default();
            let mut first = None;
            let e = d.read_guessed(
                GUESS,
                |b| {
                    first = Some(b[1].as_ptr() as usize);
                    Err(std::io::ErrorKind::WouldBlock.into())
                },
                &mut |_| panic!(),
            );
            assert_eq!(e.unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
            assert!(d.is_idle());
            let mut stream = Header::data(1, 2, GUESS as u32).to_bytes().to_vec();
            stream.extend((0..GUESS).map(|i| (i % 251) as u8));
            let mut pos = 0;
            let mut second = None;
            let mut got = Vec::new();
            d.read_guessed(
                GUESS,
                |b| {
                    second = Some(b[1].as_ptr() as usize);
                    Ok(readv_from(&stream, &mut pos, usize::MAX, b))
                },
                &mut |f| got.push(f),
            )
            .unwrap();
            assert_eq!(first, second, "the failed read's buffer served the next read");
            assert_eq!(got.len(), 1);
            assert!(got[0].payload[..] == stream[HEADER_LEN..]);
        })
        .join()
        .unwrap();
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
