"""The launcher's probe of whether a worker forked from torchrun's agent could use CUDA.

The probe's answer depends on what its process did before (on a CUDA build of torch, asking
``torch.cuda.is_available()`` once is enough to make every later fork bad), so the probe is asked
in a fresh interpreter, as the launcher asks it in torchrun's fresh agent."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from cycler.supervisor.launch import forked


def probe_after(setup: str) -> bool:
    """What :func:`forked.fork_is_bad` answers in a fresh interpreter that first ran ``setup``."""
    code = f"import torch\n{setup}\nfrom cycler.supervisor.launch import forked\n" \
           "print(forked.fork_is_bad())"
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True).stdout.split()
    assert answer in (["True"], ["False"]), answer
    return answer == ["True"]


def test_a_fresh_agent_may_fork_its_workers() -> None:
    assert probe_after("") is False


def test_an_agent_that_counted_its_gpus_through_the_runtime_may_not() -> None:
    """On a CUDA build (with or without a GPU) counting devices through the runtime marks every
    later fork as bad; a CPU build has no runtime to ask, and its forks stay good."""
    assert probe_after("torch.cuda.is_available()") is torch.cuda._is_compiled()


def test_the_probe_asks_torch_in_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert forked.fork_is_bad()


def test_the_agents_objects_frozen_for_the_fork_are_thawed_when_it_exits() -> None:
    """Left frozen, they are never freed at the agent's exit, and an extension that counts its
    live objects then (triton's nanobind, on a CUDA build) prints dozens of lines of leaks."""
    code = "import atexit, gc\nfrom cycler.supervisor.launch import forked\n" \
           "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count()))\n" \
           "forked.freeze_for_fork()\nprint('frozen:', gc.get_freeze_count() > 0)"
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, check=True).stdout.splitlines()
    assert lines == ["frozen: True", "frozen at exit: 0"]
