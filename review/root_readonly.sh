#!/bin/bash
# Promise 5: the checkpoint root made unwritable mid-run: MODE=ro remounts its bind mount read-only
# (refused, EBUSY, while files on it are open for writing); MODE=full (default) fills its tmpfs with dd, then (after WAIT s)
# SIGTERM to node 1. Expect: no hang, a documented exit code and one clear line on each node;
# the last committed checkpoint still loads.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
WAIT=${WAIT:-15}; MODE=${MODE:-full}; mkdir "$S/real" "$S/ck"
if [ "$MODE" = ro ]; then mount --bind "$S/real" "$S/ck"; else mount -t tmpfs -o size=64m,mode=0755 tmpfs "$S/ck"; fi || exit 1
trap 'cleanup; umount -l "$S/ck"' EXIT
P=$(free_port); start_node 0 "$P" "$S/ck" --grace 30 --node-timeout 20; start_node 1 "$P" "$S/ck" --grace 30 --node-timeout 20
wait_training "$S/ck" || exit 1; sleep 2
if [ "$MODE" = ro ]; then mount -o remount,bind,ro "$S/ck" && echo "root is read-only now"; else dd if=/dev/zero of="$S/ck/filler" bs=1M 2>&1 | tail -n 1; fi; t0=$(date +%s)
sleep "$WAIT"; for n in 0 1; do kill -0 $(eval echo \$NODE$n) 2>/dev/null || echo "node$n ended before the SIGTERM"; done
kill -TERM "$NODE1" 2>/dev/null
ended "$NODE0"; c0=$RC; ended "$NODE1"; c1=$RC
echo "node0 exit $c0, node1 exit $c1, $(( $(date +%s) - t0 )) s after ro"; loads "$S/ck"
grep "^cycle\|^cycler" "$S/node0.log" | grep -v "checkpoint [0-9]* committed" | tail -n 6 | cut -c1-250; echo ---
grep "^cycle\|^cycler" "$S/node1.log" | grep -v "checkpoint [0-9]* committed" | tail -n 6 | cut -c1-250
