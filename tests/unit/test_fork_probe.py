"""The launcher's probe of whether a worker forked from torchrun's agent could use CUDA."""

from __future__ import annotations

import pytest
import torch

from cycler.supervisor import forked


def test_a_fork_that_torch_would_call_bad_is_seen_by_the_probe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert not forked.fork_is_bad()
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    assert forked.fork_is_bad()
