"""examples/train.py with one thing forgotten, as users forget it: what ``cycle verify`` must
catch and name.

    cycle verify tests/verify/scripts/forgetful_train.py --forget rng [train.py's options]

--forget rng          the RNG state is neither saved nor restored
--forget sampler      the sampler's position is saved but not restored
--forget optimizer    the optimizer's state is saved but not restored
--forget scheduler    a learning-rate scheduler, stepped every step, is never saved
--forget rank-state   each rank draws its own dropout masks, but only rank 0's own file (its
                      RNG) is saved, and every rank restores it
--forget loader-seed  the DataLoader has no generator of its own (iter() draws from the
                      global RNG after the resume), with one worker process
--forget determinism  not a resume bug: dropout is reseeded from the OS, so no two runs agree
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
import train  # noqa: E402  (examples/train.py)


def forget_rng() -> None:
    train.capture_rng_state = lambda: None
    train.restore_rng_state = lambda state: None


def forget_sampler() -> None:
    train.InterruptableDistributedSampler.load_state_dict = lambda self, state: None


def forget_optimizer() -> None:
    torch.optim.SGD.load_state_dict = lambda self, state: None


class _ScheduledSGD(torch.optim.SGD):
    """SGD whose learning rate a LambdaLR decays every step; nobody saves the scheduler."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self, lambda step: 1 / (1 + step / 8))

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        self.scheduler.step()
        return loss


def forget_scheduler() -> None:
    train.torch.optim.SGD = _ScheduledSGD  # type: ignore[misc]


def forget_rank_state() -> None:
    save, load, make_model = train.atomic_torch_save, train.torch.load, train.make_model

    def own_dropout_per_rank(hidden: int) -> torch.nn.Module:
        model = make_model(hidden)  # identical initial weights; then each rank its own masks
        torch.manual_seed(1000 + train.dist.get_rank())
        return model

    def save_rank_zero_only(obj: Any, path: Path) -> None:
        if not Path(path).name.startswith("rank-") or Path(path).name == "rank-0.pt":
            save(obj, path)

    def load_rank_zero(path: Path, **kwargs: Any) -> Any:
        path = Path(path)
        return load(path.with_name("rank-0.pt") if path.name.startswith("rank-") else path,
                    **kwargs)

    train.make_model = own_dropout_per_rank
    train.atomic_torch_save = save_rank_zero_only
    train.torch.load = load_rank_zero


def forget_loader_seed() -> None:
    loader = train.DataLoader
    train.DataLoader = lambda *args, generator=None, **kwargs: loader(*args, **kwargs)
    sys.argv += ["--workers", "1"]


def forget_determinism() -> None:
    make_model = train.make_model

    def reseeded_from_the_os(hidden: int) -> torch.nn.Module:
        model = make_model(hidden)
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
        return model

    train.make_model = reseeded_from_the_os


FORGET = {"rng": forget_rng, "sampler": forget_sampler, "optimizer": forget_optimizer,
          "scheduler": forget_scheduler, "rank-state": forget_rank_state,
          "loader-seed": forget_loader_seed, "determinism": forget_determinism}

if __name__ == "__main__":
    what = sys.argv.pop(sys.argv.index("--forget") + 1)
    sys.argv.remove("--forget")
    FORGET[what]()
    train.main()
