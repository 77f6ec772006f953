"""What a job moves and computes (``JobProfile``): the numbers the cost model multiplies."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class JobProfile:
    """What the job moves and computes; the numbers the cost model multiplies.

    ``reference_seconds_per_step`` is measured on ``Requirements.num_gpus`` GPUs of the
    ``reference_gpu`` model (field report: 4 s/step on one RTX 4090). ``upload_gb`` is what the
    whole run uploads (checkpoints); a resumed run is charged its remaining share.
    ``checkpoint_gb`` is downloaded before resuming (only when ``steps_done`` > 0).
    A job's profile is given every field by ``jobs.renting.terms`` from ``JobSpec``; the
    defaults here are the same numbers, for tests and benchmarks.
    """

    image_gb: float
    model_gb: float
    upload_gb: float
    steps_total: int
    steps_done: int = 0
    reference_seconds_per_step: float = 4.0
    reference_gpu: str = "RTX 4090"
    container_start_s: float = 60.0
    checkpoint_gb: float = 0.0
    checkpoint_every_steps: int = 0  # 0: unknown, taken as a tenth of the run
    # "script" or "auto" (the supervisor also asks, jobs.checkpoints.interval); the cost model
    # does not read it: it rides along in the job's profile.
    checkpoint: str = "script"
    # Measured on earlier runs of the job (``jobs.renting.shape_history``), None until then: the
    # GPU-billed seconds a run spends besides its steps (agent start, setup, the command's own
    # downloads, the last upload, exit), in place of ``container_start_s`` and of the model download
    # at the offer's bandwidth (its traffic is still priced from ``model_gb``); and the seconds
    # from rent to container up, in place of the image at the offer's bandwidth.
    start_s: float | None = None
    pull_s: float | None = None

    @property
    def steps_remaining(self) -> int:
        """Steps still to train from the resume point."""
        return max(self.steps_total - self.steps_done, 0)

    @property
    def share_remaining(self) -> float:
        """The part of the run still ahead (0-1); uploads are charged for this part only."""
        return self.steps_remaining / self.steps_total if self.steps_total > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)
