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
Where the nodes share a run token (under Slurm the job id and its requeue count; else an
explicit ``--rdzv-id``), a record of this run counts at once: a node that failed before this
one looked is found at once, and an earlier run's record never counts.

A node never heard is said after ``timeout`` ("waiting for node 1: no heartbeat yet"); after
``start_timeout`` (``--start-timeout``, :data:`START_TIMEOUT` by default; torchrun's rendezvous is
given a little longer) it is lost as never started, and
so is one still unheard ``timeout`` after this node's workers made their first step (the
rendezvous completed, so it runs: it writes its records under another root, which the nodes
must share).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from dataclasses import dataclass, field

from cycler._fs import atomic_write_bytes, read_json_object
from cycler.checkpoint.layout import CheckpointLayout
from cycler.protocol.exit_codes import EXIT_REQUEUE, EXIT_SUCCESS

BEAT_SECONDS = 1.0
"""How often a supervisor shows it is alive."""
CHECK_SECONDS = 1.0
"""How often a supervisor reads the other nodes' records."""
START_TIMEOUT = 600.0
"""Seconds a node may stay unheard from the start before the job gives it up (torchrun's own
default rendezvous join timeout)."""


class Heartbeat:
    """This node's record: beats while the supervisor runs, its exit code when it ends."""

    def __init__(self, layout: CheckpointLayout, node_rank: int,
                 run: str | None = None) -> None:
        self._path = layout.heartbeat_path(node_rank)
        self._record: dict[str, object] = {"node": node_rank, "host": socket.gethostname(),
                                           "pid": os.getpid(), "exit_code": None, "run": run}
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
    run: str | None = None
    """This run's token, shared by every node of it (``None``: no token to go by)."""
    start_timeout: float = START_TIMEOUT
    _seen: dict[int, _Seen] = field(default_factory=dict)
    _checked_at: float | None = None
    _started_at: float | None = None
    _stepping_since: float | None = None
    _said_waiting: set[int] = field(default_factory=set)
    _ended: dict[int, object] = field(default_factory=dict)
    """Exit codes of the nodes that ended after they were seen alive in this run."""

    def lost(self, now: float, stepping: bool = False) -> Loss | None:
        """The first node found gone (read at most every :data:`CHECK_SECONDS`), or ``None``.
        ``stepping``: this node's workers have made a step (the rendezvous completed)."""
        if self._started_at is None:
            self._started_at = now
        if stepping and self._stepping_since is None:
            self._stepping_since = now
        if self._checked_at is not None and now - self._checked_at < CHECK_SECONDS:
            return None
        self._checked_at = now
        for node in range(self.nnodes):
            if node != self.node_rank:
                loss = self._check(node, now) or self._never_heard(node, now)
                if loss is not None:
                    return loss
        return None

    def requeued(self) -> Loss | None:
        """A node seen alive in this run that has since ended the job with exit 75 (it gave
        this node up while this one was not heard from: frozen, or cut off), or ``None``."""
        node = next((n for n, code in self._ended.items() if code == EXIT_REQUEUE), None)
        if node is None:
            return None
        return Loss(node, "ended the job with exit 75 while this node was not heard from",
                    failed=False)

    def waiting(self, now: float) -> list[int]:
        """Nodes still unheard ``timeout`` after the start, each returned once."""
        if self._started_at is None or now - self._started_at < self.timeout:
            return []
        late = [node for node, seen in self._seen.items()
                if not seen.alive and node not in self._said_waiting]
        self._said_waiting.update(late)
        return late

    def _never_heard(self, node: int, now: float) -> Loss | None:
        seen = self._seen.get(node)
        if seen is None or seen.alive or self._started_at is None:
            return None
        root = self.layout.root
        if self._stepping_since is not None and now - self._stepping_since > self.timeout:
            return Loss(node, f"writes no heartbeat in {root} although the job runs: the nodes "
                              "do not share the checkpoint root (every node must see the same "
                              "directory)", failed=True)
        if now - self._started_at > self.start_timeout:
            return Loss(node, f"never started: no heartbeat from its cycle run in "
                              f"{self.start_timeout:g} s (is it running, with the same "
                              f"checkpoint root {root}?)", failed=True)
        return None

    def _check(self, node: int, now: float) -> Loss | None:
        record = read_json_object(self.layout.heartbeat_path(node))
        beat = record.get("beat")
        seen = self._seen.get(node)
        ours = self.run is not None and record.get("run") == self.run
        if seen is None:
            seen = self._seen[node] = _Seen(beat, now, alive=ours)
            return _failed(node, record) if ours else None
        if beat != seen.beat:
            seen.beat, seen.changed_at, seen.alive = beat, now, True
            if record.get("exit_code") is not None:
                self._ended[node] = record.get("exit_code")
            return _failed(node, record)
        if seen.alive and record.get("exit_code") is None and now - seen.changed_at > self.timeout:
            return Loss(node, f"is gone: its supervisor has not been heard for "
                              f"{now - seen.changed_at:.0f} s (--node-timeout {self.timeout:g})",
                        failed=False)
        return None


def _failed(node: int, record: dict[str, object]) -> Loss | None:
    code = record.get("exit_code")
    if code is not None and code not in (EXIT_SUCCESS, EXIT_REQUEUE):
        return Loss(node, f"failed (its supervisor exited {code})", failed=True)
    return None


