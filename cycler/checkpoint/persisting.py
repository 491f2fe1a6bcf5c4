"""The memory tier's background work after each commit in memory: the partner copy (several
nodes), persisting every K-th, pinned and stop checkpoint to the checkpoint root, and the memory
root's retention (docs/design.md, "Tiers").

A commit waits for none of it (removing a 100 MB checkpoint from tmpfs alone took 13 ms): it
runs on one thread of its own, in order. A stop's checkpoint is waited for (the node may be
taken away next), and with several nodes a stop, ``destroy_process_group()`` and the exit wait
for it too (:mod:`cycler.checkpoint.in_flight`): the partner copies use a process group.

A stop's persist starts as soon as its checkpoint is committed in memory: the copy of an older,
unpinned checkpoint still in flight is given up (the stop's stands for it), so the grace pays
for one copy, not two. After the workers exit ``cycle run`` checks that it landed, and copies it
itself only where it did not (a kill, a failure), in what is left of the stop's deadline
(:func:`cycler.checkpoint.job_end.land_stop`).
"""

from __future__ import annotations

import logging
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cycler.checkpoint.durable_copy import PersistAbandoned, persist
from cycler.checkpoint.in_flight import (
    remember_in_flight,
    stopping,
    wait_before_destroying_process_groups,
)
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.nodes.contribution import contribute
from cycler.checkpoint.nodes.partner_copy import REPLICAS, replicate
from cycler.checkpoint.nodes.topology import Nodes
from cycler.checkpoint.retainer import retain_durable, retain_memory, retain_replicas
from cycler.checkpoint.retention import checked_keep_last
from cycler.checkpoint.tiers import MemoryTier
from cycler.protocol.control import stop_requested_of_this_job

log = logging.getLogger(__name__)


class Persister:
    """Persisting from ``memory`` to ``durable`` for one saver (``nodes``: this rank's place
    among several nodes, whose leaders exchange partner copies over ``node_group``). A
    ``keep_last`` (the checkpoint root's retention) that would keep nothing is refused."""

    def __init__(self, tier: MemoryTier, memory: CheckpointLayout, durable: CheckpointLayout,
                 nodes: Nodes | None, keep_last: int) -> None:
        self._tier, self._memory, self._durable = tier, memory, durable
        self._nodes = nodes
        self.keep_last = checked_keep_last(keep_last)
        self.node_group: Any = None
        """The gloo group of the nodes' leaders, once the saver has made it."""
        self._thread: ThreadPoolExecutor | None = None
        self.queued: Future[None] | None = None
        """The last work queued on the persisting thread (copies and removals, in order)."""
        self.busy: set[int] = set()
        """Memory checkpoints queued or being copied to the checkpoint root: kept in memory."""
        self._busy_lock = threading.Lock()
        self._stop_index: int | None = None
        """The stop's checkpoint, once committed: older copies in flight give way to it."""

    def after_commit(self, committed: str, stop: bool) -> None:
        """After a commit in memory: queue its partner copy, its persisting if it is an
        every-K-th, pinned or a stop's checkpoint (a stop's is waited for), and the memory
        root's retention."""
        name = self._memory.parse(committed)
        if name is None:
            return
        wanted = stop or self._tier.wants_persisted(name)
        if wanted:
            with self._busy_lock:
                self.busy.add(name.index)
        if stop:
            self._stop_index = name.index  # read by the copy in flight, between two chunks
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="cycler-persist")
            if self._nodes is not None:  # the partner copies run on a group the script may end
                wait_before_destroying_process_groups()
        self.queued = self._thread.submit(self._in_background, name, wanted)
        if self._nodes is not None:
            remember_in_flight(self, queued_by_commits=True)
        if stop:
            self.finish()

    def _in_background(self, name: CheckpointName, wanted: bool) -> None:
        try:
            if self._nodes is not None:
                self._copy_to_partner(name, self._nodes)
            if wanted:
                self._persist_unless_superseded(name)
            with self._busy_lock:
                busy = set(self.busy)
            retain_memory(self._memory, busy)
            if self._nodes is not None:
                retain_replicas(self._memory, self._memory.root / REPLICAS)
        except Exception as error:  # noqa: BLE001 (training goes on from memory)
            log.warning("checkpoint %d was not persisted to %s: %s", name.index,
                        self._durable.root, error)

    def _persist_unless_superseded(self, name: CheckpointName) -> None:
        """Copy ``name`` to the checkpoint root, unless a newer one is queued to be (it stands
        for this one: the durable root keeps up however slow it is); pinned ones always. A
        copy in flight gives way to a stop's checkpoint (:meth:`_gives_way`)."""
        try:
            with self._busy_lock:
                superseded = not name.pinned and max(self.busy) > name.index
            if not superseded:
                self._persist(name)
        except PersistAbandoned:
            log.info("the persist of checkpoint %d gave way to the stop's", name.index)
        finally:
            with self._busy_lock:
                self.busy.discard(name.index)

    def _persist(self, name: CheckpointName) -> None:
        memory, durable = self._memory, self._durable
        if self._nodes is not None:  # every node gives what it holds; the last seals
            if contribute(memory, durable, name, lambda: self._gives_way(name)):
                retain_durable(durable, self.keep_last)
        else:
            persist(memory, durable, name, lambda: self._gives_way(name))
            retain_durable(durable, self.keep_last)

    def _gives_way(self, name: CheckpointName) -> bool:
        """Whether the copy of ``name`` stops for a newer stop's checkpoint (pinned ones never
        do: nothing else would persist them)."""
        stop = self._stop_index
        return stop is not None and stop > name.index and not name.pinned

    def _copy_to_partner(self, name: CheckpointName, nodes: Nodes) -> None:
        """The partner copy of a committed checkpoint (every leader, in step); a failure is
        logged: the checkpoint stays in this node's memory, and a node lost before the next
        copy falls back to an older one or to the checkpoint root."""
        try:
            replicate(self._memory, name, nodes, self.node_group)
        except Exception as error:  # noqa: BLE001 (a gloo error too: persisting still runs)
            log.warning("the partner copy of checkpoint %d failed: %s", name.index, error)

    def finish(self) -> None:
        """Wait for what the background thread has queued (copies and removals)."""
        queued, self.queued = self.queued, None
        if queued is not None:
            queued.result()

    def before_leaving(self) -> None:
        """The saver leaves the memory tier (it is full): wait for what is queued; during a
        stop, older unpinned copies give way first (the stop's checkpoint goes to the
        checkpoint root directly and must not wait behind them in the grace)."""
        if stopping() or stop_requested_of_this_job():
            self._stop_index = sys.maxsize
        self.finish()

    def wait(self, reported_too: bool = True) -> None:
        """What a stop, ``destroy_process_group()`` and the exit wait for (after every save
        in flight, whose commit may queue more): :meth:`finish`."""
        self.finish()
