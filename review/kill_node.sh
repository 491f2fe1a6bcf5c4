#!/bin/bash
# Promise 2/5: kill -9 (or SIGSTOP for --node-timeout + 10 s, then SIGCONT) of ONE node's
# `cycle run` supervisor only (not its workers) mid-training. Usage: kill_node.sh RANK kill|stop
# Expect: the other node ends 75 within --node-timeout (+ a few s); a checkpoint loads; no
# worker of either node survives.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
R=$1 MODE=$2 TIMEOUT=${TIMEOUT:-10}; O=$((1 - R))
P=$(free_port); start_node 0 "$P" "$S/ck" --node-timeout "$TIMEOUT"; start_node 1 "$P" "$S/ck" --node-timeout "$TIMEOUT"
wait_training "$S/ck" || exit 1; sleep ${DELAY:-2}
V=$(eval echo \$NODE$R); W=$(eval echo \$NODE$O)
t0=$(date +%s.%N)
if [ "$MODE" = kill ]; then kill -9 "$V"; else kill -STOP "$V"; fi
if [ "$MODE" = stop ]; then sleep $((TIMEOUT + 10)); kill -CONT "$V"; fi
ended "$W"; cw=$RC; t1=$(date +%s.%N); ended "$V"; cv=$RC
echo "victim node$R exit $cv; other node$O exit $cw after $(python -c "print(round($t1-$t0,1))") s"
sleep 3; echo "survivors:"; survivors
loads "$S/ck"; tail -n 5 "$S/node0.log" "$S/node1.log"
