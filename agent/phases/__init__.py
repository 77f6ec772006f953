"""The phases of an attempt, each in its own file, and the clock of their boundaries.

agent.runner's Agent runs them in this order: code, then stage beside setup, with restore
beside both; then the command.

- code.py: the job's code into the work directory (an archive, or one git commit);
- stage.py: the staged model files, laid out for the command;
- setup.py: the job's setup commands, once per container (SetupFailed: the job's own error);
- restore.py: the checkpoint to resume from, downloaded and unpacked, or found on this disk;
- command.py: the command's environment and launcher, and the exit report of how it ended;
- child.py: the one process running at a time (git, setup, the command): started, watched
  for stop and signals, signalled as a group;
- downloads.py: what a phase that downloads is given (client, byte counter, retries);
- meter.py: each early phase's bytes, for the heartbeat's ``phase_progress``;
- clock.py: PhaseClock, when each phase ended (PROTOCOL.md ``phases``), re-exported here.

Each phase is a function: its arguments are everything it reads and its return value is what it
made (StageStats, Restored), so that a phase can report its own progress later without reaching
into the agent. Phase classes would hold the same values as attributes and hide which of them a
phase uses. The one class, child.Child, holds what outlives a call: the process running now,
which a heartbeat's ``checkpoint_now`` and the agent's endings signal, whichever phase runs it.
"""

from agent.phases.clock import PhaseClock

__all__ = ["PhaseClock"]
