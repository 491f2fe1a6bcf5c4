"""The control file: how the supervisor asks workers to checkpoint or stop (docs/design.md).

The supervisor is the only writer and always replaces the file atomically, so a reader sees a
whole request or the previous one. Workers poll it cheaply: a ``stat`` per check, and a read only
when the file was replaced (atomic replacement always changes the inode).

What workers speak of the protocol (and so how a stop reaches them) is told apart, in
:mod:`cycler.protocol.features`.
"""

from __future__ import annotations

import enum
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cycler._fs import atomic_write_bytes
from cycler.protocol.environment import ENV_CHECKPOINT_DIR, ENV_CONTROL_FILE, ENV_NODE_DIR
from cycler.protocol.features import USES_CONTROL, announce
from cycler.protocol.names import CONTROL_FILENAME, every_node
from cycler.protocol.record import RunRecord

CONTROL_VERSION = 1

WORKER_STARTED_AT = time.time()
"""About when this process started (cycler's import): a stop asked for before it was not."""


class Action(str, enum.Enum):
    """What the supervisor asks of the workers."""

    RUN = "run"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_AND_EXIT = "checkpoint_and_exit"


@dataclass(frozen=True, kw_only=True)
class ControlRequest:
    """One request. ``sequence`` grows with every request written in a job."""

    sequence: int
    action: Action
    reason: str
    requested_at: float
    """Wall-clock time (``time.time()``) the request was written."""
    deadline: float | None = None
    """Wall-clock time by which workers must be gone; ``None`` for no deadline."""
    version: int = CONTROL_VERSION

    def to_json(self) -> str:
        fields = asdict(self)
        fields["action"] = self.action.value
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ControlRequest:
        """Parse a request; raises ``ValueError`` for anything that is not one."""
        fields = json.loads(text)
        if not isinstance(fields, dict) or fields.get("version") != CONTROL_VERSION:
            raise ValueError(f"not a version {CONTROL_VERSION} control request: {text[:80]!r}")
        return cls(
            sequence=int(fields["sequence"]),
            action=Action(fields["action"]),
            reason=str(fields["reason"]),
            requested_at=float(fields["requested_at"]),
            deadline=None if fields.get("deadline") is None else float(fields["deadline"]),
        )


def write_control(path: Path, request: ControlRequest) -> None:
    """Atomically replace the control file at ``path`` with ``request``.

    Not fsynced: the workers read it from the same machine's page cache (or the shared
    filesystem's) within milliseconds, and an fsync on a busy disk was seen to take 0.7 s,
    all of it added to the time a stop takes. After a power cut the file means nothing anyway.
    """
    atomic_write_bytes(Path(path), request.to_json().encode(), durable=False)


def read_control(path: Path) -> ControlRequest | None:
    """The request in ``path``; ``None`` when the file is missing or not a valid request."""
    try:
        return ControlRequest.from_json(Path(path).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stops_since(paths: list[Path], since: float) -> list[ControlRequest]:
    """The ``checkpoint_and_exit`` requests in the control files ``paths`` made at or after
    ``since`` (wall-clock time)."""
    requests = (read_control(path) for path in paths)
    return [request for request in requests
            if request is not None and request.action is Action.CHECKPOINT_AND_EXIT
            and request.requested_at >= since]


def stop_requested_since(paths: list[Path], since: float) -> bool:
    """Whether any of the control files ``paths`` asks for ``checkpoint_and_exit`` made at or
    after ``since`` (wall-clock time)."""
    return bool(stops_since(paths, since))


def earliest_deadline(requests: list[ControlRequest]) -> float | None:
    """The earliest deadline ``requests`` set (``None``: none sets one)."""
    return min((request.deadline for request in requests if request.deadline is not None),
               default=None)


def stop_requested_of_this_job(since: float = WORKER_STARTED_AT) -> bool:
    """Under ``cycle run``: whether a supervisor of this job (any node) asked for
    ``checkpoint_and_exit`` since ``since``. Reads ``$CYCLER_CONTROL_FILE``, the control files
    beside it and, where it is on the node (``$CYCLER_NODE_DIR``), every node's copy in the
    checkpoint root (called at commits, never at every step)."""
    control = os.environ.get(ENV_CONTROL_FILE)
    if not control:
        return False
    paths = {Path(control), *Path(control).parent.glob(every_node(CONTROL_FILENAME))}
    root = os.environ.get(ENV_CHECKPOINT_DIR)
    if root and os.environ.get(ENV_NODE_DIR):
        paths.update(RunRecord(root).control_paths())
    return stop_requested_since(sorted(paths), since)


class ControlFileWatcher:
    """Reports each new request in a control file once, at the cost of one ``stat`` per poll.

    Making one announces :data:`USES_CONTROL`: this worker will honour the stop requests.
    """

    def __init__(self, path: Path | str | None) -> None:
        self.path = None if path is None else Path(path)
        if self.path is not None:
            announce(USES_CONTROL, self.path)
        self._seen_identity: tuple[int, int, int] | None = None
        self._last_sequence = -1

    def poll(self) -> ControlRequest | None:
        """The request written since the last poll, if any (``None`` without a control file)."""
        if self.path is None:
            return None
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if identity == self._seen_identity:
            return None
        self._seen_identity = identity
        request = read_control(self.path)
        if request is None or request.sequence <= self._last_sequence:
            return None
        self._last_sequence = request.sequence
        return request
