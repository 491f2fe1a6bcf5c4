"""The supervisor's side of the memory tier (docs/memory-tier.md): its record at the start, and
at a run's end the landing of the newest checkpoint in the checkpoint root, reported as facts.

The core decides the exit and any requeue (:mod:`cycler.supervisor.decisions.core`); with the memory
tier it asks first for :class:`LandNewest`, which :class:`Landing` carries out once the
workers are gone: :func:`cycler.checkpoint.job_end.finish_job`. After a stop whose checkpoint
did not reach the checkpoint root in the workers' persist, that copies it there in what is
left of the stop's deadline, less :data:`STOP_COPY_MARGIN_SECONDS`. What happened is said in
events and answered with one :class:`LandingReport`; the core turns a failure into exit 74
and no requeue.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from cycler.checkpoint import job_end
from cycler.checkpoint.layout import CheckpointName
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.decisions.vocabulary import Event, LandingReport, LandNewest, SignalReceived

STOP_COPY_MARGIN_SECONDS = 2.0
"""Kept between the end of the supervisor's copy after a stop and the stop's deadline: time to
requeue and exit before the job is killed (1 s was too little at load 7 on 2 cores: cycle run
exited 0.75 s past a 20 s grace after its copy of 10,000 files was given up)."""

Recorder = Callable[..., None]
"""The shell's ``_record(event, warning=False, **fields)``."""


class Landing:
    """Lands the newest memory checkpoint of a run with the memory tier in the checkpoint root
    and reports what happened; does nothing without the tier."""

    def __init__(self, options: RunOptions, record: Recorder,
                 clock: Callable[[], float] = time.time) -> None:
        self._options = options
        self._memory = options.memory_layout
        self._record = record
        self._clock = clock

    def announce(self) -> None:
        """Record where the tier is, for ``cycle status`` (node 0: one record per job)."""
        if self._memory is not None and self._options.node_rank == 0:
            job_end.announce(self._memory, self._options.layout, self._options.persist_every)

    def land(self, ask: LandNewest,
             give_up: Callable[[], bool] = job_end.never_abandon) -> LandingReport:
        """The workers are gone: :func:`job_end.finish_job` (after a stop, its copy of a
        checkpoint that did not land ends :data:`STOP_COPY_MARGIN_SECONDS` before the stop's
        deadline, or once ``give_up()``; no deadline: nothing is copied), said in events;
        return where the newest state is."""
        memory = self._memory
        if memory is None:
            return LandingReport(failure=None, newest=None, now=self._clock())
        until = None if ask.deadline is None else ask.deadline - STOP_COPY_MARGIN_SECONDS
        end = job_end.finish_job(memory, self._options.layout, exit_code=ask.planned,
                                 several_nodes=self._options.nnodes > 1, stopped=ask.stopped,
                                 copy_until=until, copying=self._copying, give_up=give_up)
        if end.persisted is not None:
            self._record("persisted", index=end.persisted.index, why=f"exit {ask.planned}")
        if end.stop_copy is not None:
            copy = end.stop_copy
            self._record("stop_copy_landed", index=copy.index, seconds=round(copy.seconds, 2),
                         spare=round(copy.spare, 1))
        if end.removed:
            self._record("memory_tier_removed", root=str(memory.root))
        newest = None if end.newest is None else str(end.newest)
        return LandingReport(failure=end.failure, newest=newest, now=self._clock())

    def _copying(self, name: CheckpointName, seconds_left: float) -> None:
        self._record("stop_copy", warning=True, index=name.index,
                     seconds_left=round(seconds_left, 1))


def sigint_came(events: queue.SimpleQueue[Event]) -> bool:
    """Whether the shell's queue, no longer read (its loop ended), holds a SIGINT: Ctrl-C during
    the copy after a stop means stop now, as a second SIGINT does during the stop."""
    while not events.empty():
        event = events.get_nowait()
        if isinstance(event, SignalReceived) and event.name == "SIGINT":
            return True
    return False
