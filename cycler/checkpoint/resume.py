"""Which checkpoint every rank resumes from: one choice, agreed through the store, each rank
verifying only its own share of the data.

Rank 0 lists the candidates in the order a resume takes them (the latest link's target, then
the rest newest first, sizes checked and the checkpoints a resume already found corrupt left
out). For each candidate in turn every rank checks the checksums of its share of the files
(the same share it fsyncs and checksums at a commit: its own DCP shards and an even part of the
rest) and reports through the store; the first candidate that every rank verified is the one
all of them load. A rank whose share fails makes all fall back together, so W ranks read the
checkpoint once between them, and no two ranks ever resume from different checkpoints.

Under the memory tier the candidates of both tiers are tried newest first, the memory copy
before the durable one of the same index: a memory copy that fails its checksums falls back to
the durable copy of the same checkpoint, then to older ones.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from cycler.checkpoint.coordination import Coordinator
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName
from cycler.checkpoint.listing import (
    LEGACY,
    Checkpoint,
    CheckpointWarning,
    by_index,
    find_checkpoint,
    inspect_checkpoint,
    latest_checkpoint,
    say_none_is_valid,
    with_record,
)
from cycler.checkpoint.manifest import (
    Manifest,
    check_files,
    files_of_rank,
    read_manifest,
)
from cycler.checkpoint.tiers import newest_of
from cycler.checkpoint.verification import failed_verifications, record_failed_verification
from cycler.errors import CheckpointNotFound, CorruptCheckpoint, CyclerError
from cycler.protocol.environment import ENV_RESUME_FROM

VERIFIED = "ok"
"""A verification round's outcome when every rank's share verified."""


def agreed_checkpoint(tiers: Sequence[CheckpointLayout], coordinator: Coordinator,
                      requested: str | None = None, strict: bool = False) -> Path | None:
    """On every rank: the checkpoint all ranks resume from, ``None`` when there is none.

    ``tiers``: where the saver's checkpoints may be, memory first, the checkpoint root last.
    ``requested`` (a name or an index; default ``$CYCLER_RESUME_FROM`` when it names one of
    this saver's checkpoints) must verify, else :class:`CorruptCheckpoint`. Without a
    request, what :func:`cycler.latest_checkpoint` would choose, warnings and ``strict``
    included.
    """
    layout = tiers[-1]
    requested = requested if requested is not None else requested_by_environment(tiers)
    if coordinator.world_size == 1:
        if requested is not None:
            return _found_in_a_tier(tiers, requested)
        found = [latest_checkpoint(t.root, t.prefix, strict=strict and len(tiers) == 1)
                 for t in tiers]
        newest = newest_of(layout, found)
        if newest is None and strict and len(tiers) > 1:
            return latest_checkpoint(layout.root, layout.prefix, strict=True)
        return newest
    plan = _shared_plan(tiers, coordinator, requested)
    problems = {str(name): str(problem) for name, problem in plan["invalid"]}
    for tier, name, legacy in plan["candidates"]:
        where = tiers[int(str(tier))]
        outcome = _verified_together(where, coordinator, str(name), bool(legacy))
        if outcome is None:
            _say_fell_back(layout, str(name), problems)
            return where.root / str(name)
        problems[str(name)] = outcome
    if requested is not None:
        raise CorruptCheckpoint(f"{requested} in {layout.root}: {problems.get(requested)}; "
                                "pick another with `cycle status`")
    say_none_is_valid(layout, problems, strict)
    return None


def requested_by_environment(tiers: Sequence[CheckpointLayout]) -> str | None:
    requested = os.environ.get(ENV_RESUME_FROM)
    if requested and any(t.parse(requested) or by_index(t, requested) for t in tiers):
        return requested
    return None


def requested_in_a_tier(tiers: Sequence[CheckpointLayout]) -> Path | None:
    """The checkpoint ``$CYCLER_RESUME_FROM`` names (``cycle run --resume-from``), from the
    first tier where it verifies, whichever tier holds it; ``None`` when it names none of this
    saver's checkpoints. Raises what is wrong with it when it is there and does not verify."""
    requested = requested_by_environment(tiers)
    return None if requested is None else _found_in_a_tier(tiers, requested)


def _found_in_a_tier(tiers: Sequence[CheckpointLayout], requested: str) -> Path:
    """The requested checkpoint from the first tier where it verifies."""
    error: CyclerError | None = None
    for tier in tiers:
        try:
            return find_checkpoint(tier.root, requested, tier.prefix, verify=True)
        except CheckpointNotFound as missing:
            error = error or missing
        except CorruptCheckpoint as corrupt:
            error = corrupt
    assert error is not None
    raise error


def _shared_plan(tiers: Sequence[CheckpointLayout], coordinator: Coordinator,
                 requested: str | None) -> dict[str, list[list[object]]]:
    """Rank 0's list of candidates (and of what is not valid), as every rank gets it."""
    plan = coordinator.decide(coordinator.new_round("resume"),
                              lambda: json.dumps(_candidates(tiers, requested)))
    shared: dict[str, list[list[object]]] = json.loads(plan)
    return shared


def _candidates(tiers: Sequence[CheckpointLayout], requested: str | None,
                ) -> dict[str, list[list[object]]]:
    """The checkpoints to try, in order, each with its tier and whether it is legacy; and
    what is wrong with those that cannot be tried (sizes, manifests, earlier verifications)."""
    ranked: list[tuple[tuple[int, int], Checkpoint, int]] = []
    for order, layout in enumerate(tiers):
        failed = failed_verifications(layout)
        for place, name in enumerate(_in_resume_order(layout, requested)):
            checked = with_record(inspect_checkpoint(layout, name), failed)
            # One tier: the link's order. Several: newest first, memory first on a tie.
            key = (place, order) if len(tiers) == 1 else (-name.index, order)
            ranked.append((key, checked, order))
    if requested is not None and not ranked:
        raise CheckpointNotFound(f"no checkpoint named {requested!r} in "
                                 f"{' or '.join(str(t.root) for t in tiers)}; see `cycle status`")
    ranked.sort(key=lambda entry: entry[0])
    return {"candidates": [[order, str(c.name), c.kind == LEGACY]
                           for _, c, order in ranked if c.valid],
            "invalid": [[str(c.name), c.problem] for _, c, _ in ranked
                        if not c.valid and c.committed]}


def _in_resume_order(layout: CheckpointLayout, requested: str | None) -> list[CheckpointName]:
    """The requested checkpoint if this tier has it; else the link's target, then the rest
    newest first."""
    if requested is not None:
        parsed = layout.parse(requested) or by_index(layout, requested)
        return [parsed] if parsed is not None and os.path.lexists(layout.path_of(parsed)) else []
    target = layout.link_target_name()
    every = list(reversed(layout.checkpoint_names()))
    return ([target] if target in every else []) + [n for n in every if n != target]


def _verified_together(layout: CheckpointLayout, coordinator: Coordinator, name: str,
                       legacy: bool) -> str | None:
    """Every rank checks its share of ``name``; ``None`` if all verified, else what failed."""
    mine = "" if legacy else (_share_of_rank(layout.root / name, coordinator) or "")

    def recorded(problems: list[str]) -> str:
        outcome = first_problem(problems)
        parsed = layout.parse(name)
        if DAMAGED in outcome and parsed is not None:  # files that fail the manifest
            record_failed_verification(layout, parsed, outcome)
        return outcome

    outcome = coordinator.decide_from_all(coordinator.new_round("resume-check"), mine, recorded)
    return None if outcome == VERIFIED else outcome


def first_problem(problems: list[str]) -> str:
    """Rank 0's decision of a round where every rank reports what failed (``""``: nothing):
    the first rank's problem, or :data:`VERIFIED`."""
    return next((problem for problem in problems if problem), VERIFIED)


def _share_of_rank(path: Path, coordinator: Coordinator) -> str | None:
    try:
        manifest = read_manifest(path)
    except (OSError, CyclerError) as error:
        return f"rank {coordinator.rank}: {error}"
    return share_problem(path, manifest, coordinator.rank, coordinator.world_size,
                         f"rank {coordinator.rank}")


def share_problem(directory: Path, manifest: Manifest, rank: int, ranks: int,
                  who: str) -> str | None:
    """The checksums of ``rank``'s share (of ``ranks``) of ``directory``'s files under
    ``manifest``, the same share it records at a commit; what failed, said as ``who``'s."""
    share = files_of_rank(sorted(manifest.files), rank, ranks)
    try:
        problem = check_files(directory, replace(manifest, files={
            file: manifest.files[file] for file in share}), checksums=True)
    except (OSError, CyclerError) as error:
        return f"{who}: {error}"
    return None if problem is None else f"{who}: {DAMAGED}{problem}"


DAMAGED = "damaged: "
"""Begins a rank's problem with its share when its files fail the manifest (recorded), as
opposed to a read that failed (not recorded: it may pass next time)."""


def _say_fell_back(layout: CheckpointLayout, chosen: str, problems: dict[str, str]) -> None:
    newer = {name: problem for name, problem in problems.items()
             if _index(layout, name) > _index(layout, chosen)}
    if newer:
        why = "; ".join(f"{name}: {problem}" for name, problem in newer.items())
        warnings.warn(f"{why}; using {chosen} instead", CheckpointWarning, stacklevel=3)


def _index(layout: CheckpointLayout, name: str) -> int:
    parsed = layout.parse(name)
    return -1 if parsed is None else parsed.index
