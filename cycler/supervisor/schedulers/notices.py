"""Cloud preemption notices as stop requests (``cycle run --preemption-notices``).

Spot and preemptible VMs announce their end through the instance metadata service, often with
no signal before the last seconds: AWS gives 2 minutes (``spot/instance-action``), Google 30 s
(``instance/preempted``), Azure about 30 s (a ``Preempt`` scheduled event). The supervisor polls
the service of the cloud it runs on and turns a notice into a stop with the notice's deadline.

``auto`` recognises the cloud from the machine's own identity, the DMI files cloud-init reads,
without touching the network; on a machine it does not recognise nothing is ever sent. The
endpoint is settable (``--metadata-endpoint``), so tests serve it from 127.0.0.1.
"""

from __future__ import annotations

import datetime
import email.utils
import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

NOTICE = "NOTICE"
"""The name a notice takes among the stop signals (events log, exit reasons)."""

CLOUDS = ("aws", "gcp", "azure")
NOTICE_MODES = ("auto", "off", *CLOUDS)

DEFAULT_ENDPOINTS = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal",
                     "azure": "http://169.254.169.254"}
POLL_SECONDS = 2.0
REQUEST_TIMEOUT = 1.0
GCP_NOTICE_SECONDS = 30.0
"""Google gives no time, only the notice: 30 s from when it is seen, its documented minimum."""

_AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
"""The chassis asset tag of every Azure VM (as cloud-init's Azure detection reads it)."""

DMI = Path("/sys/class/dmi/id")


@dataclass(frozen=True)
class Notice:
    """The cloud will take the machine away at ``at`` (wall clock); ``why`` says who said so."""

    at: float
    why: str


def detect_cloud(dmi: Path = DMI) -> str | None:
    """The cloud this machine runs on, from its DMI identity alone (no network)."""

    def read(name: str) -> str:
        try:
            return (dmi / name).read_text(errors="replace").strip()
        except OSError:
            return ""

    vendor, product, bios = read("sys_vendor"), read("product_name"), read("bios_vendor")
    if "Amazon EC2" in (vendor, bios) or product.startswith("Amazon EC2") or \
            read("product_uuid").lower().startswith("ec2"):
        return "aws"
    if vendor == "Google" or product == "Google Compute Engine":
        return "gcp"
    if read("chassis_asset_tag") == _AZURE_ASSET_TAG:
        return "azure"
    return None


def cloud_to_watch(mode: str, dmi: Path = DMI) -> str | None:
    """Which cloud's notices to poll for ``--preemption-notices mode`` (``None``: none)."""
    if mode == "off":
        return None
    if mode == "auto":
        return detect_cloud(dmi)
    return mode


_warned: set[str] = set()
"""The services whose malformed answer was warned about already (once each)."""


def check_once(cloud: str, endpoint: str | None = None, now: Callable[[], float] = time.time,
               ) -> Notice | None:
    """Ask the metadata service once; the notice if there is one. Never raises: a service that
    does not answer is no notice (debug level); one that answers nonsense (a broken HTTP
    answer, JSON of another shape, a time that is none) is no notice either, said once as a
    warning, and the next poll asks again."""
    base = (endpoint or DEFAULT_ENDPOINTS[cloud]).rstrip("/")
    try:
        return _CHECKS[cloud](base, now)
    except OSError as error:
        if not isinstance(error, http.client.HTTPException):  # refused, timed out: no service
            log.debug("no answer from %s's metadata service at %s: %s", cloud, base, error)
            return None
        malformed: Exception = error
    except Exception as error:  # noqa: BLE001  any answer at all must not end the polling
        malformed = error
    if base not in _warned:
        _warned.add(base)
        log.warning("%s's metadata service at %s gave an answer that is no notice (%s: %s); "
                    "cycle keeps polling", cloud, base, type(malformed).__name__,
                    repr(str(malformed))[1:-1][:200])  # one line: the answer's CR/LF escaped
    return None


def _get(url: str, headers: dict[str, str], method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(request, timeout=REQUEST_TIMEOUT) as response:
            return response.status, response.read(65536).decode()
    except urllib.error.HTTPError as error:
        return error.code, ""


def _aws(base: str, now: Callable[[], float]) -> Notice | None:
    # IMDSv2 first (a session token), IMDSv1 where the instance still allows it.
    status, token = _get(f"{base}/latest/api/token",
                         {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, method="PUT")
    headers = {"X-aws-ec2-metadata-token": token} if status == 200 and token else {}
    status, body = _get(f"{base}/latest/meta-data/spot/instance-action", headers)
    if status != 200:
        return None  # 404: no interruption scheduled
    action = json.loads(body)
    if action.get("action") not in ("terminate", "stop", "hibernate"):
        return None
    at = datetime.datetime.fromisoformat(str(action["time"]).replace("Z", "+00:00"))
    return Notice(at.timestamp(), f"AWS spot instance-action: {action['action']} at "
                                  f"{action['time']}")


def _gcp(base: str, now: Callable[[], float]) -> Notice | None:
    status, body = _get(f"{base}/computeMetadata/v1/instance/preempted",
                        {"Metadata-Flavor": "Google"})
    if status != 200 or body.strip().upper() != "TRUE":
        return None
    return Notice(now() + GCP_NOTICE_SECONDS, "Google Compute Engine: instance preempted "
                  f"(about {GCP_NOTICE_SECONDS:g} s left)")


def _azure(base: str, now: Callable[[], float]) -> Notice | None:
    status, body = _get(f"{base}/metadata/scheduledevents?api-version=2020-07-01",
                        {"Metadata": "true"})
    if status != 200:
        return None
    for event in json.loads(body).get("Events", []):
        if event.get("EventType") in ("Preempt", "Terminate"):
            not_before = event.get("NotBefore")
            parsed = email.utils.parsedate_to_datetime(not_before) if not_before else None
            at = parsed.timestamp() if parsed is not None else now() + GCP_NOTICE_SECONDS
            return Notice(at, f"Azure scheduled event {event['EventType']} not before "
                              f"{not_before or 'unknown'}")
    return None


_CHECKS: dict[str, Callable[[str, Callable[[], float]], Notice | None]] = {
    "aws": _aws, "gcp": _gcp, "azure": _azure}


def watch(cloud: str, endpoint: str | None, on_notice: Callable[[Notice], None],
          stop: threading.Event, every: float = POLL_SECONDS) -> threading.Thread:
    """Poll in a daemon thread until a notice (``on_notice`` is called once) or ``stop``."""

    def poll() -> None:
        while not stop.is_set():
            notice = check_once(cloud, endpoint)  # never raises: the thread lives on
            if notice is not None:
                on_notice(notice)
                return
            stop.wait(every)

    thread = threading.Thread(target=poll, name="cycle-preemption-notices", daemon=True)
    thread.start()
    return thread
