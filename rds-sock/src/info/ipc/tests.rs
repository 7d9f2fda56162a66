//! Unit tests of `ipc.rs`.

use super::*;

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rds-info-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn only_our_uid_and_root_are_allowed() {
    assert!(peer_allowed(1000, 1000));
    assert!(peer_allowed(0, 1000));
    assert!(peer_allowed(0, 0));
    assert!(!peer_allowed(1001, 1000));
    assert!(!peer_allowed(1000, 0), "a root node answers only root");
    assert!(!peer_allowed(u32::MAX, 1000));
}

#[test]
fn socket_peer_uid_is_ours() {
    let (a, b) = UnixStream::pair().unwrap();
    assert_eq!(peer_uid(&a).unwrap(), euid());
    assert_eq!(peer_uid(&b).unwrap(), euid());
}

#[test]
fn names_parse() {
    assert_eq!(parse_name("123.0.sock"), Some((123, 0)));
    assert_eq!(parse_name("123.17.sock"), Some((123, 17)));
    assert_eq!(parse_name(".123.0.tmp"), None);
    assert_eq!(parse_name("123.sock"), None);
    assert_eq!(parse_name("x.0.sock"), None);
}

#[test]
fn dir_is_0700_and_a_foreign_mode_is_repaired() {
    let d = tempdir("mode");
    ensure_dir(&d).unwrap();
    assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    ensure_dir(&d).unwrap();
    assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
    // A file (or symlink) in its place is refused.
    let f = d.join("file");
    std::fs::write(&f, b"").unwrap();
    assert!(ensure_dir(&f).is_err());
    let l = d.join("link");
    std::os::unix::fs::symlink(&d, &l).unwrap();
    assert!(ensure_dir(&l).is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn server_answers_then_stops_and_removes_its_socket_and_stale_ones_are_cleaned() {
    let d = tempdir("serve");
    let answer: Answer = Box::new(|want| {
        let s = Snapshot { counters: vec![("want".into(), u64::from(want))], ..Snapshot::default() };
        Some(codec::encode_snapshot(&s, super::super::sections::ALL))
    });
    let mut srv = Server::start(&d, 900, answer).unwrap();
    let path = srv.path().to_path_buf();
    assert_eq!(path, d.join(format!("{}.900.sock", std::process::id())));
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    let s = query(&path, 0x42).unwrap();
    assert_eq!(s.counters, vec![("want".to_string(), 0x42)]);
    let all = query_all(&d, 1).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].0.pid, all[0].0.engine), (std::process::id(), 900));
    srv.stop();
    assert!(!path.exists(), "socket removed on stop");
    assert!(query_all(&d, 1).unwrap().is_empty());

    // Sockets left by a process that died (no process has pid
    // 4194304, above Linux's pid_max): removed by listing.
    let dead = d.join("4194304.0.sock");
    drop(UnixListener::bind(&dead).unwrap());
    let tmp = d.join(".4194304.1.tmp");
    std::fs::write(&tmp, b"").unwrap();
    assert!(list(&d).unwrap().is_empty());
    assert!(!dead.exists() && !tmp.exists(), "leftovers of a dead process removed");
    // A socket of a live process whose listener is gone: removed by the
    // reader that is refused.
    let stale = d.join(format!("{}.999.sock", std::process::id()));
    drop(UnixListener::bind(&stale).unwrap());
    assert!(list(&d).unwrap().iter().any(|e| e.path == stale));
    assert!(matches!(query(&stale, 1), Err(QueryError::Gone)));
    assert!(!stale.exists(), "stale socket removed by the reader");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A node answering with the bytes of `answer`, recording the largest
/// buffer the client asks it to fill.
struct Answering {
    answer: Vec<u8>,
    at: usize,
    largest_read: usize,
}

impl Read for Answering {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.largest_read = self.largest_read.max(buf.len());
        let n = buf.len().min(self.answer.len() - self.at);
        buf[..n].copy_from_slice(&self.answer[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Answering {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A 12-byte header claiming the largest body, then 100 bytes and the
/// end: the node went away, and the client's buffer grew with what
/// arrived. (It used to allocate the claimed 256 MiB at once and read
/// into it: the fuzz target info_ipc found it.)
#[test]
fn an_answer_claiming_a_huge_body_costs_what_arrived() {
    let mut answer = codec::encode_response_header(Status::Ok, codec::MAX_BODY).to_vec();
    answer.extend_from_slice(&[0; 100]);
    let mut node = Answering { answer, at: 0, largest_read: 0 };
    assert!(matches!(exchange(&mut node, super::super::sections::ALL), Err(QueryError::Gone)));
    assert_eq!(node.at, codec::HEADER_LEN + 100, "everything sent was read");
    assert!(node.largest_read <= 64 << 10, "the client offered a {}-byte buffer", node.largest_read);
    // A whole answer still decodes, in pieces that grow with it.
    let s = Snapshot { counters: vec![("x".repeat(300_000), 1)], ..Snapshot::default() };
    let body = codec::encode_snapshot(&s, super::super::sections::ALL);
    let mut answer = codec::encode_response_header(Status::Ok, body.len()).to_vec();
    answer.extend_from_slice(&body);
    answer.extend_from_slice(b"trailing bytes are not read");
    let mut node = Answering { answer, at: 0, largest_read: 0 };
    assert_eq!(exchange(&mut node, super::super::sections::ALL).unwrap(), s);
    assert_eq!(node.at, codec::HEADER_LEN + body.len());
    assert!(node.largest_read <= body.len(), "the client offered a {}-byte buffer", node.largest_read);
}

#[test]
fn a_request_of_another_version_is_answered_with_ours() {
    let d = tempdir("version");
    let answer: Answer = Box::new(|_| Some(Vec::new()));
    let srv = Server::start(&d, 901, answer).unwrap();
    let mut s = UnixStream::connect(srv.path()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = codec::encode_request(1);
    req[4..6].copy_from_slice(&99u16.to_le_bytes());
    s.write_all(&req).unwrap();
    let mut hdr = [0u8; codec::HEADER_LEN];
    s.read_exact(&mut hdr).unwrap();
    assert_eq!(codec::decode_response_header(&hdr).unwrap(), (codec::VERSION, Status::Version, 0));
    drop(srv);
    std::fs::remove_dir_all(&d).unwrap();
}
