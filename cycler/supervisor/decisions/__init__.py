"""The supervisor's decisions: a pure core, events in and actions out, no I/O (STYLE.md 6).

- :mod:`.core`: :class:`~.core.SupervisorCore`, the state machine the shell feeds (stop, grace,
  restarts, requeue, the memory tier's landing, exit codes).
- :mod:`.vocabulary`: what it hears (events) and says (actions), and the stop paths.
- :mod:`.budget`: the restart budget (restarts without progress, a crash loop, backoff).
- :mod:`.failure_kinds`: how a worker failed, read from its output (:class:`WorkerFailure`).
- :mod:`.failure`: the report of a failed worker's error for the user.

Imports no other wing: every wing may speak this vocabulary.
"""
