from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from cycler.data.datasets import DistributedShardedDataset, shard_indices
from cycler.errors import ConfigError, DatasetNotFound


def _make_folder(root: Path, per_class: dict[str, int], suffix: str = ".pt") -> Path:
    for class_index, (name, count) in enumerate(sorted(per_class.items())):
        (root / name).mkdir(parents=True)
        for i in range(count):
            torch.save(torch.tensor([class_index, i]), root / name / f"{i:03d}{suffix}")
    return root


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return _make_folder(tmp_path / "data", {"cat": 7, "dog": 5, "eel": 8})


def _shard(
    root: Path, rank: int, world_size: int, fraction: float, **options: object
) -> DistributedShardedDataset:
    return DistributedShardedDataset(root, rank, world_size, fraction, **options)  # type: ignore[arg-type]


def test_classes_are_the_sorted_folder_names_and_items_carry_their_class_index(
    folder: Path,
) -> None:
    dataset = _shard(folder, 0, 1, 1.0)
    assert dataset.classes == ["cat", "dog", "eel"]
    assert dataset.class_to_idx == {"cat": 0, "dog": 1, "eel": 2}
    assert len(dataset) == 20
    for sample, target in (dataset[i] for i in range(len(dataset))):
        assert int(sample[0]) == target


def test_shards_of_a_fraction_times_world_size_up_to_one_are_disjoint(folder: Path) -> None:
    shards = [_shard(folder, rank, 4, 0.25) for rank in range(4)]
    paths = [path for shard in shards for path, _ in shard.files]
    assert [len(shard) for shard in shards] == [5, 5, 5, 5]
    assert len(set(paths)) == 20


def test_the_same_arguments_give_the_same_shard_and_another_seed_another_one(
    folder: Path,
) -> None:
    assert _shard(folder, 1, 2, 0.5).files == _shard(folder, 1, 2, 0.5).files
    assert _shard(folder, 1, 2, 0.5).files != _shard(folder, 1, 2, 0.5, seed=1).files


def test_building_a_shard_leaves_the_global_random_streams_alone(folder: Path) -> None:
    python_state, torch_state = random.getstate(), torch.get_rng_state()
    _shard(folder, 0, 2, 0.5, seed=123)
    assert random.getstate() == python_state
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_the_shard_order_matches_cycling_utils_global_reseed_and_shuffle() -> None:
    # cycling_utils did random.seed(seed); random.shuffle(samples): the same permutation.
    state = random.getstate()
    random.seed(5)
    expected = list(range(10))
    random.shuffle(expected)
    random.setstate(state)
    assert shard_indices(10, 0, 1, 1.0, seed=5, shuffle=True) == expected


def test_the_shard_size_is_the_ceiling_of_the_fraction_without_float_error() -> None:
    assert len(shard_indices(30, 0, 1, 0.1, seed=0, shuffle=False)) == 3
    assert len(shard_indices(10, 0, 3, 0.25, seed=0, shuffle=False)) == 3


def test_a_fraction_above_one_over_world_size_wraps_around_and_overlaps() -> None:
    assert shard_indices(4, 1, 2, 1.0, seed=0, shuffle=False) == [1, 3, 1, 3]


def test_transforms_run_once_at_load_and_on_every_get(folder: Path) -> None:
    dataset = _shard(
        folder,
        0,
        1,
        1.0,
        shuffle=False,
        sample_load_transform=lambda s: s * 10,
        transform=lambda s: s + 1,
        target_transform=lambda t: f"class {t}",
    )
    sample, target = dataset[0]
    assert sample.tolist() == [1, 1]
    assert target == "class 0"
    assert dataset.samples[0].tolist() == [0, 0]


def test_a_device_stacks_samples_and_targets_into_tensors(folder: Path) -> None:
    dataset = _shard(folder, 0, 2, 0.5, device="cpu")
    assert isinstance(dataset.samples, torch.Tensor) and dataset.samples.shape == (10, 2)
    assert isinstance(dataset.targets, torch.Tensor)
    assert dataset.samples[:, 0].tolist() == dataset.targets.tolist()


def test_samples_of_different_shapes_cannot_go_to_a_device(folder: Path) -> None:
    with pytest.raises(ConfigError, match="one shape"):
        _shard(
            folder, 0, 1, 1.0, device="cpu", sample_load_transform=lambda s: s[: int(s[1]) % 2 + 1]
        )


def test_a_custom_loader_and_extension_filter_pick_the_files(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.txt").write_text(name)
        (tmp_path / name / "skip.pt").write_bytes(b"")
    dataset = _shard(
        tmp_path, 0, 1, 1.0, extensions=(".TXT",), loader=lambda p: Path(p).read_text()
    )
    assert sorted(dataset.samples) == ["a", "b"]


def test_without_a_loader_unknown_files_are_read_as_bytes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"\x01\x02")
    assert _shard(tmp_path, 0, 1, 1.0, extensions=None).samples == [b"\x01\x02"]


def test_a_missing_root_is_dataset_not_found(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFound, match="does not exist"):
        _shard(tmp_path / "nope", 0, 1, 1.0)


def test_a_root_that_is_a_file_is_dataset_not_found(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetNotFound, match="not a directory"):
        _shard(tmp_path / "file", 0, 1, 1.0)


def test_a_root_without_class_folders_is_dataset_not_found(tmp_path: Path) -> None:
    (tmp_path / "loose.pt").write_bytes(b"")
    with pytest.raises(DatasetNotFound, match="no class folders"):
        _shard(tmp_path, 0, 1, 1.0)


def test_class_folders_without_matching_files_are_named(tmp_path: Path) -> None:
    _make_folder(tmp_path, {"cat": 2, "dog": 0, "eel": 0})
    with pytest.raises(DatasetNotFound, match="dog, eel") as raised:
        _shard(tmp_path, 0, 1, 1.0)
    assert isinstance(raised.value, FileNotFoundError)


@pytest.mark.parametrize(
    ("rank", "world_size", "fraction", "named"),
    [
        (0, 1, 0.0, "samples_pct_per_replica"),
        (0, 1, 25, "not a percent"),
        (0, 1, float("nan"), "samples_pct_per_replica"),
        (0, 1, True, "samples_pct_per_replica"),
        (2, 2, 0.5, "rank"),
        (0, 0, 0.5, "world_size"),
    ],
)
def test_bad_shard_arguments_are_config_errors_naming_the_argument(
    folder: Path, rank: int, world_size: int, fraction: float, named: str
) -> None:
    with pytest.raises(ConfigError, match=named) as raised:
        _shard(folder, rank, world_size, fraction)
    assert isinstance(raised.value, ValueError)


def test_a_cycling_utils_name_and_its_new_name_together_are_refused(folder: Path) -> None:
    with pytest.raises(ConfigError, match="device_id"):
        _shard(folder, 0, 1, 1.0, device="cpu", device_id="cpu")
