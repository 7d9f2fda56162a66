//! What the shim's tests share: where the shared object and the programs
//! are, a private network namespace per test, children with a deadline.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>/`, the directory of the test binary's `deps/`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent().and_then(Path::parent).expect("target dir").to_path_buf()
}

/// The shim: `RDS_TEST_SHIM` when set (scripts/test.sh runs the host
/// tests once more with the dist build, the shim as it ships: Cargo.toml),
/// else `deps/librdspreload.so`, which cargo builds with the tests of this
/// package (`cargo build` copies it to `target/<profile>/`).
pub fn shim() -> PathBuf {
    if let Some(p) = std::env::var_os("RDS_TEST_SHIM") {
        let p = PathBuf::from(p);
        assert!(p.exists(), "RDS_TEST_SHIM={} does not exist", p.display());
        return p;
    }
    let dir = target_dir();
    let p = [dir.join("deps/librdspreload.so"), dir.join("librdspreload.so")].into_iter().find(|p| p.exists());
    p.unwrap_or_else(|| panic!("librdspreload.so missing in {}", dir.display()))
}

/// A program on PATH (or an absolute path), or None after a loud SKIP line.
pub fn program(name: &str, test: &str) -> Option<PathBuf> {
    let found = if name.starts_with('/') {
        Some(PathBuf::from(name)).filter(|p| p.exists())
    } else {
        std::env::var_os("PATH")
            .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file()))
    };
    if found.is_none() {
        println!("SKIP: {test}: {name} is not installed (scripts/setup.sh installs it)");
    }
    found
}

/// Moves the calling thread (and every child it spawns from now on) into a
/// new network namespace with only `lo`, up: 127.0.0.0/8 is ours alone, no
/// port clashes with anything else on the machine. Needs root; without it
/// the test runs in the current namespace and says so.
pub fn private_net() {
    // SAFETY: unshare(CLONE_NEWNET) changes only this thread's namespace.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    if r != 0 {
        println!("NOTE: no private network namespace ({}); using the current one", std::io::Error::last_os_error());
        return;
    }
    let st = Command::new("ip").args(["link", "set", "lo", "up"]).status().expect("run ip");
    assert!(st.success(), "ip link set lo up failed");
}

/// A child whose output is collected; killed when dropped.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Proc { name: name.to_string(), child: Some(child) }
    }

    /// Waits up to `limit`, then kills; returns (exit code or None when
    /// killed, stdout, stderr).
    pub fn finish(mut self, limit: Duration) -> (Option<i32>, String, String) {
        let mut child = self.child.take().expect("child");
        let t0 = Instant::now();
        let code = loop {
            match child.try_wait().expect("try_wait") {
                Some(st) => break st.code(),
                None if t0.elapsed() > limit => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let (out, err) = output(&mut child);
        (code, out, err)
    }

    pub fn kill(mut self) -> (String, String) {
        let mut child = self.child.take().expect("child");
        let _ = child.kill();
        let _ = child.wait();
        output(&mut child)
    }
}

/// What an ended child wrote: (stdout, stderr).
fn output(child: &mut Child) -> (String, String) {
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    (out, err)
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `cmd` with the shim preloaded.
pub fn preloaded(program: &Path) -> Command {
    let mut c = Command::new(program);
    c.env("LD_PRELOAD", shim());
    c
}
