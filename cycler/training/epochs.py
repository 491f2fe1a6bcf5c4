"""An epoch loop that resumes where it stopped, like AdaptDL's ``remaining_epochs_until``.

The loop's state is one small dict that travels inside the user's checkpoint, next to the model
and the sampler: there is no hidden file. An epoch counts as finished only when its body ran to
the end, so an epoch that was cut short by a stop is run again (the sampler resumes it mid-way),
and an epoch that finished before a stop is never run again.

>>> loop = EpochLoop()
>>> if checkpoint is not None:
...     loop.load_state_dict(checkpoint["epochs"])
>>> for epoch in loop.remaining_epochs_until(10):
...     train_one_epoch(epoch)
...     loop.finish_epoch()  # optional: lets an end-of-epoch checkpoint record this epoch as done
...     save({"epochs": loop.state_dict(), ...})
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from cycler.errors import ConfigError, CyclerError, StateMismatch

EPOCH_STATE_VERSION = 1


class EpochLoop:
    """Counts finished epochs, hands out the ones not yet finished, and saves that count.

    Epochs are numbered from 0 and run in order, so the state is just how many have finished.
    """

    def __init__(self) -> None:
        self._finished = 0
        self._current: int | None = None

    def remaining_epochs_until(self, epochs: int) -> Iterator[int]:
        """Yield the epoch numbers from the first unfinished one up to ``epochs - 1``.

        An epoch is marked finished when the loop asks for the next one (the body completed), or
        earlier by :meth:`finish_epoch`. Leaving the loop by ``break``, an exception or a stop
        does not mark the running epoch finished. Only one loop may run at a time.
        """
        if epochs < 0:
            raise ConfigError(f"epochs must be an int >= 0, got {epochs!r}")
        if self._current is not None:
            raise CyclerError(
                f"epoch {self._current} is still running: remaining_epochs_until cannot be nested"
            )
        return self._run(epochs)

    def _run(self, epochs: int) -> Iterator[int]:
        try:
            while self._finished < epochs:
                self._current = self._finished
                yield self._current
                self._finished = max(self._finished, self._current + 1)
        finally:
            self._current = None

    def finish_epoch(self) -> None:
        """Mark the running epoch finished now, so a checkpoint taken after it records it as done.

        Call it after the last step of the epoch and before saving. Calling it twice is harmless.
        """
        if self._current is None:
            raise CyclerError("finish_epoch() was called outside remaining_epochs_until()")
        self._finished = self._current + 1

    def current_epoch(self) -> int | None:
        """The epoch whose body is running, or ``None`` outside the loop."""
        return self._current

    def finished_epochs(self) -> int:
        """How many epochs have finished, which is also the number of the next epoch to start."""
        return self._finished

    def state_dict(self) -> dict[str, Any]:
        """The resumable state: plain ints, loadable with ``torch.load(weights_only=True)``."""
        return {"version": EPOCH_STATE_VERSION, "finished_epochs": self._finished}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; raises :class:`StateMismatch` if it is not one."""
        if self._current is not None:
            raise CyclerError("load_state_dict() cannot be called while an epoch is running")
        version = state.get("version")
        if version != EPOCH_STATE_VERSION:
            raise StateMismatch(
                f"Epoch loop state has version {version!r}, but this cycler reads version "
                f"{EPOCH_STATE_VERSION}: save it again with this version of cycler."
            )
        finished = state.get("finished_epochs")
        if not isinstance(finished, int) or isinstance(finished, bool) or finished < 0:
            raise StateMismatch(
                f"Epoch loop state has finished_epochs={finished!r}; it must be an int >= 0."
            )
        self._finished = finished


_default_loop = EpochLoop()


def default_epoch_loop() -> EpochLoop:
    """The loop behind the module-level functions; save its ``state_dict()`` in the checkpoint."""
    return _default_loop


def remaining_epochs_until(epochs: int) -> Iterator[int]:
    """:meth:`EpochLoop.remaining_epochs_until` on :func:`default_epoch_loop`."""
    return _default_loop.remaining_epochs_until(epochs)


def current_epoch() -> int | None:
    """:meth:`EpochLoop.current_epoch` on :func:`default_epoch_loop`."""
    return _default_loop.current_epoch()


def finished_epochs() -> int:
    """:meth:`EpochLoop.finished_epochs` on :func:`default_epoch_loop`."""
    return _default_loop.finished_epochs()
