"""The compile cache carried during a run: after a committed checkpoint, in a thread, at most
once per interval, only from node 0, called off by a stop, made once more when the run ends,
and a failure is a warning event, never an exception (real files, a fake clock)."""

from __future__ import annotations

import os
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cycler.supervisor.compile_cache.archive import CACHE, pack
from cycler.supervisor.compile_cache.carrier import CompileCacheCarrier
from cycler.supervisor.compile_cache.place import (
    cache_key,
    carried_path,
    headers_dir,
    node_cache_dir,
)
from cycler.supervisor.configuration.options import RunOptions

LONG_AGO = time.time() - 3600


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, bool, str]] = []

    def __call__(self, event: str, warning: bool = False, **fields: Any) -> None:
        self.events.append((event, warning, fields["said"]))


@pytest.fixture
def options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunOptions:
    """A job whose node cache (in a TMPDIR of the test's) holds one compiled file."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    found = RunOptions(script=str(script), checkpoint_dir=tmp_path / "root")
    found.layout.record.directory.mkdir(parents=True)
    compiled(found, "inductor/fxgraph/first")
    return found


def compiled(options: RunOptions, name: str, when: float = LONG_AGO) -> Path:
    path = node_cache_dir(options) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(name.encode())
    os.utime(path, (when, when))
    return path


def carried_names(options: RunOptions) -> list[str]:
    with tarfile.open(carried_path(options)) as archive:
        return [name for name in archive.getnames() if name.startswith(f"{CACHE}/")]


def carrier(options: RunOptions, record: Recorder, now: list[float],
            settle: float = 0.0) -> CompileCacheCarrier:
    return CompileCacheCarrier(options, record, interval=300, settle=settle,
                               clock=lambda: now[0])


def test_a_committed_checkpoint_carries_the_cache_in_the_background_once_per_interval(
        options: RunOptions) -> None:
    record, now = Recorder(), [1000.0]
    carrying = carrier(options, record, now)
    carrying.checkpoint_committed()
    assert carrying.wait(10)
    assert carried_names(options) == [f"{CACHE}/inductor/fxgraph/first"]
    assert [(event, warning) for event, warning, _ in record.events] == [
        ("compile_cache_carried", False)]
    compiled(options, "inductor/fxgraph/second")
    now[0] += 299
    carrying.checkpoint_committed()
    assert carrying.wait(10) and len(carried_names(options)) == 1  # too soon
    now[0] += 1
    carrying.checkpoint_committed()
    assert carrying.wait(10) and len(carried_names(options)) == 2
    assert len(record.events) == 2


def test_a_checkpoint_with_nothing_newly_compiled_writes_nothing(options: RunOptions) -> None:
    header = headers_dir() / "c10.h.gch"  # torch's precompiled header: large, rarely new
    header.parent.mkdir(parents=True)
    header.write_bytes(b"precompiled")
    os.utime(header, (LONG_AGO, LONG_AGO))
    record, now = Recorder(), [1000.0]
    carrying = carrier(options, record, now)
    carrying.checkpoint_committed()
    assert carrying.wait(10)
    written = os.stat(carried_path(options)).st_mtime_ns
    for _ in range(3):
        now[0] += 301
        carrying.checkpoint_committed()
        assert carrying.wait(10)
    carrying.finish()
    assert os.stat(carried_path(options)).st_mtime_ns == written and len(record.events) == 1
    with tarfile.open(carried_path(options)) as archive:
        assert "headers/c10.h.gch" in archive.getnames()


def test_a_cache_still_being_written_is_not_carried_and_a_stop_calls_the_wait_off(
        options: RunOptions) -> None:
    compiled(options, "inductor/kernel.so", when=time.time() + 3600)  # a compiler writing it
    record = Recorder()
    carrying = carrier(options, record, [1000.0], settle=0.05)
    carrying.checkpoint_committed()
    carrying.call_off()
    assert carrying.wait(10)
    assert not carried_path(options).exists() and record.events == []


def test_a_stop_leaves_the_carried_file_whole_and_the_end_of_the_run_carries_once(
        options: RunOptions) -> None:
    key = cache_key(options.script)
    sources = {CACHE: node_cache_dir(options)}
    assert pack(sources, carried_path(options), key) is not None
    before = carried_path(options).read_bytes()
    compiled(options, "inductor/fxgraph/second")
    called_off = threading.Event()
    called_off.set()
    assert pack(sources, carried_path(options), key, cancel=called_off) is None
    assert carried_path(options).read_bytes() == before
    assert sorted(p.name for p in carried_path(options).parent.iterdir()) == [
        "compile-cache.tar"]
    record = Recorder()
    carrying = carrier(options, record, [1000.0])
    carrying.call_off()
    carrying.checkpoint_committed()  # after a stop began: nothing starts
    assert not carrying.busy()
    carrying.finish()
    assert [event for event, _, _ in record.events] == ["compile_cache_carried"]
    assert len(carried_names(options)) == 2


def test_only_node_0_carries(options: RunOptions) -> None:
    import dataclasses

    record = Recorder()
    second = dataclasses.replace(options, nnodes=2, node_rank=1, rdzv_endpoint="head:29400")
    carrying = carrier(second, record, [1000.0])
    carrying.checkpoint_committed()
    carrying.finish()
    assert not carried_path(options).exists() and record.events == []


def test_a_carry_that_fails_is_a_warning_event_and_never_an_exception(
        options: RunOptions) -> None:
    supervisor_dir = carried_path(options).parent
    supervisor_dir.rmdir()
    supervisor_dir.write_text("not a directory")  # every write into it fails
    record = Recorder()
    carrying = carrier(options, record, [1000.0])
    carrying.checkpoint_committed()
    assert carrying.wait(10)
    carrying.finish()
    assert [(event, warning) for event, warning, _ in record.events] == [
        ("compile_cache_not_carried", True)] * 2
    assert record.events[0][2].startswith(
        f"the compile cache could not be carried in {carried_path(options)}: ")


def test_a_root_that_takes_no_event_either_is_a_log_line(
        options: RunOptions, caplog: pytest.LogCaptureFixture) -> None:
    def unwritable(event: str, warning: bool = False, **fields: Any) -> None:
        raise OSError(30, "Read-only file system")

    carrying = CompileCacheCarrier(options, unwritable, settle=0.0)
    carrying.finish()
    assert [r.getMessage()[:25] for r in caplog.records] == ["carried the compile cache"]
