"""The public API is pinned: removing or renaming a name is a deliberate, visible change."""

from __future__ import annotations

import cycler

EXPECTED = {
    "EXIT_FAILURE", "EXIT_REQUEUE", "EXIT_SUCCESS", "EXIT_USAGE", "IS_TORCH_CYCLER", "Action",
    "AdvancedTooFarError",
    "AtomicDirectory", "AutoInterval", "Checkpoint", "CheckpointNotFound", "CheckpointState",
    "CheckpointWarning", "ConfigError", "ControlRequest", "CoordinationTimeout",
    "CorruptCheckpoint", "CyclerError", "DatasetNotFound", "DistributedShardedDataset",
    "EpochLoop", "InterruptableDistributedGroupedBatchSampler",
    "InterruptableDistributedSampler", "InterruptableSampler",
    "InterruptibleDistributedSampler", "InterruptibleSampler", "Manifest", "MetricsTracker",
    "RngRestoreWarning", "SaveHandle", "StateMismatch", "StepControl", "StepDecision",
    "TimestampedTimer",
    "__version__", "atomic_torch_save", "capture_rng_state", "current_epoch",
    "default_checkpoint_root", "find_checkpoint", "finished_epochs", "latest_checkpoint",
    "list_checkpoints", "read_manifest", "remaining_epochs_until", "restore_rng_state",
    "settle_ddp_buckets", "torch_distributed_readiness",
}


def test_all_lists_exactly_the_public_api() -> None:
    assert set(cycler.__all__) == EXPECTED


def test_every_public_name_resolves() -> None:
    for name in cycler.__all__:
        assert getattr(cycler, name) is not None


def test_exit_codes_are_the_documented_ones() -> None:
    assert (cycler.EXIT_SUCCESS, cycler.EXIT_FAILURE, cycler.EXIT_USAGE, cycler.EXIT_REQUEUE) == (
        0, 1, 2, 75)


def test_the_library_never_imports_the_cli_or_typer() -> None:
    import ast
    from pathlib import Path

    offenders = []
    for source in Path(cycler.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{source.name}: {n}" for n in names
                          if n.split(".")[0] in ("typer", "cycler_cli")]
    assert offenders == []


def test_a_cycling_utils_name_cycler_lacks_fails_in_one_line_naming_the_replacement() -> None:
    import pytest

    with pytest.raises(ImportError, match="sampler.advance"):
        from cycler import EpochHandler  # noqa: F401
