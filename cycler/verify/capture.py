"""Keep every checkpoint a run commits, before the script's own retention removes it.

A script keeps what it keeps (``keep_last=3``), but verify compares the two runs at every step
both committed. While a run goes on, :class:`Capture` looks at its checkpoint root a hundred
times a second and hard-links each newly committed checkpoint's files into an archive beside
it: no data is copied, and a checkpoint removed later stays whole in the archive. A checkpoint
removed before it was seen, or while it was being linked, is recorded as missed.

Under the memory tier a run commits to its memory root (node memory) first and persists only
some checkpoints to the root: the capture looks there too, first, and copies what it cannot
link across file systems; one the tier removed before it was kept is looked for again in the
root, and recorded as missed only there.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout, saver_prefixes
from cycler.checkpoint.manifest import Manifest, check_files, read_manifest
from cycler.errors import CyclerError


@dataclass(frozen=True)
class Captured:
    """One committed checkpoint, kept in the archive."""

    path: Path
    """The archive's copy (hard links)."""
    name: str
    """Its name in the run's root (``AtomicDirectory_checkpoint_7``)."""
    manifest: Manifest
    segment: int
    """Which start of the run committed it (0: the first)."""

    @property
    def step(self) -> int | None:
        return self.manifest.step


class Capture:
    """The checkpoints one run committed, in the order they were seen."""

    def __init__(self, root: Path, archive: Path, memory: Path | None = None) -> None:
        self.root = root
        self.archive = archive
        self.memory = memory
        """The run's memory root, where the memory tier commits first (``None``: no tier)."""
        self.kept: list[Captured] = []
        self.missed: list[str] = []
        self._starts: list[float] = []
        """When each start after the first began (its interruption: a kill, or a stopped
        start's exit), on the clock of the manifests' ``created_at``."""
        self._seen: set[str] = set()

    @property
    def segment(self) -> int:
        """Which start of the run goes on now (0: the first)."""
        return len(self._starts)

    def next_segment(self) -> None:
        """A new start begins now: checkpoints committed from now on belong to it."""
        self._starts.append(time.time())

    def segment_of(self, manifest: Manifest) -> int:
        """The start that committed a checkpoint, by its commit time: one kept late (the root's
        copy of a checkpoint the memory tier removed before it was seen) belongs to the start
        that committed it, not to the one going on when it was kept."""
        return sum(1 for start in self._starts if start <= manifest.created_at)

    def newest(self) -> Captured | None:
        """The kept checkpoint of the latest step (the last kept where steps are unknown): under
        the memory tier one persisted to the root may be kept after a newer one in memory."""
        if not self.kept or any(c.step is None for c in self.kept):
            return self.kept[-1] if self.kept else None
        return max(reversed(self.kept), key=lambda c: c.step or 0)

    def poll(self) -> list[Captured]:
        """Keep what was committed since the last poll; returns the new ones."""
        new: list[Captured] = []
        for tier in (self.memory, self.root):
            if tier is None:
                continue
            for prefix in _prefixes(tier):
                layout = CheckpointLayout(tier, prefix)
                for name in layout.checkpoint_names():
                    entry = str(name)
                    if entry not in self._seen and (layout.path_of(name) / MANIFEST_NAME).exists():
                        kept = self._keep(layout.path_of(name), entry, len(self.kept) + len(new),
                                          durable=tier == self.root)
                        if kept is not None:
                            new.append(kept)
        self.kept.extend(new)
        return new

    def _keep(self, source: Path, entry: str, number: int, durable: bool) -> Captured | None:
        """Keep ``source``; a failure is final in the root only (a checkpoint the memory tier
        removed meanwhile may still be persisted)."""
        target = self.archive / f"{number:04d}-{entry}"
        try:
            manifest = read_manifest(source)
            _link_files(source, target, [*manifest.files, MANIFEST_NAME])
            problem = check_files(target, manifest)
        except (OSError, CyclerError) as error:
            problem = str(error)
        if problem is not None:
            shutil.rmtree(target, ignore_errors=True)
            if durable:
                self._seen.add(entry)
                self.missed.append(f"{entry} ({problem})")
            return None
        self._seen.add(entry)
        return Captured(target, entry, manifest, self.segment_of(manifest))


def _prefixes(root: Path) -> list[str]:
    try:
        return saver_prefixes(root)
    except OSError:
        return []


def _link_files(source: Path, target: Path, names: list[str]) -> None:
    """Hard links, or copies where ``source`` is on another file system (node memory)."""
    for name in names:
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            os.link(source / name, destination)
        except OSError as error:
            if error.errno != errno.EXDEV:
                raise
            shutil.copyfile(source / name, destination)
