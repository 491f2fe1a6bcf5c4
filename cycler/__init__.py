"""cycler: make PyTorch training survive preemption.

This module only wires the public API together; README.md and docs/ say how to use it. Names are
imported on first use (PEP 562), so ``cycle`` and ``import cycler.protocol.control`` do not pay for
importing torch: the supervisor's start-up stays close to bare torchrun's.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from cycler._version import __version__

IS_TORCH_CYCLER = True
"""Marker that tells torch-cycler apart from matplotlib's ``cycler`` package of the same name."""

_WORKER = bool(os.environ.get("CYCLER_CONTROL_FILE") and os.environ.get("LOCAL_RANK"))
if _WORKER:
    # A worker of cycle run (torchrun sets LOCAL_RANK for workers only, not for itself): say so
    # at once, so that a stop arriving before the script builds its StepControl or saver waits
    # for them instead of treating it as a plain script.
    from cycler.protocol.features import USES_CYCLER, announce
    from cycler.protocol.progress import beacon, register_stack_dump

    announce(USES_CYCLER)
    beacon()  # from now on the supervisor sees this worker, before its first step
    register_stack_dump()  # a hung worker's stacks, asked for by the supervisor

if TYPE_CHECKING:
    from cycler.checkpoint.atomic_directory import AtomicDirectory
    from cycler.checkpoint.in_flight import SaveHandle
    from cycler.checkpoint.listing import (
        Checkpoint,
        CheckpointState,
        CheckpointWarning,
        find_checkpoint,
        latest_checkpoint,
        list_checkpoints,
    )
    from cycler.checkpoint.manifest import Manifest, read_manifest
    from cycler.checkpoint.saving import atomic_torch_save
    from cycler.data.datasets import DistributedShardedDataset
    from cycler.data.grouped_sampler import InterruptableDistributedGroupedBatchSampler
    from cycler.data.samplers import (
        AdvancedTooFarError,
        InterruptableDistributedSampler,
        InterruptableSampler,
        InterruptibleDistributedSampler,
        InterruptibleSampler,
    )
    from cycler.errors import (
        CheckpointNotFound,
        ConfigError,
        CoordinationTimeout,
        CorruptCheckpoint,
        CyclerError,
        DatasetNotFound,
        StateMismatch,
    )
    from cycler.protocol.control import Action, ControlRequest
    from cycler.protocol.environment import default_checkpoint_root
    from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS, EXIT_USAGE
    from cycler.training.auto_interval import AutoInterval
    from cycler.training.ddp_buckets import settle_ddp_buckets
    from cycler.training.epochs import (
        EpochLoop,
        current_epoch,
        finished_epochs,
        remaining_epochs_until,
    )
    from cycler.training.metrics import MetricsTracker, TimestampedTimer
    from cycler.training.readiness import torch_distributed_readiness
    from cycler.training.rng import RngRestoreWarning, capture_rng_state, restore_rng_state
    from cycler.training.step_control import StepControl, StepDecision

_PUBLIC = {
    "Action": "cycler.protocol.control",
    "AdvancedTooFarError": "cycler.data.samplers",
    "AtomicDirectory": "cycler.checkpoint.atomic_directory",
    "AutoInterval": "cycler.training.auto_interval",
    "Checkpoint": "cycler.checkpoint.listing",
    "CheckpointNotFound": "cycler.errors",
    "CheckpointState": "cycler.checkpoint.listing",
    "CheckpointWarning": "cycler.checkpoint.listing",
    "ConfigError": "cycler.errors",
    "ControlRequest": "cycler.protocol.control",
    "CoordinationTimeout": "cycler.errors",
    "CorruptCheckpoint": "cycler.errors",
    "CyclerError": "cycler.errors",
    "DatasetNotFound": "cycler.errors",
    "DistributedShardedDataset": "cycler.data.datasets",
    "EXIT_FAILURE": "cycler.protocol.exit_codes",
    "EXIT_REQUEUE": "cycler.protocol.exit_codes",
    "EXIT_SUCCESS": "cycler.protocol.exit_codes",
    "EXIT_USAGE": "cycler.protocol.exit_codes",
    "EpochLoop": "cycler.training.epochs",
    "InterruptableDistributedGroupedBatchSampler": "cycler.data.grouped_sampler",
    "InterruptableDistributedSampler": "cycler.data.samplers",
    "InterruptableSampler": "cycler.data.samplers",
    "InterruptibleDistributedSampler": "cycler.data.samplers",
    "InterruptibleSampler": "cycler.data.samplers",
    "Manifest": "cycler.checkpoint.manifest",
    "MetricsTracker": "cycler.training.metrics",
    "RngRestoreWarning": "cycler.training.rng",
    "SaveHandle": "cycler.checkpoint.in_flight",
    "StateMismatch": "cycler.errors",
    "StepControl": "cycler.training.step_control",
    "StepDecision": "cycler.training.step_control",
    "TimestampedTimer": "cycler.training.metrics",
    "atomic_torch_save": "cycler.checkpoint.saving",
    "capture_rng_state": "cycler.training.rng",
    "current_epoch": "cycler.training.epochs",
    "default_checkpoint_root": "cycler.protocol.environment",
    "find_checkpoint": "cycler.checkpoint.listing",
    "finished_epochs": "cycler.training.epochs",
    "latest_checkpoint": "cycler.checkpoint.listing",
    "list_checkpoints": "cycler.checkpoint.listing",
    "read_manifest": "cycler.checkpoint.manifest",
    "remaining_epochs_until": "cycler.training.epochs",
    "restore_rng_state": "cycler.training.rng",
    "settle_ddp_buckets": "cycler.training.ddp_buckets",
    "torch_distributed_readiness": "cycler.training.readiness",
}

_NOT_PROVIDED = {
    "EpochHandler": "cycling_utils' Lightning callback EpochHandler is not part of cycler: in a "
                    "Lightning module call sampler.advance(batch_size) once per training batch "
                    "and save sampler.state_dict() with the checkpoint",
    "HasNotResetProgressError": "cycler's samplers never raise HasNotResetProgressError: "
                                "set_epoch keeps progress for the same epoch and resets it for "
                                "another",
}
"""cycling_utils names cycler does not provide, with what to use instead."""


def __getattr__(name: str) -> Any:
    if name in _NOT_PROVIDED:
        # ImportError, not AttributeError: `from cycler import X` would replace the latter
        # with a bare "cannot import name", losing the replacement it names.
        raise ImportError(_NOT_PROVIDED[name], name=name)
    try:
        module = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module 'cycler' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    if _WORKER and "torch" in sys.modules:  # the imports a worker starts with are done
        from cycler.protocol.progress import beacon

        beacon().note("imported")
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "EXIT_FAILURE",
    "EXIT_REQUEUE",
    "EXIT_SUCCESS",
    "EXIT_USAGE",
    "IS_TORCH_CYCLER",
    "Action",
    "AdvancedTooFarError",
    "AtomicDirectory",
    "AutoInterval",
    "Checkpoint",
    "CheckpointNotFound",
    "CheckpointState",
    "CheckpointWarning",
    "ConfigError",
    "ControlRequest",
    "CoordinationTimeout",
    "CorruptCheckpoint",
    "CyclerError",
    "DatasetNotFound",
    "DistributedShardedDataset",
    "EpochLoop",
    "InterruptableDistributedGroupedBatchSampler",
    "InterruptableDistributedSampler",
    "InterruptableSampler",
    "InterruptibleDistributedSampler",
    "InterruptibleSampler",
    "Manifest",
    "MetricsTracker",
    "RngRestoreWarning",
    "SaveHandle",
    "StateMismatch",
    "StepControl",
    "StepDecision",
    "TimestampedTimer",
    "__version__",
    "atomic_torch_save",
    "capture_rng_state",
    "current_epoch",
    "default_checkpoint_root",
    "find_checkpoint",
    "finished_epochs",
    "latest_checkpoint",
    "list_checkpoints",
    "read_manifest",
    "remaining_epochs_until",
    "restore_rng_state",
    "settle_ddp_buckets",
    "torch_distributed_readiness",
]
