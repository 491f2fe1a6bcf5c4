"""verify's scratch directory: private to the user, named in the report, kept on failure.

Every run's checkpoint root and log lives under one directory made for this verification
inside a per-user base (``$TMPDIR/cycler-verify-<uid>``). The base is created 0700 and checked
with ``lstat`` before use (a real directory, owned by this user, no group or other bits), so
another local user can neither plant files verify would unpickle nor read the user's weights.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from cycler.errors import UnsafePath


def make_scratch(base: Path | None = None) -> Path:
    """A new private directory for one verification (0700), under ``base`` or the per-user base
    in the system's temporary directory. Raises :class:`UnsafePath` if the base is not private."""
    if base is None:
        base = Path(tempfile.gettempdir()) / f"cycler-verify-{os.geteuid()}"
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
    check_private(base)
    return Path(tempfile.mkdtemp(prefix="verify-", dir=base))


def check_private(directory: Path) -> None:
    """Refuse ``directory`` unless it is a real directory owned by this user with no group or
    other permission bits (``lstat``: a symlink is refused, never followed)."""
    try:
        info = os.lstat(directory)
    except OSError as error:
        raise UnsafePath(f"cannot use {directory} for verify's scratch "
                         f"({error.strerror or error})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(f"{directory} is not a directory (a symlink or a file): verify keeps its "
                         "runs in a private directory; remove it or pass --scratch-dir")
    if info.st_uid != os.geteuid():
        raise UnsafePath(f"{directory} belongs to another user (uid {info.st_uid}): verify keeps "
                         "its runs in a private directory; give --scratch-dir one of yours")
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise UnsafePath(f"{directory} is open to other users "
                         f"({stat.S_IMODE(info.st_mode):o}): chmod 700 it, or give --scratch-dir a "
                         "private directory")
