"""Name the likely cause of a difference after a resume, from what differs first.

Training state flows one way within a step: the random streams and the data position decide
what a step computes, the scheduler sets the learning rate, the scaler the loss scale, and the
optimizer turns gradients into the model's next weights. So the most upstream part that differs
is the likely cause, and the model differing alone (everything upstream equal) points at the
model itself. Where nothing upstream differs, what the checkpoint does not save at all is the
likely cause: a checkpoint without RNG state, without a data position, without the optimizer,
or one file for several ranks. Parts are recognised by the names the script gives them
(``rng``, ``sampler``, ``scheduler``, ``scaler``, ``optimizer``...).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cycler.verify.compare import CheckpointDiff, Difference

DOCS = "docs/verify.md"
ROUNDING = 1e-6
"""The largest relative difference that float rounding explains: a sum of the same gradients
in another order differs in the last bits (float32's 1.2e-7), grown over a few steps."""


@dataclass(frozen=True)
class Cause:
    """What most likely was not restored, why verify thinks so, and the docs line that fixes it."""

    name: str
    """One of :data:`CAUSES`' keys."""
    part: str
    """The part in the user's words: ``the RNG streams``."""
    why: str
    fix: str
    evidence: Difference | None = None
    """The difference that shows it, where one does."""

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "part": self.part, "why": self.why, "fix": self.fix}


CAUSES: dict[str, tuple[str, str]] = {
    "rng": ("the RNG streams", "save capture_rng_state() in every rank's own file and call "
            f"restore_rng_state() after loading it ({DOCS}#rng-streams)"),
    "dataloader_seed": ("an unseeded DataLoader", "give the DataLoader its own generator, "
                        "DataLoader(..., generator=torch.Generator().manual_seed(seed)), so "
                        "iter() draws nothing from the saved global RNG "
                        f"({DOCS}#an-unseeded-dataloader)"),
    "data": ("the data position", "save sampler.state_dict() (InterruptableDistributedSampler, "
             "advanced per batch) and load it on resume "
             f"({DOCS}#the-data-position)"),
    "data_order": ("the data order", "a sampler or DataLoader with a torch.Generator of its "
                   "own draws each epoch's order from a state no checkpoint holds: give the "
                   "sampler a seed it reseeds per epoch (InterruptableDistributedSampler(seed="
                   "...), set_epoch) or save generator.get_state() and restore it "
                   f"({DOCS}#the-data-order)"),
    "scheduler": ("the learning-rate scheduler", "save scheduler.state_dict() and load it on "
                  f"resume ({DOCS}#the-scheduler)"),
    "scaler": ("the gradient scaler", "save scaler.state_dict() (torch.amp.GradScaler) and load "
               f"it on resume ({DOCS}#the-scaler)"),
    "optimizer": ("the optimizer", "save optimizer.state_dict() and load it on resume, after "
                  f"building the optimizer over the same parameters ({DOCS}#the-optimizer)"),
    "rank_state": ("a rank's own state", "every rank saves its own file (rank-{rank}.pt: its RNG "
                   "and anything else that differs by rank) and loads its own on resume "
                   f"({DOCS}#a-ranks-own-state)"),
    "counters": ("the step and epoch counters", "save StepControl's and EpochLoop's "
                 f"state_dict() and load them on resume ({DOCS}#the-counters)"),
    "accumulation": ("the gradients accumulated since the last optimizer step",
                     "checkpoint only after an optimizer step: with accumulate_grad_batches=N at "
                     "batches that are multiples of N (.grad is not in any checkpoint, so a "
                     "resume in the middle of an accumulation loses what was summed) "
                     f"({DOCS}#gradient-accumulation)"),
    "not_loaded": ("the checkpoint, never loaded", "at start, load the newest checkpoint "
                   "(saver.latest_checkpoint()) with everything in it, the step counter "
                   f"included, before the first step ({DOCS}#loading-the-checkpoint)"),
    "order_or_unsaved": ("the data order, or state the checkpoint does not hold",
                         "if a sampler or DataLoader has a torch.Generator of its own, give "
                         "it a seed it reseeds per epoch or save generator.get_state() "
                         f"({DOCS}#the-data-order); else save what changes while training "
                         "outside the model's state_dict (a buffer registered with "
                         "persistent=False, a plain attribute) and load it on resume "
                         f"({DOCS}#state-the-checkpoint-does-not-hold)"),
    "unsaved": ("state the checkpoint does not hold", "save every object that changes while "
                "training (an EMA of the weights, a buffer registered with persistent=False, a "
                "variable of the script's own) in the checkpoint and load it on resume "
                f"({DOCS}#state-the-checkpoint-does-not-hold)"),
    "ddp_buckets": ("DDP's gradient buckets, laid out differently after the resume",
                    "call cycler.settle_ddp_buckets(model) on every rank right after "
                    "DistributedDataParallel(...), before the first forward, on every start (the "
                    "integrations do it), or construct DDP with find_unused_parameters=True "
                    "(docs/saving.md#ddp-at-three-ranks-or-more)"),
    "model": ("the model alone, or a part saved beside it", "load every part the checkpoint "
              "saves on resume (model.state_dict(), an EMA of the weights, a metric's state); "
              "a buffer registered with persistent=False or a plain attribute is in no "
              f"state_dict: save it too ({DOCS}#the-model-alone)"),
}
_PARTS: list[tuple[str, re.Pattern[str]]] = [
    ("rng", re.compile(r"rng|random|generator")),
    ("data", re.compile(r"sampler|loader|dataset|data_?position|data_?state")),
    ("scheduler", re.compile(r"sched")),
    ("scaler", re.compile(r"scaler")),
    ("optimizer", re.compile(r"optim|^opt(_state)?$|^param_groups$")),
    ("metrics", re.compile(r"metric|loss|logs?$|history")),
    ("counters", re.compile(r"^(control|epochs?|steps?|global_step|progress|trainer_state)$")),
]
_RANK_FILE = re.compile(r"(?:rank|rng_state|rng|random_states)[-_]?(\d+)")
"""A rank's own file: cycler's ``rank-N.pt``/``rng-N.pt``, HF's ``rng_state_N.pth``,
Accelerate's ``random_states_N.pkl``."""


_NEVER_FLOATING = ("rng", "data", "counters")
"""Parts whose leaves are never floating-point tensors (RNG states are bytes or integers)."""


def part_of(file: str, key: tuple[str, ...], floating: bool = False) -> str:
    """Which part of the training state a leaf belongs to (``model`` when nothing else fits).
    ``floating``: the leaf is a floating-point tensor, so not an RNG state, a data position or
    a counter whatever its name says (a GAN's ``generator.0.weight``, ``upsamplers``)."""
    words = [word.lower() for word in (*key, file.rsplit(".", 1)[0])]
    for part, pattern in _PARTS:
        if floating and part in _NEVER_FLOATING:
            continue
        if any(pattern.search(word) for word in words):
            return part
    return "model"


def part_of_difference(difference: Difference) -> str:
    return part_of(difference.file, difference.key, difference.floating)


def saved_parts(diff: CheckpointDiff) -> set[str]:
    """The parts a checkpoint saves at all (its leaves' parts)."""
    return {part_of(file, key, (file, key) in diff.weights) for file, key in diff.keys}


def name_cause(diff: CheckpointDiff, *, world_size: int, files: Iterable[str],
               checkpoint: CheckpointDiff | None = None) -> Cause:
    """The likely cause of ``diff``, the first differences after a resume. ``checkpoint``: the
    last committed checkpoint, compared identical, when ``diff`` is the end of training (files
    the script wrote after its last checkpoint, which may hold the model alone)."""
    differing = {part_of_difference(d) for d in diff.differences}
    saved = saved_parts(checkpoint or diff)
    upstream = _upstream(diff.differences, differing)
    if upstream is not None:
        name, why, evidence = upstream
    elif checkpoint is not None and "scheduler" not in saved \
            and not _no_scheduler(checkpoint.keys):
        name, evidence = "scheduler", None
        why = ("the last checkpoint is identical and the end of training differs: state the "
               "checkpoint does not hold acted after it, and it holds no scheduler (whose "
               "learning rate changes with the step)")
    elif checkpoint is not None:
        name, evidence = "unsaved", None
        why = (f"the last checkpoint is identical and the end of training differs in "
               f"{', '.join(sorted({d.file for d in diff.differences}))}: state the checkpoint "
               "does not hold acted after it (not a scheduler: "
               + ("the checkpoint saves it" if "scheduler" in saved else "the saved optimizer's "
                  "param_groups carry no initial_lr, which every torch scheduler sets") + ")")
    else:
        held = checkpoint or diff
        trained = any(part_of(file, key, True) == "optimizer" for file, key in held.weights)
        (name, why), evidence = _unsaved(differing, saved, world_size, list(files), held.keys,
                                         trained), None
    part, fix = CAUSES[name]
    return Cause(name, part, why, fix, evidence)


def ddp_rounding(diff: CheckpointDiff, world_size: int) -> Cause | None:
    """DDP's gradient buckets, where the first difference after a resume of 3 or more ranks is
    float rounding alone: only floating-point tensors differ, none by more than
    :data:`ROUNDING` of its values. A fresh DDP sums its first step's gradients in another
    bucket layout than every later step, and a ring all-reduce of 3+ ranks adds each element
    in an order set by its place in the bucket; a state not restored differs by far more."""
    if world_size < 3 or not diff.differences:
        return None
    if not all(d.floating for d in diff.differences):
        return None
    relative = [d.relative for d in diff.differences]
    sizes = [r for r in relative if r is not None]
    if len(sizes) < len(relative) or max(sizes) > ROUNDING:
        return None
    evidence = max(diff.differences, key=lambda d: d.relative or 0.0)
    why = (f"{world_size} ranks ran and only floating-point tensors differ, by {max(sizes):.1e}"
           f" of their values at most (float rounding, not a state left out): the resumed "
           f"process's first step all-reduced its gradients in DDP's initial bucket layout, the "
           f"uninterrupted run's in the one rebuilt after its first step")
    part, fix = CAUSES["ddp_buckets"]
    return Cause("ddp_buckets", part, why, fix, evidence)


def _no_scheduler(keys: Iterable[tuple[str, tuple[str, ...]]]) -> bool:
    """Whether the checkpoint shows that no torch scheduler drives its optimizer: it saves the
    optimizer's ``lr`` and no ``initial_lr`` (which every ``LRScheduler`` adds to it)."""
    names = {key[-1] for file, key in keys if key and part_of(file, key) == "optimizer"}
    return "lr" in names and "initial_lr" not in names


def _upstream(differences: list[Difference],
              differing: set[str]) -> tuple[str, str, Difference] | None:
    """The most upstream part that differs, the reason, and the difference that shows it."""
    def first(test: Callable[[Difference], bool]) -> Difference | None:
        return next((d for d in differences if test(d)), None)

    if "rng" in differing:
        drawn = first(lambda d: d.one_draw_ahead)
        if drawn is not None:
            return "dataloader_seed", ("the resumed run's global RNG is exactly one seed draw "
                                       "ahead: a DataLoader without a generator drew its "
                                       "workers' seed from it when iterated after the "
                                       "resume"), drawn
        shown = first(lambda d: part_of_difference(d) == "rng")
        assert shown is not None
        return "rng", "the saved RNG state differs from the uninterrupted run's", shown
    for part in ("data", "scheduler", "scaler", "counters"):
        shown = next((d for d in differences if part_of_difference(d) == part), None)
        if shown is not None:
            return part, "it differs from the uninterrupted run's", shown
    shown = first(_is_learning_rate)
    if shown is not None:
        return "scheduler", "the learning rate differs and no saved scheduler explains it", shown
    shown = first(lambda d: part_of_difference(d) == "optimizer" and (
        not d.is_tensor or d.key[-1] == "step"))
    if shown is not None:
        return "optimizer", "the optimizer's own bookkeeping (param_groups, step) differs", shown
    return None


def _framework(keys: Iterable[tuple[str, tuple[str, ...]]]) -> str | None:
    """The framework whose checkpoint this is, which loads the optimizer itself, not the
    script: ``lightning`` (``optimizer_states`` beside its ``loops``), ``hf`` (HF Trainer's
    ``optimizer.pt`` beside ``trainer_state.json``), ``accelerate`` (``save_state``'s
    ``optimizer.bin``); ``None`` for a script's own."""
    tops = {(Path(file).name, key[0] if key else "") for file, key in keys}
    names = {name for name, _ in tops}
    if {"optimizer_states", "loops"} <= {top for _, top in tops}:
        return "lightning"
    if "optimizer.pt" in names and "trainer_state.json" in names:
        return "hf"
    if any(re.fullmatch(r"optimizer(_\d+)?\.bin", name) for name in names):
        return "accelerate"
    return None


_KEEPS_ITS_POSITION = ("hf", "lightning")
"""Frameworks whose checkpoint holds the data position in its own counters (HF's
``global_step``, Lightning's loops), under names that are not the data's."""


def _unsaved(differing: set[str], saved: set[str], world_size: int,
             files: list[str], saved_keys: Iterable[tuple[str, tuple[str, ...]]] = (),
             trained: bool = False) -> tuple[str, str]:
    """With nothing upstream differing: the part the checkpoint does not save at all. An
    optimizer whose saved tensors (``trained``: momentum, Adam's moments) are equal shows that
    the gradients, so the RNG and the data, were equal: what differs then was not restored
    itself (an EMA of the weights, a metric)."""
    if trained and "optimizer" not in differing:
        return "model", ("it differs with the optimizer equal, so with the gradients, the "
                         "data and the RNG that fed them equal: it was saved but not restored "
                         "as it was, or it is not in the checkpoint")
    if "rng" not in saved:
        return "rng", "the checkpoint holds no RNG state, so dropout and augmentation draw " \
                      "differently after a resume"
    ranks = {int(m.group(1)) for f in files if (m := _RANK_FILE.search(f.lower()))}
    if world_size > 1 and len(ranks) < world_size:
        return "rank_state", (f"{world_size} ranks ran but the checkpoint holds files of "
                              f"{len(ranks)} of them: the others' own state (RNG) is lost")
    framework = _framework(saved_keys)
    if "data" not in saved and framework not in _KEEPS_ITS_POSITION:
        return "data", "the checkpoint holds no sampler or data position"
    if "optimizer" not in saved:
        return "optimizer", "the checkpoint holds no optimizer state"
    if differing & {"optimizer"} and framework in _KEEPS_ITS_POSITION:
        name = "HF Trainer" if framework == "hf" else "Lightning"
        return "order_or_unsaved", (f"the model and optimizer differ with the RNG, the "
                                    f"position, the learning rate and the counters equal, and "
                                    f"{name} restores its optimizer itself: the batches came "
                                    "in an order the checkpoint does not hold (a sampler "
                                    "with a generator of its own), or the model holds state "
                                    "outside its state_dict; the checkpoints cannot tell "
                                    "these apart")
    if differing & {"optimizer"} and framework is not None:
        return "data_order", ("the model and optimizer differ with the RNG, the loader's "
                              "position, the learning rate and the counters equal, and the "
                              "framework restores its optimizer itself: the batches differed, "
                              "drawn in an order the checkpoint does not hold")
    if differing & {"optimizer"} and _counts_its_steps(saved_keys):
        return "data_order", ("the model and optimizer differ with the RNG, the loader's "
                              "position, the learning rate and the optimizer's own step "
                              "counts equal (so it was restored): the gradients differed, from "
                              "batches drawn in an order the checkpoint does not hold (or a "
                              "model state it lacks)")
    if differing & {"optimizer"}:
        return "optimizer", ("the optimizer's state differs with every input to it (RNG, data "
                             "position, learning rate) equal")
    return "model", "only the model's tensors differ"


def _counts_its_steps(keys: Iterable[tuple[str, tuple[str, ...]]]) -> bool:
    """Whether the saved optimizer counts its steps per parameter (Adam's, AdamW's ``step``):
    equal there, it was restored, since a fresh one counts from 0."""
    return any(key and key[-1] == "step" and part_of(file, key, True) == "optimizer"
               for file, key in keys)


def _is_learning_rate(d: Difference) -> bool:
    return part_of_difference(d) == "optimizer" and bool(d.key) and d.key[-1] in (
        "lr", "initial_lr")


_BATCHES = ("epoch_loop", "batch_progress", "total", "processed")
_OPTIMIZER_STEPS = ("optimizer", "step", "total", "completed")


def mid_accumulation(counters: Mapping[tuple[str, ...], object]) -> str | None:
    """Why a checkpoint was taken in the middle of a gradient accumulation, from the loop
    counters it holds (Lightning's batches processed and optimizer steps: more batches than
    steps means gradients are accumulated, and a batch count that is not a multiple of the
    ratio means some were summed into ``.grad`` and not stepped); ``None`` when it was not or
    the counters are not there."""
    batches = next((v for k, v in counters.items() if k[-4:] == _BATCHES), None)
    steps = next((v for k, v in counters.items() if k[-4:] == _OPTIMIZER_STEPS), None)
    if not isinstance(batches, int) or not isinstance(steps, int) or steps <= 0 \
            or batches <= steps:
        return None
    every = round(batches / steps)
    if every < 2 or batches % every == 0:
        return None
    return (f"the checkpoint it resumed from was taken after {batches} batches but {steps} "
            f"optimizer steps (one every {every} batches): in the middle of an accumulation, "
            "whose summed gradients no checkpoint holds")
