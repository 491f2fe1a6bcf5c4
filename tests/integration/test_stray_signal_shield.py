"""The stray-signal shield in DataLoader workers: a TERM that reaches a loader worker directly
(Slurm's linuxproc signals every process) does nothing, and a process whose loader iterator is
still alive at exit still ends (multiprocessing's exit TERMs its daemonic children and joins
them: the shield ignored that TERM and the process waited forever, found by the hang tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    import torch
    from torch.utils.data import DataLoader
    from cycler.protocol.stop_signals import shield_from_stray_signals

    shield_from_stray_signals()
    batches = iter(DataLoader(range(1000), batch_size=10, num_workers=1))  # alive at exit
    next(batches)
    (worker,) = batches._workers
    os.kill(worker.pid, signal.SIGTERM)  # a stray TERM straight to the loader worker
    time.sleep(0.5)
    assert worker.is_alive(), "the shield let the loader worker die"
    assert next(batches).tolist() == list(range(10, 20))
    print("worker", worker.pid, flush=True)
""")


def test_a_shielded_loader_worker_ignores_a_stray_term_and_its_process_still_exits(
        tmp_path: Path) -> None:
    script = tmp_path / "loader.py"
    script.write_text(SCRIPT)
    environment = {**os.environ, "CYCLER_STOP_SIGNALS": "SIGTERM", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=environment, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "SIGTERM reached process" in done.stderr and "ignored" in done.stderr
    # Ended quietly: torch's loader does not take the workers' end at exit for a failure.
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    pid = int(done.stdout.split()[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the loader worker {pid} outlived its process")


ANNOUNCER = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path
    from cycler.protocol.stop_signals import shield_from_stray_signals

    said = Path(os.environ["CYCLER_CONTROL_FILE"]).with_name("control.uses-handler")
    shield_from_stray_signals()
    seen = [said.exists()]
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # the script's own, after the shield
    time.sleep(0.6)
    seen.append(said.exists())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # given back
    time.sleep(0.6)
    seen.append(said.exists())
    print(seen)
""")


def test_a_workers_own_sigterm_handler_is_announced_and_withdrawn_as_the_script_sets_it(
        tmp_path: Path) -> None:
    script = tmp_path / "announcer.py"
    script.write_text(ANNOUNCER)
    environment = {**os.environ, "CYCLER_STOP_SIGNALS": "SIGTERM",
                   "CYCLER_CONTROL_FILE": str(tmp_path / "control.json")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=environment, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[False, True, False]"
