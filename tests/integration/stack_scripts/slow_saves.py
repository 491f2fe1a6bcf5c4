"""Runs the script named first, with its arguments, as ``__main__``. With $SLOW_SAVE_MARKER set,
every ``torch.save`` touches that file once it has written, then sleeps: a test kills the job
with -9 in the middle of a save, the script unchanged."""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

import torch


def slow_saves(marker: Path) -> None:
    original = torch.save

    def save(*args, **kwargs):
        original(*args, **kwargs)
        marker.touch()
        time.sleep(120)

    torch.save = save


if __name__ == "__main__":
    if os.environ.get("SLOW_SAVE_MARKER"):
        slow_saves(Path(os.environ["SLOW_SAVE_MARKER"]))
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
