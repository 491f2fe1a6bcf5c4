"""OptimizerSteps tells an optimizer-step boundary from the middle of an accumulated step, from
the optimizers' own hooks: whatever the loop, one optimizer or several."""

from __future__ import annotations

import torch
from torch import nn

from cycler.integrations.optimizer_steps import OptimizerSteps


def backward(model: nn.Module) -> None:
    model(torch.ones(2, 4)).sum().backward()


def test_a_boundary_is_after_a_step_and_never_while_gradients_are_accumulated() -> None:
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = OptimizerSteps([optimizer])
    seen = []
    for batch in range(6):  # 3 micro-batches a step
        backward(model)
        if batch % 3 == 2:
            optimizer.step()
            optimizer.zero_grad()
        seen.append(steps.at_boundary())
    assert seen == [False, False, True, False, False, True]


def test_with_two_optimizers_a_boundary_waits_for_the_one_still_accumulating() -> None:
    first, second = nn.Linear(4, 4), nn.Linear(4, 2)
    model = nn.Sequential(first, second)
    fast = torch.optim.SGD(first.parameters(), lr=0.1)
    slow = torch.optim.Adam(second.parameters(), lr=0.1)
    steps = OptimizerSteps([fast, slow])
    seen = []
    for batch in range(4):  # fast steps every batch, slow every second one
        backward(model)
        fast.step()
        if batch % 2 == 1:
            slow.step()
            slow.zero_grad()
        seen.append(steps.at_boundary())
    assert seen == [False, True, False, True]


def test_no_step_since_the_last_boundary_is_no_boundary_and_close_removes_the_hooks() -> None:
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = OptimizerSteps([optimizer])
    assert not steps.at_boundary()
    steps.close()
    backward(model)
    optimizer.step()
    assert not steps.at_boundary()  # the step was not seen: the hooks are gone
