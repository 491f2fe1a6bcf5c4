"""Keep every checkpoint a run commits, before the script's own retention removes it.

A script keeps what it keeps (``keep_last=3``), but verify compares the two runs at every step
both committed. While a run goes on, :class:`Capture` looks at its checkpoint root a hundred
times a second and hard-links each newly committed checkpoint's files into an archive beside
it: no data is copied, and a checkpoint removed later stays whole in the archive. A checkpoint
removed before it was seen, or while it was being linked, is recorded as missed.
"""

from __future__ import annotations

import os
import shutil
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

    def __init__(self, root: Path, archive: Path) -> None:
        self.root = root
        self.archive = archive
        self.kept: list[Captured] = []
        self.missed: list[str] = []
        self.segment = 0
        self._seen: set[str] = set()

    def poll(self) -> list[Captured]:
        """Keep what was committed since the last poll; returns the new ones."""
        new = []
        for prefix in _prefixes(self.root):
            layout = CheckpointLayout(self.root, prefix)
            for name in layout.checkpoint_names():
                entry = str(name)
                if entry not in self._seen and (layout.path_of(name) / MANIFEST_NAME).exists():
                    self._seen.add(entry)
                    kept = self._keep(layout.path_of(name), entry)
                    if kept is not None:
                        new.append(kept)
        self.kept.extend(new)
        return new

    def _keep(self, source: Path, entry: str) -> Captured | None:
        target = self.archive / f"{len(self.kept):04d}-{entry}"
        try:
            manifest = read_manifest(source)
            _link_files(source, target, [*manifest.files, MANIFEST_NAME])
            problem = check_files(target, manifest)
        except (OSError, CyclerError) as error:
            problem = str(error)
        if problem is not None:
            self.missed.append(f"{entry} ({problem})")
            shutil.rmtree(target, ignore_errors=True)
            return None
        return Captured(target, entry, manifest, self.segment)


def _prefixes(root: Path) -> list[str]:
    try:
        return saver_prefixes(root)
    except OSError:
        return []


def _link_files(source: Path, target: Path, names: list[str]) -> None:
    for name in names:
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.link(source / name, destination)
