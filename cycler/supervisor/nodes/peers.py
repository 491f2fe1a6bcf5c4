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
import dataclasses
import json
import os
import socket
from dataclasses import dataclass, field

from cycler._fs import atomic_write_bytes, read_json_object
from cycler.protocol.exit_codes import EXIT_REQUEUE, EXIT_SUCCESS
from cycler.protocol.record import RunRecord
from cycler.supervisor.nodes.root_io import RootIO
from cycler.supervisor.nodes.store_link import StoreLink

VERDICT_NODE = -1
"""Where :meth:`StoreLink.records` puts node 0's verdict on the other nodes."""

BEAT_SECONDS = 1.0
"""How often a supervisor shows it is alive."""
CHECK_SECONDS = 1.0
"""How often a supervisor reads the other nodes' records (their files; what the store's link
read last is looked at every time)."""
FILE_BEAT_SECONDS = 10.0
"""While the store is reached, how often a supervisor still beats in its file (the
supervisor passes a third of ``--node-timeout``): what the other nodes go by where the store
fails them."""
START_TIMEOUT = 600.0
"""Seconds a node may stay unheard from the start before the job gives it up (torchrun's own
default rendezvous join timeout)."""


class Heartbeat:
    """This node's record: beats while the supervisor runs, its exit code when it ends. With
    a ``link`` to the job's store, the beats go there while it is reached; the file is written
    at the other beats (before the store is reached: torch's import may take seconds) and at
    the end (what the other nodes read where the store is gone). With ``root_io``, the beats'
    file is written in its thread: a frozen root never holds up the caller (a beat whose
    write is still under way is skipped); the end's, at once."""

    def __init__(self, record: RunRecord, node_rank: int,
                 run: str | None = None, link: StoreLink | None = None,
                 file_every: float = FILE_BEAT_SECONDS, root_io: RootIO | None = None) -> None:
        self._path = record.heartbeat_path(node_rank)
        self._link, self._file_every, self._root_io = link, file_every, root_io
        self._written: float | None = None
        self._record: dict[str, object] = {"node": node_rank, "host": socket.gethostname(),
                                           "pid": os.getpid(), "exit_code": None, "run": run}
        self._beat = 0
        self._last: float | None = None

    def beat(self, now: float) -> None:
        """Replace the record with the next beat, at most every :data:`BEAT_SECONDS`."""
        if self._last is not None and now - self._last < BEAT_SECONDS:
            return
        self._last = now
        stored = self._link is not None and self._link.connected
        if stored and self._written is not None and now - self._written < self._file_every:
            self._beat += 1
            self._link.publish({**self._record, "beat": self._beat})  # type: ignore[union-attr]
            return
        self._written = now  # also while the store is reached, now and then: what a node 0
        self._beat += 1  # that cannot read its own store (overloaded) goes by
        record = {**self._record, "beat": self._beat}
        if self._root_io is None:
            self._write(record)
        elif not self._root_io.busy("heartbeat"):  # else the root is slow: the store beats
            self._root_io.submit("heartbeat", lambda: self._write(record))
        if stored:
            self._link.publish(record)  # type: ignore[union-attr]

    def finish(self, exit_code: int) -> None:
        """Say how this supervisor ended: the others stop waiting for a failed node."""
        self._record["exit_code"] = exit_code
        self._beat += 1
        record = {**self._record, "beat": self._beat}
        self._write(record)
        if self._link is not None:
            self._link.send_now(record)

    def _write(self, record: dict[str, object]) -> None:
        # Not durable: a heartbeat that a crash loses only means the node looks silent.
        with contextlib.suppress(OSError):
            atomic_write_bytes(self._path, json.dumps(record).encode(), durable=False)


@dataclass
class _Seen:
    beat: object
    changed_at: float
    alive: bool = False
    writer: object = None
    """Which supervisor wrote the beat seen (host and pid): beats count up per writer."""


@dataclass(frozen=True)
class Loss:
    """Node ``node`` is gone; ``why`` in words; ``failed``: it ended in a failure."""

    node: int
    why: str
    failed: bool


@dataclass
class PeerWatch:
    """Reads the other nodes' records and says when one of them is gone."""

    record: RunRecord
    node_rank: int
    nnodes: int
    timeout: float
    """Seconds of silence after which a node that was alive counts as gone."""
    run: str | None = None
    """This run's token, shared by every node of it (``None``: no token to go by)."""
    start_timeout: float = START_TIMEOUT
    link: StoreLink | None = None
    """The job's store (:mod:`.store_link`): node 0 reads every node's record there, the others
    node 0's and its verdict; the files are read only where it cannot be reached."""
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
        first = self._checked_at is None
        files_due = first or now - (self._checked_at or 0.0) >= CHECK_SECONDS
        if not files_due and (self.link is None or not self.link.connected):
            return None
        if files_due:
            self._checked_at = now
        # The first look reads the files: a node of this run that failed before this one
        # started is found at once.
        records = None if self.link is None or first else self.link.records()
        verdict = {} if records is None else records.get(VERDICT_NODE, {})
        if isinstance(verdict.get("node"), int):
            return Loss(verdict["node"], str(verdict.get("why")), bool(verdict.get("failed")))
        for node in self._watched():
            record = {} if records is None else records.get(node, {})
            if "beat" not in record:  # not in the store (yet, or any more): its file
                if not files_due:
                    continue
                record = read_json_object(self.record.heartbeat_path(node))
            loss = self._check(node, record, now) or self._never_heard(node, now)
            if loss is not None:
                if self.link is not None and self.node_rank == 0:
                    self.link.say_lost(dataclasses.asdict(loss))
                return loss
        return None

    def begin(self, now: float) -> None:
        """Count the start timeout from ``now`` (this process's start), not from the first
        look: what the supervisor does before it (torch's import) is no grace for the others."""
        if self._started_at is None:
            self._started_at = now

    def requeued(self) -> Loss | None:
        """A node seen alive in this run that has since ended the job with exit 75 (it gave
        this node up while this one was not heard from: frozen, or cut off), or ``None``."""
        node = next((n for n, code in self._ended.items() if code == EXIT_REQUEUE), None)
        if node is None:
            return None
        return Loss(node, "ended the job with exit 75 while this node was not heard from",
                    failed=False)

    def _watched(self) -> list[int]:
        """Node 0 (or any node without a store) watches every other node; with a store, the
        others watch node 0 and read its verdict on the rest."""
        if self.link is None or self.node_rank == 0:
            return [node for node in range(self.nnodes) if node != self.node_rank]
        return [0]

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
        root = self.record.root
        if self._stepping_since is not None and now - self._stepping_since > self.timeout:
            return Loss(node, f"writes no heartbeat in {root} although the job runs: the nodes "
                              "do not share the checkpoint root (every node must see the same "
                              "directory)", failed=True)
        if now - self._started_at > self.start_timeout:
            return Loss(node, f"never started: no heartbeat from its cycle run in "
                              f"{self.start_timeout:g} s (is it running, with the same "
                              f"checkpoint root {root}?)", failed=True)
        return None

    def _check(self, node: int, record: dict[str, object], now: float) -> Loss | None:
        beat = record.get("beat")
        seen = self._seen.get(node)
        ours = self.run is not None and record.get("run") == self.run
        writer = (record.get("host"), record.get("pid"))
        if seen is None:
            seen = self._seen[node] = _Seen(beat, now, alive=ours, writer=writer)
            return _failed(node, record) if ours else None
        older = writer == seen.writer and _older(beat, seen.beat)
        if beat != seen.beat and not older:
            seen.beat, seen.changed_at, seen.alive, seen.writer = beat, now, True, writer
            if record.get("exit_code") is not None:
                self._ended[node] = record.get("exit_code")
            return _failed(node, record)
        if seen.alive and record.get("exit_code") is None and now - seen.changed_at > self.timeout:
            return Loss(node, f"is gone: its supervisor has not been heard for "
                              f"{now - seen.changed_at:.0f} s (--node-timeout {self.timeout:g})",
                        failed=False)
        return None


def _older(beat: object, seen: object) -> bool:
    """Whether ``beat`` is older than the one seen of the same supervisor (the file it wrote
    before it reached the store, read after the store went away): no sign of life."""
    return isinstance(beat, int) and isinstance(seen, int) and beat < seen


def _failed(node: int, record: dict[str, object]) -> Loss | None:
    code = record.get("exit_code")
    if code is not None and code not in (EXIT_SUCCESS, EXIT_REQUEUE):
        return Loss(node, f"failed (its supervisor exited {code})", failed=True)
    return None


