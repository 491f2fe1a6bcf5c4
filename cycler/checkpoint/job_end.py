"""The memory tier at the supervisor's side (docs/design.md, "Tiers"): where a job's tier is, and
what happens to it when a run of the job ends."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cycler import _fs
from cycler.checkpoint.durable_copy import (
    Abandon,
    PersistAbandoned,
    never_abandon,
    newer_than_persisted,
    persist,
    persist_newest,
)
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.linking import link_forward
from cycler.checkpoint.listing import inspect_checkpoint
from cycler.checkpoint.tiers import remove_memory_root
from cycler.errors import CyclerError
from cycler.protocol.exit_codes import EXIT_REQUEUE, code_when_not_landed

log = logging.getLogger(__name__)


def announce(memory: CheckpointLayout, durable: CheckpointLayout, persist_every: int) -> None:
    """Record where this job's memory tier is (root, host, persist interval) in the checkpoint
    root's ``.cycler/``, for ``cycle status``; one record per job (the caller is node 0)."""
    record = {"root": str(memory.root), "host": socket.gethostname(),
              "persist_every": persist_every}
    _fs.atomic_write_bytes(durable.record.memory_tier_record_path, json.dumps(record).encode(),
                           durable=False)


@dataclass(frozen=True)
class StopCopy:
    """A stop's checkpoint copied to the checkpoint root by ``cycle run`` after the workers."""

    index: int
    seconds: float
    """How long the copy took."""
    spare: float
    """Seconds left before the copy's deadline when it was committed."""


@dataclass(frozen=True)
class JobEnd:
    """What :func:`finish_job` did with the memory tier when a run of the job ended."""

    persisted: CheckpointName | None = None
    """The checkpoint persisted now (``None``: none needed to be, or it failed)."""
    failure: str | None = None
    """Why the newest memory checkpoint did not reach the checkpoint root (``None``: it did,
    or the root had everything already)."""
    newest: Path | None = None
    """With a failure: the memory checkpoint (or root) that holds the newest state."""
    removed: bool = False
    """Whether the memory root was removed (the job ended for good)."""
    stop_copy: StopCopy | None = None
    """After a stop whose checkpoint had not reached the checkpoint root: the copy that
    ``cycle run`` made of it in what was left of the stop's deadline."""

    def exit_code(self, planned: int) -> int:
        """The exit code the supervisor's core gives a run planned to end with ``planned``
        after this end (:func:`cycler.protocol.exit_codes.code_when_not_landed` on a failure)."""
        return planned if self.failure is None else code_when_not_landed(planned)


def finish_job(memory: CheckpointLayout, durable: CheckpointLayout, *, several_nodes: bool,
               exit_code: int, stopped: bool = False, copy_until: float | None = None,
               clock: Callable[[], float] = time.time,
               copying: Callable[[CheckpointName, float], None] | None = None,
               give_up: Abandon = never_abandon) -> JobEnd:
    """A run of the job ended and its workers are gone: persist the newest memory checkpoint
    if the checkpoint root has nothing as new (on several nodes this node contributes what it
    holds; the node that completes it commits it), then remove the memory tier unless the job
    may rerun here (``exit_code`` 75) or it holds the only copy of the newest state (the
    persist failed). Never raises for a failed persist: the returned :class:`JobEnd` says it.

    After a stop (``stopped``) the workers persisted the stop's checkpoint within the grace;
    where it did not land, it is copied here only until ``copy_until`` (wall-clock by
    ``clock``: what is left of the stop's deadline; ``None``: no time is known), given up
    between chunks then or once ``give_up()`` says so, its unfinished copy removed
    (:func:`land_stop`)."""
    try:
        persisted, copied = None, None
        if stopped:
            copied = land_stop(memory, durable, several_nodes, copy_until, clock, copying,
                               give_up)
        elif several_nodes:
            # Imported here: nodes.contribution imports this module.
            from cycler.checkpoint.nodes.contribution import contribute_newest

            persisted = contribute_newest(memory, durable)
        else:
            persisted = persist_newest(memory, durable)
    except (OSError, CyclerError) as error:
        # Known after a stop's copy: a memory root of many files takes long to list again.
        newest = error.newest if isinstance(error, NotPersisted) else None
        return JobEnd(failure=str(error) or type(error).__name__,
                      newest=newest or _newest_in_memory(memory, durable))
    removed = exit_code != EXIT_REQUEUE and memory.root.exists()
    if removed:
        remove_memory_root(memory.root)
    return JobEnd(persisted=persisted, removed=removed, stop_copy=copied)


class NotPersisted(CyclerError):
    """The newest memory checkpoint, at ``newest``, is not in the checkpoint root after a
    stop."""

    def __init__(self, message: str, newest: Path) -> None:
        super().__init__(message)
        self.newest = newest


def land_stop(memory: CheckpointLayout, durable: CheckpointLayout, several_nodes: bool,
              until: float | None, clock: Callable[[], float] = time.time,
              copying: Callable[[CheckpointName, float], None] | None = None,
              give_up: Abandon = never_abandon) -> StopCopy | None:
    """After a stop: return ``None`` when the newest valid memory checkpoint is in the
    checkpoint root (:func:`not_landed`); else copy it there (on several nodes this node's
    share, :func:`contribute`) with ``copying(name, seconds_left)`` said first, and return
    how long that took. The copy is given up between two chunks at ``until``, or once
    ``give_up()`` says so (stop now), and removed (nothing partial stays in the root). Raises
    :class:`NotPersisted` when no time is left or the copy was given up, and what the copy
    raises (a full or read-only root)."""
    name = not_landed(memory, durable, several_nodes)
    if name is None:
        return None
    unlanded = (f"checkpoint {name.index}, the newest, was not in {durable.root} when the "
                "workers exited: its copy did not finish within the stop's time (the grace, "
                "or Slurm's deadline) or failed (the workers' log says why)")
    started, newest = clock(), memory.path_of(name)
    if not several_nodes:  # deleting its files is not worth the stop's time
        _set_aside_cut_copy(durable, name)
    if until is None or until <= started:
        raise NotPersisted(f"{unlanded}, and no time was left to copy it", newest)
    if copying is not None:
        copying(name, until - started)
    deadline = _CopyDeadline(until, clock, give_up)
    try:
        _copy_before(memory, durable, name, several_nodes, deadline.reached)
    except PersistAbandoned:
        raise NotPersisted(f"{unlanded}; {deadline.said(started)}", newest) from None
    done = clock()
    return StopCopy(name.index, seconds=done - started, spare=until - done)


class _CopyDeadline:
    """When ``cycle run``'s copy after a stop is given up: at ``until``, or once
    ``give_up()`` says so; the first moment either held is kept."""

    def __init__(self, until: float, clock: Callable[[], float], give_up: Abandon) -> None:
        self._until, self._clock, self._give_up = until, clock, give_up
        self._at: float | None = None

    def reached(self) -> bool:
        if self._at is None:
            now = self._clock()
            if now >= self._until or self._give_up():
                self._at = now
        return self._at is not None

    def said(self, started: float) -> str:
        at = self._until if self._at is None else self._at
        why = "reached the stop's deadline" if at >= self._until else "was given up on request"
        return (f"cycle run's own copy of it {why} after {at - started:.1f} s; nothing "
                "unfinished of it is left under a checkpoint's name")


def _set_aside_cut_copy(durable: CheckpointLayout, name: CheckpointName) -> None:
    """Rename the workers' copy of ``name`` cut by a kill out of the checkpoint names: one
    step, where deleting its files would take the stop's time (the next persist reclaims them
    as a dead writer's leftover). Nothing else writes it: the workers are gone. Logged, never
    raised."""
    target = durable.path_of(name)
    if not os.path.lexists(target):
        return
    try:
        _fs.set_aside(target)
    except OSError as error:
        log.warning("could not set aside the unfinished copy %s (%s); the next persist "
                    "removes it", target, error)


def _copy_before(memory: CheckpointLayout, durable: CheckpointLayout, name: CheckpointName,
                 several_nodes: bool, abandon: Abandon) -> None:
    if not several_nodes:
        persist(memory, durable, name, abandon, unfinished=_fs.set_aside)
        return
    # Imported here: nodes.contribution imports the tiers this module builds on.
    from cycler.checkpoint.nodes.contribution import contribute

    contribute(memory, durable, name, abandon)  # the node that completes it commits it


def not_landed(memory: CheckpointLayout, durable: CheckpointLayout, several_nodes: bool,
               ) -> CheckpointName | None:
    """After a stop: ``None`` when the newest valid memory checkpoint is committed in the
    checkpoint root (its link moved forward if a kill left it behind) or, on several nodes,
    when this node's share of it is there (the node that completes it commits it); else its
    name. Copies nothing."""
    # Imported here: nodes.contribution imports the tiers this module builds on.
    from cycler.checkpoint.nodes.contribution import contributed, whole

    newer = newer_than_persisted(memory, durable)
    if several_nodes:  # one only some nodes committed (a rank died in between) is no one's
        newer = [checkpoint for checkpoint in newer if whole(checkpoint.path)]
    if not newer:
        return None
    name = newer[0].name
    if inspect_checkpoint(durable, name).valid:
        link_forward(durable)  # killed between the manifest and the link
        return None
    if several_nodes and contributed(memory, durable, name):
        return None
    return name


def _newest_in_memory(memory: CheckpointLayout, durable: CheckpointLayout) -> Path:
    try:
        newer = newer_than_persisted(memory, durable)
    except OSError:
        newer = []
    return newer[0].path if newer else memory.root
