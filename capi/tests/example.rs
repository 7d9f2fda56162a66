//! examples/pingpong.c, built with cc against the header and librds.so:
//! a server on 127.0.0.2 and a client on 127.0.0.1, two processes (so two
//! engines, over RDS-TCP), 200 pings and pongs checked in content and order.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn pingpong_between_two_processes() {
    let exe = common::cc(&common::repo().join("examples/pingpong.c"), "pingpong", &[]);
    let port = "4700";
    let count = 200;
    let mut server = Command::new(&exe)
        .args(["server", "127.0.0.2", port, &count.to_string()])
        .env("RDS_INFO_DIR", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready", "the server bound its address");
    let client = Command::new(&exe)
        .args(["client", "127.0.0.1", "127.0.0.2", port, &count.to_string()])
        .env("RDS_INFO_DIR", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap();
    let status = server.wait().unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(client.status.success(), "client: {}", String::from_utf8_lossy(&client.stderr));
    assert_eq!(String::from_utf8_lossy(&client.stdout), format!("ok {count}\n"));
    assert!(status.success(), "server failed");
    assert_eq!(rest, vec![format!("ok {count}")], "the server saw every ping, in order");
}
