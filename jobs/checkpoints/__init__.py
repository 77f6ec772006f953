"""Checkpoints on the server's side: where they are uploaded, when they are asked for.

- ``records``: a checkpoint's upload targets under its attempt's prefix, the check of what was
  stored, the manifest that publishes it, pruning, and fencing the writes that come too late.
- ``interval``: the adaptive checkpoint interval (Young/Daly) as plain functions, no database.
- ``requests``: the supervisor's checkpoint requests for jobs with ``checkpoint = "auto"`` (the
  watchdog's tick asks, the job page says why).
"""
