"""``cycle run``'s side of the step fingerprints: each restart's replayed steps, checked.

The workers append their fingerprints to files in the job's runtime directory on the node
(:mod:`cycler.training.fingerprints`). The supervisor, which outlives a kill -9 of its workers:

- reads what its node's workers appended since the last look, about once a second (local
  files only); when a worker's first record says it resumed at step ``N``, it loads the earlier
  runs' records of that rank (the checkpoint root's copy and the node's files) after ``N``;
- compares, and says the verdict once per start in the events log (``replay_verified``,
  ``replay_diverged``, ``replay_unchecked``; :mod:`cycler.protocol.replay`), as soon as a
  difference shows or every replayable step is compared, else when the workers end;
- copies what is new in the node's files to ``<root>/.cycler/fingerprints-node<N>.fp`` (one
  append) when a checkpoint is committed and when the workers end: so a requeue on another node
  finds them, and the shared root sees no per-step traffic.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cycler._private import PRIVATE_FILE_MODE
from cycler.checkpoint.runtime_dirs import job_runtime_dir, node_dir
from cycler.errors import CyclerError
from cycler.protocol.fingerprints import (
    ENV_FINGERPRINT_DIR,
    START,
    VALUE,
    Record,
    read_records,
    unpack,
)
from cycler.protocol.record import RunRecord
from cycler.protocol.replay import (
    DIVERGED,
    VERDICT_EVENTS,
    RankReplay,
    Segment,
    Verdict,
    compare,
    reference,
    segments,
    verdict,
)

log = logging.getLogger("cycler.supervisor")

CHECK_SECONDS = 1.0
"""How often the node's fingerprint files are read while workers run."""
FLUSHED_FILE = "flushed.json"
"""In the node's directory: how far each rank's file was copied to the root."""


def fingerprint_dir(record: RunRecord, node_rank: int) -> Path | None:
    """This node's directory for the workers' fingerprints in the job's runtime directory,
    created private; ``None`` (said once) where it cannot be: the records are for people, no
    reason to refuse a job."""
    try:
        return node_dir(job_runtime_dir(record), "fingerprints", node_rank)
    except (CyclerError, OSError) as error:
        log.warning("replayed steps are not checked: %s", error)
        return None


class ReplayWatch:
    """This node's workers' fingerprints: their restarts' verdicts and their copy to the root."""

    def __init__(self, run_record: RunRecord, node_rank: int,
                 find_directory: Callable[[], Path | None], *, stop: bool,
                 record: Callable[..., None], local_ranks: int | None = None) -> None:
        """``find_directory``: where this node's workers append (:func:`fingerprint_dir`;
        ``None``: nothing is recorded or checked), asked at the first start."""
        self._shared = run_record.fingerprints_path(node_rank)
        self._stop, self._record, self._local_ranks = stop, record, local_ranks
        self._find_directory: Callable[[], Path | None] | None = find_directory
        self.directory: Path | None = None
        self._offsets: dict[Path, int] = {}
        self._current: dict[int, Segment] = {}
        self._references: dict[int, Segment] = {}
        self._said: Verdict | None = None
        self._next_check = 0.0

    def environment(self) -> dict[str, str]:
        """What the workers need to record their fingerprints (nothing where they cannot)."""
        return {} if self.directory is None else {ENV_FINGERPRINT_DIR: str(self.directory)}

    def new_start(self) -> None:
        """The workers are (re)started: say the last group's verdict, copy its records, and
        read only what the new group appends from now on."""
        if self._find_directory is not None:  # this cycle run's first start
            self.directory, self._find_directory = self._find_directory(), None
            self.flush()  # what an earlier cycle run, killed, left uncopied; said nothing of
        else:
            self.end_of_group()
        try:
            self._offsets = {path: read_records(path)[1] for path in self._rank_files()}
        except OSError as error:
            log.warning("replayed steps are not checked: %s", error)
            self.directory = None
        self._current, self._references, self._said = {}, {}, None

    def check(self, now: float) -> Verdict | None:
        """Read what the workers appended (every :data:`CHECK_SECONDS` of ``now``, monotonic)
        and say a verdict that is due; the divergence that must end the job, if any."""
        if self.directory is None or now < self._next_check:
            return None
        self._next_check = now + CHECK_SECONDS
        try:
            return self._judge()
        except OSError as error:  # records for people: never the supervisor's end
            log.warning("cannot read the step fingerprints in %s: %s", self.directory, error)
            return None

    def _judge(self) -> Verdict | None:
        for path in self._rank_files():
            records, self._offsets[path] = read_records(path, self._offsets.get(path, 0))
            for record in records:
                self._take(record)
        found = self._compared()
        decided = verdict(found)
        if decided is None or self._said is not None or not self._due(decided, found):
            return None
        self._say(decided)
        return decided if decided.verdict == DIVERGED and self._stop else None

    def end_of_group(self) -> None:
        """The workers are gone: say what was compared if nothing was said yet, and copy the
        records to the root."""
        if self.directory is None:
            return
        self._next_check = 0.0
        self.check(0.0)
        decided = verdict(self._compared())
        if decided is not None and self._said is None:
            self._say(decided)
        self.flush()

    def finish(self, code: int) -> None:
        """The job's end on this node (``code``: ``cycle run``'s exit): the last group's
        verdict and copy; after a finished training (0) the node's records go, being in the
        root (nothing is left to replay)."""
        self.end_of_group()
        if code == 0 and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.directory.parent.rmdir()  # the job's, once no other part uses it

    def flush(self) -> None:
        """Append what the node's files hold beyond the last copy to the root's file: one
        write, whole records only (a cheap moment: a commit, the end of the workers)."""
        if self.directory is None:
            return
        try:
            self._copy_new_records(self.directory)
        except OSError as error:
            log.warning("cannot copy the step fingerprints to %s: %s", self._shared, error)

    def _copy_new_records(self, directory: Path) -> None:
        done = _read_json(directory / FLUSHED_FILE)
        chunks, copied = [], {}
        for path in self._rank_files():
            start = done.get(path.name, 0)
            start = start if isinstance(start, int) and start >= 0 else 0
            with open(path, "rb") as handle:
                handle.seek(start)
                data = handle.read()
            settled = unpack(data)[1]
            chunks.append(data[:settled])
            copied[path.name] = start + settled
        if any(chunks):
            _append(self._shared, b"".join(chunks))
        _write_json(directory / FLUSHED_FILE, {**done, **copied})

    def _take(self, record: Record) -> None:
        if record.kind == START:
            current = Segment(record.rank, record.start, record.step, record.bits)
            if record.rank in self._current:  # torchrun restarted the group (several nodes)
                self._current, self._references, self._said = {}, {}, None
            self._current[record.rank] = current
            self._references.pop(record.rank, None)
            found = self._reference_for(current)
            if found is not None:
                self._references[record.rank] = found
        elif record.kind == VALUE:
            mine = self._current.get(record.rank)
            if mine is not None and mine.start == record.start and self._said is None:
                mine.values.setdefault(record.step, (record.type, record.bits))

    def _reference_for(self, current: Segment) -> Segment | None:
        """The earlier run's segment ``current`` replays: from the root's copy and this
        node's files (the same records twice count once), values after its resume only."""
        assert self.directory is not None
        records = [r for path in (self._shared, *self._rank_files())
                   for r in read_records(path)[0] if r.rank == current.rank]
        earlier = [s for s in segments(records, after=current.resumed)
                   if s.start != current.start]
        return reference(earlier, current)

    def _compared(self) -> list[RankReplay]:
        return [compare(self._references[rank], current)
                for rank, current in sorted(self._current.items()) if rank in self._references]

    def _due(self, decided: Verdict, found: list[RankReplay]) -> bool:
        """A difference is said at once; a match once every rank compared all it can."""
        every_rank = self._local_ranks is None or len(self._current) >= self._local_ranks
        return decided.verdict == DIVERGED or (every_rank and all(r.complete for r in found))

    def _say(self, decided: Verdict) -> None:
        self._said = decided
        self._record(VERDICT_EVENTS[decided.verdict], warning=decided.verdict == DIVERGED,
                     **decided.fields())

    def _rank_files(self) -> list[Path]:
        if self.directory is None:
            return []
        return sorted(self.directory.glob("rank-*.fp"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_json(path: Path, value: dict[str, Any]) -> None:
    """``value`` into ``path``, replaced whole; 0600, as everything in the runtime directory."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)
        os.write(fd, json.dumps(value).encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
