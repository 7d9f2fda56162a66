//! Helpers of the tools' tests: run the built binaries with their output
//! collected, wait for them with a bound, kill and reap them on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Path of one of this package's binaries.
pub fn bin(name: &str) -> &'static str {
    match name {
        "rds-ping" => env!("CARGO_BIN_EXE_rds-ping"),
        "rds-stress" => env!("CARGO_BIN_EXE_rds-stress"),
        "rds-gen" => env!("CARGO_BIN_EXE_rds-gen"),
        "rds-sink" => env!("CARGO_BIN_EXE_rds-sink"),
        "rds-bench" => env!("CARGO_BIN_EXE_rds-bench"),
        "rds-info" => env!("CARGO_BIN_EXE_rds-info"),
        _ => panic!("no binary {name}"),
    }
}

/// 127.88.`test`.`host`: every test uses its own `test` number, so tests
/// (and other test binaries, which use other 127.x blocks) never share an
/// address: one address is served by one process only.
pub fn ip(test: u8, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 88, test, host)
}

/// A running tool. Killed (SIGKILL) and reaped when dropped.
pub struct Proc {
    pub name: String,
    child: Child,
    out: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

fn reader(r: impl Read + Send + 'static, into: Arc<Mutex<Vec<String>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            match line {
                Ok(l) => into.lock().unwrap().push(l),
                Err(_) => break,
            }
        }
    })
}

impl Proc {
    pub fn spawn(tool: &str, args: &[&str]) -> Proc {
        let mut child = Command::new(bin(tool))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {tool}: {e}"));
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        let readers =
            vec![reader(child.stdout.take().unwrap(), out.clone()), reader(child.stderr.take().unwrap(), err.clone())];
        Proc { name: format!("{tool} {}", args.join(" ")), child, out, err, readers, status: None }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout(&self) -> Vec<String> {
        self.out.lock().unwrap().clone()
    }

    pub fn stderr(&self) -> Vec<String> {
        self.err.lock().unwrap().clone()
    }

    /// Everything printed so far, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "--- {} (status {:?})\n--- stdout:\n{}\n--- stderr:\n{}\n",
            self.name,
            self.status,
            self.stdout().join("\n"),
            self.stderr().join("\n")
        )
    }

    /// Waits until a line of stdout (or stderr) satisfies `pred`; panics
    /// after `timeout` or if the process ends first.
    pub fn wait_line(&mut self, stderr: bool, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + timeout;
        loop {
            let lines = if stderr { self.stderr() } else { self.stdout() };
            if let Some(l) = lines.iter().find(|l| pred(l)) {
                return l.clone();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                self.status = Some(st);
                self.join_readers();
                let lines = if stderr { self.stderr() } else { self.stdout() };
                if let Some(l) = lines.iter().find(|l| pred(l)) {
                    return l.clone();
                }
                panic!("process ended before the expected line\n{}", self.dump());
            }
            assert!(Instant::now() < end, "timed out waiting for a line\n{}", self.dump());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    /// Waits for the exit (its output complete); panics after `timeout`
    /// (the process is then killed by drop).
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                self.status = Some(st);
                self.join_readers();
                return st;
            }
            assert!(Instant::now() < end, "did not exit within {timeout:?}\n{}", self.dump());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The exit code (panics if killed by a signal).
    pub fn code(&mut self, timeout: Duration) -> i32 {
        let st = self.wait(timeout);
        st.code().unwrap_or_else(|| panic!("killed by a signal\n{}", self.dump()))
    }

    /// Sends `sig` (e.g. SIGTERM) if the process still runs.
    pub fn signal(&mut self, sig: i32) {
        if self.status.is_none() {
            // SAFETY: kill only sends a signal to our own child, not yet reaped.
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        }
    }

    /// SIGKILL now and reap.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
            self.join_readers();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs a tool to completion (bounded by `timeout`): (exit code, stdout, stderr).
pub fn run(tool: &str, args: &[&str], timeout: Duration) -> (i32, Vec<String>, Vec<String>) {
    let mut p = Proc::spawn(tool, args);
    let code = p.code(timeout);
    (code, p.stdout(), p.stderr())
}
