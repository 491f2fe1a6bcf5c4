"""torchrun as ``cycle run`` starts it: torch's own launcher, under the supervisor's orders.

``python -m cycler.supervisor.launcher ARGS`` is ``torchrun ARGS`` (it calls torchrun's ``main``
with the same arguments) with two differences:

- The stop signals (``$CYCLER_STOP_SIGNALS``) that reach torchrun directly, as on clusters that
  signal every process of a job, do nothing: torchrun is told to handle only SIGQUIT
  (``--signals-to-handle``, before the user's own, which wins) and the others get a handler that
  only says so. Tearing the workers down is the supervisor's decision, and it ends torchrun
  itself with SIGKILL when it must.
- When workers end during a stop that a supervisor of the job asked for (a
  ``checkpoint_and_exit`` in any node's control file since this launcher started), torchrun's
  teardown warnings and its ``ChildFailedError`` / ``SignalException`` traceback are replaced by
  one line: a worker ended by the forwarded SIGTERM is the stop working, not a crash. Any other
  failure is reported by torchrun exactly as usual.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from cycler.checkpoint.layout import CheckpointLayout
from cycler.control import stop_requested_since
from cycler.environment import ENV_CHECKPOINT_DIR
from cycler.stray_signals import ignore_stray, stop_signals


class StopSeen:
    """Whether a supervisor of this job asked for a stop since ``since`` (wall-clock time)."""

    def __init__(self, root: str | None, since: float) -> None:
        self._layout = CheckpointLayout(root) if root else None
        self._since = since

    def __call__(self) -> bool:
        if self._layout is None:
            return False
        return stop_requested_since(self._layout.control_paths(), self._since)


class _QuietDuringStop(logging.Filter):
    def __init__(self, stopping: StopSeen) -> None:
        super().__init__()
        self._stopping = stopping

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name.startswith("torch.distributed.elastic") and self._stopping())


def main(argv: list[str] | None = None) -> None:
    """Run torchrun with ``argv`` (default: this process's arguments)."""
    stopping = StopSeen(os.environ.get(ENV_CHECKPOINT_DIR), time.time())
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    quiet = _QuietDuringStop(stopping)
    for name in ("", "torch", "torch.distributed"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(quiet)
    ignore_stray(stop_signals())
    arguments = sys.argv[1:] if argv is None else argv
    try:
        torchrun.main(["--signals-to-handle", "SIGQUIT", *arguments])
    except (ChildFailedError, SignalException) as error:
        if not stopping():
            raise
        sys.stderr.write(f"torchrun: {_summary(error)} during the stop cycle run asked for\n")
        sys.exit(1)


def _summary(error: Exception) -> str:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(error, ChildFailedError):
        codes = sorted({failure.exitcode for failure in error.failures.values()})
        return f"workers ended with exit code {', '.join(map(str, codes))}"
    return f"torchrun got {error}"


if __name__ == "__main__":
    main()
