#!/bin/bash
# Promise 3: the tmpfs holding the job's runtime directory ($XDG_RUNTIME_DIR on a 4 MiB tmpfs) filled
# with dd mid-run, then SIGTERM to node RANK. Expect: both 75 with a stop checkpoint.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
R=${1:-1}; mkdir "$S/shm"; mount -t tmpfs -o size=4m,mode=0700 tmpfs "$S/shm" || exit 1; export XDG_RUNTIME_DIR=$S/shm
trap 'cleanup; umount -l "$S/shm"' EXIT
P=$(free_port); start_node 0 "$P" "$S/ck" --grace 30; start_node 1 "$P" "$S/ck" --grace 30
wait_training "$S/ck" || exit 1; sleep 2
dd if=/dev/zero of="$S/shm/filler" bs=64k 2>&1 | tail -1; df -h "$S/shm" | tail -1
n0=$(ls "$S/ck" | grep -c checkpoint); V=$(eval echo \$NODE$R); t0=$(date +%s); kill -TERM "$V"
ended "$NODE0"; c0=$RC; ended "$NODE1"; c1=$RC
echo "node0 exit $c0, node1 exit $c1 in $(( $(date +%s) - t0 )) s"; loads "$S/ck"
grep "^cycle" "$S/node0.log" | tail -n 5; echo ---; grep "^cycle" "$S/node1.log" | grep -v "checkpoint . committed" | tail -n 9
