#!/bin/bash
# Guest side of preload/tests/qperf_vm.rs (the same script on both guests of
# a two-guest vmrig run). The guest numbered QPERF_KNODE loads the kernel's
# rds_tcp and runs Debian's qperf on it; the other runs the same qperf with
# LD_PRELOAD=$QPERF_SHIM (our RDS). Both directions: the kernel's qperf
# serves and ours is the client, then ours serves and the kernel's is the
# client. Prints, for each client run:
#     QPERF <client: ours|kernel> <test> <value> <unit>
# or  QPERF-FAIL <client> <test> <what qperf said>
# and DIAG lines for a failure report: the kernel's TCP sockets of RDS
# (ss) 1.2 s into its rds_lat runs, and, while ours serves, the last two
# snapshots of our serving engine (rds-info: paths, queues, counters; set
# QPERF_INFO to the rds-info binary) and its TCP sockets.
set -u
knode=${QPERF_KNODE:?}
shim=${QPERF_SHIM:?}
peer=$VMRIG_PEER
port=19765
if [ "$VMRIG_NODE" = "$knode" ]; then
    role=kernel
    modprobe rds_tcp || echo "QPERF-FAIL kernel setup modprobe rds_tcp failed"
else
    role=ours
fi
echo "INFO qperf $role on $VMRIG_SELF (peer $peer)"
q() {
    if [ $role = ours ]; then LD_PRELOAD=$shim qperf "$@"; else qperf "$@"; fi
}
# qperf's server sends its second port before it listens on it: a quick
# client now and then gets "Connection refused" (2 of 10 runs in one boot
# under TCG); that try is repeated, up to 8 times.
info=${QPERF_INFO:-}
# Seconds per run. The kernel's rds_bw against our server gets 5: each
# qperf server child is a new RDS node (a process is one; the kernel's
# node outlives its processes), and the kernel reaches it only through its
# reconnect backoff (up to 1 s per path after the previous process's
# connections closed) and then the multipath handshake, all inside the
# run's window, which starts before any connection exists. With 2 s, 4 of
# 6 boots in a row of a rig 2-3x slower than before measured below 1 MB/s
# (0, 0, 0.13, 0.99), the others 1.1 and 2.3; with 5 s, 2.7-3.2 in 3.
secs() { if [ $role = kernel ] && [ "$1" = rds_bw ]; then echo 5; else echo 2; fi; }
rds_ss() { ss -tn state all exclude time-wait '( sport = :16385 or dport = :16385 )' 2>&1; }
client() {
    for t in rds_bw rds_lat; do
        for try in 1 2 3 4 5 6 7 8; do
            snap=
            if [ $role = kernel ] && [ $t = rds_lat ]; then
                (sleep 1.2; rds_ss > /tmp/ss-mid.txt) &
                snap=$!
            fi
            out=$(q "$peer" -lp $port -t $(secs $t) -to 15 "$t" 2>&1)
            rc=$?
            [ -n "$snap" ] && wait $snap && sed "s/^/DIAG kernel ss try $try: /" /tmp/ss-mid.txt
            if [ $rc = 0 ] || ! echo "$out" | grep -q "Connection refused"; then break; fi
            sleep 0.5
        done
        fig=$(echo "$out" | awk '$1 == "bw" || $1 == "latency" {print $3, $4}')
        if [ $rc = 0 ] && [ -n "$fig" ]; then
            echo "QPERF $role $t $fig"
        else
            echo "QPERF-FAIL $role $t exit $rc: $(echo "$out" | tr '\n' ' ')"
        fi
    done
}
# Snapshots of our serving engines, the last two that found one kept
# (the last test's engine, near its end) until /tmp/sampler-stop appears.
sampler() {
    local i=0
    while [ ! -e /tmp/sampler-stop ]; do
        { echo "at $(date +%T.%N)"; timeout 10 "$info" -n -v -T -s -t 2>&1
          timeout 10 "$info" -c 2>&1 | awk 'NF == 2 && $2 != "0"'; rds_ss; } > /tmp/sample.new
        if grep -q "RDS node:" /tmp/sample.new; then
            mv /tmp/sample.new /tmp/sample.$((i % 2))
            i=$((i + 1))
        fi
        sleep 0.2
    done
}
barrier up 120
for server in kernel ours; do
    if [ $role = $server ]; then
        q -lp $port > /tmp/qperf-server.log 2>&1 &
        spid=$!
        sleep 1
        if [ $role = ours ] && [ -x "$info" ]; then
            sampler &
            sampler_pid=$!
        fi
    fi
    barrier "serving-$server" 120
    [ $role != $server ] && client
    barrier "done-$server" 300
    if [ $role = $server ]; then
        kill $spid 2>/dev/null
        wait $spid 2>/dev/null
        sed 's/^/INFO qperf server: /' /tmp/qperf-server.log
        if [ -n "${sampler_pid:-}" ]; then
            touch /tmp/sampler-stop
            wait $sampler_pid
            for f in $(ls -tr /tmp/sample.[01] 2>/dev/null); do sed 's/^/DIAG ours: /' $f; done
        fi
    fi
done
barrier end 60
