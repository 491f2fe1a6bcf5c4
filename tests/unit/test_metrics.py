from __future__ import annotations

import io
from collections import defaultdict

import pytest
import torch

from cycler.errors import StateMismatch
from cycler.training.metrics import MetricsTracker, TimestampedTimer


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_update_accepts_a_dict_keywords_and_one_element_tensors() -> None:
    metrics = MetricsTracker()
    metrics.update({"loss": 0.5, "images": 4}).update(loss=torch.tensor(0.25), images=4)
    assert dict(metrics.local) == {"loss": 0.75, "images": 8.0}


def test_a_name_given_both_in_the_dict_and_as_a_keyword_adds_both_values() -> None:
    assert MetricsTracker().update({"images": 2}, images=3).local["images"] == 5.0


def test_reduce_without_a_process_group_keeps_the_local_sums_and_adds_them_to_agg() -> None:
    metrics = MetricsTracker().update(loss=1.0, images=2)
    metrics.reduce()
    assert dict(metrics.local) == {"loss": 1.0, "images": 2.0}
    assert dict(metrics.agg) == {"loss": 1.0, "images": 2.0}


def test_reducing_twice_without_reset_never_counts_a_value_twice() -> None:
    metrics = MetricsTracker().update(images=2).reduce()
    metrics.update(images=3).reduce()
    assert metrics.local["images"] == 5.0
    assert metrics.agg["images"] == 5.0


def test_reset_local_then_end_epoch_records_the_epoch_and_starts_clean() -> None:
    metrics = MetricsTracker()
    metrics.update(images=2).reduce().reset_local()
    metrics.update(images=3).reduce().reset_local()
    metrics.end_epoch()
    metrics.update(images=7).reduce().end_epoch()
    assert metrics.epoch_reports == [{"images": 5.0}, {"images": 7.0}]
    assert dict(metrics.agg) == {}
    assert dict(metrics.local) == {}


def test_an_empty_tracker_reduces_and_ends_an_epoch_without_error() -> None:
    metrics = MetricsTracker().reduce().end_epoch()
    assert metrics.epoch_reports == [{}]


def test_state_round_trips_through_torch_load_with_weights_only() -> None:
    metrics = MetricsTracker().update(images=3, loss=1.5).reduce().end_epoch()
    metrics.update(images=1).reduce().update(images=100)  # unreduced: not saved
    buffer = io.BytesIO()
    torch.save(metrics.state_dict(), buffer)
    buffer.seek(0)
    restored = MetricsTracker().load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.epoch_reports == [{"images": 3.0, "loss": 1.5}]
    assert dict(restored.agg) == {"images": 1.0}
    assert dict(restored.local) == {}
    restored.update(images=2).reduce().end_epoch()
    assert restored.epoch_reports[-1] == {"images": 3.0}


def test_a_cycling_utils_state_dict_loads() -> None:
    legacy = {"epoch_reports": [{"loss": 2.0}], "agg": defaultdict(float, {"loss": 1.0})}
    restored = MetricsTracker().load_state_dict(legacy)
    assert restored.epoch_reports == [{"loss": 2.0}]
    assert dict(restored.agg) == {"loss": 1.0}


@pytest.mark.parametrize(
    "state", [{}, {"version": 7, "agg": {}, "epoch_reports": []}, {"version": 1, "agg": {}}]
)
def test_loading_a_state_that_is_not_a_metrics_state_raises_state_mismatch(
    state: dict[str, object],
) -> None:
    with pytest.raises(StateMismatch):
        MetricsTracker().load_state_dict(state)


def _timer_lines(rank: int) -> tuple[list[str], list[float | None]]:
    clock, out = FakeClock(100.0), io.StringIO()
    timer = TimestampedTimer(clock=clock, wall_clock=FakeClock(0.0), rank=rank, stream=out)
    clock.now = 102.5
    first = timer.report("loading data", ret=True)
    clock.now = 103.0
    second = timer.report("one step")
    return out.getvalue().splitlines(), [first, second]


def test_timer_reports_time_since_the_last_report_and_the_running_total() -> None:
    lines, returned = _timer_lines(rank=0)
    assert returned == [2.5, None]
    assert "Start" in lines[0] and "0.000 ms" in lines[0]
    assert "loading data" in lines[1] and "2,500.000 ms" in lines[1] and "2.50 s total" in lines[1]
    assert "one step" in lines[2] and "500.000 ms" in lines[2] and "3.00 s total" in lines[2]


def test_timer_prints_nothing_on_ranks_other_than_zero_but_still_measures() -> None:
    lines, returned = _timer_lines(rank=1)
    assert lines == []
    assert returned[0] == 2.5


def test_timer_start_time_is_a_wall_clock_timestamp_measured_on_the_monotonic_clock() -> None:
    clock, wall = FakeClock(50.0), FakeClock(1_000.0)
    timer = TimestampedTimer(
        "Start", start_time=990.0, clock=clock, wall_clock=wall, rank=0, stream=io.StringIO()
    )
    wall.now = 0.0  # a wall-clock jump backwards must not change the measured duration
    clock.now = 51.0
    assert timer.report("step", ret=True) == 11.0
