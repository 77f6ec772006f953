"""The anatomy of a recovery: where an interruption's downtime went, and the work it cost.

``breakdown`` splits the time from the lost host's last heartbeat to the first training step on
its replacement into phases, each ending at one moment:

- **detection**: last heartbeat → the loss detected (``Interruption.detected_at``);
- **renting**: → the replacement rented (``Attempt.rented_at`` of the attempt that ran again);
- **provider start-up**: → its container up (image pull and start; the bootstrap's first line,
  else the agent's first call);
- **agent bootstrap**: → the agent's dependencies installed (the bootstrap's report, else the
  agent's start), plus, when no checkpoint was restored, the agent's start until the command;
- **code**: → the job's code fetched and unpacked, or cloned (``workdir_ready``);
- **model download**: → the staged model files downloaded from the team's storage and laid
  out in the Hugging Face cache (``stage_done``; jobs.staging);
- **setup**: → the job's setup finished (``setup_done``). It runs while the model downloads:
  of the two, the one that ended first counts from the code, the other what it added after
  (``side_by_side``);
- **checkpoint download**: → the resume checkpoint's last byte (the agent's download, start
  and first call after the dependencies, a second or two, count here too);
- **unpack**: → unpacked (it overlaps the download: this is what is left after the last byte),
  plus the short wait until the command started;
- **first step**: → the first step reported on the replacement.

A moment not known (an older agent, no checkpoint to restore) leaves its phase ``None`` and the
next phase starts at the last moment that is known, and a moment reported after the first step
counts as the first step, so the known phases always add up to the whole downtime: "training
again" (``jobs.recovery_times``), from the same loss to the same first step. Lost work: the
steps done again (reached on the lost host minus resumed from), at the replacement's seconds
per step and its GPU price. The step reached is the last heartbeat's:
a checkpoint written after it resumes the job past it, and nothing is lost (the page says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from jobs.models import Attempt, Interruption
from nomadgpu.humanize import duration

PHASES: tuple[tuple[str, str], ...] = (
    ("detection", "Detection"),
    ("renting", "Renting"),
    ("provider_startup", "Provider start-up"),
    ("agent_bootstrap", "Agent bootstrap"),
    ("code", "Code"),
    ("stage", "Model download"),
    ("setup", "Setup"),
    ("checkpoint_download", "Checkpoint download"),
    ("unpack", "Unpack"),
    ("first_step", "First step"),
)
PHASE_LABELS = dict(PHASES)


def replacement_of(interruption: Interruption) -> Attempt | None:
    """The attempt that ran again after INTERRUPTION (None while it has not, or for rows
    recorded before the replacement was kept)."""
    return interruption.replacement if interruption.replacement_id else None


def boundaries(i: Interruption, r: Attempt | None) -> list[tuple[str | None, datetime | None]]:
    """(phase that ends here, moment) in order; a None phase extends the one before it."""
    if r is None:
        return [("detection", i.detected_at), ("renting", i.replacement_rented_at)]
    return [
        ("detection", i.detected_at),
        ("renting", r.rented_at),
        ("provider_startup", r.container_started_at),
        ("agent_bootstrap", r.deps_ready_at),
        ("code", r.workdir_ready_at),
        *side_by_side(("stage", r.stage_done_at), ("setup", r.setup_done_at)),
        ("checkpoint_download", r.restore_downloaded_at),
        ("unpack", r.restore_unpacked_at),
        (None, r.command_started_at or r.running_at),
        ("first_step", r.first_step_at),
    ]


def side_by_side(*ends: tuple[str, datetime | None]) -> list[tuple[str, datetime | None]]:
    """Phases that ran at once (the agent downloads the staged model while setup runs), in the
    order they ended: the first counts from the phase before them, each later one only what it
    added after the one before it ended, so the phases still add up to the downtime."""
    return sorted(ends, key=lambda end: (end[1] is None, end[1] or datetime.min))


def phase_seconds(start: datetime | None, ends) -> dict[str, float | None]:
    """Seconds per phase from START along ENDS (``boundaries``); every phase is present."""
    out: dict[str, float | None] = {key: None for key, _ in PHASES}
    previous, last_key = start, None
    for key, moment in ends:
        if moment is None:
            continue
        seconds = max((moment - previous).total_seconds(), 0.0) if previous else None
        previous = max(moment, previous) if previous else moment
        if key is None:
            if last_key is not None and seconds is not None:
                out[last_key] = (out[last_key] or 0.0) + seconds
            continue
        out[key] = seconds
        if seconds is not None:
            last_key = key
    return out


@dataclass(frozen=True)
class LostWork:
    steps: int | None  # done again: reached on the lost host minus resumed from
    gpu_s: float | None  # those steps at the replacement's seconds per step
    usd: float | None  # those GPU seconds at the replacement's $/h


def lost_work(i: Interruption, r: Attempt | None) -> LostWork:
    # A resume past the step reached is no loss: see ``written_after_last_heartbeat``.
    if i.step_reached is None or i.resumed_step is None:
        return LostWork(None, None, None)
    steps = max(i.step_reached - i.resumed_step, 0)
    if r is None or r.seconds_per_step is None:
        return LostWork(steps, None, None)
    gpu_s = steps * r.seconds_per_step
    return LostWork(steps, gpu_s, gpu_s * r.dph_base / 3600)


def written_after_last_heartbeat(reached: int | None, resumed: int | None) -> str:
    """Why a recovery resumed past the step reached: the step reached is the last heartbeat's,
    and the script went on to write (and the agent to upload) a later checkpoint before the
    host died, in the seconds before the next heartbeat would have said so. "" otherwise."""
    if reached is None or resumed is None or resumed <= reached:
        return ""
    return (
        f"checkpoint {resumed} was written after the last heartbeat, which reported step {reached}"
    )


def resume_note(reached: int | None, resumed: int | None) -> str:
    """How the step resumed from (RESUMED) compares with the step the lost host had reported
    (REACHED), in words: "34 steps done again: the host had reached step 91", "no work lost",
    or why a resume is ahead of the last report. "" while either is unknown."""
    if reached is None or resumed is None:
        return ""
    if ahead := written_after_last_heartbeat(reached, resumed):
        return f"{ahead}: no work lost"
    if resumed == reached:
        return "no work lost"
    redone = reached - resumed
    return (
        f"{redone} step{'s' if redone != 1 else ''} done again: the host had reached step {reached}"
    )


def capped(ends, last: datetime | None) -> list[tuple[str | None, datetime | None]]:
    """ENDS with every moment after LAST (the first step) taken as LAST: a boundary reported
    later than the step that ends the downtime (host clocks, a late report) adds nothing."""
    if last is None:
        return list(ends)
    return [(key, min(moment, last) if moment else moment) for key, moment in ends]


def breakdown(interruption: Interruption) -> dict:
    """INTERRUPTION's downtime by phase (seconds, None where unknown), their total, and the
    lost work. Load it with ``select_related("replacement")`` to read it in one query.

    The downtime starts at the loss, ``recovery_times.lost_at``: the last heartbeat, or the
    detection without one (then the detection phase is unknown, not zero)."""
    r = replacement_of(interruption)
    ends = capped(boundaries(interruption, r), r.first_step_at if r else None)
    phases = phase_seconds(interruption.last_heartbeat_at, ends)
    known = [s for s in phases.values() if s is not None]
    work = lost_work(interruption, r)
    return {
        "phases": phases,
        "total_s": sum(known) if known else None,
        "lost_work": {"steps": work.steps, "gpu_s": work.gpu_s, "usd": work.usd},
        "resumed_ahead": written_after_last_heartbeat(
            interruption.step_reached, interruption.resumed_step
        ),
    }


@dataclass(frozen=True)
class Segment:
    """One phase of a stacked bar: its share of the bar in percent."""

    key: str
    label: str
    seconds: float
    percent: float

    @property
    def text(self) -> str:
        return duration(self.seconds)


def segments(phases: dict[str, float | None]) -> list[Segment]:
    """PHASES (seconds by key) as the pieces of one stacked bar, in phase order; phases that
    are unknown or took no time are left out."""
    known = [(key, phases.get(key)) for key, _ in PHASES]
    known = [(key, s) for key, s in known if s]
    total = sum(s for _, s in known)
    return [Segment(key, PHASE_LABELS[key], s, 100 * s / total) for key, s in known]
