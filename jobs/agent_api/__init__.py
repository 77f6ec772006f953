"""The agent API (``/api/agent/...``): what an agent in a rented container may say and ask, and
what the supervisor records when it speaks. Job-level transitions (starting → running,
recovering, failed) belong to the job state machine (``jobs.lifecycle``); these modules only
record what the agent reported.

- ``api``: the django-ninja router, its bodies and its answers (the wire contract is
  ``agent/PROTOCOL.md``).
- ``auth``: the live attempt holding a bearer token, or why there is none (401, 503, 410).
- ``register``: what an agent is told when it registers.
- ``phases``: the phase boundaries an agent reports, kept at their first report.
- ``heartbeat``: what a heartbeat records and what it is answered.
- ``heartbeat_store``: the heartbeat's two SQL statements.
- ``exit``: what the agent's exit report does to the attempt and its job.

The onstart script and the agent's zipapp stay in ``jobs.bootstrap``: renting writes the script
into every create request, so here it would close an import cycle (jobs.agent_api →
jobs.checkpoints → jobs.renting → jobs.agent_api).
"""
