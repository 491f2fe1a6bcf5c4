"""The benchmarks' own checks of the runs they time (benchmarks/_checks.py) and the smoke
runner's table: a benchmark never reports a figure from a run that did not do its work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _checks  # noqa: E402

from benchmarks.__main__ import NEGATIVE, SMOKE, scripts  # noqa: E402


def write_events(root: Path, *records: dict[str, object]) -> None:
    (root / ".cycler").mkdir(parents=True, exist_ok=True)
    (root / ".cycler" / "events-node0.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in records))


def test_an_earlier_runs_first_step_is_never_read_as_this_runs(tmp_path: Path) -> None:
    write_events(tmp_path, {"time": 100.0, "event": "first_step", "at": 101.0})
    with pytest.raises(_checks.BadRun) as raised:
        _checks.first_step_since(tmp_path, started=200.0, run="fresh_carried")
    assert raised.value.code == _checks.EXIT_BAD_RUN
    assert "fresh_carried" in str(raised.value) and "no step of its own" in str(raised.value)


def test_this_runs_first_step_is_found_among_older_ones(tmp_path: Path) -> None:
    write_events(tmp_path, {"time": 100.0, "event": "first_step", "at": 101.0},
                 {"time": 205.0, "event": "first_step", "at": 204.5})
    assert _checks.first_step_since(tmp_path, 200.0, "warm")["at"] == 204.5


def test_a_negative_duration_or_a_ratio_to_nothing_fails_the_run() -> None:
    with pytest.raises(_checks.BadRun, match="ended before it began"):
        _checks.duration(10.0, 9.1, "warm")
    with pytest.raises(_checks.BadRun, match="baseline"):
        _checks.ratio(3.0, 0.0, "fresh")
    assert _checks.duration(1.0, 3.5, "warm") == 2.5


def test_an_unexpected_exit_code_fails_the_run() -> None:
    done = subprocess.CompletedProcess(["cycle"], returncode=1)
    with pytest.raises(_checks.BadRun, match="exited 1, expected 75"):
        _checks.exited(done, "prepare", expected=(75,))


def test_every_benchmark_has_a_smoke_size() -> None:
    assert scripts() and set(scripts()) == set(SMOKE)


@pytest.mark.parametrize("line,negative", [
    ('"warm_first_step_s": -0.9,', True), ('"fresh_carried_over_warm": -4.2', True),
    ("stop: -1.5 s", True), ('"warm_first_step_s": 7.05,', False), ("steps 1-3 s", False),
    ('"ratio": 1.14', False)])
def test_the_smoke_runner_spots_a_negative_figure(line: str, negative: bool) -> None:
    assert (NEGATIVE.search(line) is not None) is negative


def test_an_interruption_faster_than_the_uninterrupted_runs_is_noise_never_a_negative_cost(
) -> None:
    import bench_goodput

    status = {"useful": 10.0, "interruptions": [], "parts": {}, "goodput": 0.5, "wall": 12.0,
              "redone": 0.0}
    base = {"mode": "none", "variant": "", "wall": 13.5, "interruptions": 0, "status": status}
    faster = {**base, "mode": "stop", "wall": 11.8, "interruptions": 1}
    slower = {**base, "mode": "kill", "wall": 21.1, "interruptions": 1}
    noise = bench_goodput.summarise(faster, [base])
    assert noise["cost"] is None and noise["at_5_min"] is None and noise["cost_within_noise"]
    real = bench_goodput.summarise(slower, [base])
    assert real["cost"] == 7.6 and not real["cost_within_noise"]
