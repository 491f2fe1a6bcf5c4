#!/bin/bash
# Promise 4: another local process (any uid: TCP has no owner check) connects to node 0's
# liveness store, finds the job's token with list_keys (no file needed), and writes KEY.
# Usage: rogue_store.sh lost|stops|garbage. Expect (lost): the whole job ends 75 on a false verdict.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
P=$(free_port); start_node 0 "$P" "$S/ck"; start_node 1 "$P" "$S/ck"
wait_training "$S/ck" || exit 1; sleep 3
STORE_PORT=$(ss -ltnpH | grep "pid=$NODE0," | awk '{print $4}' | sed 's/.*://' | grep -v "^$P$" | head -1)
echo "node 0 listens on master port $P and store port $STORE_PORT"
python - "$STORE_PORT" "$1" <<'PY'
import datetime, json, sys, time, torch.distributed as d
s = d.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, wait_for_workers=False,
               timeout=datetime.timedelta(seconds=5))
keys = s.list_keys(); print("keys seen by a stranger:", keys)
prefix = next(k for k in keys if k.startswith("cycler/")).rsplit("/", 1)[0] + "/"
if sys.argv[2] == "lost":
    s.set(prefix + "lost", json.dumps({"node": 1, "why": "a stranger said so", "failed": False}))
elif sys.argv[2] == "stops":
    req = {"sequence": 99, "action": "checkpoint_and_exit", "reason": "stranger",
           "requested_at": time.time(), "deadline": None}
    s.append(prefix + "stops", json.dumps({"node": 1, "request": json.dumps(req)}) + "\n")
else:
    for k in keys: s.set(k, b"\xff not json")
print("written")
PY
t0=$(date +%s); timeout 60 bash -c "while kill -0 $NODE0 2>/dev/null || kill -0 $NODE1 2>/dev/null; do sleep 1; done"
kill -0 "$NODE0" 2>/dev/null && echo "job still training 60 s after the write" && { kill -TERM "$NODE0"; }
ended "$NODE0"; c0=$RC; ended "$NODE1"; c1=$RC
echo "node0 exit $c0, node1 exit $c1 (within $(( $(date +%s) - t0 )) s of the write)"
loads "$S/ck"; tail -n 3 "$S/node0.log" "$S/node1.log"
