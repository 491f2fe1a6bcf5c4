"""The memory tier with tensors on the GPU, on two nodes laid out as torchrun lays them out (one
rank each, each node its own memory root): DCP saves, synchronous and asynchronous, commit in
memory and are copied to the partner node; the node that held DCP's ``.metadata`` and the shared
tensor loses its memory, and every rank resumes onto its GPU from the partner's copy.

With one GPU the two nodes are 2 gloo ranks sharing it (NCCL refuses two ranks on one device);
with several, NCCL ranks, one per GPU, and the tier's own gloo group beside them.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from cuda_ranks import current_device, nccl_world, need_async_saves, run_ranks

from cycler import AtomicDirectory, CheckpointWarning
from cycler.checkpoint.memory_roots import memory_root
from cycler.protocol.environment import ENV_MEMORY_TIER, ENV_PERSIST_EVERY

pytestmark = pytest.mark.gpu


def gpu_state(step: int) -> dict[str, torch.Tensor]:
    rank, device = dist.get_rank(), current_device()
    return {"shared": (torch.arange(50_000.0) * step).to(device),  # rank 0 writes it
            f"own-{rank}": torch.full((1000,), float(step * 10 + rank), device=device)}


def check_gpu_tensors_resume_from_the_partners_copy_on_a_node_whose_memory_was_wiped(
        root: Path) -> None:
    rank = dist.get_rank()
    durable = root / "checkpoints"
    memory = memory_root(root / f"memory-node{rank}", durable)  # as cycle run hands it over
    os.environ.update({ENV_MEMORY_TIER: str(memory), ENV_PERSIST_EVERY: "100"})
    saver = AtomicDirectory(durable, keep_last=2)
    saver.save(gpu_state(0), {"step": 0})
    saver.save(gpu_state(1), {"step": 1}, asynchronous=True).wait()
    saved = gpu_state(2)
    handle = saver.save(saved, {"step": 2}, asynchronous=True)
    for tensor in saved.values():
        tensor.add_(1.0)  # after the snapshot: not in the checkpoint
    handle.wait()
    assert Path(handle.directory).parent == memory, handle.directory  # committed in memory
    probe = {key: torch.zeros_like(value) for key, value in saved.items()}
    assert saver.load(probe) == {"step": 2}  # waits for the partner copies too
    del saver
    dist.barrier()
    if rank == 0:  # node 0 held DCP's .metadata and the shared tensor: all gone
        shutil.rmtree(memory)
    dist.barrier()
    state = {key: torch.zeros_like(value) for key, value in saved.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", CheckpointWarning)  # no fall-back to the older disk copy
        assert AtomicDirectory(durable, keep_last=2).load(state) == {"step": 2}
    expected = gpu_state(2)
    for key, tensor in state.items():
        assert tensor.device == current_device(), f"{key} was loaded to {tensor.device}"
        assert torch.equal(tensor, expected[key]), f"{key} is not what was saved at step 2"
    dist.barrier()


def test_gpu_tensors_in_the_memory_tier_resume_from_the_partners_copy(
        accelerator, tmp_path: Path) -> None:
    need_async_saves()
    name = "check_gpu_tensors_resume_from_the_partners_copy_on_a_node_whose_memory_was_wiped"
    (tmp_path / name).mkdir()
    backend, world = ("nccl", nccl_world()) if nccl_world() >= 2 else ("gloo", 2)
    run_ranks(__name__, name, backend=backend, world_size=world, root=tmp_path, per_node=1)
