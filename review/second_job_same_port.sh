#!/bin/bash
# Promise 4: job A trains on 2 nodes; a second job B (another root) is started on A's master port:
# first B's node 0 (its port is taken), then B's node 1 alone. Expect: B refused or failing with
# a clear line; A unharmed (trains on, then a SIGTERM ends it 75 with a checkpoint).
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
P=$(free_port); start_node 0 "$P" "$S/ck"; start_node 1 "$P" "$S/ck"
wait_training "$S/ck" || exit 1; sleep 2
for r in 0 1; do
  echo "== job B node $r on port $P"
  timeout 60 python -m cycler_cli run --nnodes 2 --node-rank $r --nproc-per-node 1 --master-addr 127.0.0.1 \
    --master-port "$P" --checkpoint-dir "$S/ckB" --no-requeue --node-timeout 10 "$EXAMPLE" "${TRAIN[@]}" 2>&1 \
    | grep "^cycle" | tail -n 3 | cut -c1-220; echo "   exit ${PIPESTATUS[0]}"
done
for n in 0 1; do kill -0 $(eval echo \$NODE$n) 2>/dev/null || echo "job A node$n ended meanwhile"; done
kill -TERM "$NODE0"; ended "$NODE0"; c0=$RC; ended "$NODE1"; c1=$RC
echo "job A: node0 exit $c0, node1 exit $c1"; loads "$S/ck"
grep "^cycle" "$S/node1.log" | grep -v "checkpoint [0-9]* committed" | tail -n 4 | cut -c1-200
