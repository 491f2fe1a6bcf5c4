"""cycler: make PyTorch training survive preemption.

This module only wires the public API together; see README.md for how to use it.
"""

from __future__ import annotations

__version__ = "0.1.0"
IS_TORCH_CYCLER = True
"""Marker that tells torch-cycler apart from matplotlib's ``cycler`` package of the same name."""

from cycler.atomic_directory import AtomicDirectory  # noqa: E402
from cycler.checkpoints import (  # noqa: E402
    Checkpoint,
    CheckpointState,
    CheckpointWarning,
    find_checkpoint,
    latest_checkpoint,
    list_checkpoints,
)
from cycler.control import Action, ControlRequest  # noqa: E402
from cycler.datasets import DistributedShardedDataset  # noqa: E402
from cycler.environment import default_checkpoint_root  # noqa: E402
from cycler.epochs import (  # noqa: E402
    EpochLoop,
    current_epoch,
    finished_epochs,
    remaining_epochs_until,
)
from cycler.errors import (  # noqa: E402
    CheckpointNotFound,
    ConfigError,
    CoordinationTimeout,
    CorruptCheckpoint,
    CyclerError,
    DatasetNotFound,
    StateMismatch,
)
from cycler.exit_codes import EXIT_FAILURE, EXIT_REQUEUE, EXIT_SUCCESS, EXIT_USAGE  # noqa: E402
from cycler.manifest import Manifest, read_manifest  # noqa: E402
from cycler.metrics import MetricsTracker, TimestampedTimer  # noqa: E402
from cycler.rng import RngRestoreWarning, capture_rng_state, restore_rng_state  # noqa: E402
from cycler.samplers import (  # noqa: E402
    AdvancedTooFarError,
    InterruptableDistributedSampler,
    InterruptableSampler,
    InterruptibleDistributedSampler,
    InterruptibleSampler,
)
from cycler.saving import atomic_torch_save  # noqa: E402
from cycler.step_control import StepControl, StepDecision  # noqa: E402

__all__ = [
    "EXIT_FAILURE",
    "EXIT_REQUEUE",
    "EXIT_SUCCESS",
    "EXIT_USAGE",
    "IS_TORCH_CYCLER",
    "Action",
    "AdvancedTooFarError",
    "AtomicDirectory",
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
    "InterruptableDistributedSampler",
    "InterruptableSampler",
    "InterruptibleDistributedSampler",
    "InterruptibleSampler",
    "Manifest",
    "MetricsTracker",
    "RngRestoreWarning",
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
]
