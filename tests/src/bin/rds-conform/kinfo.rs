//! `kinfo counters|send|retrans`: the kernel's RDS_INFO_* for the run
//! script.

use std::io;

/// `kinfo counters|send|retrans`: the kernel's RDS_INFO_* (run on the
/// kernel's guest for the script, whose getsockopt is limited to 1 KiB).
pub fn kinfo(what: &str) -> i32 {
    const SOL_RDS: i32 = 276;
    let (opt, item) = match what {
        "counters" => (10000, 40),
        "send" => (10003, 26),
        "retrans" => (10004, 26),
        _ => return 2,
    };
    // SAFETY: plain socket/getsockopt/close on a buffer we own.
    unsafe {
        let fd = libc::socket(21, libc::SOCK_SEQPACKET, 0);
        if fd < 0 {
            eprintln!("socket(AF_RDS): {}", io::Error::last_os_error());
            return 1;
        }
        let mut buf = vec![0u8; 1 << 16];
        let mut len;
        loop {
            len = buf.len() as libc::socklen_t;
            if libc::getsockopt(fd, SOL_RDS, opt, buf.as_mut_ptr().cast(), &mut len) >= 0 {
                break;
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOSPC) || buf.len() >= 1 << 26 {
                eprintln!("getsockopt({opt}): {e}");
                libc::close(fd);
                return 1;
            }
            buf.resize((len as usize).max(buf.len() * 2), 0);
        }
        libc::close(fd);
        for r in buf[..len as usize].chunks_exact(item) {
            if what == "counters" {
                let name = String::from_utf8_lossy(&r[..32]).trim_end_matches('\0').to_string();
                println!("{name} {}", u64::from_le_bytes(r[32..40].try_into().unwrap()));
            } else {
                let seq = u64::from_le_bytes(r[..8].try_into().unwrap());
                let len = u32::from_le_bytes(r[8..12].try_into().unwrap());
                let lport = u16::from_be_bytes([r[20], r[21]]);
                let fport = u16::from_be_bytes([r[22], r[23]]);
                println!("{seq} {len} {lport} {fport}");
            }
        }
    }
    0
}
