"""Workers forked from torchrun's agent, which has imported torch already (``--fork-workers``).

A worker started as ``python -u train.py`` imports torch again, on every start and restart:
about a second per start on an idle machine, several under load. Forked from the agent (torch's
own ``fork`` start method with a function entrypoint, as ``torchrun --run-path --start-method
fork`` does), a worker starts with torch and the modules a training script imports loaded. The
script then runs as ``__main__`` (compiled and run as Python runs its main script), and
:func:`run_worker` makes the child what ``python -u SCRIPT ARGS`` would have been, for everything
cycle and a script can see:

- its own session (torchrun starts every worker in one: the supervisor signals its group), and
  ``python -u SCRIPT ARGS`` as its command line;
- the signal handlers and mask of a fresh interpreter, not the agent's (torchrun's handlers and
  the launcher's shield must never reach a script);
- ``sys.argv``, ``sys.path[0]`` (the script's directory) and ``__main__`` (the script, by its
  absolute path, so that pickles of its classes and DataLoader workers under ``spawn`` find it),
  unbuffered streams, multiprocessing's main process;
- the root logger without the agent's handlers, so that the script's ``logging.basicConfig``
  works as in a fresh process;
- torch's intra-op threads from ``$OMP_NUM_THREADS`` (torchrun sets it in the agent after
  torch was loaded, so the fork would keep the agent's count);
- cycler's modules unloaded, so that the script's ``import cycler`` is a worker's first, with
  its start-up (the beacon, the stack dump) and fresh module state;
- the exit: ``sys.exit(n)`` exits ``n``, an uncaught exception prints its traceback to stderr
  and exits 1, a KeyboardInterrupt ends the process by SIGINT, and the script's ``atexit``
  functions run after its non-daemon threads ended, then its modules' (not the agent's own:
  they are dropped first); the agent sees the worker's exit, not its children's.
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
import faulthandler
import gc
import importlib
import itertools
import logging
import multiprocessing.context
import multiprocessing.process
import os
import signal
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

from cycler._distributed import settle_gloo_threads_at_exit

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
    _fresh_process(script, arguments)
    # Python makes the script's path absolute (3.9 and newer) for __file__ and its frames, as
    # it is (no normalising): a script that changes directory still finds itself.
    path = os.path.join(os.getcwd(), script)
    code = _compiled(path)
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
        sys.excepthook(type(error), error.with_traceback(None), None)
        _exit(1)


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
    """The traceback Python prints, from the script's frame on (without ours)."""
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != script:
        frames = frames.tb_next
    error = error.with_traceback(frames or error.__traceback__)
    sys.excepthook(type(error), error, error.__traceback__)


def _fresh_process(script: str, arguments: tuple[str, ...]) -> None:
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
    arguments are among them). Best effort: the agent's stay where this is refused."""
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
    except (OSError, ValueError, IndexError):
        pass


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


def _exit_code(stop: SystemExit) -> int:
    """The exit status Python gives ``sys.exit(stop.code)`` (a message is printed, then 1)."""
    code = stop.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
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
    (once in 5 starts of a DDP script at load 30). Once every thread sleeps with the GIL free
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
