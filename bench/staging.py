"""Benchmark: what staging the field report's model saves and costs, by the cost model.

Usage: ``python bench/staging.py [market.json]`` (no server, no database; a second).

The field report's job (``examples/qlora/job.toml``: QLoRA of Qwen2.5-7B-Instruct on one RTX
4090, 300 steps at 4 s) is priced by ``hosts.selection.choose_offer`` on the seeded market
three ways: the typed bf16 download of 15.2 GB the command makes (the baseline), the same
bytes staged (the agent fetches them from the team's bucket: the same bytes in, so the same
price, only the source changes), and the pre-quantised 4-bit snapshot staged (about 5.6 GB:
6.5 B parameters at 4 bits plus 1.1 B of embeddings and head at 16, docs/staged-weights.md ("Staged
model weights"). Printed per way: the model download at the chosen offer's bandwidth, the job's
expected total, and each against the baseline; then what keeping the staged copy costs a
month in R2 (``R2_USD_PER_GB_MONTH``, no egress fee) against the job's cost.
"""

from __future__ import annotations

import json
import os
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nomadgpu.settings")
os.environ.setdefault("FIELD_ENCRYPTION_KEY", "YmVuY2gtb25seS1rZXktYmVuY2gtb25seS1rZXktMzI=")

import django  # noqa: E402

django.setup()  # the job file is read through jobs.spec, as a submit reads it

from bench.support import line  # noqa: E402
from hosts.selection import JobProfile, Requirements, choose_offer  # noqa: E402
from hosts.vast import parse_offer  # noqa: E402
from jobs.renting import terms  # noqa: E402
from jobs.spec import JobSpec  # noqa: E402

MARKET = ROOT / "sandbox" / "market" / "offers.json"
BF16_GB = 15.2
FOUR_BIT_GB = 5.6
R2_USD_PER_GB_MONTH = 0.015


def field_report_job() -> tuple[Requirements, JobProfile]:
    raw = tomllib.loads((ROOT / "examples" / "qlora" / "job.toml").read_text())
    raw.pop("workdir", None)  # a folder the CLI packs
    spec = JobSpec(**raw)
    req = terms.requirements_from_spec(spec.requirements)
    profile = terms.profile_from_spec(spec.profile, steps_total=spec.total_steps or 0)
    return req, replace(profile, model_gb=BF16_GB)


def priced(offers, req: Requirements, profile: JobProfile) -> tuple[float, float]:
    """(model download seconds at the chosen offer, the job's expected total USD)."""
    decision = choose_offer(offers, req, profile)
    assert decision is not None, "no offer fits the field report's requirements"
    chosen = decision.chosen
    return chosen.cost.model_download_h * 3600, chosen.expected_total_usd


def main(argv: list[str]) -> None:
    path = Path(argv[0]) if argv else MARKET
    raw = json.loads(path.read_text())
    raw = raw["offers"] if isinstance(raw, dict) else raw
    offers = [parse_offer({k: v for k, v in o.items() if not k.startswith("sim_")}) for o in raw]
    req, typed = field_report_job()
    base_s, base_usd = priced(offers, req, typed)
    print(f"market: {path} ({len(offers)} offers); the field report's job")
    for label, gb in (("staged bf16", BF16_GB), ("staged 4-bit snapshot", FOUR_BIT_GB)):
        seconds, usd = priced(offers, req, replace(typed, model_gb=gb))
        baseline = f"typed {BF16_GB} GB: {base_s:.0f} s"
        print(
            line(
                f"{label}: model download", f"{gb} GB: {seconds:.0f} s", baseline, seconds / base_s
            )
        )
        print(
            line(f"{label}: expected job total", f"${usd:.3f}", f"${base_usd:.3f}", usd / base_usd)
        )
        month = gb * R2_USD_PER_GB_MONTH
        print(line(f"{label}: R2 storage a month", f"${month:.3f}", f"job ${usd:.3f}", month / usd))


if __name__ == "__main__":
    main(sys.argv[1:])
