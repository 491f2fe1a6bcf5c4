"""What is on disk: every checkpoint of a root with its state, and the newest valid one.

This is the one reader of the layout. ``latest_checkpoint`` (resume), ``cycle status``,
``cycle prune`` and retention all see checkpoints through :func:`list_checkpoints`, so they can
never disagree about which checkpoint is valid or latest.
"""

from __future__ import annotations

import enum
import functools
import os
import stat
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cycler._fs import atomic_write_bytes
from cycler.checkpoint.layout import DEFAULT_PREFIX, MANIFEST_NAME, CheckpointLayout, CheckpointName
from cycler.checkpoint.manifest import CHECKSUM_MISMATCH, Manifest, check_files, read_manifest
from cycler.errors import CheckpointNotFound, CorruptCheckpoint
from cycler.protocol.environment import ENV_RESUME_FROM, default_checkpoint_root

NEVER_COMMITTED = "no manifest (never committed)"
"""The problem of a directory whose commit never wrote its manifest: state ``incomplete``."""


class CheckpointWarning(UserWarning):
    """The latest link could not be used and an older or unlinked checkpoint was chosen."""


class CheckpointState(str, enum.Enum):
    LATEST = "latest"
    VALID = "valid"
    PINNED = "pinned"
    INCOMPLETE = "incomplete"
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class Checkpoint:
    """One entry of the root that carries a checkpoint name."""

    name: CheckpointName
    path: Path
    manifest: Manifest | None
    problem: str | None
    """Why it is not valid (``None`` when valid)."""
    is_latest: bool = False
    is_directory: bool = True

    @property
    def valid(self) -> bool:
        return self.problem is None

    @property
    def index(self) -> int:
        return self.name.index

    @property
    def pinned(self) -> bool:
        return self.name.pinned

    @property
    def state(self) -> CheckpointState:
        if self.is_directory and self.problem == NEVER_COMMITTED:
            return CheckpointState.INCOMPLETE
        if not self.valid:
            return CheckpointState.CORRUPT
        if self.is_latest:
            return CheckpointState.LATEST
        return CheckpointState.PINNED if self.pinned else CheckpointState.VALID


def inspect_checkpoint(layout: CheckpointLayout, name: CheckpointName,
                       verify: bool = False) -> Checkpoint:
    """Validate one entry: a real directory whose files match its manifest."""
    path = layout.path_of(name)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return Checkpoint(name, path, None, "does not exist", is_directory=False)
    if stat.S_ISLNK(mode):
        return Checkpoint(name, path, None, "is a symlink; cycler never follows it",
                          is_directory=False)
    if not stat.S_ISDIR(mode):
        return Checkpoint(name, path, None, "is a file, not a directory", is_directory=False)
    try:
        manifest = read_manifest(path)
    except CorruptCheckpoint as error:
        missing = not os.path.lexists(path / MANIFEST_NAME)
        return Checkpoint(name, path, None, NEVER_COMMITTED if missing else str(error))
    problem = check_files(path, manifest, checksums=verify)
    return Checkpoint(name, path, manifest, problem)


def glance_at_checkpoint(layout: CheckpointLayout, name: CheckpointName) -> Checkpoint:
    """Only whether an entry is a real directory with a manifest, read from two ``lstat``s:
    enough for retention after a commit, where reading every manifest made each commit's cost
    grow with the checkpoints kept (52 ms with 600 of them). ``manifest`` stays ``None``."""
    path = layout.path_of(name)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return Checkpoint(name, path, None, "does not exist", is_directory=False)
    if not stat.S_ISDIR(mode):
        return inspect_checkpoint(layout, name)  # a link or a file: say exactly what
    if not os.path.lexists(path / MANIFEST_NAME):
        return Checkpoint(name, path, None, NEVER_COMMITTED)
    return Checkpoint(name, path, None, None)


def list_checkpoints(root: str | os.PathLike[str], name: str = DEFAULT_PREFIX,
                     verify: bool = False, glance: bool = False) -> list[Checkpoint]:
    """Every checkpoint of saver ``name`` under ``root`` by index, the latest one marked.

    ``glance`` only tells committed directories from torn ones (:func:`glance_at_checkpoint`).
    """
    layout = CheckpointLayout(root, name)
    names = layout.checkpoint_names()
    if glance:
        found = [glance_at_checkpoint(layout, entry) for entry in names]
    else:
        found = [inspect_checkpoint(layout, entry, verify) for entry in names]
    by_name = {c.name: c for c in found}
    latest, _ = _choose_latest(layout, [c.name for c in found], by_name.__getitem__)
    return [_marked(c, latest) for c in found]


def _marked(checkpoint: Checkpoint, latest: Checkpoint | None) -> Checkpoint:
    if latest is None or checkpoint.path != latest.path:
        return checkpoint
    return Checkpoint(checkpoint.name, checkpoint.path, checkpoint.manifest, None, True)


def _choose_latest(layout: CheckpointLayout, names: list[CheckpointName],
                   inspect: Callable[[CheckpointName], Checkpoint],
                   ) -> tuple[Checkpoint | None, str | None]:
    """The link target if valid, else the newest valid by index, with what was wrong.

    ``inspect`` is called only as far as needed: the link target alone when it is valid,
    else from the newest index down to the first valid one.
    """
    target = layout.link_target_name()
    linked = inspect(target) if target in names else None
    if linked is not None and linked.valid:
        return linked, link_outside_root(layout, names)
    newest = next((c for c in map(inspect, reversed(names)) if c.valid), None)
    if newest is None:
        return None, None
    return newest, _link_problem(layout, target, linked)


def link_outside_root(layout: CheckpointLayout, names: list[CheckpointName]) -> str | None:
    """What is suspicious about a latest link whose target lies outside the root, or ``None``.

    The target is resolved by its name inside the root, which is silent and right when the
    tree was moved or copied (the name is this root's newest checkpoint); it is said aloud when
    the name inside is an older checkpoint than this root's newest, which a link meant for
    another tree would silently make the resume point.
    """
    try:
        target = Path(os.readlink(layout.link_path))
    except OSError:
        return None
    if not target.is_absolute() or os.path.realpath(target.parent) == os.path.realpath(
            layout.root):
        return None
    newest = max((name.index for name in names), default=None)
    named = layout.parse(target.name)
    if named is not None and named.index == newest:
        return None
    return (f"{layout.link_name} points outside the root, at {target}; this root's "
            f"{target.name} is used, not that directory")


def _link_problem(layout: CheckpointLayout, target: CheckpointName | None,
                  linked: Checkpoint | None) -> str:
    link = layout.link_name
    if not os.path.lexists(layout.link_path):
        return f"{link} is missing"
    if not os.path.islink(layout.link_path):
        # A copy made with symlinks dereferenced (cp -L, some sync tools) turns the link into
        # a plain file or directory: a broken link, not a reason to fail the resume.
        return f"{link} is not a symlink"
    if target is None:
        return f"{link} does not name a checkpoint of this root ({os.readlink(layout.link_path)})"
    if linked is None:
        return f"{link} points at {target}, which does not exist"
    return f"{link} points at {target}, which is {linked.state.value}: {linked.problem}"


def latest_checkpoint(root: str | os.PathLike[str] | None = None, name: str = DEFAULT_PREFIX,
                      verify: bool = True) -> Path | None:
    """The newest valid checkpoint directory under ``root``, or ``None`` if there is none.

    The latest link's target when it validates; otherwise the newest valid checkpoint by index,
    with a :class:`CheckpointWarning` that names what was wrong. A directory without a valid
    manifest is never returned. ``verify`` (the default: this is what a resume asks) also
    checks the checksum of every file of the checkpoint it returns, so a bit flipped on disk is
    never resumed: one read of that checkpoint's data, not of the others. A checkpoint that
    fails it is recorded under ``.cycler/``, where ``cycle status`` shows it as corrupt.
    ``root`` defaults to ``$CYCLER_CHECKPOINT_DIR``, ``$CHECKPOINT_ARTIFACT_PATH``,
    ``./checkpoints``. When ``cycle run --resume-from NAME`` set ``$CYCLER_RESUME_FROM`` to one
    of this saver's checkpoints, that checkpoint is returned instead (validated).
    """
    layout = CheckpointLayout(_root_or_default(root), name)
    requested = os.environ.get(ENV_RESUME_FROM)
    if requested and (layout.parse(requested) or _by_index(layout, requested)):
        return find_checkpoint(layout.root, requested, name, verify)
    # Resuming validates the link target only, not every checkpoint (with verify=True that
    # would read the data of all of them); older ones are inspected only if it is unusable.
    inspect = functools.cache(lambda entry: inspect_checkpoint(layout, entry, verify))
    latest, problem = _choose_latest(layout, layout.checkpoint_names(), inspect)
    if problem is None:
        return None if latest is None else latest.path
    target = layout.link_target_name()
    fell_back = latest is not None and latest.name != target
    if verify and fell_back and target is not None:
        linked = inspect(target)  # inspected already: cached
        if linked.problem and CHECKSUM_MISMATCH in linked.problem:
            record_failed_verification(layout, linked)
    if latest is not None:
        using = f"; using {latest.path.name} instead" if fell_back else ""
        warnings.warn(f"{problem}{using}", CheckpointWarning, stacklevel=2)
    return None if latest is None else latest.path


def record_failed_verification(layout: CheckpointLayout, checkpoint: Checkpoint) -> None:
    """Remember that ``checkpoint`` failed its checksums (for ``cycle status``); best effort."""
    try:
        atomic_write_bytes(layout.verification_record_path(checkpoint.name),
                           (checkpoint.problem or "").encode(), durable=False)
    except OSError:
        pass


def failed_verification(layout: CheckpointLayout, name: CheckpointName) -> str | None:
    """What a resume's verification found wrong with ``name``, if it failed."""
    try:
        return layout.verification_record_path(name).read_text() or "checksum mismatch"
    except OSError:
        return None


def find_checkpoint(root: str | os.PathLike[str], checkpoint: str,
                    name: str = DEFAULT_PREFIX, verify: bool = False) -> Path:
    """The checkpoint directory called ``checkpoint`` (a name or an index), validated."""
    layout = CheckpointLayout(root, name)
    parsed = layout.parse(checkpoint) or _by_index(layout, checkpoint)
    if parsed is None:
        raise CheckpointNotFound(
            f"no checkpoint named {checkpoint!r} in {layout.root}; see `cycle status`"
        )
    found = inspect_checkpoint(layout, parsed, verify)
    if not found.valid:
        raise CorruptCheckpoint(f"{found.path} {found.problem}; pick another with `cycle status`")
    return found.path


def _by_index(layout: CheckpointLayout, text: str) -> CheckpointName | None:
    if not text.isdigit():
        return None
    return next((n for n in layout.checkpoint_names() if n.index == int(text)), None)


def _root_or_default(root: str | os.PathLike[str] | None) -> Path:
    return Path(root) if root is not None else default_checkpoint_root()
