"""The events' sentences count in English: one worker, two workers (issue 37's "1 preemptions")."""

from __future__ import annotations

import pytest

from cycler.protocol.events import counted, describe


@pytest.mark.parametrize("number, word, said", [
    (1, "worker", "1 worker"), (2, "worker", "2 workers"), (0, "failure", "0 failures"),
    (1, "kill of the job/kills of the job", "1 kill of the job"),
    (3, "kill of the job/kills of the job", "3 kills of the job")])
def test_a_count_says_one_or_many(number: int, word: str, said: str) -> None:
    assert counted(number, word) == said


def test_the_start_and_the_interval_sentences_count_their_things() -> None:
    start = {"script": "t.py", "node_rank": 0, "nnodes": 1}
    assert describe("start", {**start, "nproc_per_node": 1}).endswith(": 1 worker on node 0 of 1")
    assert ": 8 workers on" in describe("start", {**start, "nproc_per_node": 8})
    assert describe("checkpoint_interval.first", {"steps": 1, "seconds": 2}).startswith(
        "checkpoint interval: every 1 step (about 2 s)")
    assert describe("requeue_skipped", {"requeues": 1, "max_requeues": 1}) == (
        "not requeued: 1 requeue reached --max-requeues 1")
