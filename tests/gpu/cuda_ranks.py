"""Run test functions on every rank of a fresh process group on the GPUs (or on the CPU in a
rehearsal): rank r uses ``cuda:r mod gpus``, set as its current device before the group starts,
as torchrun scripts do with ``LOCAL_RANK``.

NCCL refuses two ranks on one device ("Duplicate GPU detected", ``ncclInvalidUsage``), so NCCL
groups have as many ranks as the machine has GPUs; :func:`nccl_world` says how many.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import free_port


def nccl_world() -> int:
    """Ranks an NCCL group can have on this machine: one per GPU."""
    return torch.cuda.device_count()


def run_ranks(module: str, *check_names: str, backend: str | None, world_size: int,
              root: Path | None = None, per_node: int | None = None) -> None:
    """Call ``module.<name>(root / name)`` (or ``<name>()`` without ``root``) for each name on
    every rank of a fresh ``backend`` group; any rank's failure fails the caller.

    ``backend=None``: no group and no current device set; the checks start from torchrun's
    environment alone (``MASTER_ADDR``, ``RANK``...), as a script's first lines do.

    With ``per_node``, the ranks see the environment torchrun gives ``world_size // per_node``
    nodes (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``).
    """
    mp.spawn(_rank_main, args=(module, check_names, backend, world_size, free_port(), root,
                               per_node), nprocs=world_size, join=True)


def _rank_main(rank: int, module: str, check_names: tuple[str, ...], backend: str,
               world_size: int, port: int, root: Path | None, per_node: int | None) -> None:
    local = rank if per_node is None else rank % per_node
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(local),
                      LOCAL_WORLD_SIZE=str(per_node or world_size),
                      GROUP_RANK=str(0 if per_node is None else rank // per_node),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend is not None:
        if torch.cuda.is_available():
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
    checks = importlib.import_module(module)
    try:
        for name in check_names:
            if root is None:
                getattr(checks, name)()
            else:
                getattr(checks, name)(root / name)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # As gloo_ranks: end here, not in the interpreter's finalization, once every check passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def need_async_saves() -> None:
    """Skip the calling test where asynchronous saves cannot run (torch before 2.9)."""
    import pytest
    from torch.distributed.checkpoint import staging

    if not hasattr(staging, "DefaultStager"):
        pytest.skip(f"asynchronous saves need torch 2.9 or newer (DCP's DefaultStager); this is "
                    f"torch {torch.__version__}")


def current_device() -> torch.device:
    """This rank's device: its current CUDA device, or the CPU in a rehearsal."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def write_figures(directory: Path, name: str, values: dict[str, object]) -> None:
    """Figures measured inside a rank, for the test (in the parent) to read back."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(values))


def read_figures(directory: Path, name: str) -> dict[str, object]:
    loaded = json.loads((directory / f"{name}.json").read_text())
    assert isinstance(loaded, dict)
    return loaded
