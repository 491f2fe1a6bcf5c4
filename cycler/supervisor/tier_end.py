"""The supervisor's side of the memory tier (docs/memory-tier.md): its record at the start, and
at a run's end the verdict on where the newest state is, before anything is said or requeued.

The core decides an exit line and, after a stop under Slurm, a requeue, before the workers are
reaped. With the memory tier both wait for :func:`cycler.checkpoint.job_end.finish_job`. After a
stop whose checkpoint did not reach the checkpoint root in the workers' persist, the supervisor
copies it there itself in what is left of the stop's deadline, less
:data:`STOP_COPY_MARGIN_SECONDS`: landed, the stop ends 75 and is requeued; not (no time, the
deadline came first, the copy failed), it ends with exit 74 and no requeue, since a requeued job
starts on another node, from the older checkpoint in the root, while the newest state is in this
node's memory.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any

from cycler.checkpoint import job_end
from cycler.checkpoint.layout import CheckpointName
from cycler.protocol.events import describe
from cycler.supervisor.options import RunOptions
from cycler.supervisor.vocabulary import Event, Log, Requeue, SignalReceived, SupervisorAction

STOP_COPY_MARGIN_SECONDS = 1.0
"""Kept between the end of the supervisor's copy after a stop and the stop's deadline: time to
requeue and exit before the job is killed."""

Recorder = Callable[..., None]
"""The shell's ``_record(event, warning=False, **fields)``."""


class TierEnd:
    """Holds the exit line and the requeue of a run with the memory tier until the end of job
    says where the newest state is; does nothing without the tier."""

    def __init__(self, options: RunOptions, record: Recorder,
                 requeue: Callable[[], None]) -> None:
        self._options = options
        self._memory = options.memory_layout
        self._record = record
        self._requeue = requeue
        self._exit_said: Log | None = None
        self._requeue_held = False

    def announce(self) -> None:
        """Record where the tier is, for ``cycle status`` (node 0: one record per job)."""
        if self._memory is not None and self._options.node_rank == 0:
            job_end.announce(self._memory, self._options.layout, self._options.persist_every)

    def holds(self, action: SupervisorAction) -> bool:
        """Whether ``action`` waits for :meth:`finish` (the exit line, the requeue)."""
        if self._memory is None:
            return False
        if isinstance(action, Log) and action.event == "exit":
            self._exit_said = action
            return True
        if isinstance(action, Requeue):
            self._requeue_held = True
            return True
        return False

    def finish(self, planned: int, stopped: bool, deadline: float | None = None,
               give_up: Callable[[], bool] = job_end.never_abandon) -> tuple[int, str | None]:
        """The workers are gone: :func:`job_end.finish_job` (after a stop, its copy of a
        checkpoint that did not land ends :data:`STOP_COPY_MARGIN_SECONDS` before
        ``deadline``, the stop's, or once ``give_up()``; ``None``: none is known, nothing is
        copied), said in events, then what was held; return the exit code and, when it
        changed, the line that says where the newest state is."""
        memory = self._memory
        if memory is None:
            return planned, None
        until = None if deadline is None else deadline - STOP_COPY_MARGIN_SECONDS
        end = job_end.finish_job(memory, self._options.layout, exit_code=planned,
                                 several_nodes=self._options.nnodes > 1, stopped=stopped,
                                 copy_until=until, copying=self._copying, give_up=give_up)
        if end.persisted is not None:
            self._record("persisted", index=end.persisted.index, why=f"exit {planned}")
        if end.stop_copy is not None:
            copy = end.stop_copy
            self._record("stop_copy_landed", index=copy.index, seconds=round(copy.seconds, 2),
                         spare=round(copy.spare, 1))
        if end.removed:
            self._record("memory_tier_removed", root=str(memory.root))
        said, self._exit_said = self._exit_said, None
        if end.failure is None:
            if self._requeue_held:
                self._requeue()
            if said is not None:
                self._record(said.event, warning=said.warning, **said.fields)
            return planned, None
        return self._not_persisted(end, planned)

    def _copying(self, name: CheckpointName, seconds_left: float) -> None:
        self._record("stop_copy", warning=True, index=name.index,
                     seconds_left=round(seconds_left, 1))

    def _not_persisted(self, end: job_end.JobEnd, planned: int) -> tuple[int, str]:
        code = end.exit_code(planned)
        fields: dict[str, Any] = {"newest": str(end.newest), "error": end.failure, "code": code,
                                  "planned": planned}
        self._record("persist_failed", warning=True, **fields)
        line = describe("persist_failed", fields)
        if self._requeue_held:
            self._record("requeue_withheld", warning=True, newest=str(end.newest))
            line += "; " + describe("requeue_withheld", {"newest": str(end.newest)})
        self._record("exit", warning=True, code=code,
                     reason="the newest checkpoint is only in this node's memory")
        return code, line


def sigint_came(events: queue.SimpleQueue[Event]) -> bool:
    """Whether the shell's queue, no longer read (its loop ended), holds a SIGINT: Ctrl-C during
    the copy after a stop means stop now, as a second SIGINT does during the stop."""
    while not events.empty():
        event = events.get_nowait()
        if isinstance(event, SignalReceived) and event.name == "SIGINT":
            return True
    return False
