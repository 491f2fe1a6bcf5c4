"""The one error hierarchy of cycler.

Every error a user can cause derives from :class:`CyclerError` and from the builtin it refines,
so ``except FileNotFoundError`` keeps working. The CLI catches :class:`CyclerError` once, prints
its message as one line, and exits with :attr:`CyclerError.exit_code`.
"""

from __future__ import annotations

from cycler.protocol.exit_codes import EXIT_FAILURE, EXIT_USAGE


class CyclerError(Exception):
    """Base of every error cycler raises on purpose. The message says what to fix."""

    exit_code: int = EXIT_FAILURE


class ConfigError(CyclerError, ValueError):
    """A bad option, flag value or configuration file: nothing was started."""

    exit_code = EXIT_USAGE


class CheckpointNotFound(CyclerError, FileNotFoundError):
    """A named checkpoint does not exist, or no valid checkpoint exists where one was required."""


class CorruptCheckpoint(CyclerError, ValueError):
    """A checkpoint exists but fails validation (missing manifest, size or checksum mismatch)."""


class UnsupportedCheckpoint(CorruptCheckpoint):
    """A checkpoint written by a newer cycler (a manifest version or checksum this one does not
    read): never loaded, never removed for it."""


class UnreadableCheckpoint(CyclerError, OSError):
    """A checkpoint that exists but cannot be read (EACCES; ESTALE or EIO on NFS): never taken
    for "not committed", never removed for it."""


class UnsafePath(CyclerError, PermissionError):
    """A path in a shared place that is not private to this user (a symlink, another user's,
    open to others): refused, never used."""

    exit_code = EXIT_USAGE


class PortInUse(CyclerError, OSError):
    """The port the workers' store must listen on is held by another process: nothing was
    started."""

    exit_code = EXIT_USAGE


class CheckpointDirectoryError(CyclerError, OSError):
    """The checkpoint root cannot be used: not a directory, not writable, or on a broken path."""

    exit_code = EXIT_USAGE


class DiskFull(CyclerError, OSError):
    """The checkpoint's filesystem is full (ENOSPC, a quota, or torch's 'unexpected pos' when
    ``torch.save`` hits the end of the disk); what was committed before is intact."""


class DirectoryInUse(CyclerError, RuntimeError):
    """A live ``cycle run``, or another process's saver, holds the checkpoint root's lock."""

    exit_code = EXIT_USAGE


class UnsupportedTorch(CyclerError, RuntimeError):
    """A feature needs a newer torch than the one installed (the message says which)."""


class RankFailed(CyclerError, RuntimeError):
    """Another rank (usually rank 0) failed in a step that every rank takes together."""


class StateMismatch(CyclerError, ValueError):
    """Saved resumable state does not fit the object it is loaded into (seed, length, version)."""


class CoordinationTimeout(CyclerError, TimeoutError):
    """Ranks waited for each other longer than the configured timeout."""


class DatasetNotFound(CyclerError, FileNotFoundError):
    """A dataset root, its class folders, or the matching files inside them do not exist."""
