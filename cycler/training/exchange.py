"""StepControl's exchange between ranks: a non-blocking ``all_reduce(MAX)`` of a few integers,
read later with a bounded wait, and a clear error naming the rank that never came.

A rank that stops calling ``StepControl.step()`` (its data ran out first, or it left the loop on
its own condition) leaves the others waiting in the exchange's all-reduce until the process
group's timeout (10 to 30 minutes) ends them with an error that names no rank and no step. Here
the wait is bounded (``timeout``); when it runs out, each waiting rank leaves a key in the
process group's store and, for a few seconds, looks for the others' keys: every rank that is
also stuck in the same exchange leaves one too, so the ranks with no key are the missing ones.
Nothing touches the store while exchanges complete, so the cost per step stays that of the
all-reduce.
"""

from __future__ import annotations

import collections
import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cycler.errors import CoordinationTimeout

DIAGNOSIS_SECONDS = 5.0
"""How long a rank whose exchange timed out waits for the others stuck in it to say so."""
_PREFIX = "cycler/step-control"

Result = Callable[[float], list[int]]
"""Waits at most the given seconds for the exchange's values; raises TimeoutError after."""
Start = Callable[[list[int], Any], Result]
"""Starts a non-blocking ``all_reduce(MAX)`` of the values over a group; returns the waiter."""


@dataclass(frozen=True)
class Exchange:
    """The ``number``-th exchange in flight (the same number on every rank), started at global
    step ``started_at``; ``result`` waits for it."""

    number: int
    started_at: int
    result: Result


def starter(group: Any) -> Start:
    # A mixed backend ("cpu:gloo,cuda:nccl") reduces CPU tensors on gloo, which never touches the
    # GPU; only a pure NCCL group needs the values on the device.
    return _start_on_cuda if str(dist.get_backend(group)).lower() == "nccl" else _start_on_cpu


def _start_on_cpu(values: list[int], group: Any) -> Result:
    flags = torch.tensor(values, dtype=torch.int32)
    work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group, async_op=True)

    def result(timeout: float) -> list[int]:
        try:
            work.wait(datetime.timedelta(seconds=timeout))
        except RuntimeError as error:
            # gloo says "Timed out waiting ..." in a RuntimeError; anything else (a peer that
            # died: "Connection closed by peer") is torch's own error, and a worker failure.
            if "timed out" not in str(error).lower():
                raise
            raise TimeoutError(str(error)) from None
        return list(flags.tolist())

    return result


def _start_on_cuda(values: list[int], group: Any) -> Result:
    # Every copy is non-blocking and the result comes back on a side stream, so the host waits
    # only for the collective (queued behind step s), never for the steps queued after it.
    device = torch.device("cuda", torch.cuda.current_device())
    flags = torch.tensor(values, dtype=torch.int32).pin_memory().to(device, non_blocking=True)
    work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group, async_op=True)
    host = torch.empty(len(values), dtype=torch.int32, pin_memory=True)
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        work.wait()
        host.copy_(flags, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(side)
    flags.record_stream(side)

    def result(timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while not copied.query():  # event.synchronize() has no timeout
            if time.monotonic() > deadline:
                raise TimeoutError(f"the all-reduce did not complete in {timeout:g} s")
            time.sleep(0.001)
        return list(host.tolist())

    return result


_RECENT: collections.deque[Exchange] = collections.deque(maxlen=64)
"""The exchanges waited for last, each kept alive long after it is done: its tensor is a Python
object, and gloo's worker thread drops its own reference to a finished work a moment after
``wait()`` returns. Were that the last reference while the process ends (a script that ends
right after ``StepControl.close()``: rank 1's last act), the thread would need the GIL during
interpreter finalization and libstdc++ would abort the process ("terminate called without an
active exception", exit -6, after all work was done: 10 of 30 two-rank runs; on two hosts the
restart it caused could never complete). Kept here, the last 64 are released by the main
thread; keeping only the very last one still aborted 1 run in 48 (the one before it, dropped a
step earlier, had not been released by gloo yet)."""


def wait_or_name_the_missing(exchange: Exchange, step: int, timeout: float,
                             group: Any) -> list[int]:
    """The exchange's values; :class:`CoordinationTimeout` naming the ranks that never reached
    it when ``timeout`` seconds pass first."""
    try:
        values = exchange.result(timeout)
    except TimeoutError:
        pass
    else:
        _RECENT.append(exchange)
        return values
    missing, closed = _missing_ranks(exchange.number, step, group)
    raise CoordinationTimeout(_missing_message(missing, closed, exchange, step, timeout))


def record_close(step: int, group: Any) -> None:
    """Tell ranks that may wait in a later exchange that this one left at ``step``."""
    store = _store()
    if store is not None:
        store.set(f"{_PREFIX}/closed/{dist.get_rank(group)}", str(step))


def _missing_ranks(number: int, step: int, group: Any) -> tuple[list[int], dict[int, str]]:
    store = _store()
    ranks = dist.get_process_group_ranks(group)
    if store is None:
        return [rank for rank in ranks if rank != dist.get_rank()], {}
    round_key = f"{_PREFIX}/exchange/{number}"
    store.set(f"{round_key}/{dist.get_rank()}", str(step))
    keys = {rank: f"{round_key}/{rank}" for rank in ranks}
    deadline = time.monotonic() + DIAGNOSIS_SECONDS
    while True:
        missing = [rank for rank, key in keys.items() if not store.check([key])]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    closed = {rank: store.get(f"{_PREFIX}/closed/{rank}").decode() for rank in missing
              if store.check([f"{_PREFIX}/closed/{rank}"])}
    return missing, closed


def _missing_message(missing: list[int], closed: dict[int, str], exchange: Exchange, step: int,
                     timeout: float) -> str:
    names = ", ".join(str(rank) for rank in missing) or "none found"
    left = "".join(f"; rank {rank} closed its StepControl at step {at}"
                   for rank, at in closed.items())
    return (f"rank {dist.get_rank()} waited {timeout:g} s at step {step} for StepControl's "
            f"exchange {exchange.number} (started at step {exchange.started_at}); missing: rank "
            f"{names}{left}. Every rank must call step() once per step: give every rank the "
            "same number of batches (drop_last=True, or stop all ranks together)")


def _store() -> Any:
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except (RuntimeError, ValueError):
        return None
