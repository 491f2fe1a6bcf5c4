"""``bash scripts/gpu-check`` where no GPU is: its arguments, its dry run, the summary it prints
from a run's files, and the GPU suite collecting every one of its test files on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check"
sys.path.insert(0, str(REPO / "scripts"))

from gpu_check_summary import summary  # noqa: E402


def gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_help_describes_every_option_and_exits_0() -> None:
    done = gpu_check("--help")
    assert done.returncode == 0
    for option in ("--out", "--budget", "--no-install", "--dry-run"):
        assert option in done.stdout


@pytest.mark.parametrize("args", [("--bogus",), ("--budget", "ten"), ("--budget", "5"),
                                  ("--out",)])
def test_bad_arguments_get_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = gpu_check(*args)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "gpu-check:" in done.stderr


def test_a_dry_run_prints_the_install_and_the_suite_and_creates_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = gpu_check("--dry-run", "--out", str(out), "--budget", "300")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    (install,) = [line for line in lines if "pip install" in line]
    assert f"-c {out}/torch-constraint.txt" in install and f"-e {REPO}[test]" in install
    (suite,) = [line for line in lines if " -m pytest " in line]
    assert "-m gpu tests/gpu" in suite and f"--junitxml {out}/junit.xml" in suite
    assert suite.startswith("+ timeout -s INT")
    assert not out.exists()
    without_install = gpu_check("--dry-run", "--no-install", "--out", str(out))
    assert "pip install" not in without_install.stdout


def test_every_gpu_test_file_is_collected_on_the_cpu_and_skipped_by_default() -> None:
    files = {path.name for path in (REPO / "tests" / "gpu").glob("test_*.py")}
    marked = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
                             "-p", "no:cacheprovider", "tests/gpu"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert marked.returncode == 0, marked.stdout + marked.stderr
    collected = {line.split("::")[0].rsplit("/", 1)[-1] for line in marked.stdout.splitlines()
                 if "::" in line}
    assert collected == files
    default = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                              "-p", "no:cacheprovider", "tests/gpu"],
                             capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "::" not in default.stdout, "a GPU test is not marked gpu: the default run takes it"


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.gpu.test_cuda_rng" name="test_streams" time="1.0"/>
<testcase classname="tests.gpu.test_cuda_hang" name="test_hang" time="9.0">
<failure message="boom">trace</failure></testcase>
<testcase classname="tests.gpu.test_cuda_cycle_run" name="test_gpu[gloo]" time="0">
<skipped message="several GPUs"/></testcase>
</testsuite></testsuites>"""


def test_the_summary_gives_each_tests_result_the_stall_ratio_and_the_hang_times(
        tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text(JUNIT)
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "stall.json").write_text(json.dumps({
        "device": "1 x H100", "state_mb": 512, "cycler_stall_s": 0.2,
        "dcp_default_stager_stall_s": 0.1, "dcp_default_stager_returned_s": 0.01,
        "stall_ratio": 2.0}))
    (tmp_path / "figures" / "hang.json").write_text(json.dumps({
        "device": "1 x H100", "hang_kind": "device", "ranks": 1, "backend": "nccl",
        "hang_verdict_s": 3.5, "hang_allowance_s": 3.0, "restart_s": 7.25}))
    text = summary(tmp_path)
    assert "test_cuda_rng::test_streams" in text and "passed" in text
    assert "test_cuda_hang::test_hang" in text and "failed" in text
    assert "1 passed, 1 failed, 1 skipped" in text
    assert "ratio 2.0" in text and "verdict after 3.5 s" in text and "7.25 s" in text
    assert "device: 1 x H100" in text


def test_the_summary_says_when_pytest_left_no_results_or_a_torn_report(tmp_path: Path) -> None:
    (tmp_path / "figures").mkdir()
    assert "no readable junit.xml: pytest did not finish" in summary(tmp_path)
    (tmp_path / "junit.xml").write_text(JUNIT[:200])  # cut short
    (tmp_path / "figures" / "torn.json").write_text('{"stall_ratio": ')
    text = summary(tmp_path)
    assert "no readable junit.xml" in text and "device: unknown (no figures)" in text
