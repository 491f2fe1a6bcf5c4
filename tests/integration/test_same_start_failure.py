"""A start that fails the same way twice is not tried a third time, when what differs between
the two failures is a detail (issue 25's brief, item 2): a time in the message, or a death by the
same signal. Real `cycle run`, real torchrun, real workers that fail before their first step."""

from __future__ import annotations

from pathlib import Path

import pytest
from cycle_jobs import Job

from cycler.protocol.exit_codes import EXIT_FAILURE

RAISES_WITH_THE_TIME = r'''
import time
import cycler
time.sleep(0.2)
raise RuntimeError(f"the data service did not answer by {time.time()}, after 0.{time.time_ns()} s")
'''

KILLS_ITSELF_WITH_SIGSEGV = r'''
import os, signal, time
import cycler
time.sleep(0.2)
os.kill(os.getpid(), signal.SIGSEGV)
'''


@pytest.mark.parametrize("worker", [RAISES_WITH_THE_TIME, KILLS_ITSELF_WITH_SIGSEGV],
                         ids=["a time in the message", "a SIGSEGV"])
def test_a_start_that_fails_twice_the_same_way_ends_after_the_second_start(
        tmp_path: Path, worker: str) -> None:
    job = Job(tmp_path, "--restart-delay", "0.2", worker=worker)
    assert job.wait(180) == EXIT_FAILURE, job.output()[-3000:]
    assert job.event_names().count("workers_started") == 2, job.output()[-3000:]
    output = job.output()
    report = output[output.rindex("cycle: error:"):]
    assert "failed twice before their first step with the same error" in report, report
