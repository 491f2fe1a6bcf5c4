"""``AtomicDirectory``: cycling_utils' directory saver, with a commit that cannot be torn.

Every rank calls ``prepare_checkpoint_directory()`` and then ``symlink_latest(path)`` (or its
other names ``atomic_symlink`` and ``commit``); in between, any rank writes its own files into
the directory. Rank 0 creates and commits; every rank gets the same path and returns from the
commit only once it is durable. The commit protocol is docs/design.md's: fsync the files, write the
manifest last, point a unique temporary link at the directory and rename it over the latest link,
fsync the root; only then apply retention.

The saver is a facade over parts, none of which imports it: :mod:`.placement` (which tier, which
index), :mod:`.commit` (the rounds across ranks), :mod:`.retainer` (retention after a commit),
:mod:`.persisting` (the memory tier's background copies), :mod:`.dcp` (``save``/``load``) and
:mod:`.resume` (which checkpoint every rank loads).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cycler._distributed import in_process_group, settle_gloo_threads_at_exit
from cycler.checkpoint.commit import CommitRounds
from cycler.checkpoint.coordination import COORDINATED, STRATEGIES, Coordinator, global_rank
from cycler.checkpoint.dcp import DcpSaves
from cycler.checkpoint.in_flight import SaveHandle, stopping
from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.listing import CheckpointWarning, latest_checkpoint
from cycler.checkpoint.nodes.assembly import assembled_checkpoint
from cycler.checkpoint.nodes.topology import leaders_group
from cycler.checkpoint.persisting import Persister
from cycler.checkpoint.placement import Placement, tiers_of
from cycler.checkpoint.resume import (
    agreed_checkpoint,
    requested_by_environment,
    requested_in_a_tier,
)
from cycler.checkpoint.retainer import Retainer
from cycler.checkpoint.retention import checked_keep_last
from cycler.checkpoint.tiers import newest_of, remember_overflow_on_crash
from cycler.protocol.control import stop_requested_of_this_job
from cycler.protocol.environment import ENV_CONTROL_FILE, default_checkpoint_name
from cycler.protocol.features import USES_CONTROL, USES_SAVER, announce, uses_here
from cycler.protocol.progress import SAVING, beacon
from cycler.protocol.stop_signals import lower_shield, shield_from_stray_signals

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)


class AtomicDirectory:
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
        keep_last = checked_keep_last(keep_last)
        self.strategy, self.is_master, self.device = strategy, is_master, device
        name = name or default_checkpoint_name()
        self._coordinator = Coordinator(name, timeout, strategy in COORDINATED)
        self.name = name if strategy != "async" else f"{name}_rank_{global_rank() or 0}"
        self.durable = CheckpointLayout(output_directory, self.name)
        """The checkpoint root's layout: where checkpoints are kept for good."""
        tier, nodes = tiers_of(self.durable, name, strategy)
        self._persister = None if tier is None else Persister(
            tier, CheckpointLayout(tier.root, self.name), self.durable, nodes, keep_last)
        self._placement = Placement(self.durable, tier, nodes, before_leaving=None if (
            self._persister is None) else self._persister.before_leaving)
        self._retainer = Retainer(keep_last)
        self._rounds = CommitRounds(self._coordinator, self._placement, strategy)
        self._dcp = DcpSaves(self._coordinator, strategy)
        self._node_group: Any = None
        """The gloo group of the nodes' leaders (partner copies, the resume's fetches)."""
        self._saving: contextlib.AbstractContextManager[None] | None = None
        """The beacon's saving phase, from prepare_checkpoint_directory() to the commit."""
        if tier is not None:
            remember_overflow_on_crash(self.durable, self._saving_in_memory)
        self.output_directory = str(self.durable.root)
        self.symlink_name = self.durable.link_name
        announce(USES_SAVER)
        self._shielded = bool(os.environ.get(ENV_CONTROL_FILE))
        if self._shielded:
            # Under cycle run a TERM that reaches the worker directly (clusters that signal
            # every process) must not kill it before the stop's commit (see _commit).
            shield_from_stray_signals()
        settle_gloo_threads_at_exit()
        self._placement.ensure_roots()

    @property
    def keep_last(self) -> int:
        """Committed checkpoints kept, counting the latest (``-1``: all). Set on a running saver
        it applies from the next commit on, in every tier; a value that would keep nothing is
        refused as at construction (:class:`~cycler.errors.ConfigError`)."""
        return self._retainer.keep_last

    @keep_last.setter
    def keep_last(self, keep_last: int) -> None:
        self._retainer.keep_last = checked_keep_last(keep_last)
        if self._persister is not None:
            self._persister.keep_last = keep_last

    @property
    def layout(self) -> CheckpointLayout:
        """Where checkpoints are committed now: the memory root under the memory tier, until
        its share of the tmpfs is full; else the checkpoint root."""
        return self._placement.layout

    def prepare_checkpoint_directory(self, force_save: bool = False) -> str:
        """Create the next checkpoint directory (rank 0) and return its path on every rank.

        ``force_save`` pins the checkpoint (``_force`` suffix): retention and ``cycle prune``
        never remove it. Indices only grow, even past directories that were removed. Waits
        for this saver's asynchronous save in flight first.
        """
        self._dcp.settle()
        self._ensure_node_group()
        # The files go in next, and may take long: the save's allowance until the commit.
        if self._saving is None:
            self._saving = beacon().phase(SAVING)
            self._saving.__enter__()
        return self._prepare(force_save)

    def _prepare(self, force_save: bool) -> str:
        return self._rounds.prepare(force_save, self._create)

    def _create(self, pinned: bool, votes: Sequence[str]) -> Path:
        """Rank 0's part of the prepare round: the next directory, made where it goes."""
        placement = self._placement
        if placement.hold_writer_lock():  # this saver's first prepare
            placement.layout.adopt()  # before its first directory: what was here stays legacy
            placement.expect_size(self._retainer.reclaim_torn(
                placement.tiers(), placement.layout, measure=placement.in_memory_tier()))
        path = placement.create(pinned, votes)
        self._retainer.prepared(path)
        return path

    def _in_memory_tier(self) -> bool:
        return self._placement.in_memory_tier()

    def _leave_memory_tier(self, why: str) -> None:
        self._placement.leave_memory_tier(why)

    def _saving_in_memory(self) -> bool:
        """Whether a checkpoint is prepared in the memory tier and not yet committed."""
        return self._saving is not None and self._in_memory_tier()

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
        self._dcp.settle()
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
        retention or persisting."""
        directory = Path(checkpoint_directory)
        # A script that only saves, under cycle run: whether this commit is the stop's (read
        # from the control files; StepControl scripts learn it from StepControl).
        saver_only_stop = (self._shielded and not uses_here(USES_CONTROL)
                           and stop_requested_of_this_job())
        if saver_only_stop:
            # The stray TERM came with the request already: cycle run's own TERM after this
            # commit must end the process as it would without cycler.
            lower_shield()
        in_memory = self._placement.in_memory_tier()
        size = self._rounds.commit(directory, metadata, committed)
        if size is None:  # a follower: rank 0 (or its node's leader) does what follows
            return
        # The writer lock stays held for the saver's life (released when it is dropped or the
        # process ends): between two commits another writer would interleave its own.
        self._retainer.committed(directory)
        if not in_memory:
            self._retainer.after_commit(self.layout, directory.name)
        elif self._persister is not None:
            self._placement.expect_size(size)
            self._persister.after_commit(directory.name, stopping() or saver_only_stop)

    def __del__(self) -> None:
        # The writer lock is held from the first prepare for the saver's life: between two
        # commits another process's writer would interleave its own. A dropped saver lets go.
        placement = getattr(self, "_placement", None)  # __init__ may have failed
        if placement is not None:
            placement.release()

    def save(self, state_dict: dict[str, Any], metadata: Mapping[str, Any] | None = None, *,
             asynchronous: bool = False) -> SaveHandle:
        """Every rank: write ``state_dict`` with torch.distributed.checkpoint into a new
        checkpoint and commit it (see :mod:`cycler.checkpoint.dcp`).

        ``asynchronous=False`` returns once the checkpoint is committed. ``asynchronous=True``
        returns as soon as the state is copied into staging memory: ``state_dict`` may change
        then, and the returned handle's ``wait()`` (or :meth:`wait`) returns once committed.
        With ``strategy`` ``"mono"``, ``"async"`` or ``"offline"`` each process writes its
        ``state_dict`` whole, alone (DCP's ``no_dist``); sharded (FSDP) state needs
        ``"sync_any"`` or ``"sync_all"``.
        """
        return self._dcp.save(self, state_dict, metadata, asynchronous=asynchronous)

    def load(self, state_dict: dict[str, Any], checkpoint: str | int | None = None,
             strict: bool = False) -> dict[str, Any] | None:
        """Every rank: load a checkpoint saved by :meth:`save` into ``state_dict``, in place
        and resharded to this world size; return its metadata (``None``: no checkpoint).

        ``checkpoint`` (a name or an index) picks one; default the newest valid one. All
        ranks agree on it through the store, each verifying the checksums of its own share
        (:mod:`cycler.checkpoint.resume`). ``strict``: raise when checkpoints exist and none
        is valid, instead of warning and returning ``None``.
        """
        return self._dcp.load(self, state_dict, checkpoint, strict)

    def wait(self, reported_too: bool = True) -> None:
        """Wait until this saver's asynchronous save in flight, if any, is committed and its
        retention done; raises what made it fail (once; ``reported_too=False``: only if the
        handle's ``wait()`` did not raise it already)."""
        self._dcp.wait(reported_too)

    def wait_for_persisting(self) -> None:
        """Under the memory tier: wait until the copies to the checkpoint root (and, on
        several nodes, to the partner node) queued so far are done, after the asynchronous
        save in flight, whose commit queues one too."""
        self._dcp.settle()
        if self._persister is not None:
            self._persister.finish()

    def _ensure_node_group(self) -> None:
        """With the memory tier on several nodes, make the leaders' gloo group at the first
        call every rank makes (``new_group`` is collective), on the script's thread."""
        nodes = self._placement.nodes
        if nodes is not None and self._node_group is None and in_process_group():
            self._node_group = leaders_group(nodes, self._coordinator.timeout)
            if self._persister is not None:
                self._persister.node_group = self._node_group

    def _agreed(self, requested: str | None, strict: bool) -> Path | None:
        """On every rank: the checkpoint all ranks resume from (``requested``: a name or an
        index), ``None`` when there is none. With the memory tier on several nodes the newest
        checkpoint the nodes hold between them, assembled on each, if it is as new as the
        checkpoint root's newest; else the checkpoint root's."""
        if self._placement.nodes is None:
            return agreed_checkpoint(self._placement.tiers(), self._coordinator, requested, strict)
        if not self._placement.in_memory_tier() or not in_process_group():
            # A node's memory holds only its own files: without the group to assemble them,
            # only the checkpoint root's checkpoints are whole.
            return agreed_checkpoint([self.durable], self._coordinator, requested, strict)
        self._ensure_node_group()
        self.wait_for_persisting()  # the group is free, the partner copies are in place
        requested = requested or requested_by_environment(self._placement.tiers())
        durable = self.durable

        def durable_newest() -> int:
            if requested is not None:
                return -1
            found = latest_checkpoint(durable.root, durable.prefix, verify=False)
            name = None if found is None else durable.parse(found.name)
            return -1 if name is None else name.index

        path, problems = assembled_checkpoint(self.layout, durable_newest, self._coordinator,
                                              self._placement.nodes, self._node_group,
                                              requested)
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
        (:mod:`cycler.checkpoint.nodes`); it is always verified."""
        if self._placement.nodes is not None:
            found = self._agreed(None, strict)
            return None if found is None else str(found)
        requested = requested_in_a_tier(self._placement.tiers())
        if requested is not None:
            return str(requested)
        path = newest_of(self.durable, [latest_checkpoint(tier.root, self.name, verify=verify,
                                                          strict=strict)
                                        for tier in self._placement.tiers()])
        return None if path is None else str(path)
