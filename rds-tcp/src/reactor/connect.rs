//! Connecting: the outgoing connection of a path (non-blocking, bound to
//! the path's local address) and what happens when it completes: up when
//! our address is the smaller one, else the kernel's "poke" (reset, and
//! reported down with the direction rule so that the peer connects).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use rds_core::{DownReason, PathInfo, addr_cmp};
use socket2::{SockAddr, SockRef, Socket, Type};

use super::Reactor;
use crate::path_conn::{CONNECTING, PathConn, UP};
use crate::sock_domain;

impl Reactor {
    /// Opens the connection of a path.
    pub(super) fn connect(&mut self, info: PathInfo) {
        let old = self.inner.paths.lock().get(&info.id).cloned();
        if let Some(old) = old {
            if old.info.inst >= info.inst {
                return;
            }
            self.close_conn(&old, DownReason::Closed, old.state() == CONNECTING);
        }
        let Some(sink) = self.inner.sink() else { return };
        let peer = SocketAddr::new(info.faddr, self.inner.cfg.port);
        let (stream, clamp) = match self.open(info, peer) {
            Ok(s) => s,
            Err(_) => {
                sink.path_down(info.id, info.inst, DownReason::ConnectFailed);
                return;
            }
        };
        let conn = Arc::new(PathConn::new(self.inner.token(), self.idx, info, stream, peer, CONNECTING));
        conn.rx.lock().clamp = clamp;
        if self.register(&conn).is_err() {
            sink.path_down(info.id, info.inst, DownReason::ConnectFailed);
            return;
        }
        self.inner.paths.lock().insert(info.id, conn);
    }

    /// A non-blocking connection to `peer` under way, and the window
    /// clamp `Inner::tune` set.
    fn open(&self, info: PathInfo, peer: SocketAddr) -> io::Result<(TcpStream, Option<u32>)> {
        let s = Socket::new(sock_domain(&info.faddr), Type::STREAM, None)?;
        s.set_nonblocking(true)?;
        let clamp = self.inner.tune(&SockRef::from(&s))?;
        s.bind(&SockAddr::from(SocketAddr::new(info.laddr, 0)))?;
        match s.connect(&SockAddr::from(peer)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        Ok((s.into(), clamp))
    }

    /// An outgoing connection became writable (or failed).
    pub(super) fn check_connect(&mut self, conn: &Arc<PathConn>, hup: bool) {
        let failed = match conn.stream.take_error() {
            Ok(Some(_)) | Err(_) => true,
            Ok(None) => match conn.stream.peer_addr() {
                Ok(_) => false,
                Err(e) if e.kind() == io::ErrorKind::NotConnected && !hup => return,
                Err(_) => true,
            },
        };
        if failed {
            self.close_conn(conn, DownReason::ConnectFailed, false);
            return;
        }
        let current = self.inner.paths.lock().get(&conn.info.id).is_some_and(|c| Arc::ptr_eq(c, conn));
        if !current {
            self.close_conn(conn, DownReason::Closed, true);
            return;
        }
        if addr_cmp(&conn.info.laddr, &conn.info.faddr) != std::cmp::Ordering::Less {
            // The poke: the peer has the smaller address and connects to us.
            self.close_conn(conn, DownReason::DirectionRule, true);
            return;
        }
        conn.state.store(UP, SeqCst);
        if let Some(sink) = self.inner.sink() {
            sink.path_up(conn.info.id, conn.info.inst);
        }
        self.inner.xmit(conn);
    }
}
