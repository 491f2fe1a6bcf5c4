"""StepControl on 2 real gloo ranks: every rank takes the same decision at the same step.

Each rank has its own control file, as each node has its own supervisor; only rank 1's is
written, as when only one node got the signal. One spawn runs every scenario, to keep the test
to the cost of starting two processes once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_ranks import free_port

from cycler.protocol.control import Action, ControlRequest, write_control
from cycler.training.step_control import MAX_SYNC_EVERY, StepControl

WORLD_SIZE = 2
MAX_STEPS = 60

Checkpoints = list[list[object]]
"""One ``[step, stop, reason]`` per checkpoint decision."""


def run_loop(
    control: StepControl, steps: int, before_step: Callable[[int], None] = lambda step: None
) -> Checkpoints:
    """Train ``steps`` tiny steps (or until a stop); ``before_step(n)`` runs before step n."""
    weights = torch.randn(32, 32)
    checkpoints: Checkpoints = []
    with control:
        for step in range(1, steps + 1):
            before_step(step)
            torch.mm(weights, weights)
            decision = control.step()
            assert decision.step == step
            if decision.checkpoint:
                checkpoints.append([decision.step, decision.stop, decision.reason])
            if decision.stop:
                break
    return checkpoints


def request_on_rank_one(
    rank: int, control_file: Path, at_step: int, action: Action
) -> Callable[[int], None]:
    """A ``before_step`` that writes a request into rank 1's control file before ``at_step``."""

    def write(step: int) -> None:
        if rank == 1 and step == at_step:
            fields = ControlRequest(sequence=1, action=action, reason="SIGTERM", requested_at=0)
            write_control(control_file, fields)

    return write


def stop_scenario(rank: int, directory: Path, sync_every: int) -> Checkpoints:
    control_file = directory / f"stop-{sync_every}-rank{rank}.json"
    control = StepControl(
        control_file=control_file,
        sync_every=sync_every,
        poll_interval=0.0,
        ignore_requests_before=-1.0,
    )
    assert control.is_distributed
    write = request_on_rank_one(rank, control_file, 11, Action.CHECKPOINT_AND_EXIT)
    return run_loop(control, MAX_STEPS, write)


def adaptive_stop_scenario(rank: int, directory: Path) -> Checkpoints:
    control_file = directory / f"adaptive-rank{rank}.json"
    control = StepControl(control_file=control_file, poll_interval=0.0, ignore_requests_before=-1.0)
    write = request_on_rank_one(rank, control_file, 50, Action.CHECKPOINT_AND_EXIT)
    return run_loop(control, 50 + 4 * MAX_SYNC_EVERY, write)


def covered_request_scenario(rank: int, directory: Path) -> Checkpoints:
    control_file = directory / f"covered-rank{rank}.json"
    control = StepControl(
        control_file=control_file,
        sync_every=4,
        every_steps=6,
        poll_interval=0.0,
        ignore_requests_before=-1.0,
    )
    write = request_on_rank_one(rank, control_file, 4, Action.CHECKPOINT)
    return run_loop(control, 13, write)


def timer_scenario(rank: int) -> Checkpoints:
    """Rank 1's clock runs three times as fast as rank 0's."""
    now = [0.0]
    control = StepControl(control_file=None, every_seconds=10.0, sync_every=4, clock=lambda: now[0])

    def advance(step: int) -> None:
        now[0] = step * (3.0 if rank == 1 else 1.0)

    return run_loop(control, 26, advance)


def worker(rank: int, port: int, directory: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    torch.set_num_threads(1)
    try:
        results = {
            "stop_sync_4": stop_scenario(rank, Path(directory), 4),
            "stop_sync_1": stop_scenario(rank, Path(directory), 1),
            "adaptive": adaptive_stop_scenario(rank, Path(directory)),
            "covered": covered_request_scenario(rank, Path(directory)),
            "timer": timer_scenario(rank),
        }
        (Path(directory) / f"result-{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Checkpoints]]:
    directory = tmp_path_factory.mktemp("step_control")
    mp.spawn(worker, args=(free_port(), str(directory)), nprocs=WORLD_SIZE, join=True)
    return [
        json.loads((directory / f"result-{rank}.json").read_text()) for rank in range(WORLD_SIZE)
    ]


def test_stop_seen_by_one_rank_is_decided_by_both_at_the_same_step_within_two_exchanges(
    results: list[dict[str, Checkpoints]],
) -> None:
    # Written before step 11: seen at step 12 (the next multiple of 4), decided 4 steps later.
    assert results[0]["stop_sync_4"] == results[1]["stop_sync_4"] == [[16, True, "stop requested"]]


def test_with_an_exchange_every_step_the_stop_is_decided_one_step_after_it_is_seen(
    results: list[dict[str, Checkpoints]],
) -> None:
    assert results[0]["stop_sync_1"] == results[1]["stop_sync_1"] == [[12, True, "stop requested"]]


def test_with_the_adaptive_period_both_ranks_stop_at_the_same_step_within_two_periods(
    results: list[dict[str, Checkpoints]],
) -> None:
    [[step, stop, reason]] = results[0]["adaptive"]
    assert results[1]["adaptive"] == [[step, stop, reason]]
    assert stop and reason == "stop requested"
    assert 50 <= step <= 50 + 2 * MAX_SYNC_EVERY


def test_a_checkpoint_taken_while_a_request_was_in_flight_answers_it(
    results: list[dict[str, Checkpoints]],
) -> None:
    # Seen at step 4, due at step 8, but the every-6-steps checkpoint at step 6 came after it.
    expected = [[6, False, "every 6 steps"], [12, False, "every 6 steps"]]
    assert results[0]["covered"] == results[1]["covered"] == expected


def test_the_fastest_rank_clock_decides_every_seconds_for_both_ranks_at_the_same_steps(
    results: list[dict[str, Checkpoints]],
) -> None:
    # Rank 1 passes 10 s at step 4 (12 s) and again 4 steps after each checkpoint; rank 0 never.
    expected = [[step, False, "every 10 seconds"] for step in (8, 16, 24)]
    assert results[0]["timer"] == results[1]["timer"] == expected
