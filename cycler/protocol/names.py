"""The names of the supervisor's record inside a checkpoint root (docs/design.md): ``.cycler/`` and
the files supervisor and workers share there. The
paths are made only by :class:`cycler.protocol.record.RunRecord` (the node's runtime directory
reuses the control file's and the beacons' names, :mod:`cycler.protocol.node_local`).
"""

from __future__ import annotations

SUPERVISOR_DIRNAME = ".cycler"

# One control file, events log and lock per node: each node's supervisor writes its own, so
# supervisors on a shared filesystem never race on one file (O_APPEND is not atomic over NFS).
CONTROL_FILENAME = "control-node{node}.json"
EVENTS_FILENAME = "events-node{node}.jsonl"
LOCK_FILENAME = "supervisor-node{node}.lock"
RESUME_RECORD_FILENAME = "resumed-from-node{node}.json"
HEARTBEAT_FILENAME = "alive-node{node}.json"
LIVENESS_STORE_FILENAME = "liveness-store.json"
"""Where node 0's supervisor says the address of the job's liveness store (a root's)."""
PROGRESS_DIRNAME = "progress-node{node}"
HANG_RECORD_FILENAME = "hang-node{node}.json"
WORKERS_FINISHED_FILENAME = "finished-node{node}"
MEMORY_TIER_RECORD_FILENAME = "memory-tier.json"
JOB_ID_FILENAME = "job-id"
"""The checkpoint root's job id, also recorded in its memory roots (a root's, not a node's)."""
MEMORY_OVERFLOW_FILENAME = "memory-tier-overflow.json"
"""Present once a checkpoint did not fit in the memory tier: the job saves to the root."""
MEMORY_OWNER_FILENAME = "memory-owner.json"
"""In a memory root's ``.cycler/``: the job id and checkpoint root it belongs to."""
COMPILE_CACHE_FILENAME = "compile-cache.tar"
"""torch.compile's caches of the job, carried with the root (a root's, written by node 0)."""
FINGERPRINTS_FILENAME = "fingerprints-node{node}.fp"
"""Node R's workers' step fingerprints, copied from the node by its supervisor."""
STDERR_LOG_FILENAME = "stderr-node{node}.log"
"""On several nodes: the tracebacks of torchrun and its workers held back from the terminal
(a lost node's echo is summed up in one line there), kept whole here."""

# Per saver (``<prefix><suffix>``, or ``<prefix>`` after the prefix for verification records).
INDEX_RECORD_SUFFIX = ".last_index"
FIRST_INDEX_SUFFIX = ".first_index"
VERIFICATION_RECORD_PREFIX = "verify-failed-"


def every_node(filename: str) -> str:
    """A glob that matches ``filename`` (one of the ``...node{node}...`` names) for any node."""
    return filename.format(node="*")
