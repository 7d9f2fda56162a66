#!/usr/bin/env bash
# Runs inside one VM rig guest (scripts/perf.sh starts it with vmrig run):
# two network namespaces joined by veth (netpair), modprobe rds_tcp, then
# PERF_ROUNDS times (default 3), one after the other in each round:
#   1. raw TCP with qperf (tcp_lat, tcp_bw) (last in even rounds),
#   2. ours: the same qperf (rds_lat, rds_bw) with both sides under the
#      LD_PRELOAD shim, and rds-window (64 B, 16 in flight; and with -p,
#      one in flight, waiting in poll) the same way,
#      then our tools rds-stress and rds-gen/rds-sink, on
#      RDS-TCP port 16386 (RDS_TCP_PORT) beside the kernel's listener on
#      16385 in every namespace,
#   3. the kernel's RDS-TCP with qperf (rds_lat, rds_bw) and rds-window
#      (both ways) (first in even rounds);
# then one more run of each for where the time goes (why_*), 64 KiB
# streams with the default and with larger socket buffers (sb_suite).
# Each round measures the three within a minute or two of each other, so a
# change in the shared machine's load moves them together (the kernel's
# rounds used to come after all of ours, minutes later); the report shows
# the best figure of each, and its targets take the median of the rounds'
# ratios (ours over the baseline of the same round).
# Usage: guest.sh BIN_DIR [SHIM] (default BIN_DIR/librdspreload.so)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/perf/lib.sh
. "$here/lib.sh"
BIN=$1
SHIM=${2:-$BIN/librdspreload.so}
ON_A=(ip netns exec ns1)
ON_B=(ip netns exec ns2)
ADDR_A=10.99.0.1
ADDR_B=10.99.0.2
QPERF_T=${PERF_QPERF_T:-3}
STRESS_T=${PERF_STRESS_T:-4}
TOTAL_1K=${PERF_VM_TOTAL_1K:-8388608}
TOTAL_8K=${PERF_VM_TOTAL_8K:-25165824}
TOTAL_64K=${PERF_VM_TOTAL_64K:-50331648}
PREFIX=vm_
ROUNDS=${PERF_ROUNDS:-3}
trap cleanup_pids EXIT

netpair up || { echo "perf: netpair failed" >&2; exit 1; }
echo "R vm_kernel $(uname -r)"
echo "R vm_nproc $(nproc)"
modprobe rds_tcp || { echo "perf: modprobe rds_tcp failed" >&2; exit 1; }
# Ours beside the kernel's RDS-TCP (which listens on 16385 in every
# namespace once loaded); the kernel's qperf does not read this.
export RDS_TCP_PORT=16386
raw_part() {
    echo "perf: [vm] round $round: raw TCP (qperf)" >&2
    qperf_suite raw tcp
}
kern_part() {
    echo "perf: [vm] round $round: kernel RDS-TCP (qperf)" >&2
    qperf_suite kern rds
    echo "perf: [vm] round $round: kernel RDS-TCP (rds-window, 16 in flight; -p, 1 in flight)" >&2
    window_run kern
    window_poll_run kern
}
for round in $(seq "$ROUNDS"); do
    # Ours in the middle; raw TCP first and the kernel last in odd rounds,
    # the other way round in even ones, so that neither baseline always
    # runs before ours (the targets take each round's ratio).
    if [ $((round % 2)) = 1 ]; then raw_part; else kern_part; fi
    echo "perf: [vm] round $round: ours (qperf under the shim)" >&2
    shim_suite
    echo "perf: [vm] round $round: ours (rds-window under the shim, 16 in flight; -p, 1 in flight)" >&2
    shim_window
    echo "perf: [vm] round $round: ours (rds-stress, rds-gen/rds-sink)" >&2
    ours_suite
    if [ $((round % 2)) = 1 ]; then kern_part; else raw_part; fi
done
# Why the latencies differ: guest idle share, CPU time and context
# switches per round trip of raw TCP, ours under the shim, then the kernel.
echo "perf: [vm] where a round trip's time goes (raw TCP, ours under the shim)" >&2
why_lat raw tcp_lat
why_shim() {
    why_lat shim rds_lat
    why_bw shim 64
    why_bw shim 1024
    why_bw shim 8192
    why_bw shim 65536
    why_window shim
}
if [ -f "$SHIM" ]; then
    under_shim why_shim
fi
echo "perf: [vm] where a round trip's and a message's time goes (kernel RDS-TCP)" >&2
why_lat kern rds_lat
why_bw kern 64
why_bw kern 1024
why_bw kern 8192
why_bw kern 65536
why_window kern
# What bounds a 64 KiB stream: how many messages the send buffer lets await
# their acks, ours and the kernel's.
echo "perf: [vm] what bounds a 64 KiB stream (socket buffers)" >&2
if [ -f "$SHIM" ]; then
    under_shim sb_suite shim
fi
sb_suite kern
netpair down
echo "R vm_done 1"
