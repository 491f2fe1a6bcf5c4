"""The Lightning callback's training loaders: which ones are refused (one line naming what to
add), and an iterable-style loader's position is the one after the last batch *trained*, while
Lightning's fetcher already holds the next batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from cycler.integrations import lightning_data


class Counting(IterableDataset):
    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        while self.position < 12:
            self.position += 1
            yield torch.tensor([self.position - 1])
        self.position = 0


class StatefulCounting(Counting):
    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


@pytest.mark.parametrize(("loader", "says"), [
    (DataLoader(Counting(), batch_size=2),
     "give Counting state_dict()/load_state_dict() methods, or load it with torchdata's "
     "StatefulDataLoader"),
    (DataLoader(StatefulCounting(), batch_size=2, num_workers=2),
     "load it with torchdata's StatefulDataLoader, or set num_workers=0"),
    (DataLoader(TensorDataset(torch.arange(4)), batch_size=None),
     "give it a batch_size or a batch_sampler"),
    ([torch.zeros(2)], "wrap it in a torch DataLoader"),
], ids=["iterable without a state", "stateful dataset in workers", "no batches", "a list"])
def test_a_loader_that_cannot_resume_is_refused_naming_what_to_add(loader, says) -> None:
    refusal = lightning_data.refusal(loader)
    assert refusal is not None and says in refusal and "\n" not in refusal


def test_loaders_that_can_resume_are_not_refused() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    for loader in (DataLoader(TensorDataset(torch.arange(4)), batch_size=2, shuffle=True),
                   DataLoader(StatefulCounting(), batch_size=2),
                   StatefulDataLoader(Counting(), batch_size=2, num_workers=2)):
        assert lightning_data.refusal(loader) is None


def test_the_position_saved_is_after_the_last_batch_trained_and_resumes_there(
        tmp_path: Path) -> None:
    loader = lightning_data.resumable(DataLoader(StatefulCounting(), batch_size=2), 0, 0, None)
    batches = iter(loader)
    trained = [next(batches)]
    for _ in range(2):
        lookahead = next(batches)  # Lightning's fetcher holds the next batch
        lightning_data.note_trained(loader, len(trained))
        trained.append(lookahead)
    lightning_data.save_position(loader, tmp_path, rank=0)  # two batches trained, one held

    resumed = lightning_data.resumable(DataLoader(StatefulCounting(), batch_size=2), 0, 0,
                                       tmp_path)
    assert [b.tolist() for b in resumed] == [[[4], [5]], [[6], [7]], [[8], [9]], [[10], [11]]]
    assert isinstance(resumed, DataLoader) and lightning_data.refusal(resumed) is None


def test_at_the_end_of_its_stream_the_position_is_the_stream_ended(tmp_path: Path) -> None:
    loader = lightning_data.resumable(DataLoader(StatefulCounting(), batch_size=4), 0, 0, None)
    for count, _ in enumerate(loader, start=1):
        lightning_data.note_trained(loader, count)
    lightning_data.save_position(loader, tmp_path, rank=0)
    saved = torch.load(tmp_path / lightning_data.loader_file(0), weights_only=True)
    assert saved["state"] == {"position": 0}  # where the next pass starts, as uninterrupted


@pytest.mark.parametrize("own_generator", [False, True])
def test_a_resume_in_a_later_epoch_continues_that_epochs_order_in_lightnings_call_order(
        own_generator: bool) -> None:
    # DataLoader(shuffle=True, generator=g): the sampler drew every epoch's order from g, which
    # no checkpoint holds, so a resume in epoch 1 drew epoch 0's order again. And Lightning
    # makes a later epoch's iterator after set_epoch, but a resumed epoch's before it
    # (FitLoop.setup_data, then on_advance_start): the iterator draws its workers' base seed
    # from the loader's generator, which must not move the order.
    def loader() -> lightning_data.ResumableLoader:
        generator = torch.Generator().manual_seed(5) if own_generator else None
        plain = DataLoader(TensorDataset(torch.arange(20)), batch_size=4, shuffle=True,
                           generator=generator)
        return lightning_data.ResumableLoader.around(plain, seed=7)

    def batches(iterator: object) -> list[list[int]]:
        return [batch.tolist() for (batch,) in iterator]  # type: ignore[attr-defined]

    uninterrupted = loader()
    iterator = iter(uninterrupted)  # setup_data, then the first epoch's set_epoch(0)
    uninterrupted.batch_sampler.set_epoch(0)  # type: ignore[union-attr]
    first = batches(iterator)
    uninterrupted.batch_sampler.set_epoch(1)  # type: ignore[union-attr]
    second = batches(iter(uninterrupted))  # a later epoch: its iterator after set_epoch
    assert first != second

    resumed = loader()
    resumed.load_state_dict({"version": lightning_data.LOADER_STATE_VERSION, "epoch": 1,
                             "batches_done": 2})
    iterator = iter(resumed)  # setup_data makes it, on_advance_start sets the epoch after
    resumed.batch_sampler.set_epoch(1)  # type: ignore[union-attr]
    assert batches(iterator) == second[2:]
