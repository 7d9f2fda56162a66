//! The transport's current connections ([`PathTable`], under
//! `Inner::paths`): one per path, and an index of them by address pair.
//!
//! A thread about to block in a receive looks up the paths of one address
//! pair per wait (`crate::assist`). Found by a scan of every path, that
//! cost grew with the number of peers, and the assist was switched off
//! above 64 paths in the transport: a node with more than eight peers of
//! 8 paths each lost it. The index makes the look-up the pair's own paths,
//! whatever the number of peers. Each pair's list is kept sorted, path 0
//! first, and shared (`Arc`): a wait takes it with one reference count,
//! not a vector built and sorted per wait (connections come and go far
//! less often than messages).

use std::net::IpAddr;
use std::sync::Arc;

use rds_core::PathId;
use rds_core::types::FastMap;

use crate::path_conn::PathConn;

/// The current connection of every path that has one, and the same
/// connections by (local, foreign) address pair.
#[derive(Default)]
pub(crate) struct PathTable {
    /// By the core's path id (keys this node chose: [`FastMap`]).
    by_id: FastMap<PathId, Arc<PathConn>>,
    /// Exactly the connections of `by_id`, by `(laddr, faddr)`, in path
    /// order ([`PathTable::pair`]); no empty list. A peer picks its
    /// address, but the core bounds the peers it keeps connections with
    /// (`NodeConfig::max_peers`), which bounds these entries: [`FastMap`],
    /// as the core's congestion maps by peer address.
    by_pair: FastMap<(IpAddr, IpAddr), Arc<[Arc<PathConn>]>>,
}

fn pair_of(c: &PathConn) -> (IpAddr, IpAddr) {
    (c.info.laddr, c.info.faddr)
}

impl PathTable {
    pub fn get(&self, id: &PathId) -> Option<&Arc<PathConn>> {
        self.by_id.get(id)
    }

    /// Makes `conn` the connection of path `id`; returns the one it
    /// replaces.
    pub fn insert(&mut self, id: PathId, conn: Arc<PathConn>) -> Option<Arc<PathConn>> {
        let old = self.by_id.insert(id, conn.clone());
        if let Some(o) = &old {
            self.unindex(o);
        }
        let key = pair_of(&conn);
        let mut list: Vec<Arc<PathConn>> = self.by_pair.get(&key).map_or_else(Vec::new, |l| l.to_vec());
        list.push(conn);
        list.sort_by_key(|c| (c.info.id.index, c.info.id.conn.0, c.token.0));
        self.by_pair.insert(key, list.into());
        old
    }

    /// Removes the connection of path `id`.
    pub fn remove(&mut self, id: &PathId) -> Option<Arc<PathConn>> {
        let old = self.by_id.remove(id)?;
        self.unindex(&old);
        Some(old)
    }

    fn unindex(&mut self, old: &Arc<PathConn>) {
        let key = pair_of(old);
        if let Some(list) = self.by_pair.get(&key) {
            let rest: Vec<Arc<PathConn>> = list.iter().filter(|c| !Arc::ptr_eq(c, old)).cloned().collect();
            if rest.is_empty() {
                self.by_pair.remove(&key);
            } else {
                self.by_pair.insert(key, rest.into());
            }
        }
    }

    pub fn clear(&mut self) {
        self.by_id.clear();
        self.by_pair.clear();
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<PathConn>> {
        self.by_id.values()
    }

    /// The connections from `laddr` to `faddr` (`None`: none), sorted by
    /// path index (path 0 first; among equal indexes, one RDS connection
    /// per TOS value, by connection).
    pub fn pair(&self, laddr: IpAddr, faddr: IpAddr) -> Option<Arc<[Arc<PathConn>]>> {
        self.by_pair.get(&(laddr, faddr)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path_conn::UP;
    use rds_core::PathInfo;
    use std::net::{SocketAddr, TcpListener, TcpStream};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A connection of path `index` of RDS connection `conn` between two
    /// addresses (the socket under it is a loopback TCP connection; only
    /// the path's identity matters here).
    fn conn(l: &TcpListener, laddr: &str, faddr: &str, conn: u32, index: u8) -> Arc<PathConn> {
        let stream = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let info = PathInfo {
            id: PathId { conn: rds_core::ConnId(conn), index },
            inst: 1,
            laddr: ip(laddr),
            faddr: ip(faddr),
            kind: rds_core::TransportKind::Tcp,
            tos: 0,
            npaths: 8,
            taken: true,
        };
        let peer: SocketAddr = l.local_addr().unwrap();
        Arc::new(PathConn::new(mio::Token(conn as usize * 16 + index as usize), 0, info, stream, peer, UP))
    }

    fn ids(t: &PathTable, l: &str, f: &str) -> Vec<(u32, u8)> {
        let list = t.pair(ip(l), ip(f)).unwrap_or_else(|| Arc::new([]));
        list.iter().map(|c| (c.info.id.conn.0, c.info.id.index)).collect()
    }

    /// Inserting, replacing, removing and clearing keep the pair index
    /// exactly the table's connections, pair by pair, in path order (a
    /// replacement, added last, is sorted into its place).
    #[test]
    fn the_pair_index_follows_the_table() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut t = PathTable::default();
        let (a, b, c) = ("127.0.0.1", "127.0.0.2", "127.0.0.3");
        for i in 0..3 {
            assert!(t.insert(PathId { conn: rds_core::ConnId(1), index: i }, conn(&l, a, b, 1, i)).is_none());
        }
        t.insert(PathId { conn: rds_core::ConnId(2), index: 0 }, conn(&l, a, c, 2, 0));
        assert_eq!(ids(&t, a, b), [(1, 0), (1, 1), (1, 2)]);
        assert_eq!(ids(&t, a, c), [(2, 0)]);
        assert!(t.pair(ip(b), ip(a)).is_none(), "a pair is directed");
        // A new connection of path 1 replaces the old one in both.
        let new = conn(&l, a, b, 1, 1);
        let old = t.insert(PathId { conn: rds_core::ConnId(1), index: 1 }, new.clone()).unwrap();
        assert!(!t.pair(ip(a), ip(b)).unwrap().iter().any(|x| Arc::ptr_eq(x, &old)), "the old one is gone");
        assert!(t.pair(ip(a), ip(b)).unwrap().iter().any(|x| Arc::ptr_eq(x, &new)));
        assert_eq!(ids(&t, a, b), [(1, 0), (1, 1), (1, 2)]);
        // Removing.
        t.remove(&PathId { conn: rds_core::ConnId(1), index: 0 }).unwrap();
        assert_eq!(ids(&t, a, b), [(1, 1), (1, 2)]);
        assert!(t.remove(&PathId { conn: rds_core::ConnId(1), index: 0 }).is_none());
        t.remove(&PathId { conn: rds_core::ConnId(2), index: 0 }).unwrap();
        assert!(t.pair(ip(a), ip(c)).is_none());
        assert!(!t.by_pair.contains_key(&(ip(a), ip(c))), "no empty list is kept");
        assert_eq!(t.values().count(), 2);
        t.clear();
        assert!(t.pair(ip(a), ip(b)).is_none() && t.values().count() == 0);
    }
}
