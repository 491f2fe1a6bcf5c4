"""The production step fingerprints with losses on a GPU (issue 35: "no per-step device sync"):
``FingerprintLog.record`` of a CUDA loss returns while the device is still busy, and every
step's record holds the loss's exact bits once the copies are done, on any device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cycler.protocol.fingerprints import VALUE, read_records
from cycler.training.fingerprints import RING_SLOTS, FingerprintLog, tensor_bits

pytestmark = pytest.mark.gpu

SLEEP_CYCLES = 50_000_000
"""A kernel that keeps the device busy for tens of milliseconds (torch.cuda._sleep)."""


def stored_values(path: Path) -> dict[int, tuple[int, int]]:
    return {record.step: (record.type, record.bits)
            for record in read_records(path)[0] if record.kind == VALUE}


def test_a_cuda_loss_is_recorded_without_waiting_for_the_device(
        accelerator, tmp_path: Path) -> None:
    accelerator.need_real_cuda("a CUDA stream the host can run ahead of")
    log = FingerprintLog(tmp_path / "rank-0.fp")
    weights = torch.randn(256, 256, device="cuda")
    expected = {}
    for step in range(1, 2 * RING_SLOTS + 3):
        torch.cuda._sleep(SLEEP_CYCLES)  # the device lags the host from here on
        loss = (weights @ weights).float().pow(2).mean() * step
        log.record(step, 0, loss)
        if step == 2:  # (the first step allocates the pinned ring)
            assert not torch.cuda.current_stream().query(), (
                "record() returned only once the device was idle: it synchronised")
        expected[step] = loss
    log.flush()
    stored = stored_values(tmp_path / "rank-0.fp")
    assert sorted(stored) == sorted(expected)
    for step, loss in expected.items():
        assert stored[step] == tensor_bits(loss.cpu()), f"step {step}'s bits differ"


def test_a_loss_on_another_device_than_the_current_one_is_recorded_exactly(
        accelerator, tmp_path: Path) -> None:
    accelerator.need_real_cuda("two CUDA devices")
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device: a loss on another device than the current one needs two")
    log = FingerprintLog(tmp_path / "rank-0.fp")
    expected = {}
    with torch.cuda.device(0):
        for step in range(1, 9):
            with torch.cuda.device(1):
                torch.cuda._sleep(SLEEP_CYCLES)
            loss = torch.randn(64, 64, device="cuda:1").pow(2).mean().to(torch.bfloat16)
            log.record(step, 0, loss)
            expected[step] = loss
    log.flush()
    stored = stored_values(tmp_path / "rank-0.fp")
    for step, loss in expected.items():
        assert stored[step] == tensor_bits(loss.cpu()), f"step {step}'s bits differ"
