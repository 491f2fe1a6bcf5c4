"""Whether this process is in a torch.distributed process group: the one test every part asks."""

from __future__ import annotations

import functools


def in_process_group() -> bool:
    """Whether ``torch.distributed`` is available and its default group initialized."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


_SETTLE_SECONDS = 0.05


@functools.cache  # once per process
def settle_gloo_threads_at_exit() -> None:
    """At the interpreter's exit, give gloo's worker threads a moment to let go of the works
    they finished, while they can still take the GIL.

    gloo's worker thread drops its reference to a finished work a moment after ``wait()``
    returns; when that reference holds a Python tensor (StepControl's exchange, DDP's gradient
    buckets) and the process is already finalizing, the thread cannot take the GIL and
    libstdc++ aborts the process ("terminate called without an active exception", exit -6)
    after all its work was done. An ``atexit`` hook runs before finalization: a short sleep
    there, the GIL released, lets the thread finish. Registered once, by StepControl and the
    savers.
    """
    import atexit

    atexit.register(_settle)


def _settle() -> None:
    import sys
    import time

    if "torch.distributed" in sys.modules:
        time.sleep(_SETTLE_SECONDS)
