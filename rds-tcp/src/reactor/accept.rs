//! Accepting: every pending connection of a listener taken and offered to
//! the core ([`rds_core::TransportSink::accept`]), a descriptor in reserve
//! to shed the oldest queued connection when the process is out of
//! descriptors, the connections the core deferred (kept unread, offered
//! again, at most `defer_per_peer` per peer, reset after `defer_max`), and
//! the adoption of an accepted connection by its path's reactor.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use mio::Token;
use rds_core::{Accept, DownReason, TransportKind};
use socket2::SockRef;

use super::{Cmd, Reactor};
use crate::path_conn::{CLOSED, CONNECTING, PathConn, UP};
use crate::stats::inc;

/// An accepted connection the core deferred, waiting to be offered again.
pub(super) struct Deferred {
    /// When the core first deferred it.
    since: Instant,
    /// When it is offered again, and the pause before that.
    next: Instant,
    pause: Duration,
    stream: TcpStream,
    peer: SocketAddr,
}

/// How soon a deferred connection is offered to the core again at first;
/// the pause doubles up to `DEFER_RETRY_MAX` (each offer takes the node's
/// lock).
const DEFER_RETRY: Duration = Duration::from_millis(5);
const DEFER_RETRY_MAX: Duration = Duration::from_millis(100);
/// Pauses of the listener after `accept` found no resources.
pub(super) const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

pub(super) fn reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

impl Reactor {
    /// Accepts every pending connection of a listener.
    pub(super) fn accept_all(&mut self, tok: Token) {
        loop {
            let res = match self.listeners.get(&tok) {
                Some((_, l)) => l.accept(),
                None => return,
            };
            match res {
                Ok((stream, peer)) => {
                    self.accept_backoff = ACCEPT_BACKOFF_MIN;
                    if self.reserve_fd.is_none() {
                        self.reserve_fd = reserve();
                    }
                    self.accepted(stream, peer);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // ECONNABORTED and the like concern one connection.
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
                Err(e) => {
                    inc(&self.inner.stats.accept_no_resources);
                    let fds = matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
                    if fds && self.shed(tok) {
                        continue;
                    }
                    // The edge is consumed: come back for the queued ones,
                    // after a pause that grows while the shortage lasts.
                    self.accept_retry = Some(Instant::now() + self.accept_backoff);
                    self.accept_backoff = self.accept_backoff.saturating_mul(2).min(ACCEPT_BACKOFF_MAX);
                    return;
                }
            }
        }
    }

    /// Out of descriptors: gives up the reserve descriptor to accept the
    /// oldest queued connection and close it at once (reset, counted), then
    /// takes the reserve again. Returns whether one was shed (the caller
    /// goes on: the backlog drains instead of filling for ever).
    fn shed(&mut self, tok: Token) -> bool {
        if self.reserve_fd.take().is_none() {
            return false;
        }
        let res = match self.listeners.get(&tok) {
            Some((_, l)) => l.accept(),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        };
        let shed = match res {
            Ok((stream, _)) => {
                let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                drop(stream);
                inc(&self.inner.stats.accept_shed);
                true
            }
            Err(_) => false,
        };
        self.reserve_fd = reserve();
        shed && self.reserve_fd.is_some()
    }

    fn accepted(&mut self, stream: TcpStream, peer: SocketAddr) {
        let Ok(local) = stream.local_addr() else { return };
        let clamp = match stream.set_nonblocking(true).and_then(|()| self.inner.tune(&SockRef::from(&stream))) {
            Ok(clamp) => clamp,
            Err(_) => return,
        };
        let reset = |s: &TcpStream| {
            let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
        };
        let Some(sink) = self.inner.sink() else {
            reset(&stream);
            return;
        };
        match sink.accept(TransportKind::Tcp, local.ip(), peer.ip(), peer.port()) {
            Accept::Path(info) => {
                let r = self.inner.reactor_of(info.laddr, info.faddr, info.id.index);
                let conn = Arc::new(PathConn::new(self.inner.token(), r, info, stream, peer, UP));
                conn.rx.lock().clamp = clamp;
                if r == self.idx {
                    self.adopt(conn);
                } else {
                    self.inner.reactors[r].send(Cmd::Adopt(conn));
                }
            }
            Accept::Reject | Accept::RejectPeerLarger => {
                inc(&self.inner.stats.listen_closed_stale);
                reset(&stream);
            }
            Accept::Defer => {
                inc(&self.inner.stats.accept_deferred);
                let now = Instant::now();
                self.defer(Deferred { since: now, next: now + DEFER_RETRY, pause: DEFER_RETRY, stream, peer });
            }
        }
    }

    /// Keeps a deferred connection, at most `defer_per_peer` per peer
    /// address: beyond, the peer's oldest is reset (a peer only connects
    /// again when its earlier connection is dead to it).
    fn defer(&mut self, d: Deferred) {
        let ip = d.peer.ip();
        let max = self.inner.cfg.defer_per_peer.max(1);
        while self.deferred.iter().filter(|o| o.peer.ip() == ip).count() >= max {
            let oldest = self
                .deferred
                .iter()
                .enumerate()
                .filter(|(_, o)| o.peer.ip() == ip)
                .min_by_key(|(_, o)| o.since)
                .map(|(i, _)| i)
                .unwrap();
            let old = self.deferred.swap_remove(oldest);
            inc(&self.inner.stats.deferred_replaced);
            inc(&self.inner.stats.listen_closed_stale);
            let _ = SockRef::from(&old.stream).set_linger(Some(Duration::ZERO));
        }
        if self.defer_at.is_none_or(|t| t > d.next) {
            self.defer_at = Some(d.next);
        }
        self.deferred.push(d);
    }

    /// How long a deferred connection may wait: past the old connection's
    /// drain with a margin.
    fn defer_max(&self) -> Duration {
        self.inner.cfg.defer_max.max(self.inner.cfg.shutdown_drain.saturating_add(Duration::from_secs(1)))
    }

    /// Offers the due deferred connections to the core again; resets those
    /// that waited longer than `defer_max`.
    pub(super) fn offer_deferred(&mut self, now: Instant) {
        let max = self.defer_max();
        let (due, later): (Vec<Deferred>, Vec<Deferred>) =
            std::mem::take(&mut self.deferred).into_iter().partition(|d| d.next <= now);
        self.deferred = later;
        for d in due {
            if now.duration_since(d.since) > max {
                inc(&self.inner.stats.deferred_expired);
                inc(&self.inner.stats.listen_closed_stale);
                let _ = SockRef::from(&d.stream).set_linger(Some(Duration::ZERO));
                continue;
            }
            let n = self.deferred.len();
            self.accepted(d.stream, d.peer);
            if self.deferred.len() > n {
                // Deferred again: keep its age, back off.
                let e = self.deferred.last_mut().unwrap();
                e.since = d.since;
                e.pause = (d.pause * 2).min(DEFER_RETRY_MAX);
                e.next = now + e.pause;
            }
        }
        self.defer_at = self.deferred.iter().map(|d| d.next).min();
    }

    /// A path of `faddr` went down: its deferred connections are offered
    /// at once (the slot they wait for may be free now).
    pub(super) fn deferred_due(&mut self, faddr: IpAddr) {
        let now = Instant::now();
        let mut any = false;
        for d in self.deferred.iter_mut().filter(|d| d.peer.ip() == faddr) {
            d.next = now;
            d.pause = DEFER_RETRY;
            any = true;
        }
        if any {
            self.defer_at = Some(now);
        }
    }

    /// Starts serving an accepted connection on this reactor.
    pub(super) fn adopt(&mut self, conn: Arc<PathConn>) {
        let id = conn.info.id;
        let old = self.inner.paths.lock().get(&id).cloned();
        if let Some(old) = old {
            if old.info.inst > conn.info.inst {
                // A newer instance already serves the path.
                let _ = SockRef::from(&conn.stream).set_linger(Some(Duration::ZERO));
                return;
            }
            if old.state() == CONNECTING {
                inc(&self.inner.stats.connect_raced);
            }
            self.close_conn(&old, DownReason::Closed, old.state() == CONNECTING);
        }
        if self.register(&conn).is_err() {
            conn.state.store(CLOSED, SeqCst);
            if let Some(sink) = self.inner.sink() {
                sink.path_down(id, conn.info.inst, DownReason::Closed);
            }
            return;
        }
        self.inner.paths.lock().insert(id, conn.clone());
        // Kicks that came while the core was assigning the path found no
        // connection: transmit now.
        self.inner.xmit(&conn);
    }
}
