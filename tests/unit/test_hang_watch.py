"""HangWatch: the supervisor's verdict from beacons and the time, no process and no sleep."""

from __future__ import annotations

import sysconfig

import pytest

from cycler.protocol.progress import PAUSED, SAVING, TRAINING, Reading
from cycler.supervisor.hangs import HangPolicy, HangWatch, top_frame

POLICY = HangPolicy(floor=10.0, factor=5.0, first_step=100.0, pause=1000.0)


def beacon(rank: int, counter: int, when: float, phase: int = TRAINING, step: int = -1,
           name: str = "") -> Reading:
    return Reading(rank, 1000 + rank, counter, step if step >= 0 else counter, when, phase, name)


def trained(watch: HangWatch, steps: int, interval: float, ranks: int = 2) -> float:
    """Feed ``steps`` steps of ``interval`` seconds, read after every step; the last time."""
    now = 0.0
    for counter in range(1, steps + 1):
        now = counter * interval
        assert watch.observe([beacon(r, counter, now) for r in range(ranks)], now) is None
    return now


def test_the_step_timeout_is_the_floor_or_factor_times_the_longest_step() -> None:
    fast, slow = HangWatch(POLICY), HangWatch(POLICY)
    trained(fast, 20, 0.1)
    trained(slow, 20, 4.0)
    assert fast.step_timeout() == pytest.approx(10.0)
    assert slow.step_timeout() == pytest.approx(20.0)


def test_steps_faster_than_the_readings_are_learned_from_the_mean_interval() -> None:
    watch = HangWatch(POLICY)
    for read in range(1, 10):  # 5 steps of 0.4 s between two readings
        now = read * 2.0
        watch.observe([beacon(0, read * 5, now)], now)
    assert watch.longest == pytest.approx(0.4)


def test_no_progress_past_the_timeout_is_a_hang_naming_the_ranks_behind() -> None:
    watch = HangWatch(POLICY)
    last = trained(watch, 20, 0.5)
    readings = [beacon(0, 21, last + 0.5), beacon(1, 20, last)]
    assert watch.observe(readings, last + 10.0) is None
    hang = watch.observe(readings, last + 11.0)
    assert hang is not None and [r.rank for r in hang.stalled] == [1]
    assert hang.why == "step timeout" and hang.allowance == pytest.approx(10.0)


def test_ranks_stopped_at_the_same_step_are_all_named() -> None:
    watch = HangWatch(POLICY)
    last = trained(watch, 20, 0.5)
    hang = watch.observe([beacon(0, 20, last), beacon(1, 20, last)], last + 30.0)
    assert hang is not None and [r.rank for r in hang.stalled] == [0, 1]


@pytest.mark.parametrize(("phase", "name", "why"), [(SAVING, "", "saving allowance"),
                                                    (PAUSED, "eval", "eval allowance")])
def test_a_save_or_a_marked_phase_has_the_pause_allowance(phase: int, name: str,
                                                          why: str) -> None:
    watch = HangWatch(POLICY)
    last = trained(watch, 20, 0.5)
    busy = [beacon(0, 21, last + 0.5, phase, name=name), beacon(1, 21, last + 0.5)]
    assert watch.observe(busy, last + 900.0) is None
    hang = watch.observe(busy, last + 1001.0)
    assert hang is not None and hang.why == why


def test_a_save_between_two_readings_does_not_inflate_the_learned_step() -> None:
    watch = HangWatch(POLICY)
    last = trained(watch, 10, 0.5)
    watch.observe([beacon(0, 11, last + 0.5, SAVING)], last + 0.5)
    watch.observe([beacon(0, 12, last + 60.5)], last + 60.5)
    assert watch.longest == pytest.approx(0.5)


def test_the_first_step_after_a_start_has_its_own_allowance() -> None:
    watch = HangWatch(POLICY, longest=0.1)
    watch.restarted(1000.0)
    waiting = [beacon(0, 0, 1000.5), beacon(1, 0, 1000.5)]
    assert watch.observe(waiting, 1099.0) is None
    hang = watch.observe(waiting, 1101.0)
    assert hang is not None and hang.why == "first-step allowance"


def test_workers_that_publish_nothing_are_never_declared_hung() -> None:
    watch = HangWatch(POLICY)
    watch.restarted(0.0)
    assert watch.observe([], 1e9) is None


def test_the_top_frame_is_the_innermost_frame_of_the_dumped_main_thread() -> None:
    dump = ('Thread 0x1 (most recent call first):\n'
            '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
            'Current thread 0x2 (most recent call first):\n'
            '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", '
            'line 3252 in all_reduce\n'
            '  File "/home/me/train.py", line 58 in <module>\n')
    assert top_frame(dump) == "distributed_c10d.py:3252 in all_reduce <- train.py:58 in <module>"
    assert top_frame("garbage") == "?"


def test_the_top_frame_names_the_scripts_line_under_the_standard_library_once() -> None:
    stdlib = sysconfig.get_paths()["stdlib"]
    waiting = ('Current thread 0x2 (most recent call first):\n'
               f'  File "{stdlib}/selectors.py", line 415 in select\n'
               f'  File "{stdlib}/multiprocessing/connection.py", line 947 in wait\n'
               '  File "/home/me/model/data.py", line 12 in batches\n'
               '  File "/home/me/train.py", line 80 in <module>\n')
    assert top_frame(waiting) == "selectors.py:415 in select <- data.py:12 in batches"
    asleep = ('Current thread 0x2 (most recent call first):\n'
              '  File "/home/me/train.py", line 60 in <module>\n')
    assert top_frame(asleep) == "train.py:60 in <module>"


def test_a_process_the_worker_spawns_never_takes_over_its_beacon(tmp_path) -> None:
    import os
    import subprocess
    import sys

    from cycler.protocol.progress import read_beacons

    env = {**os.environ, "CYCLER_PROGRESS_DIR": str(tmp_path), "RANK": "3"}
    worker = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from cycler.protocol.progress import beacon; "
         "beacon().progress(7); print('up', flush=True); time.sleep(30)"],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "up"
        subprocess.run([sys.executable, "-c", "from cycler.protocol.progress import beacon; "
                        "beacon().progress(1)"], env=env, check=True)  # e.g. a spawned loader
        [reading] = read_beacons(tmp_path)
        assert (reading.pid, reading.step) == (worker.pid, 7)
    finally:
        worker.kill()
        worker.wait()
