"""`python -m agent` / `python agent.pyz`: run the job this attempt's token names."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import agent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="nomadgpu-agent", description=__doc__)
    parser.add_argument(
        "--supervisor",
        default=env.get("NOMAD_SUPERVISOR_URL"),
        help="supervisor base URL (env NOMAD_SUPERVISOR_URL)",
    )
    parser.add_argument(
        "--token",
        default=env.get("NOMAD_AGENT_TOKEN"),
        help="this attempt's agent token (env NOMAD_AGENT_TOKEN)",
    )
    parser.add_argument(
        "--workdir",
        default=env.get("NOMAD_WORKDIR") or "nomad",
        help="progress file, logs and (by default) checkpoints (env NOMAD_WORKDIR)",
    )
    parser.add_argument(
        "--checkpoint-dir",
        default=env.get("NOMAD_CHECKPOINT_DIR"),
        help="where the script writes checkpoints (default WORKDIR/checkpoints)",
    )
    parser.add_argument(
        "--stop-grace",
        type=float,
        default=float(env.get("NOMAD_STOP_GRACE_S") or 30),
        help="seconds between SIGTERM and SIGKILL on stop (env NOMAD_STOP_GRACE_S)",
    )
    parser.add_argument(
        "--version", action="version", version=f"nomadgpu-agent {agent.__version__}"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s nomad-agent %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    if not args.supervisor or not args.token:
        logging.error("need --supervisor and --token (or NOMAD_SUPERVISOR_URL/NOMAD_AGENT_TOKEN)")
        return 2
    from agent.runner import Agent, Options  # imports httpx; keep --help/--version light

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    options = Options(
        supervisor_url=args.supervisor,
        token=args.token,
        workdir=workdir,
        checkpoint_dir=Path(args.checkpoint_dir).resolve()
        if args.checkpoint_dir
        else workdir / "checkpoints",
        stop_grace_s=args.stop_grace,
        gpu_timeout_s=float(os.environ.get("NOMAD_NVIDIA_SMI_TIMEOUT_S") or 10),
    )
    return Agent(options).run()


if __name__ == "__main__":
    sys.exit(main())
