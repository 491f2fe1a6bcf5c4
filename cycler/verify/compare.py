"""Compare two committed checkpoints file by file: every tensor bit for bit, every other object
by value (RNG states included), and say where they first differ.

A file is loaded the way its writer saved it: ``torch.save`` files with
``torch.load(weights_only=True)`` (and, only for checkpoints inside verify's own private scratch
directory, the full unpickler where a file holds more than tensors and plain containers); a
torch.distributed.checkpoint save (its ``.metadata`` and ``*.distcp`` shards) as one state dict
per directory; JSON by value; ``safetensors`` by tensor; plain pickles (Accelerate's
``random_states_N.pkl``) by value inside the scratch; anything else byte for byte. Inside
an object, numpy arrays are compared bit for bit as tensors, and objects of a class that
compares by identity (generators, a script's own classes) by what pickling them saves. What
:mod:`.records` calls a record of the run (logs, wall-clock times, paths) is left out and listed.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from cycler.verify.records import Skipped, record_file, record_value

DCP_METADATA = ".metadata"
_DCP_SHARD_SUFFIX = ".distcp"
_LOG = re.compile(r"the run's log")
_TORCH_RNG_STATE_SIZE = 5056
"""Bytes of a CPU torch.Generator's state."""


@dataclass(frozen=True)
class Difference:
    """One place where the two checkpoints differ."""

    file: str
    """The file (or DCP directory, ending in ``/``) as the manifest names it."""
    key: tuple[str, ...]
    """The path of keys and indices inside the file's object (empty: the file as a whole)."""
    what: str
    """``values`` (a tensor's bits or an object's value), ``shape``, ``type``, ``only in the
    reference``, ``only in the resumed run``."""
    largest: float | None = None
    """The largest absolute difference of a numeric tensor or number (``inf`` with a NaN)."""
    scale: float | None = None
    """The largest magnitude in the reference's floating-point tensor (``largest`` over it: the
    difference relative to the tensor's values)."""
    elements: int = 0
    """How many elements of a tensor differ."""
    one_draw_ahead: bool = False
    """A CPU generator state that is the reference's advanced by exactly one int64 draw."""
    record: str | None = None
    """Why the value is a record of the run rather than its state (:mod:`.records`)."""
    scalar: bool = False
    """Both values are plain numbers or strings (not tensors, arrays or containers)."""
    floating: bool = False
    """Both values are floating-point tensors: weights or statistics, never an RNG state, a
    data position or a counter, whatever their names (a GAN's ``generator.*``, a U-Net's
    ``downsamplers.*``)."""

    @property
    def is_tensor(self) -> bool:
        return self.elements > 0

    @property
    def relative(self) -> float | None:
        """``largest`` relative to the reference tensor's largest magnitude (None where either
        is unknown or the reference is all zeros)."""
        if self.largest is None or not self.scale:
            return None
        return self.largest / self.scale

    def where(self) -> str:
        """``train.pt: optimizer.state.3.exp_avg``"""
        return f"{self.file}: {'.'.join(self.key)}" if self.key else self.file


@dataclass(frozen=True)
class CheckpointDiff:
    """Every difference between two checkpoints, and what the reference holds."""

    differences: list[Difference]
    keys: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """Every (file, key path) of a leaf in the reference that is not ``None``: what the
    checkpoint saves at all."""
    tensors: int = 0
    """How many tensors the reference holds."""
    skipped: list[Skipped] = field(default_factory=list)
    """Files and values left out as records of the run (logs, times, paths)."""
    weights: frozenset[tuple[str, tuple[str, ...]]] = frozenset()
    """The (file, key path) of :attr:`keys` that hold floating-point tensors."""

    @property
    def identical(self) -> bool:
        return not self.differences

    @property
    def tensors_differing(self) -> int:
        return sum(1 for d in self.differences if d.is_tensor)

    def without(self, ignored: set[tuple[str, tuple[str, ...]]]) -> CheckpointDiff:
        """The same comparison with the differences at ``ignored`` (file, key) leaves left out."""
        kept = [d for d in self.differences if (d.file, d.key) not in ignored]
        return replace(self, differences=kept)

    @property
    def largest(self) -> float | None:
        """The largest absolute difference of any tensor (``inf`` with a NaN)."""
        sizes = [d.largest for d in self.differences if d.is_tensor and d.largest is not None]
        return max(sizes) if sizes else None


def compare_checkpoints(reference: Path, resumed: Path, files: list[str], *,
                        trusted: bool = False, workdirs: bool = False) -> CheckpointDiff:
    """The differences between two checkpoint directories over ``files`` (the manifest's names,
    relative). ``trusted``: both lie in verify's own private scratch, so a file that
    ``weights_only`` refuses may be unpickled. ``workdirs``: they are the runs' working
    directories, where text and CSV files are logs."""
    differences: list[Difference] = []
    keys: list[tuple[str, tuple[str, ...]]] = []
    skipped: list[Skipped] = []
    weights: set[tuple[str, tuple[str, ...]]] = set()
    tensors = 0
    for name in units(files):
        why = record_file(name, in_workdir=workdirs)
        if why is not None:
            skipped.append(Skipped(name, why))
            continue
        left, right = load_unit(reference, name, trusted), load_unit(resumed, name, trusted)
        for key, value in leaves(left):
            if value is not None:  # a None holds no state: "rng": None saves no RNG
                keys.append((name, key))
            tensors += isinstance(value, torch.Tensor)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                weights.add((name, key))
        for difference in diff_objects(name, left, right):
            if difference.record is None:
                differences.append(difference)
            else:
                skipped.append(Skipped(difference.where(), difference.record))
    return CheckpointDiff(differences, keys, tensors, skipped, frozenset(weights))


def units(files: list[str]) -> list[str]:
    """The files to load: a DCP save's directory once (``dir/``), every other file itself."""
    units: list[str] = []
    for name in sorted(files):
        path = Path(name)
        if path.name == DCP_METADATA or path.suffix == _DCP_SHARD_SUFFIX:
            unit = "./" if str(path.parent) == "." else f"{path.parent}/"
            if unit not in units:
                units.append(unit)
        else:
            units.append(name)
    return units


def load_unit(directory: Path, name: str, trusted: bool) -> Any:
    """The object one unit holds (see the module's docstring); ``MISSING`` when absent."""
    path = directory / name
    if name.endswith("/"):
        return _load_dcp(path) if (path / DCP_METADATA).exists() else MISSING
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return MISSING
    if name.endswith(".json"):
        try:
            return json.loads(data)
        except ValueError:
            return data
    if name.endswith(".safetensors"):
        return _load_safetensors(data)
    return _load_torch(path, trusted, data)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


def _load_torch(path: Path, trusted: bool, data: bytes) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not trusted:
            return data
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 (not a torch file after all: compared byte for byte)
            return _load_pickle(data)
    except Exception:  # noqa: BLE001 (not a torch file: a plain pickle, or bytes)
        return _load_pickle(data) if trusted else data


def _load_pickle(data: bytes) -> Any:
    """A plain pickle (Accelerate's ``random_states_N.pkl``), only inside verify's scratch."""
    try:
        return pickle.loads(data)  # noqa: S301 (verify's own private scratch: see the docstring)
    except Exception:  # noqa: BLE001 (not a pickle: compared byte for byte)
        return data


def _load_safetensors(data: bytes) -> Any:
    try:
        from safetensors.torch import load
    except ImportError:  # not installed: compared byte for byte
        return data
    try:
        return load(data)
    except Exception:  # noqa: BLE001 (not a safetensors file after all)
        return data


def _load_dcp(directory: Path) -> Any:
    """A DCP save as one state dict, read without a process group."""
    import warnings

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    # As torch's own dcp_to_torch_save reads one: the public load() fills only the keys of the
    # state dict it is given, and verify has none to give.
    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        _load_state_dict(state, storage_reader=FileSystemReader(str(directory)),
                         planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def leaves(value: Any, key: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of a nested object with its key path."""
    children = _children(value)
    if children is None:
        yield key, value
        return
    for name, child in children.items():
        yield from leaves(child, (*key, name))


def _children(value: Any) -> dict[str, Any] | None:
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return {str(i): v for i, v in enumerate(value)}
    return None


def diff_objects(file: str, left: Any, right: Any,
                 key: tuple[str, ...] = ()) -> Iterator[Difference]:
    """The differences between two loaded objects, in key order."""
    record = record_value(key, left, right)
    if left is MISSING or right is MISSING:
        if left is not right:
            yield Difference(file, key, "only in the resumed run" if left is MISSING
                             else "only in the reference", record=record)
        return
    left, right = _as_tensor(left), _as_tensor(right)
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        for difference in _diff_tensors(file, key, left, right):
            yield difference if record is None else replace(difference, record=record)
        return
    if _opaque(left, right) and len(key) < _DEEPEST:
        yield from diff_objects(file, _reduced(left), _reduced(right), key)
        return
    mine, theirs = _children(left), _children(right)
    if mine is None or theirs is None:
        if type(left) is not type(right) and (mine is not None or theirs is not None):
            yield Difference(file, key, "type", record=record)
        elif not _same_value(left, right):
            yield Difference(file, key, "values", largest=_number_gap(left, right),
                             record=record, scalar=_scalar(left) and _scalar(right))
        return
    inner = (difference for name in [*mine, *(k for k in theirs if k not in mine)]
             for difference in diff_objects(file, mine.get(name, MISSING),
                                            theirs.get(name, MISSING), (*key, name)))
    if record is not None and _LOG.match(record):
        if next(inner, None) is not None:
            yield Difference(file, key, "values", record=record)  # a whole log: one line
        return
    yield from inner


_DEEPEST = 64
"""Objects nested deeper are compared by value, not taken apart (a cycle of references)."""


def _as_tensor(value: Any) -> Any:
    """A numpy array as a tensor of the same bits (compared bit for bit; ``==`` on arrays gives
    no truth value, and their ``repr`` hides digits and elements); an array of objects as a
    list; anything else as it is."""
    numpy = sys.modules.get("numpy")  # not loaded: no array was unpickled
    if numpy is None or not isinstance(value, numpy.ndarray):
        return value
    if value.dtype.hasobject:
        return value.tolist()
    array = numpy.ascontiguousarray(value)
    try:
        return torch.from_numpy(array)
    except TypeError:  # a dtype torch lacks: its bytes, element by element
        return torch.from_numpy(array.view(numpy.uint8).reshape(*array.shape, -1))


def _opaque(left: Any, right: Any) -> bool:
    """Two objects of one class that compares by identity (no ``__eq__`` of its own: a
    ``torch.Generator``, a numpy ``Generator``, a plain class's instance): ``==`` says two
    equal ones differ, so they are compared by what pickling them saves."""
    kind = type(left)
    return kind is type(right) and left is not right and kind.__eq__ is object.__eq__ \
        and not isinstance(left, type) and _reduced(left) is not None


def _reduced(value: Any) -> dict[str, Any] | None:
    """What pickling ``value`` saves of it: its constructor's arguments and its state."""
    try:
        reduced = value.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 (not picklable: compared by value)
        return None
    if not isinstance(reduced, tuple) or len(reduced) < 2:
        return None  # a global's name: compared by value
    parts = {"args": reduced[1], "state": reduced[2] if len(reduced) > 2 else None}
    for name, index in (("items", 3), ("entries", 4)):
        if len(reduced) > index and reduced[index] is not None:
            parts[name] = list(reduced[index])
    return parts


def _same_value(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float):
        return left == right or (math.isnan(left) and math.isnan(right))
    try:
        return bool(left == right) and type(left) is type(right)
    except Exception:  # noqa: BLE001 (an object without a usable ==: compared by its repr)
        return repr(left) == repr(right)


def _scalar(value: Any) -> bool:
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _number_gap(left: Any, right: Any) -> float | None:
    numbers = (int, float)
    if isinstance(left, numbers) and isinstance(right, numbers):
        gap = abs(float(left) - float(right))
        return math.inf if math.isnan(gap) else gap
    return None


def _diff_tensors(file: str, key: tuple[str, ...], left: Any, right: Any) -> Iterator[Difference]:
    if not (isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor)):
        yield Difference(file, key, "type")
        return
    if left.dtype != right.dtype or left.shape != right.shape:
        yield Difference(file, key, "shape", elements=max(left.numel(), right.numel(), 1))
        return
    a, b = _bytes_of(left), _bytes_of(right)
    if torch.equal(a, b):
        return
    yield Difference(file, key, "values", largest=_largest(left, right),
                     scale=_largest(left, torch.zeros_like(left)),
                     elements=_elements_differing(left, right),
                     one_draw_ahead=one_draw_ahead(left, right),
                     floating=left.is_floating_point())


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as bytes: -0.0 differs from 0.0 and a NaN equals the same NaN."""
    dense = tensor.detach().cpu()
    if dense.layout != torch.strided:
        dense = dense.to_dense()
    return dense.contiguous().reshape(-1).view(torch.uint8)


def _elements_differing(left: torch.Tensor, right: torch.Tensor) -> int:
    size = left.element_size()
    a, b = _bytes_of(left).reshape(-1, size), _bytes_of(right).reshape(-1, size)
    return max(int((a != b).any(dim=1).sum()), 1)


def _largest(left: torch.Tensor, right: torch.Tensor) -> float | None:
    if not left.is_floating_point() or left.numel() == 0:
        return None  # an RNG state's bytes or an index: their gap means nothing
    try:
        gap = (left.detach().cpu().double() - right.detach().cpu().double()).abs()
    except (RuntimeError, TypeError):
        return None
    return math.inf if bool(gap.isnan().any()) else float(gap.max())


def one_draw_ahead(reference: torch.Tensor, resumed: torch.Tensor) -> bool:
    """Whether ``resumed`` is the CPU generator state ``reference`` advanced by one int64 draw:
    what ``iter(DataLoader)`` takes from the global generator when it has none of its own."""
    if reference.dtype != torch.uint8 or reference.numel() != _TORCH_RNG_STATE_SIZE:
        return False
    generator = torch.Generator()
    try:
        generator.set_state(reference.clone())
    except RuntimeError:
        return False
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    return torch.equal(generator.get_state(), resumed)
