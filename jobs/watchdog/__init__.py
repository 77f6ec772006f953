"""The watchdog: notices lost hosts, every few seconds, one question per file.

- ``passes``: one pass (``tick``), in order; the task runs it every ``WATCHDOG_INTERVAL_S``;
- ``deadlines``: the deadline causes: never registered, a GPU fault, silence, a stall;
- ``silence``: when a host's silence is its loss, and when it is the supervisor's own;
- ``outages``: the supervisor's own outages, opened and closed for the status page;
- ``stall``: when a host that heartbeats still counts as lost (the heartbeat asks it too);
- ``start_deadline``: when a host must have its agent, from the image's bytes and the link;
  ``phase_stall``: when an early phase of the agent (code, stage, restore) stalls; ``start_due``
  keeps both stored on the attempt;
- ``instance_status``: what Vast's instance fields mean for an attempt;
- ``poll``: the provider poll: each account's instances against the live attempts, orphans;
- ``adopt``: creates whose outcome is unknown: adopted by label, settled or given up;
- ``races``: a hedged rent's racers against the provider's view, and their instances out of
  the race destroyed at once;
- ``outbids``, ``offline``, ``contracts``: an outbid rental, a host offline, a contract ending.

Each row is guarded where it is handled (``with jobs.attention.row(...)``): one bad row never
stops a pass.
"""
