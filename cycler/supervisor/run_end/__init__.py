"""The end of a run, beside the core's decision.

- :mod:`.landing`: the newest memory checkpoint landed in the checkpoint root (the memory
  tier), reported to the core, which decides exit 74 and the requeue.
- :mod:`.foreign`: a stop or failure with no checkpoint of cycler's: the script's own
  checkpoint, searched for, makes it a requeue.
- :mod:`.stop_guard`: the last word on a stop's deadline, where a call on a stalled checkpoint
  root holds the loop: the process ends with the exit code that says where the newest state is.
"""
