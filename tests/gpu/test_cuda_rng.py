"""capture_rng_state and restore_rng_state with the real CUDA generators: every device's stream
continues exactly where it was captured, each its own, after a save and load through a file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cycler import capture_rng_state, restore_rng_state

pytestmark = pytest.mark.gpu


def draws() -> list[torch.Tensor]:
    """The next values of every device's generator, and of the CPU's, on the host."""
    devices = [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
    return [torch.rand(1000, device=device).cpu() for device in devices] + [torch.rand(10)]


def test_every_devices_cuda_stream_resumes_where_it_was_captured(
        accelerator, tmp_path: Path) -> None:
    accelerator.need_real_cuda("per-device CUDA generators")
    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            torch.cuda.manual_seed(1000 + index)  # the current device only: each its own stream
    draws()
    torch.save(capture_rng_state(), tmp_path / "rng.pt")
    expected = draws()
    draws()  # the streams move on, as training does after a checkpoint
    restore_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = draws()
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(want, have), f"stream {index} did not resume where it was captured"
    if torch.cuda.device_count() > 1:
        assert not torch.equal(got[0], got[1]), "two devices' streams were restored alike"
