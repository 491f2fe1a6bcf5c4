"""Exit codes of ``cycle run`` (docs/design.md), shared by the supervisor, the CLI and
user scripts."""

from __future__ import annotations

EXIT_SUCCESS = 0
"""The training script finished."""

EXIT_FAILURE = 1
"""The workers failed and restarts are used up, or they crashed in a loop."""

EXIT_USAGE = 2
"""Bad usage or configuration: nothing was started."""

EXIT_DIVERGED = 65
"""With ``--on-divergence stop``: a restart's replayed steps differed from what the earlier run
computed, so the job was ended instead of training on from a state that is not the one saved
(EX_DATAERR). Nothing is requeued; the checkpoint resumed from is still the latest."""

EXIT_NOT_PERSISTED = 74
"""With the memory tier: the script finished, or stopped after a checkpoint, but the newest
checkpoint is only in this node's memory (persisting it to the checkpoint root failed, such as
on a full disk); the memory tier is kept, so a rerun on this node resumes from it (EX_IOERR)."""

EXIT_REQUEUE = 75
"""Stopped cleanly after a committed checkpoint: requeue me (EX_TEMPFAIL)."""



def code_when_not_landed(planned: int) -> int:
    """The exit code of a run planned to end with ``planned`` whose newest state did not reach
    the checkpoint root (the memory tier): :data:`EXIT_NOT_PERSISTED` where ``planned`` would
    say it is safe there (the script finished, or a stop's checkpoint to resume); a failure's
    code stays what it was. The supervisor's core decides with it."""
    return EXIT_NOT_PERSISTED if planned in (EXIT_SUCCESS, EXIT_REQUEUE) else planned


MEANINGS = {
    EXIT_SUCCESS: "the script finished",
    EXIT_FAILURE: "the workers failed and restarts are used up (or a crash loop, or a stop "
                  "with nothing to resume)",
    EXIT_USAGE: "bad usage or configuration (a script python cannot run, a --master-port "
                "in use), nothing started",
    EXIT_DIVERGED: "--on-divergence stop: a restart's replayed steps differed from the "
                   "earlier run's, the job was ended",
    EXIT_NOT_PERSISTED: "finished or stopped, but the newest checkpoint is only in this node's "
                        "memory tier (persisting it failed): rerun on this node",
    EXIT_REQUEUE: "stopped after a committed checkpoint: requeue me",
}
"""What each code of ``cycle run`` means, as its ``--help`` and docs/cycle-run.md say it."""
