//! Snapshots across processes: every engine answers on a Unix-domain socket.
//!
//! * The directory ([`runtime_dir`]): `$RDS_INFO_DIR` if set, else
//!   `$XDG_RUNTIME_DIR/rds-rs`, else `/tmp/rds-rs-<uid>`. It is created
//!   with mode 0700 and used only if it is a real directory owned by us
//!   (a group- or world-accessible one is set back to 0700).
//! * One socket per engine, `<pid>.<engine>.sock`, mode 0600: bound under
//!   a temporary name and renamed once listening, so a socket under its
//!   final name that refuses connections is stale. An engine removes its
//!   socket on [`crate::Engine::shutdown`] and at process exit; readers
//!   remove sockets whose process died without doing so.
//! * A server answers only peers whose `SO_PEERCRED` uid is ours or 0
//!   ([`peer_allowed`]); a client likewise trusts only servers running as
//!   us or root, or, for root, as the owner of the directory the socket
//!   is in. The format is [`super::codec`].
//! * Root may ask every user's nodes: [`client_dirs`] adds, for root, the
//!   directories of every user (`/tmp/rds-rs-<uid>`,
//!   `/run/user/<uid>/rds-rs`); [`list`] reads another user's directory
//!   only for root and only if nobody but its owner can write to it, and
//!   removes nothing there.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Snapshot;
use super::codec::{self, DecodeError, Status};

/// How long either side waits for the other.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Our effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether a peer running as `peer_uid` may see the snapshots of a node
/// running as `our_uid`: the same user, or root.
pub fn peer_allowed(peer_uid: u32, our_uid: u32) -> bool {
    peer_uid == our_uid || peer_uid == 0
}

/// The uid of the process at the other end of a Unix-domain socket.
pub fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are live locals of the sizes passed.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// The per-user directory of info sockets (see the module docs).
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RDS_INFO_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if x.is_absolute() && x.is_dir() {
            return x.join("rds-rs");
        }
    }
    PathBuf::from(format!("/tmp/rds-rs-{}", euid()))
}

/// The directories a client looks for nodes in: `$RDS_INFO_DIR` alone if
/// set; else our [`runtime_dir`], and for root also every other user's
/// (`/tmp/rds-rs-<uid>` and `/run/user/<uid>/rds-rs` that exist).
pub fn client_dirs() -> Vec<PathBuf> {
    let mine = runtime_dir();
    let mut out = vec![mine.clone()];
    if euid() != 0 || std::env::var_os("RDS_INFO_DIR").is_some_and(|d| !d.is_empty()) {
        return out;
    }
    let numeric =
        |n: &std::ffi::OsStr| n.to_str().is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    let mut others = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/tmp") {
        for ent in rd.flatten() {
            let name = ent.file_name();
            if name.to_str().and_then(|n| n.strip_prefix("rds-rs-")).is_some_and(|u| numeric(u.as_ref())) {
                others.push(ent.path());
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir("/run/user") {
        for ent in rd.flatten() {
            if numeric(&ent.file_name()) {
                let d = ent.path().join("rds-rs");
                if d.is_dir() {
                    others.push(d);
                }
            }
        }
    }
    others.sort();
    for d in others {
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out
}

/// Creates `dir` (mode 0700) if needed and checks it is ours.
pub fn ensure_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_dir(dir)
}

fn check_dir(dir: &Path) -> io::Result<()> {
    let md = std::fs::symlink_metadata(dir)?;
    if !md.file_type().is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    if md.uid() != euid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} belongs to uid {}, not to us", dir.display(), md.uid()),
        ));
    }
    if md.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// `<pid>.<engine>.sock` -> (pid, engine).
fn parse_name(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_suffix(".sock")?;
    let (pid, engine) = rest.split_once('.')?;
    Some((pid.parse().ok()?, engine.parse().ok()?))
}

/// Whether process `pid` is gone.
fn pid_dead(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks whether the process exists.
    let r = unsafe { libc::kill(p, 0) };
    r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

// ----------------------------------------------------------------------
// Removal at exit
// ----------------------------------------------------------------------

static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static ATEXIT: Once = Once::new();

extern "C" fn unlink_live_sockets() {
    if let Ok(v) = LIVE.try_lock() {
        for p in v.iter() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn remember(path: &Path) {
    ATEXIT.call_once(|| {
        // SAFETY: registers a function that only unlinks paths; it takes
        // the lock with try_lock so it cannot deadlock at exit.
        unsafe {
            libc::atexit(unlink_live_sockets);
        }
    });
    if let Ok(mut v) = LIVE.lock() {
        v.push(path.to_path_buf());
    }
}

fn forget(path: &Path) {
    if let Ok(mut v) = LIVE.lock() {
        v.retain(|p| p != path);
    }
}

// ----------------------------------------------------------------------
// Server
// ----------------------------------------------------------------------

/// Builds the body of a response for the wanted sections; `None` when the
/// engine is gone.
pub(crate) type Answer = Box<dyn Fn(u32) -> Option<Vec<u8>> + Send>;

/// An engine's info socket and the thread answering on it.
pub(crate) struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `dir/<pid>.<engine>.sock` and answers with `answer`.
    pub(crate) fn start(dir: &Path, engine: u32, answer: Answer) -> io::Result<Server> {
        ensure_dir(dir)?;
        let pid = std::process::id();
        let path = dir.join(format!("{pid}.{engine}.sock"));
        let tmp = dir.join(format!(".{pid}.{engine}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        let listener = UnixListener::bind(&tmp)?;
        let ready = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = ready {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        remember(&path);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let spawned = std::thread::Builder::new().name("rds-info".into()).spawn(move || {
            let me = euid();
            for conn in listener.incoming() {
                if stop2.load(Ordering::Acquire) {
                    break;
                }
                match conn {
                    Ok(s) => {
                        let _ = serve_one(s, me, &answer);
                    }
                    // Out of descriptors and the like: do not spin.
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        match spawned {
            Ok(h) => Ok(Server { path, stop, thread: Some(h) }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                forget(&path);
                Err(e)
            }
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Stops answering and removes the socket.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread.take() {
            // Wake the accept; if that fails the thread cannot be woken and
            // is left behind (it exits on the next connection).
            if UnixStream::connect(&self.path).is_ok() {
                let _ = h.join();
            }
        }
        let _ = std::fs::remove_file(&self.path);
        forget(&self.path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve_one(mut s: UnixStream, me: u32, answer: &Answer) -> io::Result<()> {
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    if !peer_allowed(peer_uid(&s)?, me) {
        return s.write_all(&codec::encode_response_header(Status::Denied, 0));
    }
    serve_request(&mut s, &**answer)
}

/// The server's half of one exchange with an allowed client: reads its
/// request and writes the answer `answer` builds for the wanted sections
/// (nothing when it gives `None`). Public for the fuzz targets only.
#[doc(hidden)]
pub fn serve_request<S: Read + Write>(s: &mut S, answer: &dyn Fn(u32) -> Option<Vec<u8>>) -> io::Result<()> {
    let mut req = [0u8; codec::HEADER_LEN];
    s.read_exact(&mut req)?;
    let want = match codec::decode_request(&req) {
        Ok(w) => w,
        Err(st) => return s.write_all(&codec::encode_response_header(st, 0)),
    };
    let Some(body) = answer(want) else { return Ok(()) };
    s.write_all(&codec::encode_response_header(Status::Ok, body.len()))?;
    s.write_all(&body)
}

// ----------------------------------------------------------------------
// Client
// ----------------------------------------------------------------------

/// An info socket found in the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEntry {
    pub pid: u32,
    pub engine: u32,
    pub path: PathBuf,
    /// The uid owning the directory the socket is in: the user the node
    /// must run as (or root) for [`query_entry`] to trust its answer.
    pub owner: u32,
}

/// Why a node could not be asked.
#[derive(Debug)]
pub enum QueryError {
    /// The node went away (socket refused or vanished; stale sockets are
    /// removed).
    Gone,
    /// The node refused us, or it runs as another user.
    Denied,
    /// The node speaks another version of the protocol.
    Version(u16),
    Io(io::Error),
    Decode(DecodeError),
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryError::Gone => write!(f, "the node went away"),
            QueryError::Denied => write!(f, "permission denied"),
            QueryError::Version(v) => {
                write!(f, "the node speaks info protocol version {v}, we speak {}", codec::VERSION)
            }
            QueryError::Io(e) => write!(f, "{e}"),
            QueryError::Decode(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for QueryError {}

/// The info sockets in `dir`, by pid and engine number. Leftovers of
/// processes that died (sockets and temporary names) are removed on the
/// way: no live process can be serving them.
///
/// Another user's directory is read only by root, only if it is a real
/// directory that nobody but its owner can write to (else anyone could
/// plant a socket in it), and nothing is removed from it.
pub fn list(dir: &Path) -> io::Result<Vec<NodeEntry>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let md = std::fs::symlink_metadata(dir)?;
    let owner = md.uid();
    let ours = owner == euid();
    if ours {
        check_dir(dir)?;
    } else if euid() != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} belongs to uid {owner}, not to us", dir.display()),
        ));
    } else if !md.file_type().is_dir() || md.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory only its owner (uid {owner}) can write to", dir.display()),
        ));
    }
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some((pid, engine)) = parse_name(name) {
            if pid_dead(pid) {
                if ours {
                    let _ = std::fs::remove_file(ent.path());
                }
                continue;
            }
            out.push(NodeEntry { pid, engine, path: ent.path(), owner });
        } else if let Some(tmp) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")).filter(|_| ours) {
            if tmp.split_once('.').and_then(|(p, _)| p.parse().ok()).is_some_and(pid_dead) {
                let _ = std::fs::remove_file(ent.path());
            }
        }
    }
    out.sort_by_key(|e| (e.pid, e.engine));
    Ok(out)
}

/// An I/O error of an exchange: the node went away, or something else.
fn io(e: io::Error) -> QueryError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => QueryError::Gone,
        _ => QueryError::Io(e),
    }
}

/// Asks one node for the `sections` of its snapshot; trusts only a node
/// running as us or root.
pub fn query(path: &Path, sections: u32) -> Result<Snapshot, QueryError> {
    query_as(path, sections, euid())
}

/// Asks a node [`list`] found; for root, a node running as the owner of
/// its directory is trusted too.
pub fn query_entry(entry: &NodeEntry, sections: u32) -> Result<Snapshot, QueryError> {
    query_as(&entry.path, sections, if euid() == 0 { entry.owner } else { euid() })
}

fn query_as(path: &Path, sections: u32, owner: u32) -> Result<Snapshot, QueryError> {
    let ino = std::fs::symlink_metadata(path).map(|m| m.ino()).ok();
    let mut s = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            // Nobody listens on it: stale. Remove it unless a new node
            // took the name meanwhile (a different file).
            let now = std::fs::symlink_metadata(path).map(|m| m.ino()).ok();
            if ino.is_some() && ino == now {
                let _ = std::fs::remove_file(path);
            }
            return Err(QueryError::Gone);
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(QueryError::Gone),
        Err(e) => return Err(QueryError::Io(e)),
    };
    let server = peer_uid(&s).map_err(io)?;
    if !peer_allowed(server, euid()) && server != owner {
        return Err(QueryError::Denied);
    }
    s.set_read_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(IO_TIMEOUT)).map_err(io)?;
    exchange(&mut s, sections)
}

/// The client's half of one exchange with a node it trusts: sends the
/// request for `sections` and reads the answer. Public for the fuzz
/// targets only.
#[doc(hidden)]
pub fn exchange<S: Read + Write>(s: &mut S, sections: u32) -> Result<Snapshot, QueryError> {
    s.write_all(&codec::encode_request(sections)).map_err(io)?;
    let mut hdr = [0u8; codec::HEADER_LEN];
    s.read_exact(&mut hdr).map_err(io)?;
    let (version, status, len) = codec::decode_response_header(&hdr).map_err(QueryError::Decode)?;
    match status {
        Status::Ok => {}
        Status::Denied => return Err(QueryError::Denied),
        Status::Version => return Err(QueryError::Version(version)),
        Status::BadRequest => return Err(QueryError::Decode(DecodeError("the node did not understand us".into()))),
    }
    // The buffer grows with the bytes that arrive: the header's length is
    // the node's word, not a reason to allocate up to MAX_BODY at once.
    let mut body = Vec::new();
    s.take(len as u64).read_to_end(&mut body).map_err(io)?;
    if body.len() < len {
        return Err(QueryError::Gone);
    }
    codec::decode_snapshot(&body).map_err(QueryError::Decode)
}

/// Asks every node in `dir`; nodes that went away meanwhile are left out.
pub fn query_all(dir: &Path, sections: u32) -> io::Result<Vec<(NodeEntry, Result<Snapshot, QueryError>)>> {
    Ok(list(dir)?
        .into_iter()
        .map(|e| {
            let r = query_entry(&e, sections);
            (e, r)
        })
        .filter(|(_, r)| !matches!(r, Err(QueryError::Gone)))
        .collect())
}

#[cfg(test)]
mod tests;
