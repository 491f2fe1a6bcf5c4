"""The run's record in a checkpoint root: the one owner of every path under ``<root>/.cycler/``.

::

    <root>/.cycler/
      control-node<R>.json, events-node<R>.jsonl, supervisor-node<R>.lock   per node
      alive-node<R>.json, finished-node<R>, progress-node<R>/               per node
      hang-node<R>.json, hang-<time>/, resumed-from-node<R>.json            per node
      stderr-node<R>.log, fingerprints-node<R>.fp                           per node
      liveness-store.json, job-id, memory-tier.json, memory-tier-overflow.json,
      memory-owner.json (a memory root's), compile-cache.tar                 per root
      <prefix>.writer.lock, <prefix>.last_index, <prefix>.first_index       per saver
      verify-failed-<checkpoint>                                             per checkpoint

The file names are :mod:`cycler.protocol.names`'s (docs/layout-on-disk.md describes each);
the paths are made here and nowhere else: every module that reads or writes a record asks a
:class:`RunRecord`. The checkpoints' own names, indices and link are
:class:`cycler.checkpoint.layout.CheckpointLayout`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from cycler.errors import CheckpointDirectoryError
from cycler.protocol.names import (
    COMPILE_CACHE_FILENAME,
    CONTROL_FILENAME,
    EVENTS_FILENAME,
    FINGERPRINTS_FILENAME,
    FIRST_INDEX_SUFFIX,
    HANG_RECORD_FILENAME,
    HEARTBEAT_FILENAME,
    INDEX_RECORD_SUFFIX,
    JOB_ID_FILENAME,
    LIVENESS_STORE_FILENAME,
    LOCK_FILENAME,
    MEMORY_OVERFLOW_FILENAME,
    MEMORY_OWNER_FILENAME,
    MEMORY_TIER_RECORD_FILENAME,
    PROGRESS_DIRNAME,
    RESUME_RECORD_FILENAME,
    STDERR_LOG_FILENAME,
    SUPERVISOR_DIRNAME,
    VERIFICATION_RECORD_PREFIX,
    WORKERS_FINISHED_FILENAME,
    every_node,
)

WRITER_LOCK_SUFFIX = ".writer.lock"
HANG_DUMP_PREFIX = "hang-"


def node_of_control_file(control_file: Path) -> int | None:
    """The node rank a control file's name carries (``control-node<R>.json``), else ``None``."""
    prefix, suffix = CONTROL_FILENAME.split("{node}")
    name = control_file.name
    rank = name[len(prefix):len(name) - len(suffix)]
    matches = name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix)
    return int(rank) if matches and rank.isascii() and rank.isdigit() else None


def events_path_beside(control_file: Path, node_rank: int) -> Path:
    """Node ``node_rank``'s events log in the directory of its control file (where that is a
    root's record, as without a runtime directory on the node)."""
    return control_file.with_name(EVENTS_FILENAME.format(node=node_rank))


def is_record_directory(name: str) -> bool:
    """Whether ``name`` (one component of a path) is a root's record directory."""
    return name == SUPERVISOR_DIRNAME


class RunRecord:
    """The paths of the record ``cycle run``, the savers and ``cycle status`` keep in ``root``.

    The root is kept absolute, as :class:`~cycler.checkpoint.layout.CheckpointLayout` keeps it.
    Nothing here reads or writes a record: the callers do, through these paths.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.abspath(root))

    @property
    def directory(self) -> Path:
        return self.root / SUPERVISOR_DIRNAME

    def check_directory(self) -> None:
        """Refuse a ``.cycler`` that is a symlink: locks, records and control files would land
        outside the root, where another job's could be."""
        if self.directory.is_symlink():
            raise CheckpointDirectoryError(
                f"{self.directory} is a symlink; cycler keeps its locks and records inside "
                "the checkpoint root: replace it with a directory")

    # One file per node: each node's supervisor writes its own.

    def control_path(self, node_rank: int = 0) -> Path:
        return self.directory / CONTROL_FILENAME.format(node=node_rank)

    def control_paths(self) -> list[Path]:
        """Every node's control file."""
        return sorted(self.directory.glob(every_node(CONTROL_FILENAME)))

    def events_path(self, node_rank: int = 0) -> Path:
        return self.directory / EVENTS_FILENAME.format(node=node_rank)

    def events_paths(self) -> dict[int, Path]:
        """Every node's events log, by node rank."""
        return self._by_node(EVENTS_FILENAME)

    def lock_path(self, node_rank: int = 0) -> Path:
        return self.directory / LOCK_FILENAME.format(node=node_rank)

    def lock_paths(self) -> list[Path]:
        """Every node's supervisor lock file."""
        return sorted(self.directory.glob(every_node(LOCK_FILENAME)))

    def heartbeat_path(self, node_rank: int = 0) -> Path:
        """Where node ``node_rank``'s supervisor shows it is alive, and how it ended."""
        return self.directory / HEARTBEAT_FILENAME.format(node=node_rank)

    def progress_dir(self, node_rank: int = 0) -> Path:
        """Where node ``node_rank``'s workers keep their progress beacons and stack dumps."""
        return self.directory / PROGRESS_DIRNAME.format(node=node_rank)

    def workers_finished_path(self, node_rank: int = 0) -> Path:
        """Present once node ``node_rank``'s workers all ended with success in this run (its
        launcher writes it; a multi-node job's other nodes read it)."""
        return self.directory / WORKERS_FINISHED_FILENAME.format(node=node_rank)

    def workers_finished_nodes(self) -> list[int]:
        """The nodes whose workers' finish is recorded, by rank."""
        return list(self._by_node(WORKERS_FINISHED_FILENAME))

    def hang_record_path(self, node_rank: int = 0) -> Path:
        """The step interval node ``node_rank``'s hang detection learned (kept across starts)."""
        return self.directory / HANG_RECORD_FILENAME.format(node=node_rank)

    def hang_dump_dir(self, when: str) -> Path:
        """Where the stacks of the workers of a hang found at ``when`` go."""
        return self.directory / f"{HANG_DUMP_PREFIX}{when}"

    def resume_record_path(self, node_rank: int = 0) -> Path:
        """Where ``cycle run`` records that a ``--resume-from`` rollback was carried out."""
        return self.directory / RESUME_RECORD_FILENAME.format(node=node_rank)

    def stderr_log_path(self, node_rank: int = 0) -> Path:
        """On several nodes: where node ``node_rank``'s held-back tracebacks are kept whole."""
        return self.directory / STDERR_LOG_FILENAME.format(node=node_rank)

    def fingerprints_path(self, node_rank: int = 0) -> Path:
        """Node ``node_rank``'s workers' step fingerprints, copied here by its supervisor."""
        return self.directory / FINGERPRINTS_FILENAME.format(node=node_rank)

    # One file per root.

    @property
    def liveness_store_path(self) -> Path:
        """Where node 0's supervisor says the address of the job's liveness store."""
        return self.directory / LIVENESS_STORE_FILENAME

    @property
    def job_id_path(self) -> Path:
        """The checkpoint root's job id (random, made once)."""
        return self.directory / JOB_ID_FILENAME

    @property
    def memory_tier_record_path(self) -> Path:
        """Where `cycle run --memory-tier` records the memory root, for `cycle status`."""
        return self.directory / MEMORY_TIER_RECORD_FILENAME

    @property
    def memory_overflow_path(self) -> Path:
        """Present once a checkpoint did not fit in the memory tier."""
        return self.directory / MEMORY_OVERFLOW_FILENAME

    @property
    def memory_owner_path(self) -> Path:
        """In a memory root: the job id and the checkpoint root it belongs to."""
        return self.directory / MEMORY_OWNER_FILENAME

    @property
    def compile_cache_path(self) -> Path:
        """Where the root carries the job's compile cache."""
        return self.directory / COMPILE_CACHE_FILENAME

    # One file per saver (``prefix``: AtomicDirectory's ``name=``) or per checkpoint.

    def writer_lock_path(self, prefix: str) -> Path:
        """Held by the rank that creates ``prefix``'s checkpoints, from prepare to commit."""
        return self.directory / f"{prefix}{WRITER_LOCK_SUFFIX}"

    def index_record_path(self, prefix: str) -> Path:
        """The highest index ``prefix``'s saver ever used here."""
        return self.directory / f"{prefix}{INDEX_RECORD_SUFFIX}"

    def first_index_record_path(self, prefix: str) -> Path:
        """The first index ``prefix``'s saver used in a root another tool wrote."""
        return self.directory / f"{prefix}{FIRST_INDEX_SUFFIX}"

    def verification_record_path(self, checkpoint: str) -> Path:
        """Where a resume that found ``checkpoint``'s checksums wrong says so."""
        return self.directory / f"{VERIFICATION_RECORD_PREFIX}{checkpoint}"

    def verification_records(self) -> dict[str, Path]:
        """Checkpoint name -> its record, for every name a verification record is kept for
        (whatever the saver: the caller keeps the names that are its own)."""
        found = {}
        for entry in _list(self.directory):
            if entry.startswith(VERIFICATION_RECORD_PREFIX):
                found[entry[len(VERIFICATION_RECORD_PREFIX):]] = self.directory / entry
        return found

    def _by_node(self, filename: str) -> dict[int, Path]:
        prefix, suffix = filename.split("{node}")
        found = {}
        for path in self.directory.glob(every_node(filename)):
            rank = path.name[len(prefix):len(path.name) - len(suffix)]
            if rank.isdigit():
                found[int(rank)] = path
        return dict(sorted(found.items()))


def _list(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
