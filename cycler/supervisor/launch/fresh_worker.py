"""What makes a child forked from torchrun's agent the process ``python -u SCRIPT ARGS`` starts
as (:func:`fresh_process`), before the script runs: the agent's state that a fresh interpreter
would not have (signal handlers, ``atexit`` functions, faulthandler, random state, streams,
multiprocessing's idea of the process) replaced by what it would have."""

from __future__ import annotations

import atexit
import faulthandler
import itertools
import logging
import multiprocessing.context
import multiprocessing.process
import os
import signal
import sys
import tempfile
import weakref
from typing import Any

from cycler._distributed import settle_gloo_threads_at_exit


def fresh_process(script: str, arguments: tuple[str, ...]) -> None:
    """Make this forked child the process ``python -u script arguments`` starts as, for
    everything a script can observe (:mod:`.forked` lists it), before the script runs."""
    os.setsid()
    command = [sys.executable, "-u", script, *arguments]
    _command_line(command)
    sys.orig_argv = command
    _default_signals()
    _faulthandler_as_asked()
    atexit._clear()  # the agent's, inherited: only the script's run at its exit
    _main_process()
    _module_exit_functions()
    sys.argv = [script, *arguments]
    # Python's sys.path[0]: the directory of the script's real path (symlinks resolved).
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    _standard_streams()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    _torch_threads()
    _own_random_state()
    # tempfile caches the directory at its first gettempdir() (torchrun's agent made its log
    # directory with it): a script's TMPDIR, set before its own first use, is read again.
    tempfile.tempdir = None
    # cycler as a fresh worker imports it: its start-up in a worker (the beacon, the stack
    # dump) happens at the script's own `import cycler`, and never for a script without it.
    for name in [name for name in sys.modules if name.partition(".")[0] == "cycler"]:
        del sys.modules[name]
    # What StepControl and the savers register at a worker's exit, for every script: one that
    # never imports cycler ends with DDP's gloo threads as much as one that does.
    settle_gloo_threads_at_exit()


_MAIN_PROCESS = type(multiprocessing.process.current_process())
"""multiprocessing's class of a main process (private, and deleted from its module), taken
from the agent, which imports this module before it forks."""


def _main_process() -> None:
    """Make this process multiprocessing's main process, as in a fresh interpreter (not the
    agent's child ``ForkProcess-N``): libraries tell a worker process from the main one by it
    (``current_process().name``, ``parent_process()``; transformers' language-modelling
    collator with a seed raised in a forked worker), it names the script's own children, and
    the script chooses the start method (``multiprocessing.set_start_method``)."""
    processes = multiprocessing.process
    if _MAIN_PROCESS.__name__ != "_MainProcess":
        return  # the agent was not a main process itself: nothing to copy
    processes._current_process = _MAIN_PROCESS()  # type: ignore[attr-defined]
    processes._parent_process = None  # type: ignore[attr-defined]
    processes._children = set()  # type: ignore[attr-defined]
    processes._process_counter = itertools.count(1)  # type: ignore[attr-defined]
    # No start method chosen yet (a child is given its parent's, "fork"): the script's
    # set_start_method("spawn") raised "context has already been set".
    multiprocessing.context._default_context._actual_context = None  # type: ignore[attr-defined]


EXIT_FUNCTIONS = (("logging", "shutdown"), ("torch.utils.data._utils", "_set_python_exit_flag"),
                  ("multiprocessing.util", "_exit_function"))
"""The ``atexit`` functions that these modules register when they are imported, in that order:
the agent imported them, so the script's imports do not register them again. In a fresh
interpreter they run after the script's: multiprocessing's ends the script's daemonic children
and a ``Pool`` left open, joins the others and flushes its queues; logging's flushes and
closes the handlers."""


def _module_exit_functions() -> None:
    """Register :data:`EXIT_FUNCTIONS` of the loaded modules, and ``weakref.finalize``'s exit
    function for the script's finalizers (those made with ``atexit=True``, the default: a
    ``tempfile.TemporaryDirectory`` among them), never for the agent's (the agent's own
    directories are not this process's to remove)."""
    for module, name in EXIT_FUNCTIONS:
        if module in sys.modules:
            atexit.register(getattr(sys.modules[module], name))
    for info in weakref.finalize._registry.values():  # type: ignore[attr-defined]
        info.atexit = False
    atexit.register(weakref.finalize._exitfunc)  # type: ignore[attr-defined]
    weakref.finalize._registered_with_atexit = True  # type: ignore[attr-defined]


def _command_line(words: list[str]) -> None:
    """Show ``words`` as this process's command line (``ps``, psutil, the hang report), not
    the agent's it was forked with: written over the agent's arguments in this process's
    memory, which the kernel reads them from (they are always longer: the script and its
    arguments are among them), and the kernel's end of them moved to the end of ``words``
    (:func:`_end_arguments`), so that no empty argument trails them. Best effort: the agent's
    stay where this is refused; where only the move is refused, they end in NULs (psutil
    reads one empty argument for each)."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        title = b"\0".join(os.fsencode(word) for word in words) + b"\0"
        if len(title) > end - start:
            return
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            memory.write(title + b"\0" * (end - start - len(title)))
        _end_arguments(fields, start + len(title))
    except (OSError, ValueError, IndexError):
        pass


def _end_arguments(stat: list[bytes], end: int) -> None:
    """Set the kernel's end of this process's arguments to ``end`` (``prctl(PR_SET_MM,
    PR_SET_MM_MAP)``, unprivileged since Linux 3.18 where checkpoint/restore is built in),
    every other address as ``stat`` (``/proc/self/stat``'s fields after the name) and the
    program break say. Called in the forked child before any other thread exists, so that the
    break read here is still the break when the kernel takes it. Refused: nothing changes."""
    import ctypes

    class MmMap(ctypes.Structure):  # struct prctl_mm_map
        _fields_ = [*((name, ctypes.c_uint64) for name in (
            "start_code", "end_code", "start_data", "end_data", "start_brk", "brk",
            "start_stack", "arg_start", "arg_end", "env_start", "env_end", "auxv")),
            ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]

    field = [0, 0, 0, 0, *(int(value) for value in stat[1:])]  # field[n]: proc(5)'s field n
    mm_map = MmMap(field[26], field[27], field[45], field[46], field[47], 0, field[28],
                   field[48], end, field[50], field[51], 0, 0, 0xFFFFFFFF)  # exe_fd: kept
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    libc.sbrk.argtypes = [ctypes.c_ssize_t]
    mm_map.brk = libc.sbrk(0) or 0
    libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.byref(mm_map), ctypes.sizeof(mm_map), 0)


PR_SET_MM, PR_SET_MM_MAP = 35, 14
"""<linux/prctl.h>"""


def _default_signals() -> None:
    """Every handler and the mask a fresh interpreter starts with."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.set_wakeup_fd(-1)
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            current = signal.getsignal(number)
        except (OSError, ValueError):
            continue
        wanted: Any
        if number == signal.SIGINT:
            wanted = signal.default_int_handler
        elif number in (signal.SIGPIPE, signal.SIGXFSZ):
            wanted = signal.SIG_IGN
        else:
            wanted = signal.SIG_DFL
        if current is not wanted and current is not None:
            try:
                signal.signal(number, wanted)
            except (OSError, ValueError):
                pass


def _faulthandler_as_asked() -> None:
    """faulthandler as a fresh ``python -u`` has it: on only where ``$PYTHONFAULTHANDLER``
    asks (torch's entrypoint wrapper turned it on in this child), no signal of the agent's
    registered, no dump pending."""
    faulthandler.cancel_dump_traceback_later()
    for number in signal.valid_signals():
        try:
            faulthandler.unregister(number)
        except (RuntimeError, ValueError, OSError):  # the fatal ones: enable()'s, below
            pass
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable(all_threads=True)
    else:
        faulthandler.disable()


def _standard_streams() -> None:
    """Unbuffered stdout and stderr (``-u``), and stdin on file descriptor 0, as torchrun's
    ``python`` worker inherits it (multiprocessing gave the child ``/dev/null`` instead)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(write_through=True)
    model = sys.__stdin__
    try:
        stdin: Any = open(0, encoding=getattr(model, "encoding", None),  # noqa: SIM115
                          errors=getattr(model, "errors", None), closefd=False)
    except OSError:  # no descriptor 0: Python's stdin is None then
        stdin = None
    sys.stdin = stdin
    sys.__stdin__ = stdin  # type: ignore[misc]


def _own_random_state() -> None:
    """Seed the generators a fresh interpreter seeds at start from the system's entropy, as
    it does: torch's default CPU generator (CUDA's are seeded lazily, at their first use, in
    either process) and numpy's global state, which the agent's imports seeded once for every
    worker. Python's ``random`` reseeds itself at every fork."""
    import torch

    torch.default_generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _torch_threads() -> None:
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
