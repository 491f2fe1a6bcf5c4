"""What `cycle run` refuses before it starts anything, with one line each: a SCRIPT that
``python SCRIPT`` cannot run, and a store port another process holds (issue 33)."""

from __future__ import annotations

import importlib.util
import socket
import sys
import zipfile
from pathlib import Path

import pytest

from cycler.errors import ConfigError, PortInUse
from cycler.protocol.exit_codes import EXIT_USAGE
from cycler.supervisor.configuration.options import RunOptions
from cycler.supervisor.launch.startable import check_port_free, check_python_script, port_taken
from cycler.supervisor.launch.torchrun import store_port


def write(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("name, content", [
    ("train.py", b"print('hi')\n"),
    ("train", b"#!/usr/bin/env python3\nprint('no suffix')\n"),
    ("latin.py", b"# -*- coding: latin-1 -*-\nname = '\xe9'\n"),
    ("compiled.pyc", importlib.util.MAGIC_NUMBER + b"\0" * 12),
    ("empty.py", b""),
], ids=["a .py file", "python text without a suffix", "a declared encoding", "bytecode",
        "an empty file"])
def test_what_python_runs_is_accepted(tmp_path: Path, name: str, content: bytes) -> None:
    check_python_script(write(tmp_path / name, content))


def test_a_directory_or_a_zip_with_a_main_is_accepted(tmp_path: Path) -> None:
    package = tmp_path / "app"
    package.mkdir()
    (package / "__main__.py").write_text("print('main')\n")
    check_python_script(package)
    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as archive:
        archive.writestr("__main__.py", "print('zipped')\n")
    check_python_script(tmp_path / "app.pyz")


@pytest.mark.parametrize("make, said", [
    (lambda d: d / "missing.py", "does not exist"),
    (lambda d: (d / "adir").mkdir() or d / "adir", "is a directory without a __main__.py"),
    (lambda d: write(d / "train.sh", b"#!/bin/bash\npython train.py\n"),
     "is a script for bash (its #! line)"),
    (lambda d: write(d / "run", b"#!/usr/bin/env -S bash -e\necho\n"),
     "is a script for bash (its #! line)"),
    (lambda d: write(d / "a.out", Path(sys.executable).read_bytes()[:4096]),
     "is a binary file, not Python source"),
    (lambda d: write(d / "weights.py", b"\x89PNG\r\n\x1a\n\x00\x00"),
     "is a binary file, not Python source"),
    (lambda d: write(d / "notes.py", b"x = '\xff\xfe caf\xe9'\n"),
     "is not text in utf-8 at byte 5"),
], ids=["missing", "a directory", "a shell script", "env -S bash", "an executable",
        "an image", "not utf-8"])
def test_what_python_cannot_run_is_one_line_naming_the_fix(tmp_path: Path, make, said: str,
                                                           ) -> None:
    with pytest.raises(ConfigError) as raised:
        check_python_script(make(tmp_path))
    message = str(raised.value)
    assert said in message and "\n" not in message and raised.value.exit_code == EXIT_USAGE


def test_a_port_another_process_listens_on_is_refused_by_name() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert port_taken(port)
        with pytest.raises(PortInUse, match=f"--master-port {port} is in use by another "
                           "process") as raised:
            check_port_free(port)
    assert raised.value.exit_code == EXIT_USAGE and "\n" not in str(raised.value)


def test_a_port_nobody_listens_on_is_free() -> None:
    with socket.socket() as probe:  # bound, not listening: what a port in TIME_WAIT allows
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert not port_taken(port)


@pytest.mark.parametrize("fields, port", [
    ({}, None), ({"standalone": True, "master_port": 29501}, None),
    ({"master_port": 29501}, 29501), ({"master_addr": "head"}, 29500),
    ({"master_addr": "head", "node_rank": 1, "nnodes": 2}, None),
    ({"rdzv_endpoint": "head:29400"}, None),
], ids=["standalone by default", "standalone", "a port", "torchrun's default port",
        "not node 0", "a rendezvous endpoint"])
def test_only_node_0_with_a_fixed_port_checks_it(fields: dict, port: int | None) -> None:
    assert store_port(RunOptions(script="t.py", **fields)) == port


def test_an_unknown_coding_line_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="declares an encoding python does not know"):
        check_python_script(write(tmp_path / "t.py", b"# coding: klingon\nx = 1\n"))
