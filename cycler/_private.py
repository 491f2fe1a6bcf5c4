"""Directories in shared places that belong to one user (docs/design.md, "Shared places belong to
the user").

A tmpfs such as ``/dev/shm`` is writable by every local user: whatever cycler keeps there lives
in a *private* directory, a real directory (never a symlink) owned by the effective user with no
group or other permission bits. A missing one is made so (0700, whatever the umask); anything
else found under its name is refused, never used, never deleted: it may be another user's. A
private directory may only sit in a parent that no other user can rename it out of (owned by the
user or by root, and sticky where others may write), else a check could pass on a directory
that is swapped for another's right after.

A checkpoint root is not private (colleagues may read it, ISC's sync reads it) but it is the
user's alone all the same (:func:`check_owned_directory`): the user's, never open to others'
writes, and open to a group's only where the user's own group setup asks for it
(:class:`Trust`: a user-private group, or the group named by ``--shared-root-group``).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from cycler.errors import CheckpointDirectoryError, ConfigError

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


@dataclass(frozen=True)
class Trust:
    """Who besides the effective user (and root) may write where cycler keeps things: none by
    default (the memory tier), or the user's own groups (a checkpoint root)."""

    groups: frozenset[int] = frozenset()
    """Groups whose write permission is the user's own setup (a user-private group)."""
    shared_group: int | None = None
    """A group the user shares the root with (``--shared-root-group``): directories of this
    group may belong to any of its members."""

    def trusts_owner(self, status: os.stat_result) -> bool:
        return status.st_uid in (0, os.geteuid()) or (
            self.shared_group is not None and status.st_gid == self.shared_group)

    def trusts_group_write(self, status: os.stat_result) -> bool:
        return status.st_gid in self.groups or status.st_gid == self.shared_group


def user_trust(shared_group: str | None = None) -> Trust:
    """The effective user's :class:`Trust`: their user-private group (a group of their name
    with no other member: what ``umask 002`` setups rely on), and ``shared_group`` when given.
    Raises :class:`ConfigError` for a group that does not exist or does not hold the user."""
    own: set[int] = set()
    with contextlib.suppress(KeyError):
        user = pwd.getpwuid(os.geteuid())
        primary = grp.getgrgid(user.pw_gid)
        if primary.gr_name == user.pw_name and set(primary.gr_mem) <= {user.pw_name}:
            own.add(user.pw_gid)
    if shared_group is None:
        return Trust(frozenset(own))
    try:
        entry = grp.getgrnam(shared_group) if not shared_group.isdigit() else grp.getgrgid(
            int(shared_group))
    except KeyError:
        raise ConfigError(f"shared-root-group {shared_group} is not a group of this machine; "
                          "give one of yours (see: id -Gn)") from None
    if entry.gr_gid not in (os.getegid(), *os.getgroups()):
        raise ConfigError(f"shared-root-group {shared_group}: you are not a member of it; "
                          "give one of yours (see: id -Gn)")
    return Trust(frozenset(own), entry.gr_gid)


def owner_name(uid: int) -> str:
    """``uid N (name)``, or ``uid N`` for a uid without an account."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def unsafe_path_problem(path: str | os.PathLike[str], trust: Trust = Trust()) -> str | None:
    """What would let another user replace the directory ``path`` (or one above it) while
    it is used, ``None`` when nothing would; ``trust``: groups whose members may (default:
    none). Raises ``OSError`` (``path`` missing too)."""
    current = Path("/")
    for part in ["", *Path(os.path.abspath(path)).parts[1:]]:
        entry = current / part
        status = os.lstat(entry)
        if stat.S_ISLNK(status.st_mode):
            if status.st_uid not in (0, os.geteuid()):
                return (f"{entry} is a symlink of {owner_name(status.st_uid)}, who could point "
                        "it elsewhere")
            entry = Path(os.path.realpath(entry))
            status = os.stat(entry)
        problem = _open_to_others(status, trust)
        if problem is not None:
            return f"{entry} {problem}"
        current = entry
    return None


def _open_to_others(status: os.stat_result, trust: Trust) -> str | None:
    if not stat.S_ISDIR(status.st_mode):
        return "is not a directory"
    if not trust.trusts_owner(status):
        return (f"belongs to {owner_name(status.st_uid)}, who could replace what cycler keeps "
                "there")
    open_to = 0o002 if trust.trusts_group_write(status) else 0o022
    if status.st_mode & open_to and not status.st_mode & stat.S_ISVTX:
        return ("is writable by other users without the sticky bit: they could replace what "
                "cycler keeps there")
    return None


def owned_problem(status: os.stat_result, trust: Trust) -> str | None:
    """What keeps the ``lstat`` result ``status`` from being a directory of the user's that
    no one else may write to (but ``trust``'s groups), ``None`` when nothing does."""
    mode = status.st_mode
    if stat.S_ISLNK(mode):
        return "is a symlink, not a directory"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if status.st_uid != os.geteuid() and not (
            trust.shared_group is not None and status.st_gid == trust.shared_group):
        return f"belongs to {owner_name(status.st_uid)}, not to you (uid {os.geteuid()})"
    if mode & 0o002 or (mode & 0o020 and not trust.trusts_group_write(status)):
        return f"has mode {stat.S_IMODE(mode):o}: other users may write to it"
    return None


def check_owned_directory(path: Path, what: str, trust: Trust, fix: str) -> None:
    """Refuse (:class:`CheckpointDirectoryError`, one line) a ``path`` that is not
    :func:`owned_problem`-free, in a place no one else can rename it out of; a symlink of the
    user's (or root's) to such a directory is followed. Nothing in it is read before."""
    try:
        problem = unsafe_path_problem(path.parent, trust)
        status = os.lstat(path)
        if problem is None and stat.S_ISLNK(status.st_mode):
            problem = unsafe_path_problem(path, trust)
            status = os.stat(path)
    except OSError as error:
        raise CheckpointDirectoryError(f"{what} {path} cannot be used ({error.strerror}); "
                                       f"{fix}") from None
    if problem is not None:
        raise CheckpointDirectoryError(f"{what} {path} is unsafe: {problem}; {fix}")
    problem = owned_problem(status, trust)
    if problem is not None and status.st_uid == os.geteuid() and problem.startswith("has mode"):
        fix = f"chmod go-w {path} if no one else is to write there; else {fix}"
    if problem is not None:
        raise CheckpointDirectoryError(f"{what} {path} {problem}: refusing to use it; {fix}")


def check_owned_place(path: Path, what: str, trust: Trust, fix: str) -> None:
    """Refuse ``path`` when the nearest directory above it that exists could be swapped by
    another user (``trust`` aside): where nothing is made. Checks nothing if none exists."""
    above = Path(os.path.abspath(path)).parent
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    if not os.path.isdir(above):
        return  # said by the creation that follows: a file is in the way
    try:
        problem = unsafe_path_problem(above, trust)
    except OSError:
        return  # said by the creation that follows, with its reason
    if problem is not None:
        raise CheckpointDirectoryError(f"{what} {path} is unsafe: {problem}; {fix}")


def make_owned_directory(path: Path, trust: Trust) -> bool:
    """Create ``path`` (and what is missing above it) as the umask asks, less any write bit
    for others or for a group ``trust`` does not hold; whether ``path`` was created now.
    Raises ``OSError``."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            continue  # made meanwhile: checked after
        status = os.lstat(directory)
        closed = status.st_mode & ~(0o002 if trust.trusts_group_write(status) else 0o022)
        if closed != status.st_mode:
            os.chmod(directory, stat.S_IMODE(closed))
    return bool(missing)


def make_parents_private(path: Path) -> None:
    """Create ``path`` and the directories above it that are missing, each 0700 whatever the
    umask (never more open than the user's private directories). Raises ``OSError``."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        create_private(directory)  # one made meanwhile is left as it is: checked after


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
