"""Workers forked from torchrun's agent (``--fork-workers``, the default) are, for the script and
for cycle, what ``python -u SCRIPT ARGS`` workers are: the same argv, ``__main__``,
``sys.path[0]``, signal handlers and mask, session, streams, logging, thread count, exit codes,
tracebacks and ``atexit`` functions. Each case runs the same probe script under real ``cycle
run`` both ways and compares what the workers say."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cycler.supervisor.launch.launcher import FORK_SINCE, _release

PROBE = r'''
import atexit, logging, os, pickle, signal, sys, threading

class Thing:
    pass

def say(*words):
    # One write per line: the ranks share the pipe, and a line written in one piece is whole.
    sys.stdout.write(" ".join([f"rank {os.environ['RANK']}:", *map(str, words)]) + "\n")

mode = sys.argv[1]
say("argv", sys.argv[1:], "name", __name__, "main file",
    getattr(sys.modules["__main__"], "__file__", None))
say("path0", sys.path[0])
say("handlers", {name: str(signal.getsignal(getattr(signal, name)))
                 for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGPIPE", "SIGCHLD")})
say("mask", sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
say("session leader", os.getsid(0) == os.getpid())
say("pickled a class of __main__", len(pickle.loads(pickle.dumps(Thing())).__dict__))
say("cycler imported", "cycler" in sys.modules)
import multiprocessing
say("process", multiprocessing.current_process().name, "parent", multiprocessing.parent_process())
if __name__ == "__main__":  # as scripts do first (a spawned child is given its parent's)
    say("start method", multiprocessing.get_start_method(allow_none=True))
    multiprocessing.set_start_method("spawn")
import torch
say("threads", torch.get_num_threads(), "cuda initialised", torch.cuda.is_initialized())
logging.basicConfig(level=logging.INFO, format="logged %(message)s")
logging.info("by rank %s", os.environ["RANK"])
atexit.register(say, "atexit")
import weakref
weakref.finalize(logging, say, "finalized at exit")  # logging lives on: only the exit runs it
threading.Thread(target=lambda: (__import__("time").sleep(0.3), say("thread ended"))).start()
if os.environ["RANK"] == "1":
    if mode == "exit":
        sys.exit(3)
    if mode == "message":
        sys.exit("a message for stderr")
    if mode == "raise":
        raise ValueError("deliberate failure on rank 1")
    if mode == "os-exit":  # what scripts do to skip a slow teardown: never a return value
        os._exit(0)
if mode == "loader" and __name__ == "__main__":
    from torch.utils.data import DataLoader
    for context in ("fork", "spawn"):
        batches = DataLoader(list(range(8)), batch_size=4, num_workers=2,
                             multiprocessing_context=context)
        say(context, "loader", sum(len(batch) for batch in batches))
if mode == "children" and __name__ == "__main__":
    # Children the script leaves behind, as many do: multiprocessing's exit function ends them
    # (a Pool never closed, a daemonic child) or waits for them (a queue's reader); a process
    # forked by hand outlives the worker by a while, which the agent must not wait for.
    import time
    context = multiprocessing.get_context("fork")
    pool = context.Pool(2)
    say("pool", sum(pool.map(abs, range(-3, 1))))
    context.Process(target=time.sleep, args=(3600,), daemon=True).start()
    queue = context.Queue()
    context.Process(target=lambda: say("queue", len(queue.get()))).start()
    queue.put(b"x" * 1_000_000)  # its feeder thread writes it to the pipe after the script
    if os.fork() == 0:
        time.sleep(30)
        os._exit(0)
print("not flushed: the streams are unbuffered", file=sys.stderr)
'''


def run(tmp_path: Path, mode: str, fork: bool, timeout: float = 240) -> tuple[int, str, str]:
    """The probe run both ways, named by a relative path (``python`` makes it absolute)."""
    (tmp_path / "probe.py").write_text(PROBE)
    flag = "--fork-workers" if fork else "--no-fork-workers"
    done = subprocess.run(
        [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2", "--max-restarts",
         "0", "--checkpoint-dir", str(tmp_path / f"ck-{fork}"), flag, "probe.py", mode],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
        env={name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"})
    said = sorted(line for line in done.stdout.splitlines() + done.stderr.splitlines()
                  if line.startswith(("rank ", "logged ", "not flushed", "a message")))
    return done.returncode, "\n".join(said), done.stderr


@pytest.mark.parametrize("mode", ["finish", "exit", "message", "os-exit", "loader", "children"])
def test_a_forked_worker_sees_and_ends_as_a_fresh_python_worker_would(tmp_path: Path,
                                                                     mode: str) -> None:
    # 120 s: the job of "children" must end long before its hand-forked child does (30 s).
    started = time.monotonic()
    forked = run(tmp_path, mode, fork=True, timeout=120)
    forked_took = time.monotonic() - started
    fresh = run(tmp_path, mode, fork=False)
    assert forked[0] == fresh[0], forked[2]
    if mode == "children":
        assert forked_took < 25, f"the forked job waited for its workers' children: {forked_took}"
    if mode in ("finish", "loader", "children"):
        # A failed rank's peer is killed by torchrun at a moment of its own: compare only
        # runs where every rank ends by itself.
        assert forked[1] == fresh[1], forked[2]
    assert "rank 1: argv" in forked[1] and "session leader True" in forked[1]
    assert "cuda initialised False" in forked[1]


def test_a_forked_worker_that_raises_reports_its_own_traceback(tmp_path: Path) -> None:
    code, _, stderr = run(tmp_path, "raise", fork=True)
    assert code == 1
    assert "probe.py FAILED" in stderr and "run_worker" not in stderr  # torchrun's block
    report = stderr[stderr.index("cycle: error"):]
    assert 'probe.py", line' in report and "ValueError: deliberate failure on rank 1" in report
    assert "runpy" not in report and "forked.py" not in report, report


def test_the_launcher_forks_only_a_script_with_a_number_of_processes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("pass\n")

    def planned(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "cycler_cli", "run", "--dry-run", *args],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()[-1]

    assert "--cycle-fork=1" in planned(str(script))
    assert "--cycle-fork=1" not in planned("--no-fork-workers", str(script))
    assert "--cycle-fork=1" not in planned("-m", "json.tool")
    assert "--cycle-fork=1" not in planned("--start-method", "spawn", str(script))


BAD_FORK = '''
import torch.cuda
torch.cuda._is_in_bad_fork = lambda: True  # as in a child of a parent that counted GPUs
'''


@pytest.mark.skipif(_release(torch.__version__) < FORK_SINCE,
                    reason="this torch's workers are never forked")
def test_an_agent_whose_forks_could_not_use_cuda_starts_fresh_workers(tmp_path: Path) -> None:
    # torch marks a child as a bad fork once the parent asked the CUDA runtime for its devices,
    # which torch.cuda.is_initialized() does not show: the agent asks a forked probe instead.
    # Here every process is made to answer "bad fork" (a sitecustomize), as a GPU agent would.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BAD_FORK)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "cycler_cli", "run", "--nproc-per-node", "2", "--max-restarts",
         "0", "--checkpoint-dir", str(tmp_path / "ck"), str(script), "finish"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=environment)
    assert done.returncode == 0, done.stderr
    assert "a forked worker could not use it: the workers start as fresh processes" in done.stderr
    assert "rank 1: argv ['finish']" in done.stdout
