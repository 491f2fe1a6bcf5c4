"""A start that fails the same way twice is not tried a third time, when what differs between
the two failures is a detail (issue 25's brief, item 2): a time in the message, or a death by the
same signal. Real `cycle run`, real torchrun, real workers that fail before their first step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cycle_jobs import Job, wait_for
from gloo_ranks import free_port

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


# Issue 33: what failed decides, not whether the script imported cycler before failing.

MISSING_MODULE = "import torch\nimport nonexistent_pkg_xyz\n"
DOES_NOT_COMPILE = "import torch\ndef (:\n"
NAME_ERROR_AT_IMPORT = "import torch\nmodel = torch.nn.Linear(2, 2)\noptimizer = optim(model)\n"


@pytest.mark.parametrize("worker, error", [
    (MISSING_MODULE, "ModuleNotFoundError: No module named 'nonexistent_pkg_xyz'"),
    (DOES_NOT_COMPILE, "SyntaxError: invalid syntax"),
    (NAME_ERROR_AT_IMPORT, "NameError: name 'optim' is not defined"),
], ids=["a missing module", "a SyntaxError", "a NameError"])
@pytest.mark.parametrize("fork", ["--fork-workers", "--no-fork-workers"])
def test_an_error_in_the_code_of_a_script_that_never_imports_cycler_ends_after_two_starts(
        tmp_path: Path, worker: str, error: str, fork: str) -> None:
    job = Job(tmp_path, fork, "--restart-delay", "0.2", worker=worker)
    assert job.wait(180) == EXIT_FAILURE, job.output()[-3000:]
    assert job.event_names().count("workers_started") == 2, job.output()[-3000:]
    output = job.output()
    report = output[output.rindex("cycle: error:"):].splitlines()[0]
    assert f"the same error in the script's code ({error})" in report, report


HIDES_ITS_DATA_AT_THE_FIRST_TWO_STARTS = r'''
import os, sys
from pathlib import Path
import cycler
data = Path(sys.argv[sys.argv.index("--dir") + 1]) / "data.bin"
if int(os.environ["CYCLER_RESTART_COUNT"]) < 2:
    # A network filesystem hides the file for a moment: it is back well before the restart.
    away = data.with_suffix(".away")
    data.rename(away)
    try:
        data.read_bytes()
    finally:
        away.rename(data)
print("read", len(data.read_bytes()), "bytes", flush=True)
'''


def test_a_data_file_missing_for_a_moment_at_two_starts_in_a_row_costs_only_the_restarts(
        tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"x" * 64)
    job = Job(tmp_path, "--restart-delay", "0.2", worker=HIDES_ITS_DATA_AT_THE_FIRST_TWO_STARTS)
    assert job.wait(180) == 0, job.output()[-3000:]
    assert job.event_names().count("workers_started") == 3, job.output()[-3000:]
    assert "read 64 bytes" in (tmp_path / "stdout.txt").read_text()
    assert "the file " in job.output() and "data.bin is missing" in job.output()


NEEDS_A_FILE_THAT_NEVER_COMES = r'''
import sys
from pathlib import Path
import cycler
(Path(sys.argv[sys.argv.index("--dir") + 1]) / "never-written.bin").read_bytes()
'''


def test_a_file_that_stays_missing_is_retried_with_backoff_then_named_in_one_line(
        tmp_path: Path) -> None:
    job = Job(tmp_path, "--restart-delay", "0.2", "--max-restarts", "2",
              worker=NEEDS_A_FILE_THAT_NEVER_COMES)
    assert job.wait(180) == EXIT_FAILURE, job.output()[-3000:]
    events = job.events()
    assert [e["event"] for e in events].count("workers_started") == 3, job.output()[-3000:]
    delays = [e["delay"] for e in events if e["event"] == "restart_scheduled"]
    assert delays == [0.2, 0.4], delays
    output = job.output()
    line = output[output.rindex("cycle: error:"):].splitlines()[0]
    assert f"the file {tmp_path / 'never-written.bin'} is missing (FileNotFoundError)" in line


FAILS_AT_ITS_FIRST_START = r'''
import os, sys
from pathlib import Path
if os.environ["CYCLER_RESTART_COUNT"] == "0":
    (Path(sys.argv[sys.argv.index("--dir") + 1]) / "failing").touch()
    sys.exit(1)
print("trained", flush=True)
'''

TAKES_THE_PORT_ONCE_IT_IS_LET_GO = """
import os, socket, sys, time
port, here = int(sys.argv[1]), sys.argv[2]
while not os.path.exists(here + "/failing"):
    time.sleep(0.01)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
while True:
    try:
        s.bind(("0.0.0.0", port)); break
    except OSError:
        time.sleep(0.01)
s.listen()
open(here + "/held", "w").close()
while not os.path.exists(here + "/release"):
    time.sleep(0.05)
"""


def test_a_port_taken_between_two_starts_is_named_and_retried_until_it_is_free(
        tmp_path: Path) -> None:
    """Another program takes the store's port as soon as the first torchrun lets it go, and
    keeps it until cycle run has named it."""
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", TAKES_THE_PORT_ONCE_IT_IS_LET_GO,
                               str(port), str(tmp_path)])
    job = Job(tmp_path, "--restart-delay", "0.2", "--max-restarts", "5", "--master-addr",
              "127.0.0.1", "--master-port", str(port), worker=FAILS_AT_ITS_FIRST_START)
    try:
        wait_for(lambda: "resource_failed" in job.event_names(), "the port named", job,
                 timeout=240)
    finally:
        (tmp_path / "release").touch()
        holder.wait(30)
    assert job.wait(240) == 0, job.output()[-3000:]
    named = [e for e in job.events() if e["event"] == "resource_failed"]
    assert named[0]["resource"] == (f"port {port} is in use by another process (EADDRINUSE)")
    assert "trained" in (tmp_path / "stdout.txt").read_text()
