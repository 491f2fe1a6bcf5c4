"""DDP gradient buckets whose layout never changes, so that a resumed step sums as the first did.

DDP all-reduces gradients in flat buckets. A fresh ``DistributedDataParallel`` starts with one
layout and, after its first backward, rebuilds the buckets in the order gradients became ready.
A resumed process therefore all-reduces its first step in the initial layout where the
uninterrupted run, at the same step, used the rebuilt one. Ring all-reduces (gloo, NCCL) add
each element in an order set by its position in the flat bucket: with three ranks or more the
sums then differ in their last bits, and the resumed run's weights drift from the uninterrupted
run's (docs/saving.md, "DDP at three ranks or more").
"""

from __future__ import annotations

from typing import Any

from cycler.errors import CyclerError, UnsupportedTorch


def settle_ddp_buckets(model: Any) -> None:
    """Fix ``model``'s gradient buckets now, for its whole life: parameters in their order.

    ``model`` is a ``torch.nn.parallel.DistributedDataParallel``. Call it on every rank right
    after constructing the DDP model, before its first forward, on every start (fresh or
    resumed): it is a collective (rank 0's layout is broadcast), and it makes the first step of
    every process all-reduce in the layout of every later step. A model whose buckets are never
    rebuilt (``find_unused_parameters=True``) or were already rebuilt is left as it is.

    The cost: the first bucket then holds the first layers' gradients, which are ready last, and
    torch all-reduces buckets in their order, so on every step (the layout is for good) the
    all-reduces start once the backward ends instead of overlapping it; nothing for a model
    whose gradients fit one bucket (docs/saving.md has the measured figures).
    ``find_unused_parameters=True`` keeps the overlap for an extra graph traversal per step.

    Raises UnsupportedTorch where torch's DDP lacks the reducer calls this relies on, and
    CyclerError after the model's first forward (its first step would already have used, or be
    using, the layout this replaces).
    """
    reducer = getattr(model, "reducer", None)
    push = getattr(reducer, "_push_all_rebuilt_params", None)
    rebuild = getattr(reducer, "_rebuild_buckets", None)
    if push is None or rebuild is None:
        raise UnsupportedTorch(
            f"settle_ddp_buckets needs a DistributedDataParallel whose reducer has "
            f"_push_all_rebuilt_params and _rebuild_buckets (got {type(model).__name__}): "
            f"construct DDP with find_unused_parameters=True instead")
    if getattr(model, "_lazy_init_ran", False):
        raise CyclerError("settle_ddp_buckets was called after the DDP model's first forward: "
                          "call it right after constructing DistributedDataParallel, on every "
                          "rank, before the first step")
    push()  # no-op where buckets are never rebuilt
    rebuild()


def settle_fresh_ddp_buckets(model: Any) -> bool:
    """:func:`settle_ddp_buckets` for the integrations, which see whatever model the user has.

    Settles ``model`` when it is a ``DistributedDataParallel`` whose first forward has not run,
    and says so (True); leaves any other model, or a DDP that already ran a forward (whose
    layout is no longer the integration's to choose), as it is (False). A collective where it
    settles: call it on every rank at the same point.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel) or model._lazy_init_ran:
        return False
    settle_ddp_buckets(model)
    return True
