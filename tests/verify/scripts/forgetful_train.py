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
--forget checkpoint   the checkpoint is saved but never loaded: every start trains from step 0
--forget determinism  not a resume bug: dropout is reseeded from the OS, so no two runs agree
--forget optimizer-t  the optimizer counts its steps in ``t`` (a name a wall-clock time could
                      have), saved in its state_dict but not restored

--stamp KEY           not a resume bug: train.pt also holds the wall-clock time under KEY
"""

from __future__ import annotations

import os
import sys
import time
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


def forget_checkpoint() -> None:
    train.AtomicDirectory.latest_checkpoint = lambda self: None


def forget_determinism() -> None:
    make_model = train.make_model

    def reseeded_from_the_os(hidden: int) -> torch.nn.Module:
        model = make_model(hidden)
        torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
        return model

    train.make_model = reseeded_from_the_os


class _CountingSGD(torch.optim.SGD):
    """SGD that counts its steps in ``t``, saved in its state_dict and never restored."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.t = 0

    def step(self, closure: Any = None) -> Any:
        self.t += 1
        return super().step(closure)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "t": self.t}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "t"})


def forget_optimizer_t() -> None:
    train.torch.optim.SGD = _CountingSGD  # type: ignore[misc]


def stamp(key: str) -> None:
    save = train.atomic_torch_save

    def with_the_time(obj: Any, path: Path) -> None:
        save({**obj, key: time.time()} if Path(path).name == "train.pt" else obj, path)

    train.atomic_torch_save = with_the_time


FORGET = {"rng": forget_rng, "sampler": forget_sampler, "optimizer": forget_optimizer,
          "scheduler": forget_scheduler, "rank-state": forget_rank_state,
          "loader-seed": forget_loader_seed, "checkpoint": forget_checkpoint,
          "determinism": forget_determinism,
          "optimizer-t": forget_optimizer_t}

if __name__ == "__main__":
    if "--stamp" in sys.argv:
        stamp(sys.argv.pop(sys.argv.index("--stamp") + 1))
        sys.argv.remove("--stamp")
    if "--forget" in sys.argv:
        FORGET[sys.argv.pop(sys.argv.index("--forget") + 1)]()
        sys.argv.remove("--forget")
    train.main()
