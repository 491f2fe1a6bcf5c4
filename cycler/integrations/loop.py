"""Hand-written training loops (nanoGPT-style) whose state lives in local variables.

>>> loop = LoopState(model=model, optimizer=optimizer, scaler=scaler)
>>> iter_num, best_val_loss, batch = loop.resume(iter_num=0, best_val_loss=1e9, batch=None)
>>> while iter_num < max_iters:
...     batch = train_step(batch)  # the loop's own step, prefetching the next batch
...     iter_num += 1
...     if loop.step(iter_num=iter_num, best_val_loss=best_val_loss, batch=batch):
...         break  # stopped: the checkpoint is committed
>>> loop.close()
>>> if loop.stopped:
...     sys.exit(0)  # skip the post-training code

Two kinds of state, as in such loops:

- *objects* (``LoopState(name=obj, ...)``): anything with ``state_dict()`` and
  ``load_state_dict()`` that every rank holds the same copy of (a DDP model, its optimizer, a
  ``GradScaler``, a cycler sampler). Rank 0 saves them; every rank loads them.
- *values* (the keywords of :meth:`resume` and :meth:`step`): plain values that may differ by rank
  (an iteration counter, the best loss, the prefetched batch, which is the data position of a
  loop that draws batches at random). Every rank saves and gets back its own. They are loaded
  with ``weights_only=True``: tensors, numbers, strings, and lists, tuples and dicts of them.

Every rank's RNG (Python, NumPy, torch CPU and CUDA) is saved with them and restored by
:meth:`resume`, so random batches, dropout and random crops continue as in an uninterrupted run.
Checkpoints go through cycler's atomic commit (``AtomicDirectory``) under ``cycle run``'s
checkpoint root: a kill at any moment leaves the previous checkpoint to resume from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.saving import atomic_torch_save
from cycler.errors import ConfigError, StateMismatch
from cycler.protocol.environment import default_checkpoint_root, under_verify
from cycler.training.auto_interval import EverySteps
from cycler.training.ddp_buckets import settle_fresh_ddp_buckets
from cycler.training.rng import capture_rng_state, restore_rng_state
from cycler.training.step_control import StepControl

SHARED_FILE = "loop.pt"
"""Rank 0's file: the objects' states and the step count."""
LOOP_STATE_VERSION = 1


class Stateful(Protocol):
    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> Any: ...


def rank_file(rank: int) -> str:
    """Each rank's file: its values and its RNG."""
    return f"rank-{rank}.pt"


class LoopState:
    """Saves and resumes a hand-written loop's state exactly, at any step (module docstring).

    Args:
        checkpoint_dir: the checkpoint root; default ``cycle run``'s (``$CYCLER_CHECKPOINT_DIR``).
        every_steps, every_seconds: checkpoint on a timer as well as on ``cycle run``'s stop
            requests (the loop's own "save every N" becomes ``every_steps=N``).
        keep_last: committed checkpoints to keep (``-1``: all).
        objects: the replicated state, by name.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None = None, *,
                 every_steps: EverySteps = None, every_seconds: float | None = None,
                 keep_last: int = 2, **objects: Stateful) -> None:
        self.objects = objects
        self.saver = AtomicDirectory(checkpoint_dir or default_checkpoint_root(),
                                     keep_last=keep_last)
        self.control = StepControl(every_steps=every_steps, every_seconds=every_seconds)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.stopped = False
        """Whether :meth:`step` decided a stop (its checkpoint committed)."""
        self._last_values: dict[str, Any] | None = None
        self._saved_at = -1

    def resume(self, **defaults: Any) -> tuple[Any, ...]:
        """Load the newest committed checkpoint, if any, into the objects and this rank's RNG.

        Returns the values saved by :meth:`step` under the names of ``defaults``, in their
        order, or ``defaults``' own values when nothing is committed yet. Call it on every rank
        before the loop. A ``DistributedDataParallel`` among the objects that ran no forward
        yet gets its gradient buckets settled (:func:`cycler.settle_ddp_buckets`)."""
        for obj in self.objects.values():
            settle_fresh_ddp_buckets(obj)
        latest = self.saver.latest_checkpoint()
        if latest is None:
            return tuple(defaults.values())
        shared = torch.load(Path(latest) / SHARED_FILE, map_location="cpu", weights_only=True)
        own = torch.load(Path(latest) / rank_file(self.rank), map_location="cpu",
                         weights_only=True)
        _check_names(shared["objects"], self.objects, "objects", latest)
        _check_names(own["values"], defaults, "values", latest)
        for name, obj in self.objects.items():
            obj.load_state_dict(shared["objects"][name])
        self.control.load_state_dict(shared["control"])
        restore_rng_state(own["rng"])
        return tuple(own["values"][name] for name in defaults)

    def step(self, *, loss: Any = None, fingerprint: Any = None, **values: Any) -> bool:
        """Count one finished step on every rank; save when cycler or the timer asks, with
        ``values`` (this rank's); True when the loop must stop (after the commit). ``loss``
        or ``fingerprint`` is the step's record, compared when a restart replays the step
        (:meth:`StepControl.step <cycler.StepControl.step>`); it is not saved."""
        decision = self.control.step(loss=loss, fingerprint=fingerprint)
        self._last_values = values
        if decision.checkpoint:
            self.save(**values)
        self.stopped = decision.stop
        return decision.stop

    def save(self, **values: Any) -> None:
        """Commit a checkpoint now; every rank calls it at the same step."""
        for name, value in values.items():
            _check_loadable(name, value)
        directory = Path(self.saver.prepare_checkpoint_directory())
        if self.rank == 0:
            states = {name: obj.state_dict() for name, obj in self.objects.items()}
            atomic_torch_save({"version": LOOP_STATE_VERSION, "objects": states,
                               "control": self.control.state_dict()}, directory / SHARED_FILE)
        atomic_torch_save({"values": values, "rng": capture_rng_state()},
                          directory / rank_file(self.rank))
        self.saver.symlink_latest(directory, metadata={"step": self.control.global_step})
        self._saved_at = self.control.global_step

    def close(self) -> None:
        """After the loop, on every rank: waits for the exchange and the saves in flight.
        Under ``cycle verify`` it first commits the state the loop ended with (the values of
        the last :meth:`step`), so that verify compares the end of training too."""
        if under_verify() and not self.stopped and self._last_values is not None \
                and self._saved_at != self.control.global_step:
            self.save(**self._last_values)
        self.control.close()


_LOADABLE = (torch.Tensor, int, float, bool, str, bytes, type(None))


def _check_loadable(name: str, value: Any) -> None:
    """Refuse, before anything is written, a value ``resume()`` could not load back
    (``weights_only=True``): a checkpoint that cannot be resumed is worse than none."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_loadable(name, item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_loadable(name, key)
            _check_loadable(name, item)
    elif not isinstance(value, _LOADABLE):
        raise ConfigError(f"the value {name}= holds a {type(value).__name__}, which resume() "
                          f"cannot load safely: pass tensors, numbers, strings, and lists, "
                          f"tuples or dicts of them (torch.from_numpy for an array)")


def _check_names(saved: Mapping[str, Any], expected: Mapping[str, Any], kind: str,
                 checkpoint: str) -> None:
    if set(saved) != set(expected):
        raise StateMismatch(f"the checkpoint {checkpoint} holds the {kind} {sorted(saved)}, "
                            f"this loop asks for {sorted(expected)}: pass the same names to "
                            f"LoopState and resume() as the run that saved it")
