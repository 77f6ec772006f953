"""What a create body (``PUT /asks/{id}/``) may hold, as the instance's ``config``, and the
script its container runs.

Vast refuses what breaks create's own limits with 400 ``invalid_args`` (``invalid_price`` for a
price out of range); the body is normalised into the ``config`` stored with the instance.
"""

from __future__ import annotations

import itertools
import shlex
from typing import Any

from sandbox.errors import ApiError

# Create's own limits (vast-ai/docs create_instance.yaml): label at most 256 characters,
# onstart + args (+ args_str) at most 4,096 together, disk at least 8 GB.
CREATE_LABEL_MAX = 256
CREATE_SCRIPT_MAX = 4096
DISK_MIN_GB = 8.0
PRICE_MIN, PRICE_MAX = 0.001, 128.0
DEFAULT_DISK_GB = 10.0  # the SDK's default; the docs say 8


def validated_config(body: dict) -> dict:
    """The create body, validated and normalised (``docs/vast-api.md`` §3)."""
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_args", "body must be a JSON object")
    image = body.get("image")
    if not image or not isinstance(image, str):
        if body.get("template_hash_id"):
            raise ApiError(
                400, "invalid_args", "templates are not available in the sandbox; pass image"
            )
        raise ApiError(400, "invalid_args", "image is required")
    label = body.get("label")
    if label is not None and (not isinstance(label, str) or len(label) > CREATE_LABEL_MAX):
        raise ApiError(
            400, "invalid_args", f"label must be a string of at most {CREATE_LABEL_MAX} characters"
        )
    args = body.get("args")
    if args is not None and not isinstance(args, list):
        raise ApiError(400, "invalid_args", "args must be a list")
    script = len(body.get("onstart") or "") + len(str(body.get("args_str") or ""))
    script += sum(len(str(a)) for a in args or ())
    if script > CREATE_SCRIPT_MAX:
        raise ApiError(
            400,
            "invalid_args",
            f"onstart and args are {script} characters; at most {CREATE_SCRIPT_MAX} together",
        )
    return {
        "image": image,
        "disk": _disk(body.get("disk")),
        "label": label,
        "onstart": body.get("onstart") or "",
        "env": _env(body.get("env")),
        "runtype": body.get("runtype") or ("args" if args else "ssh"),
        "args": args,
        "price": _price(body.get("price")),
        "target_state": _target(body.get("target_state")),
        "template_hash_id": body.get("template_hash_id"),
        "image_login": _image_login(body.get("image_login")),
    }


def _image_login(value: Any) -> dict[str, str] | None:
    """The registry and user of ``image_login`` (docker login arguments, "-u USER -p TOKEN
    ghcr.io": vast-ai/docs creating-instances-with-api.mdx), never its password: Vast's
    documented instance object has no ``image_login`` (SDK 1.9.1 ``vastai/data/instance.py``:
    ``InstanceConfig`` sends it, ``Instance`` from ``GET /api/v1/instances/`` has no such
    field, while ``extra_env`` and ``onstart`` come back), so the sandbox keeps no copy of the
    token to show or leak. A non-string is refused (our reading: Vast documents a string)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ApiError(
            400, "invalid_args", "image_login must be a string of docker login arguments"
        )
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise ApiError(400, "invalid_args", f"image_login does not parse: {exc}") from exc
    user, rest, flags = "", [], iter(words)
    for word in flags:
        if word in ("-u", "--username"):
            user = next(flags, "")
        elif word in ("-p", "--password"):
            next(flags, "")  # the password: read past, never kept
        elif not word.startswith("-"):
            rest.append(word)
    return {"registry": rest[-1] if rest else "docker.io", "user": user}


def _disk(value: Any) -> float:
    if value is None:
        return DEFAULT_DISK_GB
    try:
        disk = float(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_args", "disk must be a number of GB") from exc
    if disk < DISK_MIN_GB:
        raise ApiError(400, "invalid_args", f"disk must be at least {DISK_MIN_GB:g} GB")
    return disk


def _env(value: Any) -> dict[str, str]:
    """``env`` as the SDK sends it (a JSON object); the OpenAPI's docker-flag string
    (``"-e A=b -p 8000:8000"``) is accepted too, but the object form is the reference."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, str):
        return _parse_docker_flags(value)
    raise ApiError(400, "invalid_args", "env must be an object of variable names to values")


def _parse_docker_flags(text: str) -> dict[str, str]:
    result, words = {}, shlex.split(text)
    for flag, value in itertools.pairwise(words):
        if flag == "-e" and "=" in value:
            key, _, val = value.partition("=")
            result[key] = val
        elif flag == "-p":
            result[f"-p {value}"] = "1"
    return result


def _price(value: Any) -> float | None:
    if value is None:
        return None
    try:
        price = float(value)
    except (TypeError, ValueError) as exc:
        raise ApiError(400, "invalid_price", "price must be a number") from exc
    if not PRICE_MIN <= price <= PRICE_MAX:
        raise ApiError(
            400, "invalid_price", f"price must be between {PRICE_MIN} and {PRICE_MAX} $/hour"
        )
    return price


def _target(value: Any) -> str:
    if value in (None, "running", "stopped"):
        return value or "running"
    raise ApiError(400, "invalid_args", "target_state must be 'running' or 'stopped'")


def container_script(config: dict) -> str:
    """What the container runs: the onstart script, or for the ``args`` runtype the
    entrypoint (carried in ``onstart`` by the CLI) followed by the args."""
    if config["runtype"] == "args" and config.get("args"):
        words = ([config["onstart"]] if config["onstart"] else []) + [
            str(a) for a in config["args"]
        ]
        return shlex.join(words) + "\n"
    return config["onstart"]
