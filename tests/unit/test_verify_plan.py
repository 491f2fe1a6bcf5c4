"""Where cycle verify interrupts: after the first checkpoint, one stop in the first epoch and one
across an epoch boundary, reproducible from the seed."""

from __future__ import annotations

from cycler.verify.plan import KILL, STOP, ReferenceShape, plan_interruptions

# Checkpoints every 8 steps, 32 steps an epoch, 64 steps in all.
SHAPE = ReferenceShape(steps=[8, 16, 24, 32, 40, 48, 56, 64], epochs=[0, 0, 0, 0, 1, 1, 1, 1],
                       last_step=64)


def test_three_stops_land_after_the_first_checkpoint_in_order() -> None:
    for seed in range(50):
        plan = plan_interruptions(SHAPE, stops=3, kills=0, seed=seed)
        steps = [p.step for p in plan]
        assert len(plan) == 3 and all(p.kind == STOP for p in plan)
        assert steps == sorted(steps) and all(s is not None and 8 < s <= 64 for s in steps)


def test_one_stop_lands_in_the_first_epoch_and_one_across_an_epoch_boundary() -> None:
    for seed in range(50):
        plan = plan_interruptions(SHAPE, stops=3, kills=0, seed=seed)
        by_why = {p.why: p.step for p in plan}
        first, boundary = by_why["in the first epoch"], by_why["across an epoch boundary"]
        assert first is not None and 8 < first <= 32
        assert boundary is not None and 32 < boundary < 40


def test_the_same_seed_gives_the_same_plan_and_kills_are_mixed_in() -> None:
    one = plan_interruptions(SHAPE, stops=2, kills=2, seed=7)
    assert one == plan_interruptions(SHAPE, stops=2, kills=2, seed=7)
    assert sorted(p.kind for p in one) == [KILL, KILL, STOP, STOP]


def test_checkpoints_without_steps_are_interrupted_by_checkpoint_count() -> None:
    shape = ReferenceShape(steps=[None] * 5, epochs=[None] * 5, last_step=-1)
    plan = plan_interruptions(shape, stops=2, kills=0, seed=0)
    assert [p.after_checkpoints for p in plan] == [1, 3]
    assert all(p.step is None for p in plan)
