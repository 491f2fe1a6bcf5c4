"""The worker's step fingerprints: what it computed at each step, recorded without a device sync.

``StepControl.step(loss=...)`` (and the integrations, which pass the loss they see) hands each
step's value to this process's :class:`FingerprintLog`, which appends one record per step to
``$CYCLER_FINGERPRINT_DIR/rank-<RANK>.fp`` (:mod:`cycler.protocol.fingerprints`): a file on the
node, in the job's private runtime directory, that outlives a kill -9 of the worker. A restart's
replayed steps are compared with these records by ``cycle run`` (:mod:`cycler.protocol.replay`).

Cost: a Python number or a CPU tensor is read at once (a CPU tensor's ``item()`` waits for no
device). A tensor on a GPU is copied into a slot of a pinned host ring with ``non_blocking`` and
an event recorded after the copy; its bits are read at a later step, once the event says the
copy is done, so the host never waits for the device (only a ring full of copies the device has
not reached, :data:`RING_SLOTS` steps behind, waits for the oldest). Other devices' tensors are
kept and read every :data:`RING_SLOTS` steps. One ``write`` of 32 bytes a step.
"""

from __future__ import annotations

import atexit
import collections
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from cycler.errors import ConfigError
from cycler.protocol.fingerprints import (
    BFLOAT16,
    ENV_FINGERPRINT_DIR,
    FLOAT16,
    FLOAT32,
    FLOAT64,
    INT64,
    RANK_FILE,
    START,
    VALUE,
    float64_bits,
    float_bits,
    pack_fields,
)

RING_SLOTS = 64
"""Device values in flight before the host waits for the oldest (steps the device may lag)."""
WRITE_SECONDS = 0.2
"""Longest a record waits in the process before it is written (a kill -9 loses at most these
last steps' records: the replay check then compares fewer steps, never a wrong one)."""
WRITE_BYTES = 4096

_FLOAT_TYPES = {torch.float64: FLOAT64, torch.float32: FLOAT32, torch.float16: FLOAT16,
                torch.bfloat16: BFLOAT16}


def tensor_bits(tensor: torch.Tensor) -> tuple[int, int]:
    """A one-element host tensor's record type and exact bits (an integer tensor as int64)."""
    kind, value = _FLOAT_TYPES.get(tensor.dtype), tensor.item()
    if kind is not None:
        return kind, float_bits(kind, value)
    if isinstance(value, complex):
        raise ConfigError("a step's loss or fingerprint must be real, not complex")
    return INT64, int(value) & ((1 << 64) - 1)


def number_bits(value: Any) -> tuple[int, int]:
    """A Python number's record type and exact bits."""
    if isinstance(value, float):
        return FLOAT64, float64_bits(value)
    if isinstance(value, bool | int):
        return INT64, int(value) & ((1 << 64) - 1)
    raise ConfigError(f"a step's loss or fingerprint must be a float, an int or a one-element "
                      f"tensor, got {type(value).__name__}")


class _DeviceRing:
    """Copies of device values on their way to the host, read once each copy is done."""

    def __init__(self) -> None:
        self._buffers: dict[torch.dtype, torch.Tensor] = {}
        self._free: dict[torch.dtype, list[int]] = {}
        self._pending: collections.deque[tuple[int, torch.dtype, int, Any]] = (
            collections.deque())
        self._ready: list[tuple[int, int, int]] = []

    def put(self, step: int, tensor: torch.Tensor) -> None:
        """Start copying ``tensor`` (one element, on a CUDA device) to the host."""
        dtype = tensor.dtype
        if dtype not in self._buffers:
            self._buffers[dtype] = torch.empty(RING_SLOTS, dtype=dtype, pin_memory=True)
            self._free[dtype] = list(range(RING_SLOTS))
        while not self._free[dtype]:  # the device is RING_SLOTS steps behind: wait for one
            self._ready.append(self._read_oldest())
        slot = self._free[dtype].pop()
        self._buffers[dtype][slot].copy_(tensor.detach().reshape(()), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((step, dtype, slot, event))

    @property
    def busy(self) -> bool:
        """Whether copies are on their way."""
        return bool(self._pending or self._ready)

    def take(self, wait: bool = False) -> list[tuple[int, int, int]]:
        """The copies done (every copy with ``wait``), as ``(step, type, bits)``, oldest first."""
        done, self._ready = self._ready, []
        while self._pending and (wait or self._pending[0][3].query()):
            done.append(self._read_oldest())
        return done

    def _read_oldest(self) -> tuple[int, int, int]:
        step, dtype, slot, event = self._pending.popleft()
        event.synchronize()
        bits = tensor_bits(self._buffers[dtype][slot])
        self._free[dtype].append(slot)
        return step, *bits


class FingerprintLog:
    """This worker's records, appended to ``path``; a log without a path records nothing."""

    def __init__(self, path: Path | None, rank: int = 0, world_size: int = 1) -> None:
        self.path, self.rank, self.world_size = path, rank, world_size
        self.pid = os.getpid()
        self._start = random.SystemRandom().getrandbits(32)
        self._fd: int | None = None
        self._ring = _DeviceRing()
        self._kept: list[tuple[int, torch.Tensor]] = []
        self._buffer = bytearray()
        self._written_at = 0.0

    def record(self, step: int, resumed: int, value: Any) -> None:
        """Record ``value`` (a loss or a checksum) as step ``step``'s; ``resumed``: the step
        this process resumed at (its first step is ``resumed + 1``)."""
        if self.path is None:
            return
        if self._fd is None:
            self._open(resumed)
        if isinstance(value, torch.Tensor):
            self._tensor(step, value)
        else:
            self._add(step, *number_bits(value))
        if self._ring.busy:
            for done in self._ring.take():
                self._add(*done)
        if len(self._buffer) >= WRITE_BYTES or time.monotonic() - self._written_at >= \
                WRITE_SECONDS:
            self._write()

    def flush(self) -> None:
        """Write every record, the values still on their way too (waits for the device): at
        the end of the loop, and at the process's exit."""
        for done in self._ring.take(wait=True):
            self._add(*done)
        kept, self._kept = self._kept, []
        for step, tensor in kept:
            self._add(step, *tensor_bits(tensor.cpu()))
        self._write()

    def _tensor(self, step: int, tensor: torch.Tensor) -> None:
        if tensor.numel() != 1:
            raise ConfigError(f"a step's loss or fingerprint must have one element, this "
                              f"tensor has {tensor.numel()}: pass loss.sum() or a checksum")
        if tensor.is_cpu:
            self._add(step, *tensor_bits(tensor))
        elif tensor.is_cuda:
            self._ring.put(step, tensor)
        else:
            self._kept.append((step, tensor.detach()))
            if len(self._kept) >= RING_SLOTS:
                self.flush()

    def _open(self, resumed: int) -> None:
        assert self.path is not None
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError:
            self.path = None  # a record for people, never a reason to stop training
            return
        atexit.register(self.flush)
        self._buffer += pack_fields(START, self.rank, self._start, resumed, self.world_size,
                                    INT64)

    def _add(self, step: int, kind_of_value: int, bits: int) -> None:
        self._buffer += pack_fields(VALUE, self.rank, self._start, step, bits, kind_of_value)

    def _write(self) -> None:
        """One ``write`` of whole records (``O_APPEND``: a kill -9 never tears one here)."""
        self._written_at = time.monotonic()
        if self._fd is None or not self._buffer or os.getpid() != self.pid:
            return
        data, self._buffer = bytes(self._buffer), bytearray()
        try:
            os.write(self._fd, data)
        except OSError:
            os.close(self._fd)
            self._fd, self.path = None, None


_log: FingerprintLog | None = None


def fingerprint_log() -> FingerprintLog:
    """This process's log (one per process; a forked child gets its own), recording nothing
    outside ``cycle run``."""
    global _log
    if _log is None or _log.pid != os.getpid():
        directory = os.environ.get(ENV_FINGERPRINT_DIR)
        try:
            rank, world = int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1"))
        except (KeyError, ValueError):
            directory = None
            rank, world = 0, 1
        path = Path(directory) / RANK_FILE.format(rank=rank) if directory else None
        _log = FingerprintLog(path, rank, world)
    return _log
