"""What workers speak of the protocol, told to the supervisor so that on a stop it picks the
path that suits the script (docs/design.md): an empty file beside the control file per feature
(``control-node0.uses-control``), created by the first worker that uses it. The supervisor
removes them before each start of the workers.
"""

from __future__ import annotations

import os
from pathlib import Path

from cycler.protocol.environment import ENV_CONTROL_FILE

USES_CYCLER = "cycler"
"""The script imported cycler (what else it uses may follow within seconds)."""
USES_CONTROL = "control"
"""The script reads the control file (``StepControl``): it stops at an agreed step."""
USES_SAVER = "saver"
"""The script commits through cycler's savers: its commits are visible to the supervisor."""
USES_OWN_HANDLER = "handler"
"""The script has its own SIGTERM handler: it gets the signal at once, whatever else it uses
but ``StepControl``."""
FEATURES = (USES_CYCLER, USES_CONTROL, USES_SAVER, USES_OWN_HANDLER)
_USED_HERE: set[str] = set()


def announcement_path(control_path: Path, feature: str) -> Path:
    """Where workers reading ``control_path`` announce ``feature`` (one of :data:`FEATURES`)."""
    return control_path.with_name(f"{control_path.stem}.uses-{feature}")


def uses_here(feature: str) -> bool:
    """Whether this process announced ``feature`` (a StepControl stops at its agreed step)."""
    return feature in _USED_HERE


def announce(feature: str, control_path: Path | str | None = None) -> None:
    """Tell the supervisor this worker uses ``feature`` (no-op outside ``cycle run``).

    ``control_path`` defaults to ``$CYCLER_CONTROL_FILE``. Costs a ``stat`` once the file exists;
    never raises: an announcement only speeds a stop up.
    """
    _USED_HERE.add(feature)
    control = control_path or os.environ.get(ENV_CONTROL_FILE)
    if not control:
        return
    path = announcement_path(Path(control), feature)
    if not os.path.exists(path):
        try:
            path.touch()
        except OSError:
            pass


def withdraw(feature: str) -> None:
    """This worker no longer uses ``feature`` (the script gave its SIGTERM handler back)."""
    _USED_HERE.discard(feature)
    control = os.environ.get(ENV_CONTROL_FILE)
    if control:
        announcement_path(Path(control), feature).unlink(missing_ok=True)


def announced(control_path: Path) -> frozenset[str]:
    """The features the workers of this node announced since the last :func:`clear`."""
    return frozenset(feature for feature in FEATURES
                     if announcement_path(control_path, feature).exists())


def clear_announcements(control_path: Path) -> None:
    """Forget the announcements of workers that are gone (before starting new ones)."""
    for feature in FEATURES:
        announcement_path(control_path, feature).unlink(missing_ok=True)
