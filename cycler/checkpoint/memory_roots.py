"""Where the memory tier lives, and whose it is (docs/design.md, "Tiers" and "Shared places belong
to the user").

::

    /dev/shm/cycler-<uid>/                  the user's base (or $XDG_RUNTIME_DIR/cycler), 0700
      <root name>-<sha256 of its path>/     a job's memory root, 0700
        .cycler/memory-owner.json           the job id, the checkpoint root, cycle run's pid
        <checkpoints: the checkpoint root's layout, files 0600>
    <checkpoint root>/.cycler/job-id         the job id: random, made once per checkpoint root

``cycle run`` computes the job's memory root once and hands it to the workers
(``$CYCLER_MEMORY_TIER``). Before anything in it is read, the base and the root must be private
directories of the user (:mod:`cycler._private`) and the root's record must name
the checkpoint root and its job id: a memory root left by an earlier job whose checkpoint root was
removed or replaced is never resumed from; being the user's own, it is removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from cycler import _fs
from cycler._private import (
    PRIVATE_FILE_MODE,
    check_private,
    check_safe_parent,
    make_parents_private,
    make_private,
    private_problem,
    unsafe_path_problem,
)
from cycler.checkpoint.layout import saver_prefixes
from cycler.checkpoint.listing import list_checkpoints
from cycler.checkpoint.retainer import discard
from cycler.errors import CheckpointDirectoryError
from cycler.protocol.record import RunRecord

log = logging.getLogger(__name__)

DEFAULT_MEMORY_DIR = Path("/dev/shm")
"""The tmpfs that holds users' memory tiers unless ``--memory-dir`` names another."""

UNOWNED_GRACE_SECONDS = 60.0
"""How old a memory root without a record must be before a sweep takes it for a leftover
(younger, it may be one that another ``cycle run`` of the user is making now)."""


def memory_base(memory_dir: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Path:
    """The user's base for memory roots: ``<memory_dir>/cycler-<uid>``; without a
    ``memory_dir``, ``$XDG_RUNTIME_DIR/cycler`` where that is a private directory of this
    user, else ``/dev/shm/cycler-<uid>``."""
    if memory_dir is None:
        runtime = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR", "")
        if runtime and os.path.isabs(runtime) and is_private(Path(runtime)) \
                and _safe_to_use(Path(runtime).parent):
            return Path(runtime) / "cycler"
        memory_dir = DEFAULT_MEMORY_DIR
    return Path(os.path.abspath(memory_dir)) / f"cycler-{os.geteuid()}"


RUNTIME_SUFFIX = "-run"
"""The job runtime directories' base is the memory tier's base with this suffix: a sibling, so
the memory tier's sweep never takes a runtime directory for a memory root."""
_RUNTIME_FIX = "set XDG_RUNTIME_DIR to a private directory of yours, or give --memory-dir DIR"


def runtime_dir(root: str | os.PathLike[str], node_rank: int,
                memory_dir: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Path:
    """The private directory on this node of the job whose checkpoint root is ``root``, as node
    ``node_rank`` (:mod:`cycler.protocol.node_local`): the same for every restart; two nodes
    of one job on one host, or two jobs, differ."""
    base = Path(f"{memory_base(memory_dir, environ)}{RUNTIME_SUFFIX}")
    return base / f"{memory_root(base, root).name}-node{node_rank}"


def prepare_runtime_dir(directory: Path) -> None:
    """``cycle run``: make the runtime ``directory`` and its base private to the user (0700,
    whatever the umask), in a parent no other user can swap them out of. Raises
    :class:`CheckpointDirectoryError` (one line) where that cannot be."""
    base = directory.parent
    try:
        make_parents_private(base.parent)
    except OSError as error:
        raise CheckpointDirectoryError(f"cannot create {base.parent} for the job's runtime "
                                       f"directory ({error.strerror}); {_RUNTIME_FIX}"
                                       ) from None
    check_safe_parent(base.parent, "the runtime directory's parent", _RUNTIME_FIX)
    make_private(base, "the runtime directories' base", _RUNTIME_FIX)
    make_private(directory, "the job's runtime directory", _RUNTIME_FIX)
    reserve_space(directory)


RESERVE_FILENAME = "reserve"
"""A few pages the supervisor keeps in the job's runtime directory, freed when the tmpfs is
full: the next control request is written in their place (:func:`release_reserve`)."""
RESERVE_BYTES = 64 * 1024


def reserve_space(directory: Path) -> None:
    """Keep :data:`RESERVE_BYTES` in ``directory`` (best effort: a tmpfs full already gets
    none)."""
    path = directory / RESERVE_FILENAME
    with contextlib.suppress(OSError):
        if not os.path.exists(path):
            _fs.atomic_write_bytes(path, bytes(RESERVE_BYTES), durable=False)


def release_reserve(directory: Path) -> bool:
    """Free the space :func:`reserve_space` kept in ``directory``; whether there was any."""
    try:
        os.unlink(directory / RESERVE_FILENAME)
    except OSError:
        return False
    return True


def is_private(path: Path) -> bool:
    """Whether ``path`` is a private directory of the effective user (never raises)."""
    try:
        return private_problem(os.lstat(path)) is None
    except OSError:
        return False


def _safe_to_use(directory: Path) -> bool:
    """Whether no other user can replace ``directory`` or one above it (never raises)."""
    try:
        return unsafe_path_problem(directory) is None
    except OSError:
        return False


def memory_root(base: str | os.PathLike[str], durable_root: str | os.PathLike[str]) -> Path:
    """The memory root in ``base`` of the job whose checkpoint root is ``durable_root``: the
    same for every restart of the job on this node, distinct for two jobs with different
    roots."""
    import hashlib

    durable = Path(os.path.abspath(durable_root))
    digest = hashlib.sha256(str(durable).encode()).hexdigest()[:12]
    return Path(os.path.abspath(base)) / f"{durable.name or 'root'}-{digest}"


def job_id(durable: RunRecord) -> str:
    """The checkpoint root's job id, made now if it has none (the first writer wins, on any
    node: the id is linked into place, never overwritten). Raises
    :class:`CheckpointDirectoryError` when the id file is not a regular file of the owner of
    ``.cycler/`` (or of this user) holding an id: in a root others may write to, another user
    could have replaced it to make the job's memory tier be taken for another job's."""
    path = durable.job_id_path
    found, problem = read_job_id(path)
    if found is None and problem is None:
        try:
            durable.directory.mkdir(parents=True, exist_ok=True)
            temporary = _fs.temporary_sibling(path)
            temporary.write_text(uuid.uuid4().hex)
            try:
                os.link(temporary, path)
                _fs.fsync_directory(path.parent)
            except FileExistsError:
                pass  # another node's, or another rank's: that one is the job's
            finally:
                temporary.unlink()
        except OSError as error:
            raise CheckpointDirectoryError(f"cannot record the job id in {path} "
                                           f"({error.strerror}); choose a writable "
                                           "--checkpoint-dir") from None
        found, problem = read_job_id(path)
    if found is None:
        raise CheckpointDirectoryError(f"the job id {path} {problem or 'is missing'}: "
                                       "refusing to use it; if the checkpoint root is yours "
                                       "alone, remove it and start again")
    return found


def read_job_id(path: Path) -> tuple[str | None, str | None]:
    """The job id in ``path`` and ``None``; or ``None`` and what is wrong with the file
    (``None``, ``None``: there is none). Never follows a symlink, never blocks on a FIFO."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, None
    except OSError as error:
        is_link = error.errno == errno.ELOOP
        return None, "is a symlink" if is_link else f"cannot be read ({error.strerror})"
    try:
        status = os.fstat(descriptor)
        owners = {os.geteuid(), os.lstat(path.parent).st_uid}
        if not stat.S_ISREG(status.st_mode):
            return None, "is not a regular file"
        if status.st_uid not in owners:
            return None, f"belongs to uid {status.st_uid}, not to the owner of {path.parent}"
        text = os.read(descriptor, 64).decode("ascii", "replace").strip()
    except OSError as error:
        return None, f"cannot be read ({error.strerror})"
    finally:
        os.close(descriptor)
    if len(text) == 32 and all(c in "0123456789abcdef" for c in text):
        return text, None
    return None, "does not hold a job id (32 hex digits)"


def prepare_memory_root(root: Path, durable: RunRecord, *, supervisor: bool = False,
                        ) -> str | None:
    """Make ``root`` this job's memory root, private, with its record; refuse it
    (:class:`CheckpointDirectoryError`) when the base or the root is not the user's private
    directory. A root of this user recorded for another job or checkpoint root is removed
    first: what was removed and why (a sentence), else ``None``. ``supervisor``: ``cycle
    run`` records itself as the root's user (a sweep leaves the root of a live one alone)."""
    # The tmpfs's directory (made here in library use), checked again as cycle run did.
    _refused_unless_done(make_parents_private, root.parent.parent)
    check_safe_parent(root.parent.parent, "the memory directory")
    make_private(root.parent, "the memory tier's base")
    identity = job_id(durable)
    # The ranks of a node prepare the root together (library use): one at a time, else a rank
    # that read no record yet takes the one another rank just wrote for another job's.
    with _held_exclusively(root.parent):
        return _prepare_root(root, durable, identity, supervisor)


@contextlib.contextmanager
def _held_exclusively(base: Path) -> Iterator[None]:
    """``flock`` on the base directory while it is held; where the filesystem has no ``flock``,
    nothing is held (a ``--memory-dir`` on such a filesystem is prepared as before)."""
    descriptor = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # the lock goes with it


def _prepare_root(root: Path, durable: RunRecord, identity: str, supervisor: bool) -> str | None:
    removed = None
    owner_path = RunRecord(root).memory_owner_path
    if os.path.lexists(root):
        check_private(root, "the memory root")
        owner = _fs.read_json_object(owner_path)
        # No record yet: another rank of this node is making the root right now.
        if os.path.lexists(owner_path) and not _belongs_to(owner, identity, durable):
            removed = (f"removed the memory tier {root}: it belonged to another job of "
                       f"{owner.get('durable_root') or 'an unknown checkpoint root'}")
            _refused_unless_done(discard, root)
    make_private(root, "the memory root")
    make_private(RunRecord(root).directory, "the memory root's record directory")
    if supervisor or not os.path.lexists(owner_path):
        record = {"job": identity, "durable_root": os.path.realpath(durable.root),
                  "supervisor": _this_process() if supervisor else None}
        _refused_unless_done(_write_private, owner_path, json.dumps(record).encode())
    return removed


def _refused_unless_done(work: Callable[..., None], path: Path, *args: object) -> None:
    try:
        work(path, *args)
    except OSError as error:
        why = "no room left" if _fs.caused_by_full_disk(error) else error.strerror or error
        raise CheckpointDirectoryError(f"cannot prepare the memory root: {path} ({why}); "
                                       "free some room or choose another --memory-dir"
                                       ) from None


def _belongs_to(owner: Mapping[str, object], identity: str, durable: RunRecord) -> bool:
    return (owner.get("job") == identity
            and owner.get("durable_root") == os.path.realpath(durable.root))


def _this_process() -> dict[str, object]:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "start": _fs.process_start(os.getpid())}


def _write_private(path: Path, data: bytes) -> None:
    _fs.atomic_write_bytes(path, data, durable=False)
    os.chmod(path, PRIVATE_FILE_MODE)


def sweep_stale_roots(base: Path, keep: Path) -> list[str]:
    """Remove the user's memory roots in ``base`` (other than ``keep``) that no job can resume
    from: their checkpoint root is gone or belongs to another job now, or they hold nothing
    newer than it and no live ``cycle run`` uses them. What was removed, one sentence each;
    failures are logged, never raised."""
    said: list[str] = []
    try:
        entries = sorted(Path(entry.path) for entry in os.scandir(base))
    except OSError:
        return said
    for path in entries:
        if path == keep or _fs.is_temporary(path.name) or not is_private(path):
            continue
        why = _stale(path)
        if why is not None and _fs.remove_logged(discard, path, "memory tier"):
            said.append(f"removed the memory tier {path}: {why}")
    return said


def _stale(root: Path) -> str | None:
    """Why the memory root ``root`` is of no use to any job, ``None`` while it may be."""
    owner = _fs.read_json_object(RunRecord(root).memory_owner_path)
    durable = owner.get("durable_root")
    if not isinstance(durable, str) or not durable:
        with contextlib.suppress(OSError):
            if time.time() - os.lstat(root).st_mtime > UNOWNED_GRACE_SECONDS:
                return "it has no owner record (an older cycler's, or cut short)"
        return None
    try:
        os.stat(durable)
    except FileNotFoundError:  # only ENOENT means gone: an NFS hiccup is not a removal
        return f"its checkpoint root {durable} is gone"
    except OSError:
        return None
    found, problem = read_job_id(RunRecord(durable).job_id_path)
    if problem is not None:
        return None  # what cannot be read or trusted does not decide a removal
    if found != owner.get("job"):
        return f"its checkpoint root {durable} belongs to another job now"
    if _alive(owner.get("supervisor")) or _holds_newer(root, Path(durable)):
        return None
    return f"everything in it is in {durable} and its job is not running here"


def _alive(process: object) -> bool:
    if not isinstance(process, dict) or process.get("host") != socket.gethostname():
        return False
    pid = process.get("pid")
    return isinstance(pid, int) and _fs.process_start(pid) == process.get("start")


def _holds_newer(memory: Path, durable: Path) -> bool:
    """Whether a saver's newest valid checkpoint in ``memory`` is newer than its newest in
    ``durable`` (sizes checked, no data read)."""
    try:
        for prefix in saver_prefixes(memory):
            newest = [max((c.index for c in list_checkpoints(root, prefix) if c.valid),
                          default=-1) for root in (memory, durable)]
            if newest[0] > newest[1]:
                return True
    except OSError:
        return True  # what cannot be read is not judged useless
    return False
