"""The failing worker's report, extracted from torchrun's stderr as the supervisor saw it."""

from __future__ import annotations

from cycler.supervisor.decisions.failure import failure_report, failure_signature

WORKER_TRACEBACK = """\
Traceback (most recent call last):
  File "/tmp/job/train.py", line 4, in <module>
    raise RuntimeError("boom on rank 1")
RuntimeError: boom on rank 1
"""

TORCHRUN_REPORT = """\
W1123 01:57:21.408000 4756 site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] \
Sending process 4805 closing signal SIGTERM
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4805)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_01:57:21
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4806)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_report_names_the_root_cause_rank_and_shows_the_worker_traceback():
    report = failure_report("hello\n" + WORKER_TRACEBACK + TORCHRUN_REPORT, 1)
    lines = report.splitlines()
    assert lines[0] == "rank 1 (local_rank: 1) failed with exit code 1 (pid: 4806):"
    assert lines[1:] == ["  " + line for line in WORKER_TRACEBACK.splitlines()]
    assert "ChildFailedError" not in report and "run.py" not in report


def test_the_last_worker_traceback_is_the_one_reported():
    earlier = WORKER_TRACEBACK.replace("boom on rank 1", "first")
    report = failure_report(earlier + "noise\n" + WORKER_TRACEBACK + TORCHRUN_REPORT, 1)
    assert "first" not in report and "boom on rank 1" in report


def test_without_a_traceback_the_last_lines_of_output_are_reported():
    output = "".join(f"line {n}\n" for n in range(30)) + "Segmentation fault\n"
    report = failure_report(output + TORCHRUN_REPORT, -11)
    lines = report.splitlines()
    assert lines[-1] == "  Segmentation fault"
    assert len(lines) == 21 and "Sending process" not in report


def test_without_any_output_the_report_is_the_exit_code():
    assert failure_report("", 2) == "workers failed (exit code 2)"


def traceback_of(message: str, line: int = 4, kind: str = "RuntimeError") -> str:
    return (f'Traceback (most recent call last):\n  File "/tmp/job/train.py", line {line}, in '
            f'<module>\n    raise {kind}(message)\n{kind}: {message}\n' + TORCHRUN_REPORT)


def test_two_failures_whose_messages_differ_in_a_time_a_path_or_a_port_have_one_signature():
    pairs = [("started at 1795704465.9313772, gave up after 12.5 s",
              "started at 1795704471.1022001, gave up after 3 s"),
             ("cannot read /tmp/tmpa8x_k2q1/state.pt", "cannot read /tmp/tmpzz0c91ab/state.pt"),
             ("address in use: 127.0.0.1:45123", "address in use: 127.0.0.1:38011"),
             ("rank 3 timed out at 2026-11-26 14:59:01", "rank 3 timed out at 2026-11-26 15:00:17")]
    for first, second in pairs:
        assert failure_signature(traceback_of(first)) == failure_signature(traceback_of(second))


def test_failures_that_differ_in_kind_keep_different_signatures():
    base = failure_signature(traceback_of("no CUDA device"))
    assert base != failure_signature(traceback_of("no CUDA device", line=5))
    assert base != failure_signature(traceback_of("no CUDA device", kind="ValueError"))
    assert base != failure_signature(traceback_of("no such file"))


def test_a_rank_killed_by_a_signal_is_named_by_the_signal():
    segfault = TORCHRUN_REPORT.replace("exitcode  : 1 (pid: 4806)", "exitcode  : -11 (pid: 4806)")
    other_pid = segfault.replace("4806", "5120")
    assert failure_signature(segfault) == failure_signature(other_pid) == "killed by SIGSEGV"
    aborted = TORCHRUN_REPORT.replace("exitcode  : 1 (pid: 4806)", "exitcode  : -6 (pid: 4806)")
    assert failure_signature(aborted) == "killed by SIGABRT"
    assert failure_signature(TORCHRUN_REPORT) is None, "an exit code is no signature"


def prefixed(text: str, rank: int) -> str:
    return "".join(f"[rank{rank}]: {line}\n" for line in text.splitlines())


def test_a_traceback_torch_prefixes_with_the_rank_is_reported_and_has_one_signature():
    worker = traceback_of("refused: drop use_stateful_dataloader").split(TORCHRUN_REPORT)[0]
    first = prefixed(worker, 0) + prefixed(worker, 1) + TORCHRUN_REPORT
    second = prefixed(worker, 1) + prefixed(worker, 0) + TORCHRUN_REPORT
    assert failure_signature(first) is not None
    assert failure_signature(first) == failure_signature(second)
    assert "  RuntimeError: refused: drop use_stateful_dataloader" in \
        failure_report(first, 1).splitlines()
