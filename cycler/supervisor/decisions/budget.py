"""How many failed starts of the workers a job may restart: one rule for both places that
restart them (the supervisor on one node, torchrun's agent on every node of a multi-node job).

Only restarts without progress count: a committed checkpoint gives the whole budget back, so a
weeks-long job with a rare fault does not end after its third fault however much it trained in
between. ``--max-restarts N`` allows N restarts in a row without a checkpoint in between; the
next failure is a crash loop and ends the job.
"""

from __future__ import annotations

from dataclasses import dataclass

from cycler.supervisor.decisions.failure_kinds import FailureKind, WorkerFailure


@dataclass(kw_only=True)
class RestartBudget:
    """Counts failures since the last checkpoint and says when to give up."""

    max_restarts: int
    """Restarts allowed after failures without a new checkpoint in between (0: none)."""
    crash_loop_limit: int | None = None
    """Failures in a row without a new checkpoint that end the job whatever ``max_restarts``
    says (``None``: ``max_restarts + 1``, the failure no restart is left for)."""
    failures_without_progress: int = 0
    repeatable: str | None = None
    """The signature of the last failure when a repeat of it would end the job (the script's
    code, or any failure before the first step): the same one again, with no checkpoint in
    between, is a start that fails the same way every time."""

    def backoff(self, first: float, longest: float = 60.0) -> float:
        """The delay before the restart of the failure just counted: ``first``, doubling with
        each failure without a checkpoint in between, at most ``longest``."""
        return min(first * 2.0 ** max(self.failures_without_progress - 1, 0), longest)

    def progress(self) -> None:
        """A checkpoint was committed: the whole budget is back."""
        self.failures_without_progress = 0
        self.repeatable = None

    def failure(self, failed: WorkerFailure | None = None,
                before_first_step: bool | None = None) -> str | None:
        """Count one failure; ``None`` to restart, else why the job must end instead.

        ``failed``: what the failing worker printed (:mod:`.failure_kinds`). The same error in
        the script's code twice in a row ends the job, and so does the same failure of any
        other kind twice before the first step (a CUDA call on a CPU node, a torn checkpoint
        of the script's own): a third start would fail the same way. A resource the OS refused
        (a missing file, a port in use) is never ended for repeating: it is restarted with
        backoff while the budget lasts, and the end names it."""
        self.failures_without_progress += 1
        count = self.failures_without_progress
        previous, self.repeatable = self.repeatable, _repeatable(failed, before_first_step)
        if self.crash_loop_limit is not None and count >= self.crash_loop_limit:
            return _used_up(f"the workers failed {count} times in a row without committing a "
                            "checkpoint (crash loop)", failed)
        if count > self.max_restarts == 0:
            return _used_up("the workers failed, and --max-restarts 0 allows no restart",
                            failed)
        if count > self.max_restarts:
            return _used_up(f"the workers failed {count} times in a row without committing a "
                            f"checkpoint (crash loop): all {self.max_restarts} restarts "
                            "(--max-restarts) since the last checkpoint are used up", failed)
        if self.repeatable is not None and self.repeatable == previous:
            return _the_same_twice(failed, before_first_step)
        return None


def _repeatable(failed: WorkerFailure | None, before_first_step: bool | None) -> str | None:
    if failed is None or failed.kind is FailureKind.RESOURCE:
        return None
    if failed.kind is FailureKind.SCRIPT or before_first_step:
        return failed.signature or failed.error
    return None


def _used_up(reason: str, failed: WorkerFailure | None) -> str:
    """``reason``, led by the resource that made the last start fail, if one did."""
    if failed is None or failed.resource is None:
        return reason
    return f"{failed.resource}: {reason}"


def _the_same_twice(failed: WorkerFailure | None, before_first_step: bool | None) -> str:
    assert failed is not None
    when = "before their first step " if before_first_step else ""
    if failed.kind is FailureKind.SCRIPT:
        return (f"the workers failed twice {when}with the same error in the script's code "
                f"({failed.error}), and no checkpoint in between: a third start would fail "
                "the same way, so it is not tried; fix the script and run again")
    return ("the workers failed twice before their first step with the same error, and no "
            "checkpoint in between: the start fails the same way each time, so it is not tried "
            "a third time")
