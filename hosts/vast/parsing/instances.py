"""What Vast says of rented instances: ``Instance`` and the answers to create, stop and start,
whether an instance is still there, and whether its host's container runtime failed."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hosts.vast.parsing.prices import price_fields
from hosts.vast.parsing.values import (
    bool_or_none,
    first_present,
    float_or_none,
    int_or_none,
    mapping_field,
    str_or_none,
    utc_from_epoch,
)


@dataclass(frozen=True)
class Instance:
    """One rented instance (v1 list or show-one), in NomadGPU units."""

    id: int
    label: str | None
    actual_status: str | None
    intended_status: str | None
    cur_state: str | None
    next_state: str | None
    status_msg: str | None
    machine_id: int | None
    host_id: int | None
    gpu_name: str | None
    num_gpus: int | None
    is_bid: bool | None
    dph_base: float | None
    dph_total: float | None
    min_bid: float | None
    storage_usd_per_gb_hour: float | None
    download_usd_per_gb: float | None
    upload_usd_per_gb: float | None
    disk_space_gb: float | None
    start_date: datetime | None
    end_date: datetime | None
    image: str | None
    public_ipaddr: str | None
    env: Mapping[str, str] = mapping_field()
    raw: Mapping[str, Any] = mapping_field()


@dataclass(frozen=True)
class CreatedInstance:
    """What a successful create returned, plus the bid check (`is_bid` None: not verified)."""

    id: int
    instance_api_key: str | None
    created_stopped: bool
    is_bid: bool | None
    raw: Mapping[str, Any] = mapping_field()


@dataclass(frozen=True)
class StateChange:
    """Answer to stop/start. `queued`: Vast accepted it but waits for the GPU
    (docs/vast-api.md §5)."""

    instance_id: int
    state: str
    queued: bool
    message: str


@dataclass(frozen=True)
class InstancePresence:
    """Whether a requested instance still exists, and its status when it does."""

    id: int
    gone: bool
    instance: Instance | None

    @property
    def actual_status(self) -> str | None:
        return self.instance.actual_status if self.instance else None


def _env_dict(extra_env: Any) -> dict[str, str]:
    # docs/vast-api.md §4: `extra_env` is a list of [key, value] pairs (the SDK turns it into a
    # dict).
    if isinstance(extra_env, Mapping):
        return {str(k): str(v) for k, v in extra_env.items()}
    pairs = extra_env if isinstance(extra_env, list) else []
    return {str(p[0]): str(p[1]) for p in pairs if isinstance(p, list | tuple) and len(p) == 2}


def parse_instance(raw: Mapping[str, Any]) -> Instance:
    """One instance object (v1 list or show-one) → `Instance`."""
    return Instance(
        id=int_or_none(raw.get("id")) or 0,
        label=str_or_none(raw.get("label")),
        actual_status=str_or_none(raw.get("actual_status")),
        intended_status=str_or_none(raw.get("intended_status")),
        cur_state=str_or_none(raw.get("cur_state")),
        next_state=str_or_none(raw.get("next_state")),
        status_msg=str_or_none(raw.get("status_msg")),
        machine_id=int_or_none(raw.get("machine_id")),
        host_id=int_or_none(raw.get("host_id")),
        gpu_name=str_or_none(raw.get("gpu_name")),
        num_gpus=int_or_none(raw.get("num_gpus")),
        is_bid=bool_or_none(raw.get("is_bid")),
        **price_fields(raw),
        disk_space_gb=float_or_none(raw.get("disk_space")),
        start_date=utc_from_epoch(raw.get("start_date")),
        end_date=utc_from_epoch(raw.get("end_date")),
        image=str_or_none(first_present(raw, "image_uuid", "image")),
        public_ipaddr=str_or_none(raw.get("public_ipaddr")),
        env=_env_dict(raw.get("extra_env")),
        raw=dict(raw),
    )


# What a status_msg says when the host's container runtime could not create the container:
# Docker's "OCI runtime create failed" (dstack's Vast backend, compute.py, fails a `created`
# instance on it), the NVIDIA runtime's CDI and nvidia-container-cli errors inside it (a
# recorded instance body: "... OCI runtime create failed: ... failed to inject CDI devices:
# unresolvable CDI devices"). The host's fault, not the image's: a missing image or a failed
# pull reads otherwise ("manifest ... not found", "error pulling image").
_RUNTIME_FAILED = re.compile(
    r"OCI runtime create failed|failed to inject CDI devices|unresolvable CDI devices"
    r"|nvidia-container-cli: initialization error",
    re.IGNORECASE,
)


# Docker's pull output, which Vast relays in ``status_msg`` while an instance loads (recorded
# instance bodies carry lines such as "Pulling from <repo>" and "<layer>: Retrying in 5
# seconds"). Its words, as ``docker image pull`` prints them
# (https://docs.docker.com/reference/cli/docker/image/pull/, the examples): "Status: Image is
# up to date for IMAGE" when the host already held the image; "Pulling from", "Pulling fs
# layer", "Downloading", "Download complete", "Extracting", "Pull complete" and "Status:
# Downloaded newer image for IMAGE" while or after it pulls. ("Already exists" is one layer
# found, not the image: it says nothing alone.)
IMAGE_PULLED, IMAGE_KEPT = "pulled", "kept"
_SAYS_KEPT = re.compile(r"Image is up to date", re.IGNORECASE)
_SAYS_PULLED = re.compile(
    r"Pulling from|Pulling fs layer|Downloading|Download complete|Extracting|Pull complete"
    r"|Downloaded newer image",
    re.IGNORECASE,
)


def image_pull_seen(status_msg: str | None) -> str | None:
    """What Docker's words in a loading instance's ``status_msg`` say of its image:
    ``IMAGE_PULLED`` (it is being or was pulled), ``IMAGE_KEPT`` (the host held it), or None
    (they say neither)."""
    text = status_msg or ""
    if _SAYS_KEPT.search(text):
        return IMAGE_KEPT
    return IMAGE_PULLED if _SAYS_PULLED.search(text) else None


def container_runtime_failed(status_msg: str | None) -> bool:
    """Whether an instance's ``status_msg`` says the host's container runtime failed to create
    the container: a host fault, which no restart or higher bid on that host fixes."""
    return bool(_RUNTIME_FAILED.search(status_msg or ""))


def instance_from_show(body: Any) -> Instance | None:
    """Show-one answer → `Instance`, or None when Vast says `{"instances": null}`
    (docs/vast-api.md §4).

    The key is plural but holds one object; tolerate a one-element list too.
    """
    found = body.get("instances") if isinstance(body, Mapping) else None
    if isinstance(found, list):
        found = found[0] if found else None
    return parse_instance(found) if isinstance(found, Mapping) else None


def instance_presence(
    ids: Iterable[int], listed: Iterable[Instance]
) -> dict[int, InstancePresence]:
    """Decide, for each requested id, whether the instance is present or gone.

    Gone: absent from the complete instance list, or released (`cur_state == "unloaded"`,
    which docs/vast-api.md §4 documents as what destroy leaves behind).
    """
    by_id = {i.id: i for i in listed}
    result = {}
    for instance_id in ids:
        found = by_id.get(instance_id)
        gone = found is None or found.cur_state == "unloaded"
        result[instance_id] = InstancePresence(instance_id, gone, None if gone else found)
    return result
