"""Lightning under ``cycle run`` in one line (extra ``torch-cycler[lightning]``).

>>> trainer = lightning.Trainer(..., callbacks=[CyclerCallback()])
>>> trainer.fit(model, datamodule)  # resumes from the newest committed checkpoint by itself

What the callback changes, and nothing else:

- every training batch that ends an optimizer step (:mod:`cycler.integrations.optimizer_steps`:
  an optimizer stepped and no gradient is pending, whatever ``accumulate_grad_batches``, manual
  optimization or several optimizers) ends with :meth:`StepControl.step()
  <cycler.StepControl.step>`, so a stop is agreed on one optimizer step by every rank and never
  drops half an accumulated gradient;
- the checkpoints it asks for (a stop's, the periodic ones of ``every_steps``, by default
  ``"auto"``, and one when ``fit()`` reaches its end) are ``trainer.save_checkpoint()`` into a
  directory from ``prepare_checkpoint_directory()`` with every rank's RNG (and an iterable
  loader's position) beside it, committed with ``symlink_latest()``: a kill at any moment leaves
  the previous checkpoint to resume from, and a finished fit run again does not train again;
- a decision on a batch that Lightning follows with a validation is carried out after that
  validation, and one on an epoch's last batch at the epoch's end: Lightning resumes a
  checkpoint made before either as if it had happened;
- ``trainer.fit(...)`` without ``ckpt_path`` resumes from the newest committed checkpoint when
  there is one: Lightning's own restore (model, optimizers, schedulers, loops, callbacks) plus
  every rank's RNG and the training loader's position (:mod:`cycler.integrations.lightning_data`;
  a loader that cannot resume exactly is refused before the first step, in one line);
- after a stop's commit the process exits 0 at once (``SystemExit`` through Lightning's own
  interrupt path: ``on_exception`` hooks and teardown run, ``on_train_end`` and the script's
  post-training code do not). With ``CyclerCallback(exit_on_stop=False)`` ``fit()`` ends
  through ``trainer.should_stop`` instead, and :func:`stopped` tells the script.

Lightning's own ``ModelCheckpoint`` keeps writing its files as before; the resume uses cycler's
commits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.checkpoint.retention import checked_keep_last
from cycler.checkpoint.saving import atomic_torch_save
from cycler.errors import ConfigError
from cycler.integrations import lightning_data
from cycler.integrations.lightning_data import ResumableLoader
from cycler.integrations.optimizer_steps import OptimizerSteps
from cycler.protocol.environment import default_checkpoint_root
from cycler.training.auto_interval import EverySteps
from cycler.training.ddp_buckets import settle_fresh_ddp_buckets
from cycler.training.rng import capture_rng_state, restore_rng_state
from cycler.training.step_control import StepControl, StepDecision

__all__ = ["CHECKPOINT_FILE", "CyclerCallback", "ResumableLoader", "rng_file", "stopped"]

CHECKPOINT_FILE = "lightning.ckpt"

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
        every_steps: periodic checkpoints, in optimizer steps: ``"auto"`` (the default: an
            interval chosen from the measured save stall and the job's failure rate, at least
            30 s and at most an hour apart, :class:`~cycler.AutoInterval`), a number, or None
            (checkpoints only at a stop and at the end: a kill -9 loses everything since).
        every_seconds: a checkpoint when that long has passed since the last one, besides.
        keep_last: committed checkpoints to keep, counting the latest (``-1``: all); one that
            would keep none is refused here (:class:`~cycler.ConfigError`), as by the saver.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None = None, *,
                 exit_on_stop: bool = True, every_steps: EverySteps = "auto",
                 every_seconds: float | None = None, keep_last: int = 2) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.exit_on_stop = exit_on_stop
        self.every_steps, self.every_seconds = every_steps, every_seconds
        self.keep_last = checked_keep_last(keep_last)  # refused here, not at fit()
        self.stopped = False
        self.resumed_from: Path | None = None
        """The committed checkpoint this fit resumed from (None: a first start)."""
        self._saver: AtomicDirectory | None = None
        self._control: StepControl | None = None
        self._steps: OptimizerSteps | None = None
        self._loader: DataLoader | None = None
        self._position_from: Path | None = None
        self._deferred: StepDecision | None = None
        self._decided = 0
        """Optimizer steps decided on so far (StepControl's count, kept in the checkpoint)."""

    @property
    def state_key(self) -> str:
        return "CyclerCallback"

    def state_dict(self) -> dict[str, Any]:
        return {"decided_steps": self._decided}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._decided = int(state_dict.get("decided_steps", self._decided))

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        global _LAST_FIT_STOPPED
        self.stopped = _LAST_FIT_STOPPED = False
        self._saver = AtomicDirectory(self.checkpoint_dir or default_checkpoint_root(),
                                      keep_last=self.keep_last)
        latest = self._saver.latest_checkpoint()
        self.resumed_from = self._position_from = None if latest is None else Path(latest)
        self._decided = -1  # unknown until a checkpoint's state says (global_step otherwise)
        # Lightning reads the checkpoint right after this hook; without ckpt_path it reads none.
        connector = trainer._checkpoint_connector
        resume_start = connector.resume_start
        vars(connector)["resume_start"] = lambda path=None, **kwargs: resume_start(
            path or self._checkpoint_file(), **kwargs)
        process_dataloader = trainer.strategy.process_dataloader
        vars(trainer.strategy)["process_dataloader"] = lambda loader: self._resumable(
            trainer, process_dataloader(loader))

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # DDPStrategy wrapped the model and no forward ran yet (the sanity check comes later):
        # the last moment its buckets can take the layout of every later step (docs/saving.md,
        # "DDP at three ranks or more").
        settle_fresh_ddp_buckets(trainer.strategy.model)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.resumed_from is not None:
            restore_rng_state(torch.load(self.resumed_from / rng_file(trainer.global_rank),
                                         weights_only=True))
        if self._decided < 0:
            self._decided = trainer.global_step
        self._steps = OptimizerSteps(trainer.optimizers)
        self._control = StepControl(start_step=self._decided, every_steps=self.every_steps,
                                    every_seconds=self.every_seconds)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self._control is not None and self._steps is not None, "on_train_start first"
        lightning_data.note_trained(self._loader, batch_idx + 1)
        if not self._steps.at_boundary():
            return  # in the middle of an accumulated step: its gradients are in no checkpoint
        decision = self._control.step(loss=_loss_of(outputs))
        self._decided = self._control.global_step
        epoch_loop = trainer.fit_loop.epoch_loop
        if batch_idx + 1 == trainer.num_training_batches or epoch_loop.batch_progress.is_last_batch:
            # Lightning resumes a checkpoint of an epoch's last batch one epoch too far: this
            # one is made at the epoch's end, Lightning's own place for it.
            self._deferred = decision
        elif _validates_after_this_batch(trainer):
            # A checkpoint made before this batch's validation would be resumed as if the
            # validation had run (Lightning skips it), and the RNG it draws would differ.
            self._deferred = decision
        else:
            self._act(trainer, decision)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # After the validation of an epoch's last batch comes the epoch's end: the place for it.
        if not trainer.sanity_checking and \
                not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._carry_out_deferred(trainer)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        self._carry_out_deferred(trainer)  # a validation expected that did not run

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        lightning_data.epoch_begins(self._loader, trainer.current_epoch)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._carry_out_deferred(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._carry_out_deferred(trainer)
        assert self._saver is not None
        if not self.stopped:
            # The end is committed too: the same command run again finds training done.
            self.save(trainer)
        self._close()

    def _carry_out_deferred(self, trainer: pl.Trainer) -> None:
        decision, self._deferred = self._deferred, None
        if decision is not None:
            self._act(trainer, decision)

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
        rank = trainer.global_rank
        atomic_torch_save(capture_rng_state(), directory / rng_file(rank))
        lightning_data.save_position(self._loader, directory, rank)
        self._saver.symlink_latest(directory, metadata={"step": trainer.global_step,
                                                        "epoch": trainer.current_epoch})

    def _checkpoint_file(self) -> str | None:
        return None if self.resumed_from is None else str(self.resumed_from / CHECKPOINT_FILE)

    def _resumable(self, trainer: pl.Trainer, loader: Any) -> Any:
        if not trainer.training:
            return loader
        refusal = lightning_data.refusal(loader)
        if refusal is not None:
            raise ConfigError(refusal)
        position_from, self._position_from = self._position_from, None
        self._loader = lightning_data.resumable(
            loader, int(os.environ.get("PL_GLOBAL_SEED", 0)), trainer.global_rank, position_from)
        return self._loader

    def _close(self) -> None:
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        if self._control is not None:
            self._control.close()
            self._control = None


def _validates_after_this_batch(trainer: pl.Trainer) -> bool:
    """Whether Lightning runs a validation right after the training batch that just ended."""
    fetcher = trainer.fit_loop._data_fetcher
    return fetcher is not None and trainer.fit_loop.epoch_loop._should_check_val_fx(fetcher)


def _loss_of(outputs: Any) -> Any:
    """The loss ``training_step`` returned (a tensor, or a dict's ``"loss"``), or ``None``:
    the step's record for the replay check (that of an accumulated step's last batch)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None
