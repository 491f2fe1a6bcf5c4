"""Metrics summed across ranks and kept across restarts, and a step timer (cycling_utils' API).

>>> metrics = MetricsTracker()
>>> metrics.update({"images_seen": len(images), "loss": loss.item()})  # or update(loss=...)
>>> metrics.reduce()             # local now holds the sums over all ranks; agg accumulates them
>>> log(metrics.local)
>>> metrics.reset_local()
>>> metrics.end_epoch()          # at the end of the epoch: agg goes to epoch_reports
>>> save({"metrics": metrics.state_dict(), ...})

Differences from cycling_utils, all corrections: values are matched across ranks by name, so
ranks may insert keys in any order or lack some (a missing key counts as 0); sums are float64,
so counts stay exact past 2**24; ``reduce()`` works on gloo and nccl, and without a process
group (sums stay local); calling ``reduce()`` twice never counts a value twice; the state holds
plain dicts, loadable with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import torch
import torch.distributed as dist

from cycler._distributed import in_process_group
from cycler.errors import StateMismatch

METRICS_STATE_VERSION = 1

Number = float | int | torch.Tensor


class MetricsTracker:
    """Summable scalar metrics: local sums, their cross-rank reduction, and per-epoch history.

    Attributes (as in cycling_utils): ``local``, the sums since :meth:`reset_local` (after
    :meth:`reduce`, summed over all ranks); ``agg``, the reduced sums of the running epoch;
    ``epoch_reports``, one dict of ``agg`` per finished epoch.

    ``group`` is the process group to reduce over (default: the whole world); ``device`` the
    device of the reduction tensor (default: the current CUDA device on nccl, else the CPU).
    """

    def __init__(
        self, *, group: dist.ProcessGroup | None = None, device: torch.device | str | None = None
    ) -> None:
        self.group = group
        self.device = device
        self.local: defaultdict[str, float] = defaultdict(float)
        self.agg: defaultdict[str, float] = defaultdict(float)
        self.epoch_reports: list[dict[str, float]] = []
        # Sums added since the last reduce(), and the reduced sums since reset_local(): keeping
        # them apart is what stops a second reduce() from summing already-global values again.
        self._unreduced: defaultdict[str, float] = defaultdict(float)
        self._reduced: defaultdict[str, float] = defaultdict(float)

    def update(
        self, metrics: Mapping[str, Number] | None = None, /, **named: Number
    ) -> MetricsTracker:
        """Add values to the local sums: ``update({"loss": 0.5})`` or ``update(loss=0.5)``.

        Values are numbers or one-element tensors (read with ``float()``, which waits for the GPU).
        """
        for name, value in itertools.chain((metrics or {}).items(), named.items()):
            self.local[name] += float(value)
            self._unreduced[name] += float(value)
        return self

    def reduce(self) -> MetricsTracker:
        """Sum what was added since the last reduce over all ranks, into ``local`` and ``agg``.

        Every rank of the group must call it, the same number of times. Without an initialised
        process group the sums are this process's own.
        """
        summed = _sum_over_ranks(dict(self._unreduced), self.group, self.device)
        for name, value in summed.items():
            self._reduced[name] += value
            self.agg[name] += value
        self.local = defaultdict(float, self._reduced)
        self._unreduced = defaultdict(float)
        return self

    def reset_local(self) -> MetricsTracker:
        """Forget the local sums, reduced or not, to start the next interval."""
        self.local = defaultdict(float)
        self._unreduced = defaultdict(float)
        self._reduced = defaultdict(float)
        return self

    def end_epoch(self) -> MetricsTracker:
        """Append ``agg`` to ``epoch_reports``, then clear ``agg`` and the local sums."""
        self.epoch_reports.append(dict(self.agg))
        self.agg = defaultdict(float)
        return self.reset_local()

    def state_dict(self) -> dict[str, Any]:
        """``agg`` and ``epoch_reports``; local sums differ between ranks, so they are not saved."""
        return {
            "version": METRICS_STATE_VERSION,
            "agg": dict(self.agg),
            "epoch_reports": [dict(report) for report in self.epoch_reports],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> MetricsTracker:
        """Restore a :meth:`state_dict`, or a cycling_utils one (no version); clears local sums."""
        version = state.get("version", 0 if "agg" in state else None)
        if version not in (0, METRICS_STATE_VERSION) or not {"agg", "epoch_reports"} <= set(state):
            raise StateMismatch(
                f"Metrics state has version {version!r} and keys {sorted(state)}; expected "
                f"version {METRICS_STATE_VERSION} with agg and epoch_reports, as "
                "MetricsTracker.state_dict() returns."
            )
        self.agg = defaultdict(float, state["agg"])
        self.epoch_reports = [dict(report) for report in state["epoch_reports"]]
        return self.reset_local()


def _sum_over_ranks(
    values: dict[str, float], group: dist.ProcessGroup | None, device: torch.device | str | None
) -> dict[str, float]:
    if not in_process_group():
        return values
    on_device = _reduction_device(group, device)
    names = _names_on_any_rank(values, group, on_device)
    if not names:
        return {}
    # float64: float32 sums stop counting exactly at 2**24 images.
    local = torch.tensor(
        [values.get(name, 0.0) for name in names], dtype=torch.float64, device=on_device
    )
    dist.all_reduce(local, op=dist.ReduceOp.SUM, group=group)
    return dict(zip(names, local.tolist(), strict=True))


def _names_on_any_rank(
    values: dict[str, float], group: dist.ProcessGroup | None, device: torch.device
) -> list[str]:
    """The sorted union of the metric names of every rank.

    The usual case, where every rank has the same names, costs one tiny all_reduce of a
    fingerprint; only when the fingerprints differ are the names themselves gathered.
    """
    names = sorted(values)
    fingerprint = _fingerprint(names)
    bounds = torch.tensor([fingerprint, -fingerprint], dtype=torch.int64, device=device)
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX, group=group)
    if bounds[0].item() == -bounds[1].item() == fingerprint:
        return names
    gathered: list[list[str] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, names, group=group)
    return sorted({name for rank_names in gathered for name in rank_names or []})


def _fingerprint(names: list[str]) -> int:
    # A stable hash: Python's str hash differs between processes.
    digest = hashlib.blake2b("\0".join(names).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


def _reduction_device(
    group: dist.ProcessGroup | None, device: torch.device | str | None
) -> torch.device:
    if device is not None:
        return torch.device(device)
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class TimestampedTimer:
    """Prints the time since the previous report and the running total (cycling_utils' format).

    Durations are measured on ``clock`` (monotonic), so a wall-clock jump never makes them wrong.
    ``start_time``, as in cycling_utils, is a wall-clock timestamp (``time.time()``) of when
    timing began. Only rank 0 prints: ``rank`` defaults to ``$RANK`` (no ``$RANK``: prints).
    """

    def __init__(
        self,
        report: str | None = None,
        start_time: float | None = None,
        running: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rank: int | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self._clock = clock
        self._wall_clock = wall_clock
        self._stream = stream
        self._prints = rank == 0 if rank is not None else os.environ.get("RANK", "0") == "0"
        now = clock()
        self._last = now if start_time is None else now - (wall_clock() - start_time)
        self.running = running
        self._print(report or "Start", 0.0)

    @property
    def start_time(self) -> float:
        """Wall-clock time (``time.time()``) of the last report, as cycling_utils keeps it."""
        return self._wall_clock() - (self._clock() - self._last)

    def report(self, annot: str, ret: bool = False) -> float | None:
        """Print ``annot`` with the seconds since the last report; return them if ``ret``."""
        now = self._clock()
        duration = now - self._last
        self._last = now
        self.running += duration
        self._print(annot, duration)
        return duration if ret else None

    def _print(self, message: str, duration: float) -> None:
        if not self._prints:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._wall_clock()))
        line = f"[ {stamp} ] {message:<70}{f'{1000 * duration:,.3f}':>12} ms, "
        print(f"{line}{f'{self.running:,.2f}':>12} s total", file=self._stream or sys.stdout)
