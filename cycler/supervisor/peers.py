"""Whether the other nodes of a job are still there, through the shared checkpoint root.

Every node's supervisor replaces ``.cycler/alive-node<R>.json`` about once a second with a
growing beat number, and with its exit code when it ends. A node whose supervisor was killed
with SIGKILL (or whose host died) stops beating; its workers are gone, so every collective and
every rendezvous round of the job would wait for it: torchrun's rendezvous for its join timeout
(600 s by default), NCCL for its collective timeout. The other supervisors notice the silence
after ``timeout`` seconds and end their own workers.

Only the beat number is compared, with the reader's own monotonic clock: no two hosts' clocks
are ever compared, and a file's mtime (which NFS caches) is never read. A peer counts as alive
only once its beat has changed while this supervisor watched, so a record left by an earlier
run is never mistaken for a live node, nor a node that has not started yet for a dead one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from cycler._fs import atomic_write_bytes
from cycler.checkpoint.layout import CheckpointLayout
from cycler.protocol.exit_codes import EXIT_REQUEUE, EXIT_SUCCESS

BEAT_SECONDS = 1.0
"""How often a supervisor shows it is alive."""
CHECK_SECONDS = 1.0
"""How often a supervisor reads the other nodes' records."""


class Heartbeat:
    """This node's record: beats while the supervisor runs, its exit code when it ends."""

    def __init__(self, layout: CheckpointLayout, node_rank: int) -> None:
        self._path = layout.heartbeat_path(node_rank)
        self._record: dict[str, object] = {"node": node_rank, "host": socket.gethostname(),
                                           "pid": os.getpid(), "exit_code": None}
        self._beat = 0
        self._last: float | None = None

    def beat(self, now: float) -> None:
        """Replace the record with the next beat, at most every :data:`BEAT_SECONDS`."""
        if self._last is not None and now - self._last < BEAT_SECONDS:
            return
        self._last = now
        self._write()

    def finish(self, exit_code: int) -> None:
        """Say how this supervisor ended: the others stop waiting for a failed node."""
        self._record["exit_code"] = exit_code
        self._write()

    def _write(self) -> None:
        self._beat += 1
        record = {**self._record, "beat": self._beat}
        # Not durable: a heartbeat that a crash loses only means the node looks silent.
        with contextlib.suppress(OSError):
            atomic_write_bytes(self._path, json.dumps(record).encode(), durable=False)


@dataclass
class _Seen:
    beat: object
    changed_at: float
    alive: bool = False


@dataclass(frozen=True)
class Loss:
    """Node ``node`` is gone; ``why`` in words; ``failed``: it ended in a failure."""

    node: int
    why: str
    failed: bool


@dataclass
class PeerWatch:
    """Reads the other nodes' records and says when one of them is gone."""

    layout: CheckpointLayout
    node_rank: int
    nnodes: int
    timeout: float
    """Seconds of silence after which a node that was alive counts as gone."""
    _seen: dict[int, _Seen] = field(default_factory=dict)
    _checked_at: float | None = None

    def lost(self, now: float) -> Loss | None:
        """The first node found gone (read at most every :data:`CHECK_SECONDS`), or ``None``."""
        if self._checked_at is not None and now - self._checked_at < CHECK_SECONDS:
            return None
        self._checked_at = now
        for node in range(self.nnodes):
            if node != self.node_rank:
                loss = self._check(node, now)
                if loss is not None:
                    return loss
        return None

    def _check(self, node: int, now: float) -> Loss | None:
        record = _read(self.layout.heartbeat_path(node))
        beat = record.get("beat")
        seen = self._seen.get(node)
        if seen is None:
            self._seen[node] = _Seen(beat, now)
            return None
        if beat != seen.beat:
            seen.beat, seen.changed_at, seen.alive = beat, now, True
            code = record.get("exit_code")
            if code is not None and code not in (EXIT_SUCCESS, EXIT_REQUEUE):
                return Loss(node, f"failed (its supervisor exited {code})", failed=True)
            return None
        if seen.alive and record.get("exit_code") is None and now - seen.changed_at > self.timeout:
            return Loss(node, f"is gone: its supervisor has not been heard for "
                              f"{now - seen.changed_at:.0f} s (--node-timeout {self.timeout:g})",
                        failed=False)
        return None


def _read(path: Path) -> dict[str, object]:
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
