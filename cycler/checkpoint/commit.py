"""The commit protocol's rounds across ranks (docs/design.md, "Commit protocol"), and its last step.

:class:`CommitRounds` runs a saver's prepare round (rank 0 creates, every rank learns the path)
and commit round (every rank records its share of the files, rank 0 writes the manifest from
the records and moves the link; on several nodes in memory each node's leader does, under the
job's manifest). Errors of any rank are announced through the store, so the others fail at once
with the same text. The last step, the manifest and then the link, is
:func:`cycler.checkpoint.linking.finalize`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cycler._version import __version__
from cycler.checkpoint.layout import CheckpointName
from cycler.checkpoint.linking import finalize
from cycler.checkpoint.manifest import (
    FileRecord,
    Manifest,
    checkpoint_files,
    commit_plan,
    files_of_rank,
    make_manifest,
    record_files,
    sealed,
    share_of_plan,
)
from cycler.checkpoint.nodes.node_commit import node_manifest
from cycler.errors import CheckpointDirectoryError, CyclerError, RankFailed
from cycler.protocol.node_local import note_commit
from cycler.protocol.progress import beacon

if TYPE_CHECKING:  # imported for their types only: coordination imports torch
    from cycler.checkpoint.coordination import Coordinator
    from cycler.checkpoint.placement import Placement


class CommitRounds:
    """A saver's prepare and commit rounds (``strategy``: cycling_utils' ``force_save``
    agreement), in the tier ``placement`` chooses."""

    def __init__(self, coordinator: Coordinator, placement: Placement, strategy: str) -> None:
        self._coordinator = coordinator
        self._placement = placement
        self._strategy = strategy

    def prepare(self, force_save: bool, create: Callable[[bool, list[str]], Path]) -> str:
        """Every rank: the path of the next checkpoint directory, which rank 0 makes with
        ``create(pinned, votes)``."""
        coordinator = self._coordinator
        vote = ("1" if force_save else "0") + self._placement.node_vote()

        def created(votes: list[str]) -> str:
            return str(create(self._pinned(votes), votes))

        path = coordinator.decide_from_all(coordinator.new_round("prepare"), vote, created)
        return path if coordinator.is_creator else self._placement.on_this_node(path)

    def _pinned(self, votes: list[str]) -> bool:
        if self._strategy == "sync_all":
            return all(vote.startswith("1") for vote in votes)
        return any(vote.startswith("1") for vote in votes)

    def commit(self, directory: Path, metadata: Mapping[str, Any] | None,
               committed: Callable[[], None]) -> int | None:
        """Every rank: commit ``directory``; ``committed`` is called once it is durable. Returns
        the bytes this rank committed for where it carries out what follows a commit (rank 0;
        on several nodes in memory each node's leader), else ``None``."""
        if self._placement.spans_nodes():
            return self._commit_on_nodes(directory, metadata, committed)
        coordinator = self._coordinator
        round_key, mine = self._records_round(directory)
        records: dict[str, FileRecord] = {}

        def sealed_and_linked() -> str:
            shares = _shares(coordinator.gather(f"{round_key}/records", mine))
            records.update({file: record for file, (record, _) in shares.items()})
            self._seal_and_link(directory, dict(metadata or {}), records)
            return "committed"

        coordinator.decide(round_key, sealed_and_linked)
        beacon().progress()
        note_commit()  # this node's supervisor reads the link now
        committed()
        return sum(r.size for r in records.values()) if coordinator.is_creator else None

    def _records_round(self, directory: Path) -> tuple[str, str]:
        """Every rank, once every rank has written its files: the commit's round, with this
        rank's records (or its error) arrived in it."""
        coordinator = self._coordinator
        round_key = coordinator.new_round("commit")
        coordinator.arrive(round_key, "done")
        coordinator.wait_for_all(round_key)  # every rank has written its files
        try:
            mine = self._record_share(directory, round_key)
        except BaseException as error:  # KeyboardInterrupt, MemoryError: nobody may wait
            coordinator.arrive(f"{round_key}/records", _error_share(coordinator.rank, error))
            raise
        coordinator.arrive(f"{round_key}/records", mine)
        return round_key, mine

    def _record_share(self, directory: Path, round_key: str) -> str:
        """This rank's share of the commit's fsyncs and checksums, as JSON (or the error):
        by rank 0's plan (:func:`commit_plan`: one listing, not one per rank); on several
        nodes in memory, of its node's files, each record naming the node."""
        coordinator = self._coordinator
        nodes = self._placement.nodes if self._placement.spans_nodes() else None
        try:
            if nodes is None:
                plan = coordinator.decide(f"{round_key}/plan", lambda: json.dumps(
                    commit_plan(checkpoint_files(directory), coordinator.world_size)))
                share = share_of_plan(json.loads(plan), coordinator.rank,
                                      coordinator.world_size)
            else:
                names = checkpoint_files(directory)
                share = files_of_rank(names, nodes.local_rank, nodes.local_size)
            records = record_files(directory, share)
        except Exception as error:  # any kind: the other ranks fail at once with its text
            return _error_share(coordinator.rank, error)
        node = [] if nodes is None else [nodes.node]
        return json.dumps({name: [r.size, r.checksum, *node] for name, r in records.items()})

    def _commit_on_nodes(self, directory: Path, metadata: Mapping[str, Any] | None,
                         committed: Callable[[], None]) -> int | None:
        """The commit in the memory tier of several nodes: rank 0 makes the job manifest from
        every rank's records; each node's leader writes it beside its node's files, seals the
        node manifest and moves its node's link (:mod:`cycler.checkpoint.nodes`)."""
        coordinator, nodes = self._coordinator, self._placement.nodes
        assert nodes is not None
        round_key, mine = self._records_round(directory)

        def job_sealed_and_linked() -> str:
            shares = coordinator.gather(f"{round_key}/records", mine)
            job, by_node = self._job_manifest(directory, dict(metadata or {}), shares)
            self._seal_node_and_link(directory, job, by_node.get(nodes.node, []))
            return json.dumps({"job": job.to_json(), "nodes": by_node})

        outcome = json.loads(coordinator.decide(round_key, job_sealed_and_linked))
        job = Manifest.from_json(outcome["job"])
        files = outcome["nodes"].get(str(nodes.node), [])
        if nodes.leader and not coordinator.is_creator:
            self._seal_node_and_link(directory, job, files)
        beacon().progress()
        note_commit()  # this node's supervisor reads the link now
        committed()
        return sum(job.files[f].size for f in files) if nodes.leader else None

    def _job_manifest(self, directory: Path, metadata: dict[str, Any], shares: list[str],
                      ) -> tuple[Manifest, dict[int, list[str]]]:
        """Rank 0, several nodes in memory: the job's manifest from every rank's records, and
        each node's files."""
        name = self._name_of(directory)
        records: dict[str, FileRecord] = {}
        by_node: dict[int, list[str]] = {}
        for file, (record, node) in _shares(shares).items():
            assert node is not None  # on several nodes every rank's records name its node
            records[file] = record
            by_node.setdefault(node, []).append(file)
        job = make_manifest(records, index=name.index, world_size=self._coordinator.world_size,
                            metadata=metadata, version=__version__)
        return job, {node: sorted(files) for node, files in by_node.items()}

    def _seal_node_and_link(self, directory: Path, job: Manifest, files: list[str]) -> None:
        layout = self._placement.layout
        manifest = node_manifest(directory, job, files)
        self._placement.wait_recorded()
        name = layout.parse(directory.name)
        assert name is not None  # the prepare round named it
        finalize(layout, name, manifest, private=True)  # nodes commit in memory only

    def _seal_and_link(self, directory: Path, metadata: dict[str, Any],
                       records: dict[str, FileRecord]) -> None:
        layout = self._placement.layout
        name = self._name_of(directory)
        if layout.link_path.is_dir() and not layout.link_path.is_symlink():
            raise CheckpointDirectoryError(
                f"{layout.link_path} is a directory, not the latest link (a copy that "
                "followed symlinks?); move it out of the checkpoint root"
            )
        manifest = sealed(layout.path_of(name), index=name.index, metadata=metadata,
                          world_size=self._coordinator.world_size, version=__version__,
                          records=records)
        self._placement.wait_recorded()
        finalize(layout, name, manifest, private=layout is not self._placement.durable)

    def _name_of(self, directory: Path) -> CheckpointName:
        """The name of a directory the prepare round made; ``ValueError`` for any other."""
        layout = self._placement.layout
        name = layout.parse(directory.name)
        if name is None or Path(os.path.abspath(directory)).parent != layout.root:
            raise ValueError(
                f"{directory} is not a directory made by prepare_checkpoint_directory() "
                f"for {layout.prefix} in {layout.root}"
            )
        return name


def _error_share(rank: int, error: BaseException) -> str:
    """A rank's share of a commit round that failed, as every rank will read it."""
    kind = "" if isinstance(error, OSError | CyclerError) else f"{type(error).__name__}: "
    return json.dumps({"error": f"rank {rank}: {kind}{error}"})


def _shares(shares: list[str]) -> dict[str, tuple[FileRecord, int | None]]:
    """Every rank's records in one dict, each with its node (``None`` on one node); raises
    what a rank could not record."""
    merged: dict[str, tuple[FileRecord, int | None]] = {}
    for share in shares:
        records = json.loads(share)
        if "error" in records and isinstance(records["error"], str):
            raise RankFailed(f"the commit failed on {records['error']}")
        for file, (size, digest, *node) in records.items():
            merged[file] = (FileRecord(size, digest), node[0] if node else None)
    return merged


_MOVED = {"finalize": "linking", "link_forward": "linking"}
"""Names this module had, now in the module named (their old import paths still work)."""


def __getattr__(name: str) -> object:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"cycler.checkpoint.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
