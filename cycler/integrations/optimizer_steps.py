"""Where a training loop may stop: after an optimizer step, with no gradient left pending.

A checkpoint holds the weights and the optimizers' states, never the gradients. A stop between
two micro-batches of an accumulated step (``accumulate_grad_batches``,
``gradient_accumulation_steps``, a manual loop that steps every few batches) drops the
gradients accumulated so far; the resumed run then steps with part of a gradient, and its
weights differ from an uninterrupted run's. :class:`OptimizerSteps` watches the optimizers
themselves with torch's own hooks (``register_step_post_hook`` on each optimizer,
``register_post_accumulate_grad_hook`` on each of its parameters), so it needs no knowledge of
the loop: automatic or manual optimization, one optimizer or several, clipping or not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class OptimizerSteps:
    """Tells whether the loop is at an optimizer-step boundary: an optimizer stepped since the
    last boundary, and no optimizer holds a gradient accumulated since its own last step.

    Every rank sees the same boundaries when every rank steps and accumulates alike (DDP).
    :meth:`close` removes the hooks.
    """

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        self._stepped = False
        self._pending: dict[int, bool] = {}
        self._handles: list[Any] = []
        for index, optimizer in enumerate(optimizers):
            self._pending[index] = False
            self._handles.append(optimizer.register_step_post_hook(self._on_step(index)))
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    if parameter.requires_grad:
                        self._handles.append(parameter.register_post_accumulate_grad_hook(
                            self._on_gradient(index)))

    def _on_step(self, index: int) -> Any:
        def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
            self._pending[index] = False
            self._stepped = True
        return stepped

    def _on_gradient(self, index: int) -> Any:
        def accumulated(parameter: torch.Tensor) -> None:
            self._pending[index] = True
        return accumulated

    def at_boundary(self) -> bool:
        """Whether the loop may stop here; a True answer starts the next interval."""
        if not self._stepped or any(self._pending.values()):
            return False
        self._stepped = False
        return True

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
