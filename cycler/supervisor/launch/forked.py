"""Workers forked from torchrun's agent, which has imported torch already (``--fork-workers``).

A worker started as ``python -u train.py`` imports torch again, on every start and restart:
about a second per start on an idle machine, several under load. Forked from the agent (torch's
own ``fork`` start method with a function entrypoint, as ``torchrun --run-path --start-method
fork`` does), a worker starts with torch and the modules a training script imports loaded. The
script then runs as ``__main__`` (compiled and run as Python runs its main script), and
:func:`run_worker` makes the child what ``python -u SCRIPT ARGS`` would have been, for everything
cycle and a script can see:

- its own session (torchrun starts every worker in one: the supervisor signals its group), and
  ``python -u SCRIPT ARGS`` as its command line (``/proc/PID/cmdline`` ending where theirs
  ends);
- the signal handlers and mask of a fresh interpreter, not the agent's (torchrun's handlers and
  the launcher's shield must never reach a script);
- ``sys.argv`` as given, ``sys.orig_argv``, ``sys.path[0]`` (the directory of the script's real
  path) and ``__main__`` (the script, by its absolute path, so that pickles of its classes and
  DataLoader workers under ``spawn`` find it), unbuffered streams, stdin on descriptor 0,
  faulthandler as ``$PYTHONFAULTHANDLER`` asks, multiprocessing's main process;
- its own random state: torch's default CPU generator and numpy's global state seeded from the
  system's entropy (Python's ``random`` reseeds itself at a fork); the str hash secret cannot be
  redone after a fork and stays the agent's (docs/cycle-run.md lists it);
- the root logger without the agent's handlers, so that the script's ``logging.basicConfig``
  works as in a fresh process;
- tempfile's directory not yet chosen (the agent's is dropped), so that a ``$TMPDIR`` the
  script sets before its first use counts;
- torch's intra-op threads from ``$OMP_NUM_THREADS`` (torchrun sets it in the agent after
  torch was loaded, so the fork would keep the agent's count);
- cycler's modules unloaded, so that the script's ``import cycler`` is a worker's first, with
  its start-up (the beacon, the stack dump) and fresh module state;
- the exit: ``sys.exit(n)`` exits ``n`` (a message is printed to stderr without ``print``,
  then 1), an uncaught exception goes to ``sys.excepthook`` (a missing or failing hook is
  reported as Python reports it) and exits 1, a KeyboardInterrupt ends the process by SIGINT,
  and the script's ``atexit`` functions run after its non-daemon threads ended, then its
  modules' (not the agent's own: they are dropped first); then, once the other threads
  sleep, the script's names are cleared as Python clears them (its objects' finalizers run);
  the agent sees the worker's exit, not its children's.
  The interpreter's own teardown is skipped (``os._exit``, as multiprocessing does): the agent's
  objects copied into the child (its store server among them) must not be torn down twice.

CUDA must never have been initialised in the agent: a forked child cannot use a CUDA context
made before the fork. torchrun initialises none with a number for ``--nproc-per-node`` (``gpu``
and ``auto`` count the GPUs, which may) and neither does anything cycle imports here. Counting
is enough to break a child: torch marks a fork as bad (``Cannot re-initialize CUDA in forked
subprocess``) once the parent asked the CUDA runtime for its devices (``torch.cuda.is_available``
without NVML, ``torch._C._cuda_getDeviceCount``), which ``torch.cuda.is_initialized()`` does not
show. So the launcher asks a forked probe child what torch says there (:func:`fork_is_bad`) and
starts fresh processes when the fork would be bad or CUDA is initialised.
"""

from __future__ import annotations

import atexit
import builtins
import gc
import importlib
import os
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

from cycler.supervisor.launch.fresh_worker import fresh_process

PRELOADED = ("torch", "torch.distributed", "torch.nn", "torch.nn.parallel", "torch.optim",
             "torch.utils.data")
"""What the agent imports before it forks: torch's modules that almost every training script
imports. ``torch._dynamo``, which ``DistributedDataParallel``'s constructor imports (1.9 s
here), only for a script that names it (:func:`.torchrun.fork_preloads`): in the agent it
delays the start of a script that never uses it by as much, and where the machine has a core
per worker the workers import it side by side in about the same time (to the first step of
the 2-rank example: 8.9 s and 13.5 s with it, 8.8 s and 13.7 s without, at load 7-11); on
fewer cores than workers, or a loaded machine, once in the agent is cheaper (process group
5-7 s per restart at load 13 without it)."""


def preload(more: list[str] | tuple[str, ...] = ()) -> None:
    """Import :data:`PRELOADED` and ``more`` in the agent (those that exist in this torch)."""
    for name in (*PRELOADED, *more):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def freeze_for_fork() -> None:
    """Keep the agent's objects out of every garbage collection from now on (:func:`gc.freeze`).

    A forked child shares the agent's memory until it writes to it; a collection writes to
    every object it visits, so a worker's full collections would copy the agent's heap, torch's
    modules included, page by page (Python's advice for a fork without exec: freeze before
    it). Frozen, the agent's objects are never visited, in the agent or a child. They are thawed
    when the agent exits, so that its interpreter's teardown frees them as usual: left frozen,
    extensions that count their live objects at exit report them as leaks (triton's, imported
    with ``torch._dynamo`` on a CUDA build, prints some 40 lines of "nanobind: leaked").
    """
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


def fork_is_bad() -> bool:
    """Whether a child forked now could not use CUDA, as torch judges it in the child
    (``torch.cuda._is_in_bad_fork``: the parent initialised CUDA or counted its devices through
    the runtime). A probe child answers by its exit code, at once and before anything else runs;
    a probe that cannot be forked or answers oddly counts as bad."""
    try:
        pid = os.fork()
    except OSError:
        return True
    if pid == 0:  # the probe: touch nothing, answer, leave without any teardown
        import torch

        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)


def count_clean_exits_as_returns() -> None:
    """Make torch's agent count a forked worker that exited 0 without returning (a script that
    ends with ``os._exit(0)``, as some do to skip a slow teardown) as finished, as it counts a
    ``python`` worker that exits 0: torch's function entrypoint waits for a return value from
    every worker, and would wait for this one's forever."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    poll = MultiprocessContext._poll

    def poll_counting_clean_exits(context: Any) -> Any:
        processes = context._pc.processes if context._pc is not None else []
        for local_rank, process in enumerate(processes):
            if process.exitcode == 0 and local_rank not in context._return_values \
                    and context._ret_vals[local_rank].empty():
                context._return_values[local_rank] = None
        return poll(context)

    MultiprocessContext._poll = poll_counting_clean_exits  # type: ignore[method-assign,assignment]


def watch_exits_by_pid() -> None:
    """Make torch's agent see a forked worker end when it exits, as it sees a ``python`` worker.

    torch waits for a forked worker's end on a pipe whose write end the worker holds until it
    exits; every process the worker forks (a ``multiprocessing.Pool`` never closed, a daemonic
    ``Process``, a DataLoader worker) inherits that end, so the pipe stays open while any of them
    lives and the agent waited for them forever (or until their parent-death check, 5 s for a
    DataLoader's). A pidfd (Linux 5.3) is readable once the worker itself has exited; where
    none can be opened, torch's pipe stays."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    start = MultiprocessContext._start

    def start_watching_pids(context: Any) -> None:
        start(context)
        try:
            processes, sentinels = context._pc.processes, context._pc.sentinels
        except AttributeError:  # a torch whose context is built otherwise: its own pipe
            return
        watched = {_exit_watch(processes[index], pipe): index
                   for pipe, index in sentinels.items()}
        context._pc.sentinels = watched
        opened = [fd for fd, index in watched.items() if fd != processes[index].sentinel]
        weakref.finalize(context._pc, _close_pidfds, opened)

    MultiprocessContext._start = start_watching_pids  # type: ignore[method-assign]


def _exit_watch(process: Any, pipe: int) -> int:
    try:
        return os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # an older kernel or Python: torch's own pipe
        return pipe


def _close_pidfds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def named_worker(script: str) -> Callable[..., NoReturn]:
    """:func:`run_worker` named ``script``: torchrun names a failed worker by its function
    ("train.py FAILED", as it names a ``python`` worker by its script, not "run_worker")."""

    def worker(*arguments: str) -> NoReturn:
        run_worker(*arguments)

    worker.__name__ = worker.__qualname__ = script
    return worker


def run_worker(script: str, *arguments: str) -> NoReturn:
    """The body of one forked worker: run ``script`` with ``arguments`` as ``python -u`` would.

    Never returns: the process exits here with the code Python would have given, success
    included. torch's function entrypoint would keep a worker that returned alive until every
    worker of the node returned, with its process group's sockets open; a peer whose teardown
    waits for them to close (gloo's threads, joined in ``~ProcessGroupGloo``) then waits
    forever, where a ``python`` worker's exit would have closed them (seen on torch 2.7.1: one
    start in ten). The agent counts a worker that exited 0 as finished
    (:func:`count_clean_exits_as_returns`).
    """
    fresh_process(script, arguments)
    # Python makes the script's path absolute (3.9 and newer) for __file__ and its frames, as
    # it is (no normalising): a script that changes directory still finds itself.
    path = os.path.join(os.getcwd(), script)
    application = _is_application(path)
    if application:
        # A directory or a zip application with a __main__.py runs as python runs it: the
        # application itself first on sys.path (the path as given, made absolute), then
        # runpy's _run_module_as_main, which leaves sys.argv[0] as given.
        sys.path[0] = path
        code = _RUN_APPLICATION
    else:
        code = _compiled(path)
    probe: dict[str, Any] = {}
    exec(_DEPTH_PROBE, probe)  # from where the script's code runs, as deep as it will be
    # An application's own frame, _RUN_APPLICATION's, is one below python's start of it.
    _recursion_as_fresh(probe["reached"] - application)
    try:
        exec(code, _main_module(path).__dict__)  # only sys.modules holds it: see _finish
    except SystemExit as stop:
        status = _exit_code(stop)
        if status:
            _exit(status)
    except KeyboardInterrupt as interrupt:
        _print_uncaught(interrupt, path)
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(128 + signal.SIGINT)  # the shell's code for it, should the signal be late
    except BaseException as error:  # noqa: BLE001 - what the interpreter does with it
        _print_uncaught(error, path)
        _exit(1)
    _exit(0)


_RUN_APPLICATION = compile("import runpy\nrunpy._run_module_as_main('__main__', False)\n",
                           "<run application>", "exec")
"""What ``python DIRECTORY`` and ``python APP.zip`` run (CPython's ``pymain_run_module``)."""


def _is_application(path: str) -> bool:
    """A directory, or a zip file (a zip application): not a source file to compile."""
    import zipfile

    return os.path.isdir(path) or (os.path.isfile(path) and zipfile.is_zipfile(path))


def _compiled(path: str) -> Any:
    """The script's code, or the exit ``python`` makes when it cannot read or compile it:
    exit 2 with its one line for a file it cannot open, exit 1 with a SyntaxError printed as
    Python prints one for its main script (no traceback: no frame of runpy's or ours)."""
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError as error:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: "
                         f"[Errno {error.errno}] {error.strerror}\n")
        _exit(2)
    try:
        if b"\0" in source:  # Python's own words for a file; compile()'s differ
            before = source[:source.index(b"\0")]
            line = before.count(b"\n") + 1
            text = before.rsplit(b"\n", 1)[-1].decode(errors="replace")
            raise SyntaxError("source code cannot contain null bytes", (path, line, None, text))
        return compile(source, path, "exec", dont_inherit=True)
    except SyntaxError as error:  # IndentationError and TabError are SyntaxErrors
        _display(error.with_traceback(None))
        _exit(1)


_DEPTH_PROBE = compile("def deepest(level=0):\n    try:\n        return deepest(level + 1)\n"
                       "    except RecursionError:\n        return level\nreached = deepest()\n",
                       "<depth probe>", "exec")
FRESH_REACH = 2
"""How many levels short of the recursion limit a fresh ``python``'s main script gets (its
module frame, and the first call: 998 of 1000 on Python 3.11)."""


def _recursion_as_fresh(reached: int) -> None:
    """Raise the recursion limit by the levels that torch's entrypoint and ours take below
    the script (``reached``: how deep a probe run where the script runs got): the script
    recurses as deep before a RecursionError as in a fresh ``python``."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + max(limit - FRESH_REACH - reached, 0))


def _main_module(path: str) -> types.ModuleType:
    """A new ``__main__`` for the script, with the attributes Python gives its main script
    (``__file__``, ``__cached__``, a source loader, no ``__spec__``), in ``sys.modules``."""
    from importlib.machinery import SourceFileLoader

    main = types.ModuleType("__main__")
    main.__dict__.update(__loader__=SourceFileLoader("__main__", path), __annotations__={},
                         __builtins__=builtins, __file__=path, __cached__=None)
    sys.modules["__main__"] = main
    return main


def _print_uncaught(error: BaseException, script: str) -> None:
    """The traceback Python prints, from the script's frame on (without ours); for an
    application, from runpy's frames below it, as Python prints them."""
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != script:
        if frames.tb_frame.f_code is _RUN_APPLICATION:
            frames = frames.tb_next
            break
        frames = frames.tb_next
    _display(error.with_traceback(frames or error.__traceback__))


def _display(error: BaseException) -> None:
    """Show an uncaught ``error`` as Python does: by ``sys.excepthook``; where it is missing,
    or raises, Python's words for that and the default hook's tracebacks (the hook's own
    error, from the hook's frame on, then the original)."""
    hook = getattr(sys, "excepthook", None)
    try:
        if hook is None:
            sys.stderr.write("sys.excepthook is missing\n")
        else:
            hook(type(error), error, error.__traceback__)
            return
    except Exception as failure:  # noqa: BLE001 - what the interpreter does with it
        sys.stderr.write("Error in sys.excepthook:\n")
        failure.__suppress_context__ = True  # Python called the hook outside any handler
        failure = failure.with_traceback(failure.__traceback__.tb_next)  # type: ignore[union-attr]
        sys.__excepthook__(type(failure), failure, failure.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
    sys.__excepthook__(type(error), error, error.__traceback__)


def _exit_code(stop: SystemExit) -> int:
    """The exit status Python gives ``sys.exit(stop.code)``: for anything but a number, the
    code printed as Python prints it (to ``sys.stderr``, or to descriptor 2 where that is None
    or fails; ``print`` is the script's to replace), then 1."""
    code = stop.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(f"{code}\n")
    except Exception:  # noqa: BLE001 - None, closed, or the script's own that fails
        os.write(2, f"{code}\n".encode(errors="backslashreplace"))
    return 1


def _finish() -> None:
    """What the interpreter does at its exit before its teardown: wait for the non-daemon
    threads, run the ``atexit`` functions (the modules' among them: multiprocessing's ends the
    daemonic children, a DataLoader's workers included), collect the script's objects (their
    finalizers run, as they would in the teardown), flush the streams."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    _wait_for_quiet_threads()
    main = sys.modules.pop("__main__", None)
    if main is not None:  # as Python clears its modules: the names, then collect the cycles
        _clear_names(vars(main))
    del main
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


QUIET_SAMPLES = 3
QUIET_TICK = 0.01
QUIET_LIMIT = 2.0


def _wait_for_quiet_threads() -> None:
    """Wait, the GIL released, until the process's other threads have all slept for
    :data:`QUIET_SAMPLES` ticks in a row without running (at most :data:`QUIET_LIMIT` s).

    Dropping the script's objects may destroy a gloo process group (DDP's reducer holds one),
    whose destructor joins gloo's threads while it holds the GIL; a gloo thread still letting
    go of its last work needs the GIL for that, and the two waited for each other forever
    (5 of 47 starts of a DDP script at load 30). Once every thread sleeps with the GIL free
    to take, none is in the middle of that."""
    deadline = time.monotonic() + QUIET_LIMIT
    quiet, last = 0, None
    while quiet < QUIET_SAMPLES and time.monotonic() < deadline:
        time.sleep(QUIET_TICK)
        now = _other_threads()
        quiet = quiet + 1 if now == last and all(state != "R" for state, _ in now.values()) \
            else 0
        last = now


def _other_threads() -> dict[str, tuple[str, bytes]]:
    """Each other thread's state and CPU time (``/proc/self/task``); none where unreadable."""
    threads, me = {}, str(threading.get_native_id())
    try:
        tasks = [task for task in os.listdir("/proc/self/task") if task != me]
    except OSError:
        return {}
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # it ended
        threads[task] = (fields[0].decode(), fields[11] + b"+" + fields[12])
    return threads


def _clear_names(names: dict[str, Any]) -> None:
    """Set a module's names to None as Python does at its exit: first those starting with one
    underscore, then all but ``__builtins__`` (the finalizers they run still find it)."""
    for name in list(names):
        if name.startswith("_") and not name.startswith("__"):
            names[name] = None
    for name in list(names):
        if name != "__builtins__":
            names[name] = None


def _exit(code: int) -> NoReturn:
    _finish()
    os._exit(code)
