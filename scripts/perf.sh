#!/usr/bin/env bash
# The benchmark, side by side with the kernel's RDS-TCP (issue 14): one
# command, one run, about 9 minutes (under 15), every load bounded by a size
# or a time. It
#   1. runs scripts/setup.sh and builds rds-gen, rds-sink, rds-stress,
#      rds-scale and perf-chart in release, librdspreload.so with the dist
#      profile (Cargo.toml), and
#      rds-window (scripts/perf/rds_window.c) with cc;
#   2. on the host loopback (in a private network namespace when run as
#      root): ours against raw TCP (qperf tcp_bw/tcp_lat on 127.0.0.1;
#      qperf is apt-installed if missing; ours with the same qperf under the
#      LD_PRELOAD shim, and with our tools), scripts/perf/host.sh; and
#      the user-space instructions per 64 B round trip of qperf's latency
#      client, raw TCP and ours, counted by callgrind (valgrind, apt-
#      installed if missing);
#   3. scale, on the host loopback (in a private network namespace when
#      run as root): one serving node with a fixed number of threads and
#      256 peer nodes (idle memory per peer, 256 active peers against 1),
#      and a multipath run (8 paths, CPU per thread), scripts/perf/scale.sh
#      with rds-scale;
#   4. in the VM rig (one guest, two network namespaces joined by veth, one
#      boot): raw TCP and the kernel's RDS-TCP with qperf, ours with the
#      same qperf under the LD_PRELOAD shim (both sides), and with
#      rds-gen/rds-sink and rds-stress; the 64 B message rate with 16 in
#      flight with rds-window on the kernel and on ours (under the shim),
#      scripts/perf/guest.sh;
#   5. writes docs/perf.md (scripts/perf/report.py): absolutes, ratios,
#      the targets of issue 14, the commit, the date, the machine and the
#      exact commands; and docs/perf.json, the figures perf-chart (crate
#      perf-chart) draws docs/perf.svg from: bandwidth by message size,
#      latency bars.
# Exits 1 with a message when the VM rig cannot run (the host part is
# measured and written anyway). Not part of scripts/test.sh: a benchmark,
# never a test. Environment: VMRIG_DIR (where the rig is), PERF_OUT (the
# report, default docs/perf.md), PERF_QPERF_T / PERF_STRESS_T (seconds per
# qperf test / rds-stress run and multipath run, default 3 / 4),
# PERF_SCALE_PEERS / PERF_SCALE_ROUNDS (peer nodes and throughput rounds of
# the scale part, default 256 / 7), PERF_ROUNDS (each other part runs this
# many times, default 3; the report shows the best figure of each and
# its targets take the median of the rounds' paired ratios).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
start=$(date +%s)
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
out="${PERF_OUT:-$here/docs/perf.md}"
work="$(mktemp -d /tmp/rds-perf.XXXXXX)"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

echo "== setup and release build"
"$here/scripts/setup.sh"
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p rds-tools --bin rds-gen --bin rds-sink --bin rds-stress --bin rds-scale --bin rds-info
# librdspreload.so: ours through the same qperf as the kernel's, built as
# it is meant to run (the dist profile, as a cdylib alone so that its
# link-time optimisation applies: Cargo.toml).
cargo rustc --profile dist -q -p rds-preload --lib --crate-type cdylib
chart_status=drawn
cargo build --release -q -p perf-chart || chart_status="not drawn: perf-chart did not build"
target_dir="$(cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="$target_dir/release"
shim="$target_dir/dist/librdspreload.so"
# rds-window: the 64 B message rate with 16 in flight, the same C program on
# the kernel's AF_RDS and on ours under the shim (qperf cannot limit what
# is in flight). setup.sh installed the C compiler (cargo links with it).
cc -O2 -Wall -o "$bin/rds-window" "$here/scripts/perf/rds_window.c" \
    || echo "perf: WARNING: rds-window did not build; no message rate with 16 in flight" >&2

if ! command -v qperf >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "perf: installing qperf (raw TCP on the host)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qperf >/dev/null 2>&1 \
        || echo "perf: WARNING: could not install qperf; no raw TCP figures on the host" >&2
fi

if ! command -v valgrind >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "perf: installing valgrind (instructions per round trip on the host)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null 2>&1 \
        || echo "perf: WARNING: could not install valgrind; no instruction counts" >&2
fi

echo "== host loopback: ours against raw TCP"
# A private network namespace for the host parts where we can make one.
private_net=()
if [ "$(id -u)" = 0 ] && unshare -n true 2>/dev/null; then
    private_net=(unshare -n)
else
    echo "perf: not root: the host and scale parts use the machine's own loopback" >&2
fi
host_cmd=("${private_net[@]}" bash "$here/scripts/perf/host.sh" "$bin" "$shim")
timeout 400 "${host_cmd[@]}" | tee "$work/host.txt" || echo "perf: WARNING: the host part failed (status $?)" >&2

echo "== scale on the host loopback: 256 peers, 8 paths"
scale_cmd=("${private_net[@]}" bash "$here/scripts/perf/scale.sh" "$bin")
scale_status=ran
timeout 400 "${scale_cmd[@]}" | tee "$work/scale.txt" || scale_status="failed (status $?)"
grep -q '^R scale_done' "$work/scale.txt" || scale_status="did not finish (${scale_status})"

echo "== VM rig: raw TCP, the kernel's RDS-TCP, ours"
vmrig_dir="${VMRIG_DIR:-}"
if [ -z "$vmrig_dir" ]; then
    for d in "$here/../shared/vmrig" /work/shared/vmrig; do
        if [ -x "$d/vmrig" ]; then vmrig_dir="$d"; break; fi
    done
fi
vm_status="ran"
vm_accel=tcg
if grep -qw -e vmx -e svm /proc/cpuinfo && ! grep -q kvm_pvm /proc/modules 2>/dev/null; then vm_accel=kvm; fi
vm_accel="${VMRIG_ACCEL:-$vm_accel}"
if [ -z "$vmrig_dir" ] || [ ! -x "$vmrig_dir/vmrig" ]; then
    vm_status="not run: no VM rig found (set VMRIG_DIR)"
elif [ ! -e /var/cache/vmrig/initrd.img ]; then
    vm_status="not run: the VM rig is not set up (vmrig setup failed? see /tmp/vmrig-setup.log)"
else
    rc=0
    vm_env=()
    for v in PERF_ROUNDS PERF_QPERF_T PERF_STRESS_T PERF_VM_TOTAL_1K PERF_VM_TOTAL_8K PERF_VM_TOTAL_64K; do
        if [ -n "${!v:-}" ]; then vm_env+=(-e "$v=${!v}"); fi
    done
    "$vmrig_dir/vmrig" run -t 1500 "${vm_env[@]}" -- bash "$here/scripts/perf/guest.sh" "$bin" "$shim" \
        | tee "$work/vm.txt" || rc=$?
    if [ $rc != 0 ] || ! grep -q '^R vm_done' "$work/vm.txt"; then
        vm_status="failed (vmrig run status $rc; figures missing from the VM part)"
    fi
fi
touch "$work/vm.txt"

{
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs/perf.md' 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "date $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "nproc $(nproc)"
    echo "kernel $(uname -r)"
    echo "cpu $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    echo "vm_status $vm_status"
    echo "vm_accel $vm_accel"
    echo "duration $(( $(date +%s) - start ))"
    echo "rounds ${PERF_ROUNDS:-3}"
    echo "stress_t ${PERF_STRESS_T:-4}"
    echo "scale_status $scale_status"
    echo "load_start $load_start"
    echo "load_end $(cut -d' ' -f1-3 /proc/loadavg)"
    qt="${PERF_QPERF_T:-3}"; st="${PERF_STRESS_T:-4}"
    echo "cmd # in the VM first: modprobe rds_tcp; export RDS_TCP_PORT=16386 (ours beside the kernel's 16385); each round runs all three"
    echo "cmd # raw TCP (KIND=tcp) and, in the VM, the kernel (KIND=rds):"
    echo "cmd B: qperf &"
    echo "cmd A: qperf -v -t $qt -m 64 B \${KIND}_lat"
    echo "cmd A: qperf -v -t $qt -m SIZE B \${KIND}_bw      # SIZE = 64, 1024, 8192, 65536"
    echo "cmd # ours through the same qperf, both sides under the shim:"
    echo "cmd B: LD_PRELOAD=librdspreload.so qperf &"
    echo "cmd A: LD_PRELOAD=librdspreload.so qperf -v -t $qt -m 64 B rds_lat"
    echo "cmd A: LD_PRELOAD=librdspreload.so qperf -v -t $qt -m SIZE B rds_bw      # SIZE = 64, 1024, 8192, 65536"
    echo "cmd # in the VM, what bounds a 64 KiB stream: the kernel's and ours (under the shim), in turns with and without -sb 1m:"
    echo "cmd A: qperf -v -t $qt [-sb 1m] -m 65536 B rds_bw"
    echo "cmd # 64 B with 16 in flight, each answered: the kernel (KIND=kern), ours (the same under LD_PRELOAD=librdspreload.so):"
    echo "cmd B: rds-window serve B 5000 30 &"
    echo "cmd A: rds-window run A 5001 B 5000 16 $qt"
    echo "cmd # 64 B, one in flight, both sides waiting in poll and receiving with MSG_DONTWAIT (the same two ways):"
    echo "cmd B: rds-window -p serve B 5000 30 &"
    echo "cmd A: rds-window -p run A 5001 B 5000 1 $qt"
    echo "cmd # ours with our tools:"
    echo "cmd B: rds-stress -r B -p 4000 &"
    echo "cmd A: rds-stress -r A -s B -p 4000 -t 1 -d 1 -q 64 -a 64 -T $st -z"
    echo "cmd B: rds-stress -r B -p 4100 &"
    echo "cmd A: rds-stress -r A -s B -p 4100 -t 1 -d 16 -q 64 -a 64 -T $st -z -o"
    echo "cmd B: rds-sink -s B:PORT -l TOTAL/SIZE -t 20 &"
    echo "cmd A: time rds-gen -s A:PORT -d B:PORT -m SIZE -l TOTAL --no-digest   # SIZE = 1024, 8192, 65536"
    echo "cmd # TOTAL in the VM: ${PERF_VM_TOTAL_1K:-8388608}, ${PERF_VM_TOTAL_8K:-25165824}, ${PERF_VM_TOTAL_64K:-50331648} bytes; on the host: ${PERF_HOST_TOTAL_1K:-268435456}, ${PERF_HOST_TOTAL_8K:-536870912}, ${PERF_HOST_TOTAL_64K:-1073741824} bytes"
} >"$work/meta.txt"

mkdir -p "$(dirname "$out")"
report() {
    { cat "$work/meta.txt"; echo "chart $chart_status"; } >"$work/meta-chart.txt"
    python3 "$here/scripts/perf/report.py" "$out" "$work/meta-chart.txt" "$work/vm.txt" "$work/host.txt" "$work/scale.txt"
}
report
svg="${out%.md}.svg"
if [ "$chart_status" = drawn ]; then
    if ! "$bin/perf-chart" "${out%.md}.json" "$svg"; then
        chart_status="not drawn: perf-chart failed"
        report
    fi
fi
echo "== wrote $out, ${out%.md}.json and ($chart_status) $svg ($(( $(date +%s) - start )) s)"
if [ "$vm_status" != ran ]; then
    echo "perf: ERROR: the VM rig part did not complete: $vm_status; $out has the host part only" >&2
    exit 1
fi
