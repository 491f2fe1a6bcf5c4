from __future__ import annotations

import io

import pytest
import torch

from cycler.errors import ConfigError, CyclerError, StateMismatch
from cycler.training.epochs import EpochLoop


def _saved(loop: EpochLoop) -> dict[str, object]:
    buffer = io.BytesIO()
    torch.save(loop.state_dict(), buffer)
    buffer.seek(0)
    loaded: dict[str, object] = torch.load(buffer, weights_only=True)
    return loaded


def test_a_fresh_loop_yields_every_epoch_in_order() -> None:
    assert list(EpochLoop().remaining_epochs_until(4)) == [0, 1, 2, 3]


def test_an_epoch_stopped_mid_body_is_run_again_after_resume() -> None:
    loop = EpochLoop()
    for epoch in loop.remaining_epochs_until(5):
        if epoch == 2:
            state = _saved(loop)
            break
    resumed = EpochLoop()
    resumed.load_state_dict(state)
    assert list(resumed.remaining_epochs_until(5)) == [2, 3, 4]


def test_an_epoch_finished_before_a_stop_is_never_repeated() -> None:
    loop = EpochLoop()
    ran: list[int] = []
    for epoch in loop.remaining_epochs_until(5):
        ran.append(epoch)
        if epoch == 1:
            break  # stop arrives between epochs: epoch 1's body did not complete
    state_after_epoch_0 = _saved(loop)
    resumed = EpochLoop()
    resumed.load_state_dict(state_after_epoch_0)
    for epoch in resumed.remaining_epochs_until(5):
        ran.append(epoch)
    assert ran == [0, 1, 1, 2, 3, 4]
    assert ran.count(0) == 1


def test_finish_epoch_lets_an_end_of_epoch_checkpoint_skip_that_epoch_on_resume() -> None:
    loop = EpochLoop()
    for epoch in loop.remaining_epochs_until(3):
        loop.finish_epoch()
        if epoch == 1:
            state = _saved(loop)
            break
    resumed = EpochLoop()
    resumed.load_state_dict(state)
    assert list(resumed.remaining_epochs_until(3)) == [2]


def test_an_exception_in_the_body_does_not_mark_the_epoch_finished() -> None:
    loop = EpochLoop()
    with pytest.raises(RuntimeError):
        for epoch in loop.remaining_epochs_until(3):
            if epoch == 1:
                raise RuntimeError("preempted")
    assert loop.finished_epochs() == 1
    assert loop.current_epoch() is None


def test_current_epoch_is_the_running_epoch_and_none_outside_the_loop() -> None:
    loop = EpochLoop()
    seen = [
        (epoch, loop.current_epoch(), loop.finished_epochs())
        for epoch in loop.remaining_epochs_until(2)
    ]
    assert seen == [(0, 0, 0), (1, 1, 1)]
    assert loop.current_epoch() is None
    assert loop.finished_epochs() == 2


def test_raising_the_target_continues_after_the_last_finished_epoch() -> None:
    loop = EpochLoop()
    list(loop.remaining_epochs_until(2))
    assert list(loop.remaining_epochs_until(2)) == []
    assert list(loop.remaining_epochs_until(4)) == [2, 3]


def test_nesting_two_loops_on_one_object_is_refused() -> None:
    loop = EpochLoop()
    for _ in loop.remaining_epochs_until(2):
        with pytest.raises(CyclerError, match="nested"):
            loop.remaining_epochs_until(2)
        break


def test_finish_epoch_outside_the_loop_is_refused() -> None:
    with pytest.raises(CyclerError, match="outside"):
        EpochLoop().finish_epoch()


def test_a_negative_epoch_count_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="epochs"):
        EpochLoop().remaining_epochs_until(-1)


@pytest.mark.parametrize(
    "state",
    [
        {"finished_epochs": 3},
        {"version": 99, "finished_epochs": 3},
        {"version": 1},
        {"version": 1, "finished_epochs": -1},
        {"version": 1, "finished_epochs": "3"},
    ],
)
def test_loading_a_state_that_is_not_an_epoch_loop_state_raises_state_mismatch(
    state: dict[str, object],
) -> None:
    loop = EpochLoop()
    with pytest.raises(StateMismatch):
        loop.load_state_dict(state)
    assert loop.finished_epochs() == 0


def test_module_functions_drive_the_default_loop() -> None:
    from cycler.training import epochs

    loop = epochs.default_epoch_loop()
    before = loop.finished_epochs()
    for epoch in epochs.remaining_epochs_until(before + 1):
        assert epoch == before
        assert epochs.current_epoch() == before
    assert epochs.finished_epochs() == before + 1
    assert epochs.current_epoch() is None
