"""LoopState, the helper for hand-written loops: what it saves, what resume() gives back, and the
mistakes it names (one process, no process group)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from cycler.errors import ConfigError, StateMismatch
from cycler.integrations.loop import LoopState


def train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = nn.functional.dropout(model(torch.randn(4, 3)), 0.5).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_a_first_run_gets_the_defaults_back(tmp_path: Path) -> None:
    loop = LoopState(tmp_path, model=nn.Linear(3, 2))
    assert loop.resume(iter_num=0, best=1e9, batch=None) == (0, 1e9, None)
    loop.close()


def test_resume_restores_objects_values_and_rng_as_they_were_at_the_save(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    loop = LoopState(tmp_path, every_steps=3, model=model, optimizer=optimizer)
    for iter_num in range(1, 4):
        train(model, optimizer)
        batch = (torch.full((2,), float(iter_num)), torch.zeros(1))
        assert loop.step(iter_num=iter_num, batch=batch) is False
    loop.close()
    expected_next = torch.rand(5)
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    torch.manual_seed(123)  # a new process: other weights, another RNG position
    fresh = nn.Linear(3, 2)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    resumed = LoopState(tmp_path, model=fresh, optimizer=fresh_optimizer)
    iter_num, batch = resumed.resume(iter_num=0, batch=None)
    assert iter_num == 3 and torch.equal(batch[0], torch.full((2,), 3.0))
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 3
    assert torch.equal(torch.rand(5), expected_next)
    assert resumed.control.global_step == 3
    resumed.close()


def test_other_names_than_the_saved_ones_are_a_state_mismatch_naming_both(
        tmp_path: Path) -> None:
    loop = LoopState(tmp_path, every_steps=1, model=nn.Linear(3, 2))
    loop.step(iter_num=1)
    loop.close()
    with pytest.raises(StateMismatch, match=r"\['iter_num'\].*\['iter_num', 'tokens'\]"):
        LoopState(tmp_path, model=nn.Linear(3, 2)).resume(iter_num=0, tokens=0)
    with pytest.raises(StateMismatch, match="objects"):
        LoopState(tmp_path, net=nn.Linear(3, 2)).resume(iter_num=0)


def test_a_value_resume_could_not_load_is_refused_before_anything_is_written(
        tmp_path: Path) -> None:
    loop = LoopState(tmp_path, model=nn.Linear(3, 2))
    with pytest.raises(ConfigError, match="batch= holds a ndarray"):
        loop.save(iter_num=1, batch=(np.zeros(3), 1))
    loop.save(iter_num=1, batch=(torch.zeros(3), {"k": [1.5, None]}))
    loop.close()
    assert loop.saver.latest_checkpoint() is not None
    assert len(list(tmp_path.glob("*_checkpoint_*"))) == 1
