"""torchrun's agent (``cycler.supervisor.launch.launcher``) knows a stop ``cycle run`` asked for, so
that workers ending during it are not reported with torch's traceback: it reads the node's
control file, where a stop reaches the workers even when its copy in the checkpoint root
cannot be written (a full root)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cycler.protocol.control import Action, ControlRequest, write_control
from cycler.protocol.environment import ENV_CHECKPOINT_DIR, ENV_CONTROL_FILE
from cycler.supervisor.launch.launcher import StopSeen


def stop(path: Path, at: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_control(path, ControlRequest(sequence=1, action=Action.CHECKPOINT_AND_EXIT,
                                       reason="SIGTERM", requested_at=at))


def test_a_stop_only_in_the_nodes_control_file_is_seen(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, node = tmp_path / "root", tmp_path / "node" / "control-node0.json"
    root.mkdir()
    monkeypatch.setenv(ENV_CHECKPOINT_DIR, str(root))
    monkeypatch.setenv(ENV_CONTROL_FILE, str(node))
    started = time.time()
    seen = StopSeen(started)
    assert not seen()
    stop(node, started + 1)
    assert seen()


def test_a_stop_from_before_the_agent_started_is_not_this_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = tmp_path / "node" / "control-node0.json"
    monkeypatch.setenv(ENV_CONTROL_FILE, str(node))
    stop(node, 100.0)
    assert not StopSeen(200.0)()
