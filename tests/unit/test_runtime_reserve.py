"""The space cycle run keeps in the job's runtime directory for a control request on a full
tmpfs (issue 36): made once, freed once."""

from __future__ import annotations

from pathlib import Path

from cycler.checkpoint.memory_roots import (
    RESERVE_BYTES,
    RESERVE_FILENAME,
    release_reserve,
    reserve_space,
)


def test_the_reserve_is_kept_once_and_freed_once(tmp_path: Path) -> None:
    reserve_space(tmp_path)
    reserve_space(tmp_path)
    assert (tmp_path / RESERVE_FILENAME).stat().st_size == RESERVE_BYTES
    assert release_reserve(tmp_path)
    assert not (tmp_path / RESERVE_FILENAME).exists()
    assert not release_reserve(tmp_path), "nothing left to free"


def test_a_directory_that_cannot_hold_the_reserve_is_left_as_it_is(tmp_path: Path) -> None:
    reserve_space(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
