"""The old home of the shared-place checks, kept so that ``cycler.checkpoint.private_dirs``
still imports: they live in :mod:`cycler._private`, below every part."""

from __future__ import annotations

from cycler._private import *  # noqa: F403
