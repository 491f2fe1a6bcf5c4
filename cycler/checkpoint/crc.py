"""CRC-32 of large files on several cores: zlib's CRC of each part, joined with crc32_combine.

zlib computes CRC-32 at about 2.5 GB/s on one core here, and resuming a 1 GB checkpoint with
verification took 1.68x an unverified resume. zlib has ``crc32_combine`` in C but Python's
module does not expose it, so it is written out below (zlib's own GF(2) matrix method, O(log n)
in the length): each part of a file is checksummed in its own thread (zlib releases the GIL on
large buffers) and the parts are joined. The result is exactly ``zlib.crc32`` of the whole file,
so manifests keep their format.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_CHUNK = 16 << 20
PART = 128 << 20
"""Files larger than this are checksummed in parts of this size, in parallel."""
_POLYNOMIAL = 0xEDB88320


def _times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _squared(matrix: list[int]) -> list[int]:
    return [_times(matrix, matrix[row]) for row in range(32)]


def crc32_combine(first: int, second: int, second_length: int) -> int:
    """The CRC-32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)`` (zlib's method)."""
    if second_length <= 0:
        return first
    matrix = [_POLYNOMIAL] + [1 << row for row in range(31)]  # appends one zero bit
    matrix = _squared(_squared(matrix))  # four zero bits
    while second_length:
        matrix = _squared(matrix)  # 8, 16, 32... zero bits: 1, 2, 4... zero bytes
        if second_length & 1:
            first = _times(matrix, first)
        second_length >>= 1
    return first ^ second


def _range_crc32(path: Path, start: int, length: int) -> int:
    crc = 0
    buffer = bytearray(min(_CHUNK, max(length, 1)))
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        handle.seek(start)
        while length > 0:
            count = handle.readinto(view[: min(len(buffer), length)])
            if not count:
                break
            crc = zlib.crc32(view[:count], crc)
            length -= count
    return crc


def file_crc32(path: Path, part: int = PART) -> str:
    """CRC-32 of a file's content, as 8 hex digits; a file over ``part`` bytes is done in
    parts of that size on several threads."""
    size = os.path.getsize(path)
    starts = range(0, max(size, 1), part)
    if len(starts) == 1:
        return f"{_range_crc32(path, 0, size):08x}"
    lengths = [min(part, size - start) for start in starts]
    with ThreadPoolExecutor(min(len(starts), os.cpu_count() or 1)) as pool:
        parts = list(pool.map(_range_crc32, [path] * len(starts), starts, lengths))
    crc = parts[0]
    for part, length in zip(parts[1:], lengths[1:], strict=True):
        crc = crc32_combine(crc, part, length)
    return f"{crc:08x}"
