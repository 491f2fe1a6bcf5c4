"""Checkpoints a plain script keeps in its own layout, recognised so that its stop is requeued.

A script that never imports cycler still saves: Hugging Face's ``Trainer`` writes
``checkpoint-N/`` folders, Lightning ``.ckpt`` files. When its workers end on a stop and no
checkpoint of cycler's exists, one of these means that a rerun resumes (the script's own
``resume_from_checkpoint``), so ``cycle run`` asks to be requeued (75) and names it, instead of
ending the job (1).

Only complete checkpoints count: HF's folder once it holds ``trainer_state.json`` (HF writes it
last), a ``.ckpt`` that is not empty (Lightning writes it aside and moves it in), and anything
``--resumable-if GLOB`` matches. The search is a fixed set of shallow patterns, so a working
directory that also holds a dataset of millions of files is never walked.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE
from cycler.supervisor.vocabulary import Exit, Log, Requeue

HUGGING_FACE = "Hugging Face checkpoint-N"
LIGHTNING = "Lightning .ckpt"
RESUMABLE_IF = "--resumable-if"

_PATTERNS: tuple[tuple[str, str], ...] = (
    (HUGGING_FACE, "checkpoint-*/trainer_state.json"),
    (HUGGING_FACE, "*/checkpoint-*/trainer_state.json"),
    (HUGGING_FACE, "*/*/checkpoint-*/trainer_state.json"),  # output_dir=runs/exp
    (LIGHTNING, "*.ckpt"),
    (LIGHTNING, "*/*.ckpt"),
    (LIGHTNING, "*/*/checkpoints/*.ckpt"),  # lightning_logs/version_0/checkpoints/
    (LIGHTNING, "*/*/*/checkpoints/*.ckpt"),
)


@dataclass(frozen=True)
class ForeignCheckpoint:
    """A complete checkpoint of the script's own: where, and which layout it was seen as."""

    path: Path
    kind: str
    mtime: float

    def __str__(self) -> str:
        return f"{self.path} ({self.kind})"


def find_foreign_checkpoint(directories: Iterable[Path],
                            resumable_if: str | None = None) -> ForeignCheckpoint | None:
    """The newest complete checkpoint of a known layout under ``directories``, or of
    ``resumable_if`` (a glob, relative to the first directory unless absolute); None if none.
    Never raises: a directory that cannot be read holds nothing to resume from."""
    found = [checkpoint for directory in dict.fromkeys(Path(d) for d in directories)
             for kind, pattern in _PATTERNS
             for checkpoint in _matches(directory, pattern, kind)]
    if resumable_if:
        searched = [Path(os.path.abspath(d)) for d in directories]
        base = next(iter(searched), Path.cwd())
        found += [checkpoint for checkpoint in _matches(base, resumable_if, RESUMABLE_IF)
                  if not any(_within(d, checkpoint.path) for d in searched)]
    return max(found, key=lambda checkpoint: checkpoint.mtime, default=None)


def finder_for(workdir: str, options: Any) -> Callable[[], ForeignCheckpoint | None]:
    """What ``cycle run`` looks through for ``options`` (a ``RunOptions``): the workers' working
    directory and the checkpoint root, and ``--resumable-if``."""
    directories = [Path(workdir), Path(options.checkpoint_dir)]
    return lambda: find_foreign_checkpoint(directories, options.resumable_if)


def _matches(directory: Path, pattern: str, kind: str) -> list[ForeignCheckpoint]:
    """The complete checkpoints ``pattern`` names (relative to ``directory`` unless absolute,
    wildcards in any component, ``**`` recursive); never anything inside a ``.cycler/``
    record folder (cycle's own files are no checkpoint of the script's)."""
    try:
        paths = glob.glob(os.path.join(directory, pattern), recursive=True)
    except (OSError, ValueError):
        return []
    return [checkpoint for path in map(Path, paths)
            if ".cycler" not in path.parts and (checkpoint := _complete(path, kind)) is not None]


def _within(path: Path, directory: Path) -> bool:
    """Whether ``path`` is ``directory`` or inside it: a glob such as ``**`` also matches the
    directories searched (the working directory, the checkpoint root), which hold checkpoints
    but are none."""
    return path == directory or directory in path.parents


def _complete(path: Path, kind: str) -> ForeignCheckpoint | None:
    try:
        status = path.stat()
    except OSError:
        return None
    if kind == HUGGING_FACE:  # HF writes trainer_state.json last: whole only if it parses
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return ForeignCheckpoint(path.parent, kind, status.st_mtime)
    if kind == LIGHTNING and status.st_size == 0:
        return None
    return ForeignCheckpoint(path, kind, status.st_mtime)


def requeue_on_foreign_checkpoint(actions: Sequence[Any], config: Any,
                                  find: Callable[[], ForeignCheckpoint | None]) -> list[Any]:
    """``actions`` with an end for want of a checkpoint (exit 1, no worker failed) turned into a
    requeue (75) when ``find()`` sees a checkpoint of the script's own; ``config`` is the core's
    (its requeue policy). ``find`` is called only for such an end."""
    end = next((a for a in actions if isinstance(a, Exit)), None)
    if end is None or end.code != EXIT_FAILURE or end.workers_failed:
        return list(actions)
    foreign = find()
    if foreign is None:
        return list(actions)
    reason = (f"stopped; the script's own checkpoint {foreign} is the one to resume (none of "
              "cycler's exists)")
    kept = [a for a in actions if not (isinstance(a, Log) and a.event == "exit") and a is not end]
    seen = Log("foreign_checkpoint", {"path": str(foreign.path), "kind": foreign.kind})
    requeue = [Requeue()] if config.requeue and config.requeue_count < config.max_requeues \
        else []
    return [*kept, seen, *requeue, Log("exit", {"code": EXIT_REQUEUE, "reason": reason}),
            Exit(EXIT_REQUEUE, reason)]
