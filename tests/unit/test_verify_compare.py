"""cycle verify's comparison, on checkpoints built by hand (no processes)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from cycler.verify.compare import compare_checkpoints, one_draw_ahead


def checkpoint(directory: Path, files: dict[str, Any]) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        if name.endswith(".json"):
            (directory / name).write_text(json.dumps(value))
        elif isinstance(value, bytes):
            (directory / name).write_bytes(value)
        else:
            torch.save(value, directory / name)
    return sorted(files)


def state(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"0.weight": torch.ones(3, 2), "0.bias": torch.zeros(3)},
        "optimizer": {"state": {0: {"exp_avg": torch.full((3, 2), 0.5)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
        "sampler": {"epoch": 1, "progress": 64},
    }
    base.update(changes)
    return base


def test_identical_checkpoints_have_no_difference(tmp_path: Path) -> None:
    files = checkpoint(tmp_path / "a", {"train.pt": state()})
    checkpoint(tmp_path / "b", {"train.pt": state()})
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files)
    assert diff.identical
    assert diff.tensors == 3


def test_a_tensor_that_differs_is_named_by_its_key_path_with_its_largest_difference(
        tmp_path: Path) -> None:
    optimizer = {"state": {3: {"exp_avg": torch.tensor([1.0, 2.0, 3.0])}}, "param_groups": []}
    changed = {"state": {3: {"exp_avg": torch.tensor([1.0, 2.5, 3.0])}}, "param_groups": []}
    files = checkpoint(tmp_path / "a", {"train.pt": state(optimizer=optimizer)})
    checkpoint(tmp_path / "b", {"train.pt": state(optimizer=changed)})
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files)
    (difference,) = diff.differences
    assert difference.where() == "train.pt: optimizer.state.3.exp_avg"
    assert difference.elements == 1 and difference.largest == 0.5
    assert diff.tensors_differing == 1


def test_tensors_are_compared_bit_for_bit(tmp_path: Path) -> None:
    files = checkpoint(tmp_path / "a", {"m.pt": {"zero": torch.tensor([0.0]),
                                                 "nan": torch.tensor([math.nan])}})
    checkpoint(tmp_path / "b", {"m.pt": {"zero": torch.tensor([-0.0]),
                                         "nan": torch.tensor([math.nan])}})
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files)
    assert [d.where() for d in diff.differences] == ["m.pt: zero"]


def test_other_objects_are_compared_by_value_and_missing_keys_are_named(tmp_path: Path) -> None:
    files = checkpoint(tmp_path / "a", {"train.pt": state(), "meta.json": {"step": 8}})
    checkpoint(tmp_path / "b", {"train.pt": state(sampler={"epoch": 1}),
                                "meta.json": {"step": 9}})
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files)
    found = {(d.where(), d.what) for d in diff.differences}
    assert found == {("meta.json: step", "values"),
                     ("train.pt: sampler.progress", "only in the reference")}


def test_a_shape_or_dtype_change_is_a_difference(tmp_path: Path) -> None:
    files = checkpoint(tmp_path / "a", {"m.pt": {"w": torch.zeros(2, 2)}})
    checkpoint(tmp_path / "b", {"m.pt": {"w": torch.zeros(2, 2, dtype=torch.float64)}})
    (difference,) = compare_checkpoints(tmp_path / "a", tmp_path / "b", files).differences
    assert difference.what == "shape"


def test_a_file_torch_cannot_read_is_compared_byte_for_byte(tmp_path: Path) -> None:
    files = checkpoint(tmp_path / "a", {"notes.bin": b"abc"})
    checkpoint(tmp_path / "b", {"notes.bin": b"abd"})
    (difference,) = compare_checkpoints(tmp_path / "a", tmp_path / "b", files).differences
    assert difference.where() == "notes.bin"


def test_a_file_of_pickled_objects_is_not_unpickled_outside_a_trusted_scratch(
        tmp_path: Path) -> None:
    class Opaque:
        pass
    files = checkpoint(tmp_path / "a", {"x.pt": {"o": Opaque.__name__, "p": Path("x")}})
    checkpoint(tmp_path / "b", {"x.pt": {"o": Opaque.__name__, "p": Path("x")}})
    assert compare_checkpoints(tmp_path / "a", tmp_path / "b", files).identical  # bytes equal
    assert compare_checkpoints(tmp_path / "a", tmp_path / "b", files, trusted=True).identical


def test_a_dcp_save_is_compared_as_one_state_dict(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    for name, value in (("a", 1.0), ("b", 2.0)):
        dcp.save({"model": {"w": torch.full((4,), value)}, "step": 3},
                 storage_writer=dcp.FileSystemWriter(str(tmp_path / name / "dcp")), no_dist=True)
    files = [f"dcp/{p.name}" for p in (tmp_path / "a" / "dcp").iterdir()]
    (difference,) = compare_checkpoints(tmp_path / "a", tmp_path / "b", files).differences
    assert difference.where() == "dcp/: model.w" and difference.largest == 1.0


def test_a_generator_state_one_dataloader_seed_draw_ahead_is_recognised() -> None:
    generator = torch.Generator().manual_seed(0)
    before = generator.get_state()
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    assert one_draw_ahead(before, generator.get_state())
    torch.rand(3, generator=generator)
    assert not one_draw_ahead(before, generator.get_state())


def test_numpy_arrays_are_compared_bit_for_bit_not_by_their_repr(tmp_path: Path) -> None:
    # Compared by repr, an array of more than 1000 elements showed only its ends, and a float
    # array only 8 digits: a resume that changed the middle or the 12th digit was identical.
    import numpy as np

    ema = np.linspace(0.0, 1.0, 5000)
    tiny = ema.copy()
    tiny[2500] += 1e-12
    files = checkpoint(tmp_path / "a", {"train.pt": {"ema": ema, "same": ema}})
    checkpoint(tmp_path / "b", {"train.pt": {"ema": tiny, "same": ema.copy()}})
    diff = compare_checkpoints(tmp_path / "a", tmp_path / "b", files, trusted=True)
    assert [(d.key, d.elements) for d in diff.differences] == [(("ema",), 1)]


def test_generators_and_plain_objects_are_compared_by_what_they_hold_not_by_identity(
        tmp_path: Path) -> None:
    # Such objects compare by identity: two loaded from equal files always differed, and an
    # exact resume that saved a numpy or torch generator object was DIFFERENT.
    import numpy as np

    def saved(draws: int) -> dict[str, Any]:
        numpy_rng, torch_rng = np.random.default_rng(7), torch.Generator().manual_seed(7)
        numpy_rng.random(draws)
        torch.randn(draws, generator=torch_rng)
        return {"numpy_rng": numpy_rng, "torch_rng": torch_rng, "ema": _Ema(draws)}

    files = checkpoint(tmp_path / "a", {"train.pt": saved(3)})
    checkpoint(tmp_path / "b", {"train.pt": saved(3)})
    checkpoint(tmp_path / "c", {"train.pt": saved(4)})
    same = compare_checkpoints(tmp_path / "a", tmp_path / "b", files, trusted=True)
    assert same.identical, same.differences
    other = compare_checkpoints(tmp_path / "a", tmp_path / "c", files, trusted=True)
    assert {d.key[0] for d in other.differences} == {"numpy_rng", "torch_rng", "ema"}


class _Ema:
    """A plain class without ``__eq__``, as a script's own state often is."""

    def __init__(self, updates: int) -> None:
        self.updates = updates
