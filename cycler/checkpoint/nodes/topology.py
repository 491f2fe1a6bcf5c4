"""A rank's place among the job's nodes, and the gloo group of the nodes' leaders."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Nodes:
    """This rank's place among the job's nodes: torchrun numbers ranks node by node."""

    node: int
    count: int
    local_rank: int
    local_size: int

    @property
    def leader(self) -> bool:
        """Whether this rank commits, copies and persists for its node."""
        return self.local_rank == 0

    def leader_of(self, node: int) -> int:
        return node * self.local_size

    @property
    def partner(self) -> int:
        """The node that keeps a copy of this node's files."""
        return (self.node + 1) % self.count

    @property
    def source(self) -> int:
        """The node whose files this node keeps a copy of."""
        return (self.node - 1) % self.count


def nodes_of(environ: Mapping[str, str]) -> Nodes | None:
    """The job's nodes as torchrun describes them to a worker; ``None`` on one node."""
    try:
        world = int(environ.get("WORLD_SIZE") or 1)
        local = int(environ.get("LOCAL_WORLD_SIZE") or world)
        rank = int(environ.get("RANK") or 0)
        local_rank = int(environ.get("LOCAL_RANK") or 0)
    except ValueError:
        return None
    if local >= world or local < 1 or world % local:
        return None
    return Nodes(rank // local, world // local, local_rank, local)


def leaders_group(nodes: Nodes, timeout: datetime.timedelta) -> Any:
    """A gloo group of the nodes' leaders (every rank of the job must call this, in the same
    order as its other groups): the partner copies and the resume's fetches use it, never the
    group the training's collectives run on."""
    import torch.distributed as dist

    return dist.new_group([nodes.leader_of(n) for n in range(nodes.count)], timeout=timeout,
                          backend="gloo")
