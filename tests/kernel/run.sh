#!/bin/bash
# Runs the conformance scenarios in a two-guest vmrig run (the same script
# on both guests). One guest loads the kernel's rds_tcp and runs
# conform.py, the other runs our node (rds-conform).
#
# Environment: CONFORM_KNODE (1 or 2: the guest running the kernel's RDS),
# CONFORM_BIN (directory with rds-conform and rds-ping), CONFORM_SCENARIOS
# (space-separated; default all), CONFORM_LIMIT (seconds each scenario may
# take; default per scenario, below). Every line the scenarios print that
# starts with RESULT/INFO/HASH is what kernel_tcp.rs parses.
set -u
here=$(cd "$(dirname "$0")" && pwd)
knode=${CONFORM_KNODE:?}
bin=${CONFORM_BIN:?}
scenarios=${CONFORM_SCENARIOS:-"ping tools datagrams batches congestion mprds reconnect resetall restart selftest"}
me=$VMRIG_SELF
peer=$VMRIG_PEER

if [ "$VMRIG_NODE" = "$knode" ]; then
    role=kernel
    modprobe rds_tcp || echo "RESULT setup both FAIL modprobe rds_tcp failed"
    python3 "$here/conform.py" warmup --self "$me" --peer "$peer"
else
    role=ours
fi
modprobe sch_netem 2>/dev/null || echo "INFO setup sch_netem not loadable"
echo "INFO setup $role on $me (peer $peer) kernel $(uname -r)"
barrier setup 120 || echo "INFO setup barrier timed out"

limit() {
    case $1 in
        ping) echo 90;;
        tools) echo 200;;
        datagrams) echo 200;;
        batches) echo 200;;
        congestion) echo 200;;
        mprds) echo 200;;
        reconnect) echo 200;;
        restart) echo 200;;
        selftest) echo 330;;
        *) echo 60;;
    esac
}

# A scenario still running 8 s before its time limit is about to be killed
# by `timeout`: print the RDS-TCP sockets (both sides) and our node's state
# (rds-info -v: connections, every path, send and retransmit queues,
# counters), so that a stall leaves more than rc=124 behind.
dump_before_timeout() {
    local pid=$1 secs=$(( $2 - 8 )) i
    for ((i = 0; i < secs; i++)); do
        kill -0 "$pid" 2>/dev/null || return
        sleep 1
    done
    kill -0 "$pid" 2>/dev/null || return
    echo "INFO $sc ($role) still running after $secs s: its state follows (DUMP lines)"
    [ $role = ours ] && timeout 5 "$bin/rds-info" -v 2>&1 | sed "s/^/DUMP $sc /"
    ss -tni '( sport = :16385 or dport = :16385 )' 2>&1 | sed "s/^/DUMP $sc ss /"
}

# Runs a scenario's command under the scenario's time limit ($lim), with
# the dump above; returns the command's exit code (124 on timeout). Waits
# for its own two jobs only: a bare `wait` would also wait for any other
# background job of this shell.
run_limited() {
    local cpid dpid rc
    timeout -k 5 "$lim" "$@" &
    cpid=$!
    dump_before_timeout $cpid "$lim" &
    dpid=$!
    wait $cpid
    rc=$?
    wait $dpid
    return $rc
}

for sc in $scenarios; do
    barrier "go-$sc" 400 || echo "INFO $sc start barrier timed out"
    export CONFORM_SC=$sc
    t0=$(date +%s.%N)
    lim=${CONFORM_LIMIT:-$(limit "$sc")}
    if [ $role = kernel ]; then
        run_limited python3 "$here/conform.py" "$sc" --self "$me" --peer "$peer"
        rc=$?
    elif [ "$sc" = restart ]; then
        # The first process stops itself once the kernel's burst is due,
        # we kill -9 it, then a new process takes the same address. A
        # small TCP receive window keeps part of the burst unacked.
        rmem=$(cat /proc/sys/net/ipv4/tcp_rmem)
        echo "4096 16384 32768" > /proc/sys/net/ipv4/tcp_rmem
        "$bin/rds-conform" restart-a --self "$me" --peer "$peer" &
        pid=$!
        for _ in $(seq 1 900); do
            st=$(awk '{print $3}' /proc/$pid/stat 2>/dev/null || echo X)
            [ "$st" = T ] || [ "$st" = X ] || [ "$st" = Z ] && break
            sleep 0.1
        done
        echo "INFO restart first process state $st"
        "$bin/rds-conform" barrier rs-3 90
        "$bin/rds-conform" barrier rs-4 90
        kill -9 $pid
        wait $pid 2>/dev/null
        echo "INFO restart first process killed (kill -9)"
        "$bin/rds-conform" barrier rs-5 90
        timeout -k 5 "$lim" "$bin/rds-conform" restart-b --self "$me" --peer "$peer"
        rc=$?
        echo "$rmem" > /proc/sys/net/ipv4/tcp_rmem
    elif [[ " ${CONFORM_PCAP:-} " == *" $sc "* ]]; then
        # Diagnostics: capture the kernel's side of the streams and tell
        # which kernel lanes each of our paths' connections carried.
        tcpdump -i eth0 -s 0 -w /tmp/$sc.pcap "tcp port 16385 and (src host $peer or tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0)" 2>/dev/null &
        tpid=$!
        sleep 1
        CONFORM_TRACE=1 timeout -k 5 "$lim" "$bin/rds-conform" "$sc" --self "$me" --peer "$peer" | tee /tmp/$sc.log
        rc=${PIPESTATUS[0]}
        kill $tpid; wait $tpid 2>/dev/null
        python3 "$here/pcap_lanes.py" /tmp/$sc.pcap /tmp/$sc.log | sed 's/^/LANES /'
    else
        run_limited "$bin/rds-conform" "$sc" --self "$me" --peer "$peer"
        rc=$?
    fi
    # A side that ended early makes the other side's barriers give up.
    [ "$rc" = 0 ] || : > "/vmrig/sync/ABORT.$sc"
    t1=$(date +%s.%N)
    echo "SCENARIO-END $sc $role rc=$rc secs=$(awk "BEGIN{printf \"%.1f\", $t1-$t0}")"
done
barrier end 120
echo "INFO end $role"
