"""Which checkpoints to keep: pure functions of checkpoint metadata, no filesystem.

:mod:`cycler.checkpoint.retainer` carries every decision here out (the saver after its commits,
the memory tier's roots, the partner copies and ``cycle prune``, whose ``--dry-run`` prints
these decisions). A checkpoint root's rules (:func:`retention_decisions`), in order:

1. The latest checkpoint is kept.
2. Pinned (``_force``) checkpoints are kept, valid or not.
3. Entries that are not real directories (symlinks, files) are kept: never followed or removed.
4. What cannot be judged is kept: unreadable checkpoints (EACCES, ESTALE, EIO), a newer
   cycler's (unsupported), and corrupt ones (a manifest, but files that do not match it: the
   evidence of damage, and perhaps the only copy left; ``cycle status`` shows them).
5. Valid checkpoints newer than the latest (committed data whose link swap was cut) are kept.
6. Torn checkpoints (incomplete: prepared by cycler, never committed) are removed when
   ``remove_torn`` says so: always when older than the latest; when newer only if
   ``writer_active`` is false, because a torn directory newer than the latest may be the one
   being written right now.
7. Of the remaining valid checkpoints (legacy ones included: a cycling_utils root's, oldest
   first), the newest ``keep_last - 1`` besides the latest are kept (``keep_last`` counts the
   latest, as in cycling_utils); ``keep_last == -1`` keeps them all. Any other value below 1
   would keep no checkpoint, which retention never does: :func:`checked_keep_last` refuses it
   for the saver, the memory tier's persisting, the integrations and ``cycle prune`` alike.

A memory root's rule (:func:`memory_decisions`): the newest :data:`MEMORY_KEEP` committed
checkpoints and those being persisted are kept, torn ones newer than the newest committed too
(they may be being written); the rest go, pinned ones too (they were persisted). A node's partner
copies (:func:`stale_replicas`) go once the node no longer keeps the checkpoint itself.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from cycler._fs import is_temporary
from cycler.checkpoint.listing import Checkpoint, CheckpointState
from cycler.errors import ConfigError

_LEFT_ALONE = {
    CheckpointState.UNREADABLE: "unreadable: left alone",
    CheckpointState.UNSUPPORTED: "written by a newer cycler: left alone",
    CheckpointState.CORRUPT: "corrupt: left for you to inspect",
}


MEMORY_KEEP = 2
"""Committed checkpoints a memory root keeps per saver (besides those being persisted)."""


@dataclass(frozen=True)
class Decision:
    checkpoint: Checkpoint
    keep: bool
    reason: str


def checked_keep_last(keep_last: int) -> int:
    """``keep_last`` if it means something (``-1``: all; ``N >= 1``: the newest N); otherwise
    :class:`~cycler.errors.ConfigError` saying what to give (a value that is no whole number,
    ``2.5`` or ``"2"``, had failed the first commit's retention, after the commit; ``True`` is
    an int to Python, and was taken as 1)."""
    if not isinstance(keep_last, int) or isinstance(keep_last, bool):
        raise ConfigError(f"keep_last={keep_last!r} is not a whole number: give 1 or more to "
                          "keep the newest N (the latest counts), or -1 to keep them all")
    if keep_last == -1 or keep_last >= 1:
        return keep_last
    raise ConfigError(f"keep_last={keep_last} would keep no checkpoint: give 1 or more to keep "
                      "the newest N (the latest counts), or -1 to keep them all")


def beyond_keep_last(kept: Sequence[int], keep_last: int) -> int:
    """How many of the oldest of ``kept`` (a saver's unpinned committed indices, oldest first,
    its latest the last) go under ``keep_last`` (rule 7, as a running saver applies it)."""
    return 0 if keep_last < 0 else max(len(kept) - keep_last, 0)


def retention_decisions(checkpoints: Sequence[Checkpoint], *, keep_last: int,
                        remove_torn: bool = True, writer_active: bool = True) -> list[Decision]:
    """One decision per checkpoint, in the order given (see the module's rules)."""
    latest = next((c for c in checkpoints if c.is_latest), None)
    latest_index = latest.index if latest is not None else None
    budget = _older_valid_to_keep(checkpoints, latest_index, keep_last)
    return [_decide(c, latest_index, budget, remove_torn, writer_active) for c in checkpoints]


def _older_valid_to_keep(checkpoints: Sequence[Checkpoint], latest_index: int | None,
                         keep_last: int) -> set[int]:
    candidates = sorted(
        (c.index for c in checkpoints
         if c.valid and not c.pinned and not c.is_latest and c.is_directory
         and (latest_index is None or c.index < latest_index)),
        reverse=True,
    )
    if keep_last < 0:
        return set(candidates)
    return set(candidates[: max(keep_last - 1, 0)])


def _decide(c: Checkpoint, latest_index: int | None, keep_older: set[int], remove_torn: bool,
            writer_active: bool) -> Decision:
    if c.is_latest:
        return Decision(c, True, "latest")
    if c.pinned:
        return Decision(c, True, "pinned")
    if not c.is_directory:
        return Decision(c, True, f"{c.problem}: left for you to inspect")
    if c.state in _LEFT_ALONE:
        return Decision(c, True, f"{_LEFT_ALONE[c.state]} ({c.problem})")
    newer = latest_index is None or c.index > latest_index
    if not c.valid:
        return _decide_torn(c, newer, remove_torn, writer_active)
    if newer:
        return Decision(c, True, "valid and newer than the latest link")
    if c.index in keep_older:
        return Decision(c, True, "within keep-last")
    return Decision(c, False, "beyond keep-last")


def _decide_torn(c: Checkpoint, newer: bool, remove_torn: bool,
                 writer_active: bool) -> Decision:
    if not remove_torn:
        return Decision(c, True, f"{c.state.value}, torn removal off")
    if newer and writer_active:
        return Decision(c, True, f"{c.state.value}, may still be being written")
    return Decision(c, False, f"{c.state.value}: {c.problem}")


def memory_decisions(checkpoints: Sequence[Checkpoint], *, busy: Collection[int],
                     keep: int = MEMORY_KEEP) -> list[Decision]:
    """One decision per checkpoint of a memory root, in the order given (the module's memory
    rule): ``busy`` are the indices being persisted."""
    committed = sorted(c.index for c in checkpoints if c.valid)
    newest_kept = set(committed[-keep:])
    newest = committed[-1] if committed else -1
    return [_decide_in_memory(c, newest_kept, set(busy), newest) for c in checkpoints]


def _decide_in_memory(c: Checkpoint, newest_kept: set[int], busy: set[int],
                      newest: int) -> Decision:
    if c.index in newest_kept:
        return Decision(c, True, "among the newest in memory")
    if c.index in busy:
        return Decision(c, True, "being persisted")
    if not c.valid and c.index > newest:
        return Decision(c, True, f"{c.state.value}, may still be being written")
    if not c.is_directory:
        return Decision(c, True, f"{c.problem}: left for you to inspect")
    if c.valid:
        return Decision(c, False, "older than the newest in memory")
    return Decision(c, False, f"{c.state.value}, older than the newest committed")


def stale_replicas(copies: Iterable[str], kept: Collection[str]) -> list[str]:
    """The partner copies (directory names under ``.replicas/``) of checkpoints the node no
    longer keeps itself (``kept``: its checkpoints' names); a temporary (a copy in progress, or
    one set aside) is not judged here."""
    return [name for name in copies if name not in kept and not is_temporary(name)]
