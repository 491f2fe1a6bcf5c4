"""Hugging Face ``Trainer`` under ``cycle run`` in one line (extra ``torch-cycler[transformers]``).

>>> trainer = Trainer(model=model, args=args, train_dataset=data,
...                   callbacks=[CyclerCallback()])
>>> trainer.train()  # resumes from the newest committed checkpoint by itself

What the callback changes, and nothing else:

- every optimizer step ends with :meth:`StepControl.step() <cycler.StepControl.step>`, so a stop
  is agreed on one step by every rank;
- every save of the Trainer (``save_steps``, ``save_strategy="epoch"``, the stop's) is HF's own
  ``checkpoint-N`` folder written inside a directory from ``prepare_checkpoint_directory()`` and
  committed with ``symlink_latest()``: a kill at any moment leaves no torn checkpoint that a
  resume could pick. ``save_total_limit`` becomes the saver's ``keep_last`` (:func:`keep_last_of`:
  unset, 0 or below keeps every checkpoint, as in HF); with ``load_best_model_at_end`` a
  checkpoint that is the best when saved is pinned;
- ``trainer.train()`` without ``resume_from_checkpoint`` (or with ``True``) resumes from the
  newest committed checkpoint when there is one: HF's own resume then restores the model,
  optimizer, scheduler, scaler, trainer state, every rank's RNG and the data position;
- after a stop's checkpoint is committed, ``train()`` ends without HF's end-of-training code
  (best-model loading, checkpoint deletion, ``on_train_end``). By default the process then exits
  0 at once (``SystemExit``), so the script's own post-training code (a final ``save_model``,
  an evaluation) never runs on a model that is not trained to the end. With
  ``CyclerCallback(exit_on_stop=False)`` ``train()`` returns instead, and :func:`stopped` (or
  ``callback.stopped``) tells the script to return without its post-training code.

The checkpoint root is ``cycle run``'s (``$CYCLER_CHECKPOINT_DIR``; ``./checkpoints`` without
it), not ``args.output_dir``. The callback finds its Trainer when the Trainer is built: pass it
in ``Trainer(callbacks=[...])``, or call :meth:`CyclerCallback.attach` for a callback added later.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

from cycler.checkpoint.atomic_directory import AtomicDirectory
from cycler.errors import ConfigError
from cycler.protocol.environment import ENV_CONTROL_FILE, default_checkpoint_root, under_verify
from cycler.training.auto_interval import EverySteps
from cycler.training.ddp_buckets import settle_fresh_ddp_buckets
from cycler.training.step_control import StepControl

TRAINER_STATE = "trainer_state.json"
"""The file HF writes last into a ``checkpoint-N`` folder: a folder without it is not HF's."""

_LAST_TRAIN_STOPPED = False


def stopped() -> bool:
    """Whether the latest ``train()`` of a Trainer with a :class:`CyclerCallback` ended at a stop
    (its checkpoint committed) rather than at the end of training."""
    return _LAST_TRAIN_STOPPED


class _Stopped(BaseException):
    """Unwinds HF's training loop after the stop's commit. A BaseException, so that a script's
    ``except Exception`` around a step cannot swallow it."""


def keep_last_of(save_total_limit: int | None) -> int:
    """The saver's ``keep_last`` for HF's ``save_total_limit``: ``N >= 1`` keeps the newest N;
    ``None``, 0 or below keeps every checkpoint, as HF's own rotation does (it rotates only
    above 0). A negative limit had reached the saver as ``keep_last`` and was refused."""
    return save_total_limit if save_total_limit is not None and save_total_limit > 0 else -1


class CyclerCallback(TrainerCallback):
    """Gives a ``transformers.Trainer`` cycler's stop, commit and exact resume (module docstring).

    Args:
        checkpoint_dir: the checkpoint root; default ``cycle run``'s (``$CYCLER_CHECKPOINT_DIR``).
        exit_on_stop: after a stop's commit, exit the process with 0 (True) or return from
            ``train()`` with :func:`stopped` true (False).
        every_steps, every_seconds: checkpoint on a timer as well as on ``cycle run``'s
            requests (:class:`~cycler.StepControl`); HF's ``save_steps`` keeps working besides.
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None = None, *,
                 exit_on_stop: bool = True, every_steps: EverySteps = None,
                 every_seconds: float | None = None) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.exit_on_stop = exit_on_stop
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.stopped = False
        """Whether the latest ``train()`` ended at a stop."""
        self.trainer: Trainer | None = None
        self._saver: AtomicDirectory | None = None
        self._control: StepControl | None = None
        self._loss: Any = None
        """The step's loss so far: its micro-batches' (detached) losses summed on their
        device, read by the step's fingerprint without a sync."""
        self._saved_at = -1

    def attach(self, trainer: Trainer) -> None:
        """Take over ``trainer``'s ``train`` and its checkpoint saves (done when the Trainer
        is built with this callback; call it yourself only after ``add_callback``)."""
        if self.trainer is trainer:
            return
        self.trainer = trainer
        _replace_jit_checkpoint(trainer)
        hf_train, hf_save = trainer.train, trainer._save_checkpoint
        hf_step = trainer.training_step
        # Instance attributes over the methods: this Trainer only, and no subclass to adopt.
        vars(trainer)["train"] = lambda *args, **kwargs: self._train(hf_train, *args, **kwargs)
        vars(trainer)["training_step"] = lambda *args, **kwargs: self._keep_loss(
            hf_step(*args, **kwargs))
        vars(trainer)["_save_checkpoint"] = lambda model, trial, *args, **kwargs: self._save(
            hf_save, model, trial, *args, **kwargs)

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.attach(_calling_trainer(sys._getframe(1)))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            raise ConfigError("CyclerCallback was added after the Trainer was built: pass it in "
                              "Trainer(callbacks=[CyclerCallback()]) or call "
                              "callback.attach(trainer) before train()")
        self._control = StepControl(start_step=state.global_step, every_steps=self.every_steps,
                                    every_seconds=self.every_seconds)
        # The Trainer wrapped the model (DDP) and no forward ran yet: the last moment its buckets
        # can take the layout of every later step (docs/saving.md, "DDP at three ranks or more").
        settle_fresh_ddp_buckets(self.trainer.model_wrapped)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        assert self._control is not None, "on_train_begin comes first"
        loss, self._loss = self._loss, None
        decision = self._control.step(loss=loss)
        if decision.checkpoint:
            control.should_save = True
        if decision.stop:
            self.stopped = True
            control.should_training_stop = True
        return control

    def _keep_loss(self, loss: Any) -> Any:
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            kept = loss.detach()
            self._loss = kept if self._loss is None else self._loss + kept
        return loss

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopped:
            # The stop's save was not made at its step (save_strategy="best" replaced the
            # request by "is this the best?"): make it now, before anything else runs.
            assert self.trainer is not None
            self.trainer._save_checkpoint(self.trainer.model_wrapped, None)

    def saver(self) -> AtomicDirectory:
        """The saver every checkpoint of this Trainer is committed with (created on first use,
        once the process group exists)."""
        if self._saver is None:
            assert self.trainer is not None
            root = self.checkpoint_dir or default_checkpoint_root()
            keep_last = keep_last_of(self.trainer.args.save_total_limit)
            self._saver = AtomicDirectory(root, keep_last=keep_last)
        return self._saver

    def latest_checkpoint(self) -> str | None:
        """HF's ``checkpoint-N`` folder inside the newest committed checkpoint, or None."""
        latest = self.saver().latest_checkpoint()
        if latest is None:
            return None
        folders = sorted(Path(latest).glob(f"{PREFIX_CHECKPOINT_DIR}-*/{TRAINER_STATE}"))
        if not folders:
            raise ConfigError(f"the checkpoint {latest} holds no Hugging Face "
                              f"{PREFIX_CHECKPOINT_DIR}-N folder: was it written by another "
                              f"script? Give this Trainer its own checkpoint_dir")
        return str(folders[-1].parent)

    def _train(self, hf_train: Any, resume_from_checkpoint: str | bool | None = None,
               *args: Any, **kwargs: Any) -> TrainOutput:
        global _LAST_TRAIN_STOPPED
        if resume_from_checkpoint is None or resume_from_checkpoint is True:
            resume_from_checkpoint = self.latest_checkpoint()
        self.stopped = _LAST_TRAIN_STOPPED = False
        try:
            output = hf_train(resume_from_checkpoint, *args, **kwargs)
        except _Stopped:
            _LAST_TRAIN_STOPPED = True
            self._close()
            if self.exit_on_stop:
                raise SystemExit(0) from None
            assert self.trainer is not None
            return TrainOutput(self.trainer.state.global_step, float("nan"), {"stopped": True})
        self._close()
        assert self.trainer is not None
        if under_verify() and self._saved_at != self.trainer.state.global_step:
            # cycle verify compares the state training ends with: commit it.
            self.trainer._save_checkpoint(self.trainer.model_wrapped, None)
        return output

    def _save(self, hf_save: Any, model: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
        trainer, saver = self.trainer, self.saver()
        assert trainer is not None
        state = trainer.state
        pin = bool(trainer.args.load_best_model_at_end and _best_when_saved(
            trainer, kwargs.get("metrics", args[0] if args else None)))
        directory = saver.prepare_checkpoint_directory(force_save=pin)
        # HF writes <output dir>/checkpoint-N: the output dir of this one save is the directory
        # being committed, so HF's files, names and resume stay its own.
        vars(trainer)["_get_output_dir"] = lambda trial: directory
        try:
            hf_save(model, trial, *args, **kwargs)
        finally:
            del trainer._get_output_dir
        saver.symlink_latest(directory, metadata={"step": state.global_step,
                                                  "epoch": int(state.epoch or 0)})
        self._saved_at = state.global_step
        if self.stopped:
            raise _Stopped

    def _close(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None


def _best_when_saved(trainer: Trainer, metrics: dict[str, float] | None) -> bool:
    """Whether the save about to be made holds the best model so far: newer transformers
    decide it before the save (``state.best_global_step``), older ones (4.45) inside it, from
    the metrics the save is given (the same comparison here)."""
    state, args = trainer.state, trainer.args
    if hasattr(state, "best_global_step"):
        return bool(state.best_global_step == state.global_step)
    if metrics is None or args.metric_for_best_model is None:
        return False
    name = args.metric_for_best_model
    value = metrics.get(name if name.startswith("eval_") else f"eval_{name}")
    if value is None:
        return False
    if state.best_metric is None or state.best_model_checkpoint is None:
        return True
    return bool(value > state.best_metric if args.greater_is_better else
                value < state.best_metric)


def _replace_jit_checkpoint(trainer: Trainer) -> None:
    """Under ``cycle run``, HF's own ``enable_jit_checkpoint`` gives way to cycler's stop.

    HF's SIGTERM handler makes each rank save after its own 3 s timer, at whatever step that
    rank is in, and then ends ``train()`` as if training were done; the stop ``cycle run``
    asks for is saved at a step every rank agrees on, and ends it as a stop. Where a SIGTERM
    reaches the workers directly (Slurm signals every process of a job), both would run: HF's
    handler is taken away again, and cycler's shield ignores that signal
    (:mod:`cycler.protocol.stop_signals`). Without ``cycle run`` HF's handler stays.
    """
    if not trainer.args.__dict__.get("enable_jit_checkpoint") or \
            not os.environ.get(ENV_CONTROL_FILE):
        return
    for callback in trainer.callback_handler.callbacks:
        manager = getattr(callback, "jit_manager", None)
        if manager is None or threading.current_thread() is not threading.main_thread():
            continue
        previous = manager._original_sigterm_handler
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        callback.jit_manager = None
        print("cycler: enable_jit_checkpoint=True is replaced by cycle run's stop: a SIGTERM "
              "is checkpointed at a step every rank agrees on", file=sys.stderr, flush=True)


def _calling_trainer(frame: FrameType | None) -> Trainer:
    """The Trainer whose ``__init__`` is on the stack (it calls ``on_init_end``, which gets no
    reference to it)."""
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    raise ConfigError("CyclerCallback.on_init_end was not called by a Trainer: pass the callback "
                      "in Trainer(callbacks=[CyclerCallback()])")
