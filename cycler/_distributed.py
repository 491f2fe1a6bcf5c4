"""Whether this process is in a torch.distributed process group: the one test every part asks."""

from __future__ import annotations


def in_process_group() -> bool:
    """Whether ``torch.distributed`` is available and its default group initialized."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
