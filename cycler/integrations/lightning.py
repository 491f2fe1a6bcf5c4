"""Lightning under ``cycle run`` in one line (extra ``torch-cycler[lightning]``).

>>> trainer = lightning.Trainer(..., callbacks=[CyclerCallback()])
>>> trainer.fit(model, datamodule)  # resumes from the newest committed checkpoint by itself

What the callback changes, and nothing else:

- every training batch ends with :meth:`StepControl.step() <cycler.StepControl.step>`, so a stop
  is agreed on one step by every rank;
- the checkpoints it asks for (a stop's, and ``every_steps``/``every_seconds``) are
  ``trainer.save_checkpoint()`` into a directory from ``prepare_checkpoint_directory()`` with
  every rank's RNG beside it, committed with ``symlink_latest()``: a kill at any moment leaves
  the previous checkpoint to resume from;
- ``trainer.fit(...)`` without ``ckpt_path`` resumes from the newest committed checkpoint when
  there is one: Lightning's own restore (model, optimizers, schedulers, loops, callbacks) plus
  every rank's RNG and the training loader's position within the epoch;
- the training loader becomes resumable with no change of sampler: the sampler Lightning
  injects (or the script's) is kept, its batches before the resumed position are skipped as
  index lists (no sample is loaded), and the loader draws its seed from its own generator, so
  the global RNG streams continue exactly. Lightning sees a resumable loader and does not warn;
- after a stop's commit the process exits 0 at once (``SystemExit`` through Lightning's own
  interrupt path: ``on_exception`` hooks and teardown run, ``on_train_end`` and the script's
  post-training code do not). With ``CyclerCallback(exit_on_stop=False)`` ``fit()`` ends
  through ``trainer.should_stop`` instead, and :func:`stopped` tells the script.

Lightning's own ``ModelCheckpoint`` keeps writing its files as before; the resume uses cycler's
commits. The loader's position is counted in batches of an optimizer step each
(``accumulate_grad_batches=1``) for the map-style loaders Lightning builds batch samplers for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.saving import atomic_torch_save
from cycler.protocol.environment import default_checkpoint_root, under_verify
from cycler.training.auto_interval import EverySteps
from cycler.training.rng import capture_rng_state, restore_rng_state
from cycler.training.step_control import StepControl, StepDecision

CHECKPOINT_FILE = "lightning.ckpt"
LOADER_STATE_VERSION = 1

_LAST_FIT_STOPPED = False


def stopped() -> bool:
    """Whether the latest ``fit()`` with a :class:`CyclerCallback` ended at a stop."""
    return _LAST_FIT_STOPPED


def rng_file(rank: int) -> str:
    return f"rng-{rank}.pt"


class CyclerCallback(pl.Callback):
    """Gives a Lightning ``Trainer`` cycler's stop, commit and exact resume (module docstring).

    Args:
        checkpoint_dir: the checkpoint root; default ``cycle run``'s (``$CYCLER_CHECKPOINT_DIR``).
        exit_on_stop: after a stop's commit exit the process with 0 (True), or end ``fit()``
            through ``trainer.should_stop`` with :func:`stopped` true (False).
        every_steps, every_seconds: checkpoint on a timer as well as on ``cycle run``'s requests.
        keep_last: committed checkpoints to keep (``-1``: all).
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None = None, *,
                 exit_on_stop: bool = True, every_steps: EverySteps = None,
                 every_seconds: float | None = None, keep_last: int = 2) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.exit_on_stop = exit_on_stop
        self.every_steps, self.every_seconds, self.keep_last = every_steps, every_seconds, keep_last
        self.stopped = False
        self.resumed_from: Path | None = None
        """The committed checkpoint this fit resumed from (None: a first start)."""
        self._saver: AtomicDirectory | None = None
        self._control: StepControl | None = None
        self._loader: ResumableLoader | None = None
        self._at_epoch_end: StepDecision | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        global _LAST_FIT_STOPPED
        self.stopped = _LAST_FIT_STOPPED = False
        self._saver = AtomicDirectory(self.checkpoint_dir or default_checkpoint_root(),
                                      keep_last=self.keep_last)
        latest = self._saver.latest_checkpoint()
        self.resumed_from = None if latest is None else Path(latest)
        # Lightning reads the checkpoint right after this hook; without ckpt_path it reads none.
        connector = trainer._checkpoint_connector
        resume_start = connector.resume_start
        vars(connector)["resume_start"] = lambda path=None, **kwargs: resume_start(
            path or self._checkpoint_file(), **kwargs)
        process_dataloader = trainer.strategy.process_dataloader
        vars(trainer.strategy)["process_dataloader"] = lambda loader: self._resumable(
            trainer, process_dataloader(loader))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.resumed_from is not None:
            restore_rng_state(torch.load(self.resumed_from / rng_file(trainer.global_rank),
                                         weights_only=True))
        self._control = StepControl(start_step=trainer.global_step,
                                    every_steps=self.every_steps,
                                    every_seconds=self.every_seconds)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self._control is not None, "on_train_start comes first"
        if self._loader is not None:
            self._loader.batches_done = batch_idx + 1
        decision = self._control.step(loss=_loss_of(outputs))
        if batch_idx + 1 == trainer.num_training_batches:
            # Lightning resumes a checkpoint of an epoch's last batch one epoch too far: this
            # one is made at the epoch's end, Lightning's own place for it, before anything else.
            self._at_epoch_end = decision
        else:
            self._act(trainer, decision)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        decision, self._at_epoch_end = self._at_epoch_end, None
        if decision is not None:
            self._act(trainer, decision)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if under_verify() and not self.stopped:
            # cycle verify compares the state training ends with: at every end, even where the
            # last epoch's end committed this step (Lightning's epoch counter moved since).
            self.save(trainer)
        self._close()

    def _act(self, trainer: pl.Trainer, decision: StepDecision) -> None:
        global _LAST_FIT_STOPPED
        if decision.checkpoint:
            self.save(trainer)
        if not decision.stop:
            return
        self.stopped = _LAST_FIT_STOPPED = True
        if self.exit_on_stop:
            self._close()
            raise SystemExit(0)
        trainer.should_stop = True

    def save(self, trainer: pl.Trainer) -> None:
        """Commit a checkpoint now; every rank calls it at the same step."""
        assert self._saver is not None
        directory = Path(self._saver.prepare_checkpoint_directory())
        trainer.save_checkpoint(directory / CHECKPOINT_FILE)
        atomic_torch_save(capture_rng_state(), directory / rng_file(trainer.global_rank))
        self._saver.symlink_latest(directory, metadata={"step": trainer.global_step,
                                                        "epoch": trainer.current_epoch})

    def _checkpoint_file(self) -> str | None:
        return None if self.resumed_from is None else str(self.resumed_from / CHECKPOINT_FILE)

    def _resumable(self, trainer: pl.Trainer, loader: Any) -> Any:
        if not trainer.training or not isinstance(loader, DataLoader) or \
                loader.batch_sampler is None or isinstance(loader, ResumableLoader):
            return loader
        self._loader = ResumableLoader.around(loader, int(os.environ.get("PL_GLOBAL_SEED", 0)))
        return self._loader

    def _close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None


class _SkippingBatchSampler:
    """A batch sampler that leaves out the first batches of the epoch a resume continues, and
    reseeds its loader's generator with the epoch (the seed of the loader's iterator)."""

    def __init__(self, batches: Any, generator: torch.Generator, seed: int) -> None:
        self.batches, self.generator, self.seed = batches, generator, seed
        self.epoch = 0
        self.resume_at: tuple[int, int] | None = None
        """(epoch, batches done in it) of a resume, until that epoch's iteration starts."""
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.generator.manual_seed(self.seed * 1_000_003 + epoch)
        for inner in (self.batches, getattr(self.batches, "sampler", None)):
            set_epoch = getattr(inner, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        skip = self.resume_at[1] if self.resume_at and self.resume_at[0] == self.epoch else 0
        self.resume_at = None
        for index, batch in enumerate(self.batches):
            if index >= skip:
                yield batch

    def __len__(self) -> int:
        return len(self.batches)


class ResumableLoader(DataLoader):
    """The training loader, rebuilt around the same dataset, batches and workers, with a
    position Lightning saves and restores (``state_dict``/``load_state_dict``)."""

    batches_done = 0
    """Batches of the current epoch trained on (set by the callback after each batch)."""

    @classmethod
    def around(cls, loader: DataLoader, seed: int) -> ResumableLoader:
        generator = torch.Generator()
        skipping = _SkippingBatchSampler(loader.batch_sampler, generator, seed)
        rebuilt = cls(loader.dataset, batch_sampler=skipping, num_workers=loader.num_workers,
                      collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                      timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                      multiprocessing_context=loader.multiprocessing_context,
                      generator=generator, prefetch_factor=loader.prefetch_factor,
                      persistent_workers=loader.persistent_workers,
                      pin_memory_device=loader.pin_memory_device)
        return rebuilt

    def state_dict(self) -> dict[str, int]:
        skipping = self.batch_sampler
        assert isinstance(skipping, _SkippingBatchSampler)
        return {"version": LOADER_STATE_VERSION, "epoch": skipping.epoch,
                "batches_done": self.batches_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        skipping = self.batch_sampler
        assert isinstance(skipping, _SkippingBatchSampler)
        skipping.set_epoch(state["epoch"])
        skipping.resume_at = (state["epoch"], state["batches_done"])


def _loss_of(outputs: Any) -> Any:
    """The loss ``training_step`` returned (a tensor, or a dict's ``"loss"``), or ``None``."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None
