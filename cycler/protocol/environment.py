"""Environment variables of the stop protocol and the checkpoint root's default (docs/design.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ENV_CONTROL_FILE = "CYCLER_CONTROL_FILE"
"""Path of the control file the supervisor writes and the workers read."""

ENV_CHECKPOINT_DIR = "CYCLER_CHECKPOINT_DIR"
"""The checkpoint root chosen by ``cycle run`` (or by the user)."""

ENV_CHECKPOINT_NAME = "CYCLER_CHECKPOINT_NAME"
"""The savers' prefix ``cycle run`` watches (``--checkpoint-name``): a saver built without
``name=`` uses it."""

ENV_RESTART_COUNT = "CYCLER_RESTART_COUNT"
"""How many times workers have been started before in this job, requeues included."""

ENV_RESUME_FROM = "CYCLER_RESUME_FROM"
"""Name of a checkpoint to start from instead of the latest (``cycle run --resume-from``)."""

ENV_STOP_SIGNALS = "CYCLER_STOP_SIGNALS"
"""The signals ``cycle run`` treats as stop requests (``SIGTERM,SIGINT,...``): a worker that
reads the control file ignores them when they reach it directly."""

ENV_PROGRESS_DIR = "CYCLER_PROGRESS_DIR"
"""Where this node's workers keep their progress beacons and stack dumps (``cycle run``)."""

ENV_NODE_DIR = "CYCLER_NODE_DIR"
"""The job's private directory on this node (``cycle run``): the control file the workers poll,
their announcements, beacons and commit notes live there, off the shared checkpoint root
(:mod:`cycler.protocol.node_local`)."""

ENV_MEMORY_TIER = "CYCLER_MEMORY_TIER"
"""This job's memory root on this node (``cycle run --memory-tier``): savers commit every
checkpoint there first and persist some to the checkpoint root. ``cycle run`` computes it once
(``checkpoint.memory_roots``) and checks it before any worker starts; a saver checks it again."""

ENV_PERSIST_EVERY = "CYCLER_PERSIST_EVERY"
"""With the memory tier: every checkpoint whose index is a multiple of this is persisted to the
checkpoint root (``cycle run --persist-every``); stop checkpoints always are."""

ENV_ISC_ARTIFACT_PATH = "CHECKPOINT_ARTIFACT_PATH"
"""ISC's checkpoint artifact directory; used when ``CYCLER_CHECKPOINT_DIR`` is not set."""

ENV_ISC_LOSSY_PATH = "LOSSY_ARTIFACT_PATH"
"""ISC's directory for logs and tensorboard files; ``cycle run`` sets it beside the root."""

ENV_VERIFY = "CYCLER_VERIFY"
"""Set (``1``) by ``cycle verify`` in the runs it compares: a :class:`~cycler.StepControl`
with no schedule of its own asks for a checkpoint at steps 2, 4, 8, 16... (the same steps in
both runs, so that there is something to compare before and after each resume), and the
integrations and ``LoopState.close()`` commit one at the end of training (so that the state a
run ends with is compared). Unset: nothing changes."""

DEFAULT_CHECKPOINT_DIR = "checkpoints"
DEFAULT_CHECKPOINT_NAME = "AtomicDirectory"


def default_checkpoint_name(environ: Mapping[str, str] | None = None) -> str:
    """``$CYCLER_CHECKPOINT_NAME``, else ``AtomicDirectory`` (cycling_utils' prefix)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_CHECKPOINT_NAME) or DEFAULT_CHECKPOINT_NAME


def default_checkpoint_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$CYCLER_CHECKPOINT_DIR``, else ``$CHECKPOINT_ARTIFACT_PATH``, else ``./checkpoints``."""
    env = os.environ if environ is None else environ
    for key in (ENV_CHECKPOINT_DIR, ENV_ISC_ARTIFACT_PATH):
        if env.get(key):
            return Path(env[key])
    return Path(DEFAULT_CHECKPOINT_DIR)


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """``$CYCLER_RESTART_COUNT`` as an int (0 when unset or malformed)."""
    env = os.environ if environ is None else environ
    try:
        return max(0, int(env.get(ENV_RESTART_COUNT, "0")))
    except ValueError:
        return 0


def under_verify(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process is a run of ``cycle verify`` (``$CYCLER_VERIFY``)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_VERIFY) == "1"


def verify_wants_checkpoint(step: int) -> bool:
    """Whether ``cycle verify``'s own schedule asks for a checkpoint at global step ``step``
    (a power of two from 2): about log2(steps) checkpoints, at the same steps in every run."""
    return step >= 2 and step & (step - 1) == 0
