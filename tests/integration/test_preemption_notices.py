"""Cloud preemption notices: each cloud's metadata answer read right, the cloud recognised from
DMI files alone, a service that never answers delays nothing, and a real `cycle run` polling a
local fake AWS service stops with a checkpoint and exit 75 when the notice appears.

The services are real HTTP servers on 127.0.0.1 (nothing else is ever contacted).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cycle_jobs import wait_for
from test_cycle_run import Job

from cycler import latest_checkpoint
from cycler.protocol.control import read_control
from cycler.protocol.exit_codes import EXIT_REQUEUE
from cycler.supervisor.schedulers.notices import (
    NOTICE,
    check_once,
    cloud_to_watch,
    detect_cloud,
)

Answer = tuple[int, str]


class FakeMetadata:
    """A metadata service on 127.0.0.1: ``answers[path]`` is (status, body); records requests."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.requests: list[tuple[str, str, Message]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                fake.requests.append((self.command, self.path, self.headers))  # any case
                status, body = fake.answers.get(self.path, (404, ""))
                self.send_response(status)
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_PUT = answer  # noqa: N815 (http.server's names)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    service = FakeMetadata()
    yield service
    service.close()


AWS_ACTION = "/latest/meta-data/spot/instance-action"


def test_aws_spot_instance_action_with_an_imdsv2_token(metadata: FakeMetadata) -> None:
    assert check_once("aws", metadata.url) is None  # 404: nothing scheduled
    metadata.answers["/latest/api/token"] = (200, "token-1")
    metadata.answers[AWS_ACTION] = (200, json.dumps(
        {"action": "terminate", "time": "2030-01-02T03:04:05Z"}))
    notice = check_once("aws", metadata.url)
    assert notice is not None and notice.at == 1893553445.0
    assert "terminate at 2030-01-02T03:04:05Z" in notice.why
    got = [(method, path, headers) for method, path, headers in metadata.requests
           if path == AWS_ACTION][-1]
    assert got[2].get("X-aws-ec2-metadata-token") == "token-1"


def test_gcp_preempted_gives_30_seconds(metadata: FakeMetadata) -> None:
    path = "/computeMetadata/v1/instance/preempted"
    metadata.answers[path] = (200, "FALSE")
    assert check_once("gcp", metadata.url) is None
    metadata.answers[path] = (200, "TRUE")
    notice = check_once("gcp", metadata.url, now=lambda: 1000.0)
    assert notice is not None and notice.at == 1030.0
    assert all(h.get("Metadata-Flavor") == "Google" for _, _, h in metadata.requests)


def test_azure_preempt_event_not_before(metadata: FakeMetadata) -> None:
    path = "/metadata/scheduledevents?api-version=2020-07-01"
    metadata.answers[path] = (200, json.dumps({"Events": [{"EventType": "Freeze"}]}))
    assert check_once("azure", metadata.url) is None
    metadata.answers[path] = (200, json.dumps({"Events": [
        {"EventType": "Preempt", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT"}]}))
    notice = check_once("azure", metadata.url)
    assert notice is not None and notice.at == 1474309787.0


@pytest.mark.parametrize(("files", "cloud"), [
    ({"sys_vendor": "Amazon EC2", "product_name": "m5.large"}, "aws"),
    ({"sys_vendor": "Xen", "product_uuid": "EC2E1916-9099-7CAF-FD21-012345ABCDEF"}, "aws"),
    ({"sys_vendor": "Google", "product_name": "Google Compute Engine"}, "gcp"),
    ({"sys_vendor": "Microsoft Corporation",
      "chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77"}, "azure"),
    ({"sys_vendor": "QEMU", "product_name": "Standard PC"}, None),
    ({}, None),
])
def test_the_cloud_is_recognised_from_dmi_files_alone(tmp_path: Path, files: dict[str, str],
                                                      cloud: str | None) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n")
    assert detect_cloud(tmp_path) == cloud
    assert cloud_to_watch("auto", tmp_path) == cloud
    assert cloud_to_watch("off", tmp_path) is None
    assert cloud_to_watch("gcp", tmp_path) == "gcp"


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """Accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_service_that_never_answers_is_no_notice_within_the_timeouts(
        silent_endpoint: str) -> None:
    started = time.monotonic()
    assert check_once("aws", silent_endpoint) is None
    assert time.monotonic() - started < 5


def ready(job: Job) -> Callable[[], bool]:
    return lambda: (job.dir / "ready-0-0").exists()


def test_cycle_run_stops_on_a_notice_with_a_checkpoint_and_exit_75(
        tmp_path: Path, jobs: list[Job], metadata: FakeMetadata) -> None:
    job = Job(tmp_path, "--grace", "30", "--preemption-notices", "aws",
              "--metadata-endpoint", metadata.url)
    jobs.append(job)
    job.wait_ready()
    assert any(path == AWS_ACTION for _, path, _ in metadata.requests), "it polls"
    at = time.time() + 20  # sooner than the grace: the notice's deadline cuts it
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    metadata.answers[AWS_ACTION] = (200, json.dumps({"action": "terminate", "time": stamp}))
    assert job.wait(60) == EXIT_REQUEUE, job.output()
    assert latest_checkpoint(job.root) is not None and (tmp_path / "stopped-0").exists()
    request = read_control(job.layout.record.control_path(0))
    assert request is not None and request.reason == NOTICE
    events = job.events()
    assert {"event": "signal", "signal": NOTICE}.items() <= next(
        e for e in events if e["event"] == "signal").items()
    deadline = next(e for e in events if e["event"] == "deadline")
    assert "AWS spot instance-action: terminate" in deadline["why"]
    assert 5 < deadline["seconds_left"] <= 15  # 20 s, minus the time to stop and requeue


def test_cycle_run_with_a_service_that_never_answers_runs_as_without(
        tmp_path: Path, jobs: list[Job], silent_endpoint: str) -> None:
    job = Job(tmp_path, "--preemption-notices", "gcp", "--metadata-endpoint", silent_endpoint,
              steps=20)
    jobs.append(job)
    assert job.wait(90) == 0, job.output()
    assert "preemption_notices" in job.event_names()
    wait_for(lambda: (tmp_path / "finished-0").exists(), "finished")


def test_auto_on_this_machine_polls_nothing(tmp_path: Path, jobs: list[Job]) -> None:
    if detect_cloud() is not None:
        pytest.skip(f"this machine is on {detect_cloud()}")
    job = Job(tmp_path, steps=5)
    jobs.append(job)
    assert job.wait(90) == 0, job.output()
    assert "preemption_notices" not in job.event_names()
