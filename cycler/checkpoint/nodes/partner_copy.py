"""The partner copy: after each commit every leader sends its node's files to the next node's
leader (a ring), which keeps them under ``.replicas/<checkpoint>/``, verified, the sender's node
manifest written last. The copies of checkpoints the node no longer keeps go by
:func:`cycler.checkpoint.retainer.retain_replicas`."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from cycler import _fs
from cycler._private import PRIVATE_DIRECTORY_MODE, restrict_tree
from cycler.checkpoint.layout import MANIFEST_NAME, CheckpointLayout, CheckpointName
from cycler.checkpoint.manifest import Manifest, check_files
from cycler.checkpoint.nodes.node_commit import check_names
from cycler.checkpoint.nodes.topology import Nodes
from cycler.checkpoint.nodes.transport import swap_bytes, swap_files
from cycler.checkpoint.retainer import discard
from cycler.errors import CorruptCheckpoint, CyclerError

log = logging.getLogger(__name__)

REPLICAS = ".replicas"
"""Where a node's memory root keeps its partner's copies, one directory per checkpoint."""


def replica_path(memory: CheckpointLayout, name: CheckpointName | str) -> Path:
    return memory.root / REPLICAS / str(name)


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
    theirs_bytes = swap_bytes(group, manifest_bytes, partner, source)
    theirs = Manifest.from_json(theirs_bytes.decode()) if theirs_bytes else None
    outgoing = [] if mine is None else [(own / f, r.size) for f, r in sorted(mine.files.items())]
    target = replica_path(memory, name)
    problem = None
    if theirs is not None:
        try:
            check_names(target, theirs)
            if os.path.lexists(target):
                discard(target)
            # 0700 whatever the umask: restrict_tree below makes the copy's own tree private.
            target.parent.mkdir(mode=PRIVATE_DIRECTORY_MODE, exist_ok=True)
            target.mkdir(mode=PRIVATE_DIRECTORY_MODE)
        except (OSError, CyclerError) as error:
            problem = str(error)
    incoming = [] if theirs is None else [(None if problem else target / f, r.size)
                                          for f, r in sorted(theirs.files.items())]
    problem = swap_files(group, outgoing, partner, incoming, source) or problem
    if theirs is None:
        return
    try:
        problem = problem or check_files(target, theirs, checksums=True)
        if problem is not None:
            raise CorruptCheckpoint(f"the copy of node {nodes.source}'s {name}: {problem}")
        _fs.atomic_write_bytes(target / MANIFEST_NAME, theirs_bytes)
        restrict_tree(target)
    except BaseException:
        _fs.remove_logged(discard, target, "unfinished partner copy")
        raise


_MOVED = {"retain_replicas": "retainer"}
"""Names this module had, now in the module named (their old import paths still work)."""


def __getattr__(name: str) -> object:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"cycler.checkpoint.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
