"""MetricsTracker.reduce with 2 real gloo processes: values meet by name, whatever order the
ranks inserted them in and whichever keys a rank lacks."""

from __future__ import annotations

import torch.distributed as dist
from gloo_ranks import run_on_every_rank

from cycler.training.metrics import MetricsTracker


def check_keys_in_different_orders_and_one_missing_reduce_by_name() -> None:
    metrics = MetricsTracker()
    if dist.get_rank() == 0:
        metrics.update({"loss": 1.0, "images": 4, "only_rank_0": 7})
    else:
        metrics.update({"images": 6, "loss": 3.0})
    metrics.reduce()
    assert dict(metrics.local) == {"images": 10.0, "loss": 4.0, "only_rank_0": 7.0}
    metrics.reset_local()
    metrics.update(images=1).reduce().end_epoch()  # same keys on both ranks: the fast path
    assert metrics.epoch_reports == [{"images": 12.0, "loss": 4.0, "only_rank_0": 7.0}]


def check_an_empty_tracker_reduces_beside_a_non_empty_one() -> None:
    metrics = MetricsTracker()
    if dist.get_rank() == 1:
        metrics.update(images=5)
    metrics.reduce()
    assert dict(metrics.local) == {"images": 5.0}
    assert dict(MetricsTracker().reduce().agg) == {}  # empty on every rank


def check_counts_past_two_to_the_24_stay_exact() -> None:
    metrics = MetricsTracker().update(images=2**24 + 1).reduce()
    assert metrics.local["images"] == 2 * (2**24 + 1)


def test_metrics_reduce_by_name_across_two_gloo_ranks() -> None:
    run_on_every_rank(
        __name__,
        "check_keys_in_different_orders_and_one_missing_reduce_by_name",
        "check_an_empty_tracker_reduces_beside_a_non_empty_one",
        "check_counts_past_two_to_the_24_stay_exact",
    )
