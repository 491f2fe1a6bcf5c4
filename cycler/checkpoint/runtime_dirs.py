"""A job's private runtime directory on a node: per-step state that must not touch the shared root.

::

    $XDG_RUNTIME_DIR/cycler-runtime/    the user's base, 0700 (or /dev/shm/cycler-<uid>-runtime)
      <job id>/                         one job (the checkpoint root's .cycler/job-id), 0700
        fingerprints-node<N>/           node N's workers' step fingerprints, 0700

A tmpfs on the node: what the workers write there at every step costs no shared-filesystem
operation, and it outlives a kill -9 of a worker (not of the node). It sits beside the memory
tier's base, never in it (the memory tier's sweep removes what it does not know there), and is
named by the job id, so a new job with the same checkpoint path never reads an old job's
records. Checked as every private directory of the user is (:mod:`cycler._private`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from cycler._private import check_safe_parent, make_private
from cycler.checkpoint.memory_roots import job_id, memory_base
from cycler.protocol.record import RunRecord

_FIX = "set $XDG_RUNTIME_DIR to a private directory of yours"


def runtime_base(environ: Mapping[str, str] | None = None) -> Path:
    """The user's base for jobs' runtime directories on this node."""
    memory = memory_base(None, environ)
    return memory.with_name(f"{memory.name}-runtime")


def job_runtime_dir(record: RunRecord, environ: Mapping[str, str] | None = None) -> Path:
    """The job's runtime directory on this node, created private if missing. Raises
    :class:`~cycler.errors.CheckpointDirectoryError` (one line) where it cannot be made or
    is not the user's own."""
    base = runtime_base(environ)
    check_safe_parent(base.parent, "the runtime directory's parent", _FIX)
    make_private(base, "the runtime directory", _FIX)
    directory = base / job_id(record)
    make_private(directory, "the job's runtime directory", _FIX)
    return directory


def node_dir(job_dir: Path, name: str, node_rank: int) -> Path:
    """``<job_dir>/<name>-node<node_rank>``, created private if missing."""
    directory = job_dir / f"{name}-node{node_rank}"
    make_private(directory, "the job's runtime directory", _FIX)
    return directory
