"""CheckpointLayout: the one owner of checkpoint names, indices and the latest link."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cycler._fs import discard_directory
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName


def test_checkpoint_names_follow_cycling_utils_with_a_force_suffix_for_pins(
        tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    assert str(CheckpointName("AtomicDirectory", 7, False)) == "AtomicDirectory_checkpoint_7"
    assert str(CheckpointName("AtomicDirectory", 3, True)) == "AtomicDirectory_checkpoint_3_force"
    assert layout.link_name == "AtomicDirectory.latest_checkpoint"
    assert layout.link_path == tmp_path / "AtomicDirectory.latest_checkpoint"
    assert layout.record.directory == tmp_path / ".cycler"


def test_parse_reads_back_every_name_the_layout_writes(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path, "model")
    for index in (0, 1, 12, 10**9):
        for pinned in (False, True):
            name = CheckpointName("model", index, pinned)
            assert layout.parse(str(name)) == name
            assert layout.path_of(name) == tmp_path / str(name)


@pytest.mark.parametrize("entry", [
    "model_checkpoint_",
    "model_checkpoint_x",
    "model_checkpoint_-1",
    "model_checkpoint_3_forced",
    "model_checkpoint_3_force_force",
    "model_checkpoint_3.tmp",
    "other_checkpoint_3",
    "modelx_checkpoint_3",
    "model.latest_checkpoint",
    ".model_checkpoint_3.cycler-tmp-0123456789ab",
    " model_checkpoint_3",
    "model_checkpoint_3\n",
    "model_checkpoint_03",
    "model_checkpoint_\u0663",
    "model_checkpoint_\uff13",
])
def test_parse_refuses_names_that_are_not_exactly_this_savers_checkpoints(
        tmp_path: Path, entry: str) -> None:
    assert CheckpointLayout(tmp_path, "model").parse(entry) is None


def test_a_prefix_with_regex_characters_matches_only_literally(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path, "a.b+")
    assert layout.parse("a.b+_checkpoint_4") == CheckpointName("a.b+", 4, False)
    assert layout.parse("axbb_checkpoint_4") is None


@pytest.mark.parametrize("prefix", ["", "a/b", ".hidden"])
def test_a_prefix_that_is_not_a_plain_visible_file_name_is_refused(
        tmp_path: Path, prefix: str) -> None:
    with pytest.raises(ValueError, match="plain, non-hidden file name"):
        CheckpointLayout(tmp_path, prefix)


def test_the_root_is_kept_absolute_even_when_given_relative(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    layout = CheckpointLayout("checkpoints")
    assert layout.root == tmp_path / "checkpoints"
    assert layout.root.is_absolute()


def test_checkpoint_names_lists_only_this_prefix_by_index_and_skips_temporaries(
        tmp_path: Path) -> None:
    for entry in ("A_checkpoint_10", "A_checkpoint_2_force", "A_checkpoint_9", "B_checkpoint_50",
                  ".A_checkpoint_11.cycler-tmp-0123456789ab", "notes"):
        (tmp_path / entry).mkdir()
    (tmp_path / "A_checkpoint_4").write_text("a file with a checkpoint's name")
    layout = CheckpointLayout(tmp_path, "A")
    assert [str(n) for n in layout.checkpoint_names()] == [
        "A_checkpoint_2_force", "A_checkpoint_4", "A_checkpoint_9", "A_checkpoint_10"]
    assert [p.name for p in layout.temporaries()] == [".A_checkpoint_11.cycler-tmp-0123456789ab"]


def test_a_missing_root_has_no_checkpoints_no_temporaries_and_starts_at_index_zero(
        tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path / "not-yet")
    assert layout.checkpoint_names() == []
    assert layout.temporaries() == []
    assert layout.link_target_name() is None
    assert layout.next_index() == 0


def test_next_index_never_reuses_an_index_after_its_directory_is_removed(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    used = []
    for _ in range(3):
        index = layout.next_index()
        layout.record_index(index)
        layout.path_of(CheckpointName(layout.prefix, index, False)).mkdir()
        used.append(index)
    assert used == [0, 1, 2]
    for index in used:
        discard_directory(layout.path_of(CheckpointName(layout.prefix, index, False)))
    assert layout.checkpoint_names() == []
    assert layout.next_index() == 3


def test_next_index_goes_past_directories_the_record_does_not_know(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    layout.record_index(4)
    (tmp_path / "AtomicDirectory_checkpoint_8_force").mkdir()
    assert layout.next_index() == 9
    (tmp_path / "AtomicDirectory_checkpoint_8_force").rmdir()
    assert layout.next_index() == 5


def test_an_unreadable_index_record_falls_back_to_the_directories_present(
        tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    layout.record.directory.mkdir()
    layout.index_record_path.write_text("not a number")
    (tmp_path / "AtomicDirectory_checkpoint_2").mkdir()
    assert layout.next_index() == 3


def test_savers_sharing_a_root_keep_separate_index_records(tmp_path: Path) -> None:
    first, second = CheckpointLayout(tmp_path, "first"), CheckpointLayout(tmp_path, "second")
    first.record_index(6)
    assert second.next_index() == 0
    assert first.next_index() == 7
    assert first.index_record_path != second.index_record_path


def test_the_link_target_is_resolved_by_its_last_component_only(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path / "root")
    layout.root.mkdir()
    for target, expected in [
        (str(layout.root / "AtomicDirectory_checkpoint_3"),
         CheckpointName(layout.prefix, 3, False)),
        ("/elsewhere/AtomicDirectory_checkpoint_4_force/",
         CheckpointName(layout.prefix, 4, True)),
        ("AtomicDirectory_checkpoint_5", CheckpointName(layout.prefix, 5, False)),
        ("/elsewhere/not_a_checkpoint", None),
        ("..", None),
    ]:
        if os.path.lexists(layout.link_path):
            layout.link_path.unlink()
        os.symlink(target, layout.link_path)
        assert layout.link_target_name() == expected, target


def test_a_link_path_that_is_not_a_symlink_names_no_checkpoint(tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path)
    layout.link_path.write_text(str(tmp_path / "AtomicDirectory_checkpoint_1"))
    assert layout.link_target_name() is None


def test_own_temporaries_are_those_of_this_savers_link_checkpoints_and_index_record(
        tmp_path: Path) -> None:
    layout = CheckpointLayout(tmp_path, "A")
    layout.record.directory.mkdir()
    mine = [".A.latest_checkpoint.cycler-tmp-1", ".A_checkpoint_3.cycler-tmp-2",
            ".A_checkpoint_4_force.cycler-tmp-3", ".cycler/.A.last_index.cycler-tmp-4"]
    theirs = [".B.latest_checkpoint.cycler-tmp-1", ".A_checkpoint_03.cycler-tmp-2",
              ".A_rank_1_checkpoint_3.cycler-tmp-3", ".model.pt.cycler-tmp-4",
              ".cycler/.B.last_index.cycler-tmp-5", "A_checkpoint_5.cycler-tmp-6",
              ".cycler/.A.latest_checkpoint.cycler-tmp-7", "A_checkpoint_6"]
    for name in mine + theirs:
        (tmp_path / name).touch()
    found = sorted(str(p.relative_to(tmp_path)) for p in layout.own_temporaries())
    assert found == sorted(mine)


def test_a_temporary_of_the_first_index_record_is_this_savers_own(tmp_path: Path) -> None:
    # A kill -9 while the first save records where cycler's indices begin left this temporary,
    # and no later commit removed it (seen in test_kill9_saving).
    layout = CheckpointLayout(tmp_path, "A")
    layout.record.directory.mkdir()
    (layout.record.directory / ".A.first_index.cycler-tmp-1").touch()
    (layout.record.directory / ".B.first_index.cycler-tmp-2").touch()
    found = [p.name for p in layout.own_temporaries()]
    assert found == [".A.first_index.cycler-tmp-1"]
