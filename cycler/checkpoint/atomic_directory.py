"""``AtomicDirectory``: cycling_utils' directory saver, with a commit that cannot be torn.

Every rank calls ``prepare_checkpoint_directory()`` and then ``symlink_latest(path)`` (or its
other names ``atomic_symlink`` and ``commit``); in between, any rank writes its own files into
the directory. Rank 0 creates and commits; every rank gets the same path and returns from the
commit only once it is durable. The commit protocol is DESIGN.md's: fsync the files, write the
manifest last, point a unique temporary link at the directory and rename it over the latest link,
fsync the root; only then apply retention.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cycler import _fs
from cycler._distributed import in_process_group, settle_gloo_threads_at_exit
from cycler.checkpoint.coordination import COORDINATED, STRATEGIES, Coordinator, global_rank
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import (
    CheckpointState,
    CheckpointWarning,
    latest_checkpoint,
    list_checkpoints,
)
from cycler.checkpoint.lock import drop_shared, hold_shared
from cycler.checkpoint.manifest import (
    FileRecord,
    Manifest,
    checkpoint_files,
    files_of_rank,
    make_manifest,
    record_files,
    seal,
)
from cycler.checkpoint.private_dirs import PRIVATE_DIRECTORY_MODE
from cycler.checkpoint.replicas import (
    Nodes,
    assembled_checkpoint,
    contribute,
    leaders_group,
    nodes_of,
    replicate,
    retain_replicas,
    seal_node,
)
from cycler.checkpoint.resume import (
    agreed_checkpoint,
    requested_by_environment,
    requested_in_a_tier,
)
from cycler.checkpoint.retention import retention_decisions
from cycler.checkpoint.sharded import (
    InFlight,
    ShardedSaves,
    remember_in_flight,
    stopping,
    wait_before_destroying_process_groups,
)
from cycler.checkpoint.tiers import (
    MemoryTier,
    first_tier,
    keep_private,
    memory_tier,
    newest_of,
    persist,
    reclaim_leftovers,
    remember_overflow,
    remember_overflow_on_crash,
    retain_durable,
    retain_memory,
)
from cycler.errors import CheckpointDirectoryError, CyclerError, RankFailed
from cycler.protocol.control import stop_requested_of_this_job
from cycler.protocol.environment import ENV_CONTROL_FILE, default_checkpoint_name
from cycler.protocol.features import USES_CONTROL, USES_SAVER, announce, uses_here
from cycler.protocol.progress import SAVING, beacon
from cycler.protocol.stop_signals import lower_shield, shield_from_stray_signals

log = logging.getLogger(__name__)

_RECORDER = ThreadPoolExecutor(1, thread_name_prefix="cycler-index-record")
"""Makes prepared indices durable in the background; one thread, started on first use."""

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


class AtomicDirectory(ShardedSaves):
    """Saves each checkpoint to a new directory and commits it by swapping one link.

    Args:
        output_directory: the checkpoint root (``$CHECKPOINT_ARTIFACT_PATH`` on ISC).
        is_master: kept for cycling_utils compatibility; with a process group rank 0 creates
            and commits, without one (or with ``strategy="async"``/``"offline"``) every
            instance acts alone.
        name: the prefix of this saver's names; savers sharing a root need distinct names.
            Default: ``cycle run --checkpoint-name`` (``$CYCLER_CHECKPOINT_NAME``), else
            ``"AtomicDirectory"``.
        keep_last: committed checkpoints to keep, counting the latest (``-1``: all). Pinned
            (``force_save``) checkpoints are never removed.
        strategy: cycling_utils' ``force_save`` agreement: ``"sync_any"`` pins if any rank
            asked, ``"sync_all"`` if all did; ``"async"`` gives every rank its own saver
            (``<name>_rank_<rank>``); ``"offline"`` ignores any process group; ``"mono"``
            is one saver used by one process of a job (typically ``if rank == 0``), which
            waits for no other rank.
        device: cycling_utils' device for its agreement tensors. Accepted and unused: the
            ranks agree through the process group's store, which needs no device.
        timeout: the longest any rank waits for another.

    Under ``cycle run --memory-tier`` every checkpoint is committed in node memory first and
    every K-th one (and every stop's and pinned one) persisted to ``output_directory`` in the
    background (:mod:`cycler.checkpoint.tiers`); ``latest_checkpoint()`` and ``load()`` take
    the newest valid checkpoint of either tier. ``output_directory`` and its latest link only
    ever hold persisted checkpoints.
    """

    def __init__(self, output_directory: str | os.PathLike[str], is_master: bool = False,
                 name: str | None = None, keep_last: int = -1, strategy: str = "sync_any",
                 device: Any = None,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, "
                             f"not {strategy!r}")
        self.strategy = strategy
        self.keep_last = keep_last
        self.is_master = is_master
        self.device = device
        name = name or default_checkpoint_name()
        self._coordinator = Coordinator(name, timeout, strategy in COORDINATED)
        self.name = name if strategy != "async" else f"{name}_rank_{global_rank() or 0}"
        self.durable = CheckpointLayout(output_directory, self.name)
        """The checkpoint root's layout: where checkpoints are kept for good."""
        self._tier: MemoryTier | None = memory_tier(self.durable.root)
        self._memory = None if self._tier is None else CheckpointLayout(self._tier.root,
                                                                         self.name)
        self._nodes: Nodes | None = None
        """With the memory tier on several nodes: this rank's place among them."""
        if self._tier is not None:
            self._nodes = nodes_of(os.environ)
            if self._nodes is not None and strategy not in COORDINATED:
                warnings.warn(f"the memory tier on several nodes needs a saver whose ranks "
                              f"commit together (strategy sync_any or sync_all, not "
                              f"{strategy}); {name}'s checkpoints go to the checkpoint root",
                              CheckpointWarning, stacklevel=2)
                self._tier = self._memory = self._nodes = None
        self._node_group: Any = None
        """The gloo group of the nodes' leaders (partner copies, the resume's fetches)."""
        self._persist_waiter = _PersistWaiter(self)
        self.layout = self._memory or self.durable
        if self._tier is not None:
            self.layout = first_tier(self._memory, self.durable)
            remember_overflow_on_crash(self.durable, self._saving_in_memory)
        """Where checkpoints are committed first: the memory root under the memory tier, until
        its share of the tmpfs is full."""
        self.output_directory = str(self.durable.root)
        self.symlink_name = self.layout.link_name
        self._index_floor = -1
        """An index above every index of the other tier (memory tier: read at first prepare)."""
        self._persister: ThreadPoolExecutor | None = None
        self._persisting: Future[None] | None = None
        """The last work queued on the persisting thread (copies and removals, in order)."""
        self._busy: set[int] = set()
        """Memory checkpoints queued or being copied to the checkpoint root: kept in memory."""
        self._busy_lock = threading.Lock()
        self._last_size = 0
        self._holds_writer_lock = False
        self._saving: contextlib.AbstractContextManager[None] | None = None
        """The beacon's saving phase, from prepare_checkpoint_directory() to the commit."""
        self._recording: Future[None] | None = None
        self._in_flight: InFlight | None = None
        """The asynchronous save in flight, until its retention is done."""
        self._kept: list[int] | None = None
        """Unpinned committed indices retention keeps, oldest first (``None``: not scanned)."""
        self._uncommitted: list[Path] = []
        """Directories this process prepared and has not committed (a failed save's)."""
        self._reclaimed = False
        self._stager: Any = None
        self._worker: ThreadPoolExecutor | None = None
        """The thread of this saver's asynchronous saves, from its first one on."""
        self._async_group: Any = None
        announce(USES_SAVER)
        self._shielded = bool(os.environ.get(ENV_CONTROL_FILE))
        if self._shielded:
            # Under cycle run a TERM that reaches the worker directly (clusters that signal
            # every process) must not kill it before the stop's commit (see _commit).
            shield_from_stray_signals()
        settle_gloo_threads_at_exit()
        _ensure_root(self.durable.root)  # on every rank: the process group may not exist yet
        self.durable.check_supervisor_dir()
        if self._tier is not None:
            _ensure_root(self._tier.root)

    def prepare_checkpoint_directory(self, force_save: bool = False) -> str:
        """Create the next checkpoint directory (rank 0) and return its path on every rank.

        ``force_save`` pins the checkpoint (``_force`` suffix): retention and ``cycle prune``
        never remove it. Indices only grow, even past directories that were removed. Waits
        for this saver's asynchronous save in flight first.
        """
        self.wait()
        self._ensure_node_group()
        # The files go in next, and may take long: the save's allowance until the commit.
        if self._saving is None:
            self._saving = beacon().phase(SAVING)
            self._saving.__enter__()
        return self._prepare(force_save)

    def _prepare(self, force_save: bool) -> str:
        coordinator = self._coordinator
        round_key = coordinator.new_round("prepare")
        vote = ("1" if force_save else "0") + self._node_vote()
        coordinator.arrive(round_key, vote)
        if not coordinator.is_creator:
            return self._on_this_node(coordinator.outcome(round_key))
        try:
            votes = coordinator.gather(round_key, vote)
            path = str(self._create(self._pinned(votes), votes))
        except BaseException as error:
            coordinator.publish_error(round_key, error)
            raise
        coordinator.publish(round_key, path)
        return path

    def _pinned(self, votes: list[str]) -> bool:
        if self.strategy == "sync_all":
            return all(vote.startswith("1") for vote in votes)
        return any(vote.startswith("1") for vote in votes)

    def _spans_nodes(self) -> bool:
        """Whether checkpoints are committed in the memory tier of several nodes now."""
        return self._nodes is not None and self._in_memory_tier()

    def _node_vote(self) -> str:
        """A leader's part of the prepare round with the memory tier on several nodes: the
        next index its memory root allows and whether the next checkpoint fits there."""
        if not self._spans_nodes() or self._nodes is None or not self._nodes.leader:
            return ""
        assert self._tier is not None
        room = self._tier.has_room(self._last_size)
        return f":{self.layout.next_index()}:{int(room)}"

    def _on_this_node(self, path: str) -> str:
        """A follower's directory of the checkpoint rank 0 prepared at ``path``: on several
        nodes in memory, the same name in this node's memory root, made here."""
        if not self._spans_nodes():
            return path
        chosen = Path(path)
        if chosen.parent == self.durable.root:  # some node's memory had no room
            self._leave_memory_tier("a node had no room for the next checkpoint")
            return path
        local = self.layout.root / chosen.name
        local.mkdir(mode=PRIVATE_DIRECTORY_MODE, exist_ok=True)
        name = self.layout.parse(chosen.name)
        if self._nodes is not None and self._nodes.leader and name is not None:
            self._recording = _record_in_background(self.layout.record_index, name.index)
        return str(local)

    def _create(self, pinned: bool, votes: Sequence[str] = ()) -> Path:
        layout = self.layout
        # This process's earlier index records land first: one landing after the reclaim's
        # own record below would take the index record back down.
        _record_in_background(_nothing).result()
        if not self._holds_writer_lock:
            for tier in self._tiers():
                _check_writable(tier.root)
                hold_shared(tier.writer_lock_path, role="writer", name=self.name)
            self._holds_writer_lock = True
            if not self._reclaimed:
                layout.adopt()  # before its first directory: what was here stays legacy
                self._reclaim_torn_directories()
        node_votes = [vote.split(":") for vote in votes if vote.count(":") == 2]
        if self._spans_nodes() and any(room == "0" for _, _, room in node_votes):
            self._leave_memory_tier("a node's memory share is full")
        layout = self._layout_with_room()
        if self._index_floor < 0 and self._tier is not None:
            self._index_floor = max(t.next_index() for t in self._tiers())
        if layout is not self.durable:  # every node's memory root allows it
            self._index_floor = max([self._index_floor, *(int(i) for _, i, _ in node_votes)])
        index = max(layout.next_index(), self._index_floor)
        path = layout.path_of(CheckpointName(self.name, index, pinned))
        path.mkdir(mode=0o777 if layout is self.durable else PRIVATE_DIRECTORY_MODE)
        self._uncommitted.append(path)
        # Recording the index takes two fsyncs (5-15 ms on a busy disk): they overlap the
        # ranks' writes, and the commit waits for them before it can link the directory.
        self._recording = _record_in_background(layout.record_index, index)
        return path

    def _tiers(self) -> list[CheckpointLayout]:
        """Where this saver's checkpoints may be: memory first, then the checkpoint root."""
        return [self.durable] if self._memory is None else [self._memory, self.durable]

    def _layout_with_room(self) -> CheckpointLayout:
        """The memory root while the next checkpoint fits in its share of the tmpfs; once it
        does not, the checkpoint root for the rest of this saver's life (said once)."""
        if self._tier is None or self.layout is self.durable \
                or self._tier.has_room(self._last_size):
            return self.layout
        self._leave_memory_tier(f"{self._last_size >> 20} MB more would pass its share")
        return self.layout

    def _in_memory_tier(self) -> bool:
        """Whether checkpoints are committed in the memory tier now."""
        return self._tier is not None and self.layout is not self.durable

    def _leave_memory_tier(self, why: str) -> None:
        """The memory tier is full: checkpoints go to the checkpoint root for the rest of this
        saver's life (said once)."""
        assert self._tier is not None
        log.warning("the memory tier %s is full (%s): checkpoints go to %s from now on",
                    self._tier.root, why, self.durable.root)
        remember_overflow(self.durable, why)
        self._finish_persisting()
        self.layout, self._kept = self.durable, None
        self._index_floor = max(t.next_index() for t in self._tiers())

    def _reclaim_torn_directories(self) -> None:
        """At this saver's first prepare, under the writer lock: every directory without a
        manifest was left by a writer that died (a crash loop on a full disk leaves one per
        run), so it goes now, before this run needs the space; in the checkpoint root too
        under the memory tier (a persist cut by a kill)."""
        self._reclaimed = True
        for tier in self._tiers():
            try:
                torn = [c for c in list_checkpoints(tier.root, self.name, commit_state_only=True)
                        if c.state is CheckpointState.INCOMPLETE and not c.pinned]
                if torn:  # indices never repeat, even those of directories removed
                    tier.record_index(max(c.index for c in torn))
            except OSError:
                continue
            if tier is self.layout and self._in_memory_tier():
                # A checkpoint that did not fit in memory (a plain script's own write failed on
                # the full tmpfs, and it crashed) left what fitted, about the free space then.
                # Twice that is predicted for the next one, so it is not tried in memory again,
                # crash after crash; a directory torn by a kill is a part of one, and twice a
                # part may only send a large checkpoint to disk early.
                self._last_size = max([self._last_size,
                                       *(2 * _fs.tree_size(c.path) for c in torn)])
            for checkpoint in torn:
                _fs.remove_logged(_fs.discard_directory, checkpoint.path, "torn directory")
            if tier is not self.layout:  # the layout's own are removed at its first commit
                reclaim_leftovers(tier, everyone=True)

    def symlink_latest(self, checkpoint_directory: str | os.PathLike[str],
                       metadata: Mapping[str, Any] | None = None) -> None:
        """Commit ``checkpoint_directory``; returns on every rank once it is durable.

        Call it on every rank after every rank has written its files. ``metadata`` (JSON:
        ``{"step": ..., "epoch": ...}`` and anything else) goes into the manifest and can be
        read back with :func:`cycler.read_manifest` without loading any tensor.

        Every rank fsyncs and checksums its share of the files (its own DCP shards, and an
        even part of the rest) and reports the records through the process group's store;
        rank 0 writes the manifest from them, so its work does not grow with the world size.
        """
        self.wait()
        try:
            self._commit(checkpoint_directory, metadata)
        finally:
            saving, self._saving = self._saving, None
            if saving is not None:
                saving.__exit__(None, None, None)

    atomic_symlink = symlink_latest
    commit = symlink_latest

    def _commit(self, checkpoint_directory: str | os.PathLike[str],
                metadata: Mapping[str, Any] | None,
                committed: Callable[[], None] = lambda: None) -> None:
        """Commit on every rank; ``committed`` is called once the commit is durable, before
        rank 0's retention."""
        coordinator = self._coordinator
        directory = Path(checkpoint_directory)
        # A script that only saves, under cycle run: whether this commit is the stop's (read
        # from the control files; StepControl scripts learn it from StepControl).
        saver_only_stop = (self._shielded and not uses_here(USES_CONTROL)
                           and stop_requested_of_this_job())
        if saver_only_stop:
            # The stray TERM came with the request already: cycle run's own TERM after this
            # commit must end the process as it would without cycler.
            lower_shield()
        if self._spans_nodes():
            self._commit_on_nodes(directory, metadata, committed,
                                  stopping() or saver_only_stop)
            return
        round_key, mine = self._records_round(directory)
        if not coordinator.is_creator:
            coordinator.outcome(round_key)
            beacon().progress()
            committed()
            return
        try:
            shares = coordinator.gather(f"{round_key}/records", mine)
            records = _merged_records(shares)
            self._seal_and_link(directory, dict(metadata or {}), records)
        except BaseException as error:
            coordinator.publish_error(round_key, error)
            raise
        coordinator.publish(round_key, "committed")
        beacon().progress()
        committed()
        # The writer lock stays held for the saver's life (released when it is dropped or the
        # process ends): between two commits another writer would interleave its own.
        self._uncommitted = [p for p in self._uncommitted if p.name != directory.name]
        if self.layout is self.durable:
            self._apply_retention(directory.name)
        else:
            self._last_size = max(self._last_size, sum(r.size for r in records.values()))
            self._persist_and_retain(directory.name, stopping() or saver_only_stop)

    def _records_round(self, directory: Path) -> tuple[str, str]:
        """Every rank, once every rank has written its files: the commit's round, with this
        rank's records (or its error) arrived in it."""
        coordinator = self._coordinator
        round_key = coordinator.new_round("commit")
        coordinator.arrive(round_key, "done")
        coordinator.wait_for_all(round_key)  # every rank has written its files
        try:
            mine = self._record_share(directory)
        except BaseException as error:  # KeyboardInterrupt, MemoryError: nobody may wait
            coordinator.arrive(f"{round_key}/records", _error_share(coordinator.rank, error))
            raise
        coordinator.arrive(f"{round_key}/records", mine)
        return round_key, mine

    def _record_share(self, directory: Path) -> str:
        """This rank's share of the commit's fsyncs and checksums, as JSON (or the error);
        on several nodes in memory, of its node's files, each record naming the node."""
        coordinator, nodes = self._coordinator, self._nodes if self._spans_nodes() else None
        try:
            names = checkpoint_files(directory)
            if nodes is None:
                share = files_of_rank(names, coordinator.rank, coordinator.world_size)
            else:
                share = files_of_rank(names, nodes.local_rank, nodes.local_size)
            records = record_files(directory, share)
        except Exception as error:  # any kind: the other ranks fail at once with its text
            return _error_share(coordinator.rank, error)
        node = [] if nodes is None else [nodes.node]
        return json.dumps({name: [r.size, r.checksum, *node] for name, r in records.items()})

    def _commit_on_nodes(self, directory: Path, metadata: Mapping[str, Any] | None,
                         committed: Callable[[], None], stop: bool) -> None:
        """The commit in the memory tier of several nodes: rank 0 makes the job manifest from
        every rank's records; each node's leader writes it beside its node's files, seals the
        node manifest and moves its node's link; then the partner copy and persisting run on
        the leader's background thread (:mod:`cycler.checkpoint.replicas`)."""
        coordinator, nodes = self._coordinator, self._nodes
        assert nodes is not None
        round_key, mine = self._records_round(directory)
        if coordinator.is_creator:
            try:
                shares = coordinator.gather(f"{round_key}/records", mine)
                job, by_node = self._job_manifest(directory, dict(metadata or {}), shares)
                files = by_node.get(nodes.node, [])
                self._seal_node_and_link(directory, job, files)
            except BaseException as error:
                coordinator.publish_error(round_key, error)
                raise
            coordinator.publish(round_key, json.dumps({"job": job.to_json(),
                                                       "nodes": by_node}))
            self._uncommitted = [p for p in self._uncommitted if p.name != directory.name]
        else:
            outcome = json.loads(coordinator.outcome(round_key))
            job = Manifest.from_json(outcome["job"])
            files = outcome["nodes"].get(str(nodes.node), [])
            if nodes.leader:
                self._seal_node_and_link(directory, job, files)
        beacon().progress()
        committed()
        if nodes.leader:
            self._last_size = max(self._last_size, sum(job.files[f].size for f in files))
            self._persist_and_retain(directory.name, stop)

    def _job_manifest(self, directory: Path, metadata: dict[str, Any], shares: list[str],
                      ) -> tuple[Manifest, dict[int, list[str]]]:
        """Rank 0, several nodes in memory: the job's manifest from every rank's records, and
        each node's files."""
        from cycler import __version__

        name = self.layout.parse(directory.name)
        if name is None or Path(os.path.abspath(directory)).parent != self.layout.root:
            raise ValueError(
                f"{directory} is not a directory made by prepare_checkpoint_directory() "
                f"for {self.name} in {self.layout.root}"
            )
        records: dict[str, FileRecord] = {}
        by_node: dict[int, list[str]] = {}
        for share in shares:
            got = json.loads(share)
            if "error" in got and isinstance(got["error"], str):
                raise RankFailed(f"the commit failed on {got['error']}")
            for file, (size, digest, node) in got.items():
                records[file] = FileRecord(size, digest)
                by_node.setdefault(node, []).append(file)
        job = make_manifest(records, index=name.index, world_size=self._coordinator.world_size,
                            metadata=metadata, version=__version__)
        return job, {node: sorted(files) for node, files in by_node.items()}

    def _seal_node_and_link(self, directory: Path, job: Manifest, files: list[str]) -> None:
        seal_node(directory, job, files)
        keep_private(self.layout, directory)
        if self._recording is not None:
            self._recording.result()
            self._recording = None
        _fs.atomic_symlink(directory, self.layout.link_path)

    def _seal_and_link(self, directory: Path, metadata: dict[str, Any],
                       records: dict[str, FileRecord]) -> None:
        name = self.layout.parse(directory.name)
        if name is None or Path(os.path.abspath(directory)).parent != self.layout.root:
            raise ValueError(
                f"{directory} is not a directory made by prepare_checkpoint_directory() "
                f"for {self.name} in {self.layout.root}"
            )
        if self.layout.link_path.is_dir() and not self.layout.link_path.is_symlink():
            raise CheckpointDirectoryError(
                f"{self.layout.link_path} is a directory, not the latest link (a copy that "
                "followed symlinks?); move it out of the checkpoint root"
            )
        from cycler import __version__

        seal(self.layout.path_of(name), index=name.index, metadata=metadata,
             world_size=self._coordinator.world_size, version=__version__, records=records)
        if self.layout is not self.durable:
            keep_private(self.layout, self.layout.path_of(name))
        if self._recording is not None:
            self._recording.result()
            self._recording = None
        _fs.atomic_symlink(self.layout.path_of(name), self.layout.link_path)

    def _persist_and_retain(self, committed: str, stop: bool) -> None:
        """Memory tier, after a commit: queue its persisting if it is an every-K-th, pinned or
        a stop's checkpoint (a stop's is waited for: the node may be taken away next), and the
        memory tier's retention, on the saver's background thread: a commit waits for
        neither (removing a 100 MB checkpoint from tmpfs alone took 13 ms)."""
        assert self._tier is not None
        name = self.layout.parse(committed)
        if name is None:
            return
        wanted = stop or self._tier.wants_persisted(name)
        if wanted:
            with self._busy_lock:
                self._busy.add(name.index)
        memory, durable, nodes = self.layout, self.durable, self._nodes

        def in_background() -> None:
            try:
                if nodes is not None:
                    self._copy_to_partner(memory, name, nodes)
                if wanted:
                    self._persist_unless_superseded(memory, durable, name)
                with self._busy_lock:
                    busy = set(self._busy)
                retain_memory(memory, busy)
                if nodes is not None:
                    retain_replicas(memory)
            except Exception as error:  # noqa: BLE001 (training goes on from memory)
                log.warning("checkpoint %d was not persisted to %s: %s", name.index,
                            durable.root, error)

        if self._persister is None:
            self._persister = ThreadPoolExecutor(1, thread_name_prefix="cycler-persist")
            if nodes is not None:  # the partner copies run on a group the script may destroy
                wait_before_destroying_process_groups()
        self._persisting = self._persister.submit(in_background)
        if nodes is not None:
            remember_in_flight(self._persist_waiter)
        if stop:
            self._finish_persisting()

    def _persist_unless_superseded(self, memory: CheckpointLayout, durable: CheckpointLayout,
                                   name: CheckpointName) -> None:
        """Copy ``name`` to the checkpoint root, unless a newer one is queued to be (it stands
        for this one: the durable root keeps up however slow it is); pinned ones always."""
        try:
            with self._busy_lock:
                superseded = not name.pinned and max(self._busy) > name.index
            if superseded:
                pass
            elif self._nodes is not None:  # every node gives what it holds; the last seals
                if contribute(memory, durable, name):
                    retain_durable(durable, self.keep_last)
            else:
                persist(memory, durable, name)
                retain_durable(durable, self.keep_last)
        finally:
            with self._busy_lock:
                self._busy.discard(name.index)

    def _copy_to_partner(self, memory: CheckpointLayout, name: CheckpointName,
                         nodes: Nodes) -> None:
        """The partner copy of a committed checkpoint (every leader, in step); a failure is
        logged: the checkpoint stays in this node's memory, and a node lost before the next
        copy falls back to an older one or to the checkpoint root."""
        try:
            replicate(memory, name, nodes, self._node_group)
        except Exception as error:  # noqa: BLE001 (a gloo error too: persisting still runs)
            log.warning("the partner copy of checkpoint %d failed: %s", name.index, error)

    def _finish_persisting(self) -> None:
        """Wait for what the background thread has queued (copies and removals)."""
        persisting, self._persisting = self._persisting, None
        if persisting is not None:
            persisting.result()

    def _saving_in_memory(self) -> bool:
        """Whether a checkpoint is prepared in the memory tier and not yet committed."""
        return self._saving is not None and self._in_memory_tier()

    def __del__(self) -> None:
        # The writer lock is held from the first prepare for the saver's life: between two
        # commits another process's writer would interleave its own. A dropped saver lets go.
        if getattr(self, "_holds_writer_lock", False):  # __init__ may have failed
            self._holds_writer_lock = False
            for tier in self._tiers():
                drop_shared(tier.writer_lock_path)

    def _apply_retention(self, committed: str) -> None:
        """Remove what retention says may go; a failure is logged and retried at the next
        commit, never raised: the commit it follows has already succeeded on every rank.

        The first commit of a saver scans the root (torn directories and temporaries that dead
        writers left); later ones only drop this saver's own checkpoints beyond ``keep_last``
        and the directories it prepared without committing, so a commit costs the same with 600
        checkpoints kept as with one. Any failure makes the next commit scan again.
        """
        name = self.layout.parse(committed)
        if self._kept is None or name is None:
            self._kept = self._scan_and_retain()
            return
        if not name.pinned:
            self._kept.append(name.index)
        doomed = self._uncommitted
        self._uncommitted = []
        if self.keep_last > 0:
            beyond = len(self._kept) - self.keep_last
            doomed += [self.layout.path_of(CheckpointName(self.name, index, False))
                       for index in self._kept[:max(beyond, 0)]]
            self._kept = self._kept[max(beyond, 0):]
        for path in doomed:
            if not _fs.remove_logged(_fs.discard_directory, path, "checkpoint"):
                self._kept = None

    def _scan_and_retain(self) -> list[int] | None:
        try:
            checkpoints = list_checkpoints(self.layout.root, self.name, commit_state_only=True)
            decisions = retention_decisions(checkpoints, keep_last=self.keep_last,
                                            remove_torn=True, writer_active=False)
            # A writer killed during a removal leaves a renamed, half-deleted checkpoint that
            # no reader lists: without this, every such kill would leak up to a checkpoint.
            leftovers = self.layout.own_temporaries()
        except OSError as error:
            log.warning("retention skipped after a commit (%s); it runs again at the next", error)
            return None
        removed = [_fs.remove_logged(_fs.discard_directory, d.checkpoint.path, "checkpoint")
                   for d in decisions if not d.keep]
        removed += [_fs.remove_logged(_fs.remove_leftover, temporary,
                                          "leftover of a dead writer") for temporary in leftovers]
        kept = [d.checkpoint.index for d in decisions
                if d.keep and d.checkpoint.valid and not d.checkpoint.pinned
                and d.checkpoint.is_directory]
        self._uncommitted = []
        return sorted(kept) if all(removed) else None

    def _ensure_node_group(self) -> None:
        """With the memory tier on several nodes, make the leaders' gloo group at the first
        call every rank makes (``new_group`` is collective), on the script's thread."""
        if self._nodes is not None and self._node_group is None and in_process_group():
            self._node_group = leaders_group(self._nodes, self._coordinator.timeout)

    def _agreed(self, requested: str | None, strict: bool) -> Path | None:
        """On every rank: the checkpoint all ranks resume from (``requested``: a name or an
        index), ``None`` when there is none. With the memory tier on several nodes the newest
        checkpoint the nodes hold between them, assembled on each, if it is as new as the
        checkpoint root's newest; else the checkpoint root's."""
        if self._nodes is None:
            return agreed_checkpoint(self._tiers(), self._coordinator, requested, strict)
        if not self._in_memory_tier() or not in_process_group():
            # A node's memory holds only its own files: without the group to assemble them,
            # only the checkpoint root's checkpoints are whole.
            return agreed_checkpoint([self.durable], self._coordinator, requested, strict)
        self._ensure_node_group()
        self._persist_waiter.wait()  # the group is free, the partner copies are in place
        requested = requested or requested_by_environment(self._tiers())
        durable = self.durable

        def durable_newest() -> int:
            if requested is not None:
                return -1
            found = latest_checkpoint(durable.root, durable.prefix, verify=False)
            name = None if found is None else durable.parse(found.name)
            return -1 if name is None else name.index

        path, problems = assembled_checkpoint(self.layout, durable_newest, self._coordinator,
                                              self._nodes, self._node_group, requested)
        if path is None:
            path = agreed_checkpoint([durable], self._coordinator, requested, strict)
        if problems:
            warnings.warn(f"{'; '.join(problems)}; using {path} instead", CheckpointWarning,
                          stacklevel=3)
        return path

    def is_checkpoint_directory(self, path: str | os.PathLike[str]) -> str | None:
        """cycling_utils' test: the suffix (``"3"`` or ``"3_force"``) if ``path`` is an existing
        checkpoint directory of this saver, else ``None``. Says nothing of validity."""
        name = self.layout.parse(Path(path).name)
        if name is None or not Path(path).is_dir():
            return None
        return f"{name.index}_force" if name.pinned else str(name.index)

    def latest_checkpoint(self, verify: bool = True, strict: bool = False) -> str | None:
        """The newest valid checkpoint of this saver (see :func:`cycler.latest_checkpoint`),
        under the memory tier the newest of either tier (memory first on a tie).

        With the memory tier on several nodes every rank must call it, as :meth:`load`: the
        ranks agree on one checkpoint and each node fetches what it lacks of it from the others
        (:mod:`cycler.checkpoint.replicas`); it is always verified."""
        if self._nodes is not None:
            found = self._agreed(None, strict)
            return None if found is None else str(found)
        requested = requested_in_a_tier(self._tiers())
        if requested is not None:
            return str(requested)
        path = newest_of(self.durable, [latest_checkpoint(tier.root, self.name, verify=verify,
                                                          strict=strict)
                                        for tier in self._tiers()])
        return None if path is None else str(path)


class _PersistWaiter:
    """What a stop, ``destroy_process_group()`` and the exit wait for with the memory tier
    on several nodes: the saver's background copies, which use a process group."""

    def __init__(self, saver: AtomicDirectory) -> None:
        self._saver = weakref.ref(saver)

    def wait(self, reported_too: bool = True) -> None:
        saver = self._saver()
        if saver is not None:
            saver.wait(reported_too)  # its asynchronous save queues a copy when it commits
            saver._finish_persisting()


def _error_share(rank: int, error: BaseException) -> str:
    """A rank's share of a commit round that failed, as every rank will read it."""
    kind = "" if isinstance(error, OSError | CyclerError) else f"{type(error).__name__}: "
    return json.dumps({"error": f"rank {rank}: {kind}{error}"})


def _merged_records(shares: list[str]) -> dict[str, FileRecord]:
    """Every rank's records in one dict; raises what a rank could not record."""
    merged: dict[str, FileRecord] = {}
    for share in shares:
        records = json.loads(share)
        if "error" in records and isinstance(records["error"], str):
            raise RankFailed(f"the commit failed on {records['error']}")
        merged.update({name: FileRecord(size, digest) for name, (size, digest) in records.items()})
    return merged


def _ensure_root(root: Path) -> None:
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


def _record_in_background(work: Callable[..., None], *args: Any) -> Future[None]:
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
