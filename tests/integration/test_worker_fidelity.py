"""The fidelity table: what a worker sees and computes under plain torchrun, under ``cycle run``
with forked workers (the default) and under ``cycle run --no-fork-workers``.

Each probe script runs once per way (real processes, 2 gloo ranks or 1); each row of
:data:`ROWS` reads one observation from every rank's output and says how the three ways must
compare: the same value everywhere, or a property each way must have (the ranks draw different
numbers). The documented differences (docs/cycle-run.md, "What a forked worker does not
share") are rows of their own, pinned as they are.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

# Each test runs every way in turn (three jobs and more): on a loaded 2-core machine a job takes
# minutes.
pytestmark = [pytest.mark.integrations, pytest.mark.timeout(1200)]

WAYS = ("torchrun", "forked", "fresh")

PROBE = r'''
import atexit, ctypes, faulthandler, gc, os, random, signal, sys, tempfile, threading

def say(key, value):
    # One write per line: the ranks share the pipe, and a line written in one piece is whole.
    sys.stdout.write(f"rank {os.environ['RANK']}: {key} = {value!r}\n")

say("argv", sys.argv)
say("orig_argv", sys.orig_argv[1:])
say("executable is orig_argv[0]", sys.orig_argv[0] == sys.executable)
say("__file__", __file__)
say("path0", sys.path[0])
say("main", (__name__, type(__loader__).__name__, __spec__, __package__, __cached__))
say("faulthandler", faulthandler.is_enabled())
say("stdin", sys.stdin is not None and sys.stdin.fileno())
say("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS"))
say("cmdline", open("/proc/self/cmdline", "rb").read().split(b"\0")[1:])
descriptors = [fd for fd in map(int, os.listdir("/proc/self/fd")) if fd > 2
               and os.path.lexists(f"/proc/self/fd/{fd}")]
say("descriptors", (bool(descriptors), [fd for fd in descriptors if os.get_inheritable(fd)]))
import multiprocessing
umask = os.umask(0o22)
os.umask(umask)
say("process state", (
    [str(signal.getsignal(number)) for number in sorted(signal.valid_signals())
     if number not in (signal.SIGKILL, signal.SIGSTOP)],
    signal.pthread_sigmask(signal.SIG_BLOCK, []),
    [getattr(sys, hook) is getattr(sys, f"__{hook}__")
     for hook in ("excepthook", "displayhook", "unraisablehook", "breakpointhook")],
    threading.excepthook is threading.__excepthook__,
    [thread.name for thread in threading.enumerate()], oct(umask),
    os.getsid(0) == os.getpid(), gc.isenabled(), gc.get_threshold(), sys.flags,
    multiprocessing.get_start_method(allow_none=True), multiprocessing.current_process().name,
    multiprocessing.parent_process(), sys.path[1:], [(stream.isatty(), stream.write_through)
                                                     for stream in (sys.stdout, sys.stderr)]))
say("hash", hash("a string"))
say("random", random.random())
import numpy
say("numpy", numpy.random.rand())
import torch
say("torch seed", torch.initial_seed())
say("torch rand", torch.rand(3).tolist())
say("threads", (torch.get_num_threads(), torch.get_num_interop_threads()))
os.environ["TMPDIR"] = os.path.realpath(os.getcwd())
say("TMPDIR set first", tempfile.gettempdir() == os.environ["TMPDIR"])

def openblas_threads():
    for line in open("/proc/self/maps"):
        if "openblas" in line.lower():
            library = ctypes.CDLL(line.split()[-1])
            for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                         "openblas_get_num_threads"):
                if hasattr(library, name):
                    return getattr(library, name)()
    return None

say("numpy threads", openblas_threads())
import logging
say("dynamo log level", logging.getLogger("torch._dynamo").level)
say("cuda initialised", torch.cuda.is_initialized())

def deepest(level=0):
    try:
        return deepest(level + 1)
    except RecursionError:
        return level

say("recursion depth", deepest())
threading.Thread(target=lambda: (__import__("time").sleep(0.3), say("order", "thread"))).start()
atexit.register(say, "order", "atexit")
say("order", "last line")
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    import builtins
    builtins.print = None  # Python prints sys.exit's message without it
    sys.exit("the script's message")
'''

ENV_FIRST = r'''
import os
os.environ["OMP_NUM_THREADS"] = "2"
os.environ["TORCH_LOGS"] = "+dynamo"
''' + PROBE

SYNTAX = "x = 1\nthis is not python ((\n"
MISSING_IMPORT = ("import os, sys\nsys.excepthook = lambda *error: 1 / 0  # Python reports both\n"
                  "import a_module_that_is_not_there\n")


def run(tmp_path: Path, way: str, script: str, *arguments: str, nproc: int = 2,
        given: str | None = None) -> tuple[int, str, str]:
    """``script`` run one ``way``, by a relative path, from ``tmp_path``, ``given`` on its
    stdin (else ``/dev/null``): exit code, stdout, stderr."""
    if way == "torchrun":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    else:
        launcher = [sys.executable, "-m", "cycler_cli", "run", "--max-restarts", "0",
                    "--checkpoint-dir", str(tmp_path / f"ck-{way}"),
                    "--fork-workers" if way == "forked" else "--no-fork-workers"]
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("OMP_NUM_THREADS", "PYTHONHASHSEED", "PYTHONFAULTHANDLER",
                                   "TORCH_LOGS")}
    done = subprocess.run([*launcher, "--nproc-per-node", str(nproc), script, *arguments],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=environment, input=given,
                          stdin=subprocess.DEVNULL if given is None else None)
    return done.returncode, done.stdout, done.stderr


def observations(stdout: str) -> dict[str, list[str]]:
    """``key -> [rank 0's value, rank 1's value, ...]`` (repr strings); ``order``: each rank's
    lines of that key in the order written."""
    seen: dict[str, dict[int, list[str]]] = {}
    for line in stdout.splitlines():
        if not line.startswith("rank ") or " = " not in line:
            continue
        head, _, value = line.partition(" = ")
        rank, _, key = head[len("rank "):].partition(": ")
        seen.setdefault(key, {}).setdefault(int(rank), []).append(value)
    return {key: [" ".join(values[rank]) for rank in sorted(values)]
            for key, values in seen.items()}


def differ_per_rank(values: list[str]) -> bool:
    return len(values) == 2 and values[0] != values[1]


@dataclass(frozen=True)
class Row:
    """One line of the table: ``key`` compared across the ways by ``check``."""

    key: str
    check: Callable[[dict[str, list[str]]], bool]
    """Given ``way -> values per rank``: whether the row holds."""
    why: str


def equal(by_way: dict[str, list[str]]) -> bool:
    return by_way["forked"] == by_way["torchrun"] == by_way["fresh"] and bool(by_way["torchrun"])


def each_differs_per_rank(by_way: dict[str, list[str]]) -> bool:
    return all(differ_per_rank(by_way[way]) for way in WAYS)


def shared_by_forked_ranks(by_way: dict[str, list[str]]) -> bool:
    return differ_per_rank(by_way["torchrun"]) and differ_per_rank(by_way["fresh"]) \
        and len(set(by_way["forked"])) == 1


ROWS = [
    Row("argv", equal, "sys.argv as given, not made absolute"),
    Row("orig_argv", equal, "python -u SCRIPT ARGS"),
    Row("executable is orig_argv[0]", equal, "the interpreter torchrun starts"),
    Row("__file__", equal, "absolute, as Python makes it"),
    Row("path0", equal, "the script's directory"),
    Row("main", equal, "__main__ as Python makes it for a script"),
    Row("faulthandler", equal, "off unless PYTHONFAULTHANDLER"),
    Row("stdin", equal, "file descriptor 0, torchrun's own stdin"),
    Row("OMP_NUM_THREADS", equal, "torchrun's 1 for 2 processes"),
    Row("cmdline", equal, "/proc/PID/cmdline (ps, psutil): -u SCRIPT ARGS, no empty argument "
        "after them"),
    Row("process state", equal, "signal handlers and mask, hooks, threads, umask, session, gc, "
        "flags, multiprocessing's main process, sys.path, streams"),
    Row("TMPDIR set first", equal, "tempfile reads a TMPDIR the script sets before its first "
        "use (the agent's cached directory dropped)"),
    Row("random", each_differs_per_rank, "Python's random: its own per process"),
    Row("numpy", each_differs_per_rank, "numpy's global state: its own per process"),
    Row("torch seed", each_differs_per_rank, "torch's default generator: its own seed"),
    Row("torch rand", each_differs_per_rank, "unseeded draws differ per rank"),
    Row("threads", equal, "torch's intra- and inter-op threads"),
    Row("numpy threads", equal, "numpy's OpenBLAS pool, sized from OMP_NUM_THREADS"),
    Row("dynamo log level", equal, "TORCH_LOGS unset: dynamo's default"),
    Row("cuda initialised", equal, "never in the agent"),
    Row("recursion depth", equal, "as deep before a RecursionError (the limit is raised by the "
        "frames below the script's: sys.getrecursionlimit() reads higher)"),
    Row("order", equal, "last line, the thread's, then atexit"),
    Row("descriptors", lambda by_way: by_way["torchrun"] == by_way["fresh"] == ["(False, [])"] * 2
        and by_way["forked"] == ["(True, [])"] * 2,
        "documented difference: a forked worker holds the agent's descriptors (above 2), all "
        "close-on-exec: no program it starts gets one"),
    Row("hash", shared_by_forked_ranks,
        "documented difference: the str hash secret is fixed at the agent's start, shared by "
        "the ranks of a start (a new agent, a new secret, at each start on one node)"),
]


@pytest.fixture(scope="module")
def probe_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str]]:
    tmp_path = tmp_path_factory.mktemp("fidelity")
    (tmp_path / "probe.py").write_text(PROBE)
    return {way: run(tmp_path, way, "probe.py") for way in WAYS}


@pytest.mark.parametrize("row", ROWS, ids=[row.key for row in ROWS])
def test_each_row_of_the_table_holds_under_torchrun_forked_and_fresh_workers(
        probe_runs: dict[str, tuple[int, str, str]], row: Row) -> None:
    for way, (code, _, stderr) in probe_runs.items():
        assert code == 0, f"{way}: {stderr[-3000:]}"
    by_way = {way: observations(stdout).get(row.key, []) for way, (_, stdout, _)
              in probe_runs.items()}
    assert row.check(by_way), f"{row.key} ({row.why}): {by_way}"


def test_a_second_start_draws_a_new_hash_secret_and_new_numbers(
        tmp_path: Path, probe_runs: dict[str, tuple[int, str, str]]) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    again = observations(run(tmp_path, "forked", "probe.py")[1])
    first = observations(probe_runs["forked"][1])
    for key in ("hash", "torch seed", "numpy", "random"):
        assert set(again[key]).isdisjoint(first[key]), (key, first[key], again[key])


def test_a_set_hash_seed_gives_forked_ranks_the_values_fresh_ranks_get(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    os.environ["PYTHONHASHSEED"] = "7"
    try:
        hashes = {}
        for way in ("forked", "fresh"):
            launcher = [sys.executable, "-m", "cycler_cli", "run", "--max-restarts", "0",
                        "--checkpoint-dir", str(tmp_path / f"ck-{way}"),
                        "--fork-workers" if way == "forked" else "--no-fork-workers"]
            done = subprocess.run([*launcher, "--nproc-per-node", "2", "probe.py"],
                                  capture_output=True, text=True, timeout=240, cwd=tmp_path)
            hashes[way] = observations(done.stdout)["hash"]
    finally:
        del os.environ["PYTHONHASHSEED"]
    assert hashes["forked"] == hashes["fresh"] and len(set(hashes["fresh"])) == 1, hashes


def test_variables_set_before_importing_torch_take_effect_in_every_way(tmp_path: Path) -> None:
    (tmp_path / "envfirst.py").write_text(ENV_FIRST)
    runs = {way: run(tmp_path, way, "envfirst.py") for way in WAYS}
    for key in ("threads", "numpy threads", "dynamo log level", "torch seed"):
        by_way = {way: observations(stdout).get(key, []) for way, (_, stdout, _) in runs.items()}
        check = each_differs_per_rank if key == "torch seed" else equal
        assert check(by_way), (key, by_way)
    assert observations(runs["fresh"][1])["threads"][0].startswith("(2,")
    assert "sets OMP_NUM_THREADS (line 3) before it imports torch" in runs["forked"][2]


def test_what_the_caller_pipes_in_reaches_the_worker_in_every_way(tmp_path: Path) -> None:
    # cycle run gave torchrun /dev/null: a script reading a pipe read nothing, and rank 0's
    # breakpoint() quit at once (BdbQuit) and its worker was restarted.
    (tmp_path / "reader.py").write_text(
        "import os, sys\nsys.stdout.write(f\"rank {os.environ['RANK']}: stdin = "
        "{sys.stdin.read()!r}\\n\")\n")
    read = {way: observations(run(tmp_path, way, "reader.py", nproc=1, given="hello\n")[1])
            for way in WAYS}
    assert all(seen.get("stdin") == [repr("hello\n")] for seen in read.values()), read


def python_report(stderr: str) -> str:
    """What the worker printed of its failure: from Python's first line of it to the error."""
    lines = stderr.splitlines()
    start = next(index for index, line in enumerate(lines)
                 if line.startswith(("Traceback (most recent", '  File "')))
    end = next(index for index, line in enumerate(lines[start:], start)
               if line.startswith(("SyntaxError", "ModuleNotFoundError", "NameError")))
    return "\n".join(lines[start:end + 1])


@pytest.mark.parametrize("source", [SYNTAX, MISSING_IMPORT], ids=["syntax", "import"])
def test_a_script_that_cannot_start_reports_as_python_reports_it_in_every_way(
        tmp_path: Path, source: str) -> None:
    (tmp_path / "broken.py").write_text(source)
    reports = {way: python_report(run(tmp_path, way, "broken.py", nproc=1)[2]) for way in WAYS}
    assert reports["forked"] == reports["torchrun"] == reports["fresh"], reports
    assert "runpy" not in reports["forked"] and "cycler" not in reports["forked"]


def test_a_worker_exit_code_is_the_same_in_every_way(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    for way in WAYS:
        code, stdout, stderr = run(tmp_path, way, "probe.py", "exit", nproc=1)
        assert code == 1 and "exitcode  : 1" in stderr, (way, stderr[-2000:])
        assert "the script's message" in stderr.splitlines(), (way, stderr)
        assert "run_worker" not in stderr, (way, stderr)  # no traceback of cycle's
        assert observations(stdout)["order"] == ["'last line' 'thread' 'atexit'"], way


APPLICATION = r'''
import os, sys
def say(key, value):
    sys.stdout.write(f"rank {os.environ['RANK']}: {key} = {value!r}\n")
say("argv", sys.argv)
say("path", [entry.replace(os.getcwd(), "CWD") for entry in sys.path[:2]])
say("main", (__file__, __name__, __package__, __spec__.name, __spec__.origin))
def deepest(level=0):
    try:
        return deepest(level + 1)
    except RecursionError:
        return level
say("recursion depth", deepest())
if sys.argv[1:] == ["fail"]:
    a_name_never_defined
'''


@pytest.mark.parametrize("kind", ["directory", "zip"])
def test_a_directory_or_zip_application_runs_as_python_runs_it_in_every_way(
        tmp_path: Path, kind: str) -> None:
    name = "app" if kind == "directory" else "app.zip"
    if kind == "directory":
        (tmp_path / name).mkdir()
        (tmp_path / name / "__main__.py").write_text(APPLICATION)
    else:
        with zipfile.ZipFile(tmp_path / name, "w") as application:
            application.writestr("__main__.py", APPLICATION)
    runs = {way: run(tmp_path, way, name) for way in WAYS}
    for key in ("argv", "path", "main", "recursion depth"):
        by_way = {way: observations(stdout).get(key, []) for way, (_, stdout, _) in runs.items()}
        assert equal(by_way), (key, by_way)
    reports = {way: python_report(run(tmp_path, way, name, "fail", nproc=1)[2])
               for way in WAYS}
    assert reports["forked"] == reports["torchrun"] == reports["fresh"], reports
    assert "a_name_never_defined" in reports["forked"] and "cycler" not in reports["forked"]
