#!/usr/bin/env bash
# The demo: two RDS nodes on this host (127.0.0.1 and 127.0.0.2) exchange
# datagrams over RDS-TCP for a few seconds; prints rds-stress figures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p rds-tools
bin=target/release
secs="${DEMO_SECONDS:-5}"
port="${DEMO_PORT:-4000}"
log=$(mktemp /tmp/rds-demo-passive.XXXXXX)
echo "== passive rds-stress on 127.0.0.2 (control port $port; its output: $log)"
echo "== active rds-stress on 127.0.0.1: 2 tasks, 4 requests of 8 KiB in flight each, $secs s"
$bin/rds-stress -r 127.0.0.2 -p "$port" >"$log" 2>&1 &
passive=$!
trap 'kill $passive 2>/dev/null || true' EXIT
sleep 0.5
$bin/rds-stress -r 127.0.0.1 -s 127.0.0.2 -p "$port" -t 2 -d 4 -q 8K -T "$secs" 2>&1 | grep -v '^Starting up\|^\.$'
wait $passive
trap - EXIT
echo "== one-way datagram throughput, RDS-TCP against a raw TCP stream of the same bytes (rds-bench)"
$bin/rds-bench --seconds 1
