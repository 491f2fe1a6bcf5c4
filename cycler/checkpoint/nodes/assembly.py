"""The resume on several nodes: the newest checkpoint the nodes hold between them, assembled in
every node's memory root from what the others send, verified by every rank."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from cycler import _fs
from cycler.checkpoint.coordination import Coordinator
from cycler.checkpoint.layout import CheckpointLayout
from cycler.checkpoint.linking import finalize
from cycler.checkpoint.manifest import Manifest
from cycler.checkpoint.nodes.node_commit import JOB_MANIFEST_NAME, check_names, node_files
from cycler.checkpoint.nodes.partner_copy import REPLICAS, replica_path
from cycler.checkpoint.nodes.topology import Nodes
from cycler.checkpoint.nodes.transport import mapped, pieces, together, writable
from cycler.checkpoint.resume import VERIFIED, first_problem, share_problem
from cycler.errors import CyclerError


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
    are verified afterwards, by every rank of the node (:func:`~.resume.share_problem`)."""

    name = memory.parse(str(plan["name"]))
    assert name is not None
    job = Manifest.from_json(str(plan["job"]))
    own, copy = memory.path_of(name), replica_path(memory, name)
    problem = None
    try:
        check_names(own, job)
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
            tensor = mapped((own if kind == "own" else copy) / file, size)
            together(group, [(piece, nodes.leader_of(target)) for piece in pieces(tensor)], [])
        elif nodes.node == target:
            temporary = _fs.temporary_sibling(own / file)
            tensor, failed = writable(None if problem else temporary, size)
            together(group, [], [(piece, nodes.leader_of(source)) for piece in pieces(tensor)])
            del tensor  # unmapped: the file holds what arrived
            problem = problem or failed or _renamed(temporary, own / file)
    if problem:
        return problem
    try:
        _fs.fsync_directory(own)
        finalize(memory, name, job, private=True)
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

    def planned(inventories: list[str]) -> str:
        reports = {rank // nodes.local_size: value for rank, value in enumerate(inventories)
                   if rank % nodes.local_size == 0}
        return json.dumps(assembly_plan(reports, memory, durable_newest(), requested, failed))

    mine = inventory(memory) if nodes.leader else ""
    plan = json.loads(coordinator.decide_from_all(coordinator.new_round("resume-nodes"), mine,
                                                  planned))
    if plan["name"] is None:
        return None, None, ""
    problem = (assemble(memory, plan, nodes, group) or "") if nodes.leader else ""
    assembled = coordinator.new_round("resume-nodes-assembled")
    coordinator.arrive(assembled, problem)
    coordinator.wait_for_all(assembled)
    name = memory.parse(str(plan["name"]))
    assert name is not None
    mine = problem or share_problem(memory.path_of(name), Manifest.from_json(plan["job"]),
                                    nodes.local_rank, nodes.local_size,
                                    f"node {nodes.node}") or ""
    outcome = coordinator.decide_from_all(coordinator.new_round("resume-nodes-check"), mine,
                                          first_problem)
    if outcome != VERIFIED:
        return None, str(plan["name"]), outcome
    return memory.path_of(name), str(plan["name"]), ""
