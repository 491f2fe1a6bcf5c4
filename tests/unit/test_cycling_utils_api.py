"""Every public cycling_utils name and argument is accepted with its meaning (one process)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from cycler import (
    AdvancedTooFarError,
    AtomicDirectory,
    InterruptableDistributedGroupedBatchSampler,
    InterruptableSampler,
    StateMismatch,
    TimestampedTimer,
    torch_distributed_readiness,
)
from cycler.data.grouped_sampler import grouped_batches


def grouped(n: int, world: int, rank: int, batch_size: int = 4,
            **kwargs: object) -> InterruptableDistributedGroupedBatchSampler:
    dataset = TensorDataset(torch.arange(n))
    groups = [index % 3 for index in range(n)]
    return InterruptableDistributedGroupedBatchSampler(
        dataset, groups, batch_size, num_replicas=world, rank=rank, **kwargs)


def test_grouped_batches_hold_one_group_each_and_number_ceil_share_over_batch_size() -> None:
    sampler = grouped(50, 2, 1)
    with sampler.in_epoch(0):
        batches = list(sampler)
    assert len(batches) == len(sampler) == sampler.num_batches == math.ceil(25 / 4)
    assert all(len(batch) == 4 and len({i % 3 for i in batch}) == 1 for batch in batches)


def test_grouped_batches_use_each_of_the_ranks_samples_and_top_up_from_their_own_group() -> None:
    share = list(range(10))
    batches = grouped_batches(share, [0] * 7 + [1] * 3, 3)
    assert [sorted(set(b)) for b in batches[:2]] == [[0, 1, 2], [3, 4, 5]]
    assert len(batches) == 4
    assert Counter(i for b in batches for i in b).keys() == set(share)


def test_the_grouped_sampler_resumes_mid_epoch_with_the_batches_the_run_would_have_taken() -> None:
    running = grouped(60, 2, 0, seed=3)
    with running.in_epoch(2):
        expected = list(running)
        for _ in range(3):
            running.advance()
        state = running.state_dict()
    resumed = grouped(60, 2, 0, seed=3)
    resumed.load_state_dict(state)
    assert (resumed.epoch, resumed.progress, len(resumed)) == (2, 3, len(expected))
    assert list(resumed) == expected[3:]
    loader = DataLoader(TensorDataset(torch.arange(60)), batch_sampler=resumed)
    assert len(loader) == len(expected)


def test_the_grouped_sampler_refuses_a_changed_batch_size_and_advancing_past_the_epoch() -> None:
    with pytest.raises(StateMismatch, match="batch_size"):
        grouped(60, 2, 0, batch_size=5).load_state_dict(grouped(60, 2, 0).state_dict())
    sampler = grouped(8, 1, 0)
    with pytest.raises(AdvancedTooFarError):
        sampler.advance(3)


def test_the_grouped_sampler_loads_a_cycling_utils_state() -> None:
    sampler = grouped(60, 2, 1)
    sampler.load_state_dict({"epoch": 4, "progress": 2})
    assert (sampler.epoch, sampler.progress) == (4, 2)


def test_interruptable_sampler_takes_cycling_utils_positional_arguments() -> None:
    data = range(10)
    sampler = InterruptableSampler(data, None, None, False, 7, False)
    assert (sampler.shuffle, sampler.seed, len(sampler)) == (False, 7, 10)
    assert list(sampler) == list(range(10))
    sampler.advance(4)
    assert (len(sampler), sampler.remaining) == (10, 6)


def test_atomic_directory_accepts_device_and_mono_and_tests_its_directories(
        tmp_path: Path) -> None:
    saver = AtomicDirectory(tmp_path, is_master=True, strategy="mono", device="cuda")
    assert saver.name == "AtomicDirectory" and saver.device == "cuda"
    first = saver.prepare_checkpoint_directory()
    saver.symlink_latest(first)
    pinned = saver.prepare_checkpoint_directory(force_save=True)
    saver.symlink_latest(pinned)
    assert saver.is_checkpoint_directory(first) == "0"
    assert saver.is_checkpoint_directory(pinned) == "1_force"
    assert saver.is_checkpoint_directory(tmp_path / "AtomicDirectory_checkpoint_9") is None
    assert saver.is_checkpoint_directory(tmp_path / saver.symlink_name) is None


def test_an_unknown_strategy_is_a_value_error_naming_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mono"):
        AtomicDirectory(tmp_path, strategy="sometimes")


def test_timestamped_timer_keeps_start_time_and_running_like_cycling_utils() -> None:
    now = [100.0]
    timer = TimestampedTimer("go", clock=lambda: now[0], wall_clock=lambda: 1000 + now[0],
                             rank=1)
    now[0] = 102.5
    assert timer.report("step", ret=True) == 2.5
    assert (timer.running, timer.start_time) == (2.5, 1102.5)


def test_readiness_checks_a_one_process_group_and_leaves_it() -> None:
    import os

    import torch.distributed as dist

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731", "RANK": "0", "WORLD_SIZE": "1"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        torch_distributed_readiness("gloo")
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value
    assert not dist.is_initialized()
