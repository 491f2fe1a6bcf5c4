"""HangWatch: the supervisor's verdict from beacons and the time, no process and no sleep."""

from __future__ import annotations

import sysconfig
import time

import pytest

from cycler.protocol.progress import PAUSED, SAVING, TRAINING, Reading
from cycler.supervisor.watch.hangs import HangPolicy, HangWatch, top_frame

POLICY = HangPolicy(floor=10.0, factor=5.0, first_step=100.0, pause=1000.0)


def beacon(rank: int, counter: int, when: float, phase: int = TRAINING, step: int = -1,
           name: str = "", longest: float = 0.0) -> Reading:
    return Reading(rank, 1000 + rank, counter, step if step >= 0 else counter, when, phase, name,
                   longest)


def trained(watch: HangWatch, steps: int, interval: float, ranks: int = 2) -> float:
    """Feed ``steps`` steps of ``interval`` seconds (as the workers timed them), read after
    every step; the last time."""
    now = 0.0
    for counter in range(1, steps + 1):
        now = counter * interval
        readings = [beacon(r, counter, now, longest=interval if counter > 1 else 0.0)
                    for r in range(ranks)]
        assert watch.observe(readings, now) is None
    return now


def test_the_step_timeout_is_the_floor_or_factor_times_the_longest_step() -> None:
    fast, slow = HangWatch(POLICY), HangWatch(POLICY)
    trained(fast, 20, 0.1)
    trained(slow, 20, 4.0)
    assert fast.step_timeout() == pytest.approx(10.0)
    assert slow.step_timeout() == pytest.approx(20.0)


def test_the_longest_interval_any_worker_timed_is_kept_across_readings() -> None:
    watch = HangWatch(POLICY, longest=1.0)
    watch.observe([beacon(0, 5, 5.0, longest=0.4), beacon(1, 5, 5.0, longest=3.0)], 5.0)
    watch.observe([beacon(0, 6, 6.0, longest=0.4), beacon(1, 6, 6.0, longest=0.4)], 6.0)
    assert watch.longest == pytest.approx(3.0)


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


def test_steps_faster_than_the_readings_are_timed_by_the_worker_itself(tmp_path) -> None:
    """CI's failure: 25 steps of 20 ms between two readings, then a hang. A supervisor that
    learned intervals from pairs of its own readings had none: it allowed the first step's
    600 s. The worker times its own steps; one reading is enough."""
    from cycler.protocol.progress import Beacon, read_beacons

    worker = Beacon(tmp_path / "rank-0.beacon")
    time.sleep(0.2)  # loading before the first step: not a step interval
    for _ in range(25):
        time.sleep(0.02)
        worker.progress()
    watch = HangWatch(POLICY)
    watch.restarted(time.monotonic() - 1.0)
    (reading,) = read_beacons(tmp_path)
    assert watch.observe([reading], reading.time + 1.0) is None
    assert 0.02 <= watch.longest < 0.2
    hang = watch.observe([reading], reading.time + POLICY.floor + 1.0)
    assert hang is not None and hang.why == "step timeout"


def test_the_worker_leaves_its_saves_and_marked_phases_out_of_the_step_interval(
        tmp_path) -> None:
    from cycler.protocol.progress import Beacon, read_beacons

    worker = Beacon(tmp_path / "rank-0.beacon")
    for _ in range(3):
        time.sleep(0.01)
        worker.progress()
    with worker.phase(SAVING):
        time.sleep(0.3)
        worker.progress()  # the commit
    time.sleep(0.01)
    worker.progress()
    with worker.phase(PAUSED, "eval"):
        time.sleep(0.3)
    worker.progress()
    (reading,) = read_beacons(tmp_path)
    assert 0.01 <= reading.longest < 0.2


def test_a_script_that_only_commits_is_timed_between_its_saves(tmp_path) -> None:
    from cycler.protocol.progress import Beacon, read_beacons

    worker = Beacon(tmp_path / "rank-0.beacon")
    for training in (0.5, 0.05, 0.15):
        time.sleep(training)  # the first stretch is loading: not learned
        with worker.phase(SAVING):
            time.sleep(0.2)
            worker.progress()
    (reading,) = read_beacons(tmp_path)
    assert 0.15 <= reading.longest < 0.35


def committer(rank: int, commits: int, when: float, longest: float = 0.0) -> Reading:
    """The beacon of a script that only commits: no step counted (-1)."""
    return Reading(rank, 1000 + rank, commits, -1, when, TRAINING, "", longest)


def test_a_script_that_only_commits_is_not_judged_before_it_learned_its_commit_interval():
    watch = HangWatch(POLICY)
    watch.restarted(0.0)
    assert watch.observe([committer(0, 0, 0.0)], 1e6) is None
    assert watch.observe([committer(0, 1, 500.0)], 1e6) is None


def test_a_script_that_only_commits_is_judged_by_its_longest_commit_interval():
    watch = HangWatch(POLICY)
    watch.restarted(0.0)
    readings = [committer(0, 2, 100.0, longest=40.0)]
    assert watch.observe(readings, 100.0 + 199.0) is None  # 5 x 40 s
    hang = watch.observe(readings, 100.0 + 201.0)
    assert hang is not None and hang.why == "step timeout" and hang.step is None


def test_an_interval_learned_at_an_earlier_start_judges_a_script_that_only_commits():
    watch = HangWatch(POLICY, longest=40.0)
    watch.restarted(0.0)
    waiting = [committer(0, 0, 0.0)]
    assert watch.observe(waiting, 199.0) is None  # not the first-step allowance (100 s) alone
    hang = watch.observe(waiting, 201.0)
    assert hang is not None and hang.why == "first-step allowance"


def test_a_worker_that_announced_its_step_cadence_is_watched_before_its_first_step():
    watch = HangWatch(POLICY)
    watch.restarted(0.0)
    waiting = [committer(0, 0, 0.0)]
    assert watch.observe(waiting, 101.0) is None
    hang = watch.observe(waiting, 101.0, cadence=True)
    assert hang is not None and hang.why == "first-step allowance"


def test_each_hang_at_the_same_step_after_the_first_doubles_the_allowance_there():
    watch = HangWatch(POLICY)
    allowances = []
    for start in range(4):
        begin = start * 1000.0
        watch.restarted(begin)
        readings = [beacon(0, 17, begin + 1.0, step=17, longest=0.1)]
        hang = next(h for t in range(1, 200) if (h := watch.observe(readings, begin + t)))
        allowances.append((hang.allowance, hang.step, hang.times))
    assert allowances == [(10.0, 17, 1), (10.0, 17, 2), (20.0, 17, 3), (40.0, 17, 4)]
    assert watch.widened(18) == 1.0


def test_workers_count_as_done_training_only_while_every_loop_ran_to_its_end(tmp_path) -> None:
    from cycler.protocol.node_local import NodeFiles
    from cycler.protocol.progress import AFTER_A_STOP, AFTER_THE_LOOP, Beacon
    from cycler.protocol.record import RunRecord
    from cycler.supervisor.watch.hangs import WorkerProgress

    node = NodeFiles.in_directory(tmp_path / "node", 0)
    node.progress_dir.mkdir(parents=True)
    progress = WorkerProgress(RunRecord(tmp_path / "ck"), 0, node, None,
                              lambda *_, **__: None)
    assert not progress.training_ended(), "no beacon: nothing is known"
    ranks = [Beacon(node.progress_dir / f"rank-{rank}.beacon") for rank in range(2)]
    ranks[0].mark(PAUSED, AFTER_THE_LOOP)
    assert not progress.training_ended(), "rank 1 still trains"
    ranks[1].mark(PAUSED, AFTER_A_STOP)
    assert not progress.training_ended(), "rank 1's loop was ended by a stop"
    ranks[1].mark(PAUSED, AFTER_THE_LOOP)
    assert progress.training_ended()
    ranks[0].loop_begins()  # a second StepControl: another loop trains
    assert not progress.training_ended()


def test_beacons_of_a_directory_removed_while_it_is_scanned_are_none(
        tmp_path, monkeypatch) -> None:
    # cycle verify's watcher read the progress directory while a new start of the run removed
    # and made it again: pathlib's scan raised FileNotFoundError and verify ended in a traceback.
    from cycler.protocol import progress

    def vanished(self, pattern):
        raise FileNotFoundError(2, "No such file or directory", str(self))

    monkeypatch.setattr(progress.Path, "glob", vanished)
    assert progress.read_beacons(tmp_path) == []
    assert progress.read_beacons(tmp_path / "never-made") == []
