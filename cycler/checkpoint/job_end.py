"""The memory tier at the supervisor's side (DESIGN.md, "Tiers"): where a job's tier is, and
what happens to it when a run of the job ends."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

from cycler import _fs
from cycler.checkpoint.commit import link_forward
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import inspect_checkpoint
from cycler.checkpoint.tiers import newer_than_persisted, persist_newest, remove_memory_root
from cycler.errors import CyclerError
from cycler.protocol.exit_codes import EXIT_NOT_PERSISTED, EXIT_REQUEUE, EXIT_SUCCESS


def announce(memory: CheckpointLayout, durable: CheckpointLayout, persist_every: int) -> None:
    """Record where this job's memory tier is (root, host, persist interval) in the checkpoint
    root's ``.cycler/``, for ``cycle status``; one record per job (the caller is node 0)."""
    record = {"root": str(memory.root), "host": socket.gethostname(),
              "persist_every": persist_every}
    _fs.atomic_write_bytes(durable.memory_tier_record_path, json.dumps(record).encode(),
                           durable=False)


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

    def exit_code(self, planned: int) -> int:
        """``cycle run``'s exit code: :data:`EXIT_NOT_PERSISTED` where the planned code would
        say the state is safe in the checkpoint root (the script finished, or a stop's
        checkpoint to resume) and it is not; a failure's code stays what it was."""
        if self.failure is not None and planned in (EXIT_SUCCESS, EXIT_REQUEUE):
            return EXIT_NOT_PERSISTED
        return planned


def finish_job(memory: CheckpointLayout, durable: CheckpointLayout, *, several_nodes: bool,
               exit_code: int, stopped: bool = False) -> JobEnd:
    """A run of the job ended and its workers are gone: persist the newest memory checkpoint
    if the checkpoint root has nothing as new (on several nodes this node contributes what it
    holds; the node that completes it commits it), then remove the memory tier unless the job
    may rerun here (``exit_code`` 75) or it holds the only copy of the newest state (the
    persist failed). Never raises for a failed persist: the returned :class:`JobEnd` says it.

    After a stop (``stopped``) nothing is copied: the workers persisted the stop's checkpoint
    within the grace, and a copy now would run past the deadline the stop was given. Only
    whether it landed is checked (:func:`check_landed`); where it did not, that is the
    failure."""
    try:
        persisted = None
        if stopped:
            check_landed(memory, durable, several_nodes)
        elif several_nodes:
            # Imported here: nodes.contribution imports this module.
            from cycler.checkpoint.nodes.contribution import contribute_newest

            persisted = contribute_newest(memory, durable)
        else:
            persisted = persist_newest(memory, durable)
    except (OSError, CyclerError) as error:
        return JobEnd(failure=str(error) or type(error).__name__,
                      newest=_newest_in_memory(memory, durable))
    removed = exit_code != EXIT_REQUEUE and memory.root.exists()
    if removed:
        remove_memory_root(memory.root)
    return JobEnd(persisted=persisted, removed=removed)


class NotPersisted(CyclerError):
    """The newest memory checkpoint is not in the checkpoint root after a stop."""


def check_landed(memory: CheckpointLayout, durable: CheckpointLayout, several_nodes: bool,
                 ) -> None:
    """After a stop: return when the newest valid memory checkpoint is committed in the
    checkpoint root (its link moved forward if a kill left it behind) or, on several nodes,
    when this node's share of it is there (the node that completes it commits it); raise
    :class:`NotPersisted` otherwise. Copies nothing."""
    # Imported here: nodes.contribution imports the tiers this module builds on.
    from cycler.checkpoint.nodes.contribution import contributed, whole

    newer = newer_than_persisted(memory, durable)
    if several_nodes:  # one only some nodes committed (a rank died in between) is no one's
        newer = [checkpoint for checkpoint in newer if whole(checkpoint.path)]
    if not newer:
        return
    name = newer[0].name
    if inspect_checkpoint(durable, name).valid:
        link_forward(durable)  # killed between the manifest and the link
        return
    if several_nodes and contributed(memory, durable, name):
        return
    raise NotPersisted(f"checkpoint {name.index}, the newest, was not in {durable.root} when "
                       "the workers exited: its copy did not finish within the stop's time "
                       "(the grace, or Slurm's deadline) or failed (the workers' log says why)")


def _newest_in_memory(memory: CheckpointLayout, durable: CheckpointLayout) -> Path:
    try:
        newer = newer_than_persisted(memory, durable)
    except OSError:
        newer = []
    return newer[0].path if newer else memory.root
