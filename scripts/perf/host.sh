#!/usr/bin/env bash
# The host loopback part of scripts/perf.sh: ours (127.0.0.1 -> 127.0.0.2;
# qperf under the LD_PRELOAD shim, then our tools)
# against raw TCP with qperf on 127.0.0.1 when qperf is installed. perf.sh
# runs it inside a private network namespace (unshare -n) when it can.
# PERF_ROUNDS times (default 3); the report keeps the best figure of each.
# Usage: host.sh BIN_DIR [SHIM] (default BIN_DIR/librdspreload.so)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/perf/lib.sh
. "$here/lib.sh"
BIN=$1
SHIM=${2:-$BIN/librdspreload.so}
ON_A=()
ON_B=()
ADDR_A=127.0.0.1
ADDR_B=127.0.0.2
QPERF_T=${PERF_QPERF_T:-3}
STRESS_T=${PERF_STRESS_T:-4}
TOTAL_1K=${PERF_HOST_TOTAL_1K:-268435456}
TOTAL_8K=${PERF_HOST_TOTAL_8K:-536870912}
TOTAL_64K=${PERF_HOST_TOTAL_64K:-1073741824}
PREFIX=host_
ROUNDS=${PERF_ROUNDS:-3}
trap cleanup_pids EXIT

ip link set lo up 2>/dev/null || true
for round in $(seq "$ROUNDS"); do
    if command -v qperf >/dev/null 2>&1; then
        echo "perf: [host] round $round: raw TCP (qperf on 127.0.0.1)" >&2
        ADDR_B=127.0.0.1 qperf_suite raw tcp
    else
        echo "perf: [host] qperf is not installed: no raw TCP figures on the host" >&2
        echo "R host_noqperf 1"
    fi
    if command -v qperf >/dev/null 2>&1; then
        echo "perf: [host] round $round: ours (qperf under the shim, 127.0.0.1 -> 127.0.0.2)" >&2
        shim_suite
    fi
    echo "perf: [host] round $round: ours (rds-window under the shim, 16 in flight; -p, 1 in flight)" >&2
    shim_window
    echo "perf: [host] round $round: ours (rds-stress, rds-gen/rds-sink)" >&2
    ours_suite
done
if command -v qperf >/dev/null 2>&1; then
    echo "perf: [host] instructions per round trip (callgrind)" >&2
    instr_suite
fi
