"""What the supervisor and the workers share: the control file, the environment variables, the
exit codes, the events log, the stop signals and the stray-signal shield, the progress beacons,
what workers announce of the protocol, the names under ``.cycler/`` and the one
maker of their paths (:mod:`.record`), and the job's timeline and
goodput read from its events.

Imports no other part of cycler (only the helpers ``cycler._fs`` and ``cycler.errors``), and never
torch at import time: ``cycle run`` reads these on its start-up path.
"""
