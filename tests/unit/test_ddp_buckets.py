"""settle_ddp_buckets: a DDP model's buckets are laid out once, at construction, for good;
settle_fresh_ddp_buckets, the integrations' call, settles only a DDP that ran no forward."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cycler import settle_ddp_buckets
from cycler.errors import CyclerError, UnsupportedTorch
from cycler.training.ddp_buckets import settle_fresh_ddp_buckets


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def rebuilt_order_after_one_step(settle: bool, settle_with=settle_ddp_buckets) -> list[int]:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    if settle:
        settle_with(model)
    return order_after_one_step(model)


def order_after_one_step(model: DistributedDataParallel) -> list[int]:
    """The parameters' order in ``model``'s buckets once it would have rebuilt them."""
    model(torch.randn(5, 4)).sum().backward()
    model(torch.randn(5, 4))  # DDP rebuilds (if it still does) before this forward
    index = {id(p): i for i, p in enumerate(model.parameters())}
    return [index[id(p)] for bucket in model.reducer._get_zeros_like_grad_buckets()
            for p in bucket.parameters()]


def test_a_settled_model_keeps_its_parameter_order_after_the_first_backward(
        one_rank_group: None) -> None:
    # Unsettled, DDP rebuilds in the order gradients became ready (the last layer's first): a
    # fresh process's first step used another layout than every later step.
    assert rebuilt_order_after_one_step(settle=False) == [3, 2, 1, 0]
    assert rebuilt_order_after_one_step(settle=True) == [0, 1, 2, 3]


def test_a_model_that_is_not_ddp_is_refused_naming_what_to_do_instead() -> None:
    with pytest.raises(UnsupportedTorch, match="find_unused_parameters=True"):
        settle_ddp_buckets(nn.Linear(2, 2))


def test_a_model_that_already_ran_a_forward_is_refused_saying_when_to_call_it(
        one_rank_group: None) -> None:
    model = DistributedDataParallel(nn.Linear(2, 2))
    model(torch.randn(3, 2))
    with pytest.raises(CyclerError, match="right after constructing"):
        settle_ddp_buckets(model)


def test_the_integrations_call_settles_a_fresh_ddp_model_as_settle_ddp_buckets_does(
        one_rank_group: None) -> None:
    assert rebuilt_order_after_one_step(True, settle_fresh_ddp_buckets) == [0, 1, 2, 3]


def test_the_integrations_call_leaves_a_plain_model_or_a_ddp_that_ran_a_forward_as_it_is(
        one_rank_group: None) -> None:
    assert settle_fresh_ddp_buckets(nn.Linear(2, 2)) is False
    model = DistributedDataParallel(nn.Linear(2, 2))
    model(torch.randn(3, 2))
    assert settle_fresh_ddp_buckets(model) is False  # no CyclerError: the user's forward came first


def test_loop_state_resume_settles_a_ddp_model_it_holds_before_its_first_forward(
        one_rank_group: None, tmp_path: Path) -> None:
    from cycler.integrations.loop import LoopState

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    loop = LoopState(tmp_path / "ck", model=model)
    assert loop.resume(step=0) == (0,)
    assert order_after_one_step(model) == [0, 1, 2, 3]
    loop.close()
