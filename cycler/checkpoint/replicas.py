"""The memory tier of a job on several nodes: node manifests, the partner copy, persisting by
contribution and the resume that assembles a checkpoint from what the nodes hold
(DESIGN.md, "Tiers").

With several nodes, a node's memory root holds only what its own ranks wrote. A checkpoint is
committed there by the node's first local rank (its *leader*) under a *node manifest*: the
node's own files with their checksums, and beside them the job's manifest (every file of every
node) as ``cycler-job-manifest.json``, which the node manifest covers too. So each node's memory
root stays a checkpoint root like any other: listed, retained and pruned by the same rules.

**The partner copy.** After each commit every leader sends its node's files to the next node's
leader (a ring: node r to node r+1) over a gloo group of the leaders, in the saver's background
thread; the receiver keeps them under ``.replicas/<checkpoint>/`` and writes the sender's node
manifest there last, once every file read back with its checksum. The exchange is in lockstep
(every leader sends and receives the same number of chunks per checkpoint), so a file that cannot
be read is sent as zeros and fails the receiver's checksums instead of stalling the ring.

**Persisting.** Every node contributes the files it holds (its own and its partner copy) to the
checkpoint root's directory of that checkpoint: each file is copied under a temporary name,
verified against the job manifest and renamed into place. The contribution that completes the
set writes the job manifest there and moves the durable link forward. No node waits for
another, and a kill at any moment leaves a directory without a manifest (torn).

**Resume.** The leaders report what they hold; rank 0 picks the newest checkpoint whose files
the nodes hold between them, if it is at least as new as the checkpoint root's newest, and tells
each node which files to fetch from which node. Once fetched, every node holds the whole
checkpoint in its memory root under the job manifest, every rank verifies its node's share of
the checksums, and all load it; any failure falls back to the checkpoint root.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import os
import shutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cycler import _fs
from cycler.checkpoint.checksum import file_checksum
from cycler.checkpoint.coordination import Coordinator
from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import inspect_checkpoint, list_checkpoints
from cycler.checkpoint.manifest import (
    FileRecord,
    Manifest,
    check_files,
    files_of_rank,
    name_outside,
    read_manifest,
    seal,
)
from cycler.checkpoint.private_dirs import restrict_tree
from cycler.checkpoint.tiers import newer_than_persisted
from cycler.errors import CorruptCheckpoint, CyclerError

log = logging.getLogger(__name__)

JOB_MANIFEST_NAME = "cycler-job-manifest.json"
"""The job's manifest beside a node's files in its memory checkpoint (covered by the node's)."""
REPLICAS = ".replicas"
"""Where a node's memory root keeps its partner's copies, one directory per checkpoint."""
CHUNK = 16 << 20
"""Bytes per message of a copy between nodes."""


@dataclass(frozen=True)
class Nodes:
    """This rank's place among the job's nodes: torchrun numbers ranks node by node."""

    node: int
    count: int
    local_rank: int
    local_size: int

    @property
    def leader(self) -> bool:
        """Whether this rank commits, copies and persists for its node."""
        return self.local_rank == 0

    def leader_of(self, node: int) -> int:
        return node * self.local_size

    @property
    def partner(self) -> int:
        """The node that keeps a copy of this node's files."""
        return (self.node + 1) % self.count

    @property
    def source(self) -> int:
        """The node whose files this node keeps a copy of."""
        return (self.node - 1) % self.count


def nodes_of(environ: Mapping[str, str]) -> Nodes | None:
    """The job's nodes as torchrun describes them to a worker; ``None`` on one node."""
    try:
        world = int(environ.get("WORLD_SIZE") or 1)
        local = int(environ.get("LOCAL_WORLD_SIZE") or world)
        rank = int(environ.get("RANK") or 0)
        local_rank = int(environ.get("LOCAL_RANK") or 0)
    except ValueError:
        return None
    if local >= world or local < 1 or world % local:
        return None
    return Nodes(rank // local, world // local, local_rank, local)


def leaders_group(nodes: Nodes, timeout: datetime.timedelta) -> Any:
    """A gloo group of the nodes' leaders (every rank of the job must call this, in the same
    order as its other groups): the partner copies and the resume's fetches use it, never the
    group the training's collectives run on."""
    import torch.distributed as dist

    return dist.new_group([nodes.leader_of(n) for n in range(nodes.count)], timeout=timeout,
                          backend="gloo")


# ---------------------------------------------------------------------------------------------
# A node's commit


def seal_node(directory: Path, job: Manifest, files: list[str]) -> Manifest:
    """Commit this node's part of a checkpoint in its memory root: the job manifest beside the
    node's ``files`` (recorded and fsynced by its ranks), then the node manifest over both."""
    sidecar = directory / JOB_MANIFEST_NAME
    _fs.atomic_write_bytes(sidecar, job.to_json().encode())
    records = {name: job.files[name] for name in files}
    records[JOB_MANIFEST_NAME] = FileRecord(sidecar.stat().st_size,
                                            file_checksum(sidecar, job.checksum))
    return seal(directory, index=job.index, metadata=job.metadata, world_size=job.world_size,
                version=job.cycler_version, records=records)


def job_manifest(directory: Path) -> Manifest:
    """The job manifest kept beside a node's files (:class:`CorruptCheckpoint` if it is
    missing or malformed)."""
    try:
        return Manifest.from_json((directory / JOB_MANIFEST_NAME).read_text())
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise CorruptCheckpoint(f"{directory} has no readable job manifest ({error})") from None


def node_files(directory: Path) -> list[str]:
    """The checkpoint's files a committed node directory holds (its manifest's, the job
    manifest beside them left out); empty where it is not valid."""
    try:
        manifest = read_manifest(directory)
        if check_files(directory, manifest) is not None:
            return []
    except (OSError, CyclerError):
        return []
    return sorted(name for name in manifest.files if name != JOB_MANIFEST_NAME)


def replica_path(memory: CheckpointLayout, name: CheckpointName | str) -> Path:
    return memory.root / REPLICAS / str(name)


# ---------------------------------------------------------------------------------------------
# The partner copy


def replicate(memory: CheckpointLayout, name: CheckpointName, nodes: Nodes, group: Any) -> None:
    """On every leader after a commit: send this node's files of ``name`` to the partner node,
    and keep the source node's files of it under ``.replicas/``, verified, its node manifest
    written last. Raises :class:`CorruptCheckpoint` (the copy removed) when what arrived does
    not match its checksums. Every leader sends and receives all its messages whatever fails
    on its side: the ring stays in step."""
    own = memory.path_of(name)
    try:
        manifest_bytes = (own / MANIFEST_NAME).read_bytes()
        mine: Manifest | None = Manifest.from_json(manifest_bytes.decode())
    except (OSError, ValueError, CyclerError) as error:
        log.warning("checkpoint %s is not copied to node %d: %s", name, nodes.partner, error)
        manifest_bytes, mine = b"", None
    partner, source = nodes.leader_of(nodes.partner), nodes.leader_of(nodes.source)
    theirs_bytes = _swap_bytes(group, manifest_bytes, partner, source)
    theirs = Manifest.from_json(theirs_bytes.decode()) if theirs_bytes else None
    outgoing = [] if mine is None else [(own / f, r.size) for f, r in sorted(mine.files.items())]
    target = replica_path(memory, name)
    problem = None
    if theirs is not None:
        try:
            _check_names(target, theirs)
            if os.path.lexists(target):
                _fs.discard_directory(target)
            target.mkdir(parents=True)
        except (OSError, CyclerError) as error:
            problem = str(error)
    incoming = [] if theirs is None else [(None if problem else target / f, r.size)
                                          for f, r in sorted(theirs.files.items())]
    problem = _swap_files(group, outgoing, partner, incoming, source) or problem
    if theirs is None:
        return
    try:
        problem = problem or check_files(target, theirs, checksums=True)
        if problem is not None:
            raise CorruptCheckpoint(f"the copy of node {nodes.source}'s {name}: {problem}")
        _fs.atomic_write_bytes(target / MANIFEST_NAME, theirs_bytes)
        restrict_tree(target)
    except BaseException:
        _fs.remove_logged(_fs.discard_directory, target, "unfinished partner copy")
        raise


def retain_replicas(memory: CheckpointLayout) -> None:
    """Remove the partner copies of checkpoints this node no longer keeps itself."""
    kept = {str(name) for name in memory.checkpoint_names()}
    try:
        copies = list((memory.root / REPLICAS).iterdir())
    except OSError:
        return
    for copy in copies:
        if copy.name not in kept and not _fs.is_temporary(copy.name):
            _fs.remove_logged(_fs.discard_directory, copy, "partner copy")


def _swap_bytes(group: Any, data: bytes, to: int, source: int) -> bytes:
    """Send ``data`` to rank ``to`` while receiving the bytes rank ``source`` sends."""
    import torch

    length = torch.tensor([len(data)], dtype=torch.int64)
    theirs = torch.zeros(1, dtype=torch.int64)
    _together(group, [(length, to)], [(theirs, source)])
    incoming = torch.empty(int(theirs.item()), dtype=torch.uint8)
    outgoing = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
    _together(group, [] if outgoing is None else [(outgoing, to)],
              [] if not len(incoming) else [(incoming, source)])
    return incoming.numpy().tobytes()


def _together(group: Any, sends: list[tuple[Any, int]], receives: list[tuple[Any, int]]) -> None:
    import torch.distributed as dist

    works = [dist.isend(tensor, peer, group=group) for tensor, peer in sends]
    works += [dist.irecv(tensor, peer, group=group) for tensor, peer in receives]
    for work in works:
        if work is not None:  # None: this rank is not in the group (never the case here)
            work.wait()


def _pieces(tensor: Any) -> list[Any]:
    """A file's tensor in messages of at most :data:`CHUNK` bytes (views: nothing is copied);
    none for an empty file."""
    return [tensor[offset:offset + CHUNK] for offset in range(0, tensor.numel(), CHUNK)]


def _swap_files(group: Any, outgoing: list[tuple[Path, int]], to: int,
                incoming: list[tuple[Path | None, int]], source: int) -> str | None:
    """Send ``outgoing`` (path, size) to ``to`` while receiving ``incoming`` from ``source``;
    an incoming path ``None`` is received and dropped. Every message is posted at once and the
    files are mapped, not read: the bytes go from one node's page cache to the other's.
    Returns the first file that could not be written (the rest is still received)."""
    sends = [(piece, to) for path, size in outgoing for piece in _pieces(_mapped(path, size))]
    receiving = [(path, *_writable(path, size)) for path, size in incoming]
    receives = [(piece, source) for _, tensor, _ in receiving for piece in _pieces(tensor)]
    _together(group, sends, receives)
    return next((problem for _, _, problem in receiving if problem), None)


def _mapped(path: Path, size: int) -> Any:
    """A file's bytes as a tensor mapped from it; zeros where it cannot be read (the receiver's
    checksums refuse them, and the exchange stays in step)."""
    import torch

    try:
        if path.stat().st_size != size:
            raise OSError(f"{size} bytes expected")
        return torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    except (OSError, RuntimeError) as error:
        log.warning("%s could not be read for a copy to another node (%s)", path, error)
        return torch.zeros(size, dtype=torch.uint8)


def _writable(path: Path | None, size: int) -> tuple[Any, str | None]:
    """A tensor mapped onto a new file of ``size`` bytes at ``path``, which receiving into
    writes (its blocks allocated first: a full tmpfs refuses them here instead of killing the
    process with SIGBUS at a write into the mapping); a tensor of plain memory for ``None``, or
    with what failed where the file cannot be made."""
    import torch

    if path is None:
        return torch.empty(size, dtype=torch.uint8), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as made:
            if size:
                os.posix_fallocate(made.fileno(), 0, size)
        return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8), None
    except (OSError, RuntimeError) as error:
        _fs.remove_logged(_fs.remove_leftover, path, "file that could not be made")
        problem = f"{path.name} could not be made ({getattr(error, 'strerror', None) or error})"
        return torch.empty(size, dtype=torch.uint8), problem


def _check_names(directory: Path, manifest: Manifest) -> None:
    outside = name_outside(manifest)
    if outside is not None:
        raise CorruptCheckpoint(f"{directory}: {outside}")


# ---------------------------------------------------------------------------------------------
# Persisting by contribution


def held_files(memory: CheckpointLayout, name: CheckpointName) -> dict[str, Path]:
    """The files of checkpoint ``name`` this node holds, own and partner copy, by name."""
    held = {}
    for directory in (replica_path(memory, name), memory.path_of(name)):
        held.update({file: directory / file for file in node_files(directory)})
    return held


def contribute(memory: CheckpointLayout, durable: CheckpointLayout, name: CheckpointName,
               ) -> bool:
    """Copy what this node holds of checkpoint ``name`` into the checkpoint root's directory of
    it, each file verified before it is renamed into place; whichever node completes the set
    writes the job manifest and moves the link forward. Returns whether the checkpoint is
    committed in the checkpoint root."""
    job = job_manifest(memory.path_of(name))
    _check_names(memory.path_of(name), job)
    target = durable.path_of(name)
    if os.path.lexists(target) and inspect_checkpoint(durable, name).valid:
        link_newest(durable)  # a contributor killed between the manifest and the link
        return True
    durable.record_index(name.index)
    target.mkdir(exist_ok=True)
    for file, path in sorted(held_files(memory, name).items()):
        record = job.files.get(file)
        if record is None or _complete(target / file, record):
            continue
        _copy_verified(path, target / file, record, job.checksum)
    if not all(_complete(target / file, record) for file, record in job.files.items()):
        return False
    for parent in sorted({(target / file).parent for file in job.files}, reverse=True):
        _fs.fsync_directory(parent)
    _fs.atomic_write_bytes(target / MANIFEST_NAME, job.to_json().encode())
    link_newest(durable)
    return True


def link_newest(durable: CheckpointLayout) -> None:
    """Point the durable link at the newest committed checkpoint if it names an older one.
    Nodes seal concurrently: each checks after its own swap, so the last swap is corrected."""
    linked = durable.link_target_name()
    for checkpoint in reversed(list_checkpoints(durable.root, durable.prefix,
                                                commit_state_only=True)):
        if linked is not None and checkpoint.index <= linked.index:
            return
        if checkpoint.valid:
            _fs.atomic_symlink(checkpoint.path, durable.link_path)
            return


def _complete(path: Path, record: FileRecord) -> bool:
    try:
        return path.lstat().st_size == record.size and not path.is_symlink()
    except OSError:
        return False


def _copy_verified(source: Path, target: Path, record: FileRecord, algorithm: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = _fs.temporary_sibling(target)
    try:
        with open(source, "rb") as reading, open(temporary, "xb") as writing:
            shutil.copyfileobj(reading, writing, 8 << 20)
            writing.flush()
            os.fsync(writing.fileno())
        if file_checksum(temporary, algorithm) != record.checksum:
            raise CorruptCheckpoint(f"{source} does not match its checksum; not persisted")
        os.replace(temporary, target)
    finally:
        if os.path.lexists(temporary):
            _fs.remove_logged(_fs.remove_leftover, temporary, "unfinished copy")
    _fs.fsync_directory(target.parent)


def contribute_newest(memory: CheckpointLayout, durable: CheckpointLayout,
                      ) -> CheckpointName | None:
    """At a node's end (its workers gone): contribute what this node holds of its memory
    checkpoints newer than the durable link's, newest first, until one is committed there;
    return that one (``None``: none was, or none needed to be). The newest may be one that
    only some nodes committed (a rank died in between): then an older one is the newest
    whole one."""
    for checkpoint in newer_than_persisted(memory, durable):
        if (checkpoint.path / JOB_MANIFEST_NAME).is_file() \
                and contribute(memory, durable, checkpoint.name):
            return checkpoint.name
    return None


# ---------------------------------------------------------------------------------------------
# Resume: assemble the newest checkpoint the nodes hold between them


def inventory(memory: CheckpointLayout) -> str:
    """What this node holds, as its leader reports it: per checkpoint, its own files, those of
    the partner copy and the job manifest."""
    held: dict[str, dict[str, Any]] = {}
    names = {str(n) for n in memory.checkpoint_names()}
    try:
        names |= {p.name for p in (memory.root / REPLICAS).iterdir()
                  if memory.parse(p.name) is not None}
    except OSError:
        pass
    for name in names:
        parsed = memory.parse(name)
        assert parsed is not None
        own, copy = memory.path_of(parsed), replica_path(memory, parsed)
        job = None
        for directory in (own, copy):
            try:
                job = job or (directory / JOB_MANIFEST_NAME).read_text()
            except (OSError, UnicodeDecodeError):
                continue
        held[name] = {"own": node_files(own), "copy": node_files(copy), "job": job}
    return json.dumps(held)


def assembly_plan(inventories: Mapping[int, str], prefix_layout: CheckpointLayout,
                  durable_newest: int, requested: str | None,
                  failed: Collection[str] = ()) -> dict[str, Any]:
    """Rank 0: the newest checkpoint the nodes hold between them (``requested`` only, if
    given), not older than ``durable_newest`` and not among ``failed``, and the fetches that
    give every node all of it:
    ``{"name": ..., "job": ..., "fetch": [[from, to, file, "own" | "copy"], ...]}``, or
    ``{"name": None}``."""
    held = {node: json.loads(text) for node, text in inventories.items()}
    names = {name for node in held.values() for name in node}
    ranked = sorted((parsed.index, name) for name in names
                    if (parsed := prefix_layout.parse(name)) is not None)
    for index, name in reversed(ranked):
        if requested is not None and requested not in (name, str(index)):
            continue
        if index < durable_newest:
            break
        texts = [node[name]["job"] for node in held.values() if node.get(name, {}).get("job")]
        if name in failed or not texts:
            continue
        # Per node, where it holds each file: its own ("own") or its partner copy ("copy").
        where = {node: {**{f: "copy" for f in held[node].get(name, {}).get("copy", [])},
                        **{f: "own" for f in held[node].get(name, {}).get("own", [])}}
                 for node in sorted(held)}
        fetch = []
        for file in sorted(Manifest.from_json(texts[0]).files):
            holders = sorted((kinds[file] != "own", node) for node, kinds in where.items()
                             if file in kinds)
            if not holders:
                break  # nowhere: an older checkpoint, or the checkpoint root's
            source = holders[0][1]
            fetch += [[source, node, file, where[source][file]] for node, kinds in where.items()
                      if file not in kinds]
        else:
            return {"name": name, "job": texts[0], "fetch": fetch}
    return {"name": None}


def assemble(memory: CheckpointLayout, plan: Mapping[str, Any], nodes: Nodes, group: Any,
             ) -> str | None:
    """On every leader: make this node's memory directory of the planned checkpoint whole:
    its partner-copy files linked in, the others fetched from the nodes the plan names (in
    the plan's order, which every leader follows, so no send waits on a receive that comes
    later), and the job manifest as its manifest. Returns what failed on this node (every
    fetch is still sent and received: the other leaders never wait for nothing). Checksums
    are verified afterwards, by every rank of the node (:func:`share_problem`)."""

    name = memory.parse(str(plan["name"]))
    assert name is not None
    job = Manifest.from_json(str(plan["job"]))
    own, copy = memory.path_of(name), replica_path(memory, name)
    problem = None
    try:
        _check_names(own, job)
        own.mkdir(parents=True, exist_ok=True)
        memory.record_index(name.index)
        for file in sorted(set(node_files(copy)) - set(node_files(own))):
            (own / file).parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(own / file):
                os.link(copy / file, own / file)
    except (OSError, CyclerError) as error:
        problem = f"node {nodes.node}: {error}"
    for source, target, file, kind in plan["fetch"]:
        size = job.files[file].size
        if nodes.node == source:
            tensor = _mapped((own if kind == "own" else copy) / file, size)
            _together(group, [(piece, nodes.leader_of(target)) for piece in _pieces(tensor)], [])
        elif nodes.node == target:
            temporary = _fs.temporary_sibling(own / file)
            tensor, failed = _writable(None if problem else temporary, size)
            _together(group, [], [(piece, nodes.leader_of(source)) for piece in _pieces(tensor)])
            del tensor  # unmapped: the file holds what arrived
            problem = problem or failed or _renamed(temporary, own / file)
    if problem:
        return problem
    try:
        _fs.fsync_directory(own)
        _fs.atomic_write_bytes(own / MANIFEST_NAME, job.to_json().encode())
        restrict_tree(own)
        _fs.atomic_symlink(own, memory.link_path)
    except OSError as error:
        return f"node {nodes.node}: {error}"
    return None


def _renamed(temporary: Path, path: Path) -> str | None:
    """Move a received file into place; what failed instead of raising (the other leaders'
    fetches must go on), the temporary removed."""
    try:
        os.replace(temporary, path)
    except OSError as error:
        _fs.remove_logged(_fs.remove_leftover, temporary, "unfinished fetch")
        return f"{path.name} could not be moved into place ({error.strerror or error})"
    return None


def share_problem(directory: Path, job: Manifest, nodes: Nodes) -> str | None:
    """This rank's share of its node's checksums of an assembled checkpoint, or the problem."""
    share = files_of_rank(sorted(job.files), nodes.local_rank, nodes.local_size)
    try:
        problem = check_files(directory, Manifest(
            index=job.index, files={f: job.files[f] for f in share}, created_at=job.created_at,
            checksum=job.checksum), checksums=True)
    except (OSError, CyclerError) as error:
        problem = str(error)
    return None if problem is None else f"node {nodes.node}: {problem}"


def assembled_checkpoint(memory: CheckpointLayout, durable_newest: Callable[[], int],
                         coordinator: Coordinator, nodes: Nodes, group: Any,
                         requested: str | None) -> tuple[Path | None, list[str]]:
    """On every rank: the memory checkpoint all ranks resume from, assembled on every node,
    or ``None`` (the caller then takes the checkpoint root's); and what was wrong with newer
    memory checkpoints that were tried. ``durable_newest``: the index of the checkpoint
    root's newest valid checkpoint (asked on rank 0 only, once)."""
    durable_once = functools.cache(durable_newest)
    failed: dict[str, str] = {}
    while True:
        path, name, problem = _assembled_once(memory, durable_once, coordinator, nodes, group,
                                              requested, failed)
        if path is not None or name is None:
            return path, [f"{n} in memory: {p}" for n, p in failed.items()]
        failed[name] = problem


def _assembled_once(memory: CheckpointLayout, durable_newest: Callable[[], int],
                    coordinator: Coordinator, nodes: Nodes, group: Any, requested: str | None,
                    failed: Collection[str]) -> tuple[Path | None, str | None, str]:
    """One candidate: (its path, assembled and verified on every node, its name, ""), or
    (``None``, its name, what failed), or (``None``, ``None``, "") when there is none left."""
    key = coordinator.new_round("resume-nodes")
    mine = inventory(memory) if nodes.leader else ""
    coordinator.arrive(key, mine)
    if coordinator.is_creator:
        try:
            values = coordinator.gather(key, mine)
            reports = {rank // nodes.local_size: value for rank, value in enumerate(values)
                       if rank % nodes.local_size == 0}
            plan = assembly_plan(reports, memory, durable_newest(), requested, failed)
        except BaseException as error:
            coordinator.publish_error(key, error)
            raise
        coordinator.publish(key, json.dumps(plan))
    else:
        plan = json.loads(coordinator.outcome(key))
    if plan["name"] is None:
        return None, None, ""
    problem = (assemble(memory, plan, nodes, group) or "") if nodes.leader else ""
    assembled = coordinator.new_round("resume-nodes-assembled")
    coordinator.arrive(assembled, problem)
    coordinator.wait_for_all(assembled)
    name = memory.parse(str(plan["name"]))
    assert name is not None
    check = coordinator.new_round("resume-nodes-check")
    mine = problem or share_problem(memory.path_of(name), Manifest.from_json(plan["job"]),
                                    nodes) or ""
    coordinator.arrive(check, mine)
    if coordinator.is_creator:
        outcome = next((v for v in coordinator.gather(check, mine) if v), "ok")
        coordinator.publish(check, outcome)
    else:
        outcome = coordinator.outcome(check)
    if outcome != "ok":
        return None, str(plan["name"]), outcome
    return memory.path_of(name), str(plan["name"]), ""
