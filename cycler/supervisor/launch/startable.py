"""Whether what ``cycle run`` would start can start, told before anything starts (exit 2): the
SCRIPT is something ``python SCRIPT`` runs, and the port node 0's store listens on is free.

torchrun runs ``python -u SCRIPT``, so SCRIPT is Python whatever its name: a ``.py`` file, a
text file of any other name (``train`` without a suffix), a compiled ``.pyc``, a zip
application, or a directory with a ``__main__.py``. What ``python`` cannot run is refused here
with one line each: a missing path, a directory without ``__main__.py``, a file that is not
Python source (an executable binary, a file that is not text in its declared encoding), and a
script for another interpreter (a ``#!`` line that names no python, such as ``train.sh``).
"""

from __future__ import annotations

import errno
import importlib.util
import io
import socket
import tokenize
import zipfile
from pathlib import Path

import psutil

from cycler.errors import ConfigError, PortInUse

SNIFFED_BYTES = 1 << 16
"""How much of SCRIPT is read to tell whether it is Python source."""


def check_python_script(script: Path) -> None:
    """Refuse, with one line, a SCRIPT that ``python SCRIPT`` cannot run (see the module)."""
    if script.is_dir():
        if not (script / "__main__.py").is_file():
            raise ConfigError(f"script {script} is a directory without a __main__.py; give the "
                              "path of your training script (a .py file)")
        return
    if not script.exists():
        raise ConfigError(f"script {script} does not exist; give the path of your training "
                          "script")
    if not script.is_file():
        raise ConfigError(f"script {script} is not a regular file; give the path of your "
                          "training script (a .py file)")
    try:
        with open(script, "rb") as handle:
            head = handle.read(SNIFFED_BYTES)
    except OSError as error:
        raise ConfigError(f"script {script} cannot be read ({error.strerror}); give a "
                          "training script you can read") from None
    problem = not_python(head, script)
    if problem is not None:
        raise ConfigError(f"script {script} {problem}")


def not_python(head: bytes, script: Path) -> str | None:
    """Why a file that starts with ``head`` is not something python runs (``None``: it is)."""
    if head.startswith(importlib.util.MAGIC_NUMBER):
        return None  # compiled by this python
    if zipfile.is_zipfile(script):
        return None if _zip_has_main(script) else (
            "is a zip file without a __main__.py; give the path of your training script")
    interpreter = _shebang_interpreter(head)
    if interpreter is not None and "python" not in interpreter:
        return (f"is a script for {interpreter} (its #! line), but torchrun runs SCRIPT with "
                "python; add --no-python to run it as it is, or give your Python training "
                "script")
    if head.startswith(b"\x7fELF") or b"\0" in head:
        return ("is a binary file, not Python source; add --no-python to run an executable, "
                "or give your Python training script")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(head).readline)
    except SyntaxError as error:  # an unknown coding, or a first line that is not UTF-8
        if "unknown encoding" in str(error):
            return f"declares an encoding python does not know ({error}); fix its coding line"
        encoding = "utf-8"
    try:
        head.decode(encoding)
    except UnicodeDecodeError as error:
        if error.start < len(head) - 4:  # not merely a character cut at the end of the read
            return (f"is not text in {error.encoding} at byte {error.start}, so not Python "
                    "source; give your Python training script")
    return None


def _zip_has_main(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return "__main__.py" in archive.namelist() or "__main__.pyc" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _shebang_interpreter(head: bytes) -> str | None:
    """The program a ``#!`` first line names (``env``'s argument for ``/usr/bin/env X``)."""
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        words = [word for word in words[1:] if not word.startswith("-")] or words
    return Path(words[0]).name


def check_port_free(port: int, flag: str = "--master-port") -> None:
    """Refuse, with one line, a ``port`` that another process listens on: torchrun's store
    could not listen there, and every start would fail the same way."""
    if not port_taken(port):
        return
    holder = port_holder(port)
    who = f" ({holder})" if holder else ""
    raise PortInUse(f"{flag} {port} is in use by another process{who}, so the workers' store "
                    f"cannot listen on it; give a free port with {flag}, or leave "
                    f"{flag} out on one node")


def port_taken(port: int) -> bool:
    """Whether binding ``port`` on every address fails with EADDRINUSE, as torchrun's store's
    bind would (``SO_REUSEADDR``: a port a finished run left in TIME_WAIT is free)."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind((address, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    return True
                continue
            return False
    return False


def port_holder(port: int) -> str | None:
    """``pid N, NAME`` of the process that listens on ``port``, where this user may see it."""
    try:
        for connection in psutil.net_connections(kind="tcp"):
            if (connection.status == psutil.CONN_LISTEN and connection.laddr
                    and connection.laddr.port == port and connection.pid):
                return f"pid {connection.pid}, {psutil.Process(connection.pid).name()}"
    except (psutil.Error, OSError):
        pass
    return None
