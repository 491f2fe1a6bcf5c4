"""The summary of a ``scripts/gpu-check`` run: one row per test from pytest's junit.xml, then the
figures the tests wrote (``figures/*.json``): the asynchronous save's stall against DCP's own
stager, the hang verdict time, the restart time. Printed, and written to ``summary.md``.

Usage: python scripts/gpu_check_summary.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def results(junit: Path) -> list[tuple[str, str]]:
    """``(test, passed|failed|error|skipped)`` per test case, in the order pytest ran them."""
    try:
        cases = list(ElementTree.parse(junit).getroot().iter("testcase"))
    except (OSError, ElementTree.ParseError):  # absent, or cut short with pytest
        return []
    rows = []
    for case in cases:
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if case.find(child) is not None:
                outcome = name
        module = case.get("classname", "").rsplit(".", 1)[-1]
        rows.append((f"{module}::{case.get('name', '?')}", outcome))
    return rows


def figures(directory: Path) -> dict[str, dict[str, object]]:
    """Each test's figures by the JSON file's name (one that does not parse is left out)."""
    found = {}
    for path in sorted(directory.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def figure_lines(found: dict[str, dict[str, object]]) -> list[str]:
    lines = []
    for values in found.values():
        if "stall_ratio" in values:
            lines.append(
                f"async save stall, {values['state_mb']} MB of state: cycler "
                f"{values['cycler_stall_s']} s, DCP's default stager "
                f"{values['dcp_default_stager_stall_s']} s (returned after "
                f"{values['dcp_default_stager_returned_s']} s): ratio {values['stall_ratio']}"
                + (f"; DCP's stager pinned and blocking {values['dcp_pinned_blocking_stall_s']} s"
                   if "dcp_pinned_blocking_stall_s" in values else ""))
        if "hang_verdict_s" in values:
            lines.append(
                f"hang ({values['hang_kind']}, {values['ranks']} rank(s), {values['backend']}): "
                f"verdict after {values['hang_verdict_s']} s of silence (allowance "
                f"{values['hang_allowance_s']} s); restart to the first step "
                f"{values['restart_s']} s")
    devices = sorted({str(values.get("device")) for values in found.values()})
    return [f"device: {', '.join(devices) or 'unknown (no figures)'}", *lines]


def summary(out: Path) -> str:
    rows = results(out / "junit.xml")
    width = max([len(test) for test, _ in rows] + [4])
    table = [f"{'test':<{width}}  result", f"{'-' * width}  ------"]
    table += [f"{test:<{width}}  {outcome}" for test, outcome in rows]
    if not rows:
        table.append("(no readable junit.xml: pytest did not finish; see pytest.log)")
    counts = {outcome: sum(1 for _, o in rows if o == outcome)
              for outcome in ("passed", "failed", "error", "skipped")}
    total = ", ".join(f"{count} {outcome}" for outcome, count in counts.items() if count)
    return "\n".join([*table, "", total or "no tests ran", *figure_lines(
        figures(out / "figures"))]) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = Path(argv[1])
    text = summary(out)
    print(text, end="")
    (out / "summary.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
