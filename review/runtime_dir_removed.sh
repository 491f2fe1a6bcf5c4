#!/bin/bash
# Promise 3: the job's runtime directory removed mid-run (as logind removes $XDG_RUNTIME_DIR,
# or RemoveIPC=yes clears /dev/shm, when the user's last session logs out), then after WAIT s a
# SIGTERM to node RANK. Expect: no false hang/loss verdict, both nodes 75 with a checkpoint.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
R=${1:-1}; WAIT=${WAIT:-30}
P=$(free_port); start_node 0 "$P" "$S/ck"; start_node 1 "$P" "$S/ck"
wait_training "$S/ck" || exit 1; sleep 2
DIRS=$(tr '\0' '\n' </proc/$NODE0/environ | grep -c . >/dev/null; for n in $NODE0 $NODE1; do for c in $(pgrep -P $(pgrep -P $n | head -1) 2>/dev/null) $(pgrep -P $n); do tr '\0' '\n' </proc/$c/environ 2>/dev/null | sed -n 's/^CYCLER_NODE_DIR=//p'; done; done | sort -u)
echo "removing: $DIRS"; rm -rf $DIRS
sleep "$WAIT"; ls -d $DIRS 2>&1 | sed 's/^/  after: /'
V=$(eval echo \$NODE$R); kill -TERM "$V"
ended "$NODE0"; c0=$RC; ended "$NODE1"; c1=$RC
echo "node0 exit $c0, node1 exit $c1"; loads "$S/ck"
grep "^cycle" "$S/node0.log" | tail -n 6; echo ---; grep "^cycle" "$S/node1.log" | tail -n 6
