"""Step fingerprints on disk: what each rank computed at each step, as exact bits.

Under ``cycle run`` every rank appends one fixed-size record per step to a file of its own,
``$CYCLER_FINGERPRINT_DIR/rank-<RANK>.fp``, in the job's private runtime directory on the node
(never the shared checkpoint root: a step touches no shared path). The supervisor copies what is
new into ``<root>/.cycler/fingerprints-node<N>.fp`` at cheap moments (a commit, the end of a
worker group), and compares a restart's replayed steps with the earlier runs' records
(:mod:`cycler.protocol.replay`).

A record is :data:`RECORD_SIZE` bytes, stored into the writer's memory-mapped file (no system
call a step; the page cache keeps it through a kill -9 of the writer): a magic byte, the kind
(a start's header or a step's value), the value's type, the rank, the worker's start id (random
per process), the step and 64 bits of value, then a CRC-32 of the rest. A reader keeps only
records whose CRC holds and steps over anything else (the zeros of a mapped file's unwritten
tail, a record cut short by a copy or a full disk), so a torn record costs that record only.
No torch here: the supervisor reads these on its own path.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

_MAGIC = 0xCF
_MAGIC_BYTE = bytes([_MAGIC])
_BODY = struct.Struct("<BBBxIIqQ")
"""magic, kind, value type, rank, start id, step, value bits; then a CRC-32 of these."""
RECORD_SIZE = _BODY.size + 4

START, VALUE = 1, 2
"""A start's header (``step``: the step it resumed at, ``bits``: the world size), a step's
value."""

FLOAT64, FLOAT32, FLOAT16, BFLOAT16, INT64 = 1, 2, 3, 4, 5
"""The value's type: a loss as the script computed it, or an integer checksum it chose."""
TYPE_NAMES = {FLOAT64: "float64", FLOAT32: "float32", FLOAT16: "float16",
              BFLOAT16: "bfloat16", INT64: "int64"}

ENV_FINGERPRINT_DIR = "CYCLER_FINGERPRINT_DIR"
"""Where this node's workers append their step fingerprints (``cycle run``: the job's private
runtime directory on the node); unset, nothing is recorded."""

RANK_FILE = "rank-{rank}.fp"
"""A rank's records in the node's runtime directory."""


@dataclass(frozen=True)
class Record:
    """One record: a start's header or one step's value."""

    kind: int
    rank: int
    start: int
    step: int
    bits: int
    type: int = INT64

    @property
    def key(self) -> tuple[int, int, int, int]:
        """What makes a record unique (a copy read twice counts once)."""
        return self.kind, self.rank, self.start, self.step


def pack(record: Record) -> bytes:
    """``record`` as the :data:`RECORD_SIZE` bytes a writer appends."""
    return pack_fields(record.kind, record.rank, record.start, record.step, record.bits,
                       record.type)


_CRC = struct.Struct("<I")


def pack_fields(kind: int, rank: int, start: int, step: int, bits: int,
                type_of_value: int) -> bytes:
    """A record from its fields, without making a :class:`Record` (the worker's step path)."""
    body = _BODY.pack(_MAGIC, kind, type_of_value, rank, start, step,
                      bits & 0xFFFF_FFFF_FFFF_FFFF)
    return body + _CRC.pack(zlib.crc32(body))


def unpack(data: bytes) -> tuple[list[Record], int]:
    """Every whole, intact record in ``data``, in order, and the end of the last one (where
    the next read starts: a writer's file is mapped, its tail zeros until written); torn,
    zero or foreign bytes are stepped over until records line up again."""
    records, offset, end, settled = [], 0, len(data) - RECORD_SIZE, 0
    while offset <= end:
        if data[offset] != _MAGIC:
            offset = data.find(_MAGIC_BYTE, offset + 1)
            if offset < 0:
                break
            continue
        body = data[offset:offset + _BODY.size]
        (crc,) = _CRC.unpack_from(data, offset + _BODY.size)
        if zlib.crc32(body) == crc:
            _, kind, kind_of_value, rank, start, step, bits = _BODY.unpack(body)
            records.append(Record(kind, rank, start, step, bits, kind_of_value))
            offset += RECORD_SIZE
            settled = offset
        else:
            offset += 1
    return records, settled


def read_records(path: Path, offset: int = 0) -> tuple[list[Record], int]:
    """The records in ``path`` from byte ``offset``, and the offset to read from next time (a
    record still being appended is read then). A missing file has none."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    records, settled = unpack(data)
    return records, offset + settled


def value_of(type_of_value: int, bits: int) -> float | int:
    """The number a value's bits stand for (a checksum as an int)."""
    if type_of_value == FLOAT64:
        return float(struct.unpack("<d", struct.pack("<Q", bits))[0])
    if type_of_value == FLOAT32:
        return float(struct.unpack("<f", struct.pack("<I", bits & 0xFFFF_FFFF))[0])
    if type_of_value == FLOAT16:
        return float(struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0])
    if type_of_value == BFLOAT16:
        return float(struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0])
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def shown(type_of_value: int, bits: int) -> str:
    """A value as people read it; NaNs and values that print alike show their bits."""
    value = value_of(type_of_value, bits)
    if isinstance(value, float) and math.isnan(value):
        return f"nan (bits {bits:#x})"
    return repr(value)


_BITS = {FLOAT64: (struct.Struct("<d"), struct.Struct("<Q")),
         FLOAT32: (struct.Struct("<f"), struct.Struct("<I")),
         FLOAT16: (struct.Struct("<e"), struct.Struct("<H"))}


def float64_bits(value: float) -> int:
    """The bits of a Python float."""
    return float_bits(FLOAT64, value)


def float_bits(type_of_value: int, value: float) -> int:
    """The bits of ``value`` in the float type ``type_of_value``, where ``value`` is exactly a
    number of that type (what ``item()`` of such a tensor gives)."""
    if type_of_value == BFLOAT16:
        return float_bits(FLOAT32, value) >> 16
    packer, reader = _BITS[type_of_value]
    return int(reader.unpack(packer.pack(value))[0])
