"""The market the selection tests decide on: one healthy offer to vary, the shipped market file,
and the field report's job and requirements (an RTX 4090 on demand, 15 GB downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

from hosts.selection import JobProfile, SpeedBook
from hosts.vast import Offer, parse_offer

ROOT = Path(__file__).resolve().parents[2]
MARKET_FILE = ROOT / "sandbox" / "market" / "offers.json"

RAW_OFFER = {  # a healthy single RTX 4090 in the market's field names and units
    "id": 16018470,
    "machine_id": 30941,
    "host_id": 150455,
    "gpu_name": "RTX 4090",
    "num_gpus": 1,
    "gpu_ram": 24564,
    "gpu_total_ram": 24564,
    "cuda_max_good": 12.4,
    "disk_space": 1386.0,
    "dph_base": 0.36,
    "storage_cost": 0.144,  # $/GB/month: 0.0002 $/GB/h
    "inet_down": 1000.0,
    "inet_up": 800.0,
    "inet_down_cost": 2 / 1024,  # $2/TB
    "inet_up_cost": 3 / 1024,
    "reliability": 0.99,
    "verification": "verified",
    "hosting_type": 0,
    "dlperf": 100.0,
    "geolocation": "Texas, US",
}
FIELD_REPORT_JOB = JobProfile(  # 15 GB downloaded in all, as the market README's check counts it
    image_gb=0, model_gb=15, upload_gb=1, steps_total=300, reference_seconds_per_step=4.0
)
REFERENCE = SpeedBook(dlperf_by_model={"RTX 4090": 100.0})  # an offer at dlperf 100 runs 4 s/step
# On demand, as the field report rented: these runs' prices and budgets are its rates (a job
# that leaves `rental` out gets JobSpec's `auto`, which bids on this market).
FIELD_REPORT_REQUIREMENTS = {
    "gpu_names": ["RTX 4090"],
    "min_reliability": 0.98,
    "min_inet_down_mbps": 500,
    "disk_gb": 20,
    "rental": "on-demand",
}


def make_offer(**changes) -> Offer:
    return parse_offer({**RAW_OFFER, **changes})


def load_market() -> tuple[list[Offer], dict[int, dict]]:
    path = MARKET_FILE
    raw = json.loads(path.read_text())
    public = [{k: v for k, v in o.items() if not k.startswith("sim_")} for o in raw]
    return [parse_offer(o) for o in public], {o["id"]: o for o in public}
