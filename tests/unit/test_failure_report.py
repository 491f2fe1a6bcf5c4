"""The failing worker's report, extracted from torchrun's stderr as the supervisor saw it."""

from __future__ import annotations

from cycler.supervisor.failure import failure_report

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
