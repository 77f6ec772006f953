"""What a member sees of a job through the API and the CLI: progress, ETA, host, and the log
tail as something that can be followed with a cursor.

Plain functions over a job with its attempts prefetched; no request, no serialisation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from jobs.models import LIVE_ATTEMPT_STATES, Attempt, Checkpoint, Job, JobState
from nomadgpu.humanize import duration

FINISHED = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

# Lines of context a log cursor remembers: enough that ordinary training output (each line a
# new step) never repeats, few enough to survive the tail rolling by between two polls.
ANCHOR_LINES = 3


@dataclass(frozen=True)
class Progress:
    step: int | None
    total_steps: int | None
    fraction: float | None  # 0..1, None when the total is unknown
    eta_s: float | None  # while training only: remaining steps at the latest s/step

    @property
    def percent(self) -> float | None:
        return None if self.fraction is None else 100.0 * self.fraction


def job_progress(job: Job) -> Progress:
    """Step and total from the newest attempt that reported one; ETA only while running, at
    that attempt's latest seconds per step. The one progress rule: the job pages, the member
    API, the CLI and the finished notification all read it."""
    attempts = sorted(job.attempts.all(), key=lambda a: a.number, reverse=True)
    reporting = next((a for a in attempts if a.step is not None), None)
    step = reporting.step if reporting else None
    if job.state == JobState.SUCCEEDED and job.final_step is not None:
        step = job.final_step
    total = (reporting.total_steps if reporting else None) or job.total_steps
    fraction = min(step / total, 1.0) if step is not None and total else None
    eta = None
    speed = reporting.seconds_per_step if reporting else None
    if job.state == JobState.RUNNING and step is not None and total and speed:
        eta = max(total - step, 0) * speed
    return Progress(step=step, total_steps=total, fraction=fraction, eta_s=eta)


def early_finish_note(job: Job) -> str:
    """For a job that succeeded short of its total: "ended at step 100 of 2,400"; else "".

    An exit 0 is taken as success even before the last step (scripts may stop early on
    purpose); this is what the job page, the member API and the finished notification all
    say about it, so they read the same. The total is the one the progress shows.
    """
    if job.state != JobState.SUCCEEDED:
        return ""
    progress = job_progress(job)
    step, total = progress.step, progress.total_steps
    if step is None or not total or step >= total:
        return ""
    return f"ended at step {step:,} of {total:,}"


def rework_note(job: Job) -> str:
    """While the job gets back to where a lost host had been: why the step went back.

    The progress shows the newest step reported: the lost host's until its replacement
    reports, then the replacement's, which starts from the checkpoint, below it. Recovering:
    "Host lost at step 91; training resumes from checkpoint 57, so steps 58 to 91 will be
    done again." Redoing: "Host lost at step 91; training resumed from checkpoint 57, so
    steps 58 to 91 are being done again." "" when nothing was lost, once the step reached is
    passed again, or once the job has ended."""
    lost = job.interruptions.order_by("-detected_at").first()
    if lost is None or lost.step_reached is None or job.state in FINISHED:
        return ""
    reached = lost.step_reached
    if lost.running_again_at is None:
        resume = Checkpoint.objects.filter(job=job).newest_ready_step() or 0
        return _redo_words(reached, resume, recovering=True)
    step = job_progress(job).step
    if lost.resumed_step is None or step is None or step >= reached:
        return ""
    return _redo_words(reached, lost.resumed_step, recovering=False)


def _redo_words(reached: int, resume: int, *, recovering: bool) -> str:
    if resume >= reached:
        return ""
    if resume:
        how = f"{'resumes' if recovering else 'resumed'} from checkpoint {resume:,}"
    else:
        how = f"{'starts' if recovering else 'started'} again from step 0 (no checkpoint yet)"
    tense = "will be" if recovering else "are being"
    steps = f"step {reached:,}" if resume + 1 == reached else f"steps {resume + 1:,} to {reached:,}"
    return f"Host lost at step {reached:,}; training {how}, so {steps} {tense} done again."


def current_host(job: Job) -> Attempt | None:
    """The attempt holding (or that last held) a rented instance: the job's host."""
    rented = [a for a in job.attempts.all() if a.instance_id is not None]
    return max(rented, key=lambda a: a.number, default=None)


@dataclass(frozen=True)
class StartDeadline:
    """The live attempt's start deadline and why (``jobs.watchdog.start_deadline``), as the job
    page and the member API show it: WAITING_FOR (the host's agent, or an early phase's next
    byte), AT, IN_S (negative once passed) and WHY."""

    waiting_for: str
    at: datetime
    in_s: float
    why: str

    @property
    def text(self) -> str:
        """ "pull of 4.1 GB at 520 Mbit/s measured: 95 s + agent start 60 s: due in 3 min"."""
        left = duration(abs(self.in_s))
        return f"{self.why}: {f'due in {left}' if self.in_s >= 0 else f'{left} overdue'}"


def start_deadline(job: Job, *, now: datetime) -> StartDeadline | None:
    """The deadline the watchdog holds the job's live host to before training (expects its
    attempts prefetched): before its agent registers, the host's start deadline; after, while
    code, staged files or a checkpoint download, when the phase under way stalls if no byte of
    it moves. None when neither applies (no host, training, or an older agent)."""
    attempt = next((a for a in job.attempts.all() if a.state in LIVE_ATTEMPT_STATES), None)
    if attempt is None or attempt.start_due_at is None:
        return None
    if attempt.registered_at is None:
        waiting = "the host's agent"
    elif attempt.phase == "restoring":
        waiting = "the next byte of its start-up"
    else:
        return None
    in_s = (attempt.start_due_at - now).total_seconds()
    return StartDeadline(waiting, attempt.start_due_at, in_s, attempt.start_due_why)


# ---- following the log tail -------------------------------------------------------------------
#
# The agent ships only a rolling tail (the last <= 50 lines) with each heartbeat, so the log is
# followed by content, not by offset: a cursor names the attempt and a digest of the last few
# lines already seen; the next call returns what follows them. If the tail rolled past those
# lines between two calls, everything in the tail is returned and `gap` says lines were missed.


@dataclass(frozen=True)
class LogLine:
    attempt: int
    text: str


@dataclass(frozen=True)
class LogChunk:
    lines: list[LogLine]
    pending: str  # the live attempt's last line: it may still be rewritten (a progress bar)
    cursor: str
    gap: bool


def settled_lines(attempt: Attempt) -> list[str]:
    """Lines that will not change: all of an ended attempt's, all but the last of a live one."""
    lines = attempt.log_tail.split("\n") if attempt.log_tail else []
    return lines[:-1] if attempt.state in LIVE_ATTEMPT_STATES else lines


def _line_digest(line: str) -> str:
    return hashlib.sha256(line.encode()).hexdigest()[:8]


def make_cursor(number: int, lines: list[str]) -> str:
    """``<attempt>:<digest>.<digest>...`` of the last ANCHOR_LINES lines seen (none: empty)."""
    return f"{number}:" + ".".join(_line_digest(line) for line in lines[-ANCHOR_LINES:])


def parse_cursor(cursor: str) -> tuple[int, list[str]]:
    """(attempt number, anchor line digests); ValueError when malformed."""
    number, anchor = cursor.split(":")
    digests = anchor.split(".") if anchor else []
    if len(digests) > ANCHOR_LINES or any(len(d) != 8 for d in digests):
        raise ValueError("bad anchor")
    int("".join(digests) or "0", 16)
    return int(number), digests


def lines_after_anchor(lines: list[str], anchor: list[str]) -> tuple[list[str], bool]:
    """The lines after the last place the anchor matches, and whether the anchor was lost.

    The anchor's first lines may already have rolled out of the tail: a match of its last
    lines at the very start of the tail counts.
    """
    if not anchor:
        return lines, False
    digests = [_line_digest(line) for line in lines]
    for end in range(len(digests), 0, -1):
        width = min(len(anchor), end)
        if digests[end - width : end] == anchor[-width:]:
            return lines[end:], False
    return lines, True


def follow_logs(attempts: list[Attempt], cursor: str | None) -> LogChunk:
    """The log lines after CURSOR across ATTEMPTS (a whole job's); without a cursor, the newest
    attempt's tail. The returned cursor continues from the last settled line."""
    attempts = sorted(attempts, key=lambda a: a.number)
    if cursor is not None:
        parse_cursor(cursor)  # a malformed cursor is refused even before there is any log
    if not attempts:
        return LogChunk(lines=[], pending="", cursor=cursor or "0:", gap=False)
    out: list[LogLine] = []
    gap = False
    if cursor is None:
        newest = attempts[-1]
        out = [LogLine(newest.number, t) for t in settled_lines(newest)]
    else:
        number, anchor = parse_cursor(cursor)
        for attempt in attempts:
            if attempt.number < number:
                continue
            lines = settled_lines(attempt)
            if attempt.number == number:
                lines, gap = lines_after_anchor(lines, anchor)
            out.extend(LogLine(attempt.number, t) for t in lines)
    last = attempts[-1]
    pending = last.log_tail.split("\n")[-1] if last.state in LIVE_ATTEMPT_STATES else ""
    return LogChunk(
        lines=out,
        pending=pending,
        cursor=make_cursor(last.number, settled_lines(last)),
        gap=gap,
    )
