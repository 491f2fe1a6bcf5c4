"""What is on disk: every checkpoint of a root with its state, and the newest valid one.

This is the one reader of the layout. ``latest_checkpoint`` (resume), ``cycle status``,
``cycle prune`` and retention all see checkpoints through :func:`list_checkpoints`, so they can
never disagree about which checkpoint is valid or latest. What a verifying read found wrong is
kept by :mod:`cycler.checkpoint.verification` (the one thing a read leaves behind, so that the
others agree with it).
"""

from __future__ import annotations

import enum
import functools
import os
import stat
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from cycler.checkpoint.layout import DEFAULT_PREFIX, MANIFEST_NAME, CheckpointLayout, CheckpointName
from cycler.checkpoint.manifest import Manifest, check_files, read_manifest
from cycler.checkpoint.verification import failed_verifications, record_failed_verification
from cycler.errors import (
    CheckpointNotFound,
    CorruptCheckpoint,
    UnreadableCheckpoint,
    UnsupportedCheckpoint,
)
from cycler.protocol.environment import (
    ENV_RESUME_FROM,
    default_checkpoint_name,
    default_checkpoint_root,
)

NEVER_COMMITTED = "no manifest (never committed)"
"""The problem of a directory whose commit never wrote its manifest: state ``incomplete``."""
LEGACY = "legacy"
UNREADABLE = "unreadable"
UNSUPPORTED = "unsupported"


class CheckpointWarning(UserWarning):
    """The latest link could not be used and an older or unlinked checkpoint was chosen, or no
    checkpoint among those that exist is valid."""


class CheckpointState(str, enum.Enum):
    LATEST = "latest"
    VALID = "valid"
    PINNED = "pinned"
    LEGACY = "legacy"
    """Written by another tool (cycling_utils) before cycler's first prepare: no manifest."""
    INCOMPLETE = "incomplete"
    CORRUPT = "corrupt"
    UNREADABLE = "unreadable"
    """Exists but cannot be read (EACCES, ESTALE, EIO): never taken for "never committed"."""
    UNSUPPORTED = "unsupported"
    """Written by a newer cycler: neither loaded nor removed by this one."""


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
    kind: str | None = None
    """``"legacy"``, ``"unreadable"`` or ``"unsupported"`` where that is what it is."""

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
    def committed(self) -> bool:
        """Whether it is more than a directory a writer prepared and never committed."""
        return self.state is not CheckpointState.INCOMPLETE

    @property
    def state(self) -> CheckpointState:
        if self.is_directory and self.problem == NEVER_COMMITTED:
            return CheckpointState.INCOMPLETE
        if self.kind in (UNREADABLE, UNSUPPORTED):
            return CheckpointState(self.kind)
        if not self.valid:
            return CheckpointState.CORRUPT
        if self.is_latest:
            return CheckpointState.LATEST
        if self.pinned:
            return CheckpointState.PINNED
        return CheckpointState.LEGACY if self.kind == LEGACY else CheckpointState.VALID


def inspect_checkpoint(layout: CheckpointLayout, name: CheckpointName,
                       verify: bool = False) -> Checkpoint:
    """Validate one entry: a real directory whose files match its manifest."""
    path = layout.path_of(name)
    entry = _entry(layout, name)
    if entry is not None:
        return entry
    try:
        manifest = read_manifest(path)
        problem = check_files(path, manifest, checksums=verify)
    except UnreadableCheckpoint as error:
        return Checkpoint(name, path, None, str(error), kind=UNREADABLE)
    except UnsupportedCheckpoint as error:
        return Checkpoint(name, path, None, str(error), kind=UNSUPPORTED)
    except CorruptCheckpoint as error:
        if _manifest_absent(path):
            return _without_manifest(layout, name)
        return Checkpoint(name, path, None, str(error))
    return Checkpoint(name, path, manifest, problem)


def commit_state(layout: CheckpointLayout, name: CheckpointName) -> Checkpoint:
    """Only whether an entry is a real directory with a manifest, read from two ``lstat``s:
    enough for retention after a commit, where reading every manifest made each commit's cost
    grow with the checkpoints kept (52 ms with 600 of them). ``manifest`` stays ``None``."""
    entry = _entry(layout, name)
    if entry is not None:
        return entry
    path = layout.path_of(name)
    try:
        mode = os.lstat(path / MANIFEST_NAME).st_mode
    except FileNotFoundError:
        return _without_manifest(layout, name)
    except OSError as error:
        return Checkpoint(name, path, None, f"cannot read it ({error.strerror})", kind=UNREADABLE)
    if not stat.S_ISREG(mode):
        return inspect_checkpoint(layout, name)  # say exactly what
    return Checkpoint(name, path, None, None)


def _entry(layout: CheckpointLayout, name: CheckpointName) -> Checkpoint | None:
    """The checkpoint when the entry itself says all (absent, unreadable, not a directory),
    else ``None``: a real directory to look into."""
    path = layout.path_of(name)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return Checkpoint(name, path, None, "does not exist", is_directory=False)
    except OSError as error:
        return Checkpoint(name, path, None, f"cannot read it ({error.strerror})", kind=UNREADABLE)
    if stat.S_ISLNK(mode):
        return Checkpoint(name, path, None, "is a symlink; cycler never follows it",
                          is_directory=False)
    if not stat.S_ISDIR(mode):
        return Checkpoint(name, path, None, "is a file, not a directory", is_directory=False)
    return None


def _manifest_absent(path: Path) -> bool:
    try:
        os.lstat(path / MANIFEST_NAME)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _without_manifest(layout: CheckpointLayout, name: CheckpointName) -> Checkpoint:
    """A directory with no manifest: torn if cycler prepared it, else another tool's."""
    first = layout.first_own_index()
    path = layout.path_of(name)
    if first is None or name.index < first:
        return Checkpoint(name, path, None, None, kind=LEGACY)
    return Checkpoint(name, path, None, NEVER_COMMITTED)


def list_checkpoints(root: str | os.PathLike[str], name: str = DEFAULT_PREFIX,
                     verify: bool = False, commit_state_only: bool = False,
                     verify_latest: bool = False) -> list[Checkpoint]:
    """Every checkpoint of saver ``name`` under ``root`` by index, the latest one marked.

    The latest is chosen as resume chooses it: checkpoints a resume found corrupt (recorded
    under ``.cycler/``) are corrupt here too. ``verify`` checks every checksum;
    ``verify_latest`` only those of the checkpoint chosen as latest, falling back as resume
    does (what ``cycle prune`` needs before removing anything older). ``commit_state_only``
    only tells committed directories from torn ones (:func:`commit_state`).
    """
    layout = CheckpointLayout(root, name)
    names = layout.checkpoint_names()
    failed = failed_verifications(layout)
    if commit_state_only:
        found = [commit_state(layout, entry) for entry in names]
    else:
        found = [inspect_checkpoint(layout, entry, verify) for entry in names]
    by_name = {c.name: with_record(c, failed) for c in found}
    look: Callable[[CheckpointName], Checkpoint] = by_name.__getitem__
    if verify_latest and not verify:
        look = functools.cache(lambda entry: _verified(layout, by_name[entry], failed))
    latest, _ = _choose_latest(layout, names, look)
    if verify_latest and not verify:
        by_name.update({entry: look(entry) for entry in names
                        if latest is None or entry.index >= latest.index})
    return [_marked(by_name[entry], latest) for entry in names]


def _verified(layout: CheckpointLayout, checkpoint: Checkpoint, failed: dict[str, str],
              ) -> Checkpoint:
    if not checkpoint.valid or checkpoint.kind == LEGACY:
        return checkpoint
    checked = inspect_checkpoint(layout, checkpoint.name, verify=True)
    record_if_damaged(layout, checked)
    return checked


def record_if_damaged(layout: CheckpointLayout, checked: Checkpoint) -> None:
    """Record a committed checkpoint whose files fail its manifest (a checksum, a size, a file
    gone): retention lists by commit state alone and would remove it as "beyond keep-last",
    while status and prune keep it for inspection. Unreadable ones are not: that may pass."""
    if checked.state is CheckpointState.CORRUPT and checked.manifest is not None:
        record_failed_verification(layout, checked.name, checked.problem)


def with_record(checkpoint: Checkpoint, failed: dict[str, str]) -> Checkpoint:
    """``checkpoint``, corrupt if a resume recorded that its checksums failed."""
    found = failed.get(str(checkpoint.name))
    if found is None or not checkpoint.valid:
        return checkpoint
    return replace(checkpoint, problem=f"{found} (found when resuming)")


def _marked(checkpoint: Checkpoint, latest: Checkpoint | None) -> Checkpoint:
    if latest is None or checkpoint.path != latest.path:
        return checkpoint
    return replace(checkpoint, is_latest=True)


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


def latest_checkpoint(root: str | os.PathLike[str] | None = None, name: str | None = None,
                      verify: bool = True, strict: bool = False) -> Path | None:
    """The newest valid checkpoint directory under ``root``, or ``None`` if there is none.

    The latest link's target when it validates; otherwise the newest valid checkpoint by index,
    with a :class:`CheckpointWarning` that names what was wrong. A directory without a valid
    manifest is never returned (a cycling_utils checkpoint, which has none, is returned as it
    is). ``verify`` (the default: this is what a resume asks) also checks the checksum of
    every file of the checkpoint it returns, so a bit flipped on disk is never resumed: one
    read of that checkpoint's data, not of the others. A checkpoint that fails it is recorded
    under ``.cycler/``, where ``cycle status``, ``cycle prune`` and retention see it as corrupt.
    When checkpoints exist and none is valid, a :class:`CheckpointWarning` names each and why
    (``strict``: :class:`CorruptCheckpoint` instead). ``root`` defaults to
    ``$CYCLER_CHECKPOINT_DIR``, ``$CHECKPOINT_ARTIFACT_PATH``, ``./checkpoints``. When
    ``cycle run --resume-from NAME`` set ``$CYCLER_RESUME_FROM`` to one of this saver's
    checkpoints, that checkpoint is returned instead (validated). ``name`` defaults to
    ``cycle run --checkpoint-name`` (``$CYCLER_CHECKPOINT_NAME``), else ``AtomicDirectory``.
    """
    name = name or default_checkpoint_name()
    layout = CheckpointLayout(_root_or_default(root), name)
    requested = os.environ.get(ENV_RESUME_FROM)
    if requested and (layout.parse(requested) or by_index(layout, requested)):
        return find_checkpoint(layout.root, requested, name, verify)
    # Resuming validates the link target only, not every checkpoint (with verify=True that
    # would read the data of all of them); older ones are inspected only if it is unusable.
    failed = failed_verifications(layout)

    @functools.cache
    def look(entry: CheckpointName) -> Checkpoint:
        checked = with_record(inspect_checkpoint(layout, entry, verify), failed)
        if str(checked.name) not in failed:
            record_if_damaged(layout, checked)
        return checked

    names = layout.checkpoint_names()
    latest, problem = _choose_latest(layout, names, look)
    if latest is None:
        checked = [look(entry) for entry in names]
        say_none_is_valid(layout, {c.path.name: c.problem or "" for c in checked
                                   if c.committed}, strict)
        return None
    if problem is not None:
        fell_back = latest.name != layout.link_target_name()
        using = f"; using {latest.path.name} instead" if fell_back else ""
        warnings.warn(f"{problem}{using}", CheckpointWarning, stacklevel=2)
    return latest.path


def say_none_is_valid(layout: CheckpointLayout, problems: dict[str, str], strict: bool,
                      stacklevel: int = 3) -> None:
    """Checkpoints exist (``problems``: name -> what is wrong, torn directories left out) and
    none is valid: never silent. A warning, or with ``strict`` :class:`CorruptCheckpoint`."""
    if not problems:
        return
    why = "; ".join(f"{name}: {problem}" for name, problem in problems.items())
    message = f"no valid checkpoint in {layout.root} ({why})"
    if strict:
        raise CorruptCheckpoint(f"{message}; repair or move them, or start elsewhere")
    warnings.warn(f"{message}; training starts from the beginning", CheckpointWarning,
                  stacklevel=stacklevel + 1)


def no_valid_checkpoint(root: str | os.PathLike[str], name: str = DEFAULT_PREFIX) -> str | None:
    """What is wrong when checkpoints exist under ``root`` and none is valid (sizes only, no
    data read), else ``None``: what ``cycle run`` says at start."""
    checked = list_checkpoints(root, name)
    if any(c.valid for c in checked) or not any(c.committed for c in checked):
        return None
    return "; ".join(f"{c.path.name}: {c.problem}" for c in checked if c.committed)


def find_checkpoint(root: str | os.PathLike[str], checkpoint: str,
                    name: str = DEFAULT_PREFIX, verify: bool = False) -> Path:
    """The checkpoint directory called ``checkpoint`` (a name or an index), validated."""
    layout = CheckpointLayout(root, name)
    parsed = layout.parse(checkpoint) or by_index(layout, checkpoint)
    if parsed is None:
        raise CheckpointNotFound(
            f"no checkpoint named {checkpoint!r} in {layout.root}; see `cycle status`"
        )
    found = inspect_checkpoint(layout, parsed, verify)
    if not found.valid:
        raise CorruptCheckpoint(f"{found.path} {found.problem}; pick another with `cycle status`")
    return found.path


def by_index(layout: CheckpointLayout, text: str) -> CheckpointName | None:
    if not text.isdigit():
        return None
    return next((n for n in layout.checkpoint_names() if n.index == int(text)), None)


def _root_or_default(root: str | os.PathLike[str] | None) -> Path:
    return Path(root) if root is not None else default_checkpoint_root()
