"""Checkpoints a plain script keeps in its own layout, recognised so that its stop is requeued.

A script that never imports cycler still saves: Hugging Face's ``Trainer`` writes
``checkpoint-N/`` folders, Lightning ``.ckpt`` files, Accelerate ``save_state`` folders
(``step_N/``, ``epoch_N/``, ``checkpoints/checkpoint_N/``), nanoGPT and many loops a
``torch.save`` file (``out/ckpt.pt``). When its workers end on a stop and no checkpoint of
cycler's exists, one of these means that a rerun resumes (the script's own resume), so
``cycle run`` asks to be requeued (75) and names it, instead of ending the job (1).

Only complete checkpoints written since the job began count (the first ``cycle run`` on this
checkpoint root, in its events log): a pretrained file that was there before never does. HF's
folder once it holds ``trainer_state.json`` (HF writes it last), a ``.ckpt`` that is not empty
(Lightning writes it aside and moves it in), a ``torch.save`` file or Accelerate's
``random_states_0.pkl`` that is a whole zip archive (torch writes the archive's directory last),
and anything ``--resumable-if GLOB`` matches. When nothing counts, the end names
``--resumable-if`` and the files that looked like checkpoints. The search is a fixed set of
shallow patterns, so a working directory that also holds a dataset of millions of files is never
walked.
"""

from __future__ import annotations

import glob
import json
import os
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cycler.checkpoint.layout import is_checkpoint_name
from cycler.protocol.events import read_events
from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE
from cycler.protocol.record import is_record_directory
from cycler.supervisor.decisions.vocabulary import NO_CHECKPOINT_TO_RESUME, Exit, Log, Requeue

HUGGING_FACE = "Hugging Face checkpoint-N"
LIGHTNING = "Lightning .ckpt"
ACCELERATE = "Accelerate save_state folder"
TORCH_SAVE = "torch.save file"
RESUMABLE_IF = "--resumable-if"

_PATTERNS: tuple[tuple[str, str], ...] = (
    (HUGGING_FACE, "checkpoint-*/trainer_state.json"),
    (HUGGING_FACE, "*/checkpoint-*/trainer_state.json"),
    (HUGGING_FACE, "*/*/checkpoint-*/trainer_state.json"),  # output_dir=runs/exp
    (LIGHTNING, "*.ckpt"),
    (LIGHTNING, "*/*.ckpt"),
    (LIGHTNING, "*/*/checkpoints/*.ckpt"),  # lightning_logs/version_0/checkpoints/
    (LIGHTNING, "*/*/*/checkpoints/*.ckpt"),
    # save_state(output_dir) as run_clm_no_trainer names it, and its automatic naming
    *((ACCELERATE, f"{where}{folder}/random_states_0.pkl") for where in ("", "*/")
      for folder in ("step_*", "epoch_*", "checkpoints/checkpoint_*")),
    *((TORCH_SAVE, f"{where}*.{suffix}") for where in ("", "*/") for suffix in ("pt", "pth")),
)
CANDIDATE_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors", ".pkl", ".npz", ".h5",
                      ".msgpack", ".distcp")
"""What a file a script wrote during the job is named when it could be a checkpoint that
``--resumable-if`` should name."""
SHOWN_CANDIDATES = 5
_SCANNED_ENTRIES = 20_000
TIMESTAMP_SLACK = 2.0
"""Seconds before the job's start that still count as written during it (coarse mtimes)."""


@dataclass(frozen=True)
class ForeignCheckpoint:
    """A complete checkpoint of the script's own: where, and which layout it was seen as."""

    path: Path
    kind: str
    mtime: float

    def __str__(self) -> str:
        return f"{self.path} ({self.kind})"


@dataclass(frozen=True)
class ForeignSearch:
    """What a search found: the checkpoint to resume (or None), and the files that looked like
    checkpoints but do not count, each with why (``"out/ckpt.pt (from before the job)"``)."""

    found: ForeignCheckpoint | None
    candidates: tuple[str, ...] = field(default=())


def find_foreign_checkpoint(directories: Iterable[Path], resumable_if: str | None = None, *,
                            since: float | None = None) -> ForeignCheckpoint | None:
    """The newest complete checkpoint of a known layout under ``directories``, or of
    ``resumable_if`` (a glob, relative to the first directory unless absolute), written at or
    after ``since`` (wall clock; None: whenever); None if none. Never raises: a directory that
    cannot be read holds nothing to resume from."""
    return search_foreign_checkpoints(directories, resumable_if, since=since).found


def search_foreign_checkpoints(directories: Iterable[Path], resumable_if: str | None = None, *,
                               since: float | None = None) -> ForeignSearch:
    """:func:`find_foreign_checkpoint`, with the candidates that did not count."""
    searched = list(dict.fromkeys(Path(os.path.abspath(d)) for d in directories))
    seen = [checkpoint for directory in searched for kind, pattern in _PATTERNS
            for checkpoint in _matches(directory, pattern, kind)]
    if resumable_if:
        base = next(iter(searched), Path.cwd())
        seen += [checkpoint for checkpoint in _matches(base, resumable_if, RESUMABLE_IF)
                 if not any(_within(d, checkpoint.path) for d in searched)]
    counted = [c for c in seen if c.kind != _TORN and (since is None or
                                                      c.mtime >= since - TIMESTAMP_SLACK)]
    found = max(counted, key=lambda checkpoint: checkpoint.mtime, default=None)
    if found is not None:
        return ForeignSearch(found)
    return ForeignSearch(None, _candidates(searched, seen, since))


def finder_for(workdir: str, options: Any) -> Callable[[], ForeignSearch]:
    """What ``cycle run`` looks through for ``options`` (a ``RunOptions``): the workers' working
    directory and the checkpoint root, ``--resumable-if``, and since when (the job's start)."""
    directories = [Path(workdir), Path(options.checkpoint_dir)]
    events, created = options.record.events_path(options.node_rank), time.time()
    return lambda: search_foreign_checkpoints(directories, options.resumable_if,
                                              since=job_start(events, created))


def job_start(events: Path, default: float) -> float:
    """When the job began: the first ``cycle run`` start its events log holds (requeued runs
    continue the same job), else ``default``."""
    for record in read_events(events):
        if record["event"] == "start":
            started = record.get("process_started", record["time"])
            return float(started) if isinstance(started, int | float) else record["time"]
    return default


_TORN = "torn"


def _matches(directory: Path, pattern: str, kind: str) -> list[ForeignCheckpoint]:
    """The checkpoints ``pattern`` names (relative to ``directory`` unless absolute, wildcards
    in any component, ``**`` recursive), a torn one as kind ``_TORN``; never anything inside a
    ``.cycler/`` record folder or a checkpoint of cycler's (no checkpoint of the script's)."""
    try:
        paths = glob.glob(os.path.join(directory, pattern), recursive=True)
    except (OSError, ValueError):
        return []
    return [checkpoint for path in map(Path, paths)
            if not _cyclers(path, directory) and (checkpoint := _complete(path, kind)) is not None]


def _cyclers(path: Path, directory: Path) -> bool:
    """Whether ``path`` is in cycle's record folder or a checkpoint of cycler's, below
    ``directory`` (which may itself have any name)."""
    below = path.relative_to(directory).parts if _within(path, directory) else path.parts
    return any(is_record_directory(part) or is_checkpoint_name(part) for part in below)


def _within(path: Path, directory: Path) -> bool:
    """Whether ``path`` is ``directory`` or inside it: a glob such as ``**`` also matches the
    directories searched (the working directory, the checkpoint root), which hold checkpoints
    but are none."""
    return path == directory or directory in path.parents


def _complete(path: Path, kind: str) -> ForeignCheckpoint | None:
    """``path`` as the checkpoint it is (a torn one as kind ``_TORN``); None if it is none."""
    try:
        status = path.stat()
    except OSError:
        return None
    if kind == HUGGING_FACE:  # HF writes trainer_state.json last: whole only if it parses
        try:
            json.loads(path.read_text())
        except (OSError, ValueError):
            return ForeignCheckpoint(path.parent, _TORN, status.st_mtime)
        return ForeignCheckpoint(path.parent, kind, status.st_mtime)
    if kind == LIGHTNING and status.st_size == 0:
        return ForeignCheckpoint(path, _TORN, status.st_mtime)
    if kind in (ACCELERATE, TORCH_SAVE):
        if not path.is_file():
            return None
        whole = _whole_archive(path)
        where = path.parent if kind == ACCELERATE else path
        return ForeignCheckpoint(where, kind if whole else _TORN, status.st_mtime)
    return ForeignCheckpoint(path, kind, status.st_mtime)


def _whole_archive(path: Path) -> bool:
    """Whether ``path`` is a whole zip archive (torch.save's format since torch 1.6): its
    central directory, written last, is there and lists a ``data.pkl``."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("data.pkl") for name in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _candidates(searched: Sequence[Path], seen: Sequence[ForeignCheckpoint],
                since: float | None) -> tuple[str, ...]:
    """The files that looked like checkpoints and why each does not count: torn, from before
    the job, or of no layout known (written during the job with a checkpoint's suffix)."""
    said: dict[Path, str] = {}
    for checkpoint in sorted(seen, key=lambda c: -c.mtime):
        why = "incomplete" if checkpoint.kind == _TORN else "from before the job"
        said.setdefault(checkpoint.path, why)
    if since is not None:
        for path in _recent_files(searched, since - TIMESTAMP_SLACK):
            if not any(_within(path, known) for known in said):
                said.setdefault(path, "written during the job, of no layout cycle knows")
    return tuple(f"{_shown(path, searched)} ({why})" for path, why in said.items())


def _recent_files(directories: Sequence[Path], since: float) -> list[Path]:
    """Files with a checkpoint's suffix, modified at or after ``since``, at most two directories
    down (hidden folders and cycler's own left out), looking at no more than
    ``_SCANNED_ENTRIES`` entries."""
    found: list[Path] = []
    budget = _SCANNED_ENTRIES
    queue = [(directory, 0) for directory in directories]
    while queue and budget > 0:
        directory, depth = queue.pop(0)
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    budget -= 1
                    if budget <= 0:
                        break
                    if entry.name.startswith(".") or is_checkpoint_name(entry.name):
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        if depth < 2:
                            queue.append((Path(entry.path), depth + 1))
                    elif entry.name.endswith(CANDIDATE_SUFFIXES) and \
                            entry.stat().st_mtime >= since:
                        found.append(Path(entry.path))
        except OSError:
            continue
    return found


def _shown(path: Path, searched: Sequence[Path]) -> str:
    for directory in searched:
        if _within(path, directory) and path != directory:
            return str(path.relative_to(directory))
    return str(path)


def requeue_on_foreign_checkpoint(actions: Sequence[Any], config: Any,
                                  find: Callable[[], ForeignSearch]) -> list[Any]:
    """``actions`` with an end for want of a checkpoint (exit 1, no worker failed) turned into a
    requeue (75) when ``find()`` sees a checkpoint of the script's own; ``config`` is the core's
    (its requeue policy). ``find`` is called only for such an end. A stop's end for want of any
    checkpoint that finds none of the script's names ``--resumable-if`` and what it saw."""
    end = next((a for a in actions if isinstance(a, Exit)), None)
    if end is None or end.code != EXIT_FAILURE or end.workers_failed:
        return list(actions)
    search = find()
    foreign = search.found
    if foreign is None:
        if end.reason != NO_CHECKPOINT_TO_RESUME:
            return list(actions)
        return _replace_end(actions, end, [], EXIT_FAILURE, _nothing_recognised(search))
    reason = (f"stopped; the script's own checkpoint {foreign} is the one to resume (none of "
              "cycler's exists)")
    seen = Log("foreign_checkpoint", {"path": str(foreign.path), "kind": foreign.kind})
    requeue = [Requeue()] if config.requeue and config.requeue_count < config.max_requeues \
        else []
    return _replace_end(actions, end, [seen, *requeue], EXIT_REQUEUE, reason)


def _nothing_recognised(search: ForeignSearch) -> str:
    shown = list(search.candidates[:SHOWN_CANDIDATES])
    more = len(search.candidates) - len(shown)
    if more:
        shown.append(f"and {more} more")
    saw = "; saw " + ", ".join(shown) if shown else \
        "; no file written during the job looked like a checkpoint"
    return (f"{NO_CHECKPOINT_TO_RESUME}: if the script keeps checkpoints of its own, name them "
            f"with --resumable-if GLOB{saw}")


def _replace_end(actions: Sequence[Any], end: Exit, before: list[Any], code: int,
                 reason: str) -> list[Any]:
    kept = [a for a in actions if not (isinstance(a, Log) and a.event == "exit") and a is not end]
    return [*kept, *before, Log("exit", {"code": code, "reason": reason},
                                warning=code == EXIT_FAILURE), Exit(code, reason)]
