"""How the commands write what the server said: durations, losses and money by the server's
rules, the progress bar, event lines, and the screen that redraws them."""

from __future__ import annotations

import sys
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal


def duration(seconds: float | None, none: str = "-") -> str:
    """The server's rule (``nomadgpu.humanize.duration``; the CLI installs without it, and
    ``tests/test_humanize.py`` holds the two to the same texts): "45 s", "1 min 30 s",
    "12 min", "2 h 05 min"."""
    if seconds is None:
        return none
    whole = int(seconds + 0.5)
    if whole < 60:
        return f"{whole} s"
    if whole < 600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    minutes = (whole + 30) // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if minutes else f"{hours} h"


def loss(value: float | None, none: str = "-") -> str:
    """The server's rule (``nomadgpu.humanize.loss``, held to the same texts by
    ``tests/test_humanize.py``): four significant digits, "0.6931", "1.351e-05"."""
    if value is None:
        return none
    return f"{value:.4g}"


def _places(amount: Decimal) -> int:
    if amount >= 1 or amount == 0:
        return 2
    return min(2 - amount.adjusted(), 6)


def money(usd: float | None, none: str = "-") -> str:
    """The server's rule (``nomadgpu.humanize.money``, held to the same texts by
    ``tests/test_humanize.py``): cents from $1, three significant digits under it, at most
    six decimals: "$1.24", "$0.0191", "$0.00820", "$0.00"."""
    if usd is None:
        return none
    amount = Decimal(str(usd))
    step = _places(abs(amount))
    places = _places(abs(amount).quantize(Decimal(1).scaleb(-step), rounding=ROUND_HALF_UP))
    shown = abs(amount).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return f"{'-' if amount < 0 and shown else ''}${shown:,.{places}f}"


# The server's states that get a host (jobs.models.ACTIVE_STATES): a job in one with no step
# yet is "waiting for the first step", as the portal says; in any other, no step will come
# until someone acts.
ACTIVE = frozenset({"queued", "renting", "starting", "running", "recovering"})
WAITING = "waiting for the first step"


def progress_bar(job: dict, width: int = 30) -> str:
    """``[#########.........] 150/300  50%  ETA 10 min  running`` (text only: works in logs);
    before the first step, ``[..........] waiting for the first step of 300  starting``."""
    step, total = job.get("step"), job.get("total_steps")
    fraction = job.get("progress")
    filled = round((fraction or 0) * width)
    if step is None:
        if job["state"] not in ACTIVE:
            return f"[{'.' * width}] no step reported  {job['state']}"
        of = f" of {total}" if total else ""
        return f"[{'.' * width}] {WAITING}{of}  {job['state']}"
    counts = f"{step}/{total or '?'}"
    percent = f"{fraction * 100:3.0f}%" if fraction is not None else "  ?%"
    eta = f"ETA {duration(job.get('eta_s'))}" if job.get("eta_s") is not None else ""
    bar = "#" * filled + "." * (width - filled)
    return f"[{bar}] {counts} {percent}  {eta}  {job['state']}".rstrip()


def event_line(event: dict) -> str:
    moment = datetime.fromisoformat(event["created_at"]).astimezone()
    text = f"{moment:%H:%M:%S} {event['kind']}"
    return f"{text}: {event['message']}" if event.get("message") else text


class Screen:
    """Events as lines and one progress line: redrawn in place on a terminal, printed when it
    changes otherwise (a CI log gets one line per change, not a smear of carriage returns)."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.bar = ""

    def line(self, text: str) -> None:
        if self.tty and self.bar:
            self.stream.write("\r\033[K")
        self.stream.write(text + "\n")
        if self.tty and self.bar:
            self.stream.write(self.bar)
        self.stream.flush()

    def progress(self, bar: str) -> None:
        if bar == self.bar:
            return
        self.bar = bar
        self.stream.write(f"\r\033[K{bar}" if self.tty else bar + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self.bar:
            self.stream.write("\n")
            self.stream.flush()


def cost_text(job: dict) -> str:
    """``$0.0191 (recorded)``: the job's one cost and which it is, as the portal writes it,
    with a partly invoiced one's parts: ``$0.0141 (partly invoiced: $0.0098 invoiced +
    $0.0043 recorded)`` (the server's ``JobCost.described``)."""
    split = job.get("cost_split_text") or ""  # an older server sends none
    return f"{money(job['cost_usd'])} ({job['cost_basis']}{': ' + split if split else ''})"
