"""A checkpoint root that can freeze: Debian's ``bindfs`` over a scratch directory, its daemon in
the foreground so that SIGSTOP stops every call on the mount (as a parallel filesystem's stall
does) and SIGCONT lets them go on. Shared by tests/integration/test_frozen_root.py and
benchmarks/bench_frozen_root.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def fuse_missing() -> str | None:
    """Why this machine cannot mount bindfs, or None where it can."""
    if os.geteuid() != 0:
        return "mounting a FUSE filesystem needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: FUSE is missing on this machine"
    if shutil.which("bindfs") is None:
        return "bindfs is not installed (apt-get install bindfs)"
    return None


@contextlib.contextmanager
def freezable_mount(base: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """``base/mount``, a bindfs mount of ``base/source``, and its daemon (ours to stop and
    continue); continued, unmounted and ended afterwards, whatever happened."""
    source, mount = base / "source", base / "mount"
    source.mkdir()
    mount.mkdir()
    daemon = subprocess.Popen(["bindfs", "-f", str(source), str(mount)])
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mount):
            assert daemon.poll() is None and time.monotonic() < deadline, "bindfs did not mount"
            time.sleep(0.1)
        yield mount, daemon
    finally:
        daemon.send_signal(signal.SIGCONT)
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        daemon.terminate()
        daemon.wait(30)


def frozen(path: Path) -> bool:
    """Whether a stat of ``path`` hangs (the FUSE daemon answers nothing). A stat that hangs is
    killed and not waited for: it may sit uninterruptible (state D) until the daemon answers
    again, and ``subprocess.run``'s wait after its timeout then blocked the test for good (18
    minutes in a CI run, the daemon stopped)."""
    probe = subprocess.Popen(["stat", str(path)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        probe.wait(timeout=3)
    except subprocess.TimeoutExpired:
        probe.kill()  # not waited for: subprocess reaps an unwaited child at a later Popen
        return True
    return False
