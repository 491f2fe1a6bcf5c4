"""AtomicDirectory.save/load with torch.distributed.checkpoint on real gloo ranks (CPU, FSDP2).

Synchronous and asynchronous saves commit through the same protocol as any checkpoint; a state
changed right after an asynchronous save returns does not leak into it; loading reshards from 2
ranks to 1 and to 4; a rank killed during the background write leaves the previous checkpoint
the latest, and the next run resumes from it.
"""

from __future__ import annotations

import datetime
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_on_every_rank
from torch import nn

from cycler import AtomicDirectory, latest_checkpoint, list_checkpoints, read_manifest

TIMEOUT = datetime.timedelta(seconds=20)


def sharded_model() -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (an empty dict elsewhere)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {k: v.clone() for k, v in get_model_state_dict(model, options=options).items()}


def train_a_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(4, 8)).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def app_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, object]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def check_sync_and_async_saves_commit_every_ranks_shards_and_load_in_place(root: Path) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    model = sharded_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    saver = AtomicDirectory(root, keep_last=2, timeout=TIMEOUT)
    train_a_step(model, optimizer)
    saver.save(app_state(model, optimizer), metadata={"step": 1})
    train_a_step(model, optimizer)
    expected = full_weights(model)
    handle = saver.save(app_state(model, optimizer), metadata={"step": 2}, asynchronous=True)
    train_a_step(model, optimizer)  # training goes on while the save is written
    handle.wait()
    manifest = read_manifest(Path(handle.directory))
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(manifest.files)
    assert manifest.step == 2 and manifest.world_size == 2
    state = app_state(model, optimizer)
    assert saver.load(state) == {"step": 2}
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"])
    loaded = full_weights(model)
    assert loaded.keys() == expected.keys() and (dist.get_rank() > 0 or loaded)
    assert all(torch.equal(expected[name], loaded[name]) for name in expected)
    assert saver.load(state, checkpoint=0) == {"step": 1}


def check_a_tensor_changed_after_an_async_save_returns_does_not_leak_in(root: Path) -> None:
    saver = AtomicDirectory(root, timeout=TIMEOUT)
    weights = torch.full((1 << 20,), float(dist.get_rank()))
    handle = saver.save({"weights": weights}, asynchronous=True)
    weights.add_(100.0)  # the staging copy was taken before save() returned
    handle.wait()
    loaded = {"weights": torch.zeros(1 << 20)}
    saver.load(loaded)
    # Replicated tensors are written once (DCP deduplicates): rank 0's values.
    assert torch.equal(loaded["weights"], torch.zeros(1 << 20))


def check_save_sharded_weights_for_resharding(root: Path) -> None:
    model = sharded_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    train_a_step(model, optimizer)
    AtomicDirectory(root, timeout=TIMEOUT).save({"model": app_state(model, optimizer)["model"]})
    weights = full_weights(model)
    if dist.get_rank() == 0:
        torch.save(weights, root / "expected.pt")


def check_load_resharded(root: Path) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    model = sharded_model()
    state = {"model": app_state(model, torch.optim.AdamW(model.parameters()))["model"]}
    AtomicDirectory(root, timeout=TIMEOUT).load(state)
    set_model_state_dict(model, state["model"])
    loaded = full_weights(model)
    if dist.get_rank() == 0:
        expected = torch.load(root / "expected.pt", weights_only=True)
        assert expected.keys() == loaded.keys()
        assert all(torch.equal(expected[name], loaded[name]) for name in expected)


def check_a_rank_killed_during_the_background_write(root: Path) -> None:
    saver = AtomicDirectory(root, timeout=datetime.timedelta(seconds=5))
    weights = torch.arange(1 << 22, dtype=torch.float32)
    saver.save({"weights": weights}, metadata={"step": 1})
    saver.save({"weights": weights + 1}, metadata={"step": 2}, asynchronous=True)
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    with pytest.raises(Exception):  # noqa: B017 (gloo or the store, whichever notices first)
        saver.wait()


def check_the_next_run_resumes_from_the_last_committed(root: Path) -> None:
    state = {"weights": torch.zeros(1 << 22)}
    assert AtomicDirectory(root, timeout=TIMEOUT).load(state) == {"step": 1}
    assert torch.equal(state["weights"], torch.arange(1 << 22, dtype=torch.float32))


def test_sync_and_async_dcp_saves_commit_and_load(tmp_path: Path) -> None:
    run_on_every_rank(__name__, "check_sync_and_async_saves_commit_every_ranks_shards_and_load"
                      "_in_place", "check_a_tensor_changed_after_an_async_save_returns_does_not"
                      "_leak_in", root=tmp_path)


@pytest.mark.parametrize("world_size", [1, 4])
def test_a_checkpoint_saved_by_2_ranks_loads_on_1_and_on_4(tmp_path: Path,
                                                            world_size: int) -> None:
    run_on_every_rank(__name__, "check_save_sharded_weights_for_resharding", root=tmp_path)
    root = tmp_path / "check_save_sharded_weights_for_resharding"
    (tmp_path / "check_load_resharded").symlink_to(root)
    run_on_every_rank(__name__, "check_load_resharded", root=tmp_path, world_size=world_size)


def test_kill_9_during_an_async_write_leaves_the_previous_checkpoint_latest(
        tmp_path: Path) -> None:
    with pytest.raises(Exception, match="signal|exit"):  # noqa: B017 (rank 1 killed itself)
        run_on_every_rank(__name__, "check_a_rank_killed_during_the_background_write",
                          root=tmp_path)
    root = tmp_path / "check_a_rank_killed_during_the_background_write"
    latest = latest_checkpoint(root)
    assert latest is not None and read_manifest(latest).step == 1
    assert [c.index for c in list_checkpoints(root) if c.valid] == [0]
    (tmp_path / "check_the_next_run_resumes_from_the_last_committed").symlink_to(root)
    run_on_every_rank(__name__, "check_the_next_run_resumes_from_the_last_committed",
                      root=tmp_path)
