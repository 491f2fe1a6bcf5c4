"""How many failed starts of the workers a job may restart: one rule for both places that
restart them (the supervisor on one node, torchrun's agent on every node of a multi-node job).

Only restarts without progress count: a committed checkpoint gives the whole budget back, so a
weeks-long job with a rare fault does not end after its third fault however much it trained in
between. ``--max-restarts N`` allows N restarts in a row without a checkpoint in between; the
next failure is a crash loop and ends the job.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class RestartBudget:
    """Counts failures since the last checkpoint and says when to give up."""

    max_restarts: int
    """Restarts allowed after failures without a new checkpoint in between (0: none)."""
    crash_loop_limit: int | None = None
    """Failures in a row without a new checkpoint that end the job whatever ``max_restarts``
    says (``None``: ``max_restarts + 1``, the failure no restart is left for)."""
    failures_without_progress: int = 0
    start_error: str | None = None
    """The error of the last failure when it came before the first step: the same one again,
    with no checkpoint in between, is a start that fails the same way every time."""

    def backoff(self, first: float, longest: float = 60.0) -> float:
        """The delay before the restart of the failure just counted: ``first``, doubling with
        each failure without a checkpoint in between, at most ``longest``."""
        return min(first * 2.0 ** max(self.failures_without_progress - 1, 0), longest)

    def progress(self) -> None:
        """A checkpoint was committed: the whole budget is back."""
        self.failures_without_progress = 0
        self.start_error = None

    def failure(self, start_error: str | None = None) -> str | None:
        """Count one failure; ``None`` to restart, else why the job must end instead.
        ``start_error``: the failing worker's traceback when it failed before its first step;
        the same one twice in a row ends the job (a third start would fail the same way: a
        CUDA call on a CPU node, a torn checkpoint of the script's own)."""
        self.failures_without_progress += 1
        count = self.failures_without_progress
        previous, self.start_error = self.start_error, start_error
        failed = (f"the workers failed {count} times in a row without committing a checkpoint"
                  " (crash loop)")
        if self.crash_loop_limit is not None and count >= self.crash_loop_limit:
            return failed
        if count > self.max_restarts == 0:
            return "the workers failed, and --max-restarts 0 allows no restart"
        if count > self.max_restarts:
            return (f"{failed}: all {self.max_restarts} restarts (--max-restarts) since the last "
                    "checkpoint are used up")
        if start_error is not None and start_error == previous:
            return ("the workers failed twice before their first step with the same error, and "
                    "no checkpoint in between: the start fails the same way each time, so it is "
                    "not tried a third time")
        return None
