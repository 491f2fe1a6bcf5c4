"""Run every benchmark at its smallest size: ``python -m benchmarks --smoke [NAME ...]``.

The smoke run checks that each benchmark runs and that its self-checks hold (every timed run
did its work: see ``_checks.py``), not its speed: the figures of a smoke run are not quoted.
A benchmark that the machine cannot run (two simulated hosts need root and network
namespaces) says why and is skipped. Exit 0 when every benchmark passed or was skipped, 1
otherwise; one line per benchmark, and the output of each failed one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._checks import EXIT_SKIPPED

HERE = Path(__file__).resolve().parent

SMOKE: dict[str, list[str]] = {
    "bench_checkpoint_interval": ["--hours", "2", "--seeds", "1", "--stalls", "5",
                                  "--rates", "1"],
    "bench_commit_scaling": ["--kept", "20", "--repeats", "3"],
    "bench_compile_cache": ["--repeats", "1"],
    "bench_control_plane": ["--nodes", "2", "4", "--window", "2", "--node-timeout", "3",
                            "--ranks", "8"],
    "bench_control_call": ["--steps", "200", "--repeats", "1", "--size", "32"],
    "bench_cycle_run": ["--repeats", "1", "--size-mb", "1"],
    "bench_ddp_buckets": ["--ranks", "3", "--steps", "3", "--repeats", "1", "--layers", "2",
                          "--width", "64"],
    "bench_frozen_root": ["--window", "10"],
    "bench_goodput": ["--samples", "2048", "--epochs", "5", "--every", "5",
                      "--checkpoint-every", "20", "--step-delay", "0.05",
                      "--modes", "none,stop,kill"],
    "bench_hang": ["--steps-seconds", "0.05"],
    "bench_integrations": ["--repeats", "1", "--stop-at", "30"],
    "bench_memory_tier": ["--sizes-mb", "10", "--repeats", "1", "--crashes", "1"],
    "bench_multinode_restart": ["--repeats", "1"],
    "bench_restart_cost": ["--rounds", "1", "--kills", "1"],
    "bench_resume_verify": ["--size-mb", "10", "--repeats", "2"],
    "bench_sampler_resume": ["--smoke"],
    "bench_saving": ["--sizes", "10MB", "--repeats", "2"],
    "bench_scalable_order": ["--smoke"],
    "bench_sharded": ["--sizes-mb", "10", "--repeats", "1", "--rank-mb", "8"],
    "bench_step_fingerprints": ["--steps", "500", "--repeats", "1"],
    "bench_stop_paths": ["--repeats", "1", "--size-mb", "1"],
    "bench_streaming_resume": ["--smoke"],
    "bench_verify": ["--stops", "1"],
    "bench_worker_exit": ["--starts", "2"],
}
"""Each benchmark's smallest size. A new ``bench_*.py`` must be added here (a unit test
checks that every script has its row)."""

NEGATIVE = re.compile(r'"\w*(?:_s|_ms|_us|ratio\w*|_over_\w+)": -\d'
                      r"|(?<![\w.])-\d+(?:\.\d+)?\s?(?:s|ms|us)\b")
"""A negative duration or ratio in a benchmark's output: never a real figure."""


def scripts() -> list[str]:
    return sorted(path.stem for path in HERE.glob("bench_*.py"))


def smoke(name: str, timeout: float) -> tuple[str, float, str]:
    """Run one benchmark at its smoke size: (verdict, seconds, output). A benchmark still
    running at ``timeout`` is ended with everything it started (its own session: a ``cycle
    run`` it left behind would train on, unseen)."""
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, str(HERE / f"{name}.py"), *SMOKE[name]],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=HERE.parent, start_new_session=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_session(process)
        stdout, stderr = process.communicate()
        return f"FAILED: still running after {timeout:.0f} s", timeout, stdout + stderr
    seconds = time.monotonic() - started
    if process.returncode == EXIT_SKIPPED:
        return f"skipped: {(stderr.strip().splitlines() or ['no reason'])[-1]}", seconds, ""
    if process.returncode != 0:
        return f"FAILED: exit {process.returncode}", seconds, stdout + stderr
    if (negative := NEGATIVE.search(stdout)) is not None:
        return f"FAILED: printed a negative figure ({negative.group(0)})", seconds, \
            stdout + stderr
    return "ok", seconds, ""


def end_session(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the benchmark's session (``cycle run`` stops its job), SIGKILL after 30 s."""
    for number, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, number)
        try:
            process.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--smoke", action="store_true", required=True,
                        help="every benchmark at its smallest size (the only mode here; run "
                             "a benchmark's script for its figures)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per benchmark")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    args = parser.parse_args()
    missing = sorted(set(scripts()) - set(SMOKE))
    if missing:
        sys.exit(f"no smoke size for {', '.join(missing)}: add it to SMOKE in "
                 f"{Path(__file__).name}")
    names = args.names or scripts()
    unknown = sorted(set(names) - set(SMOKE))
    if unknown:
        sys.exit(f"no benchmark named {', '.join(unknown)}; known: {', '.join(scripts())}")
    failed = []
    for name in names:
        verdict, seconds, output = smoke(name, args.timeout)
        print(f"{name}: {verdict} ({seconds:.0f} s)", flush=True)
        if verdict.startswith("FAILED"):
            failed.append(name)
            print("\n".join("    " + line for line in output.splitlines()[-40:]), flush=True)
    print(f"{len(names) - len(failed)} of {len(names)} benchmarks passed or were skipped "
          f"(load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
