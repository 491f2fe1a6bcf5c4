"""Capture and restore every random stream a training process draws from.

A resumed run continues the same random streams as the run that saved the checkpoint: Python's
``random``, numpy's global generator, torch's CPU generator and every CUDA device's generator.
Each rank captures and restores its own streams, so save one state per rank.

The captured state holds only tensors, lists, tuples, ints, floats, strings and ``None``, so it can
be written with ``torch.save`` and read back with ``torch.load(weights_only=True)``.

A stream that cannot be restored (CUDA state saved but no CUDA now, a different device count,
numpy state but no numpy) is reported with :class:`RngRestoreWarning`, never skipped silently.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch

from cycler.errors import StateMismatch

RNG_STATE_VERSION = 1


class RngRestoreWarning(RuntimeWarning):
    """Some random stream was not restored; the message names which and why."""


class CudaGenerators(Protocol):
    """The CUDA generators of this process: torch.cuda in real runs, a stand-in in tests."""

    def device_count(self) -> int:
        """How many CUDA devices this process sees (0 without CUDA)."""
        ...

    def get_states(self) -> list[torch.Tensor]:
        """One generator state per device, in device order."""
        ...

    def set_states(self, states: Sequence[torch.Tensor]) -> None:
        """Set the generators of devices ``0 .. len(states) - 1``."""
        ...


class TorchCuda:
    """The real CUDA generators, through ``torch.cuda``."""

    def device_count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def get_states(self) -> list[torch.Tensor]:
        return list(torch.cuda.get_rng_state_all())

    def set_states(self, states: Sequence[torch.Tensor]) -> None:
        for device, state in enumerate(states):
            torch.cuda.set_rng_state(state, device)


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def capture_rng_state(*, cuda: CudaGenerators | None = None) -> dict[str, Any]:
    """Snapshot this process's random streams as a versioned dict (see the module docstring).

    ``numpy`` is ``None`` when numpy is not installed; ``cuda`` is an empty list without CUDA.
    """
    cuda = cuda if cuda is not None else TorchCuda()
    return {
        "version": RNG_STATE_VERSION,
        "python": random.getstate(),
        "numpy": _capture_numpy(),
        "torch": torch.get_rng_state(),
        "cuda": cuda.get_states() if cuda.device_count() > 0 else [],
    }


def _capture_numpy() -> dict[str, Any] | None:
    numpy = _numpy()
    if numpy is None:
        return None
    # weights_only loading refuses numpy arrays, so the key travels as a list of ints.
    name, key, pos, has_gauss, cached_gaussian = numpy.random.get_state(legacy=True)
    return {
        "bit_generator": str(name),
        "key": [int(word) for word in key],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def restore_rng_state(state: Mapping[str, Any], *, cuda: CudaGenerators | None = None) -> None:
    """Put back the streams of a :func:`capture_rng_state` dict.

    Raises :class:`StateMismatch` if ``state`` is not such a dict. Streams that cannot be
    restored here are named in a :class:`RngRestoreWarning`; the others are still restored.
    """
    _check_version(state)
    random.setstate(_as_python_state(state["python"]))
    torch.set_rng_state(state["torch"])
    _restore_numpy(state.get("numpy"))
    _restore_cuda(list(state.get("cuda") or []), cuda if cuda is not None else TorchCuda())


def _check_version(state: Mapping[str, Any]) -> None:
    version = state.get("version") if isinstance(state, Mapping) else None
    if version != RNG_STATE_VERSION:
        raise StateMismatch(
            f"RNG state has version {version!r}, but this cycler reads version "
            f"{RNG_STATE_VERSION}: pass the dict that capture_rng_state() returned."
        )
    missing = [key for key in ("python", "torch") if key not in state]
    if missing:
        raise StateMismatch(f"RNG state lacks {', '.join(missing)}: it was not made by cycler.")


def _as_python_state(saved: Sequence[Any]) -> tuple[Any, ...]:
    # random.setstate wants tuples; a state that went through JSON or YAML comes back as lists.
    version, internal, gauss_next = saved
    return (version, tuple(internal), gauss_next)


def _restore_numpy(saved: Mapping[str, Any] | None) -> None:
    numpy = _numpy()
    if saved is None:
        if numpy is not None:
            _warn("numpy's global generator was not restored: the state was saved without numpy.")
        return
    if numpy is None:
        _warn("numpy's global generator was saved but numpy is not installed: not restored.")
        return
    key = numpy.array(saved["key"], dtype=numpy.uint32)
    numpy.random.set_state(
        (saved["bit_generator"], key, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
    )


def _restore_cuda(saved: list[torch.Tensor], cuda: CudaGenerators) -> None:
    available = cuda.device_count()
    if saved and available == 0:
        _warn(
            f"CUDA generator states of {len(saved)} device(s) were saved but CUDA is not "
            "available: CUDA random streams were not restored."
        )
        return
    if available and not saved:
        _warn("CUDA random streams were not restored: the state was saved without CUDA.")
        return
    if len(saved) != available:
        _warn(
            f"CUDA generator states were saved for {len(saved)} device(s) but this process sees "
            f"{available}: only devices 0..{min(len(saved), available) - 1} were restored."
        )
    cuda.set_states(saved[:available])


def _warn(message: str) -> None:
    warnings.warn(message, RngRestoreWarning, stacklevel=3)
