#!/bin/bash
# Kernel-to-kernel baseline of the stream scenarios: the kernel's RDS on
# both guests; node 1 runs the kernel side of conform.py, node 2 plays our
# node's part with the kernel's sockets (the *-mirror scenarios). Prints
# the same GAPS/RESULT lines as run.sh.
#   vmrig run -n 2 -e CONFORM_BIN=$PWD/target/release -- bash tests/kernel/baseline.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
modprobe rds_tcp
python3 "$here/conform.py" warmup --self "$VMRIG_SELF" --peer "$VMRIG_PEER"
barrier setup 120
for sc in ${BASELINE_SCENARIOS:-resetall}; do
    export CONFORM_SC=$sc
    barrier "go-$sc" 400
    if [ "$VMRIG_NODE" = 1 ]; then
        timeout -k 5 200 python3 "$here/conform.py" "$sc" --self "$VMRIG_SELF" --peer "$VMRIG_PEER"
    else
        timeout -k 5 200 python3 "$here/conform.py" "$sc-mirror" --self "$VMRIG_SELF" --peer "$VMRIG_PEER"
    fi
    [ $? = 0 ] || : > "/vmrig/sync/ABORT.$sc"
done
barrier end 120
