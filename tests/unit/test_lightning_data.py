"""The Lightning callback's training loaders: which ones are refused (one line naming what to
add), and an iterable-style loader's position is the one after the last batch *trained*, while
Lightning's fetcher already holds the next batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

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


def lightning_fit(loader: lightning_data.ResumableLoader, epochs: range,
                  resume: tuple[int, int] | None = None) -> list[list[list[int]]]:
    """The batches of each epoch in ``epochs``, in the order Lightning 2.6 calls the loader:
    ``FitLoop.setup_data`` loads a resumed position and makes the first epoch's iterator (its
    prefetch draws the first batch); then per epoch ``_set_sampler_epoch`` (which never reaches
    the rebuilt loader's batch sampler), ``on_train_epoch_start`` (not for an epoch resumed in
    its middle), and a later epoch's iterator after it."""
    if resume is not None:
        loader.load_state_dict({"version": lightning_data.LOADER_STATE_VERSION,
                                "epoch": resume[0], "batches_done": resume[1]})
    iterator = iter(loader)
    first = next(iterator, None)
    seen = []
    for number, epoch in enumerate(epochs):
        if number > 0:
            lightning_data.epoch_begins(loader, epoch)
            iterator = iter(loader)
            first = next(iterator, None)
        elif resume is None:
            lightning_data.epoch_begins(loader, epoch)
        batches = [] if first is None else [first]
        seen.append([batch.tolist() for (batch,) in [*batches, *iterator]])
    return seen


@pytest.mark.parametrize("sampling", ["shuffle", "own generator", "distributed"])
def test_each_epoch_has_its_own_order_and_a_resume_in_any_epoch_continues_it(
        sampling: str) -> None:
    # Lightning's set_epoch never reached the rebuilt loader's batch sampler: a
    # DistributedSampler shuffled every epoch as the first, the checkpoint's epoch was always 0,
    # and a RandomSampler with DataLoader(generator=g) drew from g, which no checkpoint holds.
    def loader() -> lightning_data.ResumableLoader:
        dataset = TensorDataset(torch.arange(20))
        if sampling == "distributed":
            sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=3)
            plain = DataLoader(dataset, batch_size=4, sampler=sampler)
        else:
            generator = torch.Generator().manual_seed(5) if sampling == "own generator" else None
            plain = DataLoader(dataset, batch_size=4, shuffle=True, generator=generator)
        return lightning_data.ResumableLoader.around(plain, seed=7)

    uninterrupted = lightning_fit(loader(), range(3))
    assert len({str(epoch) for epoch in uninterrupted}) == 3, "each epoch its own order"
    for epoch in range(3):
        resumed = lightning_fit(loader(), range(epoch, 3), resume=(epoch, 2))
        assert resumed == [uninterrupted[epoch][2:], *uninterrupted[epoch + 1:]], epoch
