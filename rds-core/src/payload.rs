//! Message payloads and the pool their buffers come back to.
//!
//! A [`Payload`] is shared without copying between a send queue, the
//! retransmit queue, a transport writing it and (for loopback) the
//! receiver. [`Payload::copy_from`] (what a `sendmsg` does with the
//! caller's bytes) takes its buffer from a [`PayloadPool`]: when the last
//! reference to the payload drops (the message was acked and the transport
//! is done with it), the buffer, with the shared handle around it, goes
//! back to the pool, and the next send reuses it. On the receive side the
//! TCP framing (`wire::FrameDecoder`) reads a payload into a buffer the
//! pool lends ([`PayloadPool::take_vec`]) and [`Payload::new`] wraps it in
//! a handle the lending left behind ([`PayloadPool::adopt`]). In the
//! steady state of a stream a message costs no allocation at all.
//!
//! Each thread keeps a small cache of free buffers in front of the pool's
//! shared lists ([`PayloadPool::with_thread_cache`]; the global pool
//! does), so a thread that sends and drops payloads takes no lock; a
//! thread that only drops them (a reactor, a receiving application) hands
//! them on in batches.
//!
//! Buffers are kept by size class (powers of two from 64 bytes up to
//! [`MAX_MSG_SIZE`]); a pooled payload's buffer is the class size, as the
//! kernel gives a message whole pages. The pool is bounded in buffers and
//! bytes: a buffer that would exceed either goes back to the allocator, so
//! memory held idle stays below [`PayloadPool::max_bytes`]. The pool never
//! decides anything the protocol does: the node stays deterministic.

use std::cell::RefCell;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::wire::MAX_MSG_SIZE;

/// The smallest class: payloads up to 64 bytes share it.
const MIN_CLASS_SHIFT: u32 = 6;
/// The largest class holds the largest message.
const MAX_CLASS_SHIFT: u32 = MAX_MSG_SIZE.trailing_zeros();
const CLASSES: usize = (MAX_CLASS_SHIFT - MIN_CLASS_SHIFT + 1) as usize;

/// The global pool's bounds (see [`PayloadPool::global`]).
pub const GLOBAL_POOL_BYTES: usize = 8 << 20;
pub const GLOBAL_POOL_BUFFERS: usize = 4096;

/// A message payload: immutable bytes behind a shared handle; cloning it
/// copies no byte.
#[derive(Clone, Default)]
pub struct Payload(Option<Arc<Buf>>);

/// A payload's bytes, and the pool they go back to.
struct Buf {
    data: Vec<u8>,
    home: Option<Arc<Shared>>,
}

impl Payload {
    /// Takes ownership of a filled buffer (no copy), as
    /// [`PayloadPool::adopt`] of the global pool: a buffer from
    /// [`PayloadPool::take_vec`] goes back to the pool when the payload's
    /// last reference drops.
    pub fn new(v: Vec<u8>) -> Payload {
        PayloadPool::global().adopt(v)
    }

    /// Copies `s` into a payload whose buffer comes from the global pool
    /// ([`PayloadPool::global`]): no allocation once the pool holds a
    /// buffer of the size class.
    pub fn copy_from(s: &[u8]) -> Payload {
        PayloadPool::global().copy_from(s)
    }

    /// The empty payload (no allocation).
    pub fn empty() -> Payload {
        Payload(None)
    }

    /// Whether two payloads share one buffer (a clone, not a copy).
    pub fn same_buffer(&self, other: &Payload) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        let Some(buf) = self.0.take() else { return };
        // Only the last reference gives the buffer back: no other clone
        // exists (and none can appear, as this is the last handle; no weak
        // handle is ever made). Two clones dropped at once on two threads
        // may both see the other: the buffer is then freed, never shared.
        if buf.home.is_some() && Arc::strong_count(&buf) == 1 {
            give_back(buf);
        }
    }
}

impl Deref for Payload {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Some(b) => &b.data,
            None => &[],
        }
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        **self == **other
    }
}

impl Eq for Payload {}

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for Payload {
    fn from(v: Vec<u8>) -> Payload {
        Payload::new(v)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.len())
    }
}

/// Buffers for [`Payload`]s, reused when the last reference to a payload
/// drops. Cloning the pool shares it.
#[derive(Clone)]
pub struct PayloadPool(Arc<Shared>);

/// Free buffers a thread keeps of one pool in front of its shared lists
/// (a pool made by [`PayloadPool::with_thread_cache`], as the global one), at most
/// this many and this many bytes; they move to and from the shared lists
/// 16 at a time (`BATCH`).
pub const THREAD_CACHE_BUFFERS: usize = 64;
pub const THREAD_CACHE_BYTES: usize = 256 << 10;
const BATCH: usize = 16;

struct Shared {
    max_bytes: usize,
    max_buffers: usize,
    /// Whether threads keep a cache of this pool's buffers.
    thread_cache: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lists: Lists,
    stats: PoolStats,
}

/// Free buffers by class (each with capacity `64 << class`), each the only
/// handle to its `Buf`, with their count and bytes; and shells: `Buf`s
/// whose buffer [`PayloadPool::take_vec`] lent out, each the only handle
/// too, for [`PayloadPool::adopt`] to wrap a buffer in without allocating.
#[derive(Default)]
struct Lists {
    free: [Vec<Arc<Buf>>; CLASSES],
    buffers: usize,
    bytes: usize,
    shells: Vec<Arc<Buf>>,
}

impl Lists {
    /// Keeps an empty shell if fewer than `max` are kept (else drops it).
    fn keep_shell(&mut self, shell: Arc<Buf>, max: usize) {
        if self.shells.len() < max {
            self.shells.push(shell);
        }
    }

    fn pop(&mut self, class: usize) -> Option<Arc<Buf>> {
        let b = self.free[class].pop()?;
        self.buffers -= 1;
        self.bytes -= class_size(class);
        Some(b)
    }

    /// Keeps `buf` (of `class`) if that stays within `max` buffers and
    /// bytes; else hands it back.
    fn push(&mut self, buf: Arc<Buf>, class: usize, max: (usize, usize)) -> Result<(), Arc<Buf>> {
        let size = class_size(class);
        if self.buffers >= max.0 || self.bytes + size > max.1 {
            return Err(buf);
        }
        self.buffers += 1;
        self.bytes += size;
        self.free[class].push(buf);
        Ok(())
    }
}

/// A thread's cache of one pool's buffers (the first pool with a thread
/// cache that the thread used).
#[derive(Default)]
struct ThreadCache {
    pool: Option<Arc<Shared>>,
    lists: Lists,
}

impl ThreadCache {
    fn serves(&self, pool: &Arc<Shared>) -> bool {
        self.pool.as_ref().is_some_and(|p| Arc::ptr_eq(p, pool))
    }
}

impl Drop for ThreadCache {
    /// A thread that ends gives its buffers to the shared lists.
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else { return };
        let mut st = pool.lock();
        for class in 0..CLASSES {
            while let Some(b) = self.lists.pop(class) {
                pool.keep(&mut st, b, class);
            }
        }
    }
}

thread_local! {
    static CACHE: RefCell<ThreadCache> = RefCell::new(ThreadCache::default());
}

/// What a pool's shared lists did (a thread's cache counts nothing), for
/// tests and introspection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Free buffers the shared lists hold now, and their bytes (capacity).
    pub buffers: usize,
    pub bytes: usize,
    /// Payloads made from a free buffer, and from a new allocation.
    pub reused: u64,
    pub allocated: u64,
    /// Buffers that came back and were kept, or freed (the pool was full).
    pub returned: u64,
    pub discarded: u64,
    /// Shells (see [`PayloadPool::adopt`]) the shared lists hold now.
    pub shells: usize,
}

/// The class of a payload of `len` bytes (1..=MAX_MSG_SIZE).
fn class_of(len: usize) -> usize {
    let shift = len.next_power_of_two().trailing_zeros().max(MIN_CLASS_SHIFT);
    (shift - MIN_CLASS_SHIFT) as usize
}

fn class_size(class: usize) -> usize {
    1 << (class as u32 + MIN_CLASS_SHIFT)
}

impl PayloadPool {
    /// A pool keeping at most `max_buffers` free buffers of at most
    /// `max_bytes` in all, without thread caches: every payload made and
    /// every buffer given back takes its lock.
    pub fn new(max_bytes: usize, max_buffers: usize) -> PayloadPool {
        PayloadPool::build(max_bytes, max_buffers, false)
    }

    /// A pool as [`PayloadPool::new`] in front of which each thread keeps
    /// up to [`THREAD_CACHE_BUFFERS`] free buffers ([`THREAD_CACHE_BYTES`]),
    /// taken and given back without a lock, so that a thread that both
    /// sends and drops payloads never takes it. Only the first such pool a
    /// thread uses is cached on that thread. Memory held idle is then at
    /// most the pool's bounds plus a cache per thread.
    pub fn with_thread_cache(max_bytes: usize, max_buffers: usize) -> PayloadPool {
        PayloadPool::build(max_bytes, max_buffers, true)
    }

    fn build(max_bytes: usize, max_buffers: usize, thread_cache: bool) -> PayloadPool {
        let state = Mutex::new(State::default());
        PayloadPool(Arc::new(Shared { max_bytes, max_buffers, thread_cache, state }))
    }

    /// The process's pool, which [`Payload::copy_from`] uses: at most
    /// [`GLOBAL_POOL_BUFFERS`] free buffers, [`GLOBAL_POOL_BYTES`] bytes,
    /// with thread caches.
    pub fn global() -> &'static PayloadPool {
        static GLOBAL: OnceLock<PayloadPool> = OnceLock::new();
        GLOBAL.get_or_init(|| PayloadPool::with_thread_cache(GLOBAL_POOL_BYTES, GLOBAL_POOL_BUFFERS))
    }

    pub fn max_bytes(&self) -> usize {
        self.0.max_bytes
    }

    pub fn max_buffers(&self) -> usize {
        self.0.max_buffers
    }

    /// Copies `s` into a payload with a buffer of this pool (a free one of
    /// its class if there is one). Payloads larger than the largest message
    /// get a buffer of their own that does not come back.
    pub fn copy_from(&self, s: &[u8]) -> Payload {
        if s.is_empty() {
            return Payload(None);
        }
        if s.len() > MAX_MSG_SIZE {
            return Payload::new(s.to_vec());
        }
        let class = class_of(s.len());
        if let Some(mut buf) = self.take(class) {
            // The pool held the only handle: `get_mut` also orders this
            // write after the last reader's drop.
            if let Some(b) = Arc::get_mut(&mut buf) {
                b.data.clear();
                b.data.extend_from_slice(s);
                return Payload(Some(buf));
            }
        }
        let mut data = Vec::with_capacity(class_size(class));
        data.extend_from_slice(s);
        Payload(Some(Arc::new(Buf { data, home: Some(self.0.clone()) })))
    }

    /// An empty buffer with room for `len` bytes, from the pool: for a
    /// transport that fills a message in place (the TCP framing does) and
    /// then hands it to [`PayloadPool::adopt`] (or [`Payload::new`]). Its
    /// capacity is the class size (`len` rounded up to a power of two, at
    /// least 64), so it comes back to the pool with the payload.
    pub fn take_vec(&self, len: usize) -> Vec<u8> {
        let mut v = self.take_buffer(len);
        v.clear();
        v
    }

    /// Like [`PayloadPool::take_vec`], but `len` bytes long: the bytes of
    /// the payload the buffer last held, zeros beyond them (a new buffer
    /// is all zeros). For a read into the buffer in place that then
    /// truncates it to what it read: a buffer that comes round the pool
    /// for messages of one size is never zero-filled again.
    pub fn take_vec_filled(&self, len: usize) -> Vec<u8> {
        let mut v = self.take_buffer(len);
        v.resize(len, 0);
        v
    }

    /// A buffer of `len`'s class with the length it came back with (empty
    /// when new); of capacity `len` when no class holds it.
    fn take_buffer(&self, len: usize) -> Vec<u8> {
        if len == 0 || len > MAX_MSG_SIZE {
            return Vec::with_capacity(len);
        }
        let class = class_of(len);
        if let Some(mut buf) = self.take(class) {
            if let Some(b) = Arc::get_mut(&mut buf) {
                let data = std::mem::take(&mut b.data);
                self.keep_shell(buf);
                return data;
            }
        }
        Vec::with_capacity(class_size(class))
    }

    /// Wraps a filled buffer in a payload (no copy), in a shell that
    /// [`PayloadPool::take_vec`] left if there is one (no allocation). If
    /// the buffer's capacity is a class size it comes back to this pool
    /// when the payload's last reference drops.
    pub fn adopt(&self, v: Vec<u8>) -> Payload {
        if v.is_empty() {
            return Payload(None);
        }
        if let Some(mut shell) = self.take_shell() {
            if let Some(b) = Arc::get_mut(&mut shell) {
                b.data = v;
                return Payload(Some(shell));
            }
        }
        Payload(Some(Arc::new(Buf { data: v, home: Some(self.0.clone()) })))
    }

    /// Keeps a shell: in this thread's cache, else in the shared lists.
    fn keep_shell(&self, shell: Arc<Buf>) {
        let pool = &self.0;
        let shell = if pool.thread_cache {
            let r = CACHE.try_with(|c| {
                let mut c = c.borrow_mut();
                if !c.serves(pool) {
                    return Some(shell);
                }
                c.lists.keep_shell(shell, THREAD_CACHE_BUFFERS);
                None
            });
            match r {
                Ok(Some(shell)) => shell,
                _ => return,
            }
        } else {
            shell
        };
        pool.lock().lists.keep_shell(shell, pool.max_buffers);
    }

    fn take_shell(&self) -> Option<Arc<Buf>> {
        let pool = &self.0;
        if pool.thread_cache {
            let got = CACHE.try_with(|c| {
                let mut c = c.borrow_mut();
                c.serves(pool).then(|| c.lists.shells.pop())
            });
            if let Ok(Some(shell)) = got {
                return shell;
            }
        }
        pool.lock().lists.shells.pop()
    }

    /// A free buffer of `class`: from this thread's cache, else from the
    /// shared lists (which refill the cache with up to a batch).
    fn take(&self, class: usize) -> Option<Arc<Buf>> {
        let pool = &self.0;
        if pool.thread_cache {
            let got = CACHE.try_with(|c| {
                let mut c = c.borrow_mut();
                if c.pool.is_none() {
                    c.pool = Some(pool.clone());
                }
                if !c.serves(pool) {
                    return None;
                }
                if let Some(b) = c.lists.pop(class) {
                    return Some(Some(b));
                }
                let mut st = pool.lock();
                let b = st.lists.pop(class);
                st.count_take(b.is_some());
                for _ in 1..BATCH {
                    let Some(more) = st.lists.pop(class) else { break };
                    if let Err(more) = c.lists.push(more, class, (THREAD_CACHE_BUFFERS, THREAD_CACHE_BYTES)) {
                        pool.keep(&mut st, more, class);
                        break;
                    }
                }
                Some(b)
            });
            if let Ok(Some(b)) = got {
                return b;
            }
        }
        let mut st = pool.lock();
        let b = st.lists.pop(class);
        st.count_take(b.is_some());
        b
    }

    /// What the pool's shared lists did so far, and what they hold.
    pub fn stats(&self) -> PoolStats {
        let st = self.0.lock();
        PoolStats { buffers: st.lists.buffers, bytes: st.lists.bytes, shells: st.lists.shells.len(), ..st.stats }
    }
}

impl fmt::Debug for PayloadPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PayloadPool({:?})", self.stats())
    }
}

impl State {
    fn count_take(&mut self, reused: bool) {
        if reused {
            self.stats.reused += 1;
        } else {
            self.stats.allocated += 1;
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held left the lists consistent (every
        // change under it is a push or a pop with its counts).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `buf` in the shared lists unless they are full (then it is
    /// freed).
    fn keep(&self, st: &mut State, buf: Arc<Buf>, class: usize) {
        match st.lists.push(buf, class, (self.max_buffers, self.max_bytes)) {
            Ok(()) => st.stats.returned += 1,
            Err(_) => st.stats.discarded += 1,
        }
    }
}

/// Takes back the buffer of a payload whose last reference dropped (`buf`
/// is its only handle): to this thread's cache, or when it is full (with a
/// batch of the cache's buffers of that class) to the shared lists, unless
/// they are full too.
fn give_back(buf: Arc<Buf>) {
    let Some(thread_cache) = buf.home.as_ref().map(|h| h.thread_cache) else { return };
    let cap = buf.data.capacity();
    // Only buffers of exactly a class size came from a pool.
    let class = class_of(cap);
    if class_size(class) != cap {
        return;
    }
    let buf = if thread_cache {
        let r = CACHE.try_with(|c| {
            let mut c = c.borrow_mut();
            let home = buf.home.as_ref().expect("checked above");
            if c.pool.is_none() {
                c.pool = Some(home.clone());
            }
            if !c.serves(home) {
                return Some(buf);
            }
            let Err(buf) = c.lists.push(buf, class, (THREAD_CACHE_BUFFERS, THREAD_CACHE_BYTES)) else {
                return None;
            };
            let home = buf.home.clone().expect("checked above");
            let mut st = home.lock();
            home.keep(&mut st, buf, class);
            for _ in 1..BATCH {
                let Some(b) = c.lists.pop(class) else { break };
                home.keep(&mut st, b, class);
            }
            None
        });
        match r {
            Ok(None) => return,
            Ok(Some(buf)) => buf,
            // The thread is ending and its cache is gone.
            Err(_) => return,
        }
    } else {
        buf
    };
    let home = buf.home.clone().expect("checked above");
    let mut st = home.lock();
    home.keep(&mut st, buf, class);
}

#[cfg(test)]
mod tests;
