"""What the supervisor and the workers share: the control file, the environment variables, the
exit codes and the events log.

Imports no other part of cycler (only the helpers ``cycler._fs`` and ``cycler.errors``), and never
torch: ``cycle run`` reads these on its start-up path.
"""
