//! # rds-rdmabuf: memory that RDMA may read and write
//!
//! Memory that a peer's RDMA or our own RDMA operations may read and write:
//! [`RdmaBuf`] and ranges of it, [`RdmaSeg`].
//!
//! ## Why a crate of its own
//!
//! This is the one place in rds-rs where memory that a device may write
//! behind the compiler's back is owned, and so the one place of the
//! protocol's types that needs `unsafe` (allocating and freeing it, viewing
//! it as atomics, [`RdmaBuf::from_raw`], `Send` / `Sync`). Keeping it apart
//! lets `rds-core`, the sans-IO general layer, `#![forbid(unsafe_code)]`;
//! rds-core depends on this crate and re-exports it at the same paths
//! (`rds_core::RdmaBuf`, `rds_core::RdmaSeg`, `rds_core::rdma_buf::*`), so
//! users name it through rds-core as before. It depends on nothing (not
//! even rds-core, which depends on it): its only error is [`OutOfRange`],
//! the kernel's EINVAL, which converts into (and compares equal to)
//! `rds_core::Errno::EINVAL`.
//!
//! ## The contract
//!
//! The kernel's AF_RDS takes raw user addresses for `RDS_GET_MR`,
//! `RDS_CMSG_RDMA_MAP` and the local vectors of `RDS_CMSG_RDMA_ARGS`, and
//! the user must keep that memory alive until the MR is released or the
//! operation completed. Safe Rust cannot make that promise about a raw
//! address, so the socket API takes these buffers instead:
//!
//! * an `RdmaBuf` is a handle (cheap to clone, `Arc`-counted) to memory
//!   that lives until its last handle goes; every registration (an MR of
//!   `get_mr`, the local buffer of an RDMA operation in flight) holds a
//!   handle and drops it only after the device can no longer touch the
//!   memory (the MR deregistered, the work requests completed or their QP
//!   destroyed), so freeing it under a running operation is impossible;
//! * the memory may change under the caller at any time while a peer or
//!   the device can write it, so its bytes are never lent out as `&[u8]`
//!   while any other handle exists: they are copied in and out with
//!   [`RdmaBuf::read_at`] / [`RdmaBuf::write_at`] (byte-wise atomic
//!   accesses, sound against concurrent writers), or borrowed with
//!   [`RdmaBuf::exclusive`] when this is the only handle (then nothing can
//!   be registered over it for the borrow's duration);
//! * [`RdmaBuf::from_raw`] is the raw form for a C ABI that must pass user
//!   pointers as the kernel's AF_RDS does; it is `unsafe` and states the
//!   contract that replaces the ownership.
//!
//! Ranges are checked when a segment is formed ([`RdmaBuf::seg`]: EINVAL
//! beyond the buffer), so a registration can only ever cover memory of its
//! buffer.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// A range that is not inside its buffer: the kernel's EINVAL. Its `Debug`
/// and `Display` read `EINVAL(22)` as `rds_core::Errno::EINVAL`'s do;
/// rds-core converts it into that `Errno` (`From`, so `?` works) and
/// compares the two equal.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OutOfRange;

impl OutOfRange {
    /// Its errno value (`EINVAL`).
    pub const ERRNO: i32 = 22;

    /// Its errno value (`EINVAL`).
    pub fn errno(self) -> i32 {
        Self::ERRNO
    }
}

impl fmt::Debug for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EINVAL({})", Self::ERRNO)
    }
}

impl fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl std::error::Error for OutOfRange {}

impl From<OutOfRange> for std::io::Error {
    fn from(e: OutOfRange) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.errno())
    }
}

/// Alignment of the memory [`RdmaBuf::new`] allocates: a page, so that a
/// segment's in-page offset (which an MR cookie carries) is its offset
/// modulo 4096.
pub const RDMA_BUF_ALIGN: usize = 4096;

struct Mem {
    ptr: NonNull<AtomicU8>,
    len: usize,
    /// The layout it was allocated with; `None` for memory of the caller
    /// ([`RdmaBuf::from_raw`]), which is never freed here.
    layout: Option<Layout>,
}

// SAFETY: the memory is only accessed as `AtomicU8`s (or exclusively through
// `&mut` when no other handle exists), so sharing and sending the handle
// between threads is as safe as sharing a `[AtomicU8]`.
unsafe impl Send for Mem {}
// SAFETY: as above.
unsafe impl Sync for Mem {}

impl Drop for Mem {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: allocated in `RdmaBuf::new` with this layout; this is
            // the last handle, and every registration over the memory held
            // one until the device was done with it.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr().cast(), layout) };
        }
    }
}

/// A buffer for RDMA: memory the socket API may register and hand to the
/// device, kept alive for as long as any registration or operation needs
/// it. See the [crate docs](crate).
///
/// ```
/// use rds_rdmabuf::RdmaBuf; // or rds_core::RdmaBuf, the same type
/// let buf = RdmaBuf::new(8192);
/// buf.write_at(100, b"hello").unwrap();
/// let seg = buf.seg(100, 5).unwrap(); // what get_mr / RdmaOp take
/// assert_eq!(seg.in_page_offset(), 100);
/// let mut out = [0u8; 5];
/// buf.read_at(100, &mut out).unwrap();
/// assert_eq!(&out, b"hello");
/// ```
#[derive(Clone)]
pub struct RdmaBuf {
    mem: Arc<Mem>,
}

impl RdmaBuf {
    /// `len` zeroed bytes, page-aligned. Panics only where `Vec` would
    /// (allocation failure, a length near `isize::MAX`).
    pub fn new(len: usize) -> RdmaBuf {
        let layout = Layout::from_size_align(len.max(1), RDMA_BUF_ALIGN).expect("RdmaBuf: length too large");
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(p.cast::<AtomicU8>()) else { std::alloc::handle_alloc_error(layout) };
        RdmaBuf { mem: Arc::new(Mem { ptr, len, layout: Some(layout) }) }
    }

    /// A new buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> RdmaBuf {
        let b = RdmaBuf::new(data.len());
        b.write_at(0, data).expect("in range");
        b
    }

    /// A handle to `len` bytes at `addr` of this process, not owned (never
    /// freed here): the raw form, for a C ABI that passes user pointers as
    /// the kernel's AF_RDS does.
    ///
    /// # Safety
    ///
    /// For as long as any clone of the returned handle exists,
    /// `addr..addr + len` must be memory of this process that is valid for
    /// reads and writes (not freed, unmapped or reused), and it must not be
    /// accessed through Rust references (`&[u8]`, `&mut [u8]`) or
    /// non-atomic reads and writes of other threads: the device and peers
    /// may read or write it at any time until then. The engine holds a
    /// clone while the memory is registered: an MR until
    /// `free_mr`, its use-once release or the socket's close (each
    /// deregisters before it returns), an RDMA operation's local buffer
    /// until its work requests completed or its connection was destroyed.
    /// [`RdmaBuf::handles`] returning 1 on the caller's only handle means
    /// the engine let go. The range must not wrap.
    pub unsafe fn from_raw(addr: u64, len: u64) -> RdmaBuf {
        let ptr = NonNull::new(addr as usize as *mut AtomicU8).unwrap_or(NonNull::dangling());
        RdmaBuf { mem: Arc::new(Mem { ptr, len: len as usize, layout: None }) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// The address of the first byte (a number: what the original tools
    /// put in their headers; using it as a pointer is the caller's risk).
    pub fn addr(&self) -> u64 {
        self.mem.ptr.as_ptr() as usize as u64
    }

    /// Handles to this memory alive now, this one included: registrations
    /// and operations in flight each hold one.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.mem)
    }

    fn cells(&self) -> &[AtomicU8] {
        // SAFETY: `len` bytes at `ptr` are live memory (allocated by `new`
        // and freed only with the last handle, or promised by the caller of
        // `from_raw` for the life of every handle); `AtomicU8` has the
        // layout of `u8`, and all shared accesses go through atomics.
        unsafe { std::slice::from_raw_parts(self.mem.ptr.as_ptr(), self.mem.len) }
    }

    fn range(&self, off: usize, len: usize) -> Result<&[AtomicU8], OutOfRange> {
        let end = off.checked_add(len).ok_or(OutOfRange)?;
        self.cells().get(off..end).ok_or(OutOfRange)
    }

    /// Copies `out.len()` bytes from offset `off` into `out`; EINVAL when
    /// the range is not inside the buffer. The bytes are a snapshot: a
    /// peer's write in flight may be seen partly.
    pub fn read_at(&self, off: usize, out: &mut [u8]) -> Result<(), OutOfRange> {
        let src = self.range(off, out.len())?;
        for (o, c) in out.iter_mut().zip(src) {
            *o = c.load(Relaxed);
        }
        Ok(())
    }

    /// Copies `data` to offset `off`; EINVAL when the range is not inside
    /// the buffer.
    pub fn write_at(&self, off: usize, data: &[u8]) -> Result<(), OutOfRange> {
        for (c, d) in self.range(off, data.len())?.iter().zip(data) {
            c.store(*d, Relaxed);
        }
        Ok(())
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        self.cells().iter().map(|c| c.load(Relaxed)).collect()
    }

    /// The bytes as a plain slice, when this is the only handle (nothing
    /// registered over the memory, no operation using it, no clone): then
    /// nobody else can reach the memory while the borrow lasts. `None`
    /// otherwise, and always for memory of [`RdmaBuf::from_raw`].
    pub fn exclusive(&mut self) -> Option<&mut [u8]> {
        self.mem.layout?;
        let mem = Arc::get_mut(&mut self.mem)?;
        // SAFETY: the only handle, borrowed mutably: no other reference,
        // registration or operation can reach the memory for the borrow's
        // duration; it is `len` live bytes owned by this handle.
        Some(unsafe { std::slice::from_raw_parts_mut(mem.ptr.as_ptr().cast::<u8>(), mem.len) })
    }

    /// The range `off..off + len` as a segment for `get_mr` or an RDMA
    /// operation's local buffer; EINVAL when it is not inside the buffer.
    /// (An empty segment is formed; the socket refuses it where the kernel
    /// does.)
    pub fn seg(&self, off: usize, len: usize) -> Result<RdmaSeg, OutOfRange> {
        self.range(off, len)?;
        Ok(RdmaSeg { buf: self.clone(), off, len })
    }

    /// The whole buffer as a segment.
    pub fn all(&self) -> RdmaSeg {
        RdmaSeg { buf: self.clone(), off: 0, len: self.len() }
    }
}

impl fmt::Debug for RdmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RdmaBuf({:#x}, {})", self.addr(), self.len())
    }
}

/// A range of an [`RdmaBuf`], always inside it: what `get_mr` registers and
/// what an RDMA operation (`rds_core::RdmaOp::local`) reads or writes. It
/// holds a handle to its buffer, so the memory lives as long as the
/// segment.
#[derive(Clone)]
pub struct RdmaSeg {
    buf: RdmaBuf,
    off: usize,
    len: usize,
}

impl RdmaSeg {
    /// The buffer it is a range of.
    pub fn buf(&self) -> &RdmaBuf {
        &self.buf
    }

    /// Offset in the buffer.
    pub fn offset(&self) -> usize {
        self.off
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of its first byte (to register it; a number here).
    pub fn addr(&self) -> u64 {
        self.buf.addr().wrapping_add(self.off as u64)
    }

    /// The address modulo the page size: the offset an MR cookie carries.
    pub fn in_page_offset(&self) -> u64 {
        self.addr() % RDMA_BUF_ALIGN as u64
    }
}

impl fmt::Debug for RdmaSeg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RdmaSeg({:#x}, {})", self.addr(), self.len)
    }
}

/// Segments are equal when they cover the same bytes.
impl PartialEq for RdmaSeg {
    fn eq(&self, o: &RdmaSeg) -> bool {
        (self.addr(), self.len) == (o.addr(), o.len)
    }
}

impl Eq for RdmaSeg {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        let b = RdmaBuf::new(100);
        assert_eq!(b.seg(0, 100).unwrap().len(), 100);
        assert_eq!(b.seg(100, 0).unwrap().len(), 0);
        assert_eq!(b.seg(1, 100).unwrap_err(), OutOfRange);
        assert_eq!(b.seg(usize::MAX, 2).unwrap_err(), OutOfRange);
        assert_eq!(b.write_at(99, b"ab"), Err(OutOfRange));
        let mut out = [0u8; 2];
        assert_eq!(b.read_at(usize::MAX, &mut out), Err(OutOfRange));
        assert_eq!(b.addr() % RDMA_BUF_ALIGN as u64, 0);
        assert_eq!(b.seg(37, 1).unwrap().in_page_offset(), 37);
    }

    #[test]
    fn contents_and_exclusive_access() {
        let mut b = RdmaBuf::from_slice(b"abcdef");
        assert_eq!(b.to_vec(), b"abcdef");
        b.exclusive().unwrap()[0] = b'X';
        let seg = b.seg(1, 2).unwrap();
        assert_eq!(b.handles(), 2);
        // A segment (a registration, an op) exists: no plain borrow.
        assert!(b.exclusive().is_none());
        drop(seg);
        assert_eq!(b.exclusive().unwrap(), b"Xbcdef");
        let mut z = RdmaBuf::new(0);
        assert!(z.is_empty());
        assert_eq!(z.exclusive().unwrap(), b"");
    }

    #[test]
    fn out_of_range_is_einval() {
        assert_eq!(OutOfRange.errno(), 22);
        assert_eq!(OutOfRange.to_string(), "EINVAL(22)");
        assert_eq!(format!("{OutOfRange:?}"), "EINVAL(22)");
        assert_eq!(std::io::Error::from(OutOfRange).raw_os_error(), Some(22));
    }

    #[test]
    fn a_segment_keeps_the_memory_alive() {
        let b = RdmaBuf::from_slice(&[7u8; 4096]);
        let seg = b.seg(4000, 96).unwrap();
        drop(b);
        assert_eq!(seg.buf().handles(), 1);
        let mut out = [0u8; 96];
        seg.buf().read_at(4000, &mut out).unwrap();
        assert_eq!(out, [7u8; 96]);
    }
}
