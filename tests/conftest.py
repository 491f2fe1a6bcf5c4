"""Every suite: the processes the tests start answer SIGINT as they do from a terminal.

A command started in the background by a non-interactive shell (``cmd &`` in a script: how
``.ci/run`` runs its lanes) has SIGINT ignored, every process it starts inherits that, and
Python leaves an ignored SIGINT ignored: ``cycle status --watch`` then never saw its Ctrl-C
and a test timed out. Python's own handler here makes the children start with the default.
"""

from __future__ import annotations

import signal

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
