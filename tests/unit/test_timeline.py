"""The job's life on one line per node, from the scripted job of test_goodput, cell by cell."""

from __future__ import annotations

from test_goodput import JOB, event

from cycler.protocol.timeline import HANG, spans, timeline


def test_the_stretches_of_a_scripted_job() -> None:
    found = spans(JOB[:20])  # run 1 only
    assert [(round(a, 1), round(b, 1), s) for a, b, s in found] == [
        (0.0, 10.2, "s"), (10.2, 90.0, "="), (90.0, 96.3, "R"), (96.3, 160.0, "="),
        (160.0, 160.0, "H"), (160.0, 165.4, "R"), (165.4, 190.0, "="), (190.0, 200.0, "S")]


def test_one_line_per_node_one_cell_per_stretch_of_time() -> None:
    run = JOB[:20]  # 0..200 s, 20 cells of 10 s
    line = timeline({0: run}, width=20)[0]
    assert len(line) == 20
    assert line[0] == "s" and line[1:8] == "=======" and line[9] == "R"
    assert line[16] == HANG and line[19] == "S"
    node_1 = [event("start", 100.0), event("first_step", 105.0, at=105.0),
              event("exit", 200.0, code=0)]
    lines = timeline({0: run, 1: node_1}, width=20)
    assert lines[1][:10].strip() == "" and set(lines[1][11:20]) == {"="}, lines[1]


def test_no_events_no_timeline() -> None:
    assert timeline({}) == {} and timeline({0: []}) == {}
