"""AccelerateLoop in one process (no process group): the order of an epoch is a function of the
seed and the epoch only, a resumed epoch continues after the batches trained on, and what it
cannot resume exactly is refused in one line. The 2-process runs under `cycle run` are in
tests/integration/test_accelerate_integration.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from cycler.errors import ConfigError

accelerate = pytest.importorskip("accelerate", reason="the [accelerate] extra is not installed")

from cycler.integrations.accelerate import AccelerateLoop  # noqa: E402


def prepared(accumulation: int = 1, data: object = None, seedable: bool = False):
    configuration = accelerate.DataLoaderConfiguration(use_seedable_sampler=seedable)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation,
                                         dataloader_config=configuration)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(list(range(20)) if data is None else data, batch_size=2,
                        shuffle=data is None)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, loader


def epoch_order(loop: AccelerateLoop, loader, epoch: int) -> list[list[int]]:
    return [batch.tolist() for batch in loop.batches(loader, epoch)]


@pytest.mark.parametrize("seedable", [False, True], ids=["RandomSampler", "use_seedable_sampler"])
def test_an_epochs_order_depends_only_on_the_seed_and_the_epoch(tmp_path: Path,
                                                                seedable: bool) -> None:
    accelerator, loader = prepared(seedable=seedable)
    loop = AccelerateLoop(accelerator, tmp_path)
    loop.resume()
    first = [epoch_order(loop, loader, epoch) for epoch in range(3)]
    torch.rand(100)  # whatever the global RNG did in between
    again = []
    for epoch in (2, 0, 1):  # each in a loop of its own, as a restarted process would
        fresh = AccelerateLoop(accelerator, tmp_path)
        fresh.resume()
        again.append(epoch_order(fresh, loader, epoch))
    assert again == [first[2], first[0], first[1]]
    assert first[0] != first[1], "each epoch its own shuffle"


def test_building_an_epochs_iterator_draws_nothing_from_the_global_rng(tmp_path: Path) -> None:
    accelerator, loader = prepared()
    loop = AccelerateLoop(accelerator, tmp_path)
    loop.resume()
    state = torch.get_rng_state()
    next(iter(loop.batches(loader, 0)))
    assert torch.equal(state, torch.get_rng_state())


def test_a_resumed_epoch_continues_after_the_batches_trained_on(tmp_path: Path) -> None:
    accelerator, loader = prepared()
    loop = AccelerateLoop(accelerator, tmp_path)
    loop.resume()
    whole = epoch_order(loop, loader, 1)
    loop.epoch, loop.batches_done = 1, 4  # as resume() sets them from a checkpoint
    assert epoch_order(loop, loader, 1) == whole[4:]
    following = epoch_order(loop, loader, 2)
    assert following != whole and len(following) == 10, "the next epoch is whole"
    loop.epoch, loop.batches_done = 2, 10  # a checkpoint of the epoch's last step
    assert epoch_order(loop, loader, 2) == []


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(20))


@pytest.mark.parametrize(("make", "says"), [
    (lambda a, loader: loader, None),
    (lambda a, loader: a.skip_first_batches(loader, 1), "already skips batches"),
])
def test_a_loader_that_already_skips_is_refused(tmp_path: Path, make, says) -> None:
    accelerator, loader = prepared()
    loop = AccelerateLoop(accelerator, tmp_path)
    loop.resume()
    if says is None:
        assert epoch_order(loop, make(accelerator, loader), 0)
    else:
        with pytest.raises(ConfigError, match=says):
            epoch_order(loop, make(accelerator, loader), 0)


def test_an_iterable_dataset_is_refused_naming_it(tmp_path: Path) -> None:
    accelerator, loader = prepared(data=Stream())
    loop = AccelerateLoop(accelerator, tmp_path)
    loop.resume()
    with pytest.raises(ConfigError, match=r"reads an IterableDataset \(Stream\)"):
        epoch_order(loop, loader, 0)


def test_resume_before_prepare_and_step_outside_batches_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="came before accelerator.prepare"):
        AccelerateLoop(accelerate.Accelerator(cpu=True), tmp_path).resume()
    accelerator, loader = prepared()
    loop = AccelerateLoop(accelerator, tmp_path)
    with pytest.raises(ConfigError, match="batches\\(\\) came before resume\\(\\)"):
        epoch_order(loop, loader, 0)
    loop.resume()
    with pytest.raises(ConfigError, match="step\\(\\) outside"):
        loop.step()


def test_accumulation_without_accelerator_accumulate_is_refused(tmp_path: Path) -> None:
    accelerator, loader = prepared(accumulation=2)
    loop = AccelerateLoop(accelerator, tmp_path)
    loop.resume()
    batches = loop.batches(loader, 0)
    next(batches)
    with pytest.raises(ConfigError, match="does not run its steps in `with accelerator"):
        loop.step()
