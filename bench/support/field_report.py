"""The recovery bench's field-report part (issue 30): the field report's job shape on the real
stack, a host destroyed again and again, each recovery split into phases in production seconds.

Usage: ``python bench/support/field_report.py [--drills N] [--quick] [--keep]`` (``bench/
recovery.py`` runs it after its detection figures; 2 drills per configuration, about 3 min on
an idle 2-core machine, near 4 beside a test suite; ``--quick`` 1, about 70 s).

What runs: the installation of ``bench/recovery.py`` (web, worker, beat thread, sandbox), the
sandbox at one uniform time scale (``--time-scale 0.02``, no ``--fast`` clamps: every phase keeps
its proportion; a figure is wall seconds / 0.02) and its market cut to offers of 500-2,000 Mbit/s,
the provider start drawn as the market weather draws it (``--start-weather``, ``START_WEATHER``;
before 6 December the sandbox's 60-300 s triangle: the figures below are from then).
Poll, tick and heartbeat are production's times the same scale. The job is the field report's:
a 4 GB image (``--image-size``), a setup (45 s, an assumption: pip installing the QLoRA example's
requirements over an image that has torch), a command that downloads the 15 GB model through
the sandbox's metered, throttled download (``bench/support/field_job.py``; nothing when the
agent staged it), loads it (30 s, an
assumption: not published, the anatomy measures it on real hosts) and trains at 4 s a step,
writing 0.25 GB checkpoints (every 10 steps here, so drills need not wait 50).

Bytes are scaled with time: at 0.02 a 1 Gbit/s link would carry 6 GB of wall time per second,
which no CPU here moves, so the sandbox carries ``--byte-scale 0.001`` of each link's bytes and
the job sends a thousandth of them (a 15 MB model, 250 kB checkpoints): each transfer lasts what
the full bytes would, scaled. The money is priced on the full bytes, from the rented offers.

Detection is the detection part's median (``--detection-s``): at this scale the watchdog ticks
back to back and reads its clock before its provider poll. The rent and the agent's start are
our own computation, printed as measured (not divided by the scale).

Measures: each configuration is measured in its own drills, interleaved, as a ladder where each
adds one measure to the one before it (``CONFIGS``): baseline (restore after setup, the command
downloads the model); 5 overlap (the restore beside setup); 1 staged bf16 (the job's ``stage``
entries, two snapshots of a fake Hub, ``tests/support/hub_fake.py``, mirrored once into the team's
storage before the first rent; the agent lays the chosen one out in the Hugging Face cache with
the restore's ranged GETs through the sandbox's metered, throttled proxy, and the command only
loads it); 1 staged 4-bit (0.3 of the bytes), the files laid out before setup; 5 the model
download beside setup (the agent's default); 2 a machine that holds the image (another job of
the team rented while the job checkpoints, ended once its container came up; the replacement is
sent there by avoiding every other machine, as selection picks it on a tie, and its pull is
compared with that machine's own first one); 3 wait (``reboot-host`` back after 60 s, the
HOST_RETURN_CAP_S of 600 s scaled, the machine given a history of quick returns as in
``tests/e2e/test_host_return.py``: the watchdog waits, the same instance restarts on its disk,
setup, checkpoint and staged files already there; training again is read as the command's load
end plus one step, the agent's first_step mark being kept from the first start). The snapshots
are sharded (4 bf16 shards, 2 4-bit ones), each under the agent's 8 MiB ranged-GET threshold at
the byte scale: the sandbox throttles each connection, and parallel ranges would beat the link.
``--quick`` leaves out the overlap step (the default run measures it). The standby (measure 4)
is not built: its keep rule is computed from the same figures.

Measured (``--drills 2``, 3 December 2026, 2 cores shared with three helpers' tests; the
medians move with the hosts each drill draws, the provider start above all, 104-190 s;
docs/benchmarks.md has the rows): model download 92.5 s → 95.5 s staged bf16 (the same bytes over
the same link) → 26.2 s staged 4-bit; model download + setup 77.9 s → 52.7 s with the download
beside setup; image pull 24.9 s → 5.2 s on a machine that holds the image (its own first pull
46 s); host loss → training again p50 / p90 326 / 343 s baseline, 273 / 289 s with every
measure on (a move), 111 / 112 s for a host back in 60 s (measure 3); rent → first step p50
315 s → 268 s; the extra money 9.7 % of the job (the dearer $/h of the machine that held the
image; R2 $0.00004). Goals not met on a move: the bound is 204 s, and its provider start (159 s)
alone is over 90 s. The command's Python starts and the agent's word of the first step are
read in real seconds (``command_start``): scaled, they had read as 18-20 s more of "load".
Since 6 December the provider start is the market weather's calibrated draw, and issue 39's
restated goal is judged against the bound of a move to a host without the model (a standby
does not pay: its keep rule): ``--drills 5`` read a move p50 154 s = that bound 138 s + 16 s,
p90/p50 1.10 (docs/benchmarks.md has every run's rows).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.recovery import Installation, configure, p90, wait_for  # noqa: E402
from bench.recovery import median as p50  # noqa: E402
from bench.support import keep_or_remove  # noqa: E402

SCALE = 0.02  # sandbox time scale: 1 wall second = 50 production seconds
BYTE_SCALE = 0.001  # a thousandth of every byte, on links a thousandth as wide
DETECTION_S = 5.0  # half the provider poll interval: a destroyed host, confirmed by the poll
HEARTBEAT_S = 25.0  # production seconds (15 s scaled would be 0.3 s: too tight for 2 busy cores)
IMAGE = "ghcr.io/nomadgpu/field-report-qlora:bench"
GB = 1e9
IMAGE_GB, MODEL_GB, CHECKPOINT_GB = 4.0, 15.0, 0.25
FOUR_BIT_SHARE = 0.3  # a 4-bit snapshot: a quarter to a third of the bf16 bytes
# Staged snapshots as the Hub shards them (a 7B bf16 model: 4 shards of ~3.75 GB). Each scaled
# shard is under the agent's 8 MiB ranged-GET threshold, so each crosses one throttled link as
# one GET: the sandbox throttles per connection, and parallel ranges would beat the host's link.
SHARDS = {"bf16": 4, "4bit": 2}
HUB_REPOS = {"bf16": "field/qlora-base-bf16", "4bit": "field/qlora-base-4bit"}
RETURN_S = 60.0  # measure 3's drill: the rebooted host is back after this (production s)
RETURN_CAP_S = 600.0  # HOST_RETURN_CAP_S's default (production s)
SETUP_S, LOAD_S, STEP_S = 45.0, 30.0, 4.0  # production seconds (assumptions, module docstring)
FIELD_STEPS = 300  # the field report's job: 300 steps at ~4 s
CONTAINER_START_S = 5.0  # the sandbox's container start on a host that has the image
MBIT = (500, 2000)  # the host bandwidths
MARKET_COPIES = 3  # field_market: how many machines like each 1-GPU RTX 4090 offer, at least
HOURS_PER_MONTH = 730.0
R2_USD_PER_GB_MONTH = 0.015  # Cloudflare R2 standard storage; no egress fee
FIELD_INTERRUPTIONS_PER_H = 15 / (30 * 24)  # the field report: 15 in 30 days
GOALS = {"loss_to_training_p50": 90.0, "loss_to_training_p90": 180.0, "rent_to_step_p50": 150.0}
# Issue 30's goal as issue 39 restates it for a move: host loss → training again p50 within
# 30 s of the bound printed beside it, and p90 <= 1.5 x p50, on the calibrated provider start.
RESTATED_OVER_BOUND_S, RESTATED_SPREAD = 30.0, 1.5
# The provider start (created → loading) as the sandbox's market weather draws it, with none of
# its failures (``sandbox serve --start-weather``; sandbox/weather.py: a cached host 25-70 s,
# Vast's FAQ and dumont-cloud's 72.8 s; a busy host's "2-5 minutes", Vast's docs, for a fifth of
# rentals in ``typical``), the same model bench/acquisition.py rents on.
START_WEATHER = "typical"
PHASES = (
    ("detection", "detection (the detection part's)"),
    ("rent", "rent (real s)"),
    ("provider_start", "provider start"),
    ("image_pull", "image pull"),
    ("agent_start", "agent start + code (real s)"),
    ("setup", "setup"),
    ("restore", "checkpoint restore (left after setup)"),
    ("model_download", "model download"),
    ("command_start", "command start + first report (real s)"),
    ("load_first_step", "load + first step"),
)
# Phases that are our own computation, not a simulated wait: the rent (a worker task, the
# provider calls) and the agent's start (its bootstrap, Python imports, register, the code). Their
# wall seconds here would be about their seconds on a real host, so they are printed unscaled;
# divided by the scale, the three Python starts of an agent would read as minutes.
# So are the command's Python starts (the field job's, then the toy's it becomes) and the
# agent's word of the first step: scaled, 0.3 s of them read as 15 s of "load".
REAL_TIME_PHASES = frozenset({"rent", "agent_start", "command_start"})
REQUIREMENTS = {
    "gpu_names": ["RTX 4090"],
    "min_reliability": 0.98,
    "min_inet_down_mbps": MBIT[0],
    "disk_gb": 40,
    "rental": "on-demand",
}


@dataclass(frozen=True)
class FieldTiming:
    """Production's intervals at the sandbox's scale, as ``Installation`` reads them."""

    scale: float = SCALE

    @property
    def poll_s(self) -> float:
        return 10.0 * self.scale  # PROVIDER_POLL_INTERVAL_S

    @property
    def tick_s(self) -> float:
        return 5.0 * self.scale  # WATCHDOG_INTERVAL_S


@dataclass(frozen=True)
class Config:
    """One configuration of the drills: the job env the next attempt reads, which staged
    snapshot its agent downloads ("" for none: the command downloads the model), whether a
    machine that holds the image is free for the replacement, and how the host is lost."""

    key: str
    name: str
    env: dict[str, str]
    stage: str = ""
    cached: bool = False
    fault: str = "destroy"


ON = {"NOMADGPU_RESTORE_OVERLAP": "1"}
# The agent lays the model out (the command loads it), after setup: measure 1 alone.
STAGED = {**ON, "FIELD_MODEL_BYTES": "0", "NOMADGPU_STAGE_OVERLAP": "0"}
BESIDE = {**STAGED, "NOMADGPU_STAGE_OVERLAP": "1"}  # and beside setup, the agent's default
BASELINE_CONFIG = Config("baseline", "baseline", {"NOMADGPU_RESTORE_OVERLAP": "0"})
# A ladder: each configuration adds one measure to the one before it, so a phase's change from
# one column to the next is that measure's; the last move ("cached") is every measure on.
CONFIGS = (
    BASELINE_CONFIG,
    Config("overlap", "5 overlap (restore beside setup)", ON),
    Config("bf16", "1 staged model weights, bf16", STAGED, stage="bf16"),
    Config("4bit", "1 staged model weights, 4-bit", STAGED, stage="4bit"),
    Config("beside", "5 model download beside setup", BESIDE, stage="4bit"),
    Config("cached", "2 a machine that holds the image", BESIDE, stage="4bit", cached=True),
    Config("wait", "3 wait for the rebooted host", BESIDE, stage="4bit", fault="reboot"),
)
QUICK_SKIPS = frozenset({"overlap"})  # --quick: measure 5 is measured by the default run
BASELINE = BASELINE_CONFIG.env


# ---- the run -----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drills", type=int, default=2, help="drills per configuration (2)")
    parser.add_argument("--quick", action="store_true", help="1 drill per configuration")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--detection-s",
        type=float,
        default=DETECTION_S,
        help="detection in production s (bench/recovery.py passes its measured median; "
        f"default {DETECTION_S:g}: half the 10 s provider poll)",
    )
    args = parser.parse_args()
    if args.detection_s < 1.0:  # under any poll of seconds: the clock read before the poll
        print(
            f"field report: the detection part read {args.detection_s:g} s (its tick's clock is"
            f" read before its provider poll); using {DETECTION_S:g} s, half the 10 s poll",
            file=sys.stderr,
        )
        args.detection_s = DETECTION_S
    if args.quick:
        args.drills = 1
    return args


def field_market(tmp: Path, drills: int = 2) -> Path:
    """The realistic market (the sandbox's copy) cut to the issue's 500-2,000 Mbit/s, deep
    enough for DRILLS drills per configuration."""
    offers = json.loads((ROOT / "sandbox" / "market" / "offers.json").read_text())
    kept = [o for o in offers if MBIT[0] <= float(o["inet_down"]) <= MBIT[1]]
    # Only 10 of them are 1-GPU RTX 4090s and every destroy takes one off the market for good,
    # while the default run destroys 16: each is listed MARKET_COPIES times, as machines like it
    # (new ask and machine ids; the sandbox draws each one's phases on its own).
    fits = [o for o in kept if o["gpu_name"] == "RTX 4090" and int(o["num_gpus"]) == 1]
    # Each round of drills takes up to one rent per configuration (a move, the cached drill's
    # other job), plus the first rent, and a rent may race two hosts (race = "auto"): every
    # destroy, a loser's too, takes its machine off the market. With 5 drills up to 72.
    used = 2 * (drills * len(CONFIGS) + 1)
    for copy in range(1, max(MARKET_COPIES, math.ceil(used / len(fits)))):
        for o in fits:
            ask = int(o["ask_contract_id"]) + copy * 100_000_000
            machine = int(o.get("machine_id") or o["ask_contract_id"]) + copy * 100_000_000
            kept.append({**o, "id": ask, "ask_contract_id": ask, "machine_id": machine})
    path = tmp / "market-500-2000.json"
    path.write_text(json.dumps(kept))
    FIELD_MARKET[:] = [path]
    return path


def sandbox_flags(tmp: Path, drills: int = 2) -> tuple[str, ...]:
    market = field_market(tmp, drills)
    return (
        *("--time-scale", str(SCALE), "--byte-scale", str(BYTE_SCALE)),
        *("--image-size", f"{IMAGE}={int(IMAGE_GB * GB)}", "--market", str(market)),
        # On-demand rentals: no other tenants, a still min_bid; rate limits are real seconds.
        *("--outbid-rate-per-h", "0", "--min-bid-step-pct", "0", "--relaxed-rate-limits"),
        # Measure 2's drill wants the image found; selection prices the 0.2 wipe guess anyway.
        *("--image-wipe-chance", "0"),
        *(("--start-weather", START_WEATHER) if START_WEATHER else ()),
    )


def job_env(measure_env: dict[str, str]) -> dict[str, str]:
    return {
        "TOY_STEPS": "1000000",
        "TOY_CHECKPOINT_EVERY": "10",
        "TOY_STEP_SECONDS": f"{STEP_S * SCALE:.4f}",
        "TOY_WEIGHTS_KB": str(int(CHECKPOINT_GB * GB * BYTE_SCALE / 1000)),
        "FIELD_MODEL_BYTES": str(int(MODEL_GB * GB * BYTE_SCALE)),
        "FIELD_LOAD_S": f"{LOAD_S * SCALE:.4f}",
        **measure_env,
    }


def hub_repos():
    """The fake Hub's two snapshots of the field report's model (``tests/support/hub_fake.py``):
    bf16 and 4-bit, sharded, at the bench's byte scale (random bytes: nothing compresses them)."""
    import os

    from tests.support import hub_fake

    repos = {}
    for kind, repo in HUB_REPOS.items():
        gb = MODEL_GB * (FOUR_BIT_SHARE if kind == "4bit" else 1.0)
        shard = int(gb * GB * BYTE_SCALE / SHARDS[kind])
        files = {
            f"model-{i + 1:05d}-of-{SHARDS[kind]:05d}.safetensors": os.urandom(shard)
            for i in range(SHARDS[kind])
        }
        files["config.json"] = b'{"model_type": "qwen2"}'
        repos[repo] = hub_fake.Repo(files=files)
    return hub_fake.FakeHub(repos=repos)


def submit_field_job():
    """The field report's job, staging both snapshots (mirrored once into the team's storage
    before its first rent); each configuration then hands its agent one of them, or none."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from jobs import lifecycle
    from nomadgpu.models import Team

    team = Team.objects.create(name="field", slug="field")
    job = lifecycle.submit_job(
        team=team,
        created_by=get_user_model().objects.create_user("field"),
        now=timezone.now(),
        name="field report shape",
        image=IMAGE,
        setup=f"sleep {SETUP_S * SCALE:.3f}",
        command=f"{sys.executable} {ROOT}/bench/support/field_job.py",
        env=job_env(BASELINE),
        total_steps=1_000_000,
        heartbeat_interval_s=HEARTBEAT_S * SCALE,
        requirements=REQUIREMENTS,
        profile={"image_gb": IMAGE_GB, "model_gb": MODEL_GB, "upload_gb": CHECKPOINT_GB},
        stage=[{"hf": repo, "revision": "main"} for repo in HUB_REPOS.values()],
    )
    staged = wait_for(
        lambda: type(job).objects.filter(pk=job.pk, stage_state="ready").first(),
        timeout=60,
        what="the job's stage entries mirrored",
        every=0.01,
    )
    # Before its first host registers (the provider start alone is seconds here): the first
    # rental is the baseline's, the command downloading the model.
    objects = {o.repo: o for o in staged.staged_objects.all()}
    staged.staged_objects.set([])
    return staged, {kind: objects[repo] for kind, repo in HUB_REPOS.items()}


@dataclass
class Recovery:
    """One drill's phases (production s) and what its replacement cost."""

    config: str
    phases: dict[str, float]
    total_s: float
    rent_to_step_s: float
    dph: float
    download_usd_per_gb: float
    image_source: str = ""
    first_pull_s: float | None = None  # measure 2: the same machine's pull for the other job
    mbit: float = 0.0  # the replacement's download link


def sandbox_moments(sandbox, instance_id: int) -> dict[str, float]:
    info = sandbox.debug(instance_id)
    events = {}
    for event in info["events"]:
        events.setdefault(event["kind"], event["ts"])
    marks = json.loads((Path(info["scratch"]) / "field_phases.json").read_text())
    return {"loading": events["loading"], "running": events["running"], **marks}


def wait_first_step(attempt_id: int):
    from jobs.models import Attempt

    return wait_for(
        lambda: Attempt.objects.filter(pk=attempt_id, first_step_at__isnull=False).first(),
        timeout=120,
        what="the first step on a rented host",
    )


def scaled(key: str, wall_s: float) -> float:
    """WALL_S of phase KEY in production seconds (REAL_TIME_PHASES as measured)."""
    return max(wall_s, 0.0) / (1.0 if key in REAL_TIME_PHASES else SCALE)


def host_phases(sandbox, r) -> dict[str, float]:
    """A rented host's phases, production s: provider start (rented → loading), image pull
    (→ running), agent start + code (→ code in place), then the staged files (→ stage done,
    counted as model download), setup, the restore left after it, the command's own model
    download (→ downloaded) and load + first step. They add up to rent → first step."""
    at = sandbox_moments(sandbox, r.instance_id)
    ts = {
        "rented": r.rented_at.timestamp(),
        "code": r.workdir_ready_at.timestamp(),
        "staged": (r.stage_done_at or r.workdir_ready_at).timestamp(),
        "setup": r.setup_done_at.timestamp(),
        "first_step": r.first_step_at.timestamp(),
    }
    # The staged files download beside setup: the one that ended first counts from the code,
    # the other what it added after (jobs.anatomy.side_by_side), so the phases still add up.
    both = max(ts["staged"], ts["setup"])
    first = min(ts["staged"], ts["setup"])
    staged_s = ts["staged"] - (ts["code"] if ts["staged"] <= ts["setup"] else first)
    setup_s = ts["setup"] - (ts["code"] if ts["setup"] < ts["staged"] else first)
    restored = max((r.restore_unpacked_at or r.setup_done_at).timestamp(), both)
    stepped = at["loaded"] + STEP_S * SCALE  # the toy's first step, as the wait drill reads it
    return {
        "provider_start": scaled("provider_start", at["loading"] - ts["rented"]),
        "image_pull": scaled("image_pull", at["running"] - at["loading"]),
        "agent_start": scaled("agent_start", ts["code"] - at["running"]),
        "setup": scaled("setup", setup_s),
        "restore": scaled("restore", restored - both),
        "model_download": scaled("model_download", staged_s)
        + scaled("model_download", at["model_downloaded"] - at["command"]),
        "command_start": scaled("command_start", at["command"] - restored)
        + scaled("command_start", ts["first_step"] - stepped),
        "load_first_step": scaled("load_first_step", stepped - at["model_downloaded"]),
    }


def rent_to_step(sandbox, r) -> float:
    return sum(host_phases(sandbox, r).values())


def recovery_of(
    config: str, sandbox, broken_at: datetime, interruption, r, detection_s: float
) -> Recovery:
    """The drill's phases: broken, detected, rented, then the replacement's host phases.

    Detection is DETECTION_S (production s), not this drill's: at this scale the watchdog
    ticks back to back and a tick's clock is read before its provider poll, so a loss reads as
    detected the moment it happened. The detection part measures it at its own scale."""
    host = host_phases(sandbox, r)
    rent = scaled("rent", (r.rented_at - interruption.detected_at).total_seconds())
    phases = {"detection": detection_s, "rent": rent, **host}
    return Recovery(
        config=config,
        phases=phases,
        total_s=sum(phases.values()),
        rent_to_step_s=sum(host.values()),
        dph=r.dph_base,
        download_usd_per_gb=r.download_usd_per_gb,
        image_source=sandbox.debug(r.instance_id)["image_source"] or "",
        mbit=float(r.decision["chosen"]["offer"].get("inet_down_mbps") or 0.0),
    )


def run_elsewhere(job):
    """Measure 2's set-up: another job of the team, rented now on the machine the replacement
    would rent (the cheapest free one, as selection picks); ``let_go`` ends it once its
    container came up, so that machine holds the image."""
    from django.utils import timezone

    from jobs import lifecycle

    return lifecycle.submit_job(
        team=job.team,
        created_by=job.created_by,
        now=timezone.now(),
        name="ran here before",
        image=IMAGE,
        command="sleep 600",
        env={},
        total_steps=job.total_steps,  # ranked as the job is: by its hours, not one step
        heartbeat_interval_s=HEARTBEAT_S * SCALE,
        requirements=REQUIREMENTS,
        profile=job.profile,
    )


def let_go(other, sandbox) -> tuple[int, float]:
    """End OTHER once its container came up; its machine and its image pull there (rent to
    container up, production s)."""
    from django.utils import timezone

    from jobs import lifecycle

    # Its agent's first call: the container came up, so the team's history says "pulled here".
    attempt = wait_for(
        lambda: other.attempts.filter(registered_at__isnull=False).first(),
        timeout=60,
        what="the other job's agent up",
    )
    lifecycle.cancel_job(other.pk, now=timezone.now(), by="the bench")
    wait_for(
        lambda: sandbox.debug(attempt.instance_id)["destroyed_by"],
        timeout=30,
        what="the other job's machine free",
    )
    at = {}
    for event in sandbox.debug(attempt.instance_id)["events"]:
        at.setdefault(event["kind"], event["ts"])
    return attempt.machine_id, scaled("image_pull", at["running"] - at["loading"])


def drill(job, sandbox, config: Config, detection_s: float) -> Recovery:
    """Destroy the job's host once it shipped a checkpoint; wait for the first step after."""
    from django.utils import timezone

    from bench.recovery import ready_to_break
    from jobs.models import Interruption

    other = run_elsewhere(job) if config.cached else None  # rents while the job checkpoints
    attempt = wait_for(lambda: ready_to_break(job), timeout=120, what="a checkpointed host")
    first_pull = None
    if other is not None:
        machine, first_pull = let_go(other, sandbox)
        # Every other machine avoided: the replacement lands where the team's other job ran, as
        # selection would pick it on a tie (tests/e2e/test_image_cached_replacement.py); on this
        # market a cheaper $/h outweighs a saved pull, so it would seldom pick it unaided.
        others = sorted(set(market_machines()) - {machine})
        type(job).objects.filter(pk=job.pk).update(avoid_machine_ids=others)
    broken_at = timezone.now()
    sandbox.inject(attempt.instance_id, "destroy")

    def replaced():
        row = Interruption.objects.filter(attempt=attempt).first()
        return row if row is not None and row.replacement_id else None

    row = wait_for(replaced, timeout=120, what="a replacement running")
    replacement = wait_first_step(row.replacement_id)
    # Destroyed asks leave the market for good, and the avoid list would too: forgotten.
    type(job).objects.filter(pk=job.pk).update(avoid_machine_ids=[])
    recovery = recovery_of(config.key, sandbox, broken_at, row, replacement, detection_s)
    recovery.first_pull_s = first_pull
    return recovery


def market_machines() -> list[int]:
    offers = json.loads(FIELD_MARKET[0].read_text())
    return [int(o.get("machine_id") or o["ask_contract_id"]) for o in offers]


FIELD_MARKET: list[Path] = []  # the market file this run's sandbox serves (field_market)


@dataclass
class Return:
    """Measure 3's drill: the host rebooted and came back; the same instance trains again.
    Phases in production s, from the break."""

    phases: dict[str, float]
    total_s: float
    attempts: int


def wait_drill(job, sandbox, detection_s: float) -> Return:
    """``reboot-host`` back after RETURN_S: the watchdog waits (the machine has a history of
    quick returns, as ``tests/e2e/test_host_return.py`` gives it), the container restarts on
    the same disk, the agent resumes from the checkpoint there; training again is the
    command's load end plus one step (the agent's first_step mark is kept from the first
    start)."""
    from django.utils import timezone

    from bench.recovery import ready_to_break
    from hosts.models import Machine
    from jobs.models import Interruption, JobEvent

    attempt = wait_for(lambda: ready_to_break(job), timeout=120, what="a checkpointed host")
    Machine.objects.filter(machine_id=attempt.machine_id).update(
        offline_returns=20, offline_return_s=20 * RETURN_S * SCALE, offline_never=0
    )
    attempts = job.attempts.count()
    last_event = JobEvent.objects.filter(job=job).order_by("-pk").values_list("pk", flat=True)[0]
    broken_at = timezone.now()
    sandbox.inject(attempt.instance_id, "reboot-host", RETURN_S * SCALE)
    scratch = Path(sandbox.debug(attempt.instance_id)["scratch"])

    def restarted():
        if Interruption.objects.filter(attempt=attempt).exists():
            raise SystemExit("field report: the watchdog moved the job instead of waiting")
        try:
            marks = json.loads((scratch / "field_phases.json").read_text())
        except (OSError, ValueError):
            return None
        return marks if marks["command"] > broken_at.timestamp() else None

    marks = wait_for(restarted, timeout=120, what="the command again on the same host")
    # (By pk: a tick dates its events from its clock, read before its provider poll.)
    since = JobEvent.objects.filter(job=job, pk__gt=last_event)
    if not since.filter(kind="host_offline", data__wait=True).exists():
        seen = "; ".join(e.message for e in since)
        raise SystemExit(f"field report: no wait was chosen for the rebooted host: {seen}")
    info = sandbox.debug(attempt.instance_id)
    events = [e for e in info["events"] if e["ts"] > broken_at.timestamp()]
    back = next(e["ts"] for e in events if e["kind"] == "host back online")
    running = next(e["ts"] for e in events if e["kind"] == "running" and e["ts"] >= back)
    stamps = {
        "broken": broken_at.timestamp(),
        "back": back,
        "running": running,
        "command": marks["command"],
        "downloaded": marks["model_downloaded"],
        "stepped": marks["loaded"] + STEP_S * SCALE,
    }
    phases = {
        "offline": scaled("offline", stamps["back"] - stamps["broken"]),
        "restart": scaled("restart", stamps["running"] - stamps["back"]),
        "agent_start": scaled("agent_start", stamps["command"] - stamps["running"]),
        "model_download": scaled("model_download", stamps["downloaded"] - stamps["command"]),
        "load_first_step": scaled("load_first_step", stamps["stepped"] - stamps["downloaded"]),
    }
    return Return(phases, sum(phases.values()), job.attempts.count() - attempts)


def switch(job, config: Config, staged: dict) -> None:
    """The next attempt's job env (the agent reads it at register) and staged snapshot."""
    type(job).objects.filter(pk=job.pk).update(env=job_env(config.env))  # whole: no leftovers
    job.staged_objects.set([staged[config.stage]] if config.stage else [])
    job.refresh_from_db()


@dataclass
class Run:
    first_rent_to_step_s: float
    by_config: dict[str, list[Recovery]] = field(default_factory=dict)
    returns: list[Return] = field(default_factory=list)
    staged_bytes: dict[str, int] = field(default_factory=dict)

    def all(self) -> list[Recovery]:
        return [r for rows in self.by_config.values() for r in rows]


def run_drills(installation, drills: int, detection_s: float, *, quick: bool = False) -> Run:
    from django.conf import settings
    from django.utils import timezone

    from jobs import lifecycle
    from tests.support import hub_fake

    settings.HOST_RETURN_CAP_S = RETURN_CAP_S * SCALE
    with hub_fake.running(hub_repos()) as hub:
        settings.HF_ENDPOINT = hub.url
        job, staged = submit_field_job()
    first = wait_for(
        # The first attempt that got to a step (on 2 busy cores a first host can miss its
        # scaled heartbeats before its first step and be replaced: that one never steps).
        lambda: job.attempts.filter(first_step_at__isnull=False).order_by("number").first(),
        timeout=180,
        what="the job's first step",
    )
    run = Run(first_rent_to_step_s=rent_to_step(installation.sandbox, first))
    run.staged_bytes = {kind: obj.bytes_total for kind, obj in staged.items()}
    # Interleaved, not one block per configuration: selection rents the cheapest host left and
    # every destroy takes one off the market, so a block would meet slower hosts than the last.
    configs = [c for c in CONFIGS if not (quick and c.key in QUICK_SKIPS)]
    for i in range(drills):
        for config in configs:
            switch(job, config, staged)
            if config.fault == "reboot":
                run.returns.append(wait_drill(job, installation.sandbox, detection_s))
            else:
                recovery = drill(job, installation.sandbox, config, detection_s)
                run.by_config.setdefault(config.key, []).append(recovery)
            print(f"field report: {config.key} drill {i + 1}/{drills} recovered", file=sys.stderr)
    lifecycle.cancel_job(job.pk, now=timezone.now(), by="the bench")
    return run


# ---- figures -----------------------------------------------------------------------------------


def market_standby_usd_per_h() -> tuple[float, float]:
    """The interruptible min_bid of a 1-GPU RTX 4090 at 500-2,000 Mbit/s, reliability >= 0.98:
    the cheapest and the median (what a standby rented at min_bid pays per hour)."""
    offers = json.loads((ROOT / "sandbox" / "market" / "offers.json").read_text())
    bids = sorted(
        float(o["min_bid"])
        for o in offers
        if o["gpu_name"] == "RTX 4090"
        and int(o["num_gpus"]) == 1
        and float(o["reliability"]) >= 0.98
        and MBIT[0] <= float(o["inet_down"]) <= MBIT[1]
    )
    return bids[0], statistics.median(bids)


@dataclass(frozen=True)
class JobCost:
    usd: float
    dph: float
    download_usd_per_gb: float
    hours: float


def job_cost(run: Run) -> JobCost:
    """The field report's job on the hosts this run rented: GPU hours for 300 steps and one
    start (rent → first step), and its image and model download at their $/GB."""
    rows = run.all()
    dph = p50([r.dph for r in rows])
    per_gb = p50([r.download_usd_per_gb for r in rows])
    hours = (FIELD_STEPS * STEP_S + run.first_rent_to_step_s) / 3600
    return JobCost(dph * hours + (IMAGE_GB + MODEL_GB) * per_gb, dph, per_gb, hours)


def phase_table(run: Run) -> list[str]:
    names = list(run.by_config)
    lines = ["phase medians, production s: " + " | ".join(names)]
    for key, label in PHASES:
        cells = [f"{p50([r.phases[key] for r in run.by_config[n]]):7.1f}" for n in names]
        lines.append(f"  {label:<40} " + " ".join(cells))
    for label, pick in (("host loss → training again p50", p50), ("p90", p90)):
        cells = [f"{pick([r.total_s for r in run.by_config[n]]):7.1f}" for n in names]
        lines.append(f"  {label:<40} " + " ".join(cells))
    cells = [f"{p50([r.rent_to_step_s for r in run.by_config[n]]):7.1f}" for n in names]
    lines.append(f"  {'replacement rent → first step p50':<40} " + " ".join(cells))
    return lines


def median_phases(rows: list[Recovery]) -> dict[str, float]:
    return {key: p50([r.phases[key] for r in rows]) for key, _ in PHASES}


def model_bytes_s(run: Run, rows: list[Recovery]) -> float:
    """The staged 4-bit weights at the replacement's advertised link (p50 of ROWS): the least a
    move to a host that does not hold them can take to get them, in production seconds."""
    gb = run.staged_bytes["4bit"] / BYTE_SCALE / GB
    mbit = p50([r.mbit for r in rows])
    return gb * GB * 8 / (mbit * 1e6) if mbit > 0 else 0.0


def standby_bound(m: dict[str, float]) -> float:
    """Host loss → training again with no failure and perfect knowledge, on a host that already
    holds the image and the model (a standby, measure 4, or the same host back, measure 3)."""
    loss = m["detection"] + m["rent"] + m["provider_start"] + CONTAINER_START_S
    return loss + m["restore"] + m["command_start"] + m["load_first_step"]


def bounds(run: Run) -> list[str]:
    """What no failure and perfect knowledge would give a fresh rental: image and model already
    on the host (a standby), or the image alone (a move to a machine that holds it, setup
    hidden behind the download: the model's bytes at the link are what is left); nothing
    wasted; and what blocks it."""
    rows = run.all()
    m = median_phases(rows)
    loss = standby_bound(m)
    model_s = model_bytes_s(run, run.by_config["cached"])
    fresh = loss + model_s
    rent = m["provider_start"] + CONTAINER_START_S + m["command_start"] + m["load_first_step"]
    blocker = (
        f"provider start {m['provider_start']:.0f} s (Vast's scheduling, 2-5 min) is not ours to "
        "shorten: only a host already running (a standby, measure 4; the same host back, "
        "measure 3) goes under it"
    )
    return [
        f"bound, host loss → training again: {loss:.0f} s = detection + rent + provider start"
        f" + container start + restore + load/first step (goal 90 s); {blocker}",
        f"bound, a move to a host without the model (no standby): {fresh:.0f} s = the bound above"
        f" + the 4-bit weights at the host's link ({model_s:.0f} s); the restated goal is judged"
        " against it, since a standby does not pay here (its keep rule below)",
        f"bound, rent → first step: {rent:.0f} s = provider start + container start + load/first"
        " step (goal 150 s)",
    ]


def restated_goal(run: Run) -> list[str]:
    """Issue 30's goal restated (``RESTATED_*``) on the move with every measure on, against the
    bound of a move to a host without the model (``bounds``, the same medians): with no
    standby, perfect knowledge still has to move the model's bytes. PASS or FAIL."""
    rows = run.by_config["cached"]
    m = median_phases(run.all())
    bound = standby_bound(m) + model_bytes_s(run, rows)
    moves = [r.total_s for r in rows]
    over, spread = p50(moves) - bound, p90(moves) / p50(moves)
    ok = over <= RESTATED_OVER_BOUND_S and spread <= RESTATED_SPREAD
    start = f"--start-weather {START_WEATHER}" if START_WEATHER else "the sandbox's triangle"
    lines = [
        f"{'PASS' if ok else 'FAIL'} issue 30 restated (a move, every measure on, provider start"
        f" from {start}): host loss → training again p50 {p50(moves):.0f} s = bound without"
        f" a standby {bound:.0f} s + {over:.0f} s (goal <= +{RESTATED_OVER_BOUND_S:g} s),"
        f" p90/p50 {spread:.2f} (goal <= {RESTATED_SPREAD:g}); {len(moves)} moves"
    ]
    mine = median_phases(rows)
    gap = ", ".join(
        f"{label} {mine[key]:.0f} s"
        for key, label in (
            ("image_pull", "image pull"),
            ("setup", "setup (45 s assumed: a pip install)"),
            ("model_download", "model download"),
        )
    )
    lines.append(
        "  what separates the move from its bound: its provider start"
        f" {mine['provider_start']:.0f} s against the bound's median {m['provider_start']:.0f} s"
        f" (each drill draws its own: {len(rows)} drills), and on the new host {gap}, where"
        f" the bound has the model's bytes at the link ({model_bytes_s(run, rows):.0f} s)"
    )
    return lines


def measure_lines(run: Run, cost: JobCost) -> list[str]:
    """Each measure's phase before and after it (the ladder's column before, then its own)."""
    by = run.by_config

    def med(key: str, phase: str) -> float:
        return p50([r.phases[phase] for r in by[key]])

    def loss(key: str) -> str:
        totals = [r.total_s for r in by[key]]
        return f"{p50(totals):.0f} s (p90 {p90(totals):.0f})"

    def rent(key: str) -> float:
        return p50([r.rent_to_step_s for r in by[key]])

    def link(key: str) -> str:
        return f"{p50([r.mbit for r in by[key]]):.0f} Mbit/s"

    gb = {k: v / BYTE_SCALE / GB for k, v in run.staged_bytes.items()}
    before = "overlap" if "overlap" in by else "baseline"
    out = []
    for key in ("bf16", "4bit"):
        out.append(
            f"measure 1 (staged {key}, {gb[key]:.1f} GB in {SHARDS[key]} shards, vs {before}):"
            f" model download p50 {med(before, 'model_download'):.1f} s at {link(before)} →"
            f" {med(key, 'model_download'):.1f} s at {link(key)}; host loss → training again"
            f" {loss(before)} → {loss(key)}; rent → first step {rent(before):.0f} →"
            f" {rent(key):.0f} s"
        )
    out.append(
        f"measure 5 (model download beside setup, vs 4bit): model download + setup p50"
        f" {med('4bit', 'model_download') + med('4bit', 'setup'):.1f} →"
        f" {med('beside', 'model_download') + med('beside', 'setup'):.1f} s; host loss →"
        f" training again {loss('4bit')} → {loss('beside')}; rent → first step"
        f" {rent('4bit'):.0f} → {rent('beside'):.0f} s"
    )
    found = sum(r.image_source == "machine" for r in by["cached"])
    same = p50([r.first_pull_s for r in by["cached"] if r.first_pull_s is not None])
    out.append(
        f"measure 2 (a machine that holds the image, vs beside): image pull p50"
        f" {med('beside', 'image_pull'):.1f} → {med('cached', 'image_pull'):.1f} s (the same"
        f" machine's own first pull {same:.1f} s; {found} of {len(by['cached'])} replacements"
        f" found it there); host loss → training again {loss('beside')} → {loss('cached')};"
        f" rent → first step {rent('beside'):.0f} → {rent('cached'):.0f} s"
    )
    if run.returns:
        totals = [r.total_s for r in run.returns]
        parts = ", ".join(
            f"{label} {p50([r.phases[k] for r in run.returns]):.1f}"
            for k, label in (
                ("offline", "offline"),
                ("restart", "host restart + container start"),
                ("agent_start", "agent start + setup/restore on disk (real s)"),
                ("model_download", "model on disk"),
                ("load_first_step", "load + first step"),
            )
        )
        out.append(
            f"measure 3 (wait: reboot-host back in {RETURN_S:g} s, cap {RETURN_CAP_S:g} s, the"
            f" measures of 1-2 on): host loss → training again p50 {p50(totals):.0f} s, p90"
            f" {p90(totals):.0f} s on the same instance ({parts};"
            f" {sum(r.attempts for r in run.returns)} new rents); a destroy beside it"
            f" {loss('cached')}; a return after R s reads ~R + {p50(totals) - RETURN_S:.0f} s"
        )
    return out


def all_on_lines(run: Run, cost: JobCost) -> list[str]:
    """Every measure on (the ladder's last move, and the host that comes back) vs the goals,
    and the extra money they cost on the field report's job."""
    moves = [r.total_s for r in run.by_config["cached"]]
    rents = [r.rent_to_step_s for r in run.by_config["cached"]]
    returns = [r.total_s for r in run.returns]
    four_bit_gb = run.staged_bytes["4bit"] / BYTE_SCALE / GB
    month = four_bit_gb * R2_USD_PER_GB_MONTH
    storage = month * cost.hours / HOURS_PER_MONTH  # R2 bills GB-months pro rata
    starts = 1 + FIELD_INTERRUPTIONS_PER_H * cost.hours  # the first and the expected moves
    saved = (MODEL_GB - four_bit_gb) * cost.download_usd_per_gb * starts
    others = [r.dph for key, rows in run.by_config.items() if key != "cached" for r in rows]
    dearer = max(p50([r.dph for r in run.by_config["cached"]]) - p50(others), 0.0)
    extra = storage + dearer * cost.hours
    net = extra - saved
    wait = (
        f"; a host back within the cap p50 {p50(returns):.0f} s, p90 {p90(returns):.0f} s"
        if returns
        else ""
    )
    return [
        f"all measures on (1 4-bit + 2 + 3 + 5): a move p50 {p50(moves):.0f} s (goal 90), p90"
        f" {p90(moves):.0f} s (goal 180){wait}; rent → first step p50 {p50(rents):.0f} s (goal"
        f" 150; first rental {run.first_rent_to_step_s:.0f} s, no measure)",
        f"  extra money all on: ${extra:.4f} a job (R2 {four_bit_gb:.1f} GB 4-bit for the job's"
        f" {cost.hours:.2f} h ${storage:.5f}, ${month:.4f} if kept a month; the machine that"
        f" held the image ${dearer:.3f}/h over the other moves' median:"
        f" ${dearer * cost.hours:.4f}) ="
        f" {extra / cost.usd:.1%} of the job's ${cost.usd:.3f} (goal <= 10 %); the 4-bit bytes"
        f" save ${saved:.4f} of traffic over {starts:.2f} starts: net ${net:+.4f}",
    ]


def costs(run: Run, cost: JobCost) -> list[str]:
    four_bit_gb = MODEL_GB / 4
    staged_month = MODEL_GB * R2_USD_PER_GB_MONTH
    lines = [
        f"the field report's job here: ${cost.usd:.3f} (${cost.dph:.3f}/h x {cost.hours:.2f} h"
        f" + {IMAGE_GB + MODEL_GB:.0f} GB in at ${cost.download_usd_per_gb:.4f}/GB);"
        " 10 % = ${:.3f}".format(cost.usd * 0.1),
        "cost of measure 5 (overlap): $0 (no traffic, no storage, no standby); it saves the "
        "GPU seconds of the restore and the download it hides (here setup is a sleep: a pip "
        "install beside the download would share the host's link with it)",
        f"cost of measure 1 (staged): storage ${staged_month:.3f}/month for 15 GB in R2"
        f" (${four_bit_gb * R2_USD_PER_GB_MONTH:.3f} as 4-bit), egress $0; Vast still bills the"
        f" bytes in: 4-bit saves ${(MODEL_GB - four_bit_gb) * cost.download_usd_per_gb:.4f}"
        f" a start; within 10 % of the job once {staged_month / (cost.usd * 0.1):.1f} jobs a"
        " month share the bf16 copy",
        "cost of measure 2 (cached hosts): $0 extra traffic (less: no pull, no download); it may "
        "pick a dearer $/h host, which selection prices",
        "cost of measure 3 (wait): $0 while offline (Vast bills no GPU or storage then); the "
        "wait's time is priced against the move's start-up",
    ]
    return lines


def standby_rule(run: Run, cost: JobCost) -> list[str]:
    """Measure 4's keep rule on this run's figures: interruptions/h x jobs of the class x
    downtime saved x their $/h, against the standby's $/h at the market's min_bid."""
    rows = run.all()
    m = median_phases(rows)
    with_standby = m["detection"] + m["restore"] + m["command_start"] + m["load_first_step"]
    saved_h = max(p50([r.total_s for r in rows]) - with_standby, 0.0) / 3600
    cheapest, typical = market_standby_usd_per_h()
    rate = FIELD_INTERRUPTIONS_PER_H  # the team's, all its jobs of this class together
    savings = rate * saved_h * cost.dph
    pays = savings > cheapest
    breakeven = cheapest / (saved_h * cost.dph) if saved_h else float("inf")
    return [
        f"measure 4 (standby, not built): keep rule {rate:.4f} interruptions/h (field report: 15"
        f" in 30 days, all jobs of the class) x {saved_h * 3600:.0f} s saved x ${cost.dph:.3f}/h"
        f" = ${savings:.5f}/h of savings against ${cheapest:.3f}/h (cheapest min_bid; median"
        f" ${typical:.3f}/h): {'pays' if pays else 'does not pay'}"
        f" ({savings / cheapest:.4f} of its cost); it pays at {breakeven:.1f} interruptions/h",
        f"  with a standby, host loss → training again would be ~{with_standby:.0f} s (detection"
        " + restore + load/first step): under the 90 s goal, at that price",
    ]


def report(run: Run) -> None:
    rows = run.all()
    cost = job_cost(run)
    print(
        f"recovery bench, field report part: sandbox time scale {SCALE:g} (wall / {SCALE:g} ="
        f" production s), bytes x {BYTE_SCALE:g}; {len(rows)} destroy drills; "
        f"{IMAGE_GB:g} GB image, {MODEL_GB:g} GB model, {CHECKPOINT_GB:g} GB checkpoints, "
        f"setup {SETUP_S:g} s, load {LOAD_S:g} s (assumed); hosts {MBIT[0]}-{MBIT[1]} Mbit/s"
    )
    print("\n".join(phase_table(run)))
    print("\n".join(measure_lines(run, cost)))
    print("\n".join(all_on_lines(run, cost)))
    every = [r.total_s for r in rows]
    print(
        f"  all {len(rows)} moves: p50 {p50(every):.0f} s, p90 {p90(every):.0f} s (compare"
        " configurations by phase: each drill rents the cheapest host left, so later drills of"
        " a run meet slower ones)"
    )
    print("\n".join(bounds(run)))
    print("\n".join(restated_goal(run)))
    print("\n".join(costs(run, cost)))
    print("\n".join(standby_rule(run, cost)))
    print(overlap_verdict(run, cost))


def overlap_verdict(run: Run, cost: JobCost) -> str:
    """Measure 5 on the phases it touches (setup and the restore left after it): the totals
    also carry each drill's own provider start draw, which a few drills do not average out."""
    overlap, base = run.by_config.get("overlap"), run.by_config["baseline"]
    if not overlap:
        return "measure 5: not measured"

    def touched(rows: list[Recovery]) -> float:
        return p50([r.phases["setup"] + r.phases["restore"] for r in rows])

    before, after = touched(base), touched(overlap)
    gain = before - after
    usd = gain / 3600 * cost.dph
    verdict = "pays" if gain > 0 else "does not pay in this run"
    return (
        f"measure 5 (overlap) {verdict}: setup + restore p50 {before:.1f} → {after:.1f} s,"
        f" {gain:.1f} s less downtime per recovery (${usd:.5f} of GPU time) at $0; the restore"
        f" of a {CHECKPOINT_GB:g} GB checkpoint is short beside setup, so the gain is that restore"
    )


def main() -> int:
    args = parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nomadgpu-field-bench-"))
    configure(tmp)
    flags = sandbox_flags(tmp, args.drills)
    installation = Installation(tmp, FieldTiming(), sandbox_flags=flags)
    try:
        installation.start()
        report(run_drills(installation, args.drills, args.detection_s, quick=args.quick))
    finally:
        installation.stop()
        keep_or_remove(tmp, keep=args.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
