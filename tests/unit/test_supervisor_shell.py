"""The shell's pure parts: the signal handler, the multi-node stop check, the pre-start checks."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from cycler.control import Action, ControlRequest, write_control
from cycler.errors import CheckpointDirectoryError, ConfigError
from cycler.layout import CheckpointLayout
from cycler.supervisor.core import SignalReceived
from cycler.supervisor.options import RunOptions
from cycler.supervisor.shell import (
    Supervisor,
    check_script,
    prepare_checkpoint_root,
    stop_requested_elsewhere,
)


def request(action: Action, at: float) -> ControlRequest:
    return ControlRequest(sequence=1, action=action, reason="SIGTERM", requested_at=at)


def test_the_signal_handler_only_records_the_signal_with_the_time(tmp_path: Path):
    options = RunOptions(script=tmp_path / "t.py", checkpoint_dir=tmp_path / "ck")
    supervisor = Supervisor(options, clock=lambda: 12.5)
    supervisor.handle_signal(signal.SIGTERM, None)
    supervisor.handle_signal(signal.SIGCONT, None)
    assert supervisor._queue.get_nowait() == SignalReceived("SIGTERM", 12.5)
    assert supervisor._queue.get_nowait() == SignalReceived("SIGCONT", 12.5)
    assert not (tmp_path / "ck").exists(), "handling a signal touches no file"


def test_a_stop_asked_on_another_node_since_the_start_is_seen(tmp_path: Path):
    layout = CheckpointLayout(tmp_path)
    layout.supervisor_dir.mkdir()
    write_control(layout.control_path(1), request(Action.CHECKPOINT_AND_EXIT, at=100.0))
    assert stop_requested_elsewhere(layout, node_rank=0, since=99.0)
    assert not stop_requested_elsewhere(layout, node_rank=0, since=101.0), "an old request"
    assert not stop_requested_elsewhere(layout, node_rank=1, since=99.0), "its own file"


def test_a_run_request_on_another_node_is_not_a_stop(tmp_path: Path):
    layout = CheckpointLayout(tmp_path)
    layout.supervisor_dir.mkdir()
    write_control(layout.control_path(1), request(Action.RUN, at=100.0))
    assert not stop_requested_elsewhere(layout, node_rank=0, since=0.0)


def test_a_missing_script_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="does not exist"):
        check_script(RunOptions(script=tmp_path / "missing.py"))


def test_the_checkpoint_root_is_created_and_probed(tmp_path: Path):
    options = RunOptions(script=Path("t.py"), checkpoint_dir=tmp_path / "a" / "b")
    prepare_checkpoint_root(options)
    assert (tmp_path / "a" / "b" / ".cycler").is_dir()
    assert list((tmp_path / "a" / "b" / ".cycler").iterdir()) == [], "the probe is removed"


def test_a_checkpoint_root_below_a_file_is_refused(tmp_path: Path):
    (tmp_path / "file").write_text("")
    options = RunOptions(script=Path("t.py"), checkpoint_dir=tmp_path / "file" / "ck")
    with pytest.raises(CheckpointDirectoryError, match="choose a writable --checkpoint-dir"):
        prepare_checkpoint_root(options)
