"""The collectives cycler runs on the GPU: StepControl's exchange on a CUDA side stream under
NCCL, metrics reduced on the current CUDA device, the readiness check's NCCL all-reduce, and a
mixed ``cpu:gloo,cuda:nccl`` group, where the same calls stay on the CPU.

NCCL groups have one rank per GPU (NCCL refuses two ranks on one device). With one GPU the
NCCL checks run on a one-rank group, which still takes every CUDA path (a one-rank exchange is
started the same way), and StepControl's agreement between ranks, which needs two, runs on 2
gloo ranks whose training tensors live on the GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from cuda_ranks import current_device, nccl_world, run_ranks

from cycler import MetricsTracker, StepControl
from cycler.protocol.control import Action, ControlRequest, write_control
from cycler.training.exchange import starter
from cycler.training.readiness import torch_distributed_readiness

pytestmark = pytest.mark.gpu

SPIN_CYCLES = 3_000_000_000
"""A kernel that spins this many GPU clock cycles (1.5-3 s at 1-2 GHz): work queued after an
exchange, which reading the exchange's result must not wait for."""


def check_the_exchange_comes_back_on_a_side_stream_before_work_queued_after_it(root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    result = starter(dist.group.WORLD)([rank, 100 - rank, 7], dist.group.WORLD)
    torch.cuda._sleep(SPIN_CYCLES)  # the next steps' work, queued behind the all-reduce
    started = time.monotonic()
    assert result(60.0) == [world - 1, 100, 7]
    waited = time.monotonic() - started
    assert not torch.cuda.current_stream().query(), (
        f"reading the exchange waited {waited:.2f} s, until the work queued after it was done")
    torch.cuda.synchronize()


def check_step_control_agrees_on_a_request_only_the_last_rank_read(root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    control_file = root / f"control-{rank}.json"
    control = StepControl(control_file=control_file, sync_every=4, poll_interval=0.0,
                          ignore_requests_before=-1.0)
    assert control.is_distributed
    weights = torch.randn(256, 256, device=current_device())
    decisions = []
    with control:
        for step in range(1, 41):
            if rank == world - 1 and step == 10:
                write_control(control_file, ControlRequest(
                    sequence=1, action=Action.CHECKPOINT_AND_EXIT, reason="SIGTERM",
                    requested_at=0))
            weights = torch.tanh(weights @ weights)
            decision = control.step()
            if decision.checkpoint or decision.stop:
                decisions.append((decision.step, decision.checkpoint, decision.stop))
            if decision.stop:
                break
    # One decision, a checkpoint and a stop at the same step on every rank, at most two
    # exchanges (8 steps) after the request.
    gathered: list[object] = [None] * world
    dist.all_gather_object(gathered, decisions)
    assert all(found == gathered[0] for found in gathered), gathered
    ((step, checkpoint, stop),) = decisions
    assert checkpoint and stop and 10 <= step <= 18, decisions


def check_metrics_reduce_on_the_current_device_exactly(root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    metrics = MetricsTracker().update(images=2**24 + 1, loss=0.5 * (rank + 1))
    if rank == 0:
        metrics.update(only_rank_0=3)
    metrics.reduce()
    assert dict(metrics.local) == {"images": world * (2**24 + 1),
                                   "loss": 0.25 * world * (world + 1), "only_rank_0": 3.0}


def check_the_readiness_check_all_reduces_in_the_group_it_finds(root: Path) -> None:
    torch_distributed_readiness()
    assert dist.is_initialized()  # a group the script made is left as it was


def check_the_readiness_check_joins_and_leaves_nccl_on_its_local_gpu(root: Path) -> None:
    assert not dist.is_initialized()
    torch_distributed_readiness()  # nccl, chosen because CUDA is there
    assert not dist.is_initialized()


def check_a_mixed_group_keeps_cycler_collectives_on_the_cpu_and_tensors_on_nccl(root: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    # The exchange's values and the metrics go through gloo: CPU tensors only.
    assert starter(group)([rank, 1], group)(60.0) == [world - 1, 1]
    metrics = MetricsTracker().update(steps=2).reduce()
    assert metrics.local["steps"] == 2.0 * world
    torch_distributed_readiness()
    on_gpu = torch.full((4,), float(rank + 1), device=current_device())
    dist.all_reduce(on_gpu)  # NCCL
    assert on_gpu.tolist() == [world * (world + 1) / 2] * 4


def check_gloo_ranks_sharing_one_gpu_agree_on_a_stop_and_reduce_cuda_metrics(root: Path) -> None:
    check_step_control_agrees_on_a_request_only_the_last_rank_read(root)
    metrics = MetricsTracker(device=current_device()).update(images=2**24 + 1).reduce()
    assert metrics.local["images"] == dist.get_world_size() * (2**24 + 1)


def test_the_exchange_metrics_and_readiness_run_on_the_gpu_under_nccl(
        accelerator, tmp_path: Path) -> None:
    accelerator.need_real_cuda("NCCL")
    checks = ["check_the_exchange_comes_back_on_a_side_stream_before_work_queued_after_it",
              "check_metrics_reduce_on_the_current_device_exactly",
              "check_the_readiness_check_all_reduces_in_the_group_it_finds"]
    if nccl_world() >= 2:
        checks.append("check_step_control_agrees_on_a_request_only_the_last_rank_read")
    run(checks, "nccl", nccl_world(), tmp_path)


def test_the_readiness_check_joins_nccl_on_each_ranks_own_gpu(
        accelerator, tmp_path: Path) -> None:
    accelerator.need_real_cuda("NCCL")
    run(["check_the_readiness_check_joins_and_leaves_nccl_on_its_local_gpu"], None, nccl_world(),
        tmp_path)


def test_a_mixed_cpu_gloo_cuda_nccl_group_runs_cyclers_collectives_on_gloo(
        accelerator, tmp_path: Path) -> None:
    accelerator.need_real_cuda("a cuda:nccl backend")
    run(["check_a_mixed_group_keeps_cycler_collectives_on_the_cpu_and_tensors_on_nccl"],
        "cpu:gloo,cuda:nccl", nccl_world(), tmp_path)


def test_two_gloo_ranks_on_one_gpu_agree_on_a_stop_and_reduce_metrics_on_the_device(
        accelerator, tmp_path: Path) -> None:
    if nccl_world() >= 2:
        pytest.skip("several GPUs: StepControl's agreement ran over NCCL already")
    run(["check_gloo_ranks_sharing_one_gpu_agree_on_a_stop_and_reduce_cuda_metrics"], "gloo", 2,
        tmp_path)


def run(checks: list[str], backend: str | None, world_size: int, root: Path) -> None:
    for name in checks:
        (root / name).mkdir()
    run_ranks(__name__, *checks, backend=backend, world_size=world_size, root=root)
