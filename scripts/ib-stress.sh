#!/usr/bin/env bash
# RDS over Soft-RoCE (rxe) in two VM-rig guests: our rds-stress on our IB
# transport, then the kernel's rds_rdma with the rig's rds-pingpong (Python
# AF_RDS echo; qperf's rds_bw fails to connect in these guests), in the same
# boot: one request in flight, REQ_BYTES each way, round-trip times compared.
#
#   scripts/ib-stress.sh [SECONDS] [REQ_BYTES]      (default 5 s, 4096 bytes)
#
# Builds the tools with --features ib (needs libibverbs-dev, librdmacm-dev,
# libclang-dev, pkg-config: scripts/setup.sh installs them). The guests run
# under software emulation, so absolute figures are far below real hardware.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
req=${2:-4096}
rig=${VMRIG_DIR:-}
for d in "$rig" ../shared/vmrig /work/shared/vmrig; do
    [ -n "$d" ] && [ -x "$d/vmrig" ] && rig=$d && break
done
[ -x "$rig/vmrig" ] || { echo "SKIP: ib-stress: no VM rig found (set VMRIG_DIR)"; exit 0; }
cargo build --release -q -p rds-tools --features ib --bin rds-stress
exec "$rig/vmrig" run -n 2 -t 300 -e SECS="$secs" -e REQ="$req" -c '
set -u
modprobe rdma_rxe; modprobe rdma_ucm; modprobe ib_uverbs
rdma link add rxe0 type rxe netdev eth0
barrier rxe 60
bin=$PWD/target/release
if [ "$VMRIG_NODE" = 1 ]; then
    timeout $((SECS + 60)) $bin/rds-stress -r $VMRIG_SELF -p 4000 --transport ib -z > /tmp/passive.log 2>&1 &
    passive=$!
    barrier ours-ready 60
    barrier ours-done $((SECS + 90))
    kill $passive 2>/dev/null; wait $passive 2>/dev/null
    modprobe rds_rdma
    rds-pingpong server $VMRIG_SELF 4000 > /dev/null 2>&1 &
    server=$!
    sleep 1
    barrier kernel-ready 60
    barrier kernel-done $((SECS * 2 + 90))
    kill $server 2>/dev/null; true
else
    barrier ours-ready 60
    sleep 1
    echo "== ours: rds-stress --transport ib -q $REQ -a $REQ -d 1 -t 1 -T $SECS (over rxe)"
    timeout $((SECS + 60)) $bin/rds-stress -r $VMRIG_SELF -s $VMRIG_PEER -p 4000 --transport ib -q $REQ -a $REQ -d 1 -t 1 -T $SECS
    barrier ours-done 60
    modprobe rds_rdma
    barrier kernel-ready 60
    sleep 1
    echo "== kernel: rds-pingpong client, 200 x $REQ B echoed (rds_rdma over rxe)"
    timeout $((SECS * 2 + 60)) rds-pingpong client $VMRIG_SELF $VMRIG_PEER 4000 200 $REQ
    barrier kernel-done 60
fi
'
