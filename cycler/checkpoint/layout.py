"""The checkpoint root's layout: the one owner of checkpoint names, indices and the link.

::

    <root>/
      <prefix>.latest_checkpoint -> <root>/<prefix>_checkpoint_7   the commit record
      <prefix>_checkpoint_7/           a checkpoint: user files + MANIFEST_NAME (written last)
      <prefix>_checkpoint_8/           being written or torn: no manifest, never linked
      <prefix>_checkpoint_3_force/     pinned: retention and prune never remove it
      .cycler/                         the run's record: :class:`cycler.protocol.record.RunRecord`

Everything that needs a checkpoint's name, index, pin or the link asks :class:`CheckpointLayout`;
nothing else parses these names. The records beside them (the index records among them) are
named by the layout's :attr:`CheckpointLayout.record`, never here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cycler._fs import TEMP_MARKER, atomic_write_bytes, is_temporary
from cycler.protocol.environment import DEFAULT_CHECKPOINT_NAME
from cycler.protocol.record import RunRecord

DEFAULT_PREFIX = DEFAULT_CHECKPOINT_NAME
CHECKPOINT_INFIX = "_checkpoint_"
PINNED_SUFFIX = "_force"
LINK_SUFFIX = ".latest_checkpoint"
MANIFEST_NAME = "cycler_manifest.json"


_ANY_CHECKPOINT = re.compile(
    rf"^(?P<prefix>[^./][^/]*?){re.escape(CHECKPOINT_INFIX)}\d+(?:{re.escape(PINNED_SUFFIX)})?$"
)
_ANY_LINK = re.compile(rf"^(?P<prefix>[^./][^/]*){re.escape(LINK_SUFFIX)}$")


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is one of any saver's checkpoint directories (``X_checkpoint_7``), or
    a temporary of one, whatever the prefix."""
    return _ANY_CHECKPOINT.match(name) is not None or is_temporary(name)


def saver_prefixes(root: str | os.PathLike[str]) -> list[str]:
    """The prefixes (AtomicDirectory ``name=``) of every saver that left names in ``root``."""
    try:
        entries = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = set()
    for entry in entries:
        match = _ANY_CHECKPOINT.match(entry) or _ANY_LINK.match(entry)
        if match is not None and not is_temporary(entry):
            found.add(match.group("prefix"))
    return sorted(found)


@dataclass(frozen=True)
class CheckpointName:
    """A parsed checkpoint directory name."""

    prefix: str
    index: int
    pinned: bool

    def __str__(self) -> str:
        suffix = PINNED_SUFFIX if self.pinned else ""
        return f"{self.prefix}{CHECKPOINT_INFIX}{self.index}{suffix}"


class CheckpointLayout:
    """Names and paths of one saver's checkpoints under one root.

    ``prefix`` is AtomicDirectory's ``name=`` (several savers can share a root under different
    prefixes). The root is kept absolute, because the link must hold an absolute target for
    ISC's artifact sync and for users who ``os.readlink`` it.
    """

    def __init__(self, root: str | os.PathLike[str], prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise ValueError(f"checkpoint name {prefix!r} must be a plain, non-hidden file name")
        self.root = Path(os.path.abspath(root))
        self.prefix = prefix
        self.record = RunRecord(self.root)
        """The run's record in the same root (:mod:`cycler.protocol.record`)."""
        # Only the exact spelling str(CheckpointName) produces may parse: "_03", "_\u0663" or a
        # trailing newline would alias another entry's path, and retention could then decide
        # about one entry and delete another.
        self._pattern = re.compile(
            rf"{re.escape(prefix)}{re.escape(CHECKPOINT_INFIX)}(0|[1-9][0-9]*)"
            rf"({re.escape(PINNED_SUFFIX)})?"
        )

    @property
    def link_name(self) -> str:
        return f"{self.prefix}{LINK_SUFFIX}"

    @property
    def link_path(self) -> Path:
        return self.root / self.link_name

    @property
    def index_record_path(self) -> Path:
        """The highest index this saver ever used (kept in the root's record)."""
        return self.record.index_record_path(self.prefix)

    @property
    def first_index_record_path(self) -> Path:
        """The first index cycler used here (kept in the root's record)."""
        return self.record.first_index_record_path(self.prefix)

    def adopt(self) -> None:
        """Record, before cycler prepares its first directory here, the first index it uses.

        Directories below that index that have no manifest were written by another tool
        (cycling_utils): they are legacy checkpoints, never torn ones. A root where an earlier
        cycler prepared (an index record, no adoption record) holds no legacy directories.
        """
        if os.path.lexists(self.first_index_record_path):
            return
        first = 0 if os.path.lexists(self.index_record_path) else self.next_index()
        self.record.directory.mkdir(exist_ok=True)
        atomic_write_bytes(self.first_index_record_path, f"{first}\n".encode())

    def first_own_index(self) -> int | None:
        """The first index cycler prepared in this root, ``None`` if it never prepared here
        (every directory without a manifest is then a legacy checkpoint)."""
        try:
            return int(self.first_index_record_path.read_text().strip())
        except FileNotFoundError:
            return 0 if os.path.lexists(self.index_record_path) else None
        except (OSError, ValueError):
            return None  # unsure: nothing may be taken for torn

    def parse(self, name: str) -> CheckpointName | None:
        """The parsed name if ``name`` is one of this layout's checkpoint names, else ``None``."""
        match = self._pattern.fullmatch(name)
        if match is None:
            return None
        return CheckpointName(self.prefix, int(match.group(1)), match.group(2) is not None)

    def path_of(self, name: CheckpointName) -> Path:
        return self.root / str(name)

    def checkpoint_names(self) -> list[CheckpointName]:
        """Every entry of the root that carries a checkpoint name, by index (files included)."""
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return []
        parsed = (self.parse(entry) for entry in entries if not is_temporary(entry))
        return sorted((name for name in parsed if name is not None), key=lambda n: n.index)

    def temporaries(self) -> list[Path]:
        """Temporaries left in the root by writers that died before their rename."""
        try:
            entries = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return [self.root / entry for entry in entries if is_temporary(entry)]

    def own_temporaries(self) -> list[Path]:
        """Temporaries only this saver's writer makes: of its link, its checkpoint directories
        (a removal cut short) and its two index records.

        While that writer's lock is held, every one of them was left by a writer that died.
        """
        entries = [self.root / entry for entry in _list(self.root)]
        entries += [self.record.directory / entry for entry in _list(self.record.directory)]
        return [path for path in entries if self._owns_temporary(path)]

    def _owns_temporary(self, path: Path) -> bool:
        if not (path.name.startswith(".") and is_temporary(path.name)):
            return False
        final = path.name[1:].split(TEMP_MARKER, 1)[0]
        if path.parent == self.record.directory:
            return final in (self.index_record_path.name, self.first_index_record_path.name)
        return final == self.link_name or self.parse(final) is not None

    def link_target_name(self) -> CheckpointName | None:
        """The checkpoint the link names, resolved by name inside the root, or ``None``.

        The target is read with ``readlink`` and only its last component is used, so a tree
        that was moved or copied still resolves, and a link pointing outside the root can never
        lead a reader there: the name is looked up in this root or not at all.
        """
        try:
            target = os.readlink(self.link_path)
        except OSError:
            return None
        return self.parse(Path(target.rstrip("/")).name)

    def next_index(self) -> int:
        """An index above every index ever used here, including removed ones."""
        used = [name.index for name in self.checkpoint_names()]
        return max([self._recorded_index(), *used], default=-1) + 1

    def record_index(self, index: int) -> None:
        """Remember that ``index`` was used, so that removing its directory never frees it
        (the record only grows: a lower index leaves it as it is)."""
        if index <= self._recorded_index():
            return
        self.adopt()  # an index record alone would make a cycling_utils root's directories torn
        atomic_write_bytes(self.index_record_path, f"{index}\n".encode())

    def _recorded_index(self) -> int:
        try:
            return int(self.index_record_path.read_text().strip())
        except (OSError, ValueError):
            return -1


def _list(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
