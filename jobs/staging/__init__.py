"""Staged model weights: a job's ``stage`` entries mirrored once into its team's storage before
any rent, and handed to every agent as presigned objects.

- ``resolve``: an entry at its source (the Hub's commit and files, or a URL), and the Hub's
  refusals as sentences that say what to do.
- ``trouble``: what went wrong on which entry, in words (DNS, refused, timeout, TLS, 5xx,
  429), and whether and when it is tried again (2, 4, 8, 16 s) or fails the job at once.
- ``mirror``: copying a resolved entry into the team's storage, once per content.
- ``stage``: the job's staging pass (``stage_job``, the watchdog's nudge, finish, fail), its
  progress on the job page, and the GB each host downloads (the cost model's ``staged_gb``).
- ``for_agent``: what an agent is told of the staged files at register.
"""
