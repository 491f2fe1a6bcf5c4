"""``cycle verify``'s CLI: the ``cycle run`` options it passes to runs that work elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cycler_cli.verify_command import _config_for_a_workdir


def _passed(config: Path | None, memory_dir: str | None = None) -> dict[str, Any]:
    return {"config": config, "memory_dir": memory_dir}


def test_a_relative_config_file_is_passed_absolute_and_the_scripts_own_config_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--config", "run.yaml", "train.py", "--config", "model.yaml"]
    assert _config_for_a_workdir(args, _passed(Path("run.yaml")), {}) == [
        "--config", str(tmp_path / "run.yaml"), "train.py", "--config", "model.yaml"]
    assert _config_for_a_workdir(["--config=./run.yaml", "train.py"],
                                 _passed(Path("run.yaml")), {}) == [
        f"--config={tmp_path / 'run.yaml'}", "train.py"]


@pytest.mark.parametrize("from_file", [{"memory_dir": "mem"}, {"memory_tier": "mem"}])
def test_a_config_files_memory_directory_reaches_verify_as_a_flag(
        tmp_path: Path, from_file: dict[str, Any]) -> None:
    """verify reads the runs' memory tier where ``--memory-dir`` says: it had looked in the
    default place while the runs kept their checkpoints in the file's."""
    config = tmp_path / "run.yaml"
    assert _config_for_a_workdir(["--config", str(config), "train.py"], _passed(config),
                                 from_file) == ["--memory-dir", "mem", "--config", str(config),
                                                "train.py"]


def test_a_memory_dir_flag_wins_over_the_config_files_and_no_config_changes_nothing(
        tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    args = ["--memory-dir", "flag", "--config", str(config), "train.py"]
    assert _config_for_a_workdir(args, _passed(config, "flag"), {"memory_dir": "file"}) == args
    assert _config_for_a_workdir(["train.py"], _passed(None), {}) == ["train.py"]
