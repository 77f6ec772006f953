"""The typed profile corrected by what was measured (``corrected_profile``: every figure a run
measured replaces the typed one), and each figure in words for the job page and the offers
preview (``figure_lines``: measured, with its runs, or typed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hosts import selection
from hosts.vast import Offer
from jobs.rent_decision import RentDecision
from jobs.renting.measures import GB, Checkpoints, History, HostPaid, Measure, Startup
from nomadgpu.humanize import money


def corrected_profile(profile: selection.JobProfile, history: History) -> selection.JobProfile:
    """PROFILE with every figure HISTORY measured in place of the typed one (module
    docstring); a figure never measured stays as typed."""
    changes: dict[str, float] = {}
    if (spp := history.speeds.reference(profile.reference_gpu)) is not None:
        changes["reference_seconds_per_step"] = spp
    if history.download is not None:
        changes["model_gb"] = history.download.value
    if history.startup is not None:
        changes["start_s"] = history.startup.start_s
        changes["pull_s"] = history.startup.pull_s  # None: the image at the bandwidth
    if history.checkpoints is not None:
        changes["checkpoint_gb"] = history.checkpoints.size_gb
        changes["upload_gb"] = history.checkpoints.upload_gb_per_step * profile.steps_total
    return replace(profile, **changes)


@dataclass(frozen=True)
class FigureLine:
    """One figure of the profile as the page says it: what it is, the value used, and
    "measured on N runs" or "typed"."""

    figure: str
    value: str
    runs: int = 0
    # How it was made when it is no plain measure: "estimated from 1-GPU runs".
    how: str = ""

    @property
    def measured(self) -> bool:
        """True when the value comes from earlier runs."""
        return self.runs > 0

    @property
    def source(self) -> str:
        """ "measured on 3 runs", "measured on 1 run", "estimated from 1-GPU runs, 2 runs" or
        "typed"."""
        if not self.measured:
            return "typed"
        runs = f"{self.runs} run{'s' if self.runs != 1 else ''}"
        return f"{self.how}, {runs}" if self.how else f"measured on {runs}"


def figure_lines(
    typed: selection.JobProfile, history: History, *, reference_host: Offer | None = None
) -> list[FigureLine]:
    """Each figure of the estimate: measured (its value and number of runs) or typed (TYPED,
    the profile before correction). REFERENCE_HOST is the host the estimate falls back to
    (``jobs.renting.reference.reference_offer``), named with its price."""
    used = corrected_profile(typed, history)
    speeds, ckpt, start = history.speeds, history.checkpoints, history.startup
    spp_runs = speeds.runs if speeds.reference(typed.reference_gpu) is not None else 0
    lines = [
        FigureLine(
            "Seconds per step",
            f"{_number(used.reference_seconds_per_step)} s on {typed.reference_gpu}",
            spp_runs,
            speeds.source_words,
        ),
        FigureLine("Downloaded by the command", _size(used.model_gb), _runs(history.download)),
        FigureLine("Start-up and finish", _start_words(used, start), _runs(start)),
        FigureLine("Checkpoint size", _size(used.checkpoint_gb), _runs(ckpt)),
        FigureLine("Checkpoints uploaded per run", _size(used.upload_gb), _runs(ckpt)),
    ]
    if ckpt is not None and ckpt.upload_s is not None:
        lines.append(FigureLine("Checkpoint upload", f"{_number(ckpt.upload_s)} s", ckpt.runs))
    lines.append(host_line(history, typed.reference_gpu, reference_host))
    return lines


def host_line(history: History, gpu: str, reference_host: Offer | None = None) -> FigureLine:
    """Which host the pre-flight prices on (``jobs.renting.reference.reference_cost``), in words."""
    weighed = RentDecision(history.last_decision).candidate_count
    if weighed:
        words = f"the cheapest with these figures of the {weighed} offers the newest rent weighed"
        return FigureLine("Host for the estimate", words, 1)
    if history.host is None:
        return FigureLine("Host for the estimate", reference_words(gpu, reference_host))
    return FigureLine("Host for the estimate", _host_words(history.host), _runs(history.host))


def reference_words(gpu: str, host: Offer | None) -> str:
    """The typed reference host in words, with its price: "a reference RTX 4090 at $0.400/h,
    free traffic" (a setting's name means nothing to the member reading the preview)."""
    if host is None:
        return f"a reference {gpu}, free traffic"
    count = host.num_gpus or 1
    if count == 1:
        price = money(host.dph_base, per_hour=True)
        return f"a reference {host.gpu_name} at {price}, free traffic"
    each = money(host.dph_base / count, per_hour=True)
    whole = money(host.dph_base, per_hour=True)
    return f"{count} reference {host.gpu_name} at {each} each ({whole}), free traffic"


def _start_words(used: selection.JobProfile, start: Startup | None) -> str:
    if start is None:
        return f"{_number(used.container_start_s)} s, the image and model at the host's bandwidth"
    if start.pull_s is None:
        return f"{_number(start.start_s)} s on the GPU; the image was on every machine"
    return f"{_number(start.start_s)} s on the GPU, after a {_number(start.pull_s)} s pull"


def _host_words(host: HostPaid) -> str:
    return f"{host.gpu_name} at {money(host.dph, per_hour=True)}, as the earlier rents paid"


def _runs(found: Measure | Startup | Checkpoints | HostPaid | None) -> int:
    return found.runs if found is not None else 0


def _number(value: float) -> str:
    return f"{value:.3g}"


def _size(gb: float) -> str:
    nbytes = gb * GB
    if nbytes < 1:
        return "none"
    for unit, scale in (("GB", GB), ("MB", 1024**2), ("KB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
