"""AtomicDirectory.save/load (torch.distributed.checkpoint) of tensors that live on the GPU:
synchronous and asynchronous saves under an NCCL group commit and load back in place on the
device, a state changed right after an asynchronous save returns does not leak into it, and the
asynchronous save's stall is measured against DCP's own stager in the same process.

The stall is what training waits for: cycler's ``save(..., asynchronous=True)`` returns once the
state is copied off the GPU into reused staging memory (plain host memory: cycler's stager does
not pin). DCP's ``async_save`` with its default ``DefaultStager`` (pinned and shared memory, the
copy on a side stream in a thread) returns at once, but the state may be changed only once its
staging completes: that wait is the stall compared. A third figure, DCP's stager with pinned
memory and a blocking copy, says what pinning alone would give cycler's stager.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from cuda_ranks import current_device, nccl_world, need_async_saves, run_ranks

from cycler import AtomicDirectory, read_manifest

pytestmark = pytest.mark.gpu

STALL_MB = int(os.environ.get("CYCLER_GPU_STALL_MB", "512"))
"""Size of the state whose asynchronous save's stall is measured."""
SAVES = 4
"""Saves per way of saving; the first one (staging memory allocated) is left out."""


def state_on(device: torch.device, seed: int, megabytes: float = 8) -> dict[str, object]:
    """Ten tensors of ``megabytes`` in all, the same on every rank (replicated), and a step."""
    generator = torch.Generator().manual_seed(seed)
    numel = int(megabytes * 2**20 / 4 / 10)
    return {"weights": {f"layer{i}": torch.randn(numel, generator=generator).to(device)
                        for i in range(10)}, "step": seed}


def check_sync_and_async_saves_of_gpu_tensors_commit_and_load_back_on_the_gpu(
        root: Path) -> None:
    device = current_device()
    saver = AtomicDirectory(root / "ck", keep_last=2)
    saver.save(state_on(device, 1), metadata={"step": 1})
    state = state_on(device, 2)
    expected = {name: tensor.clone() for name, tensor in state["weights"].items()}
    handle = saver.save(state, metadata={"step": 2}, asynchronous=True)
    for tensor in state["weights"].values():
        tensor.add_(1.0)  # training goes on: the save holds the snapshot, not this
    handle.wait()
    manifest = read_manifest(Path(handle.directory))
    assert ".metadata" in manifest.files and manifest.world_size == dist.get_world_size()
    target = state_on(device, 3)
    assert saver.load(target) == {"step": 2}
    assert target["step"] == 2
    for name, tensor in target["weights"].items():
        assert tensor.device == device, f"{name} was loaded to {tensor.device}"
        assert torch.equal(tensor, expected[name]), f"{name} is not what was saved"
    assert saver.load(target, checkpoint=0) == {"step": 1}  # the synchronous one
    assert torch.equal(target["weights"]["layer0"], state_on(device, 1)["weights"]["layer0"])


def test_sync_and_async_saves_of_gpu_tensors_under_nccl_commit_and_load_back(
        accelerator, tmp_path: Path) -> None:
    need_async_saves()
    name = "check_sync_and_async_saves_of_gpu_tensors_commit_and_load_back_on_the_gpu"
    (tmp_path / name).mkdir()
    backend, world = ("nccl", nccl_world()) if accelerator.real else ("gloo", 2)
    run_ranks(__name__, name, backend=backend, world_size=world, root=tmp_path)


def cycler_stall(root: Path, state: dict[str, object]) -> Callable[[int], float]:
    saver = AtomicDirectory(root, keep_last=1)

    def measure(number: int) -> float:
        synchronize()
        started = time.perf_counter()
        handle = saver.save(state, metadata={"step": number}, asynchronous=True)
        stall = time.perf_counter() - started
        handle.wait()
        saver.wait()  # retention too: the next save must not wait for this one's removals
        return stall

    return measure


def dcp_stall(root: Path, state: dict[str, object], stager: object,
              waits: dict[str, list[float]]) -> Callable[[int], float]:
    """DCP's ``async_save`` with ``stager``: the time until the state may change (returned);
    the time ``async_save`` itself took goes to ``waits["returned"]``."""
    import torch.distributed.checkpoint as dcp

    def measure(number: int) -> float:
        synchronize()
        started = time.perf_counter()
        response = dcp.async_save(state, checkpoint_id=str(root / f"{number}"),
                                  async_stager=stager, no_dist=True)
        returned = time.perf_counter() - started
        staged = getattr(response, "staging_completion", None)
        if staged is not None:
            staged.result()
        free = time.perf_counter() - started
        getattr(response, "upload_completion", response).result()
        shutil.rmtree(root / f"{number}")
        waits.setdefault("returned", []).append(returned)
        return free

    return measure


def synchronize() -> None:
    """The GPU idle before a save: the stall measured is the save's alone."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def staging_options(pinned: bool, real: bool) -> object:
    from torch.distributed.checkpoint.staging import StagingOptions

    if pinned:
        return StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                              use_async_staging=False, use_non_blocking_copy=False)
    if real:
        return StagingOptions()  # DCP's defaults
    # A CPU rehearsal: DCP's non-blocking copy needs an accelerator.
    return StagingOptions(use_non_blocking_copy=False)


def test_an_async_saves_stall_is_measured_against_dcps_own_stager(
        accelerator, tmp_path: Path, figures: dict[str, object]) -> None:
    need_async_saves()
    from torch.distributed.checkpoint import staging

    state = state_on(torch.device(accelerator.device), 4, megabytes=STALL_MB)
    waits: dict[str, list[float]] = {}
    stagers = {"dcp_default_stager_stall_s": staging.DefaultStager(
        staging_options(pinned=False, real=accelerator.real))}
    if accelerator.real:
        stagers["dcp_pinned_blocking_stall_s"] = staging.DefaultStager(
            staging_options(pinned=True, real=True))
    measures = {"cycler_stall_s": cycler_stall(tmp_path / "cycler", state)}
    for name, stager in stagers.items():
        measures[name] = dcp_stall(tmp_path / name, state, stager,
                                   waits if name.startswith("dcp_default") else {})
    stalls = interleaved_medians(measures)
    for stager in stagers.values():
        stager.close()
    ours, theirs = stalls["cycler_stall_s"], stalls["dcp_default_stager_stall_s"]
    figures.update({name: round(value, 4) for name, value in stalls.items()})
    figures.update(state_mb=STALL_MB, saves=SAVES - 1, stall_ratio=round(ours / theirs, 2),
                   dcp_default_stager_returned_s=round(statistics.median(waits["returned"][1:]), 4))
    assert ours > 0 and theirs > 0


def interleaved_medians(measures: dict[str, Callable[[int], float]]) -> dict[str, float]:
    """Each way's median of ``SAVES`` saves but the first (staging memory is allocated then),
    the ways taking turns so that the disk's and the machine's drift spread over all."""
    values: dict[str, list[float]] = {name: [] for name in measures}
    for number in range(SAVES):
        for name, measure in measures.items():
            values[name].append(measure(number))
    return {name: statistics.median(found[1:]) for name, found in values.items()}
