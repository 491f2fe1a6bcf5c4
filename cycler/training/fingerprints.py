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
kept and read every :data:`RING_SLOTS` steps. Each record is 32 bytes stored into the mapped
file: no system call a step (one per :data:`MAP_BYTES`), and nothing lost at a kill -9.
"""

from __future__ import annotations

import atexit
import collections
import mmap
import os
import random
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
    RECORD_SIZE,
    START,
    VALUE,
    float64_bits,
    float_bits,
    pack_fields,
)

RING_SLOTS = 64
"""Device values in flight before the host waits for the oldest (steps the device may lag)."""
MAP_BYTES = 1 << 20
"""How much of the file is mapped at a time: 32 768 records."""

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
        # The copy runs on the tensor's device's current stream, which need not be the current
        # device's (a loss on cuda:1 with cuda:0 current): the event is recorded there.
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensor.device))
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
    """This worker's records, stored into ``path`` (mapped); without a path, nothing."""

    def __init__(self, path: Path | None, rank: int = 0, world_size: int = 1) -> None:
        self.path, self.rank, self.world_size = path, rank, world_size
        self.pid = os.getpid()
        self._start = random.SystemRandom().getrandbits(32)
        self._fd: int | None = None
        self._memory: mmap.mmap | None = None
        self._offset = self._size = 0
        self._ring = _DeviceRing()
        self._kept: list[tuple[int, torch.Tensor]] = []

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
            self.write()

    def write(self) -> None:
        """Store the device values whose copies are done, without waiting for the others."""
        for done in self._ring.take():
            self._add(*done)

    def flush(self) -> None:
        """Store every value still on its way (waits for the device): at the end of the loop,
        and at the process's exit."""
        for done in self._ring.take(wait=True):
            self._add(*done)
        kept, self._kept = self._kept, []
        for step, tensor in kept:
            self._add(step, *tensor_bits(tensor.cpu()))

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
        """Map the file after what earlier starts stored (a gap of zeros between: readers
        skip it), then store this start's header."""
        assert self.path is not None
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            with open(self.path, "rb") as handle:
                stored = len(handle.read().rstrip(b"\0"))
            self._offset = stored + RECORD_SIZE if stored else 0
        except OSError:
            self._stop()  # a record for people, never a reason to stop training
            return
        atexit.register(self.flush)
        self._store(pack_fields(START, self.rank, self._start, resumed, self.world_size,
                                INT64))

    def _add(self, step: int, kind_of_value: int, bits: int) -> None:
        self._store(pack_fields(VALUE, self.rank, self._start, step, bits, kind_of_value))

    def _store(self, record: bytes) -> None:
        end = self._offset + RECORD_SIZE
        if end > self._size and not self._grow(end):
            return
        assert self._memory is not None
        self._memory[self._offset:end] = record
        self._offset = end

    def _grow(self, end: int) -> bool:
        """Map ``MAP_BYTES`` more; blocks reserved first, so a full disk is an ``OSError``
        here (recording stops) rather than a SIGBUS at a store."""
        if self._fd is None or os.getpid() != self.pid:
            return False
        size = (end // MAP_BYTES + 1) * MAP_BYTES
        try:
            os.posix_fallocate(self._fd, 0, size)
            memory = mmap.mmap(self._fd, size)
        except OSError:
            self._stop()
            return False
        if self._memory is not None:
            self._memory.close()
        self._memory, self._size = memory, size
        return True

    def _stop(self) -> None:
        if self._fd is not None:
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
