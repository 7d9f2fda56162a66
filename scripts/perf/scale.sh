#!/usr/bin/env bash
# The scale part of scripts/perf.sh (issue 14, item 4), on the host
# loopback; perf.sh runs it inside a private network namespace (unshare -n)
# when it can. One serving node, its own process with a fixed number of
# threads (rds-scale serve: 2 reactor threads, 8 receiving sockets), then
#   1. 256 peer nodes (rds-scale peers: one process, a socket per peer on
#      one shared rds-sock Engine, at 127.0.1.1, 127.0.1.2, ... skipping .0
#      and .255; --engine-per-peer would give each its own): the serving
#      node's RSS and PSS before and after all 256 connected and went idle,
#      and the aggregate throughput of 1 active peer against 256;
#   2. one node with 8 paths (rds-scale paths --npaths 8: 8 sockets, a path
#      and a sending thread each), then with 1 path: messages per path and
#      CPU time per thread of both processes.
# Prints "R key value [unit]" lines (scripts/perf/report.py). Every step is
# bounded by timeout(1); the serving node leaves when asked, or after 300 s.
# Usage: scale.sh BIN_DIR
set -uo pipefail
BIN=$1
# Throughput rounds of 1 peer and of all (about a second each, taken in
# turns: rds-scale peers runs the one-peer side first in every other
# round): more than the other parts, the figure moves the most (a run's
# paired ratios spread from 0.58 to 1.12 on this shared machine).
ROUNDS=${PERF_SCALE_ROUNDS:-7}
SECS=${PERF_STRESS_T:-4}
PEERS=${PERF_SCALE_PEERS:-256}
SRV=127.0.0.1:4000
ip link set lo up 2>/dev/null || true
# 256 peers of 8 paths: over 2,000 connections on each side.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "R scale_nofile $(ulimit -n)"
echo "R scale_rounds $ROUNDS"

log=$(mktemp /tmp/rds-scale-serve.XXXXXX)
timeout 330 "$BIN/rds-scale" serve -s "$SRV" --sockets 8 --threads 2 -t 300 >"$log.out" 2>"$log" &
srv=$!
cleanup() {
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    rm -f "$log" "$log.out"
}
trap cleanup EXIT
for _ in $(seq 100); do
    grep -q "serving" "$log" && break
    sleep 0.1
done
if ! grep -q "serving" "$log"; then
    echo "perf: [scale] rds-scale serve did not start:" >&2
    cat "$log" >&2
    echo "R scale_failed serve"
    exit 0
fi
echo "perf: [scale] $(cat "$log")" >&2
# The serving node's own pid ($srv is timeout's).
pid=$(sed -n 's/.* pid \([0-9]*\) .*/\1/p' "$log" | head -1)
echo "R scale_server_pid ${pid:-?}"

echo "perf: [scale] $PEERS peers: idle memory, 1 active peer against $PEERS" >&2
timeout 300 "$BIN/rds-scale" peers -d "$SRV" --peers "$PEERS" --rounds "$ROUNDS" \
    || echo "R scale_failed peers (status $?)"
# The serving node's own threads, as /proc/PID/status shows them.
echo "R scale_server_threads_proc $(awk '$1 == "Threads:" { print $2 }' "/proc/${pid:-0}/status" 2>/dev/null || echo '?')"

for np in 8 1; do
    echo "perf: [scale] one peer with $np path(s), $SECS s" >&2
    timeout $((SECS + 90)) "$BIN/rds-scale" paths -d "$SRV" -s "127.0.0.$((10 + np)):6000" --npaths "$np" -T "$SECS" \
        || echo "R scale_failed paths --npaths $np (status $?)"
done

# The serving node's totals (every message once, in order) as it leaves.
timeout 30 "$BIN/rds-scale" paths -d "$SRV" -s 127.0.0.30:6000 --sockets 1 --npaths 1 -T 0.1 --quit >/dev/null 2>&1 || true
for _ in $(seq 50); do
    kill -0 "$srv" 2>/dev/null || break
    sleep 0.1
done
if wait "$srv"; then echo "R scale_server_exit 0"; else echo "R scale_server_exit $?"; fi
echo "perf: [scale] the serving node's totals: $(cat "$log.out")" >&2
echo "R scale_done 1"
