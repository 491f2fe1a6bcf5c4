"""Issue 25 item 7 (finding 10): one malformed answer from the metadata service never turns
preemption notices off. The poller catches per poll, warns once, and keeps polling: a real
notice served after garbage is still read. The service is a real socket server on 127.0.0.1
that answers each request with the next of a list of raw responses."""

from __future__ import annotations

import datetime
import json
import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from cycler.supervisor.schedulers.notices import Notice, watch


def _in(seconds: float) -> str:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def response(status: int, body: bytes) -> bytes:
    return (f"HTTP/1.0 {status} X\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


NOT_YET = response(404, b"")
NOTICE = response(200, json.dumps({"action": "terminate", "time": _in(120)}).encode())
GARBAGE = {
    "a bad status line": b"HELLO\r\n\r\n",
    "a cut body": b"HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n{\"action\"",
    "a JSON list": response(200, b"[1, 2]"),
    "a JSON string": response(200, b"\"terminate\""),
    "a time that is no time": response(200, b'{"action": "stop", "time": "soon"}'),
    "a time out of range": response(200, b'{"action": "stop", "time": 1e300}'),
    "bytes that are no UTF-8": response(200, b"\xff\xfe\x00{"),
    "a closed connection": b"",
}


class RawService:
    """Answers the n-th GET with ``answers[n]`` (the last one from then on); PUTs with a token."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers, self.gets = answers, 0
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                request = connection.recv(65536)
                if request.startswith(b"PUT"):
                    connection.sendall(response(200, b"token"))
                    continue
                answer = self.answers[min(self.gets, len(self.answers) - 1)]
                self.gets += 1
                connection.sendall(answer)


@pytest.fixture
def served() -> Iterator[list[RawService]]:
    services: list[RawService] = []
    yield services
    for service in services:
        service.socket.close()


@pytest.mark.parametrize("what", list(GARBAGE))
def test_a_notice_after_a_malformed_answer_is_still_read(
        what: str, served: list[RawService], caplog: pytest.LogCaptureFixture) -> None:
    service = RawService([NOT_YET, GARBAGE[what], GARBAGE[what], NOT_YET, NOTICE])
    served.append(service)
    got: list[Notice] = []
    arrived, stop = threading.Event(), threading.Event()
    caplog.set_level(logging.DEBUG, logger="cycler.supervisor.schedulers.notices")
    thread = watch("aws", service.url, lambda n: (got.append(n), arrived.set()), stop,
                   every=0.05)
    try:
        assert arrived.wait(20), f"the notice after {what} was never read"
    finally:
        stop.set()
        thread.join(5)
    assert got[0].why.startswith("AWS spot instance-action: terminate")
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "keeps polling" in warned[0].getMessage()
    assert "\n" not in warned[0].getMessage() and "\r" not in warned[0].getMessage(), \
        "the service's answer is never a line of cycle's log of its own"
