"""The job's private directory on this node: everything ranks and supervisor exchange while
training lives here, never on the shared checkpoint root (docs/design.md, "State on the node").

A parallel filesystem's metadata server is shared by every node of every job, and a stall of
seconds is routine there. So what changes at every step, or is polled several times a second,
stays in node memory: the control request the ranks poll (the supervisor writes it here first,
then a copy in the root for the other nodes and ``cycle status``), what the workers announce
(``control-node<R>.uses-*``), the switch that lowers their shields, the progress beacons and
stack dumps (``progress/``) and the note every rank leaves after each commit (``commits``: the
supervisor reads the checkpoint root's link when it changes, not ten times a second).

::

    <base>-run/                              0700, beside the memory tier's base
      <root name>-<sha256 of its path>-node<R>/   this job's directory on node R, 0700

``<base>`` is the memory tier's (``$XDG_RUNTIME_DIR/cycler`` where that is private to the user,
else ``/dev/shm/cycler-<uid>``, or ``--memory-dir``'s). ``cycle run`` makes it, checks it, and
names it in ``$CYCLER_NODE_DIR`` (:func:`cycler.checkpoint.memory_roots.runtime_dir`);
workers check it again before they use it (:func:`node_dir`). A script started without
``cycle run`` has none and needs none.

Other per-step state a worker keeps for its supervisor belongs here too: build its path with
:func:`node_dir`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cycler.errors import CheckpointDirectoryError
from cycler.protocol.environment import ENV_NODE_DIR
from cycler.protocol.names import CONTROL_FILENAME, PROGRESS_DIRNAME

COMMITS_FILENAME = "commits"
"""Touched by every rank after each commit: the supervisor then reads the root's link."""


@dataclass(frozen=True)
class NodeFiles:
    """Where one node's ranks and supervisor meet: the control file the ranks poll (its
    announcements and shield switch beside it), the beacons' directory and the commit note."""

    control_path: Path
    progress_dir: Path
    commits_path: Path

    @classmethod
    def in_directory(cls, directory: Path, node_rank: int) -> NodeFiles:
        """The files in the job's private directory on this node."""
        return cls(directory / CONTROL_FILENAME.format(node=node_rank),
                   directory / PROGRESS_DIRNAME.format(node=node_rank),
                   directory / COMMITS_FILENAME)


_FIX = "set XDG_RUNTIME_DIR to a private directory of yours, or give --memory-dir DIR"


@functools.cache
def _checked(directory: str) -> Path | None:
    # The one check of a user's private directories, imported when a worker first needs it
    # (it has no dependency on the rest of cycler.checkpoint).
    from cycler._private import check_private

    try:
        check_private(Path(directory), "the job's runtime directory", _FIX)
    except CheckpointDirectoryError as error:
        sys.stderr.write(f"cycler: {error}; the supervisor will not see this worker's "
                         "progress\n")
        return None
    return Path(directory)


def node_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The job's private directory on this node (``$CYCLER_NODE_DIR``), checked once per
    process to be a private directory of this user; ``None`` outside ``cycle run`` or when the
    check fails (said once on stderr)."""
    directory = (os.environ if environ is None else environ).get(ENV_NODE_DIR)
    return _checked(directory) if directory else None


def refused_node_dir(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``cycle run`` named a runtime directory that failed the check: the workers
    must then use none of its files (another user may have put them there)."""
    env = os.environ if environ is None else environ
    return bool(env.get(ENV_NODE_DIR)) and node_dir(env) is None


def note_commit() -> None:
    """Every rank, after each commit: tell this node's supervisor to read the root's link
    (a ``utime`` in node memory; nothing outside ``cycle run``; never raises)."""
    directory = node_dir()
    if directory is None:
        return
    path = directory / COMMITS_FILENAME
    try:
        with open(path, "a"):
            os.utime(path)
    except OSError:
        pass


def commit_note(files: NodeFiles) -> tuple[int, int] | None:
    """What the commit note says now (its inode and change time; ``None``: none yet)."""
    try:
        status = os.stat(files.commits_path)
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns
