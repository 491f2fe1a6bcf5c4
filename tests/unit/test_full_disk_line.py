"""A worker under cycle run that dies of a full disk says it in one line, not a traceback
(cycler._fs.full_disk_said_in_one_line); any other error still prints its traceback."""

from __future__ import annotations

import errno
import sys

import pytest

from cycler import _fs
from cycler.errors import DiskFull


def test_a_full_disk_is_one_line_naming_the_rank_and_other_errors_pass_through(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    passed: list[type[BaseException]] = []

    def chained(kind: type[BaseException], error: BaseException, trace: object) -> None:
        passed.append(kind)  # what a hook installed before acts on (the memory tier's record)
        print("a traceback", file=sys.stderr)  # what it prints is dropped for a full disk

    monkeypatch.setattr(sys, "excepthook", chained)
    monkeypatch.setenv("RANK", "3")
    _fs.full_disk_said_in_one_line()
    _fs.full_disk_said_in_one_line()  # twice: still one hook
    sys.excepthook(DiskFull, DiskFull("no space left on /r"), None)
    wrapped = RuntimeError("unexpected pos")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    sys.excepthook(RuntimeError, wrapped, None)
    sys.excepthook(ValueError, ValueError("bad"), None)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["cycler: rank 3: no space left on /r",
                     "cycler: rank 3: RuntimeError: unexpected pos: the disk is full "
                     "(ENOSPC or a quota)", "a traceback"]
    assert passed == [DiskFull, RuntimeError, ValueError]
