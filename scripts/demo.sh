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
echo "== passive rds-stress on 127.0.0.2 (port $port), active on 127.0.0.1, $secs s"
$bin/rds-stress -r 127.0.0.2 -p "$port" &
passive=$!
trap 'kill $passive 2>/dev/null || true' EXIT
sleep 0.5
$bin/rds-stress -r 127.0.0.1 -s 127.0.0.2 -p "$port" -t 2 -d 4 -q 8K -T "$secs"
wait $passive
trap - EXIT
echo "== raw TCP vs RDS-TCP throughput"
$bin/rds-bench --seconds 1
