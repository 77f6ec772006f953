"""What register told the agent to do (PROTOCOL.md §2, the register reply), read and checked."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import agent
from agent import launch, staging, workdir
from agent.heartbeat import clamp_interval


@dataclass
class Assignment:
    """What register told us to do."""

    job_id: str
    attempt_no: int
    command: str
    env: dict[str, str]
    heartbeat_interval_s: float
    total_steps: int | None
    resume: dict[str, Any] | None
    data_key: bytes | None
    stop_grace_s: float | None = None
    checkpoint_mode: str = agent.SCRIPT
    setup: str = ""
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    code: workdir.Code | None = field(default=None, repr=False)
    stage: tuple[staging.StageEntry, ...] = ()
    # Several GPUs: "torchrun"/"accelerate" wraps the command, one process per GPU (num_gpus).
    launcher: str | None = None
    num_gpus: int = 1
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def secret_values(self) -> list[str]:
        """What must never leave the agent: the secrets, and a deploy key."""
        key = self.code.ssh_key if self.code is not None else None
        return [*self.secrets.values(), *([key] if key else [])]


def parse_assignment(reply: dict[str, Any]) -> Assignment:
    """Read the register reply; KeyError/TypeError/ValueError when it is malformed."""
    encryption = reply.get("encryption")
    data_key = None
    if encryption:
        if encryption.get("format", "ngck1") != "ngck1":
            raise ValueError(f"unknown encryption format {encryption.get('format')!r}")
        data_key = base64.b64decode(encryption["data_key_b64"], validate=True)
        if len(data_key) != 32:
            raise ValueError("the data key must be 32 bytes")
    command = reply["command"]
    if not isinstance(command, str) or not command.strip():
        raise ValueError("empty command")
    total = reply.get("total_steps")
    grace = reply.get("stop_grace_s")
    setup = reply.get("setup") or ""
    if not isinstance(setup, str):
        raise ValueError("setup must be text")
    return Assignment(
        job_id=str(reply["job_id"]),
        attempt_no=int(reply["attempt_no"]),
        command=command,
        env={str(k): str(v) for k, v in (reply.get("env") or {}).items()},
        heartbeat_interval_s=clamp_interval(reply.get("heartbeat_interval_s"), 15.0),
        total_steps=int(total) if total is not None else None,
        resume=reply.get("resume") or None,
        data_key=data_key,
        stop_grace_s=float(grace) if grace is not None else None,
        checkpoint_mode=mode_from_reply(reply.get("checkpoint")),
        setup=setup,
        secrets=secrets_from_reply(reply.get("secrets")),
        code=workdir.parse_code(reply.get("workdir")),
        stage=staging.parse_stage(reply.get("stage")),
        launcher=launcher_from_reply(reply.get("launcher")),
        num_gpus=gpus_from_reply(reply.get("num_gpus")),
        raw=reply,
    )


def gpus_from_reply(num_gpus: Any) -> int:
    """Register's ``num_gpus``: 1 from a server too old to send it."""
    if num_gpus is None:
        return 1
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or not 1 <= num_gpus <= 16:
        raise ValueError(f"num_gpus must be a whole number from 1 to 16, not {num_gpus!r}")
    return num_gpus


def secrets_from_reply(secrets: Any) -> dict[str, str]:
    """Register's ``secrets``: names (environment variables) to values; none when absent."""
    if secrets is None:
        return {}
    if not isinstance(secrets, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in secrets.items()
    ):
        raise ValueError("secrets must map names to text")
    return dict(secrets)


def mode_from_reply(checkpoint: Any) -> str:
    """Register's ``checkpoint.mode``; ``script`` from a server too old to send one (it never
    asks for checkpoints on its own) and for a value this agent does not know."""
    mode = checkpoint.get("mode") if isinstance(checkpoint, dict) else None
    return agent.AUTO if mode == agent.AUTO else agent.SCRIPT


def launcher_from_reply(launcher: Any) -> str | None:
    """Register's ``launcher``: None (absent, from an older server: the command as it is) or
    one the agent knows; any other value is a malformed reply, not a command run wrongly."""
    if launcher is None:
        return None
    if launcher not in launch.LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}")
    return str(launcher)
