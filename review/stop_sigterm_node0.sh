#!/bin/bash
# Promise 2: SIGTERM to node 0's `cycle run` only: both nodes end 75, a checkpoint of world 2 loads.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
P=$(free_port); start_node 0 "$P" "$S/ck"; start_node 1 "$P" "$S/ck"
wait_training "$S/ck" || exit 1; sleep 1
t0=$(date +%s.%N); kill -TERM "$NODE0"
ended "$NODE0"; c0=$RC; ended "$NODE1"; c1=$RC; t1=$(date +%s.%N)
echo "node0 exit $c0, node1 exit $c1, $(python -c "print(round($t1-$t0,1))") s"; loads "$S/ck"
tail -n 4 "$S/node0.log" "$S/node1.log"
