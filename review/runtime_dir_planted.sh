#!/bin/bash
# Promise 3: another local user (rogue, made with useradd) plants the victim's runtime base
# before the victim's job starts: a directory of theirs, a symlink to theirs, a FIFO; then the
# victim's own base made group/world-writable; then XDG_RUNTIME_DIR pointing at a public place.
# Expect each: refused before start, one line naming what to fix (exit 2), or a private base used.
WT=$(cd "$(dirname "$0")/.." && pwd); S=$(mktemp -d); . "$WT/review/lib.sh"
id rogue >/dev/null 2>&1 || useradd -M rogue
chmod 755 "$S"; printf 'print("trained")\n' >"$S/t.py"
M=$S/shm; mkdir "$M"; chmod 1777 "$M"; B=$M/cycler-$(id -u)-run   # --memory-dir's tmpfs stand-in
one() { echo "== $1"; timeout 120 python -m cycler_cli run --nproc-per-node 1 --memory-dir "$M" \
  --checkpoint-dir "$S/ck" --no-requeue "$S/t.py" 2>&1 | grep -v "^cycle: supervising\|^cycle: started" | tail -n 2 | cut -c1-220
  echo "   exit ${PIPESTATUS[0]}"; }
runuser -u rogue -- mkdir "$B"; one "rogue's directory at the base"; rm -rf "$B"
runuser -u rogue -- mkdir "$M/theirs"; runuser -u rogue -- ln -s "$M/theirs" "$B"; one "rogue's symlink at the base"; rm -rf "$B"
runuser -u rogue -- mkfifo "$B"; one "rogue's FIFO at the base"; rm -f "$B"
mkdir -m 700 "$B"; chmod 777 "$B"; one "own base, mode 777"; rm -rf "$B"
XDG_RUNTIME_DIR=/tmp M=/dev/shm one "XDG_RUNTIME_DIR=/tmp (public), no --memory-dir" 2>&1
echo "   runtime dirs made: $(ls -d /dev/shm/cycler-$(id -u)-run /tmp/cycler-run 2>/dev/null)"
