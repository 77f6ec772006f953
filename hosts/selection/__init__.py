"""Offer selection: which Vast offer to rent for a job, by the expected TOTAL cost of the job.

Plain data in, plain data out (``hosts.vast.Offer``, a ``Requirements`` and the dataclasses of
these files); no Django, no models, no network, so it runs the same on a live search, the
sandbox and a market file. One question per file, in the order a decision needs them:

- ``requirements``: what a job needs of an offer (``Requirements``), and the search that asks
  Vast for such offers (``vast_query``).
- ``filters``: which offers the job may rent: the rules, checked in order, and why an offer
  failed (``filter_offers``, ``Rejection``).
- ``profile``: what the job moves and computes (``JobProfile``).
- ``speed``: how fast the job trains on an offer (``SpeedBook``, ``seconds_per_step``).
- ``several_gpus``: how fast the same command runs on another number of GPUs
  (``seconds_per_step_at``).
- ``image_cache``: the chance a machine still holds the job's image (``ImageCache``).
- ``costs``: the cost model: start-up, training, storage and traffic of the rest of the job on
  one offer, without an interruption (``estimate_cost``, ``CostBreakdown``).
- ``bids``: on demand or a bid, which margins to weigh, and what to do after an outbid
  (``Rental``, ``rentals_to_weigh``, ``outbid_choice``).
- ``preemption``: how often a rental is interrupted (``PreemptionRates``, ``prior_rate``).
- ``machine_memory``: the team's memory of machines, with decay and posteriors: P(fail to
  start), losses per rented hour, speed and link against their promise, the 2-in-7-days ban
  (``MachineMemory``, ``start_failure_chance``, ``loss_rate_per_h``).
- ``failed_start``: what a start that fails costs, in time and money (``failed_start``).
- ``rental_costs``: the expected total with interruptions priced in (and, with a memory, what
  the machine showed), and the cheapest way to rent an offer (``expected_cost``,
  ``best_rental``).
- ``ranking``: the acceptable offers, cheapest expected total first, and the choice
  (``rank_offers``, ``choose_offer``).
- ``decision``: what is stored and shown of a decision (``Decision``, ``Ranked``,
  ``offer_summary``).

The names other packages use are re-exported here, so that ``from hosts import selection`` and
``selection.choose_offer(...)`` read as before; a test of one file's internals imports that
file.
"""

from hosts.selection.bids import (
    AUTO,
    BID_MARGINS,
    INTERRUPTIBLE,
    ON_DEMAND,
    RAISE_STEP_USD,
    OutbidChoice,
    Rental,
    outbid_choice,
    rentals_to_weigh,
)
from hosts.selection.costs import (
    BYTES_PER_GB,
    SECONDS_PER_HOUR,
    CannotEstimate,
    CostBreakdown,
    estimate_cost,
    transfer_hours,
)
from hosts.selection.decision import Decision, MemoryNote, Ranked, offer_summary
from hosts.selection.failed_start import FailedStart, failed_start, failed_start_seconds
from hosts.selection.filters import NOT_BIDDABLE, Rejection, filter_offers, job_dph_total
from hosts.selection.image_cache import ImageCache
from hosts.selection.machine_memory import (
    HALF_LIFE_DAYS,
    NO_MEMORY,
    MachineMemory,
    MachineRecord,
    RentalRecord,
    loss_rate_per_h,
    memory_parts,
    memory_words,
    remember,
    start_failure_chance,
)
from hosts.selection.preemption import (
    PRIOR_HOST_LOSS_PER_H,
    PRIOR_WEIGHT_H,
    PreemptionRates,
    margin_bucket,
    prior_rate,
)
from hosts.selection.profile import JobProfile
from hosts.selection.ranking import (
    DEFAULT_TOP_N,
    RULE_MEMORY,
    SAFER_WITHIN,
    choose_offer,
    failure_chance,
    rank_offers,
)
from hosts.selection.rental_costs import (
    DETECTION_S,
    RENT_S,
    UNKNOWN_INTERVAL_MAX_H,
    RentalCost,
    best_rental,
    checkpoint_interval_h,
    expected_cost,
)
from hosts.selection.requirements import SEARCH_LIMIT, Requirements, vast_query
from hosts.selection.several_gpus import MULTI_GPU_EFFICIENCY, seconds_per_step_at
from hosts.selection.speed import (
    KNOWN_DLPERF_PER_GPU,
    SPEED_DLPERF,
    SPEED_DLPERF_MODEL,
    SPEED_MACHINE,
    SPEED_MODEL,
    SpeedBook,
)

__all__ = [
    "AUTO",
    "BID_MARGINS",
    "BYTES_PER_GB",
    "DEFAULT_TOP_N",
    "DETECTION_S",
    "HALF_LIFE_DAYS",
    "INTERRUPTIBLE",
    "KNOWN_DLPERF_PER_GPU",
    "MULTI_GPU_EFFICIENCY",
    "NOT_BIDDABLE",
    "NO_MEMORY",
    "ON_DEMAND",
    "PRIOR_HOST_LOSS_PER_H",
    "PRIOR_WEIGHT_H",
    "RAISE_STEP_USD",
    "RENT_S",
    "RULE_MEMORY",
    "SAFER_WITHIN",
    "SEARCH_LIMIT",
    "SECONDS_PER_HOUR",
    "SPEED_DLPERF",
    "SPEED_DLPERF_MODEL",
    "SPEED_MACHINE",
    "SPEED_MODEL",
    "UNKNOWN_INTERVAL_MAX_H",
    "CannotEstimate",
    "CostBreakdown",
    "Decision",
    "FailedStart",
    "ImageCache",
    "JobProfile",
    "MachineMemory",
    "MachineRecord",
    "MemoryNote",
    "OutbidChoice",
    "PreemptionRates",
    "Ranked",
    "Rejection",
    "Rental",
    "RentalCost",
    "RentalRecord",
    "Requirements",
    "SpeedBook",
    "best_rental",
    "checkpoint_interval_h",
    "choose_offer",
    "estimate_cost",
    "expected_cost",
    "failed_start",
    "failed_start_seconds",
    "failure_chance",
    "filter_offers",
    "job_dph_total",
    "loss_rate_per_h",
    "margin_bucket",
    "memory_parts",
    "memory_words",
    "offer_summary",
    "outbid_choice",
    "prior_rate",
    "rank_offers",
    "remember",
    "rentals_to_weigh",
    "seconds_per_step_at",
    "start_failure_chance",
    "transfer_hours",
    "vast_query",
]
