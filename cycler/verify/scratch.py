"""verify's scratch directory: private to the user, named in the report, kept on failure.

Every run's checkpoint root and log lives under one directory made for this verification
inside a per-user base (``$TMPDIR/cycler-verify-<uid>``; a ``$TMPDIR`` another user could rename
it out of is refused). The base is created 0700 and checked with ``lstat`` before use (a real
directory, owned by this user, no group or other bits: the checks of
:mod:`cycler._private`), so another local user can neither plant files verify
would unpickle nor read the user's weights.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cycler._private import (
    create_private,
    private_problem,
    unsafe_path_problem,
)
from cycler.errors import UnsafePath


def make_scratch(base: Path | None = None) -> Path:
    """A new private directory for one verification (0700), under ``base`` or the per-user base
    in the system's temporary directory. Raises :class:`UnsafePath` if the base is not private."""
    if base is None:
        base = Path(tempfile.gettempdir()) / f"cycler-verify-{os.geteuid()}"
        try:
            problem = unsafe_path_problem(base.parent)
            if problem is not None:  # a $TMPDIR another user could swap the base out of
                raise UnsafePath(f"cannot keep verify's scratch in {base.parent}: {problem}; "
                                 "pass --scratch-dir")
            create_private(base)
        except OSError as error:
            raise UnsafePath(f"cannot create {base} for verify's scratch "
                             f"({error.strerror or error}); pass --scratch-dir") from None
    check_private(base)
    return Path(tempfile.mkdtemp(prefix="verify-", dir=base))


def check_private(directory: Path) -> None:
    """Refuse ``directory`` unless it is a real directory owned by this user with no group or
    other permission bits (``lstat``: a symlink is refused, never followed)."""
    try:
        problem = private_problem(os.lstat(directory))
    except OSError as error:
        raise UnsafePath(f"cannot use {directory} for verify's scratch "
                         f"({error.strerror or error})") from None
    if problem is not None:
        raise UnsafePath(f"{directory} {problem}: verify keeps its runs in a private directory; "
                         "chmod 700 it or remove it if it is yours, else give --scratch-dir a "
                         "private directory of yours")
