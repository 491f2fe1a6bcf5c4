from __future__ import annotations

import io
import random
from collections.abc import Sequence

import numpy
import pytest
import torch

from cycler.errors import StateMismatch
from cycler.training.rng import RngRestoreWarning, capture_rng_state, restore_rng_state


class FakeCuda:
    """Stand-in CUDA generators: a list of byte tensors, one per device."""

    def __init__(self, devices: int) -> None:
        self.states = [torch.tensor([device, 7], dtype=torch.uint8) for device in range(devices)]

    def device_count(self) -> int:
        return len(self.states)

    def get_states(self) -> list[torch.Tensor]:
        return [state.clone() for state in self.states]

    def set_states(self, states: Sequence[torch.Tensor]) -> None:
        for device, state in enumerate(states):
            self.states[device] = state.clone()


def _draws() -> tuple[list[float], list[float], list[float]]:
    return (
        [random.random() for _ in range(5)],
        numpy.random.standard_normal(5).tolist(),
        torch.randn(5).tolist(),
    )


def _through_weights_only_load(state: dict[str, object]) -> dict[str, object]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, object] = torch.load(buffer, weights_only=True)
    return loaded


def test_restore_after_consuming_gives_the_same_python_numpy_and_torch_streams() -> None:
    cuda = FakeCuda(0)
    numpy.random.standard_normal()  # leaves a cached gaussian, which must be restored too
    state = capture_rng_state(cuda=cuda)
    expected = _draws()
    _draws()
    restore_rng_state(state, cuda=cuda)
    assert _draws() == expected


def test_the_state_survives_torch_load_with_weights_only() -> None:
    cuda = FakeCuda(2)
    state = _through_weights_only_load(capture_rng_state(cuda=cuda))
    expected = _draws()
    restore_rng_state(state, cuda=cuda)
    assert _draws() == expected


def test_every_cuda_device_state_is_captured_and_restored() -> None:
    cuda = FakeCuda(2)
    state = capture_rng_state(cuda=cuda)
    cuda.states = [torch.tensor([9, 9], dtype=torch.uint8)] * 2
    restore_rng_state(state, cuda=cuda)
    assert [s.tolist() for s in cuda.states] == [[0, 7], [1, 7]]


def test_restoring_cuda_state_without_cuda_warns_naming_cuda_and_restores_the_rest() -> None:
    state = capture_rng_state(cuda=FakeCuda(2))
    expected = _draws()
    with pytest.warns(RngRestoreWarning, match="CUDA.*not available"):
        restore_rng_state(state, cuda=FakeCuda(0))
    assert _draws() == expected


def test_restoring_onto_fewer_cuda_devices_warns_and_restores_the_ones_present() -> None:
    state = capture_rng_state(cuda=FakeCuda(2))
    target = FakeCuda(1)
    target.states = [torch.tensor([5, 5], dtype=torch.uint8)]
    with pytest.warns(RngRestoreWarning, match="2 device.*sees 1"):
        restore_rng_state(state, cuda=target)
    assert target.states[0].tolist() == [0, 7]


def test_restoring_a_cpu_state_on_a_cuda_machine_warns_that_cuda_was_not_restored() -> None:
    state = capture_rng_state(cuda=FakeCuda(0))
    with pytest.warns(RngRestoreWarning, match="saved without CUDA"):
        restore_rng_state(state, cuda=FakeCuda(1))


def test_a_state_saved_without_numpy_warns_that_numpy_was_not_restored() -> None:
    state = capture_rng_state(cuda=FakeCuda(0))
    state["numpy"] = None
    with pytest.warns(RngRestoreWarning, match="numpy"):
        restore_rng_state(state, cuda=FakeCuda(0))


def test_a_matching_restore_emits_no_warning() -> None:
    import warnings

    state = capture_rng_state(cuda=FakeCuda(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restore_rng_state(state, cuda=FakeCuda(1))


@pytest.mark.parametrize(
    "state",
    [{}, {"version": 2, "python": None, "torch": None}, {"version": 1, "torch": None}],
)
def test_a_state_not_made_by_capture_raises_state_mismatch(state: dict[str, object]) -> None:
    with pytest.raises(StateMismatch):
        restore_rng_state(state, cuda=FakeCuda(0))
