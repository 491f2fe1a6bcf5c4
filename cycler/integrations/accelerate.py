"""Hugging Face Accelerate loops under ``cycle run`` in a few lines (extra
``torch-cycler[accelerate]``).

>>> model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
...     model, optimizer, train_dataloader, lr_scheduler)
>>> loop = AccelerateLoop(accelerator, every_steps=500)
>>> starting_epoch, completed_steps = loop.resume()
>>> for epoch in range(starting_epoch, num_train_epochs):
...     for batch in loop.batches(train_dataloader, epoch):
...         with accelerator.accumulate(model):
...             ...  # forward, accelerator.backward, optimizer and scheduler steps
...         loop.step()  # after a stop's commit: exits 0

What it does, and nothing else:

- :meth:`~AccelerateLoop.step` after every batch asks :class:`~cycler.StepControl` only at
  optimizer-step boundaries (``accelerator.sync_gradients``), so a checkpoint or a stop never
  lands in the middle of a gradient accumulation; every rank agrees on the step;
- a checkpoint is Accelerate's own ``accelerator.save_state()`` (models, optimizers, schedulers,
  scaler, every process's RNG and its accumulation counter) written into a directory from
  ``prepare_checkpoint_directory()``, with the loop's position beside it, committed with
  ``symlink_latest()``: a kill at any moment leaves the previous checkpoint to resume from;
- :meth:`~AccelerateLoop.resume` loads the newest committed checkpoint with
  ``accelerator.load_state()`` and returns the epoch and the optimizer steps done;
- :meth:`~AccelerateLoop.batches` makes the data order exact: each epoch's shuffle is seeded
  from a seed kept in the checkpoint and the epoch (``set_epoch``, the sampler's generator, the
  loader's own generator, so that building an iterator draws nothing from the global RNG), and
  the epoch a resume continues skips the batches already trained on with
  ``accelerator.skip_first_batches`` (as index lists: no sample is loaded);
- after a stop's commit the process exits 0 (``SystemExit``): the script's post-training code
  never runs on a half-trained model. With ``exit_on_stop=False`` :meth:`step` returns True
  instead and ``loop.stopped`` tells the script.

Refused at the first batch, in one line: an ``IterableDataset`` or a stateful loader (their
position is not an index into a sampler), a loader that skips batches already
(``skip_first_batches`` by the script as well), and ``gradient_accumulation_steps > 1`` without
``accelerator.accumulate()`` (a stop could land mid-accumulation).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.data_loader import SeedableRandomSampler, SkipBatchSampler
from torch.utils.data import IterableDataset, RandomSampler

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.saving import atomic_torch_save
from cycler.errors import ConfigError, StateMismatch
from cycler.protocol.environment import default_checkpoint_root, under_verify
from cycler.training.auto_interval import EverySteps
from cycler.training.ddp_buckets import settle_fresh_ddp_buckets
from cycler.training.rng import capture_rng_state, restore_rng_state
from cycler.training.step_control import StepControl

ACCELERATE_DIR = "accelerate"
"""The folder of a checkpoint that ``accelerator.save_state()`` writes."""
LOOP_STATE_VERSION = 1


def rank_file(rank: int) -> str:
    """Each process's file beside Accelerate's: the loop's position, its data seed and RNG."""
    return f"loop-{rank}.pt"


class AccelerateLoop:
    """Gives an Accelerate training loop cycler's stop, commit and exact resume (module
    docstring). Build it after ``accelerator.prepare(...)``, on every process.

    Args:
        accelerator: the script's ``Accelerator``.
        checkpoint_dir: the checkpoint root; default ``cycle run``'s (``$CYCLER_CHECKPOINT_DIR``).
        every_steps, every_seconds: checkpoint on a timer (optimizer steps, seconds) as well as
            on ``cycle run``'s requests (the script's ``checkpointing_steps`` becomes
            ``every_steps``).
        keep_last: committed checkpoints to keep (``-1``: all).
        exit_on_stop: after a stop's commit exit the process with 0 (True), or return True from
            :meth:`step` with ``stopped`` set (False).
    """

    def __init__(self, accelerator: Accelerator, checkpoint_dir: str | os.PathLike[str] | None
                 = None, *, every_steps: EverySteps = None, every_seconds: float | None = None,
                 keep_last: int = 2, exit_on_stop: bool = True) -> None:
        self.accelerator = accelerator
        self.exit_on_stop = exit_on_stop
        self.saver = AtomicDirectory(checkpoint_dir or default_checkpoint_root(),
                                     keep_last=keep_last)
        self.control = StepControl(every_steps=every_steps, every_seconds=every_seconds)
        self.stopped = False
        """Whether :meth:`step` decided a stop (its checkpoint committed)."""
        self.resumed_from: Path | None = None
        """The committed checkpoint :meth:`resume` loaded (None: a first start)."""
        self.epoch = 0
        self.batches_done = 0
        """Batches of ``epoch`` yielded by :meth:`batches` (those trained on, at a step)."""
        self.data_seed = _agreed_seed(accelerator)
        """The seed of every epoch's shuffle, the same on every process (each process takes
        its share of one order); a resume takes the saved one."""
        self._resumed = False
        self._saved_at: int | None = None
        """The optimizer step of the last commit (None: none by this process yet)."""
        self._in_batches = False

    @property
    def completed_steps(self) -> int:
        """Optimizer steps done, counting those before the resumed checkpoint."""
        return self.control.global_step

    def resume(self) -> tuple[int, int]:
        """Load the newest committed checkpoint, if any (every process, after ``prepare``).

        Returns ``(epoch, completed_steps)``: the epoch to continue (``range(epoch, ...)``) and
        the optimizer steps done; ``(0, 0)`` on a first start."""
        if not self.accelerator._models:
            raise ConfigError("AccelerateLoop.resume() came before accelerator.prepare(model, "
                              "optimizer, ...): Accelerate's load_state restores only what was "
                              "prepared; call resume() after prepare")
        self._resumed = True
        for model in _prepared_ddp_models(self.accelerator):  # after prepare, no forward yet
            settle_fresh_ddp_buckets(model)
        latest = self.saver.latest_checkpoint()
        if latest is None:
            return 0, 0
        self.resumed_from = Path(latest)
        own = self.resumed_from / rank_file(self.accelerator.process_index)
        if not (self.resumed_from / ACCELERATE_DIR).is_dir() or not own.is_file():
            raise StateMismatch(f"the checkpoint {latest} holds no {ACCELERATE_DIR}/ folder and "
                                f"{own.name} of an AccelerateLoop: was it written by another "
                                f"script, or by more processes? Give this loop its own "
                                f"checkpoint_dir")
        state = torch.load(own, map_location="cpu", weights_only=True)
        if state.get("version") != LOOP_STATE_VERSION:
            raise StateMismatch(f"{own} is not a version {LOOP_STATE_VERSION} AccelerateLoop "
                                f"state: resume with the cycler version that wrote it")
        processes = self.accelerator.num_processes
        if state.get("num_processes", processes) != processes:
            raise StateMismatch(f"the checkpoint {latest} was saved by {state['num_processes']} "
                                f"processes and this run has {processes}: each process's "
                                f"position is a count of its own share of batches; resume "
                                f"with --nproc-per-node/--nnodes as it was saved")
        with _explicit_directories(self.accelerator):
            self.accelerator.load_state(str(self.resumed_from / ACCELERATE_DIR))
        # Accelerate 1.0's load_state drops the RNG without a word under torch >= 2.6 (its
        # torch.load refuses numpy's state): cycler's own copy is restored after it.
        restore_rng_state(state["rng"])
        self.control.load_state_dict(state["control"])
        self.epoch, self.batches_done = state["epoch"], state["batches_done"]
        self.data_seed = state["data_seed"]
        return self.epoch, self.completed_steps

    def batches(self, loader: Any, epoch: int) -> Iterator[Any]:
        """The batches of ``epoch`` of the prepared training ``loader``, in an order that depends
        only on the data seed and the epoch; the epoch a resume continues starts after the
        batches it already trained on. Call :meth:`step` after each one."""
        if not self._resumed:
            raise ConfigError("AccelerateLoop.batches() came before resume(): call "
                              "loop.resume() after accelerator.prepare(...) and before the loop")
        _check_loader(loader)
        skip = self.batches_done if epoch == self.epoch else 0
        self.epoch, self.batches_done = epoch, skip
        _seed_epoch(loader, self.data_seed, epoch)
        if skip >= len(loader):
            return  # the checkpoint was the epoch's last step (Accelerate 1.0 yields a None)
        active = self.accelerator.skip_first_batches(loader, skip) if skip else loader
        if active is not loader and hasattr(active, "iteration"):
            active.iteration = epoch  # Accelerate 1.0 starts a skipping loader at epoch 0
        self._in_batches = True
        try:
            for batch in active:
                self.batches_done += 1
                yield batch
        finally:
            self._in_batches = False

    def step(self, *, loss: Any = None, fingerprint: Any = None) -> bool:
        """After every batch, on every process: at an optimizer-step boundary, checkpoint when
        cycler or the timer asks and stop when cycler asks. True when the loop must stop (after
        the commit); with ``exit_on_stop`` the process exits 0 instead. ``loss`` (or
        ``fingerprint``) is the optimizer step's record, compared when a restart replays it
        (:meth:`StepControl.step <cycler.StepControl.step>`)."""
        if not self._in_batches:
            raise ConfigError("AccelerateLoop.step() outside `for batch in loop.batches("
                              "train_dataloader, epoch)`: the loop must read its batches "
                              "through it, or a resume cannot find its place in the epoch")
        if not self.accelerator.sync_gradients:
            return False
        self._check_accumulation()
        decision = self.control.step(loss=loss, fingerprint=fingerprint)
        if decision.checkpoint:
            self.save()
        if not decision.stop:
            return False
        self.stopped = True
        if self.exit_on_stop:
            self.close()
            sys.exit(0)
        return True

    def save(self) -> None:
        """Commit a checkpoint now; every process calls it at the same optimizer step."""
        self._saved_at = self.completed_steps
        directory = Path(self.saver.prepare_checkpoint_directory())
        with _explicit_directories(self.accelerator):
            self.accelerator.save_state(str(directory / ACCELERATE_DIR))
        atomic_torch_save({"version": LOOP_STATE_VERSION, "epoch": self.epoch,
                           "num_processes": self.accelerator.num_processes,
                           "batches_done": self.batches_done, "data_seed": self.data_seed,
                           "rng": capture_rng_state(),
                           "control": self.control.state_dict()},
                          directory / rank_file(self.accelerator.process_index))
        self.saver.symlink_latest(directory, metadata={"step": self.completed_steps,
                                                       "epoch": self.epoch})

    def close(self) -> None:
        """After the loop, on every process: waits for the exchange in flight. Under ``cycle
        verify`` it first commits the state the loop ended with, so that verify compares the
        end of training too."""
        if under_verify() and not self.stopped and self._resumed \
                and self._saved_at != self.completed_steps:
            self.save()
        self.control.close()

    def _check_accumulation(self) -> None:
        accelerator = self.accelerator
        if accelerator.gradient_accumulation_steps > 1 and accelerator.step == 0 and \
                not accelerator.gradient_state.end_of_dataloader:
            raise ConfigError(
                f"Accelerator(gradient_accumulation_steps="
                f"{accelerator.gradient_accumulation_steps}) but the loop does not run its steps "
                f"in `with accelerator.accumulate(model):`, so every batch looks like an "
                f"optimizer step and a stop could drop half a gradient: wrap the step in it")


class _explicit_directories:
    """Accelerate's ``automatic_checkpoint_naming`` sends ``save_state`` to its own folder
    whatever it is given: off while cycler saves into, or loads from, its checkpoint."""

    def __init__(self, accelerator: Accelerator) -> None:
        self.configuration = accelerator.project_configuration

    def __enter__(self) -> None:
        self.automatic = self.configuration.automatic_checkpoint_naming
        self.configuration.automatic_checkpoint_naming = False

    def __exit__(self, *exc_info: object) -> None:
        self.configuration.automatic_checkpoint_naming = self.automatic


def _prepared_ddp_models(accelerator: Accelerator) -> list[Any]:
    """The ``DistributedDataParallel`` models ``prepare`` returned. Accelerate keeps the model
    it was given (``_models``), not the DDP it wraps it in, and nothing refers from the model to
    the DDP: the DDP objects alive in the process that wrap one of them. One scan of the
    objects the garbage collector tracks, once per start (0.2-0.4 s with transformers loaded,
    400,000 objects, on a loaded 2-core machine)."""
    from torch.nn.parallel import DistributedDataParallel

    models = [id(model) for model in accelerator._models]
    return [wrapper for wrapper in gc.get_objects()
            if issubclass(type(wrapper), DistributedDataParallel) and id(wrapper.module) in models]


def _check_loader(loader: Any) -> None:
    """One line for a loader whose position cycler cannot restore by skipping batches."""
    if isinstance(loader.dataset, IterableDataset):
        raise ConfigError(f"the training loader reads an IterableDataset "
                          f"({type(loader.dataset).__name__}): its position is not a number of "
                          f"batches of a sampler, so AccelerateLoop cannot resume it exactly; "
                          f"use a map-style Dataset (__len__ and __getitem__)")
    if getattr(loader, "use_stateful_dataloader", False):
        raise ConfigError("the training loader is a StatefulDataLoader "
                          "(DataLoaderConfiguration(use_stateful_dataloader=True)): AccelerateLoop "
                          "restores the position itself; drop use_stateful_dataloader")
    if isinstance(loader.batch_sampler, SkipBatchSampler) or getattr(loader, "skip_batches", None):
        raise ConfigError("the loader given to AccelerateLoop.batches() already skips batches "
                          "(skip_first_batches): pass the prepared train_dataloader itself; the "
                          "loop skips what a resume already trained on")


def _seed_epoch(loader: Any, seed: int, epoch: int) -> None:
    """Make ``epoch``'s order a function of ``seed`` and ``epoch`` only, on every process:
    the sampler's shuffle and the loader's own generator (the base seed of its iterator,
    which would otherwise be drawn from the global RNG each epoch)."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    sampler = _sampler(loader)
    if isinstance(sampler, SeedableRandomSampler):
        sampler.initial_seed = seed
        sampler.set_epoch(epoch)
    elif isinstance(sampler, RandomSampler):
        if sampler.generator is None:
            sampler.generator = torch.Generator()
        sampler.generator.manual_seed(_epoch_seed(seed, epoch))
    base = getattr(loader, "base_dataloader", loader)
    if base.generator is None or base.generator is getattr(sampler, "generator", None):
        # Its own: a generator shared with the sampler would be drawn from twice per epoch.
        base.generator = torch.Generator()
    base.generator.manual_seed(_epoch_seed(seed, epoch) ^ 0x5EED)


def _agreed_seed(accelerator: Accelerator) -> int:
    """Process 0's ``torch.initial_seed()`` on every process: an unseeded script's processes
    each draw their own (fresh interpreters, or forked workers reseeded as fresh ones), and
    shards of different shuffles would repeat some samples and drop others."""
    seed = [torch.initial_seed()]
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(seed, from_process=0)
    return int(seed[0])


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % (1 << 63)


def _sampler(loader: Any) -> Any:
    """The sampler of indices under the loader's batch samplers (Accelerate's shard, the
    script's ``BatchSampler``), or None."""
    inner = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    while hasattr(inner, "batch_sampler"):
        inner = inner.batch_sampler
    return getattr(inner, "sampler", inner)
