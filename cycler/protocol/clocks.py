"""How long ago a process started, from the kernel's own record (no torch, no psutil).

``cycle status`` counts a run from the first moment of the ``cycle run`` process, not from its
first event (the imports and checks before it are part of what a restart costs), and a worker's
start from its ``exec``, not from its first line of Python.
"""

from __future__ import annotations

import os
import time


def process_age(pid: int | str = "self") -> float | None:
    """Seconds since process ``pid`` started (``None`` where ``/proc`` does not say).

    Linux counts a process's start (field 22 of ``/proc/<pid>/stat``, in clock ticks: 10 ms)
    on the boot clock, which keeps counting through a suspend, so it is read against
    ``CLOCK_BOOTTIME``.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
