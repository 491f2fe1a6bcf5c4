"""What verifying reads found: a checkpoint whose checksums failed when a resume (or
``cycle prune``) read its data is recorded under ``.cycler/``, so that ``cycle status``, ``cycle
prune`` and retention, which read sizes only, see it as corrupt too and never keep it as the one
to resume from. The records are written by the readers that verify (:mod:`listing`,
:mod:`resume`) and read by every listing.
"""

from __future__ import annotations

from cycler._fs import atomic_write_bytes
from cycler.checkpoint.layout import CheckpointLayout, CheckpointName


def record_failed_verification(layout: CheckpointLayout, name: CheckpointName,
                               problem: str | None) -> None:
    """Remember that checkpoint ``name`` failed its checksums (``problem`` says how), for
    ``cycle status``, ``cycle prune`` and retention; best effort."""
    try:
        layout.record.directory.mkdir(exist_ok=True)
        atomic_write_bytes(layout.record.verification_record_path(str(name)),
                           (problem or "").encode(),
                           durable=False)
    except OSError:
        pass


def failed_verifications(layout: CheckpointLayout) -> dict[str, str]:
    """Checkpoint name -> what a verification found wrong, for every one that failed."""
    found = {}
    for name, record in layout.record.verification_records().items():
        if layout.parse(name) is None:
            continue  # another saver's
        try:
            found[name] = record.read_text() or "checksum mismatch"
        except OSError:
            continue
    return found
