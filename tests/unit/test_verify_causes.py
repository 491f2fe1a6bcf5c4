"""cycle verify names the likely cause from what differs first, on checkpoint pairs built by
hand: a reference state and the state a resume that forgot one thing would have saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cycler.verify.causes import ddp_rounding, name_cause, part_of
from cycler.verify.compare import compare_checkpoints
from cycler.verify.session import nondeterminism


def rng_state(draws: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    for _ in range(draws):
        torch.empty((), dtype=torch.int64).random_(generator=generator)
    return generator.get_state()


def train_state(model: float = 1.0, momentum: float = 0.5, progress: int = 64,
                lr: float = 0.1) -> dict[str, Any]:
    return {
        "model": {"0.weight": torch.full((3, 2), model)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.full((3, 2), momentum)}},
                      "param_groups": [{"lr": lr, "momentum": 0.9, "params": [0]}]},
        "sampler": {"epoch": 1, "progress": progress},
        "control": {"global_step": 16},
    }


def rank_state(rank: int = 0, draws: int = 0) -> dict[str, Any]:
    return {"rng": {"torch": rng_state(draws)}, "metrics": {"loss": 1.5 + rank}}


def cause_of(tmp_path: Path, reference: dict[str, Any], resumed: dict[str, Any],
             world_size: int = 1) -> str:
    for name, files in (("a", reference), ("b", resumed)):
        (tmp_path / name).mkdir()
        for file, value in files.items():
            torch.save(value, tmp_path / name / file)
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", sorted(reference))
    assert not diff.identical
    return name_cause(diff, world_size=world_size, files=sorted(reference)).name


def test_a_checkpoint_without_rng_state_points_at_the_rng_streams(tmp_path: Path) -> None:
    no_rng = {"metrics": {"loss": 1.0}}
    assert cause_of(tmp_path, {"train.pt": train_state(), "rank-0.pt": no_rng},
                    {"train.pt": train_state(model=1.5, momentum=0.7),
                     "rank-0.pt": {"metrics": {"loss": 1.2}}}) == "rng"


def test_a_saved_rng_state_that_differs_points_at_the_rng_streams(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(1)
    torch.rand(5, generator=generator)
    assert cause_of(tmp_path, {"rank-0.pt": rank_state(), "train.pt": train_state()},
                    {"rank-0.pt": {"rng": {"torch": generator.get_state()},
                                   "metrics": {"loss": 1.5}},
                     "train.pt": train_state(model=2.0)}) == "rng"


def test_a_global_rng_one_seed_draw_ahead_points_at_an_unseeded_dataloader(
        tmp_path: Path) -> None:
    assert cause_of(tmp_path, {"rank-0.pt": rank_state(), "train.pt": train_state()},
                    {"rank-0.pt": rank_state(draws=1),
                     "train.pt": train_state(model=2.0)}) == "dataloader_seed"


def test_a_sampler_state_that_differs_points_at_the_data_position(tmp_path: Path) -> None:
    assert cause_of(tmp_path, {"train.pt": train_state(), "rank-0.pt": rank_state()},
                    {"train.pt": train_state(progress=16, model=3.0),
                     "rank-0.pt": rank_state()}) == "data"


def test_a_checkpoint_without_a_sampler_points_at_the_data_position(tmp_path: Path) -> None:
    def without_sampler(**changes: Any) -> dict[str, Any]:
        state = train_state(**changes)
        del state["sampler"]
        return state
    assert cause_of(tmp_path, {"train.pt": without_sampler(), "rank-0.pt": rank_state()},
                    {"train.pt": without_sampler(model=3.0, momentum=0.1),
                     "rank-0.pt": rank_state()}) == "data"


def test_a_learning_rate_no_saved_scheduler_explains_points_at_the_scheduler(
        tmp_path: Path) -> None:
    assert cause_of(tmp_path, {"train.pt": train_state(), "rank-0.pt": rank_state()},
                    {"train.pt": train_state(lr=0.05, model=0.9, momentum=0.4),
                     "rank-0.pt": rank_state()}) == "scheduler"


@pytest.mark.parametrize(("key", "cause"), [("lr_scheduler", "scheduler"),
                                            ("grad_scaler", "scaler")])
def test_a_saved_scheduler_or_scaler_that_differs_is_named(tmp_path: Path, key: str,
                                                           cause: str) -> None:
    assert cause_of(tmp_path, {"train.pt": {**train_state(), key: {"last": 16}}},
                    {"train.pt": {**train_state(model=2.0), key: {"last": 2}}}) == cause


def test_an_unsaved_optimizer_is_named(tmp_path: Path) -> None:
    def without_optimizer(**changes: Any) -> dict[str, Any]:
        state = train_state(**changes)
        del state["optimizer"]
        return state
    assert cause_of(tmp_path, {"train.pt": without_optimizer(), "rank-0.pt": rank_state()},
                    {"train.pt": without_optimizer(model=1.1),
                     "rank-0.pt": rank_state()}) == "optimizer"


def test_an_optimizer_state_that_differs_with_every_input_equal_is_named(tmp_path: Path) -> None:
    assert cause_of(tmp_path, {"train.pt": train_state(), "rank-0.pt": rank_state()},
                    {"train.pt": train_state(momentum=0.1, model=1.1),
                     "rank-0.pt": rank_state()}) == "optimizer"


def test_several_ranks_with_one_rank_file_point_at_a_ranks_own_state(tmp_path: Path) -> None:
    assert cause_of(tmp_path, {"train.pt": train_state(), "rank-0.pt": rank_state()},
                    {"train.pt": train_state(model=1.1, momentum=0.6),
                     "rank-0.pt": rank_state()}, world_size=2) == "rank_state"


def test_the_model_differing_alone_is_named(tmp_path: Path) -> None:
    assert cause_of(tmp_path, {"train.pt": train_state(), "rank-0.pt": rank_state()},
                    {"train.pt": train_state(model=1.1), "rank-0.pt": rank_state()}) == "model"


def test_parts_are_recognised_by_the_names_scripts_give_them() -> None:
    assert part_of("rank-0.pt", ("rng", "torch")) == "rng"
    assert part_of("train.pt", ("optimizer", "state", "3", "exp_avg")) == "optimizer"
    assert part_of("train.pt", ("optimizer", "state", "3", "step")) == "optimizer"
    assert part_of("train.pt", ("sampler", "progress")) == "data"
    assert part_of("train.pt", ("model", "0.weight")) == "model"
    assert part_of("model.pt", ("0.weight",)) == "model"
    assert part_of("train.pt", ("control", "global_step")) == "counters"


def test_two_uninterrupted_runs_that_differ_are_told_apart_by_what_differs(
        tmp_path: Path) -> None:
    for name, draws, model in (("a", 0, 1.0), ("b", 1, 1.0), ("c", 0, 2.0)):
        (tmp_path / name).mkdir()
        torch.save({**train_state(model=model), **rank_state(draws=draws)},
                   tmp_path / name / "all.pt")
    unseeded = compare_checkpoints(tmp_path / "a", tmp_path / "b", ["all.pt"])
    kernels = compare_checkpoints(tmp_path / "a", tmp_path / "c", ["all.pt"])
    assert nondeterminism(unseeded).name == "unseeded"
    assert nondeterminism(kernels).name == "kernels"


def test_two_uninterrupted_runs_whose_checkpoint_holds_no_rng_are_not_blamed_on_kernels(
        tmp_path: Path) -> None:
    # Dropout seeded from the clock, no RNG saved: only the weights differ, and verify said
    # "nondeterministic kernels" (equal RNG) for an RNG it never saw.
    for name, model in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        torch.save(train_state(model=model), tmp_path / name / "train.pt")
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", ["train.pt"])
    cause = nondeterminism(diff)
    assert cause.name == "unseeded" and "no RNG state" in cause.why


def lightning_checkpoint(model: float, momentum: float) -> dict[str, Any]:
    return {"state_dict": {"layer.weight": torch.full((3, 2), model)},
            "optimizer_states": [{"state": {0: {"momentum_buffer": torch.full((3, 2), momentum)}},
                                  "param_groups": [{"lr": 0.1, "params": [0]}]}],
            "loops": {"fit_loop": {"state_dict": {"combined_loader": [
                {"epoch": 1, "batches_done": 4}]}}}, "global_step": 36}


def test_lightning_weights_that_differ_with_every_input_equal_point_at_the_order_or_state(
        tmp_path: Path) -> None:
    # A DataLoader with a generator of its own (the order is in no checkpoint) and a buffer
    # registered with persistent=False leave the same checkpoints; Lightning restores the
    # optimizer itself, so "the optimizer" would be a wrong cause, and "the data order" alone
    # was wrong for the buffer (this session's hostile review).
    rng = {"rng": {"torch": rng_state()}}
    assert cause_of(tmp_path, {"lightning.ckpt": lightning_checkpoint(1.0, 0.5), "rng-0.pt": rng},
                    {"lightning.ckpt": lightning_checkpoint(1.5, 0.7),
                     "rng-0.pt": rng}) == "order_or_unsaved"


def hf_checkpoint(directory: Path, model: float, momentum: float) -> list[str]:
    """An HF Trainer checkpoint's files: no name of the data's, its position is the step."""
    directory.mkdir()
    torch.save({"layer.weight": torch.full((3, 2), model)}, directory / "pytorch_model.bin")
    torch.save({"state": {0: {"momentum_buffer": torch.full((3, 2), momentum)}},
                "param_groups": [{"lr": 0.1, "initial_lr": 0.1, "params": [0]}]},
               directory / "optimizer.pt")
    torch.save({"last_epoch": 12, "_last_lr": [0.1]}, directory / "scheduler.pt")
    torch.save({"cpu": rng_state(), "python": 1}, directory / "rng_state.pth")
    (directory / "trainer_state.json").write_text('{"global_step": 12, "epoch": 1.5}')
    return sorted(path.name for path in directory.iterdir())


def test_hf_weights_that_differ_with_every_input_equal_point_at_the_order_or_state(
        tmp_path: Path) -> None:
    # A plain attribute of the model changed the loss: verify said "the data position: the
    # checkpoint holds no sampler or data position", but HF keeps its position in its step.
    # A sampler of the script's own with an unsaved generator leaves the same checkpoints.
    files = hf_checkpoint(tmp_path / "a", 1.0, 0.5)
    hf_checkpoint(tmp_path / "b", 1.5, 0.7)
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files)
    assert name_cause(diff, world_size=1, files=files).name == "order_or_unsaved"


def test_an_optimizer_saved_under_opt_is_the_optimizer_and_its_lr_the_scheduler(
        tmp_path: Path) -> None:
    # {"opt": optimizer.state_dict()} and no scheduler saved: verify said "the optimizer: the
    # checkpoint holds no optimizer state".
    def state(lr: float) -> dict[str, Any]:
        saved = train_state(lr=lr)
        saved["opt"] = saved.pop("optimizer")
        return saved

    assert part_of("s.pt", ("opt", "param_groups", "0", "lr")) == "optimizer"
    assert cause_of(tmp_path, {"s.pt": state(0.1), "rank-0.pt": rank_state()},
                    {"s.pt": state(0.07), "rank-0.pt": rank_state()}) == "scheduler"


def test_a_script_s_own_optimizer_that_differs_with_every_input_equal_is_still_named(
        tmp_path: Path) -> None:
    assert cause_of(tmp_path, {"train.pt": train_state(), "rank-0.pt": rank_state()},
                    {"train.pt": train_state(model=1.5, momentum=0.7),
                     "rank-0.pt": rank_state()}) == "optimizer"


def end_cause(tmp_path: Path, checkpoint: dict[str, Any], end: tuple[Any, Any]) -> str:
    """The cause named when the last checkpoint (``checkpoint``, equal in both runs) is
    identical and the runs' ``ema.pt`` at the end differs."""
    for name, value in (("a", end[0]), ("b", end[1])):
        (tmp_path / name).mkdir()
        torch.save(checkpoint, tmp_path / name / "train.pt")
        torch.save(value, tmp_path / name / "ema.pt")
    last = compare_checkpoints(tmp_path / "a", tmp_path / "b", ["train.pt"])
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", ["ema.pt"])
    assert last.identical and not diff.identical
    return name_cause(diff, world_size=1, files=["ema.pt"], checkpoint=last).name


def test_only_the_end_differing_names_the_unsaved_scheduler_where_one_may_drive_the_optimizer(
        tmp_path: Path) -> None:
    scheduled = train_state()
    scheduled["optimizer"]["param_groups"][0]["initial_lr"] = 0.1  # a torch scheduler's mark
    assert end_cause(tmp_path, scheduled, (torch.ones(2), torch.zeros(2))) == "scheduler"


def test_only_the_end_differing_with_no_scheduler_anywhere_names_unsaved_state(
        tmp_path: Path) -> None:
    # An EMA of the weights, never saved, written at the end: verify blamed a scheduler the
    # script does not have (its optimizer holds no initial_lr).
    assert end_cause(tmp_path, train_state(), (torch.ones(2), torch.zeros(2))) == "unsaved"


def test_weights_named_like_a_generator_or_a_sampler_are_the_model_not_the_rng_or_data(
        tmp_path: Path) -> None:
    # A GAN's generator.* and a U-Net's downsamplers.* weights: named by their words, they were
    # "the RNG streams" and "the data position" when a lost optimizer state changed them.
    def gan(weights: float, momentum: float) -> dict[str, Any]:
        state = train_state(momentum=momentum)
        state["model"] = {"generator.0.weight": torch.full((2, 2), weights),
                          "unet.downsamplers.0.conv.weight": torch.full((2,), weights)}
        return state

    assert part_of("train.pt", ("model", "generator.0.weight"), floating=True) == "model"
    assert part_of("train.pt", ("model", "downsamplers.0.conv.weight"), floating=True) == "model"
    assert cause_of(tmp_path, {"train.pt": gan(1.0, 0.5), "rank-0.pt": rank_state()},
                    {"train.pt": gan(1.5, 0.7), "rank-0.pt": rank_state()}) == "optimizer"


def test_an_adam_whose_step_counts_agree_points_at_the_data_order_not_the_optimizer(
        tmp_path: Path) -> None:
    # DataLoader(shuffle=True, generator=g), g never saved: a resume in the second epoch drew
    # the first epoch's order. Adam's per-parameter step counts agree, so it was restored, and
    # "the optimizer" was a wrong cause.
    def adam(weights: float, exp_avg: float) -> dict[str, Any]:
        state = train_state(model=weights)
        state["optimizer"]["state"] = {0: {"step": torch.tensor(16.0),
                                           "exp_avg": torch.full((3, 2), exp_avg)}}
        return state

    assert cause_of(tmp_path, {"train.pt": adam(1.0, 0.5), "rank-0.pt": rank_state()},
                    {"train.pt": adam(1.5, 0.7), "rank-0.pt": rank_state()}) == "data_order"


def test_an_ema_saved_but_not_restored_with_the_optimizer_equal_is_not_blamed_on_the_data(
        tmp_path: Path) -> None:
    # A nanoGPT-style loop (batches drawn from the RNG: no sampler) saving an EMA it does not
    # load: with the optimizer equal, "the checkpoint holds no sampler" was a wrong cause.
    def ema(value: float) -> dict[str, Any]:
        state = train_state()
        del state["sampler"]
        return {**state, "ema": {"0.weight": torch.full((3, 2), value)}}

    assert cause_of(tmp_path, {"train.pt": ema(1.0), "rank-0.pt": rank_state()},
                    {"train.pt": ema(0.9), "rank-0.pt": rank_state()}) == "model"


def test_an_sgd_without_momentum_holds_no_gradients_and_shows_nothing_equal(
        tmp_path: Path) -> None:
    # Its state holds no tensor: equal whatever the gradients, so no evidence that the RNG
    # was equal; a checkpoint without RNG state still points at the RNG.
    def plain_sgd(model: float) -> dict[str, Any]:
        state = train_state(model=model)
        state["optimizer"]["state"] = {}
        return state

    assert cause_of(tmp_path, {"train.pt": plain_sgd(1.0)},
                    {"train.pt": plain_sgd(1.5)}) == "rng"


def rounding_diff(tmp_path: Path, model: float, momentum: float, progress: int = 64):
    for name, state in (("a", train_state()), ("b", train_state(model, momentum, progress))):
        (tmp_path / name).mkdir()
        torch.save(state, tmp_path / name / "train.pt")
        torch.save(rank_state(), tmp_path / name / "rank-0.pt")
    return compare_checkpoints(tmp_path / "a", tmp_path / "b", ["rank-0.pt", "train.pt"])


@pytest.mark.parametrize("world_size", [3, 4])
def test_weights_apart_by_float_rounding_at_three_ranks_or_more_point_at_ddp_buckets(
        tmp_path: Path, world_size: int) -> None:
    cause = ddp_rounding(rounding_diff(tmp_path, 1.0 + 2 ** -23, 0.5 - 2 ** -25), world_size)
    assert cause is not None and cause.name == "ddp_buckets"
    assert "settle_ddp_buckets(model)" in cause.fix and "docs/saving.md" in cause.fix
    assert f"{world_size} ranks ran" in cause.why


def test_rounding_at_two_ranks_does_not_point_at_ddp_buckets(tmp_path: Path) -> None:
    # two ranks sum a + b in either order alike: their layout cannot change a bit
    assert ddp_rounding(rounding_diff(tmp_path, 1.0 + 2 ** -23, 0.5), 2) is None


@pytest.mark.parametrize(("model", "progress"), [(1.001, 64), (1.0 + 2 ** -23, 65)],
                         ids=["beyond-rounding", "data-position-differs"])
def test_differences_rounding_does_not_explain_do_not_point_at_ddp_buckets(
        tmp_path: Path, model: float, progress: int) -> None:
    assert ddp_rounding(rounding_diff(tmp_path, model, 0.5, progress), 4) is None
