"""``cycle verify``: run the script uninterrupted and interrupted, compare, name the cause.

1. The reference: ``cycle run`` of the user's command to its end, every commit kept.
2. The interrupted run: the same command, stopped (and killed) at planned steps after the
   reference's first checkpoint, started again after each stop as a requeue would.
3. Its first segment, before any interruption, is the script run twice: a checkpoint that
   differs there means the script is not deterministic, and no resume is blamed (checked as
   soon as that segment ends, so a nondeterministic script costs one segment more, not a run).
   A number or string that differs there outside the RNG and the data position is a record
   of the run (a wall-clock time under a name of the script's own), left out from then on.
4. Every step both runs committed is compared, oldest first; the first that differs is
   reported relative to the resume before it, with the part most likely not restored.
"""

from __future__ import annotations

import itertools
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cycler.errors import ConfigError, CyclerError
from cycler.protocol.exit_codes import EXIT_USAGE
from cycler.verify.capture import Captured
from cycler.verify.causes import (
    CAUSES,
    Cause,
    ddp_rounding,
    mid_accumulation,
    name_cause,
    part_of,
    part_of_difference,
    saved_parts,
)
from cycler.verify.compare import (
    CheckpointDiff,
    Difference,
    compare_checkpoints,
    leaves,
    load_unit,
    units,
)
from cycler.verify.matching import Pair, pair_checkpoints
from cycler.verify.plan import Interruption, ReferenceShape, plan_interruptions
from cycler.verify.records import ONLY_ONE_RUN, VARIES, Skipped, record_file
from cycler.verify.result import (
    DIFFERENT,
    IDENTICAL,
    NONDETERMINISTIC,
    FirstDifference,
    VerifyResult,
)
from cycler.verify.runner import Progress, Resume, Runner, RunRecord
from cycler.verify.scratch import make_scratch
from cycler.verify.went_back import judge_went_back

NEEDS = ("verify compares the checkpoints a run commits with cycler's savers: save with "
         "AtomicDirectory(default_checkpoint_root()) and commit at least "
         "two checkpoints during the run")


class NothingToVerify(CyclerError):
    """The script commits too few cycler checkpoints for verify to compare anything."""

    exit_code = EXIT_USAGE


class Interrupted(CyclerError):
    """Ctrl-C: the runs were stopped at once (exit 130, as a shell reports SIGINT)."""

    exit_code = 130


@dataclass(frozen=True, kw_only=True)
class VerifyOptions:
    """What ``cycle verify`` runs and how it interrupts it."""

    run_args: list[str]
    """``cycle run`` options, then SCRIPT and its arguments (passed through unchanged)."""
    cycle_run: Sequence[str] = ()
    """The command that starts ``cycle run`` (given by the CLI, which is what knows it)."""
    stops: int = 3
    """Stops (the stop signal, then a fresh start) of the interrupted run."""
    kills: int = 0
    """kill -9 of a worker (cycle run restarts it) in the interrupted run."""
    seed: int | None = None
    """Seed of the choice of interruption steps (``None``: a random one, reported)."""
    determinism_check: bool = True
    """Report differences before the first interruption as nondeterminism, not as a resume's."""
    scratch_dir: Path | None = None
    """A private directory (0700) to keep the runs in (default: one under the system's tmp)."""
    keep: bool = False
    """Keep the runs' checkpoints even when identical."""
    caller_imports: Path | None = None
    """A directory the runs import from although they work elsewhere (the caller's, for a
    module run with ``-m``)."""

    def __post_init__(self) -> None:
        if not self.cycle_run:
            raise ConfigError("cycle verify needs the command that starts cycle run")
        if not self.run_args:
            raise ConfigError("cycle verify needs the script to run: cycle verify [OPTIONS] "
                              "SCRIPT [ARGS]...")
        if self.stops < 0 or self.kills < 0 or self.stops + self.kills == 0:
            raise ConfigError(f"--stops ({self.stops}) and --kills ({self.kills}) must not be "
                              "negative and at least one must be positive")


Compared = Callable[[int, int], None]


def verify(options: VerifyOptions, progress: Progress = lambda name, step, kept: None,
           compared: Compared = lambda done, total: None) -> VerifyResult:
    """Run, interrupt, compare (see the module's docstring). The scratch directory is removed
    when the runs are identical (unless ``options.keep``) and kept, and named, otherwise."""
    seed = options.seed if options.seed is not None else random.randrange(1 << 31)
    scratch = make_scratch(options.scratch_dir)
    runner = Runner(options.cycle_run, options.run_args, scratch, progress=progress,
                    imports=options.caller_imports)
    try:
        result = _verify(options, runner, seed, compared)
    except ConfigError:
        shutil.rmtree(scratch, ignore_errors=True)  # nothing ran: nothing to look at
        raise
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted: the runs so far are in {scratch}") from None
    result.scratch = scratch
    if result.verdict == IDENTICAL and not options.keep:
        shutil.rmtree(scratch, ignore_errors=True)
        result.scratch = None
    return result


def _verify(options: VerifyOptions, runner: Runner, seed: int,
            compared: Compared) -> VerifyResult:
    reference = runner.run("reference")
    kept = reference.capture.kept
    if len(kept) < 2:
        raise NothingToVerify(f"the script committed {len(kept)} cycler checkpoint"
                              f"{'' if len(kept) == 1 else 's'} ({NEEDS}); its runs are in "
                              f"{runner.scratch}")
    plan, count_delay = _plan(reference, options, seed)
    result = VerifyResult(IDENTICAL, [reference], seed, runner.scratch,
                          determinism_check=options.determinism_check)
    ignored = idle_streams(kept[0], kept[-1])

    def deterministic_so_far(interrupted: RunRecord) -> bool:
        if not options.determinism_check or interrupted.capture.segment != 1:
            return True
        compare_pairs(reference, interrupted, result, compared, ignored, segments=1)
        return result.verdict == IDENTICAL

    interrupted = runner.run("interrupted", plan, count_delay=count_delay,
                             go_on=deterministic_so_far)
    result.runs.append(interrupted)
    if result.verdict == IDENTICAL:
        judge_went_back(reference, interrupted, result, ignored)
    if result.verdict == IDENTICAL:
        last = compare_pairs(reference, interrupted, result, compared, ignored)
        if result.verdict == IDENTICAL and interrupted.finished:
            compare_ends(reference, interrupted, result, last, {key for _, key in ignored})
    if result.verdict == IDENTICAL and not any(segment > 0 for _, segment, _ in result.compared):
        if plan and interrupted.finished and interrupted.starts == 1:
            raise NothingToVerify(f"the run ended (step {interrupted.last_step}) before its first "
                                  "interruption took effect: its steps are too short to "
                                  "interrupt; run more or longer steps (the runs are in "
                                  f"{runner.scratch})")
        raise NothingToVerify("no checkpoint after a resume could be compared with the "
                              f"reference's: {why_unpaired(reference, interrupted)} (the runs "
                              f"are in {runner.scratch})")
    _note(result, reference, interrupted, plan_size=len(plan))
    return result


def why_unpaired(reference: RunRecord, interrupted: RunRecord) -> str:
    """Why no checkpoint after a resume has a counterpart, and what to do."""
    after = [c.step for c in interrupted.capture.kept if c.segment > 0 and c.step is not None]
    theirs = {c.step for c in reference.capture.kept}
    if after and not theirs & set(after):
        resumed = interrupted.resumes[0].from_step if interrupted.resumes else None
        start = min(after) if resumed is None else resumed
        shown = sorted(s for s in theirs if s is not None and s > start)[:5]
        return (f"after its resume the interrupted run committed at steps {after[:5]}, the "
                f"uninterrupted run at {shown}: no step in common (a schedule that follows the "
                "clock shifts them, as does a StepControl whose state_dict is not restored); "
                "commit at fixed steps (StepControl(every_steps=N)) and restore its state")
    return "commit more often or run longer"


def _plan(reference: RunRecord, options: VerifyOptions,
          seed: int) -> tuple[list[Interruption], float]:
    """The interruptions, and the delay after a commit for those planned by commit count (half
    the reference's mean interval between commits)."""
    kept = reference.capture.kept
    shape = ReferenceShape([c.step for c in kept], [c.manifest.epoch for c in kept],
                           reference.last_step)
    plan = plan_interruptions(shape, stops=options.stops, kills=options.kills, seed=seed)
    gaps = [b.manifest.created_at - a.manifest.created_at for a, b in itertools.pairwise(kept)]
    return plan, sum(gaps) / len(gaps) / 2


def idle_streams(first: Captured, last: Captured) -> set[tuple[str, tuple[str, ...]]]:
    """The RNG state leaves that never change during the reference run: streams the script
    never draws from (Python's ``random`` and numpy's, seeded by the OS at start-up, are saved
    by ``capture_rng_state`` whether used or not). They differ between any two runs and do not
    matter, so they are left out of every comparison."""
    files = sorted({*first.manifest.files, *last.manifest.files})
    diff = compare_checkpoints(first.path, last.path, files, trusted=True)
    changed = {(d.file, d.key) for d in diff.differences}
    return {(file, key) for file, key in diff.keys
            if part_of(file, key, (file, key) in diff.weights) == "rng"
            and (file, key) not in changed}


def seen_to_vary(diff: CheckpointDiff) -> list[Difference]:
    """The leaves of a comparison of two uninterrupted runs that are records of the run: plain
    numbers or strings outside the RNG and the data position (a wall-clock time, whatever its
    name). A tensor, an RNG state or a data position differing there is nondeterminism."""
    return [d for d in diff.differences
            if d.scalar and part_of_difference(d) not in ("rng", "data")]


def compare_pairs(reference: RunRecord, interrupted: RunRecord, result: VerifyResult,
             compared: Compared, ignored: set[tuple[str, tuple[str, ...]]],
             segments: int | None = None) -> CheckpointDiff | None:
    """Compare the pairs not compared yet (of the first ``segments`` only), oldest first,
    until the first difference; returns the last comparison. ``ignored`` (idle RNG streams)
    grows by what two uninterrupted runs are seen to vary in (:func:`seen_to_vary`)."""
    diff = None
    done = len(result.compared)
    # Not the first ``done`` pairs: a checkpoint kept after the determinism check (the memory
    # tier's, seen late) may pair before the pairs it compared.
    pairs = [pair for pair in pair_checkpoints(reference.capture.kept, interrupted.capture.kept)
             if (pair.reference.path, pair.interrupted.path) not in result.paired]
    if segments is not None:
        pairs = [pair for pair in pairs if pair.interrupted.segment < segments]
    for number, pair in enumerate(pairs, start=done + 1):
        compared(number, done + len(pairs))
        mine, theirs = pair.reference, pair.interrupted
        result.paired.add((mine.path, theirs.path))
        files = sorted({*mine.manifest.files, *theirs.manifest.files})
        diff = compare_checkpoints(mine.path, theirs.path, files, trusted=True).without(ignored)
        if theirs.segment == 0:
            varies = seen_to_vary(diff)
            ignored |= {(d.file, d.key) for d in varies}
            diff = diff.without(ignored)
            result.note_skipped([Skipped(d.where(), VARIES) for d in varies])
        result.compared.append((pair.moment, theirs.segment, diff.identical))
        result.note_skipped(diff.skipped)
        if theirs.step is not None:
            result.last_step_compared = theirs.step
        if theirs.segment == 0:
            result.determinism_checked += 1
        if not diff.identical:
            _differs(result, interrupted, pair, diff)
            return diff
    return diff


def compare_ends(reference: RunRecord, interrupted: RunRecord, result: VerifyResult,
                  last: CheckpointDiff | None, varying: set[tuple[str, ...]]) -> None:
    """Compare what the two runs left in their working directories at the end of training
    (the files a script writes after its loop, ``final.pt``), when they left anything; the
    ``varying`` key paths (records in the checkpoints) are records there too."""
    mine, theirs = set(_files_in(reference.workdir)), set(_files_in(interrupted.workdir))
    # Only in one run, with a number in its name (a time, a pid, a start count): a record.
    # Without one (final.pt), its absence from the other run is a difference.
    generated = {name for name in mine ^ theirs if any(c.isdigit() for c in name)}
    result.note_skipped([Skipped(name, record_file(name, in_workdir=True) or ONLY_ONE_RUN)
                         for name in sorted(generated)])
    files = sorted((mine | theirs) - generated)
    if not files:
        return
    diff = compare_checkpoints(reference.workdir, interrupted.workdir, files, trusted=True,
                               workdirs=True)
    diff = diff.without({(d.file, d.key) for d in diff.differences if d.key in varying})
    end = interrupted.last_step if interrupted.last_step >= 0 else None
    if _state_shown_equal(diff, end, result.last_step_compared):
        records = [d for d in diff.differences if d.scalar]
        diff = diff.without({(d.file, d.key) for d in records})
        result.note_skipped([Skipped(d.where(), AT_THE_END) for d in records])
    result.note_skipped(diff.skipped)
    result.compared.append(("the end of training", interrupted.capture.segment, diff.identical))
    if diff.identical:
        if end is not None and diff.keys:
            result.last_step_compared = max(result.last_step_compared or 0, end)
        return
    result.verdict = DIFFERENT
    cause = name_cause(diff, world_size=1, files=files, checkpoint=last)
    resume = interrupted.resumes[-1] if interrupted.resumes else None
    result.first = FirstDifference(end, "the end of training (the files the runs left in their "
                                   "working directories)", "work/", diff, cause, resume,
                                   len(interrupted.resumes))


AT_THE_END = ("a number or string that differs at the end of training while the state is seen "
              "equal there (every tensor the runs wrote, or a checkpoint of the last step): a "
              "throughput, a timing, a run id")


def _state_shown_equal(diff: CheckpointDiff, end: int | None, compared_to: int | None) -> bool:
    """Whether the end files' differences can only be records: plain numbers or strings while
    the training state is seen equal at the end (the end files hold tensors and none differs,
    or the last checkpoint compared identical was taken at the run's last step)."""
    if not diff.differences or not all(d.scalar for d in diff.differences):
        return False
    return diff.tensors > 0 or (end is not None and compared_to == end)


def _files_in(directory: Path) -> list[str]:
    return [str(path.relative_to(directory)) for path in sorted(directory.rglob("*"))
            if path.is_file() and not path.is_symlink()]


def _differs(result: VerifyResult, interrupted: RunRecord, pair: Pair,
             diff: CheckpointDiff) -> None:
    theirs = pair.interrupted
    before_any = theirs.segment == 0
    result.verdict = NONDETERMINISTIC if before_any and result.determinism_check else DIFFERENT
    if result.verdict == NONDETERMINISTIC:
        cause = nondeterminism(diff)
    else:
        cause = name_cause(diff, world_size=theirs.manifest.world_size,
                           files=theirs.manifest.files)
    resume = None if before_any else interrupted.resumes[theirs.segment - 1]
    if resume is not None and result.verdict == DIFFERENT:
        cause = _accumulation(interrupted, resume) or ddp_rounding(
            diff, theirs.manifest.world_size) or cause
    result.first = FirstDifference(theirs.step, pair.moment, theirs.name, diff, cause, resume,
                                   theirs.segment)


def _accumulation(interrupted: RunRecord, resume: Resume) -> Cause | None:
    """The accumulated gradients, where the checkpoint the run resumed from was taken in the
    middle of a gradient accumulation (what differs then is downstream of it: the weights)."""
    taken = [c for c in interrupted.capture.kept if c.name == resume.from_name]
    if not taken:
        return None
    counters = {(unit, *key): value for unit in units(list(taken[-1].manifest.files))
                for key, value in leaves(load_unit(taken[-1].path, unit, trusted=True))
                if isinstance(value, int)}
    why = mid_accumulation(counters)
    if why is None:
        return None
    part, fix = CAUSES["accumulation"]
    return Cause("accumulation", part, why, fix)


def nondeterminism(diff: CheckpointDiff) -> Cause:
    """Which kind of nondeterminism two uninterrupted runs show."""
    shown = next((d for d in diff.differences if part_of_difference(d) in ("rng", "data")),
                 None)
    if shown is not None:
        return Cause("unseeded", "unseeded randomness", "the RNG state or the data order "
                     "differs between two runs that were never interrupted",
                     "seed every generator from a fixed seed (torch.manual_seed(seed), the "
                     "sampler's seed=, the DataLoader's generator=) "
                     "(docs/verify.md#a-nondeterministic-script)", shown)
    if "rng" not in saved_parts(diff):
        return Cause("unseeded", "unseeded randomness or nondeterministic kernels", "the "
                     "tensors differ between two runs that were never interrupted, and the "
                     "checkpoint holds no RNG state to tell whether the random streams did",
                     "seed every generator from a fixed seed (torch.manual_seed(seed), the "
                     "sampler's seed=, the DataLoader's generator=); if they are, "
                     "torch.use_deterministic_algorithms(True) and "
                     "CUBLAS_WORKSPACE_CONFIG=:4096:8 (docs/verify.md#a-nondeterministic-script)")
    return Cause("kernels", "nondeterministic kernels", "the RNG and data are equal but the "
                 "tensors differ between two runs that were never interrupted",
                 "torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8 "
                 "make kernels deterministic (docs/verify.md#a-nondeterministic-script)")


def _note(result: VerifyResult, reference: RunRecord, interrupted: RunRecord,
          plan_size: int) -> None:
    for run in (reference, interrupted):
        if run.capture.missed:
            result.notes.append(f"{run.name}: {len(run.capture.missed)} checkpoint(s) removed "
                                "by the script's retention before verify kept them")
    if interrupted.finished and len(interrupted.resumes) < plan_size:
        result.notes.append(f"{plan_size - len(interrupted.resumes)} interruption(s) came after "
                            "the run ended: fewer were tested")
    if any(c.step is None for c in reference.capture.kept):
        result.notes.append("the manifests carry no step: checkpoints were matched by the "
                            "data position they hold, else by commit order (pass "
                            'metadata={"step": ...} to the commit)')
    compared_to, ran_to = result.last_step_compared, interrupted.last_step
    if result.verdict == IDENTICAL and compared_to is not None and ran_to > compared_to:
        result.notes.append(f"the last state compared is the checkpoint of step {compared_to}; "
                            f"the workers counted {ran_to} StepControl steps: training after "
                            "the last checkpoint is compared only where the script commits or "
                            "writes its final state (integrations and LoopState commit it "
                            "under verify; else save it, or write final.pt in the working "
                            "directory)")
    ended, stopped = (_newest_step(run) for run in (reference, interrupted))
    # A later last checkpoint may be a stop's; an earlier one means steps were skipped.
    if result.verdict == IDENTICAL and interrupted.finished and ended is not None \
            and stopped is not None and stopped < ended:
        result.verdict = DIFFERENT
        result.notes.append(f"the interrupted run ended at step {stopped}, before the "
                            f"uninterrupted run's last checkpoint (step {ended}): "
                            f"{CAUSES['counters'][1]}")


def _newest_step(run: RunRecord) -> int | None:
    newest = run.capture.newest()
    return None if newest is None else newest.step
