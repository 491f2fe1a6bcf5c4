"""Where a saver's next checkpoint goes: the memory root of ``cycle run --memory-tier`` while it
has room, else the checkpoint root; and the index it gets, above every index of either tier.

:class:`Placement` owns the saver's tiers, its place among the nodes, the index floor, the
writer lock of each tier and the records of prepared indices (made durable on a background
thread while the ranks write). It creates directories; it never commits or removes one.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cycler._private import PRIVATE_DIRECTORY_MODE
from cycler.checkpoint.coordination import COORDINATED
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import CheckpointWarning
from cycler.checkpoint.lock import drop_shared, hold_shared
from cycler.checkpoint.nodes.topology import Nodes, nodes_of
from cycler.checkpoint.tiers import MemoryTier, first_tier, memory_tier, remember_overflow
from cycler.errors import CheckpointDirectoryError

log = logging.getLogger(__name__)

_RECORDER = ThreadPoolExecutor(1, thread_name_prefix="cycler-index-record")
"""Makes prepared indices durable in the background; one thread, started on first use."""


class Placement:
    """A saver's tiers: ``durable`` always, a memory root under the memory tier (given up for
    good once full: ``before_leaving`` runs first), and ``nodes`` with several nodes."""

    def __init__(self, durable: CheckpointLayout, tier: MemoryTier | None, nodes: Nodes | None,
                 *, before_leaving: Callable[[], None] | None = None) -> None:
        self.durable = durable
        self.tier = tier
        self.nodes = nodes
        """With the memory tier on several nodes: this rank's place among them."""
        self._memory = None if tier is None else CheckpointLayout(tier.root, durable.prefix)
        self.layout = durable if self._memory is None else first_tier(self._memory, durable)
        """Where checkpoints are committed first: the memory root under the memory tier (unless
        it was found too small for this job before), until its share of the tmpfs is full."""
        self._before_leaving = before_leaving
        self._index_floor = -1
        """An index above every index of the other tier (memory tier: read at first prepare)."""
        self.last_size = 0
        """The largest checkpoint committed in memory so far, in bytes (this rank's part)."""
        self._holds_writer_lock = False
        self._recording: Future[None] | None = None

    def tiers(self) -> list[CheckpointLayout]:
        """Where this saver's checkpoints may be: memory first, then the checkpoint root."""
        return [self.durable] if self._memory is None else [self._memory, self.durable]

    def in_memory_tier(self) -> bool:
        """Whether checkpoints are committed in the memory tier now."""
        return self.tier is not None and self.layout is not self.durable

    def spans_nodes(self) -> bool:
        """Whether checkpoints are committed in the memory tier of several nodes now."""
        return self.nodes is not None and self.in_memory_tier()

    def ensure_roots(self) -> None:
        """Create the roots (on every rank: the process group may not exist yet)."""
        ensure_root(self.durable.root)
        self.durable.record.check_directory()
        if self.tier is not None:
            ensure_root(self.tier.root)

    def node_vote(self) -> str:
        """A leader's part of the prepare round with the memory tier on several nodes: the
        next index its memory root allows and whether the next checkpoint fits there."""
        if not self.spans_nodes() or self.nodes is None or not self.nodes.leader:
            return ""
        assert self.tier is not None
        room = self.tier.has_room(self.last_size)
        return f":{self.layout.next_index()}:{int(room)}"

    def on_this_node(self, path: str) -> str:
        """A follower's directory of the checkpoint rank 0 prepared at ``path``: on several
        nodes in memory, the same name in this node's memory root, made here."""
        if not self.spans_nodes():
            return path
        chosen = Path(path)
        if chosen.parent == self.durable.root:  # some node's memory had no room
            self.leave_memory_tier("a node had no room for the next checkpoint")
            return path
        local = self.layout.root / chosen.name
        local.mkdir(mode=PRIVATE_DIRECTORY_MODE, exist_ok=True)
        name = self.layout.parse(chosen.name)
        if self.nodes is not None and self.nodes.leader and name is not None:
            self._recording = record_in_background(self.layout.record_index, name.index)
        return str(local)

    def hold_writer_lock(self) -> bool:
        """Take every tier's writer lock, held for the saver's life (between two commits
        another process's writer would interleave its own); ``True`` the first time."""
        # This process's earlier index records land first: one landing after the reclaim's
        # own record (the caller's, next) would take the index record back down.
        record_in_background(_nothing).result()
        if self._holds_writer_lock:
            return False
        for tier in self.tiers():
            _check_writable(tier.root)
            hold_shared(tier.record.writer_lock_path(tier.prefix), role="writer",
                        name=self.durable.prefix)
        self._holds_writer_lock = True
        return True

    def release(self) -> None:
        """Let go of the writer locks (the saver is dropped)."""
        if self._holds_writer_lock:
            self._holds_writer_lock = False
            for tier in self.tiers():
                drop_shared(tier.record.writer_lock_path(tier.prefix))

    def create(self, pinned: bool, votes: Sequence[str] = ()) -> Path:
        """Rank 0: the next checkpoint's directory, made in the tier it goes to, its index
        above every index of either tier (and of every node's memory root in ``votes``)."""
        node_votes = [vote.split(":") for vote in votes if vote.count(":") == 2]
        if self.spans_nodes() and any(room == "0" for _, _, room in node_votes):
            self.leave_memory_tier("a node's memory share is full")
        layout = self._layout_with_room()
        if self._index_floor < 0 and self.tier is not None:
            self._index_floor = max(t.next_index() for t in self.tiers())
        if layout is not self.durable:  # every node's memory root allows it
            self._index_floor = max([self._index_floor, *(int(i) for _, i, _ in node_votes)])
        index = max(layout.next_index(), self._index_floor)
        path = layout.path_of(CheckpointName(layout.prefix, index, pinned))
        path.mkdir(mode=0o777 if layout is self.durable else PRIVATE_DIRECTORY_MODE)
        # Recording the index takes two fsyncs (5-15 ms on a busy disk): they overlap the
        # ranks' writes, and the commit waits for them before it can link the directory.
        self._recording = record_in_background(layout.record_index, index)
        return path

    def wait_recorded(self) -> None:
        """Wait until the index of the directory last made is durably recorded."""
        recording, self._recording = self._recording, None
        if recording is not None:
            recording.result()

    def expect_size(self, size: int) -> None:
        """A checkpoint of ``size`` bytes was committed (or is predicted) in memory."""
        self.last_size = max(self.last_size, size)

    def _layout_with_room(self) -> CheckpointLayout:
        """The memory root while the next checkpoint fits in its share of the tmpfs; once it
        does not, the checkpoint root for the rest of this saver's life (said once)."""
        if self.tier is None or self.layout is self.durable \
                or self.tier.has_room(self.last_size):
            return self.layout
        self.leave_memory_tier(f"{self.last_size >> 20} MB more would pass its share")
        return self.layout

    def leave_memory_tier(self, why: str) -> None:
        """The memory tier is full: checkpoints go to the checkpoint root for the rest of this
        saver's life (said once)."""
        assert self.tier is not None
        log.warning("the memory tier %s is full (%s): checkpoints go to %s from now on",
                    self.tier.root, why, self.durable.root)
        remember_overflow(self.durable.record, why)
        if self._before_leaving is not None:
            self._before_leaving()  # the persisting queued so far, from the memory root
        self.layout = self.durable
        self._index_floor = max(t.next_index() for t in self.tiers())


def tiers_of(durable: CheckpointLayout, name: str, strategy: str,
             ) -> tuple[MemoryTier | None, Nodes | None]:
    """The memory tier ``cycle run`` set for this worker and its nodes (``None``, ``None``
    without one; ``None`` nodes on one node). On several nodes only a saver whose ranks commit
    together can use it: another says so and saves to the checkpoint root."""
    tier = memory_tier(durable.root)
    nodes = None if tier is None else nodes_of(os.environ)
    if nodes is not None and strategy not in COORDINATED:
        warnings.warn(f"the memory tier on several nodes needs a saver whose ranks commit "
                      f"together (strategy sync_any or sync_all, not {strategy}); {name}'s "
                      "checkpoints go to the checkpoint root", CheckpointWarning, stacklevel=3)
        return None, None
    return tier, nodes


def ensure_root(root: Path) -> None:
    """Create the root if it is missing; an existing one may be read-only (``load()`` and
    ``latest_checkpoint()`` only read): writing is checked at the first prepare."""
    if root.is_dir():
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CheckpointDirectoryError(
            f"cannot create the checkpoint directory {root} ({error.strerror}); "
            "choose a writable location"
        ) from None


def _check_writable(root: Path) -> None:
    if not os.access(root, os.W_OK | os.X_OK):
        raise CheckpointDirectoryError(f"{root} is not writable (read-only?); saving needs a "
                                       "writable checkpoint directory")


def record_in_background(work: Callable[..., None], *args: Any) -> Future[None]:
    """``work(*args)`` on the background thread; done at once if the interpreter is exiting
    (the executor then refuses work, while an asynchronous save may still be preparing)."""
    try:
        return _RECORDER.submit(work, *args)
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        done: Future[None] = Future()
        try:
            work(*args)
        except BaseException as error:
            done.set_exception(error)
        else:
            done.set_result(None)
        return done


def _nothing() -> None:
    """Queued behind the pending index records, to wait for them."""
