//! Every tool's --help exits 0 and mentions every option the tool accepts;
//! an unknown option is a usage error (exit 2).

mod common;

use std::time::Duration;

use common::run;

const LONG: Duration = Duration::from_secs(30);

/// Whether `opt` (like "-c" or "--show-params") occurs in `text` as a word
/// of its own, not inside a longer option.
fn mentions(text: &str, opt: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    text.match_indices(opt).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + opt.len()..].chars().next();
        before.is_none_or(|c| !word(c)) && after.is_none_or(|c| !word(c))
    })
}

fn check(tool: &str, options: &[&str]) {
    let (code, out, err) = run(tool, &["--help"], LONG);
    assert_eq!(code, 0, "{tool} --help: {err:?}");
    let text = out.join("\n");
    assert!(text.starts_with("usage: "), "{tool}: {text}");
    for o in options {
        assert!(mentions(&text, o), "{tool} --help does not mention {o}:\n{text}");
    }
    let (code, _, _) = run(tool, &["-h"], LONG);
    assert_eq!(code, 0, "{tool} -h");
    let (code, _, err) = run(tool, &["--no-such-option"], LONG);
    assert_eq!(code, 2, "{tool}: {err:?}");
    assert!(err.iter().any(|l| l.contains("unknown option --no-such-option")), "{tool}: {err:?}");
}

#[test]
fn mentions_is_exact() {
    assert!(mentions("  -c count", "-c"));
    assert!(mentions("[-c count]", "-c"));
    assert!(!mentions("  --connect-retries N", "-c"));
    assert!(!mentions("  --show-params-x", "--show-params"));
}

#[test]
fn rds_ping() {
    check("rds-ping", &["-c", "-i", "-I", "-Q", "-h", "--help"]);
}

#[test]
fn rds_gen() {
    check("rds-gen", &["-s", "-d", "-m", "-l", "-f", "-i", "-b", "--no-digest", "-h", "--help"]);
}

#[test]
fn rds_sink() {
    check("rds-sink", &["-s", "--digest", "-l", "-t", "-b", "-h", "--help"]);
}

#[test]
fn rds_info() {
    check("rds-info", &["-c", "-k", "-n", "-r", "-s", "-t", "-I", "-T", "-v", "--pid", "-h", "--help"]);
}

#[test]
fn rds_bench() {
    check(
        "rds-bench",
        &[
            "-s",
            "--sizes",
            "-t",
            "--seconds",
            "-b",
            "--sndbuf",
            "-a",
            "--from",
            "-d",
            "--to",
            "-p",
            "--port",
            "-r",
            "--repeat",
            "--only",
            "--sockets",
            "--paths",
            "-h",
            "--help",
        ],
    );
}

#[test]
fn rds_stress() {
    check(
        "rds-stress",
        &[
            "-a",
            "--ack-bytes",
            "-q",
            "--req-bytes",
            "-d",
            "--depth",
            "-t",
            "--tasks",
            "-r",
            "--recv-addr",
            "-s",
            "--send-addr",
            "-p",
            "--port",
            "-T",
            "--time",
            "-Q",
            "--tos",
            "--connect-retries",
            "--use-cong-monitor",
            "--show-outliers",
            "--abort-after",
            "-D",
            "--rdma-bytes",
            "-I",
            "--rdma-buffers",
            "-M",
            "--rdma-mode",
            "--rdma-use-once",
            "--rdma-use-get-mr",
            "--rdma-use-fence",
            "--rdma-use-notify",
            "--rdma-cache-mrs",
            "--rdma-alignment",
            "-c",
            "--report-cpu",
            "-z",
            "--report-summary",
            "-R",
            "--rtprio",
            "-v",
            "--verify",
            "-V",
            "--trace",
            "-o",
            "--one-way",
            "--show-params",
            "--show-perfdata",
            "--show-histogram",
            "--cancel-sent-to",
            "--disable-inq",
            "--rdma-key-o-meter",
            "--reset",
            "--async",
            "--always-bursty",
            "--sync-always-bursty",
            "-h",
            "--help",
        ],
    );
}
