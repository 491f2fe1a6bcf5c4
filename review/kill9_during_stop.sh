#!/bin/bash
# Promise 5: SIGTERM to node 1, then kill -9 of node 0's `cycle run` DELAY s later (during the
# stop). Expect: node 1 ends 75 within --node-timeout (+ a few s); the newest committed
# checkpoint loads; no process of the job survives.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
P=$(free_port); start_node 0 "$P" "$S/ck" --node-timeout 10; start_node 1 "$P" "$S/ck" --node-timeout 10
wait_training "$S/ck" || exit 1; sleep 2
kill -TERM "$NODE1"; sleep "${DELAY:-0.3}"; kill -9 "$NODE0"; t0=$(date +%s)
ended "$NODE1"; c1=$RC; ended "$NODE0"; c0=$RC
echo "node0 exit $c0 (killed), node1 exit $c1 after $(( $(date +%s) - t0 )) s"; sleep 3; survivors; loads "$S/ck"
grep "^cycle" "$S/node1.log" | grep -v "checkpoint [0-9]* committed" | tail -n 5 | cut -c1-220
