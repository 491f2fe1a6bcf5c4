"""retention_decisions: a pure function, tested with tables of Checkpoint objects, no filesystem."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cycler.checkpoint.layout import CheckpointName
from cycler.checkpoint.listing import Checkpoint, CheckpointState
from cycler.checkpoint.manifest import FileRecord, Manifest
from cycler.checkpoint.retention import (
    beyond_keep_last,
    checked_keep_last,
    memory_decisions,
    retention_decisions,
    stale_replicas,
)

ROOT = Path("/nowhere/root")


def _checkpoint(spec: str) -> Checkpoint:
    """``"7"`` valid, ``"7L"`` latest, ``"7P"`` pinned, ``"7T"`` torn (no manifest), ``"7C"``
    corrupt (manifest, bad files), ``"7S"`` a symlink named like a checkpoint, ``"7F"`` a file;
    flags combine (``"3PT"``: pinned and torn)."""
    index, flags = int(spec.rstrip("LPTCSF")), set(spec.lstrip("0123456789"))
    name = CheckpointName("AtomicDirectory", index, "P" in flags)
    manifest = Manifest(index=index, files={"model.pt": FileRecord(8, "00000000")},
                        created_at=0.0)
    if "T" in flags:
        return Checkpoint(name, ROOT / str(name), None, "no manifest (never committed)")
    if "C" in flags:
        return Checkpoint(name, ROOT / str(name), manifest, "model.pt is missing")
    if "S" in flags or "F" in flags:
        problem = "is a symlink; cycler never follows it" if "S" in flags else "is a file"
        return Checkpoint(name, ROOT / str(name), None, problem, is_directory=False)
    return Checkpoint(name, ROOT / str(name), manifest, None, is_latest="L" in flags)


def _removed(specs: str, **options: object) -> str:
    """The specs (space separated) whose decision is to remove them, in the order given."""
    checkpoints = [_checkpoint(spec) for spec in specs.split()]
    decisions = retention_decisions(checkpoints, **options)  # type: ignore[arg-type]
    assert [d.checkpoint for d in decisions] == checkpoints
    return " ".join(spec for spec, d in zip(specs.split(), decisions, strict=True) if not d.keep)


def test_the_table_helper_builds_checkpoints_in_the_states_it_names() -> None:
    states = [_checkpoint(spec).state for spec in "1 2L 3P 4T 5C 6S 7F 8PT".split()]
    assert states == [CheckpointState.VALID, CheckpointState.LATEST, CheckpointState.PINNED,
                      CheckpointState.INCOMPLETE, CheckpointState.CORRUPT,
                      CheckpointState.CORRUPT, CheckpointState.CORRUPT,
                      CheckpointState.INCOMPLETE]


@pytest.mark.parametrize(("specs", "keep_last", "removed"), [
    ("1 2 3 4L", 1, "1 2 3"),
    ("1 2 3 4L", 2, "1 2"),
    ("1 2 3 4L", 3, "1"),
    ("1 2 3 4L", 4, ""),
    ("1 2 3 4L", 10, ""),
    ("1 2 3 4L", -1, ""),
    ("1 2 3 4L", 0, "1 2 3"),
    ("4L", 1, ""),
    ("", 1, ""),
    ("1 2L 3 4", 1, "1"),
    ("1 2L 3 4", 2, ""),
    ("5 1 9L 3", 2, "1 3"),
])
def test_keep_last_counts_the_latest_and_keeps_the_newest_older_valid_ones(
        specs: str, keep_last: int, removed: str) -> None:
    assert _removed(specs, keep_last=keep_last) == removed


@pytest.mark.parametrize(("specs", "keep_last", "removed"), [
    ("1P 2P 3 4L", 1, "3"),
    ("1P 2 3P 4L", 2, ""),
    ("1 2 3P 4L", 2, "1"),
    ("1PT 2PC 3L", 1, ""),
    ("1P 2L 3PT", 1, ""),
])
def test_pinned_checkpoints_are_kept_valid_or_not_and_do_not_use_keep_last(
        specs: str, keep_last: int, removed: str) -> None:
    assert _removed(specs, keep_last=keep_last) == removed


@pytest.mark.parametrize("specs", ["1S 2F 3L", "1 2S 3F 4L 5S 6F"])
def test_symlinks_and_files_named_like_checkpoints_are_never_removed(specs: str) -> None:
    assert "S" not in _removed(specs, keep_last=1, writer_active=False)
    assert "F" not in _removed(specs, keep_last=1, writer_active=False)


@pytest.mark.parametrize(("specs", "keep_last", "removed"), [
    ("1 2L 3", 1, "1"),
    ("1 2L 3 4 5", 1, "1"),
    ("1 2 3L 4", 2, "1"),
])
def test_valid_checkpoints_newer_than_the_latest_are_kept_and_do_not_use_keep_last(
        specs: str, keep_last: int, removed: str) -> None:
    assert _removed(specs, keep_last=keep_last, writer_active=False) == removed


@pytest.mark.parametrize(("remove_torn", "writer_active", "removed"), [
    (True, True, "1T"),
    (True, False, "1T 5T"),
    (False, True, ""),
    (False, False, ""),
])
def test_torn_checkpoints_newer_than_the_latest_survive_while_a_writer_may_be_writing_them(
        remove_torn: bool, writer_active: bool, removed: str) -> None:
    specs = "1T 2C 3 4L 5T 6C"
    assert _removed(specs, keep_last=-1, remove_torn=remove_torn,
                    writer_active=writer_active) == removed


def test_torn_checkpoints_do_not_count_against_keep_last() -> None:
    assert _removed("1 2T 3C 4L", keep_last=2, remove_torn=False) == ""
    assert _removed("1 2T 3C 4L", keep_last=2) == "2T"


def test_corrupt_checkpoints_are_kept_for_inspection_and_do_not_count_against_keep_last(
        ) -> None:
    assert _removed("1C 2 3C 4L 5C", keep_last=1, writer_active=False) == "2"
    assert _removed("1C 2C", keep_last=1, writer_active=False) == ""


def test_without_a_latest_checkpoint_no_valid_checkpoint_is_removed() -> None:
    assert _removed("1 2 3", keep_last=1) == ""
    assert _removed("1 2T 3", keep_last=1, writer_active=True) == ""
    assert _removed("1 2T 3", keep_last=1, writer_active=False) == "2T"


def test_every_decision_gives_a_reason_that_names_why() -> None:
    specs = "1 2T 3 4P 5S 6L 7"
    decisions = retention_decisions([_checkpoint(s) for s in specs.split()], keep_last=2)
    reasons = {str(d.checkpoint.name): d.reason for d in decisions}
    assert reasons == {
        "AtomicDirectory_checkpoint_1": "beyond keep-last",
        "AtomicDirectory_checkpoint_2": "incomplete: no manifest (never committed)",
        "AtomicDirectory_checkpoint_3": "within keep-last",
        "AtomicDirectory_checkpoint_4_force": "pinned",
        "AtomicDirectory_checkpoint_5": "is a symlink; cycler never follows it: left for you "
                                        "to inspect",
        "AtomicDirectory_checkpoint_6": "latest",
        "AtomicDirectory_checkpoint_7": "valid and newer than the latest link",
    }



@given(
    flags=st.lists(st.sampled_from(["", "", "", "P", "T", "C", "S", "F", "PT"]), max_size=12),
    latest=st.integers(min_value=-1, max_value=11),
    keep_last=st.integers(min_value=-1, max_value=5),
    remove_torn=st.booleans(),
    writer_active=st.booleans(),
)
def test_retention_never_removes_what_it_must_keep_and_keeps_exactly_keep_last(
        flags: list[str], latest: int, keep_last: int, remove_torn: bool,
        writer_active: bool) -> None:
    specs = [f"{i}{f}" for i, f in enumerate(flags)]
    if 0 <= latest < len(specs) and flags[latest] == "":
        specs[latest] += "L"
    checkpoints = [_checkpoint(spec) for spec in specs]
    decisions = retention_decisions(checkpoints, keep_last=keep_last, remove_torn=remove_torn,
                                    writer_active=writer_active)
    latest_index = next((c.index for c in checkpoints if c.is_latest), None)
    for d in decisions:
        c = d.checkpoint
        must_keep = (c.is_latest or c.pinned or not c.is_directory
                     or (c.valid and (latest_index is None or c.index > latest_index))
                     or (not c.valid and not remove_torn))
        if must_keep:
            assert d.keep, (specs, d)
    older_valid = [c for c in checkpoints if c.valid and not c.pinned and c.is_directory
                   and latest_index is not None and c.index < latest_index]
    kept_older = [d for d in decisions if d.keep and d.checkpoint in older_valid]
    expected = len(older_valid) if keep_last < 0 else min(len(older_valid), max(keep_last - 1, 0))
    assert len(kept_older) == expected
    kept_indices = {d.checkpoint.index for d in kept_older}
    assert kept_indices == {c.index for c in older_valid[len(older_valid) - expected:]}


@pytest.mark.parametrize("keep_last", [0, -2])
def test_a_keep_last_that_would_keep_nothing_is_refused_the_same_everywhere(
        tmp_path: Path, keep_last: int) -> None:
    """A running saver, a new saver and ``cycle prune`` had disagreed at ``keep_last=0`` (five
    kept during a run, one after a new saver's first commit); now each refuses it alike."""
    from cycler import AtomicDirectory
    from cycler.checkpoint.inspection import prune
    from cycler.errors import ConfigError

    for refused in (lambda: AtomicDirectory(str(tmp_path), keep_last=keep_last),
                    lambda: prune(tmp_path, keep_last=keep_last, dry_run=True)):
        with pytest.raises(ConfigError, match=f"keep_last={keep_last} would keep no checkpoint"):
            refused()
    assert checked_keep_last(-1) == -1 and checked_keep_last(1) == 1


@pytest.mark.parametrize("keep_last", [True, False, 2.0, "2"])
def test_keep_last_that_is_no_whole_number_is_refused_booleans_included(
        keep_last: object) -> None:
    """``True`` is an ``int`` to Python: it was taken as ``keep_last=1`` and deleted every older
    checkpoint at the next commit."""
    from cycler.errors import ConfigError

    with pytest.raises(ConfigError, match="is not a whole number"):
        checked_keep_last(keep_last)  # type: ignore[arg-type]


def _removed_in_memory(specs: str, busy: set[int], keep: int = 2) -> str:
    checkpoints = [_checkpoint(spec) for spec in specs.split()]
    decisions = memory_decisions(checkpoints, busy=busy, keep=keep)
    return " ".join(spec for spec, d in zip(specs.split(), decisions, strict=True) if not d.keep)


def test_a_memory_root_keeps_its_newest_committed_and_the_busy_and_drops_pinned_ones() -> None:
    assert _removed_in_memory("1P 2 3T 4 5 6T", busy={2}) == "1P 3T"
    assert _removed_in_memory("1 2 3 4 5", busy=set(), keep=3) == "1 2"


def test_a_memory_root_keeps_a_torn_checkpoint_newer_than_its_newest_and_what_is_no_directory(
        ) -> None:
    assert _removed_in_memory("1 2T 3 4T", busy=set(), keep=1) == "1 2T"
    assert _removed_in_memory("1S 2F 3 4", busy=set(), keep=1) == "3"
    assert _removed_in_memory("1T 2T", busy=set()) == ""


def test_a_running_saver_drops_the_oldest_beyond_keep_last_and_none_with_minus_one() -> None:
    assert beyond_keep_last([1, 2, 3, 4], 2) == 2
    assert beyond_keep_last([4], 2) == 0
    assert beyond_keep_last([1, 2, 3, 4], -1) == 0


def test_partner_copies_of_checkpoints_no_longer_kept_go_but_not_temporaries() -> None:
    copies = ["AD_checkpoint_1", "AD_checkpoint_2", ".AD_checkpoint_0.cycler-tmp-h-1-x"]
    assert stale_replicas(copies, {"AD_checkpoint_2"}) == ["AD_checkpoint_1"]


@pytest.mark.parametrize("keep_last", [2.5, "2", None])
def test_a_keep_last_that_is_no_whole_number_is_refused_before_any_commit(
        tmp_path: Path, keep_last: object) -> None:
    from cycler import AtomicDirectory
    from cycler.errors import ConfigError

    with pytest.raises(ConfigError, match="is not a whole number"):
        AtomicDirectory(str(tmp_path), keep_last=keep_last)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir()), "nothing was prepared"
