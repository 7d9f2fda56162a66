//! Secrets from the operating system, the I/O half of the verbs-only side
//! channel ([`crate::proto::sidechannel`] is the sans-IO codec and
//! handshake): nonces and 24-bit PSNs from the kernel's CSPRNG
//! (`getrandom(2)`), and the pre-shared [`Key`] read from its file.

use std::io;

use crate::proto::sidechannel::{Key, NONCE_LEN};

/// Fills `buf` from the OS CSPRNG (`getrandom(2)`, blocking until the pool
/// is initialised).
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: rest is valid for rest.len() bytes of writes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// A fresh nonce from the OS CSPRNG.
pub fn random_nonce() -> io::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    random_bytes(&mut n)?;
    Ok(n)
}

/// A fresh 24-bit packet sequence number from the OS CSPRNG.
pub fn random_psn() -> io::Result<u32> {
    let mut b = [0u8; 4];
    random_bytes(&mut b)?;
    Ok(u32::from_be_bytes(b) & 0x00ff_ffff)
}

impl Key {
    /// Reads a key file, refusing (as ssh refuses a private key) one that
    /// its group or others may access: mode bits 0o077 set is
    /// `PermissionDenied`, naming the file and its mode. The mode is the
    /// opened file's (no window between the check and the read).
    pub fn from_file(path: &std::path::Path) -> io::Result<Key> {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let mut f = std::fs::File::open(path).map_err(named)?;
        let mode = f.metadata().map_err(named)?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{}: key file mode {mode:04o} lets its group or others access it (refused, as ssh refuses such a private key); chmod 600 it",
                    path.display()
                ),
            ));
        }
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).map_err(named)?;
        Key::from_file_contents(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::sidechannel::SideError;

    #[test]
    fn a_key_file_its_group_or_others_may_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rds-ib-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("psk");
        std::fs::write(&path, b"0123456789abcdef0123\n").unwrap();
        let want = Key::new(b"0123456789abcdef0123".to_vec()).unwrap();
        let mut refused = Vec::new();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o606, 0o620, 0o602, 0o610, 0o601, 0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            match Key::from_file(&path) {
                Ok(k) => assert_eq!(k, want, "mode {mode:o}"),
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "mode {mode:o}: {e}");
                    let msg = e.to_string();
                    assert!(msg.contains(&path.display().to_string()), "{msg}");
                    assert!(msg.contains(&format!("mode 0{mode:o}")), "{msg}");
                    refused.push(mode);
                }
            }
        }
        assert_eq!(refused, [0o644, 0o640, 0o604, 0o660, 0o606, 0o620, 0o602, 0o610, 0o601]);
        // Short keys and missing files still name the file.
        std::fs::write(&path, b"short\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = Key::from_file(&path).unwrap_err();
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        std::fs::remove_file(&path).unwrap();
        let e = Key::from_file(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn keys_and_randomness() {
        assert_eq!(Key::new(vec![1; 15]), Err(SideError::ShortKey(15)));
        assert_eq!(
            Key::from_file_contents(b"0123456789abcdef\n").unwrap(),
            Key::new(b"0123456789abcdef".to_vec()).unwrap()
        );
        assert_eq!(format!("{:?}", Key::new(vec![1; 32]).unwrap()), "Key(32 bytes)");
        let a = random_nonce().unwrap();
        let b = random_nonce().unwrap();
        assert_ne!(a, b);
        for _ in 0..64 {
            assert!(random_psn().unwrap() <= 0x00ff_ffff);
        }
    }
}
