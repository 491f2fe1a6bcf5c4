"""Bytes between the nodes' leaders over their gloo group: every message posted at once, files
mapped rather than read, and always in step (a file that cannot be read is sent as zeros, which
the receiver's checksums refuse)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from cycler import _fs

log = logging.getLogger(__name__)

CHUNK = 16 << 20
"""Bytes per message of a copy between nodes."""


def swap_bytes(group: Any, data: bytes, to: int, source: int) -> bytes:
    """Send ``data`` to rank ``to`` while receiving the bytes rank ``source`` sends."""
    import torch

    length = torch.tensor([len(data)], dtype=torch.int64)
    theirs = torch.zeros(1, dtype=torch.int64)
    together(group, [(length, to)], [(theirs, source)])
    incoming = torch.empty(int(theirs.item()), dtype=torch.uint8)
    outgoing = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
    together(group, [] if outgoing is None else [(outgoing, to)],
              [] if not len(incoming) else [(incoming, source)])
    return incoming.numpy().tobytes()


def together(group: Any, sends: list[tuple[Any, int]], receives: list[tuple[Any, int]]) -> None:
    import torch.distributed as dist

    works = [dist.isend(tensor, peer, group=group) for tensor, peer in sends]
    works += [dist.irecv(tensor, peer, group=group) for tensor, peer in receives]
    for work in works:
        if work is not None:  # None: this rank is not in the group (never the case here)
            work.wait()


def pieces(tensor: Any) -> list[Any]:
    """A file's tensor in messages of at most :data:`CHUNK` bytes (views: nothing is copied);
    none for an empty file."""
    return [tensor[offset:offset + CHUNK] for offset in range(0, tensor.numel(), CHUNK)]


def swap_files(group: Any, outgoing: list[tuple[Path, int]], to: int,
                incoming: list[tuple[Path | None, int]], source: int) -> str | None:
    """Send ``outgoing`` (path, size) to ``to`` while receiving ``incoming`` from ``source``;
    an incoming path ``None`` is received and dropped. Every message is posted at once and the
    files are mapped, not read: the bytes go from one node's page cache to the other's.
    Returns the first file that could not be written (the rest is still received)."""
    sends = [(piece, to) for path, size in outgoing for piece in pieces(mapped(path, size))]
    receiving = [(path, *writable(path, size)) for path, size in incoming]
    receives = [(piece, source) for _, tensor, _ in receiving for piece in pieces(tensor)]
    together(group, sends, receives)
    return next((problem for _, _, problem in receiving if problem), None)


def mapped(path: Path, size: int) -> Any:
    """A file's bytes as a tensor mapped from it; zeros where it cannot be read (the receiver's
    checksums refuse them, and the exchange stays in step)."""
    import torch

    try:
        if path.stat().st_size != size:
            raise OSError(f"{size} bytes expected")
        return torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
    except (OSError, RuntimeError) as error:
        log.warning("%s could not be read for a copy to another node (%s)", path, error)
        return torch.zeros(size, dtype=torch.uint8)


def writable(path: Path | None, size: int) -> tuple[Any, str | None]:
    """A tensor mapped onto a new file of ``size`` bytes at ``path``, which receiving into
    writes (its blocks allocated first: a full tmpfs refuses them here instead of killing the
    process with SIGBUS at a write into the mapping); a tensor of plain memory for ``None``, or
    with what failed where the file cannot be made."""
    import torch

    if path is None:
        return torch.empty(size, dtype=torch.uint8), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as made:
            if size:
                os.posix_fallocate(made.fileno(), 0, size)
        return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8), None
    except (OSError, RuntimeError) as error:
        _fs.remove_logged(_fs.remove_leftover, path, "file that could not be made")
        problem = f"{path.name} could not be made ({getattr(error, 'strerror', None) or error})"
        return torch.empty(size, dtype=torch.uint8), problem
