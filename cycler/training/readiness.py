"""cycling_utils' start-up check that every rank can reach every other."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from cycler.errors import CyclerError
from cycler.protocol.progress import beacon


class DistributedNotReady(CyclerError, RuntimeError):
    """The ranks could not all-reduce a value, or got a wrong sum."""


def torch_distributed_readiness(backend: str | None = None) -> None:
    """Join the process group from torchrun's environment (unless already joined), all-reduce
    ``rank + 1`` over every rank, check the sum, and leave a group this call joined.

    ``backend`` defaults to nccl with CUDA, else gloo (cycling_utils' check needed CUDA). On
    nccl the value lives on the current CUDA device, or, when this call joins the group itself,
    on the node's ``$LOCAL_RANK``-th visible GPU (modulo their count: one GPU per task is
    ``cuda:0``). Raises :class:`DistributedNotReady` naming the sum it got and the one it
    expected.
    """
    joined = not dist.is_initialized()
    if joined:
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    try:
        nccl = dist.get_backend() == "nccl"
        device = _own_gpu(joined) if nccl else None
        value = torch.tensor([dist.get_rank() + 1], dtype=torch.int64, device=device)
        dist.all_reduce(value)
        world = dist.get_world_size()
        if int(value.item()) != world * (world + 1) // 2:
            raise DistributedNotReady(
                f"the readiness all-reduce over {world} ranks gave {int(value.item())}, not "
                f"{world * (world + 1) // 2}: a rank is misconfigured (check WORLD_SIZE and RANK)"
            )
        beacon().note("ready")
    finally:
        if joined:
            dist.destroy_process_group()


def _own_gpu(joined: bool) -> torch.device:
    # A script that joined set its device; joined here, nothing did, and every rank of a node
    # would use cuda:0, which NCCL refuses ("Duplicate GPU detected").
    if not joined:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
