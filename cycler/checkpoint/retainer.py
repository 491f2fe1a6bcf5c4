"""The one executor of retention, and the one place a checkpoint directory is removed.

Which checkpoints to keep is :mod:`cycler.checkpoint.retention`'s pure decision; this module
carries it out: :class:`Retainer` for one saver in the root it commits to,
:func:`retain_durable` and :func:`retain_memory` for the memory tier's roots,
:func:`retain_replicas` for a node's partner copies and :func:`carry_out` for ``cycle prune``.
All but the last log a failure and never raise: the commit they follow has already succeeded
on every rank; ``cycle prune`` raises it, to report it in one line.

Removals that are no retention (a failed save's own directory, a copy cut short, a memory root
at the job's end or another job's) go through :func:`discard`, so that no other module deletes
a checkpoint directory (``tests/unit/test_retainer.py`` checks it).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from pathlib import Path

from cycler import _fs
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import CheckpointState, list_checkpoints
from cycler.checkpoint.retention import (
    MEMORY_KEEP,
    Decision,
    beyond_keep_last,
    checked_keep_last,
    memory_decisions,
    retention_decisions,
    stale_replicas,
)

log = logging.getLogger(__name__)


def discard(path: Path) -> None:
    """Remove the checkpoint directory (or memory root) ``path`` that is no retention's to
    judge: a failed save's, a copy that did not commit, a memory root no job needs. Renamed
    aside first, so it never looks half-removed under its own name (:func:`_fs.discard_directory`);
    raises :class:`OSError` (wrap it in :func:`_fs.remove_logged` to log it instead)."""
    _fs.discard_directory(path)


class Retainer:
    """Retention of one saver (``keep_last`` committed checkpoints, counting the latest;
    ``-1``: all; pinned ones always). A ``keep_last`` that would keep nothing is refused
    (:func:`~cycler.checkpoint.retention.checked_keep_last`), when made and when changed."""

    def __init__(self, keep_last: int) -> None:
        self.keep_last = keep_last
        self._kept: list[int] | None = None
        """Unpinned committed indices retention keeps, oldest first (``None``: not scanned)."""
        self._root: Path | None = None
        """The root ``_kept`` is of (the memory tier's, until the saver leaves it)."""
        self._uncommitted: list[Path] = []
        """Directories this process prepared and has not committed (a failed save's)."""

    @property
    def keep_last(self) -> int:
        return self._keep_last

    @keep_last.setter
    def keep_last(self, keep_last: int) -> None:
        self._keep_last = checked_keep_last(keep_last)

    def prepared(self, path: Path) -> None:
        """This process made ``path``: removed after the next commit unless it is the one."""
        self._uncommitted.append(path)

    def committed(self, directory: Path) -> None:
        """``directory`` is committed: retention never removes it as uncommitted."""
        self._uncommitted = [p for p in self._uncommitted if p.name != directory.name]

    def after_commit(self, layout: CheckpointLayout, committed: str) -> None:
        """Remove what retention says may go; a failure is logged and retried at the next
        commit, never raised.

        The first commit of a saver scans the root (torn directories and temporaries that dead
        writers left); later ones only drop this saver's own checkpoints beyond ``keep_last``
        and the directories it prepared without committing, so a commit costs the same with 600
        checkpoints kept as with one. Any failure makes the next commit scan again.
        """
        name = layout.parse(committed)
        if self._kept is None or name is None or layout.root != self._root:
            self._kept, self._root = self._scan(layout), layout.root
            return
        if not name.pinned:
            self._kept.append(name.index)
        doomed, self._uncommitted = self._uncommitted, []
        beyond = beyond_keep_last(self._kept, self.keep_last)
        doomed += [layout.path_of(CheckpointName(layout.prefix, index, False))
                   for index in self._kept[:beyond]]
        self._kept = self._kept[beyond:]
        for path in doomed:
            if not _fs.remove_logged(_fs.discard_directory, path, "checkpoint"):
                self._kept = None

    def _scan(self, layout: CheckpointLayout) -> list[int] | None:
        try:
            checkpoints = list_checkpoints(layout.root, layout.prefix, commit_state_only=True)
            decisions = retention_decisions(checkpoints, keep_last=self.keep_last,
                                            remove_torn=True, writer_active=False)
            # A writer killed during a removal leaves a renamed, half-deleted checkpoint that
            # no reader lists: without this, every such kill would leak up to a checkpoint.
            leftovers = layout.own_temporaries()
        except OSError as error:
            log.warning("retention skipped after a commit (%s); it runs again at the next", error)
            return None
        removed = _remove_decided(decisions, "checkpoint")
        removed += [_fs.remove_logged(_fs.remove_leftover, temporary,
                                      "leftover of a dead writer") for temporary in leftovers]
        kept = [d.checkpoint.index for d in decisions
                if d.keep and d.checkpoint.valid and not d.checkpoint.pinned
                and d.checkpoint.is_directory]
        self._uncommitted = []
        return sorted(kept) if all(removed) else None

    def reclaim_torn(self, tiers: list[CheckpointLayout], layout: CheckpointLayout, *,
                     measure: bool) -> int:
        """At a saver's first prepare, under the writer locks: every directory without a
        manifest in any of its ``tiers`` was left by a writer that died (a crash loop on a full
        disk leaves one per run; under the memory tier, a persist cut by a kill leaves one in
        the checkpoint root), so it goes now, before this run needs the space; so do the
        leftovers of dead writers in every tier but a checkpoint root that ``layout`` is
        (whose own go at its first commit's scan; a memory root has no such scan). With
        ``measure`` (``layout`` is a memory root), returns twice the largest torn directory's
        size in ``layout`` (the memory tier's prediction of the next checkpoint), else 0."""
        predicted = 0
        for tier in tiers:
            predicted = max(predicted, self._reclaim_torn_in(tier, measure=measure and (
                tier is layout)))
            if tier is not layout or measure:
                reclaim_leftovers(tier, everyone=True)
        return predicted

    @staticmethod
    def _reclaim_torn_in(layout: CheckpointLayout, *, measure: bool) -> int:
        try:
            torn = [c for c in list_checkpoints(layout.root, layout.prefix,
                                                commit_state_only=True)
                    if c.state is CheckpointState.INCOMPLETE and not c.pinned]
            if torn:  # indices never repeat, even those of directories removed
                layout.record_index(max(c.index for c in torn))
        except OSError:
            return 0
        # A checkpoint that did not fit in memory (a plain script's own write failed on the
        # full tmpfs, and it crashed) left what fitted, about the free space then. Twice that
        # is predicted for the next one, so it is not tried in memory again, crash after
        # crash; a directory torn by a kill is a part of one, and twice a part may only send a
        # large checkpoint to disk early.
        predicted = max([0, *(2 * _fs.tree_size(c.path) for c in torn)]) if measure else 0
        for checkpoint in torn:
            _fs.remove_logged(_fs.discard_directory, checkpoint.path, "torn directory")
        return predicted


def reclaim_leftovers(layout: CheckpointLayout, everyone: bool) -> None:
    """Remove the temporaries of ``layout``'s writers that died (a removal or a copy cut by a
    kill: a whole checkpoint's size each): on this host those whose writer is gone, and with
    ``everyone`` (no writer of the job is running: a saver's first prepare) all of them."""
    try:
        leftovers = layout.own_temporaries()
    except OSError:
        return
    for path in leftovers:
        if everyone or _fs.left_by_dead_writer(path.name):
            _fs.remove_logged(_fs.remove_leftover, path, "leftover of a dead writer")


def _remove_decided(decisions: Sequence[Decision], what: str) -> list[bool]:
    """Remove every checkpoint whose decision is not to keep it; whether each removal worked
    (a failure is logged)."""
    return [_fs.remove_logged(_fs.discard_directory, d.checkpoint.path, what)
            for d in decisions if not d.keep]


def retain_durable(durable: CheckpointLayout, keep_last: int) -> None:
    """Retention in the checkpoint root after a persisted commit (the rules of
    :func:`~cycler.checkpoint.retention.retention_decisions`, a writer possibly active), and
    the leftovers of this host's dead writers; failures are logged, never raised."""
    try:
        checkpoints = list_checkpoints(durable.root, durable.prefix, commit_state_only=True)
    except OSError as error:
        log.warning("retention skipped in %s (%s)", durable.root, error)
        return
    _remove_decided(retention_decisions(checkpoints, keep_last=checked_keep_last(keep_last),
                                        remove_torn=True, writer_active=True), "checkpoint")
    reclaim_leftovers(durable, everyone=False)


def retain_memory(memory: CheckpointLayout, busy: Collection[int], keep: int = MEMORY_KEEP,
                  ) -> None:
    """A memory root's retention (:func:`~cycler.checkpoint.retention.memory_decisions`:
    ``busy`` are being persisted), and what writers on this host left when they died (a
    removal cut by a kill: up to a whole checkpoint in RAM each). Failures are logged, never
    raised."""
    try:
        checkpoints = list_checkpoints(memory.root, memory.prefix, commit_state_only=True)
    except OSError as error:
        log.warning("retention skipped in %s (%s)", memory.root, error)
        return
    _remove_decided(memory_decisions(checkpoints, busy=busy, keep=keep), "memory checkpoint")
    reclaim_leftovers(memory, everyone=False)


def retain_replicas(memory: CheckpointLayout, replicas: Path) -> None:
    """Remove the partner copies in ``replicas`` of checkpoints this node no longer keeps
    itself (:func:`~cycler.checkpoint.retention.stale_replicas`); logged, never raised."""
    kept = {str(name) for name in memory.checkpoint_names()}
    try:
        copies = [entry.name for entry in replicas.iterdir()]
    except OSError:
        return
    for copy in stale_replicas(copies, kept):
        _fs.remove_logged(_fs.discard_directory, replicas / copy, "partner copy")


def carry_out(decisions: Sequence[Decision], leftovers: Sequence[Path]) -> list[Path]:
    """``cycle prune``'s removals: every checkpoint whose decision is not to keep it, then the
    ``leftovers`` (temporaries of dead writers); what was removed. Raises the first
    :class:`OSError`: what was kept is untouched, the rest stays for the next prune."""
    doomed = [d.checkpoint.path for d in decisions if not d.keep]
    for target in doomed:
        _fs.discard_directory(target)
    for leftover in leftovers:
        _fs.remove_leftover(leftover)
    return [*doomed, *leftovers]
