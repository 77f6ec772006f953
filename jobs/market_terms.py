"""A job in the market's terms: the one translation from a job (or a spec not yet submitted)
to what ``hosts.selection`` ranks offers by, and the one reader of what a rent decided.

- ``requirements_for`` and ``profile_for`` turn a job's stored ``requirements`` and ``profile``
  into ``selection.Requirements`` and ``selection.JobProfile``. Every value passes through
  ``jobs.spec`` (``RequirementsSpec``, ``ProfileSpec``), so a key a job leaves out takes
  ``JobSpec``'s default, written there once (``rental: auto``, a 5 GB image, ...): the
  selection's dataclasses are always given every field, never left to their own defaults.
- Stored JSON is checked by that same schema: a job hand-edited in the admin with a typo'd key
  raises ``StoredSpecInvalid`` ("requirements: unknown key 'gpu_name'"), not a ``TypeError``.
- ``profile_for`` is corrected by what the team measured on earlier runs of the job's shape
  (``jobs.measured``): every figure measured replaces the typed one.
- ``reference_offer``: the host a job is priced on before any market search (the budget's
  pre-flight and rent reservation, ``billing.services``, through ``estimate_for``).
- ``RentDecision``: ``Attempt.decision`` (``selection.Decision.as_dict``, stored at rent) read
  by name in one place: the image pull priced, the chosen offer's upload speed, the planned
  speed and upload cost, the choice after an outbid or while a host is offline, the record
  the job page shows.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from pydantic import TypeAdapter, ValidationError

from hosts import selection
from hosts.vast import Offer
from hosts.wait_or_move import ReturnHistory, WaitOrMove, wait_or_move
from jobs import measured
from jobs.models import Attempt, Checkpoint, Job
from jobs.spec import EnvVars, ProfileSpec, RequirementsSpec
from jobs.staging import stage

# --- Stored specs, checked ---------------------------------------------------------------------


class StoredSpecInvalid(ValueError):
    """A job's stored ``requirements``, ``profile`` or ``env`` no longer fit ``JobSpec`` (JSON
    edited by hand). The message names each field in a sentence ("requirements: unknown key
    'gpu_name'"); ``problems`` holds (field, sentence) pairs, the field dotted
    ("requirements.gpu_name")."""

    def __init__(self, job_id: int | None, problems: Sequence[tuple[str, str]]) -> None:
        self.job_id = job_id
        self.problems = tuple(problems)
        super().__init__("; ".join(sentence for _, sentence in self.problems))

    @property
    def fields(self) -> tuple[str, ...]:
        """The dotted fields at fault."""
        return tuple(where for where, _ in self.problems)


@dataclass(frozen=True)
class StoredSpec:
    """A job's stored requirements, profile and env as ``JobSpec`` reads them (defaults filled)."""

    requirements: RequirementsSpec
    profile: ProfileSpec
    env: dict[str, str]


_ENV = TypeAdapter(EnvVars)
# How each stored part is checked, and the keys it knows (for "did you mean").
_SECTIONS: dict[str, tuple[Callable[[Any], Any], tuple[str, ...]]] = {
    "requirements": (RequirementsSpec.model_validate, tuple(RequirementsSpec.model_fields)),
    "profile": (ProfileSpec.model_validate, tuple(ProfileSpec.model_fields)),
    "env": (_ENV.validate_python, ()),
}


def validate_stored(job: Job) -> StoredSpec:
    """JOB's stored requirements, profile and env checked against ``JobSpec``, every problem of
    the three at once. Raises ``StoredSpecInvalid``."""
    parsed: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for section in _SECTIONS:
        try:
            parsed[section] = _validated(job, section)
        except StoredSpecInvalid as exc:
            problems.extend(exc.problems)
    if problems:
        raise StoredSpecInvalid(job.pk, problems)
    return StoredSpec(**parsed)


def _validated(job: Job, section: str) -> Any:
    validate, known = _SECTIONS[section]
    try:
        return validate(getattr(job, section))
    except ValidationError as exc:
        problems = [_problem(section, err, known) for err in exc.errors()]
        raise StoredSpecInvalid(job.pk, problems) from None


def _problem(section: str, err: Mapping[str, Any], known: Sequence[str]) -> tuple[str, str]:
    """(dotted field, sentence) for one of pydantic's errors in SECTION."""
    path = ".".join(str(p) for p in err["loc"])
    where = f"{section}.{path}" if path else section
    if err["type"] == "extra_forbidden":
        key = str(err["loc"][-1])
        close = difflib.get_close_matches(key, known, n=1) if len(err["loc"]) == 1 else []
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return where, f"{section}: unknown key '{key}'{hint}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if not path:
        if err["type"] in ("model_type", "dict_type"):
            found = type(err["input"]).__name__
            return where, f"{section}: should be an object of keys and values, not a {found}"
        return where, f"{section}: {message}"
    message = message[:1].lower() + message[1:]
    return where, f"{section}: bad value for '{path}': {message} (found {err['input']!r})"


# --- The translation ---------------------------------------------------------------------------


def requirements_from_spec(
    spec: RequirementsSpec, *, avoid: Iterable[int] = ()
) -> selection.Requirements:
    """The selection's requirements of SPEC (``JobSpec``'s defaults for what it leaves out),
    with the machines to AVOID."""
    return selection.Requirements(**spec.model_dump(), avoid_machine_ids=frozenset(avoid))


def profile_from_spec(
    spec: ProfileSpec, *, steps_total: int, steps_done: int = 0
) -> selection.JobProfile:
    """The cost model's profile of SPEC for a run of STEPS_TOTAL steps resumed at STEPS_DONE."""
    return selection.JobProfile(**spec.model_dump(), steps_total=steps_total, steps_done=steps_done)


def requirements_for(job: Job) -> selection.Requirements:
    """What a host must have for JOB: its stored requirements over ``JobSpec``'s defaults, and
    its avoid list. Raises ``StoredSpecInvalid`` when the stored JSON no longer fits."""
    spec = _validated(job, "requirements")
    return requirements_from_spec(spec, avoid=job.avoid_machine_ids)


def profile_for(job: Job, history: measured.History | None = None) -> selection.JobProfile:
    """What the cost model multiplies for JOB, resumed from its newest ready checkpoint, each
    figure its shape's runs measured (HISTORY, else ``measured.history_for``) in place of the
    typed one. Raises ``StoredSpecInvalid`` when the stored JSON no longer fits."""
    history = history if history is not None else measured.history_for(job)
    return with_staged(measured.corrected_profile(typed_profile_for(job), history), job, history)


def with_staged(
    profile: selection.JobProfile, job: Job, history: measured.History
) -> selection.JobProfile:
    """PROFILE with JOB's staged files (once mirrored) as its model download, in place of the
    typed ``model_gb``: the agent fetches them on every host. What the command itself still
    downloads (measured, which leaves out the agent's own bytes) comes on top."""
    staged = stage.staged_gb(job)
    if staged is None:
        return profile
    own = history.download.value if history.download is not None else 0.0
    return replace(profile, model_gb=staged + own)


def typed_profile_for(job: Job) -> selection.JobProfile:
    """``profile_for`` as typed, before anything measured corrects it."""
    spec = _validated(job, "profile")
    resume_step = Checkpoint.objects.filter(job=job).newest_ready_step() or 0
    return profile_from_spec(spec, steps_total=job.total_steps or 0, steps_done=resume_step)


# --- The reference host ------------------------------------------------------------------------

REFERENCE_STORAGE_USD_PER_GB_MONTH = 0.15
HOURS_PER_MONTH = 720


def reference_offer(
    req: selection.Requirements,
    profile: selection.JobProfile,
    paid: measured.HostPaid | None = None,
) -> Offer:
    """The host a job is priced on before any market search: submitting must not depend on
    the provider answering, and the cheapest host is not known until the rent. Once the job's
    shape was rented (PAID, ``measured.HostPaid``): the GPU model its rents got most, at the
    median rates they paid. Before: REQ's number of the profile's reference GPU at
    ``BUDGET_ESTIMATE_DPH`` $/h each (default 0.40, an RTX 4090 at the field report's prices),
    storage at $0.15/GB/month, free traffic. REQ's minimum bandwidth either way; it takes no
    bid, so it is rented on demand whatever REQ's rental (at the bid, when PAID was one)."""
    offer = _typed_reference_offer(req, profile)
    if paid is None:
        return offer
    return replace(
        offer,
        gpu_name=paid.gpu_name,
        dph_base=paid.dph,
        storage_usd_per_gb_hour=paid.storage_usd_per_gb_hour,
        download_usd_per_gb=paid.download_usd_per_gb,
        upload_usd_per_gb=paid.upload_usd_per_gb,
    )


def _typed_reference_offer(req: selection.Requirements, profile: selection.JobProfile) -> Offer:
    return Offer(
        id=0,
        machine_id=None,
        host_id=None,
        gpu_name=profile.reference_gpu,
        num_gpus=req.num_gpus,
        gpu_ram_gb=None,
        gpu_total_ram_gb=None,
        cpu_cores_effective=None,
        cpu_ram_gb=None,
        disk_space_gb=None,
        cuda_max_good=None,
        compute_cap=None,
        dph_base=float(settings.BUDGET_ESTIMATE_DPH) * req.num_gpus,
        dph_total=None,
        min_bid=None,
        storage_usd_per_gb_hour=REFERENCE_STORAGE_USD_PER_GB_MONTH / HOURS_PER_MONTH,
        download_usd_per_gb=0.0,
        upload_usd_per_gb=0.0,
        inet_down_mbps=req.min_inet_down_mbps or 500.0,
        inet_up_mbps=None,
        reliability=1.0,
        verified=True,
        datacenter=False,
        dlperf=None,
        geolocation=None,
    )


def reference_cost(
    req: selection.Requirements,
    profile: selection.JobProfile,
    history: measured.History = measured.NO_HISTORY,
) -> selection.CostBreakdown:
    """The selection's cost model for the rest of the job before any market search: on the
    offers HISTORY's newest rent weighed, priced again with PROFILE (what is measured now
    may rank them differently: a shape found to train fast no longer pays a metered link for
    a cheaper GPU), the cheapest; without any, on ``reference_offer``."""
    weighed = _weighed_costs(req, profile, history)
    if weighed:
        return min(weighed, key=lambda cost: cost.total_usd)
    return _reference_offer_cost(req, profile, history)


def _weighed_costs(
    req: selection.Requirements, profile: selection.JobProfile, history: measured.History
) -> list[selection.CostBreakdown]:
    weighed = RentDecision(history.last_decision).weighed_offers(req)
    book = history.speeds.book()
    book = replace(
        book, by_model={profile.reference_gpu: profile.reference_seconds_per_step, **book.by_model}
    ).with_market([offer for offer, _ in weighed], req.num_gpus)
    costs = []
    for offer, price in weighed:
        try:
            costs.append(selection.estimate_cost(offer, profile, book, req, gpu_usd_per_hour=price))
        except selection.CannotEstimate:
            continue  # stored without a price or a speed estimate: not a host to price on
    return costs


def _reference_offer_cost(
    req: selection.Requirements, profile: selection.JobProfile, history: measured.History
) -> selection.CostBreakdown:
    by_model = {profile.reference_gpu: profile.reference_seconds_per_step}
    offer = reference_offer(req, profile, history.host)
    if offer.gpu_name not in by_model:
        spp = history.speeds.reference(offer.gpu_name or "")
        if spp is None:  # rented, but never timed there: its price at the reference's speed
            offer = replace(offer, gpu_name=profile.reference_gpu)
        else:
            by_model[offer.gpu_name] = spp
    speeds = selection.SpeedBook(by_model=by_model)
    return selection.estimate_cost(offer, profile, speeds, req)


def estimate_for(job: Job) -> selection.CostBreakdown:
    """The rest of JOB on the reference host, with what its shape measured (the budget's
    pre-flight, reservation and projection). Raises ``StoredSpecInvalid``."""
    history = measured.history_for(job)
    return reference_cost(requirements_for(job), profile_for(job, history), history)


# --- What a rent decided -----------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class RentDecision:
    """The rent decision stored on an attempt (``Attempt.decision``: ``selection.Decision.
    as_dict``, or ``{"adopted": True}`` for an instance adopted by its label), read by name
    here only. Every reader is lenient: an attempt rented before a key was stored reads as
    having no figure for it."""

    data: Mapping[str, Any]

    @classmethod
    def of(cls, attempt: Attempt) -> RentDecision:
        """ATTEMPT's decision (empty when none was stored)."""
        return cls(_mapping(attempt.decision))

    @property
    def chosen_offer(self) -> Mapping[str, Any]:
        """The rented offer's deciding fields (``selection.offer_summary``)."""
        return _mapping(_mapping(self.data.get("chosen")).get("offer"))

    @property
    def chosen_cost(self) -> Mapping[str, Any]:
        """The chosen rental's run without interruptions (``selection.CostBreakdown``)."""
        return _mapping(_mapping(self.data.get("chosen")).get("cost"))

    @property
    def chosen_rental(self) -> Mapping[str, Any]:
        """How the offer was rented and its expected total (``selection.RentalCost``)."""
        chosen = _mapping(self.data.get("chosen"))
        return _mapping(chosen.get("rental") or self.data.get("rental"))

    def weighed_offers(self, req: selection.Requirements) -> list[tuple[Offer, float | None]]:
        """The offers this decision ranked (its candidates), each with the GPU $/h it was to
        be rented at: its bid where REQ allows bidding, else on demand (None: ``dph_base``)."""
        found = []
        for candidate in map(_mapping, self.data.get("candidates") or []):
            offer = offer_from_summary(_mapping(candidate.get("offer")))
            if offer is None:
                continue
            bid = _mapping(_mapping(candidate.get("rental")).get("rental")).get("kind")
            price = _mapping(candidate.get("rental")).get("gpu_usd_per_hour")
            bids = bid == selection.INTERRUPTIBLE and req.rental != selection.ON_DEMAND
            found.append((offer, float(price) if bids and price else None))
        return found

    @property
    def image_gb(self) -> float:
        """The image pull as priced at rent (the profile's ``image_gb``; 0 without one)."""
        return float(_mapping(self.data.get("profile")).get("image_gb") or 0.0)

    @property
    def startup_download_gb(self) -> float:
        """What the start-up was priced to download on the chosen offer: the image, the model
        and, for a resume, the checkpoint (0 without a stored decision)."""
        return float(self.chosen_cost.get("download_gb") or 0.0)

    @property
    def upload_mbps(self) -> float | None:
        """The upload speed the rented offer advertised, if it did."""
        mbps = self.chosen_offer.get("inet_up_mbps")
        return float(mbps) if isinstance(mbps, int | float) and mbps > 0 else None

    @property
    def seconds_per_step(self) -> float | None:
        """The speed the rent expected on the chosen offer."""
        return self.chosen_cost.get("seconds_per_step") or None

    @property
    def steps_planned(self) -> int:
        """The steps the rent priced (the rest of the run when it was rented)."""
        return int(self.chosen_cost.get("steps_remaining") or 0)

    @property
    def upload_usd(self) -> float:
        """What uploading the priced steps' checkpoints was expected to cost."""
        return float(self.chosen_cost.get("upload_usd") or 0.0)

    def outbid_choice(
        self,
        *,
        machine_id: int | None,
        steps_left: int,
        seconds_per_step: float | None,
        bid_margin: float,
        new_min_bid: float | None,
        max_bid_dph: float | None,
        rates: selection.PreemptionRates,
    ) -> selection.OutbidChoice:
        """``selection.outbid_choice`` with the numbers this decision holds: the move is its
        best candidate on another machine than MACHINE_ID (its price, speed, rework without
        the half interval, which both sides redo alike, and rate), else this offer on demand;
        staying restarts the container and faces the rate of a bid at BID_MARGIN."""
        cost, gpu = self.chosen_cost, self.chosen_offer.get("gpu_name") or ""
        on_demand = self.chosen_offer.get("dph_base")
        stay_spp = seconds_per_step or cost.get("seconds_per_step") or 0.0
        move, move_price, move_spp, move_rate = self._move(machine_id, stay_spp, rates)
        redone_usd = (move.get("gpu_usd_per_hour") or 0.0) * (move.get("redo_h") or 0.0)
        caps = [c for c in (max_bid_dph, on_demand) if c]
        return selection.outbid_choice(
            steps_left=steps_left,
            stay_seconds_per_step=stay_spp,
            new_min_bid=new_min_bid,
            bid_margin=bid_margin,
            stay_outbids_per_h=rates.rate(selection.INTERRUPTIBLE, gpu, bid_margin)[0],
            restart_h=cost.get("container_start_h") or 0.0,
            cap_usd_per_hour=min(caps) if caps else None,
            move_usd_per_hour=move_price,
            move_seconds_per_step=move_spp,
            move_interruptions_per_h=move_rate,
            move_rework_usd=max((move.get("rework_usd") or 0.0) - redone_usd, 0.0),
        )

    def wait_or_move(
        self,
        *,
        machine_id: int | None,
        offline_s: float,
        cap_s: float,
        history: ReturnHistory,
        usd_per_hour: float,
        rates: selection.PreemptionRates,
    ) -> WaitOrMove:
        """``hosts.wait_or_move`` with the numbers this decision holds: waiting ends in a
        container restart on the same disk (the chosen offer's container start, nothing to
        pull or download); moving is the best candidate on another machine than MACHINE_ID
        (else this offer on demand): its rework after a loss without the detection (done
        already) and without the half interval redone (the same either way)."""
        restart_h = self.chosen_cost.get("container_start_h") or 0.0
        stay_spp = self.chosen_cost.get("seconds_per_step") or 0.0
        move, move_price, _, _ = self._move(machine_id, stay_spp, rates)
        redo_h = move.get("redo_h") or 0.0
        detection_h = selection.DETECTION_S / selection.SECONDS_PER_HOUR
        return wait_or_move(
            offline_s=offline_s,
            cap_s=cap_s,
            history=history,
            restart_h=restart_h,
            restart_usd=usd_per_hour * restart_h,
            move_h=max((move.get("rework_h") or 0.0) - redo_h - detection_h, 0.0),
            move_usd=max((move.get("rework_usd") or 0.0) - move_price * redo_h, 0.0),
            usd_per_hour=usd_per_hour,
        )

    def _move(
        self, machine_id: int | None, stay_spp: float, rates: selection.PreemptionRates
    ) -> tuple[Mapping[str, Any], float, float, float]:
        """(rental, $/h, s/step, interruptions/h) of moving: the best candidate on another
        machine than MACHINE_ID, else a machine like this one, on demand."""
        for candidate in map(_mapping, self.data.get("candidates") or []):
            rental = _mapping(candidate.get("rental"))
            if rental and _mapping(candidate.get("offer")).get("machine_id") != machine_id:
                spp = _mapping(candidate.get("cost")).get("seconds_per_step") or stay_spp
                rate = rental.get("preemptions_per_h") or 0.0
                return rental, rental["gpu_usd_per_hour"], spp, rate
        on_demand = self.chosen_offer.get("dph_base") or math.inf
        gpu = self.chosen_offer.get("gpu_name") or ""
        return self.chosen_rental, on_demand, stay_spp, rates.rate(selection.ON_DEMAND, gpu)[0]


@dataclass(frozen=True)
class RankedOffer:
    """One ranked candidate of a decision (``selection.Ranked.as_dict``, fresh or stored) read
    by name: the offer, how it would be rented and at what GPU $/h, the run without
    interruptions at that price (``cost``) and the expected total with them. A candidate
    stored before rentals were weighed reads as on-demand at the offer's price, with no
    interruptions priced."""

    data: Mapping[str, Any]

    @property
    def offer(self) -> Mapping[str, Any]:
        """The offer's deciding fields (``selection.offer_summary``)."""
        return _mapping(self.data.get("offer"))

    @property
    def cost(self) -> Mapping[str, Any]:
        """The run without interruptions at ``usd_per_hour`` (``selection.CostBreakdown``)."""
        return _mapping(self.data.get("cost"))

    @property
    def rental(self) -> Mapping[str, Any]:
        """How the offer would be rented (``selection.RentalCost``; empty when not stored)."""
        return _mapping(self.data.get("rental"))

    @property
    def rental_label(self) -> str:
        """ "on-demand" or "interruptible, min_bid +15 %"."""
        return str(_mapping(self.rental.get("rental")).get("label") or selection.ON_DEMAND)

    @property
    def usd_per_hour(self) -> float:
        """The GPU price the row was priced at: the bid, or the on-demand price."""
        price = self.rental.get("gpu_usd_per_hour")
        return float(price if price is not None else self.offer.get("dph_base") or 0.0)

    @property
    def expected_total_usd(self) -> float | None:
        """The run with its expected interruptions; None when they come faster than the work
        (stored as null: "never finishes")."""
        if not self.rental:
            return float(self.cost.get("total_usd") or 0.0)
        total = self.rental.get("expected_total_usd")
        return None if total is None else float(total)


def ranked_offers(decision: Mapping[str, Any]) -> tuple[RankedOffer, ...]:
    """DECISION's candidates (``selection.Decision.as_dict``), the chosen one first."""
    return tuple(RankedOffer(_mapping(c)) for c in decision.get("candidates") or [])


def offer_from_summary(summary: Mapping[str, Any]) -> Offer | None:
    """An offer as ``selection.offer_summary`` stored it (the fields a decision rests on; the
    rest unknown), or None for a summary without an id."""
    if not isinstance(summary.get("id"), int):
        return None
    known = {name: summary.get(name) for name in _SUMMARY_FIELDS}
    unknown = dict.fromkeys(_NOT_SUMMARISED)
    return Offer(
        **known,
        **unknown,
        gpu_name=str(summary.get("gpu_name") or ""),
        num_gpus=int(summary.get("num_gpus") or 1),
        verified=bool(summary.get("verified")),
        datacenter=bool(summary.get("datacenter")),
    )


_SUMMARY_FIELDS = (
    "id",
    "machine_id",
    "host_id",
    "dph_base",
    "dph_total",
    "storage_usd_per_gb_hour",
    "download_usd_per_gb",
    "upload_usd_per_gb",
    "inet_down_mbps",
    "inet_up_mbps",
    "reliability",
    "dlperf",
    "geolocation",
)
_NOT_SUMMARISED = (
    "gpu_ram_gb",
    "gpu_total_ram_gb",
    "cpu_cores_effective",
    "cpu_ram_gb",
    "disk_space_gb",
    "cuda_max_good",
    "compute_cap",
    "min_bid",
)


def page_decision(attempts: Iterable[Attempt]) -> Mapping[str, Any] | None:
    """The decision the job page shows: the newest stored among ATTEMPTS (oldest first)."""
    stored = [a.decision for a in attempts if a.decision]
    return stored[-1] if stored else None
