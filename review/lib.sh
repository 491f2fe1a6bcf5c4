# Shared helpers of the issue-36 hostile repros: two `cycle run` nodes of one job on 127.0.0.1.
# Source it; set WT, S (scratch) first. Every process started is ours, ended by pid.
set -u
export PYTHONPATH=${WT:?} OMP_NUM_THREADS=1
EXAMPLE=$WT/examples/train.py
TRAIN=(--epochs 50 --samples 4096 --hidden 16 --checkpoint-every 40 --step-delay 0.02)
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start_node RANK PORT ROOT [extra cycle run args...]: pid in NODE<RANK>, output in $S/node<RANK>.log
start_node() {
  local rank=$1 port=$2 root=$3; shift 3
  nice -n 10 setsid python -m cycler_cli run --nnodes 2 --node-rank "$rank" --nproc-per-node 1 \
    --master-addr 127.0.0.1 --master-port "$port" --checkpoint-dir "$root" --no-requeue "$@" \
    "$EXAMPLE" "${TRAIN[@]}" >"$S/node$rank.log" 2>&1 &
  eval "NODE$rank=$!"
}
wait_training() {  # until node 0's rank prints a training line and a first checkpoint exists
  for _ in $(seq 600); do
    grep -q "training from step" "$S/node0.log" 2>/dev/null && [ -n "$(ls "$1" 2>/dev/null | grep -v '^\.')" ] && return 0
    sleep 0.2
  done; echo "never trained"; return 1
}
ended() { wait "$1"; RC=$?; }
loads() {  # the newest committed checkpoint of ROOT loads (manifest + step)
  python - "$1" <<'PY'
import sys
from cycler import latest_checkpoint, read_manifest
c = latest_checkpoint(sys.argv[1])
print("latest:", c and c.name, "world", c and read_manifest(c).world_size)
PY
}
cleanup() { for p in ${NODE0:-} ${NODE1:-}; do kill -9 -- -"$p" 2>/dev/null; done; }
trap cleanup EXIT
survivors() {  # processes whose environment names this scratch dir (the job's, on any node)
  for e in /proc/[0-9]*/environ; do
    grep -qa "$S" "$e" 2>/dev/null && { p=${e#/proc/}; p=${p%/environ}; [ "$p" != $$ ] && echo "  survivor $p $(tr '\0' ' ' </proc/$p/cmdline | cut -c1-100)"; }
  done; true
}
