"""Agreement between ranks through the process group's key-value store.

AtomicDirectory needs one rank to act and every rank to learn the outcome
(:meth:`Coordinator.decide`, the one way every round of the saver is written). Doing that through
the store rather than collectives gives every wait an explicit timeout, needs no device tensors
(the same code serves gloo and nccl), and lets no rank list the directory. Keys are numbered per
rank by a counter kept in the store itself, so several saver objects in one job never collide as
long as every rank makes the same sequence of calls, which the API requires anyway.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from cycler._distributed import in_process_group
from cycler.errors import CoordinationTimeout, RankFailed

_ERROR_PREFIX = "error:"

STRATEGIES = ("sync_any", "sync_all", "async", "offline", "mono")
"""cycling_utils' saver strategies (see :class:`cycler.AtomicDirectory`)."""
COORDINATED = ("sync_any", "sync_all")
"""The strategies whose ranks coordinate through the process group; the others act alone."""


class Coordinator:
    """One creator rank (global rank 0) and ``world_size - 1`` followers, or a lone process."""

    def __init__(self, namespace: str, timeout: datetime.timedelta,
                 use_process_group: bool = True) -> None:
        self.namespace = namespace
        self.timeout = timeout
        self._use_process_group = use_process_group
        self._bound: tuple[int, int, Any] | None = None
        self._previous: dict[str, str] = {}
        """Per kind of round, the last round's key whose keys the creator has yet to delete."""

    def _binding(self) -> tuple[int, int, Any]:
        # Resolved at the first round, not when the saver is built: a saver made before
        # init_process_group would otherwise act alone on every rank for good.
        if self._bound is None:
            distributed = self._use_process_group and global_rank() is not None
            rank = dist.get_rank() if distributed else 0
            world_size = dist.get_world_size() if distributed else 1
            store = _default_store() if distributed and world_size > 1 else None
            self._bound = (rank, world_size, store)
        return self._bound

    @property
    def rank(self) -> int:
        return self._binding()[0]

    @property
    def world_size(self) -> int:
        return self._binding()[1]

    @property
    def _store(self) -> Any:
        return self._binding()[2]

    @property
    def is_creator(self) -> bool:
        return self.rank == 0

    def new_round(self, what: str) -> str:
        """A key prefix unique to this call, identical on every rank."""
        if self._store is None:
            return ""
        number = self._store.add(f"cycler/{self.namespace}/{what}/calls/{self.rank}", 1)
        return f"cycler/{self.namespace}/{what}/{number}"

    def _forget_previous(self, round_key: str) -> None:
        """On the creator, once every rank has reached ``round_key``: delete the keys of the
        round before it of the same kind, which every rank has finished with (a store lives
        as long as the job: 2W + 3 keys per round would otherwise pile up for good)."""
        kind = round_key.rsplit("/", 1)[0]
        previous, self._previous[kind] = self._previous.get(kind), round_key
        if previous is None:
            return
        keys = [f"{previous}/outcome", f"{previous}/plan/outcome", f"{previous}/count",
                f"{previous}/all"] + [
            f"{previous}{part}/rank/{rank}" for part in ("", "/records")
            for rank in range(self.world_size)]
        for key in keys:
            try:
                self._store.delete_key(key)
            except Exception:  # a store without delete_key (or a key never set): harmless
                return

    def arrive(self, round_key: str, value: str) -> None:
        """Tell the creator this rank reached ``round_key``, with a small value."""
        if self._store is not None:
            self._store.set(f"{round_key}/rank/{self.rank}", value)

    def wait_for_all(self, round_key: str) -> None:
        """On any rank, after :meth:`arrive`: wait until every rank has arrived at
        ``round_key``. A counter barrier, as torch's store-based barrier: each rank adds one to
        the round's count, the rank that makes it ``world_size`` sets the round's done key, and
        every rank waits for that one key: O(1) store calls a rank, O(W) a round (a wait on
        every rank's key was W lookups a rank, W x W a round). On a timeout the
        :class:`CoordinationTimeout` names the ranks whose keys are missing (read then only)."""
        if self._store is None:
            return
        done = f"{round_key}/all"
        if self._store.add(f"{round_key}/count", 1) == self.world_size:
            self._store.set(done, "1")
        self._wait([done], "every rank to reach it", missing=lambda: self._absent(round_key))
        if self.is_creator:
            self._forget_previous(round_key)

    def _absent(self, round_key: str) -> str:
        """Which ranks have not arrived at ``round_key``, in a few words: a timeout's detail,
        read only once a wait has failed. In a job of more than :data:`NAMED_BY_EVERY_RANK`
        ranks only rank 0 reads (and any rank that finds rank 0 missing), so that W ranks timing
        out together do not ask the store W times each."""
        def arrived(ranks: list[int]) -> bool:
            return bool(self._store.check([f"{round_key}/rank/{rank}" for rank in ranks]))

        try:
            if self.world_size > NAMED_BY_EVERY_RANK and not self.is_creator and arrived([0]):
                return "rank 0's error names the ranks missing"
            absent = missing_ranks(arrived, self.world_size)
        except Exception as error:  # the store itself is gone (rank 0 died with it)
            return f"the store does not answer: {error}"
        if not absent:
            return "every rank has arrived"
        if len(absent) > SHOWN_MISSING:
            return f"more than {SHOWN_MISSING} of {self.world_size} ranks missing: " + \
                ", ".join(map(str, absent[:SHOWN_MISSING])) + ", ..."
        return f"{len(absent)} of {self.world_size} ranks missing: {', '.join(map(str, absent))}"

    def gather(self, round_key: str, local: str) -> list[str]:
        """On the creator: every rank's value for ``round_key`` (waits for all of them)."""
        if self._store is None:
            return [local]
        keys = [f"{round_key}/rank/{rank}" for rank in range(self.world_size)]
        self._wait(keys, "every rank to reach it")
        values = [self._store.get(key).decode() for key in keys]
        if not round_key.endswith("/records"):
            self._forget_previous(round_key)
        return values

    def publish(self, round_key: str, outcome: str) -> None:
        """On the creator: publish the round's outcome to every follower."""
        if self._store is not None:
            self._store.set(f"{round_key}/outcome", outcome)

    def publish_error(self, round_key: str, error: BaseException) -> None:
        self.publish(round_key, f"{_ERROR_PREFIX}{type(error).__name__}: {error}")

    def outcome(self, round_key: str) -> str:
        """On a follower: the creator's outcome; raises if the creator reported an error."""
        self._wait([f"{round_key}/outcome"], "rank 0 to finish")
        value = self._store.get(f"{round_key}/outcome").decode()
        if value.startswith(_ERROR_PREFIX):
            raise RankFailed(f"rank 0 failed: {value[len(_ERROR_PREFIX):]}")
        return value

    def decide(self, round_key: str, decision: Callable[[], str]) -> str:
        """One rank decides, every rank learns: rank 0 runs ``decision()`` (which may gather
        the ranks' values of the round) and publishes what it returns; every rank returns that.
        What ``decision`` raises is published first, so every follower raises
        :class:`RankFailed` with its text at once instead of waiting for a timeout."""
        if not self.is_creator:
            return self.outcome(round_key)
        try:
            outcome = decision()
        except BaseException as error:
            self.publish_error(round_key, error)
            raise
        self.publish(round_key, outcome)
        return outcome

    def decide_from_all(self, round_key: str, mine: str,
                        decision: Callable[[list[str]], str]) -> str:
        """Every rank arrives at ``round_key`` with ``mine``; rank 0 decides from every rank's
        value, in rank order, and every rank returns the decision (see :meth:`decide`)."""
        self.arrive(round_key, mine)
        return self.decide(round_key, lambda: decision(self.gather(round_key, mine)))

    def _wait(self, keys: Sequence[str], what: str,
              missing: Callable[[], str] | None = None) -> None:
        """Wait for ``keys``; a :class:`CoordinationTimeout` after the timeout, with the store's
        error or what ``missing()`` says is missing."""
        try:
            self._store.wait(list(keys), self.timeout)
        except Exception as error:  # the store raises a bare RuntimeError/DistStoreError
            detail = missing() if missing is not None else str(error)
            at = keys[0].rsplit("/rank/", 1)[0].removesuffix("/all")
            raise CoordinationTimeout(
                f"rank {self.rank} waited {self.timeout.total_seconds():g} s for {what} "
                f"at {at} ({detail}); is a rank dead or skipping a call that every rank "
                "must make?"
            ) from None


NAMED_BY_EVERY_RANK = 64
"""Up to this many ranks, every rank that timed out at a barrier names the ranks missing."""
SHOWN_MISSING = 16
"""The most missing ranks a timeout names."""


def missing_ranks(arrived: Callable[[list[int]], bool], world_size: int,
                  limit: int = SHOWN_MISSING + 1) -> list[int]:
    """The first ``limit`` ranks of ``range(world_size)`` for which ``arrived([rank])`` is
    false, in order, where ``arrived(ranks)`` tells whether all of ``ranks`` arrived (one store
    call): halves are asked in turn, so m missing ranks cost O(m log W) calls, not W."""
    found: list[int] = []

    def look(ranks: list[int]) -> None:
        if len(found) >= limit or arrived(ranks):
            return
        if len(ranks) == 1:
            found.append(ranks[0])
            return
        look(ranks[:len(ranks) // 2])
        look(ranks[len(ranks) // 2:])

    look(list(range(world_size)))
    return found


def global_rank() -> int | None:
    """This process's rank in the default process group, ``None`` without one."""
    if in_process_group():
        return dist.get_rank()
    return None


def _default_store() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()
