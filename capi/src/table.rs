//! The descriptor table: which descriptor numbers are RDS sockets, the
//! socket behind each, the process's engine, and what a fork does to them.
//!
//! A descriptor we hand out is a real kernel descriptor: a `dup` of the
//! socket's readiness descriptor (rds-sock's `readiness` module), so poll,
//! select and epoll on it need no emulation. The table owns each number
//! (closes it in `rds_close`); the [`RdsSocket`] owns its own readiness
//! descriptor, which no number aliases, so nothing is closed twice and a
//! number is never reused while it is mapped. Several numbers (dups) map to
//! one [`Entry`]; the socket closes when the last is gone (the last `Arc`).
//!
//! `rds_is_rds_fd` must be cheap on the common "not ours" path: a bitmap of
//! atomics answers for descriptors below [`BITMAP_FDS`] without a lock.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use rds_sock::{Engine, EngineConfig, RdsSocket};

use crate::{Errno, cvt};

/// Descriptors the bitmap covers (1 Mi: 128 KiB of zeroed statics);
/// numbers above are looked up in the table under its lock.
pub const BITMAP_FDS: usize = 1 << 20;

static BITS: [AtomicU64; BITMAP_FDS / 64] = [const { AtomicU64::new(0) }; BITMAP_FDS / 64];

/// One RDS socket as the C ABI sees it: what the kernel keeps per open file
/// (O_NONBLOCK, shared by dups) and per socket beside the [`RdsSocket`].
pub struct Entry {
    pub sock: RdsSocket,
    /// The socket's own readiness descriptor (owned by `sock`): blocking
    /// calls wait on it, so closing a number does not disturb them.
    pub base: RawFd,
    pub nonblock: AtomicBool,
    pub reuseaddr: AtomicBool,
    /// SO_TIMESTAMP: 0 off, 1 SO_TIMESTAMP_OLD (struct timeval), 2
    /// SO_TIMESTAMP_NEW (struct __kernel_sock_timeval).
    pub timestamp: AtomicU8,
    /// SO_RDS_TRANSPORT was set (so RDS_TRANSPORT from the environment is
    /// not applied at bind).
    pub transport_set: AtomicBool,
    pub rcvtimeo: Mutex<Option<Duration>>,
    pub sndtimeo: Mutex<Option<Duration>>,
}

enum Slot {
    Live(Arc<Entry>),
    /// Inherited across fork: every call but close fails with EBADF.
    Dead,
}

struct Table {
    slots: Vec<Option<Slot>>,
    engine: Option<Engine>,
    /// The process the table belongs to (0 before the first socket).
    pid: i32,
}

static TABLE: RwLock<Table> = RwLock::new(Table { slots: Vec::new(), engine: None, pid: 0 });
/// Serializes engine creation (not under the table lock: it starts threads).
static ENGINE_INIT: Mutex<()> = Mutex::new(());
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

fn bit(fd: RawFd) -> Option<(usize, u64)> {
    let i = usize::try_from(fd).ok()?;
    (i < BITMAP_FDS).then(|| (i / 64, 1u64 << (i % 64)))
}

fn set_bit(fd: RawFd, on: bool) {
    if let Some((w, m)) = bit(fd) {
        if on {
            BITS[w].fetch_or(m, Ordering::Release);
        } else {
            BITS[w].fetch_and(!m, Ordering::Release);
        }
    }
}

/// Whether `fd` is one of ours (also a socket inherited across fork).
pub fn is_ours(fd: RawFd) -> bool {
    if fd < 0 {
        return false;
    }
    match bit(fd) {
        Some((w, m)) => BITS[w].load(Ordering::Acquire) & m != 0,
        None => TABLE.read().slots.get(fd as usize).is_some_and(|s| s.is_some()),
    }
}

/// The socket behind `fd`: EBADF for a number that is not an open
/// descriptor or is a socket inherited across fork, ENOTSOCK for another
/// open descriptor (what the kernel says for a file).
pub fn get(fd: RawFd) -> Result<Arc<Entry>, Errno> {
    if fd >= 0 {
        match TABLE.read().slots.get(fd as usize) {
            Some(Some(Slot::Live(e))) => return Ok(e.clone()),
            Some(Some(Slot::Dead)) => return Err(libc::EBADF),
            _ => {}
        }
    }
    // SAFETY: F_GETFD only reads the descriptor's flags.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 { Err(libc::EBADF) } else { Err(libc::ENOTSOCK) }
}

/// Maps `fd` (a descriptor the caller owns, now owned by the table) to `e`.
/// A number already mapped (the target of dup2) loses its old mapping.
fn insert(fd: RawFd, slot: Slot) -> Option<Slot> {
    let i = fd as usize;
    let mut t = TABLE.write();
    if t.slots.len() <= i {
        t.slots.resize_with(i + 1, || None);
    }
    let old = t.slots[i].replace(slot);
    set_bit(fd, true);
    old
}

/// Unmaps `fd`; the caller closes the number afterwards.
fn remove(fd: RawFd) -> Option<Slot> {
    let mut t = TABLE.write();
    let old = t.slots.get_mut(usize::try_from(fd).ok()?)?.take();
    set_bit(fd, false);
    old
}

/// The engine of this process, started on first use with the settings of
/// the environment (see the crate docs).
pub fn engine() -> Result<Engine, Errno> {
    if let Some(e) = &TABLE.read().engine {
        return Ok(e.clone());
    }
    let _g = ENGINE_INIT.lock();
    if let Some(e) = &TABLE.read().engine {
        return Ok(e.clone());
    }
    let e = Engine::new(config()).map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
    let mut t = TABLE.write();
    t.engine = Some(e.clone());
    // SAFETY: getpid has no preconditions.
    t.pid = unsafe { libc::getpid() };
    OWNER_PID.store(t.pid, Ordering::Release);
    Ok(e)
}

/// [`EngineConfig::default`] (RDS_TCP_PORT, RDS_IB_PSK_TCP, RDS_INFO_DIR,
/// and with the `ib` feature RDS_IB_PSK_FILE) plus RDS_NPATHS.
pub fn config() -> EngineConfig {
    let mut cfg = EngineConfig::default();
    if let Some(n) = std::env::var("RDS_NPATHS").ok().and_then(|v| v.trim().parse::<u8>().ok()) {
        cfg.node.npaths = n.clamp(1, 8);
        cfg.tcp.defer_per_peer = usize::from(cfg.node.npaths);
    }
    cfg
}

/// RDS_TRANSPORT: the transport (uapi number) a socket binds with when the
/// program did not choose one with SO_RDS_TRANSPORT (`tcp` 2, `ib` 0).
pub fn env_transport() -> Option<i32> {
    match std::env::var("RDS_TRANSPORT").ok()?.trim().to_ascii_lowercase().as_str() {
        "tcp" => Some(2),
        "ib" | "rdma" => Some(0),
        _ => None,
    }
}

/// A new socket: its number is a dup of its readiness descriptor
/// (`cloexec`: FD_CLOEXEC on the number).
pub fn open(nonblock: bool, cloexec: bool) -> Result<RawFd, Errno> {
    let sock = engine()?.socket().map_err(|e| e.raw_os_error().unwrap_or(libc::ENOMEM))?;
    let base = sock.as_raw_fd();
    // The file is left blocking (O_NONBLOCK cleared), as a new socket's
    // is: rds-sock reads and writes it with MSG_DONTWAIT only, a blocking
    // receive waits in poll on it (msg.rs), and F_GETFL answers from
    // `Entry::nonblock`, so the flag only shows to calls that reach the
    // kernel descriptor without the C ABI.
    // SAFETY: F_SETFL on a descriptor the socket owns.
    cvt(unsafe { libc::fcntl(base, libc::F_SETFL, libc::O_RDWR) })?;
    let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    // SAFETY: dups a descriptor the socket owns; the new number is ours.
    let fd = cvt(unsafe { libc::fcntl(base, cmd, 0) })?;
    let e = Entry {
        sock,
        base,
        nonblock: AtomicBool::new(nonblock),
        reuseaddr: AtomicBool::new(false),
        timestamp: AtomicU8::new(0),
        transport_set: AtomicBool::new(false),
        rcvtimeo: Mutex::new(None),
        sndtimeo: Mutex::new(None),
    };
    insert(fd, Slot::Live(Arc::new(e)));
    Ok(fd)
}

fn close_raw(fd: RawFd) {
    // SAFETY: closes a number the table owned and just unmapped.
    unsafe { libc::close(fd) };
}

/// `close`: unmaps and closes the number; the socket goes with its last.
pub fn close(fd: RawFd) -> Result<(), Errno> {
    match remove(fd) {
        Some(slot) => {
            close_raw(fd);
            drop(slot);
            Ok(())
        }
        None => get(fd).map(|_| ()),
    }
}

/// `dup` / `fcntl(F_DUPFD[_CLOEXEC], min)`: a real dup of the number,
/// mapped to the same socket.
pub fn dup_min(fd: RawFd, min: libc::c_long, cloexec: bool) -> Result<RawFd, Errno> {
    let e = get(fd)?;
    let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    // SAFETY: dups a number the table owns; the new number is ours.
    let new = cvt(unsafe { libc::fcntl(fd, cmd, min) })?;
    insert(new, Slot::Live(e));
    Ok(new)
}

/// `dup3` (`dup2` with `flags` 0 and `old == new` allowed): `old` need not
/// be ours; a mapped `new` loses its old socket, as a kernel dup2 closes it.
pub fn dup3(old: RawFd, new: RawFd, flags: libc::c_int, is_dup2: bool) -> Result<RawFd, Errno> {
    if old == new {
        if !is_dup2 {
            return Err(libc::EINVAL);
        }
        // dup2(fd, fd): fd if it is open.
        return match get(old) {
            Ok(_) | Err(libc::ENOTSOCK) => Ok(new),
            Err(e) => Err(e),
        };
    }
    let src = match get(old) {
        Ok(e) => Some(Slot::Live(e)),
        Err(libc::EBADF) if is_ours(old) => Some(Slot::Dead),
        Err(libc::ENOTSOCK) => None,
        Err(e) => return Err(e),
    };
    // Hold the table while the number changes hands so nobody maps `new`
    // in between (a racing open could not get `new` anyway: it is open).
    // SAFETY: dup3 on numbers the caller names; `new` is replaced atomically.
    cvt(unsafe { libc::dup3(old, new, flags) })?;
    let replaced = match src {
        Some(s) => insert(new, s),
        None => remove(new),
    };
    drop(replaced);
    Ok(new)
}

/// After fork, in the child: the engine's threads do not exist here, so
/// forget the parent's engine and sockets without running their drops
/// (they would wait for those threads; `Engine::forget_after_fork` also
/// clears the dead threads out of parking_lot's wait queue). Inherited
/// numbers stay open and mapped as dead: every call on them fails with
/// EBADF but close, which frees the number. New sockets start a new
/// engine. Idempotent, and safe to call before the library's own atfork
/// child handler (the shim's handler may run first): it releases the locks
/// the prepare handler took.
pub fn fork_child() {
    release_fork_locks(true);
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let owner = OWNER_PID.load(Ordering::Acquire);
    if owner == 0 || owner == me {
        return;
    }
    let mut t = TABLE.write();
    if let Some(e) = t.engine.take() {
        e.forget_after_fork();
    }
    for s in t.slots.iter_mut() {
        if let Some(Slot::Live(e)) = s.take() {
            std::mem::forget(e);
            *s = Some(Slot::Dead);
        }
    }
    t.pid = me;
    OWNER_PID.store(me, Ordering::Release);
}

/// Set while `atfork_prepare` holds the table and the engine lock across a
/// fork; whoever runs first in the child (the atfork child handler, or the
/// shim's own handler calling `rds_fork_child` before it) releases them.
static FORK_LOCKED: AtomicBool = AtomicBool::new(false);
/// The process that forks while FORK_LOCKED is set.
static FORK_PARENT: AtomicI32 = AtomicI32::new(0);

/// pthread_atfork handlers: no fork happens while a thread holds the table
/// (the child would inherit it locked).
pub extern "C" fn atfork_prepare() {
    std::mem::forget(ENGINE_INIT.lock());
    std::mem::forget(TABLE.write());
    // SAFETY: getpid has no preconditions.
    FORK_PARENT.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    FORK_LOCKED.store(true, Ordering::Release);
}

/// Releases what `atfork_prepare` took, once: in the parent, or in the
/// child (`in_child`: not in the forking process itself, where another
/// thread's stray `rds_fork_child` must not release them).
fn release_fork_locks(in_child: bool) {
    // SAFETY: getpid has no preconditions.
    if in_child && unsafe { libc::getpid() } == FORK_PARENT.load(Ordering::Relaxed) {
        return;
    }
    if FORK_LOCKED.swap(false, Ordering::AcqRel) {
        // SAFETY: atfork_prepare locked both in the forking thread and forgot
        // the guards; the flag makes sure they are released once, by that
        // thread (the parent) or by the child's only thread.
        unsafe {
            TABLE.force_unlock_write();
            ENGINE_INIT.force_unlock();
        }
    }
}

pub extern "C" fn atfork_parent() {
    release_fork_locks(false);
}

pub extern "C" fn atfork_child() {
    fork_child();
}

/// Registers the atfork handlers once (from the library's constructor and
/// from the first `rds_socket`).
pub fn register_atfork() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers three functions that live as long as the process.
        unsafe { libc::pthread_atfork(Some(atfork_prepare), Some(atfork_parent), Some(atfork_child)) };
    });
}
