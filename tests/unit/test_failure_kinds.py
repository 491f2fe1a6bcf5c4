"""The kind of a workers' failure, told from what they and torchrun printed (as captured from
real `cycle run`s: fresh and forked workers, torchrun's agent), and what the restart budget
does with each kind."""

from __future__ import annotations

import pytest

from cycler.supervisor.decisions.budget import RestartBudget
from cycler.supervisor.decisions.failure import failure_report
from cycler.supervisor.decisions.failure_kinds import FailureKind, WorkerFailure, classify

ROOT_CAUSE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_15:43:13
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : {code} (pid: 9087)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
AGENT_TRACEBACK = """\
E1127 15:43:06.805000 8968 site-packages/torch/distributed/elastic/multiprocessing/api.py:836] \
failed (exitcode: 1) local_rank: 0 (pid: 9087) of fn: train.py (start_method: fork)
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
"""


def worker_failed(traceback: str, code: int = 1) -> str:
    return traceback + AGENT_TRACEBACK + ROOT_CAUSE.format(code=code)


def raised(line: str, where: str = '  File "/tmp/job/train.py", line 2, in <module>\n'
           '    import data\n') -> str:
    return worker_failed(f"Traceback (most recent call last):\n{where}{line}\n")


FRESH_SYNTAX_ERROR = worker_failed(
    '  File "/tmp/job/train.py", line 2\n    def (:\n        ^\nSyntaxError: invalid syntax\n')
FORKED_SYNTAX_ERROR = worker_failed(
    'Traceback (most recent call last):\n'
    '  File "/cycler/supervisor/launch/forked.py", line 203, in run_worker\n'
    '    runpy.run_path(script, run_name="__main__")\n'
    '  File "<frozen runpy>", line 290, in run_path\n'
    '  File "/tmp/job/train.py", line 2\n    def (:\n        ^\nSyntaxError: invalid syntax\n')
STORE_PORT_IN_USE = (
    "[W1127 15:51:20 socket.cpp:460] [c10d] The server socket has failed to bind.\n"
    "Traceback (most recent call last):\n"
    '  File "/site-packages/torch/distributed/run.py", line 1019, in run\n'
    "    elastic_launch(\n"
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
    "network address. port: 60277, useIpv6: false, code: -98, name: EADDRINUSE, message: "
    "address already in use\n")


@pytest.mark.parametrize("stderr, error", [
    (raised("ModuleNotFoundError: No module named 'nonexistent_pkg_xyz'"),
     "ModuleNotFoundError: No module named 'nonexistent_pkg_xyz'"),
    (raised("ImportError: cannot import name 'Trainer' from 'lib'"),
     "ImportError: cannot import name 'Trainer' from 'lib'"),
    (raised("NameError: name 'modle' is not defined"), "NameError: name 'modle' is not defined"),
    (raised("AttributeError: module 'torch' has no attribute 'compiel'"),
     "AttributeError: module 'torch' has no attribute 'compiel'"),
    (raised("TypeError: forward() missing 1 required positional argument: 'x'"),
     "TypeError: forward() missing 1 required positional argument: 'x'"),
    (FRESH_SYNTAX_ERROR, "SyntaxError: invalid syntax"),
    (FORKED_SYNTAX_ERROR, "SyntaxError: invalid syntax"),
    (worker_failed('  File "/tmp/t.py", line 3\n    x = 1\nIndentationError: unexpected '
                   'indent\n'), "IndentationError: unexpected indent"),
], ids=["missing module", "import error", "name error", "attribute error", "type error",
        "syntax error, fresh worker", "syntax error, forked worker", "indentation error"])
def test_an_error_in_the_scripts_code_is_the_scripts(stderr: str, error: str) -> None:
    failed = classify(stderr)
    assert failed is not None and failed.kind is FailureKind.SCRIPT, failed
    assert failed.error == error and failed.resource is None and failed.signature


@pytest.mark.parametrize("stderr, resource", [
    (raised("FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-0.bin'"),
     "the file /data/shard-0.bin is missing (FileNotFoundError)"),
    (raised("ConnectionRefusedError: [Errno 111] Connection refused"),
     "a connection failed (ConnectionRefusedError: [Errno 111] Connection refused)"),
    (raised("torch.distributed.DistNetworkError: The client socket has failed to connect to "
            "[head]:29500 (errno: 111 - Connection refused)."),
     "a connection to [head]:29500 failed (DistNetworkError)"),
    (raised("OSError: [Errno 98] Address already in use"),
     "an address is in use by another process (OSError)"),
    (STORE_PORT_IN_USE, "port 60277 is in use by another process (EADDRINUSE)"),
    (raised("MemoryError"), "out of memory (MemoryError)"),
    (raised("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
     "out of memory (torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)"),
    (raised("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
            "can't allocate memory: you tried to allocate 4096 bytes. Error code 12 (Cannot "
            "allocate memory)"),
     "out of memory (RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. "
     "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes. Error code "
     "12 (Cannot allocate memory))"),
    (raised("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: "
            "not enough memory: you tried to allocate 4096 bytes."),
     "out of memory (RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. "
     "DefaultCPUAllocator: not enough memory: you tried to allocate 4096 bytes.)"),
    (raised("PermissionError: [Errno 13] Permission denied: '/data/locked'"),
     "/data/locked: PermissionError: [Errno 13] Permission denied: '/data/locked'"),
    (worker_failed("", code=-9), "killed by SIGKILL, as the kernel's out-of-memory killer does"),
], ids=["missing file", "connection refused", "store unreachable", "address in use",
        "store port in use", "memory", "cuda memory", "cpu memory", "cpu memory before 2.13",
        "permission", "oom kill"])
def test_what_the_os_refused_is_a_resource_named_in_one_phrase(stderr: str,
                                                                resource: str) -> None:
    failed = classify(stderr)
    assert failed is not None and failed.kind is FailureKind.RESOURCE, failed
    assert failed.resource == resource and "\n" not in resource


@pytest.mark.parametrize("stderr", [
    raised("RuntimeError: Found no NVIDIA driver on your system."),
    raised("ValueError: batch_size should be a positive integer value"),
    worker_failed("", code=-11),
], ids=["runtime error", "value error", "segfault"])
def test_anything_else_is_other(stderr: str) -> None:
    failed = classify(stderr)
    assert failed is not None and failed.kind is FailureKind.OTHER and failed.resource is None


def test_nothing_printed_is_no_failure_to_classify() -> None:
    assert classify("") is None and classify(AGENT_TRACEBACK + ROOT_CAUSE.format(code=1)) is None


def test_a_fresh_workers_syntax_error_is_reported_with_its_code_and_caret() -> None:
    report = failure_report(FRESH_SYNTAX_ERROR, 1).splitlines()
    assert report[1:] == ['    File "/tmp/job/train.py", line 2', "      def (:",
                          "          ^", "  SyntaxError: invalid syntax"]


SCRIPT = WorkerFailure(FailureKind.SCRIPT, "NameError: x", "NameError: x")
OTHER = WorkerFailure(FailureKind.OTHER, "RuntimeError: no CUDA", "RuntimeError: no CUDA")
MISSING = WorkerFailure(FailureKind.RESOURCE, "FileNotFoundError: ...", "FileNotFoundError",
                        "the file /data/x is missing (FileNotFoundError)")


@pytest.mark.parametrize("before_first_step", [True, False, None],
                         ids=["before the first step", "after a step", "unknown: no cycler"])
def test_the_same_error_in_the_scripts_code_twice_ends_the_job(
        before_first_step: bool | None) -> None:
    budget = RestartBudget(max_restarts=5)
    assert budget.failure(SCRIPT, before_first_step) is None
    reason = budget.failure(SCRIPT, before_first_step)
    assert reason is not None and "the same error in the script's code (NameError: x)" in reason


@pytest.mark.parametrize("before_first_step, ends", [(True, True), (False, False),
                                                     (None, False)])
def test_another_error_twice_ends_the_job_only_before_the_first_step(
        before_first_step: bool | None, ends: bool) -> None:
    budget = RestartBudget(max_restarts=5)
    budget.failure(OTHER, before_first_step)
    assert (budget.failure(OTHER, before_first_step) is not None) is ends


@pytest.mark.parametrize("before_first_step", [True, None])
def test_a_resource_is_restarted_however_often_it_repeats_until_the_budget_is_used(
        before_first_step: bool | None) -> None:
    budget = RestartBudget(max_restarts=3)
    assert [budget.failure(MISSING, before_first_step) for _ in range(3)] == [None] * 3
    reason = budget.failure(MISSING, before_first_step)
    assert reason is not None and reason.startswith("the file /data/x is missing "
                                                    "(FileNotFoundError): the workers failed 4 "
                                                    "times in a row"), reason


def test_a_resource_glitch_between_two_script_errors_keeps_them_apart() -> None:
    budget = RestartBudget(max_restarts=5)
    budget.failure(SCRIPT, None)
    budget.failure(MISSING, None)
    assert budget.failure(SCRIPT, None) is None


def test_a_checkpoint_forgets_the_last_error() -> None:
    budget = RestartBudget(max_restarts=5)
    budget.failure(SCRIPT, None)
    budget.progress()
    assert budget.failure(SCRIPT, None) is None


def test_a_traceback_with_torchruns_rank_prefixes_is_read_as_without() -> None:
    prefixed = "".join(f"[rank1]:{line}\n" for line in (
        "Traceback (most recent call last):", '  File "/tmp/job/train.py", line 2, in <module>',
        "    import data", "ModuleNotFoundError: No module named 'data'"))
    failed = classify(worker_failed(prefixed))
    assert failed is not None and failed.kind is FailureKind.SCRIPT
    assert failed.error == "ModuleNotFoundError: No module named 'data'"


def test_a_traceback_cut_short_by_torchruns_sigterm_is_not_the_failure() -> None:
    """The other rank of a failed group is ended while it prints its own traceback: what it
    left must not replace the failing rank's (two starts would then differ)."""
    whole = ("Traceback (most recent call last):\n"
             '  File "/tmp/job/a.py", line 2, in <module>\n    import nonexistent_pkg_xyz\n'
             "ModuleNotFoundError: No module named 'nonexistent_pkg_xyz'\n")
    cut = ("W1127 16:48:28.101000 9195 site-packages/torch/multiprocessing/spawn.py:165] "
           "Terminating process 9641 via signal SIGTERM\nTraceback (most recent call last):\n")
    alone, with_cut = classify(worker_failed(whole)), classify(worker_failed(whole + cut))
    assert alone is not None and with_cut is not None
    assert with_cut == alone and alone.kind is FailureKind.SCRIPT


FULL_DISK = worker_failed(
    "cycler: rank 0: no space left on /ckpt (0.0 MB free) writing model.pt after 3.2 MB: the "
    "checkpoints committed before are intact; free space or choose another checkpoint "
    "directory\n"
    "[rank1]:Traceback (most recent call last):\n"
    '[rank1]:  File "/tmp/job/train.py", line 40, in <module>\n'
    "[rank1]:    loss.backward()\n"
    "[rank1]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
    "closed by peer [127.0.0.1]:29500\n")


def test_a_rank_dead_of_a_full_disk_is_the_cause_not_the_peers_broken_connection() -> None:
    # Rank 0 says its full disk in one line, no traceback; rank 1's gloo error came after it
    # and was reported as rank 0's failure, a crash loop that never named the disk.
    failed = classify(FULL_DISK)
    assert failed is not None and failed.kind is FailureKind.RESOURCE, failed
    assert failed.resource is not None and failed.resource.startswith(
        "the disk is full: no space left on /ckpt")
    report = failure_report(FULL_DISK, 1)
    assert report.splitlines()[0].startswith("rank 0 (local_rank: 0) failed with exit code 1")
    assert "no space left on /ckpt" in report and "Connection closed" not in report
