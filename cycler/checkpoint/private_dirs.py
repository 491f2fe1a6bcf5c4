"""Directories in shared places that belong to one user (docs/design.md, "Shared places belong to
the user").

A tmpfs such as ``/dev/shm`` is writable by every local user: whatever cycler keeps there lives
in a *private* directory, a real directory (never a symlink) owned by the effective user with no
group or other permission bits. A missing one is made so (0700, whatever the umask); anything
else found under its name is refused, never used, never deleted: it may be another user's. A
private directory may only sit in a parent that no other user can rename it out of (owned by the
user or by root, and sticky where others may write), else a check could pass on a directory
that is swapped for another's right after.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from cycler.errors import CheckpointDirectoryError

PRIVATE_DIRECTORY_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_problem(status: os.stat_result) -> str | None:
    """What keeps the ``lstat`` result ``status`` from being a private directory of the
    effective user, ``None`` when nothing does."""
    mode, user = status.st_mode, os.geteuid()
    if stat.S_ISLNK(mode):
        return "is a symlink, not a directory"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if status.st_uid != user:
        return f"belongs to uid {status.st_uid}, not to you (uid {user})"
    if mode & 0o077:
        return f"has mode {stat.S_IMODE(mode):o}: it is open to other users (it must be 700)"
    return None


_FIX = "choose another --memory-dir"


def check_private(path: Path, what: str, fix: str = _FIX) -> None:
    """Refuse ``path`` (:class:`CheckpointDirectoryError`, one line) unless it is a private
    directory of the effective user; nothing in it is read before this passed."""
    try:
        status = os.lstat(path)
    except OSError as error:
        raise CheckpointDirectoryError(
            f"{what} {path} cannot be used ({error.strerror})") from None
    problem = private_problem(status)
    if problem is not None:
        raise CheckpointDirectoryError(
            f"{what} {path} {problem}: refusing to use it; if it is yours, remove it, else "
            f"{fix.removeprefix('remove it if it is yours, or ')}")


def make_private(path: Path, what: str, fix: str = _FIX) -> bool:
    """Create ``path`` 0700 if it is missing, then :func:`check_private` it; whether it was
    created now. ``fix``: what the one-line refusal tells the user to do."""
    try:
        created = create_private(path)
    except OSError as error:
        raise CheckpointDirectoryError(
            f"cannot create {what} {path} ({error.strerror}); {fix}") from None
    check_private(path, what, fix)
    return created


def create_private(path: Path) -> bool:
    """Create ``path`` 0700, whatever the umask, if nothing is there; whether it was created
    now (``False``: something was there already, not checked). Raises ``OSError``."""
    try:
        os.mkdir(path, PRIVATE_DIRECTORY_MODE)
    except FileExistsError:
        return False
    # The umask can only have taken bits away: give the owner's back.
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchmod(descriptor, PRIVATE_DIRECTORY_MODE)
    finally:
        os.close(descriptor)
    return True


def check_safe_parent(path: Path, what: str, fix: str = _FIX) -> None:
    """Refuse a directory that would let another user rename a private directory out of it,
    or swap it for another on the way there: ``path`` and every directory above it must be
    owned by the effective user or root, and sticky where group or others may write; a
    symlink on the way (``/dev/shm`` may be a link to ``/run/shm``) must be the user's or
    root's, and is followed."""
    try:
        problem = unsafe_path_problem(path)
    except OSError as error:
        raise CheckpointDirectoryError(f"{what} {path} cannot be used ({error.strerror}); "
                                       f"{fix}") from None
    if problem is not None:
        raise CheckpointDirectoryError(f"{what} {path} is unsafe: {problem}; {fix}")


def unsafe_path_problem(path: str | os.PathLike[str]) -> str | None:
    """What would let another user replace the directory ``path`` (or one above it) while
    it is used, ``None`` when nothing would. Raises ``OSError`` (``path`` missing too)."""
    current = Path("/")
    for part in ["", *Path(os.path.abspath(path)).parts[1:]]:
        entry = current / part
        status = os.lstat(entry)
        if stat.S_ISLNK(status.st_mode):
            if status.st_uid not in (0, os.geteuid()):
                return f"{entry} is a symlink of uid {status.st_uid}, who could point it elsewhere"
            entry = Path(os.path.realpath(entry))
            status = os.stat(entry)
        problem = _open_to_others(status)
        if problem is not None:
            return f"{entry} {problem}"
        current = entry
    return None


def _open_to_others(status: os.stat_result) -> str | None:
    if not stat.S_ISDIR(status.st_mode):
        return "is not a directory"
    if status.st_uid not in (0, os.geteuid()):
        return f"belongs to uid {status.st_uid}, who could replace what cycler keeps there"
    if status.st_mode & 0o022 and not status.st_mode & stat.S_ISVTX:
        return ("is writable by other users without the sticky bit: they could replace what "
                "cycler keeps there")
    return None


def make_parents_private(path: Path) -> None:
    """Create ``path`` and the directories above it that are missing, each 0700 whatever the
    umask (never more open than the user's private directories). Raises ``OSError``."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked after
            os.mkdir(directory, PRIVATE_DIRECTORY_MODE)


def restrict_tree(path: Path) -> None:
    """Make every directory under ``path`` (itself included) 0700 and every file 0600, whatever
    the umask they were written with; symlinks are left alone, never followed."""
    for parent, directories, files in os.walk(path):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(parent, PRIVATE_DIRECTORY_MODE)
        for name in files + directories:
            entry = os.path.join(parent, name)
            with contextlib.suppress(FileNotFoundError):
                mode = os.lstat(entry).st_mode
                if stat.S_ISREG(mode) and stat.S_IMODE(mode) != PRIVATE_FILE_MODE:
                    os.chmod(entry, PRIVATE_FILE_MODE)
