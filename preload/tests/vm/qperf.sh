#!/bin/bash
# Guest side of preload/tests/qperf_vm.rs (the same script on both guests of
# a two-guest vmrig run). The guest numbered QPERF_KNODE loads the kernel's
# rds_tcp and runs Debian's qperf on it; the other runs the same qperf with
# LD_PRELOAD=$QPERF_SHIM (our RDS). Both directions: the kernel's qperf
# serves and ours is the client, then ours serves and the kernel's is the
# client. Prints, for each client run:
#     QPERF <client: ours|kernel> <test> <value> <unit>
# or  QPERF-FAIL <client> <test> <what qperf said>
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
client() {
    for t in rds_bw rds_lat; do
        for try in 1 2 3 4 5 6 7 8; do
            out=$(q "$peer" -lp $port -t 2 -to 15 "$t" 2>&1)
            rc=$?
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
barrier up 120
for server in kernel ours; do
    if [ $role = $server ]; then
        q -lp $port > /tmp/qperf-server.log 2>&1 &
        spid=$!
        sleep 1
    fi
    barrier "serving-$server" 120
    [ $role != $server ] && client
    barrier "done-$server" 300
    if [ $role = $server ]; then
        kill $spid 2>/dev/null
        wait $spid 2>/dev/null
        sed 's/^/INFO qperf server: /' /tmp/qperf-server.log
    fi
done
barrier end 60
