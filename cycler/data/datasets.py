"""A per-rank shard of a class-folder dataset, loaded into memory (cycling_utils' API).

The layout is torchvision's ``DatasetFolder``: ``root/<class name>/**/<file>``, classes sorted by
name and numbered from 0. torchvision is not needed.

Each rank shuffles the global file list with its own ``random.Random(seed)`` (the same order
cycling_utils produced, without reseeding Python's global generator), then deals itself every
``world_size``-th file starting at its rank until it holds ``ceil(samples_pct_per_replica * N)``
files. Shards are disjoint when ``samples_pct_per_replica * world_size <= 1``; larger fractions
wrap around the list and overlap on purpose. Pair it with a sampler that does not shard again.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cycler.errors import ConfigError, DatasetNotFound

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
TENSOR_EXTENSIONS = (".pt", ".pth")
DEFAULT_EXTENSIONS = IMG_EXTENSIONS + TENSOR_EXTENSIONS

Transform = Callable[[Any], Any]


def default_loader(path: str) -> Any:
    """Read one file: ``.pt``/``.pth`` with ``torch.load(weights_only=True)``, images as RGB PIL
    images (needs pillow, as cycling_utils' default did), anything else as raw ``bytes``."""
    lowered = path.lower()
    if lowered.endswith(TENSOR_EXTENSIONS):
        return torch.load(path, map_location="cpu", weights_only=True)
    if lowered.endswith(IMG_EXTENSIONS):
        return _load_image(path)
    with open(path, "rb") as file:
        return file.read()


def _load_image(path: str) -> Any:
    try:
        from PIL import Image
    except ImportError as error:
        raise ConfigError(
            f"{path} is an image and reading images needs pillow: pip install pillow, "
            "or pass loader= to DistributedShardedDataset."
        ) from error
    with Image.open(path) as image:
        return image.convert("RGB")


class DistributedShardedDataset:
    """This rank's shard of ``root``, loaded at construction; items are ``(sample, target)``.

    ``samples_pct_per_replica`` is a fraction of the whole dataset in (0, 1], despite its
    cycling_utils name: 0.25 means a quarter. ``loader(path)`` reads a file (default:
    :func:`default_loader`); ``sample_load_transform``/``target_load_transform`` run once at
    load time, ``transform``/``target_transform`` on every ``__getitem__``. ``extensions``
    selects files by suffix (``None``: every non-hidden file) unless ``is_valid_file`` is given.
    With ``device``, samples (tensors of one shape) and targets are stacked and moved there.

    The positional order is cycling_utils' (``device_id``, ``seed``, ``shuffle``, ``loader``,
    ``extensions``, the load and getitem transforms, ``is_valid_file``); ``device``,
    ``transform`` and ``target_transform`` are keyword-only names for ``device_id`` and the
    getitem transforms.

    Attributes: ``classes``, ``class_to_idx``, ``files`` (this shard's ``(path, class_index)``
    pairs, in item order), ``samples`` and ``targets`` (loaded; tensors when on a device).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        rank: int,
        world_size: int,
        samples_pct_per_replica: float,
        device_id: torch.device | str | int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        loader: Callable[[str], Any] | None = None,
        extensions: Sequence[str] | None = DEFAULT_EXTENSIONS,
        sample_load_transform: Transform | None = None,
        target_load_transform: Transform | None = None,
        sample_getitem_transform: Transform | None = None,
        target_getitem_transform: Transform | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        *,
        transform: Transform | None = None,
        target_transform: Transform | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        _check_shard_arguments(rank, world_size, samples_pct_per_replica)
        self.root = os.fspath(root)
        self.transform = _one_of(
            "transform", transform, "sample_getitem_transform", sample_getitem_transform
        )
        self.target_transform = _one_of(
            "target_transform",
            target_transform,
            "target_getitem_transform",
            target_getitem_transform,
        )
        self.classes, self.class_to_idx = find_classes(self.root)
        is_valid = is_valid_file or _suffix_filter(extensions)
        every_file = list_files(self.root, self.class_to_idx, is_valid)
        order = shard_indices(
            len(every_file), rank, world_size, samples_pct_per_replica, seed=seed, shuffle=shuffle
        )
        self.files = [every_file[index] for index in order]
        self.samples, self.targets = _load(
            self.files,
            loader or default_loader,
            sample_load_transform,
            target_load_transform,
            _one_of("device", device, "device_id", device_id),
        )

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        sample, target = self.samples[index], self.targets[index]
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target


def _check_shard_arguments(rank: int, world_size: int, fraction: float) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be an int >= 1, got {world_size!r}.")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an int in [0, {world_size - 1}], got {rank!r}.")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ConfigError(f"samples_pct_per_replica must be a number, got {fraction!r}.")
    if not 0 < fraction <= 1:
        raise ConfigError(
            f"samples_pct_per_replica must be a fraction in (0, 1], got {fraction!r}: "
            "it is a fraction of the whole dataset, not a percent (pass 0.25 for 25%)."
        )


def _one_of(name: str, value: Any, alias: str, alias_value: Any) -> Any:
    if value is not None and alias_value is not None:
        raise ConfigError(f"pass {name} or its cycling_utils name {alias}, not both.")
    return value if value is not None else alias_value


def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """The sorted class folder names of ``root`` and their indices, as torchvision finds them."""
    if not os.path.exists(root):
        raise DatasetNotFound(f"dataset root {root} does not exist.")
    if not os.path.isdir(root):
        raise DatasetNotFound(f"dataset root {root} is not a directory.")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise DatasetNotFound(
            f"dataset root {root} has no class folders: put each class's files in "
            f"{root}/<class name>/."
        )
    return classes, {name: index for index, name in enumerate(classes)}


def list_files(
    root: str, class_to_idx: dict[str, int], is_valid_file: Callable[[str], bool]
) -> list[tuple[str, int]]:
    """Every ``(path, class_index)`` under the class folders, in class then path order."""
    files: list[tuple[str, int]] = []
    empty: list[str] = []
    for name in sorted(class_to_idx):
        found = _files_under(os.path.join(root, name), is_valid_file)
        files.extend((path, class_to_idx[name]) for path in found)
        if not found:
            empty.append(name)
    if empty:
        raise DatasetNotFound(
            f"class folder(s) {', '.join(empty)} under {root} hold no matching files: add files, "
            "remove the folders, or change extensions= / is_valid_file=."
        )
    return files


def _files_under(folder: str, is_valid_file: Callable[[str], bool]) -> list[str]:
    found: list[str] = []
    for directory, _, names in sorted(os.walk(folder, followlinks=True)):
        paths = (os.path.join(directory, name) for name in sorted(names))
        found.extend(path for path in paths if is_valid_file(path))
    return found


def _suffix_filter(extensions: Sequence[str] | None) -> Callable[[str], bool]:
    if extensions is None:
        return lambda path: not os.path.basename(path).startswith(".")
    suffixes = tuple(suffix.lower() for suffix in extensions)
    return lambda path: path.lower().endswith(suffixes)


def shard_indices(
    length: int, rank: int, world_size: int, fraction: float, *, seed: int, shuffle: bool
) -> list[int]:
    """The global indices this rank holds, in item order (see the module docstring)."""
    order = list(range(length))
    if shuffle:
        random.Random(seed).shuffle(order)
    # round() first: 0.1 * 30 is 3.0000000000000004 in floating point, which must give 3, not 4.
    count = math.ceil(round(fraction * length, 9))
    return [order[(rank + k * world_size) % length] for k in range(count)]


def _load(
    files: list[tuple[str, int]],
    loader: Callable[[str], Any],
    sample_transform: Transform | None,
    target_transform: Transform | None,
    device: torch.device | str | int | None,
) -> tuple[Any, Any]:
    samples = [loader(path) for path, _ in files]
    targets: list[Any] = [target for _, target in files]
    if sample_transform is not None:
        samples = [sample_transform(sample) for sample in samples]
    if target_transform is not None:
        targets = [target_transform(target) for target in targets]
    if device is None:
        return samples, targets
    return _stack(samples, "samples").to(device), _stack(targets, "targets").to(device)


def _stack(values: list[Any], what: str) -> torch.Tensor:
    try:
        if all(isinstance(value, torch.Tensor) for value in values):
            return torch.stack(values)
        return torch.as_tensor(values)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ConfigError(
            f"moving the shard to a device needs {what} that are tensors (or numbers) of one "
            f"shape ({error}): make them so with a load transform, or pass device=None."
        ) from error
