"""Run test functions in real gloo process groups (2 ranks on 127.0.0.1 unless told otherwise)."""

from __future__ import annotations

import gc
import importlib
import os
import socket
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def no_thread_ending() -> None:
    """Before forking DataLoader workers: let an abandoned iterator's threads end first.

    CPython 3.11 deadlocks a child forked while another thread of the parent is ending
    (``PyOS_AfterFork_Child`` waits forever for the thread-state lock the ending thread held).
    A loader abandoned mid-epoch ends its queues' feeder threads in the background, so the next
    loader's fork could hang the test forever (seen once in the README suite).
    """
    gc.collect()  # an abandoned iterator shuts its workers and queues down now
    deadline = time.monotonic() + 10
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.01)


def run_on_every_rank(module: str, *check_names: str, root: Path | None = None,
                      world_size: int = 2, per_node: int | None = None) -> None:
    """Call ``module.<name>()`` for each name on every rank of a fresh gloo group.

    With ``root``, each check gets its own ``root / name`` and the ranks meet at a barrier
    after it. With ``per_node``, the ranks see the environment torchrun gives ``world_size //
    per_node`` nodes of ``per_node`` ranks (``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``...).
    Any rank's failure fails the caller (``mp.spawn`` re-raises it).
    """
    mp.spawn(_rank_main, args=(module, check_names, root, world_size, free_port(), per_node),
             nprocs=world_size, join=True)


def _rank_main(rank: int, module: str, check_names: tuple[str, ...], root: Path | None,
               world_size: int, port: int, per_node: int | None = None) -> None:
    if per_node is not None:
        os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank),
                          LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node),
                          GROUP_RANK=str(rank // per_node))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    checks = importlib.import_module(module)
    try:
        for name in check_names:
            if root is None:
                getattr(checks, name)()
            else:
                getattr(checks, name)(root / name)
                dist.barrier()
    finally:
        dist.destroy_process_group()
    # Every check passed. End here rather than in the interpreter's finalization: FSDP2's
    # device mesh keeps the gloo group alive past destroy_process_group, and its worker thread
    # can drop a finished barrier's tensors while the interpreter finalizes, which aborts the
    # process (std::terminate, SIGABRT) after all checks passed (seen in CI, about 1 run in 10).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
