"""Facts about a checkpoint root for people and scripts: ``cycle status`` and ``cycle prune``.

Everything here is read through :mod:`cycler.checkpoint.listing` and decided through
:mod:`cycler.checkpoint.retention`; this module only gathers, and (for prune) carries out the
decisions.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cycler import _fs
from cycler.checkpoint.layout import CheckpointLayout, saver_prefixes
from cycler.checkpoint.listing import (
    Checkpoint,
    link_outside_root,
    list_checkpoints,
)
from cycler.checkpoint.lock import lock_holder
from cycler.checkpoint.memory_roots import is_private, memory_base, memory_root
from cycler.checkpoint.retainer import carry_out
from cycler.checkpoint.retention import Decision, checked_keep_last, retention_decisions
from cycler.errors import CheckpointDirectoryError, DirectoryInUse
from cycler.protocol.events import history_counts, job_history, read_events
from cycler.protocol.goodput import Goodput, goodput
from cycler.protocol.record import RunRecord
from cycler.protocol.replay import VERDICT_EVENTS
from cycler.protocol.timeline import timeline

VERDICT_NAMES = frozenset(VERDICT_EVENTS.values())


@dataclass(frozen=True)
class CheckpointFacts:
    """One row of ``cycle status``."""

    saver: str
    name: str
    index: int
    state: str
    pinned: bool
    step: int | None
    epoch: int | None
    size: int
    age_seconds: float
    problem: str | None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class MemoryTierStatus:
    """The memory tier of a job, as ``cycle status`` shows it: its checkpoints and how far the
    checkpoint root is behind (``lag``: checkpoints committed after the newest persisted one,
    which a loss of this node's memory would cost)."""

    root: Path
    host: str
    checkpoints: list[CheckpointFacts]
    newest: int | None
    newest_persisted: int | None
    lag: int
    """How many valid checkpoints are newer in memory than the newest persisted one."""

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "root": str(self.root),
                "checkpoints": [c.as_dict() for c in self.checkpoints]}


@dataclass(frozen=True)
class RootStatus:
    root: Path
    exists: bool
    checkpoints: list[CheckpointFacts] = field(default_factory=list)
    supervisors: list[dict[str, Any]] = field(default_factory=list)
    """Owner records of live ``cycle run`` supervisors (one per node)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The job's history (:func:`cycler.protocol.events.job_history`), its last entries, oldest
    first."""
    counts: dict[str, int] = field(default_factory=dict)
    """Starts, stops, restarts and requeues over the job's whole life."""
    notes: list[str] = field(default_factory=list)
    """What looks wrong beyond single checkpoints (a latest link pointing outside the root)."""
    goodput: Goodput | None = None
    """What preemption cost the job, from node 0's events (``None``: no events)."""
    memory: MemoryTierStatus | None = None
    """The job's memory tier where ``cycle run --memory-tier`` recorded one on this host."""
    timeline: dict[int, str] = field(default_factory=dict)
    """One line per node: the job's life cell by cell (:mod:`cycler.protocol.timeline`)."""
    replays: list[dict[str, Any]] = field(default_factory=list)
    """Every restart's verdict on its replayed steps, oldest first (events ``replay_*``:
    ``verdict``, ``resumed``, ``steps``, ``said``...; :mod:`cycler.protocol.replay`)."""

    def as_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "exists": self.exists,
                "memory": None if self.memory is None else self.memory.as_dict(),
                "checkpoints": [c.as_dict() for c in self.checkpoints],
                "supervisors": self.supervisors, "events": self.events,
                "counts": self.counts, "notes": self.notes,
                "goodput": None if self.goodput is None else self.goodput.as_dict(),
                "timeline": {str(node): line for node, line in self.timeline.items()},
                "replays": self.replays}


def checked_root(root: str | os.PathLike[str]) -> Path | None:
    """``root`` made absolute; ``None`` if missing; an error if it is not a directory."""
    path = Path(os.path.abspath(root))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CheckpointDirectoryError(f"cannot read {path}: {error.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise CheckpointDirectoryError(f"{path} is not a directory; give the checkpoint root")
    return path


def collect_status(root: str | os.PathLike[str], *, verify: bool = False, events: int = 10,
                   on_checked: Callable[[int], None] | None = None,
                   clock: Callable[[], float] = time.time,
                   memory_dir: str | os.PathLike[str] | None = None) -> RootStatus:
    """Every saver's checkpoints, the live supervisors and the last ``events`` entries of the
    job's history (starts, stops, restarts, requeues, commits), with counts over all of it.

    ``verify`` reads every file to check its checksum; ``on_checked(bytes)`` is called after
    each checkpoint so a caller can show progress. ``memory_dir``: where ``cycle run
    --memory-dir`` kept the job's memory tier (default: the default base), to find one left by
    a job whose root is gone.
    """
    path = checked_root(root)
    if path is None:
        path = Path(os.path.abspath(root))
        return RootStatus(path, exists=False, notes=_memory_tier_without_root(path, memory_dir))
    facts, notes = [], []
    for prefix in saver_prefixes(path):
        saver_layout = CheckpointLayout(path, prefix)
        outside = link_outside_root(saver_layout, saver_layout.checkpoint_names())
        if outside is not None:
            notes.append(outside)
        for checkpoint in list_checkpoints(path, prefix, verify=verify):
            facts.append(_facts(prefix, checkpoint, clock()))
            if on_checked is not None:
                on_checked(facts[-1].size)
    record = RunRecord(path)
    by_node = {node: read_events(path) for node, path in record.events_paths().items()}
    merged = [{**event, "node": node} for node, records in by_node.items() for event in records]
    merged.sort(key=lambda event: float(event.get("time", 0)))
    history = job_history(merged)
    # Node 0's log (the lowest node's) holds the whole job's timeline: every node starts,
    # restarts and stops together.
    first = by_node[min(by_node)] if by_node else []
    return RootStatus(path, True, facts, live_supervisors(record),
                      history[-events:] if events > 0 else [], history_counts(merged), notes,
                      goodput(first) if first else None,
                      _memory_tier(record, facts, verify, clock()), timeline(by_node),
                      [event for event in merged if event.get("event") in VERDICT_NAMES])


def memory_tier_here(record: RunRecord) -> Path | None:
    """The memory root ``cycle run --memory-tier`` recorded for this checkpoint root, if it
    is on this host and still there."""
    try:
        tier = _fs.read_json_object(record.memory_tier_record_path)
    except (OSError, ValueError):
        return None
    root = Path(str(tier.get("root", "")))
    if tier.get("host") != socket.gethostname() or not root.is_absolute():
        return None
    # Listed only where it is the user's own private directory: nothing else is read. And only
    # where its own record names this root: the record in .cycler/ may be another user's (a
    # group-writable root), pointing at another job's tier for `cycle prune` to delete from.
    if not (is_private(root.parent) and is_private(root)):
        return None
    owner = _fs.read_json_object(RunRecord(root).memory_owner_path)
    return root if owner.get("durable_root") == os.path.realpath(record.root) else None


def _memory_tier_without_root(root: Path, memory_dir: str | os.PathLike[str] | None,
                              ) -> list[str]:
    """A note when this user's memory base on this host (in ``memory_dir``, else the default
    one) holds a memory tier of ``root``, which is gone: its checkpoints are of a job that no
    longer has a root."""
    memory = memory_root(memory_base(memory_dir), root)
    if not (is_private(memory.parent) and is_private(memory)):
        return []
    return [f"a memory tier of an earlier job of this root is still at {memory}: it is never "
            "resumed from, and your next `cycle run` on this host removes it"]


def _memory_tier(record: RunRecord, on_disk: list[CheckpointFacts], verify: bool,
                 now: float) -> MemoryTierStatus | None:
    root = memory_tier_here(record)
    if root is None:
        return None
    rows = [_facts(prefix, checkpoint, now) for prefix in saver_prefixes(root)
            for checkpoint in list_checkpoints(root, prefix, verify=verify)]
    newest = max((r.index for r in rows if r.problem is None), default=None)
    persisted = max((r.index for r in on_disk if r.problem is None), default=None)
    floor = -1 if persisted is None else persisted  # what a gap left out is not counted
    lag = sum(1 for r in rows if r.problem is None and r.index > floor)
    return MemoryTierStatus(root, socket.gethostname(), rows, newest, persisted, lag)


def total_size(root: str | os.PathLike[str], *, verify: bool = False) -> int:
    """Bytes under every checkpoint of ``root`` (for sizing a progress bar)."""
    path = checked_root(root)
    if path is None:
        return 0
    return sum(_fs.tree_size(c.path) for prefix in saver_prefixes(path)
               for c in list_checkpoints(path, prefix) if c.is_directory)


def _facts(prefix: str, checkpoint: Checkpoint, now: float) -> CheckpointFacts:
    """One row of ``cycle status``."""
    manifest = checkpoint.manifest
    size = manifest.total_size if manifest is not None else _fs.tree_size(checkpoint.path)
    created = manifest.created_at if manifest is not None else _mtime(checkpoint.path)
    return CheckpointFacts(
        saver=prefix, name=checkpoint.path.name, index=checkpoint.index,
        state=checkpoint.state.value, pinned=checkpoint.pinned,
        step=manifest.step if manifest else None, epoch=manifest.epoch if manifest else None,
        size=size, age_seconds=max(0.0, now - created), problem=checkpoint.problem,
    )


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return time.time()


def live_supervisors(record: RunRecord) -> list[dict[str, Any]]:
    """Owner records of the ``cycle run`` supervisors holding a lock on this root."""
    holders = (lock_holder(path) for path in record.lock_paths())
    return [holder for holder in holders if holder is not None]


@dataclass(frozen=True)
class PruneResult:
    decisions: list[Decision]
    stale_temporaries: list[Path]
    removed: list[Path]
    dry_run: bool


def prune(root: str | os.PathLike[str], *, keep_last: int = -1, dry_run: bool = False,
          force: bool = False) -> PruneResult:
    """Remove torn checkpoints and unpinned ones beyond ``keep_last`` (``-1``: keep all valid).

    Never removes the latest valid checkpoint, a pinned one, anything reached through a
    symlink, or anything outside ``root``. Refuses while a live ``cycle run`` holds the root's
    lock, unless ``force``. With ``dry_run`` only the decisions are returned. The job's memory
    tier on this host, if ``cycle run`` recorded one, is pruned by the same rules.
    """
    keep_last = checked_keep_last(keep_last)
    path = checked_root(root)
    if path is None:
        return PruneResult([], [], [], dry_run)
    _refuse_if_supervised(RunRecord(path), force)
    decisions, temporaries = _plan(path, keep_last)
    memory = memory_tier_here(RunRecord(path))
    if memory is not None:
        in_memory, memory_temporaries = _plan(memory, keep_last)
        decisions, temporaries = decisions + in_memory, temporaries + memory_temporaries
    if dry_run:
        return PruneResult(decisions, temporaries, [], True)
    try:
        for tier in {d.checkpoint.path.parent for d in decisions if not d.keep}:
            _remember_indices(tier, [d.checkpoint for d in decisions
                                     if not d.keep and d.checkpoint.path.parent == tier])
        removed = carry_out(decisions, temporaries)
    except OSError as error:
        raise CheckpointDirectoryError(
            f"cannot prune {path}: {error.strerror or error} at {error.filename or path}; "
            "nothing that was kept is affected: make the directory writable and run it again"
        ) from None
    return PruneResult(decisions, temporaries, removed, False)


def _remember_indices(root: Path, removed: list[Checkpoint]) -> None:
    """Record the highest index about to be removed, so that no saver ever reuses it."""
    for prefix in {c.name.prefix for c in removed}:
        layout = CheckpointLayout(root, prefix)
        highest = max(c.index for c in removed if c.name.prefix == prefix)
        if highest >= layout.next_index() - 1:
            layout.record_index(highest)


def _refuse_if_supervised(record: RunRecord, force: bool) -> None:
    supervisors = live_supervisors(record)
    if supervisors and not force:
        owner = supervisors[0]
        raise DirectoryInUse(
            f"a live cycle run (pid {owner.get('pid', '?')} on {owner.get('host', '?')}) is "
            f"writing to {record.root}; stop it first, or pass --force"
        )


def _plan(root: Path, keep_last: int) -> tuple[list[Decision], list[Path]]:
    decisions: list[Decision] = []
    any_writing = False
    for prefix in saver_prefixes(root):
        writing = lock_holder(RunRecord(root).writer_lock_path(prefix)) is not None
        any_writing = any_writing or writing
        # The latest is chosen as resume chooses it, its checksums verified, so that what is
        # kept always includes a checkpoint a resume can load.
        checkpoints = list_checkpoints(root, prefix, verify_latest=keep_last >= 0)
        decisions += retention_decisions(checkpoints, keep_last=keep_last, remove_torn=True,
                                         writer_active=writing)
    # A live writer's temporaries are about to be renamed into place: leave them all alone then.
    temporaries = [] if any_writing else CheckpointLayout(root).temporaries()
    return decisions, temporaries
