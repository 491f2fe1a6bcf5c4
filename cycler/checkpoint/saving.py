"""``atomic_torch_save``: ``torch.save`` that never leaves a torn or missing file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from cycler._fs import atomic_write, remove_dead_writers_temporaries


def atomic_torch_save(obj: Any, f: str | os.PathLike[str], **kwargs: Any) -> None:
    """Save ``obj`` to ``f`` like ``torch.save(obj, f, **kwargs)``, atomically and durably.

    The data goes to a uniquely named temporary in the same directory, is fsynced, renamed over
    ``f``, and the directory is fsynced. Until the rename the previous file at ``f`` is intact;
    on any failure the temporary is removed. Unlike cycling_utils' version (a fixed ``.temp``
    name and no fsync), two writers never share a temporary and a power cut after the call
    returns cannot lose the file. ``f`` must be a path, not a file object.

    Before writing, it removes the temporaries of ``f`` that writers on this host left when they
    were killed between creating and renaming them; a live writer's temporary is never touched.
    """
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError("atomic_torch_save needs a path; for a file object use torch.save")
    remove_dead_writers_temporaries(Path(f))
    atomic_write(Path(f), lambda handle: torch.save(obj, handle, **kwargs))
