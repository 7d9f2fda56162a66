//! rds-gen -> rds-sink: the sink's line for the generator's source equals
//! the generator's line (messages, bytes, SHA-256), for the generated
//! pattern and for files, at several message sizes up to 1 MiB; the sink
//! leaves after -l messages; without digests both print `-`.

mod common;

use std::time::Duration;

use common::{Proc, ip};
use sha2::Digest;

const LONG: Duration = Duration::from_secs(90);

/// Runs a sink for `count` messages at 127.88.`test`.`host`:4000 and a
/// generator from 127.88.`test`.(`host`+100):4000 with `gen_args`; returns
/// the generator's line after checking the sink printed the same.
fn transfer(test: u8, host: u8, gen_args: &[&str], count: u64) -> String {
    let sink_at = format!("{}:4000", ip(test, host));
    let gen_at = format!("{}:4000", ip(test, host + 100));
    let mut sink = Proc::spawn("rds-sink", &["-s", &sink_at, "--digest", "-l", &count.to_string(), "-b", "8M"]);
    sink.wait_line(true, LONG, |l| l.starts_with("rds-sink: receiving on"));
    let mut args = vec!["-s", gen_at.as_str(), "-d", sink_at.as_str()];
    args.extend_from_slice(gen_args);
    let mut generator = Proc::spawn("rds-gen", &args);
    assert_eq!(generator.code(LONG), 0, "{}", generator.dump());
    let gout = generator.stdout();
    assert_eq!(gout.len(), 1, "{}", generator.dump());
    let line = gout[0].clone();
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f.len(), 4, "{line}");
    assert_eq!(f[0], gen_at);
    assert_eq!(f[1].parse::<u64>().unwrap(), count, "{line}");
    assert_eq!(f[3].len(), 64, "{line}");
    // -l count: the sink leaves by itself after count messages.
    assert_eq!(sink.code(LONG), 0, "{}", sink.dump());
    let sout = sink.stdout();
    assert_eq!(sout, vec![line.clone()], "sink\n{}\ngenerator\n{}", sink.dump(), generator.dump());
    line
}

#[test]
fn pattern_at_several_sizes() {
    let t = 20;
    // (message size, total bytes, messages): partial last messages too.
    let cases: [(&str, u64, u64); 5] = [
        ("1", 5, 5),
        ("4K", 3 * 4096 + 100, 4),
        ("65539", 200_000, 4),
        ("1M", 3 * (1 << 20) + 12_345, 4),
        ("1m", 2 << 20, 2),
    ];
    for (i, (m, total, count)) in cases.iter().enumerate() {
        let line = transfer(t, 1 + i as u8, &["-m", m, "-l", &total.to_string()], *count);
        assert_eq!(line.split(' ').nth(2).unwrap(), total.to_string(), "{line}");
    }
    // The defaults: 4 KiB messages, 1 MiB in all.
    let line = transfer(t, 10, &[], 256);
    assert_eq!(line.split(' ').nth(2).unwrap(), (1 << 20).to_string());
}

fn test_file(name: &str, len: usize) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("rds-tools-test-{}-{name}", std::process::id()));
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ len as u64;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&path, data).unwrap();
    path
}

fn sha256_hex(path: &std::path::Path) -> String {
    let d = sha2::Sha256::digest(std::fs::read(path).unwrap());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn files_at_several_sizes() {
    let t = 21;
    let odd = test_file("odd", 300_001);
    let even = test_file("even", 3 * 4096);
    let big = test_file("big", (1 << 20) + 1);
    let cases: [(&std::path::PathBuf, &str, u64); 5] =
        [(&odd, "64K", 5), (&odd, "1M", 1), (&even, "4K", 3), (&big, "1M", 2), (&big, "100000", 11)];
    for (i, (file, m, count)) in cases.iter().enumerate() {
        let line = transfer(t, 1 + i as u8, &["-f", file.to_str().unwrap(), "-m", m], *count);
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[2], std::fs::metadata(file).unwrap().len().to_string(), "{line}");
        // The digest of what went through is the file's.
        assert_eq!(f[3], sha256_hex(file), "{line}");
    }
    for f in [odd, even, big] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn sink_leaves_after_count_messages_of_a_longer_stream() {
    let t = 22;
    let sink_at = format!("{}:4000", ip(t, 1));
    let gen_at = format!("{}:4000", ip(t, 101));
    let mut sink = Proc::spawn("rds-sink", &["-s", &sink_at, "--digest", "-l", "3"]);
    sink.wait_line(true, LONG, |l| l.starts_with("rds-sink: receiving on"));
    // The generator paces 200 ms per message: the sink has left long
    // before it is done.
    let mut generator = Proc::spawn("rds-gen", &["-s", &gen_at, "-d", &sink_at, "-m", "10", "-l", "100", "-i", "0.2"]);
    assert_eq!(sink.code(LONG), 0, "{}", sink.dump());
    let out = sink.stdout();
    assert_eq!(out.len(), 1, "{}", sink.dump());
    let f: Vec<&str> = out[0].split(' ').collect();
    assert_eq!((f[0], f[1], f[2]), (gen_at.as_str(), "3", "30"), "{}", sink.dump());
    generator.kill();
}

/// `--no-digest`: the generator hashes nothing and prints `-` for the
/// digest, as a sink without `--digest` does; counts and bytes as always.
#[test]
fn no_digest_prints_a_dash() {
    let t = 24;
    let sink_at = format!("{}:4000", ip(t, 1));
    let gen_at = format!("{}:4000", ip(t, 101));
    let mut sink = Proc::spawn("rds-sink", &["-s", &sink_at, "-l", "5"]);
    sink.wait_line(true, LONG, |l| l.starts_with("rds-sink: receiving on"));
    let mut generator =
        Proc::spawn("rds-gen", &["-s", &gen_at, "-d", &sink_at, "-m", "1K", "-l", "5000", "--no-digest"]);
    assert_eq!(generator.code(LONG), 0, "{}", generator.dump());
    let want = format!("{gen_at} 5 5000 -");
    assert_eq!(generator.stdout(), vec![want.clone()], "{}", generator.dump());
    assert_eq!(sink.code(LONG), 0, "{}", sink.dump());
    assert_eq!(sink.stdout(), vec![want], "{}", sink.dump());
}

/// `--transport tcp` forces TCP (the same line at the sink); a value other
/// than tcp or ib is refused before anything is sent.
#[test]
fn transport_option() {
    let t = 23;
    let line = transfer(t, 1, &["-m", "4K", "-l", "8192", "--transport", "tcp"], 2);
    assert_eq!(line.split(' ').nth(2).unwrap(), "8192", "{line}");
    let (src, dst) = (format!("{}:4000", ip(t, 3)), format!("{}:4000", ip(t, 4)));
    let mut g = Proc::spawn("rds-gen", &["-s", &src, "-d", &dst, "--transport", "rdma"]);
    assert_ne!(g.code(LONG), 0, "{}", g.dump());
    assert!(g.stdout().is_empty(), "{}", g.dump());
    assert!(g.stderr().iter().any(|l| l.contains("--transport: tcp or ib, not 'rdma'")), "{}", g.dump());
}
