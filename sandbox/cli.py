"""Command line: ``serve`` the marketplace, ``inject`` a failure, ``instances`` and ``machines``
to look inside.

Runs without Django (``python -m sandbox ...``); ``manage.py sandbox ...`` is a thin
wrapper that only supplies the default state directory from the ``SANDBOX_DIR`` setting.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sandbox import weather
from sandbox.bids import BidSettings
from sandbox.engine.buyer_hazards import BUYER_HAZARDS
from sandbox.engine.faults import INSTANCE_ACTIONS
from sandbox.image_cache import GUESSED_WIPE_CHANCE
from sandbox.timing import HOST_RETURN_MEAN_S, HOST_RETURN_P, Timing, image_name

DEFAULT_STATE_DIR = Path(__file__).resolve().parents[1] / "var" / "sandbox"
DEFAULT_URL = "http://127.0.0.1:8700"
GLOBAL_ACTIONS = ("ratelimit", "refuse-ask", *BUYER_HAZARDS)


def build_parser(default_state_dir: Path) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox", description="Local Vast.ai-compatible marketplace."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the marketplace (HTTP, Vast REST API)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--port", type=int, default=8700, help="0 picks a free port (see server.json)"
    )
    serve.add_argument(
        "--seed", type=int, default=None, help="pre-rent a seeded share of asks; jitter timings"
    )
    serve.add_argument(
        "--market", type=Path, default=None, help="offers JSON (default: the bundled market)"
    )
    serve.add_argument("--state-dir", type=Path, default=default_state_dir)
    serve.add_argument(
        "--api-key", action="append", dest="api_keys", help="one account per key (repeatable)"
    )
    serve.add_argument("--credit", type=float, default=100.0, help="opening top-up per account, $")
    serve.add_argument(
        "--relaxed-rate-limits", action="store_true", help="no per-endpoint minimum intervals"
    )
    serve.add_argument(
        "--retry-after", action="store_true", help="send Retry-After on 429 (Vast does not)"
    )
    serve.add_argument(
        "--fast", action="store_true", help="every phase 0.1-1 s, transfers 100x faster"
    )
    serve.add_argument(
        "--time-scale", type=float, default=None, help="multiply simulated durations"
    )
    serve.add_argument(
        "--host-return-p",
        type=float,
        default=HOST_RETURN_P,
        help=f"share of rebooted hosts (reboot-host) that come back (default {HOST_RETURN_P})",
    )
    serve.add_argument(
        "--host-return-mean-s",
        type=_positive,
        default=HOST_RETURN_MEAN_S,
        help="mean real seconds until a rebooted host comes back, exponential, seeded "
        f"(default {HOST_RETURN_MEAN_S:g}; scaled like every duration)",
    )
    serve.add_argument(
        "--free-image-pull", action="store_true", help="do not bill image pulls as download"
    )
    serve.add_argument(
        "--image-wipe-chance",
        type=_probability,
        default=None,
        help="chance a host wiped a machine's pulled image before its next rental (seeded; "
        f"default {GUESSED_WIPE_CHANCE:g}, a guess: not published; 0 under --fast)",
    )
    serve.add_argument(
        "--scheduling-s",
        type=_non_negative,
        default=None,
        help="a fixed created → loading in real seconds (default: drawn, 60-300 s)",
    )
    serve.add_argument(
        "--byte-scale",
        type=_positive,
        default=1.0,
        help="links carry this many times their bytes (a bench sending scaled-down bytes)",
    )
    serve.add_argument(
        "--image-size",
        action="append",
        default=[],
        type=_image_size,
        metavar="IMAGE=BYTES",
        help="the download size of an image (repeatable; wins over the built-in table)",
    )
    market = serve.add_argument_group(
        "interruptible market (sandbox/bids.py); under --fast both are off unless given"
    )
    market.add_argument(
        "--outbid-rate-per-h",
        type=_non_negative,
        default=None,
        help="other tenants outbid a running bid at base * exp(-margin / scale) per sandbox "
        f"hour; this is the base (default {BidSettings.outbid_rate_per_h}, 0 under --fast; 0: off)",
    )
    market.add_argument(
        "--outbid-margin-scale",
        type=_positive,
        default=BidSettings.margin_scale,
        help="margin (bid / min_bid - 1) that divides the rate by e (default %(default)s)",
    )
    market.add_argument(
        "--outbid-hold-h",
        type=_positive,
        default=BidSettings.hold_h,
        help="mean sandbox hours the higher bidder keeps the machine; inf: until outbid in "
        "turn (default %(default)s)",
    )
    market.add_argument(
        "--min-bid-step-pct",
        type=_percent,
        default=None,
        help="each sandbox hour every min_bid moves by up to ±this %% (seeded), within "
        f"0.3-1 * dph_base (default {BidSettings.min_bid_step_pct:g}, 0 under --fast; 0: fixed)",
    )
    serve.add_argument(
        "--market-weather",
        choices=weather.WEATHERS,
        default=None,
        help="how rentals fail on their own (sandbox/weather.py): none (nothing fails unasked), "
        "good, typical or bad (first attempts succeed about 95 / 75 / 40 %%); default: "
        f"${weather.ENV_VAR}, else none; under --fast only this flag sets it",
    )
    serve.add_argument(
        "--start-weather",
        choices=weather.WEATHERS[1:],
        default="",
        help="in weather none, draw created → loading as this weather does (sandbox/weather.py:"
        " cached hosts 25-70 s, busy hosts 2-5 min), none of its failures",
    )
    serve.add_argument("--verbose", action="store_true", help="log every request")
    inject = sub.add_parser("inject", help="inject a failure into a running sandbox")
    inject.add_argument("action", choices=(*INSTANCE_ACTIONS, *GLOBAL_ACTIONS))
    inject.add_argument(
        "target",
        nargs="?",
        help="instance id (ratelimit: the seconds; refuse-ask, double-sell, create-timeout: "
        "the ask id)",
    )
    inject.add_argument("arg", nargs="?", help="hang|clear, FACTOR, PERCENT, end, SECONDS ...")
    inject.add_argument("--url", default=os.environ.get("SANDBOX_URL", DEFAULT_URL))
    show = sub.add_parser("instances", help="print every instance's sandbox-side state as JSON")
    show.add_argument("--url", default=os.environ.get("SANDBOX_URL", DEFAULT_URL))
    machines = sub.add_parser(
        "machines", help="print every machine's hidden traits in the market weather, as JSON"
    )
    machines.add_argument("--url", default=os.environ.get("SANDBOX_URL", DEFAULT_URL))
    return parser


def main(argv: list[str] | None = None, default_state_dir: Path | None = None) -> int:
    args = build_parser(
        Path(default_state_dir or os.environ.get("SANDBOX_DIR") or DEFAULT_STATE_DIR)
    ).parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "inject":
        return inject(args)
    if args.command == "machines":
        return _print(_call(args.url, "GET", "/sandbox/machines"))
    return _print(_call(args.url, "GET", "/sandbox/instances"))


def serve(args: argparse.Namespace) -> int:
    from sandbox.server import App, Options

    try:
        market_weather = chosen_weather(args)
    except ValueError as exc:
        print(f"sandbox serve: {exc} (set by ${weather.ENV_VAR})", file=sys.stderr)
        return 2
    timing = Timing.fast(args.seed) if args.fast else Timing(seed=args.seed)
    if args.time_scale is not None:
        timing = dataclasses.replace(timing, scale=args.time_scale)
    fixed = timing.scheduling_fixed_s if market_weather == weather.NONE else None
    timing = dataclasses.replace(
        timing,
        host_return_p=args.host_return_p,
        host_return_mean_s=args.host_return_mean_s,
        # --scheduling-s wins; else --fast's flat 3 s, unless a weather draws the start.
        scheduling_fixed_s=fixed if args.scheduling_s is None else args.scheduling_s,
        byte_scale=args.byte_scale,
        image_sizes=tuple(args.image_size),
        start_weather=args.start_weather,
    )
    options = Options(
        bids=bid_settings(args),
        state_dir=args.state_dir,
        host=args.host,
        port=args.port,
        market=args.market,
        seed=args.seed,
        api_keys=args.api_keys or ["sandbox-key"],
        credit=args.credit,
        relaxed_rate_limits=args.relaxed_rate_limits,
        retry_after=args.retry_after,
        timing=timing,
        bill_image_pull=not args.free_image_pull,
        image_wipe_chance=image_wipe_chance(args),
        market_weather=market_weather,
        verbose=args.verbose,
    )
    # SIGTERM ends serve_forever like Ctrl-C does, so instances are shut down cleanly.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        App(options).serve()
    return 0


def bid_settings(args: argparse.Namespace) -> BidSettings:
    """The interruptible market's settings. Under ``--fast`` (every test sandbox) random outbids
    and the min_bid walk are off unless their flag is given, so tests that rent a bid stay
    deterministic; otherwise both run with their defaults."""
    default = BidSettings.off() if args.fast else BidSettings()
    rate, step = args.outbid_rate_per_h, args.min_bid_step_pct
    return BidSettings(
        outbid_rate_per_h=default.outbid_rate_per_h if rate is None else rate,
        margin_scale=args.outbid_margin_scale,
        hold_h=args.outbid_hold_h,
        min_bid_step_pct=default.min_bid_step_pct if step is None else step,
    )


def chosen_weather(args: argparse.Namespace) -> str:
    """The market weather: ``--market-weather``, else ``$SANDBOX_MARKET_WEATHER`` (how the
    Procfile sets it), else ``none``. Under ``--fast`` (every test sandbox) only the flag sets
    it, so a variable left in a shell never makes a test's rentals fail."""
    if args.market_weather is not None:
        return args.market_weather
    if args.fast:
        return weather.NONE
    return weather.weather_of(os.environ.get(weather.ENV_VAR))


def image_wipe_chance(args: argparse.Namespace) -> float:
    """The chance a host wiped a machine's image between rentals: the flag's, else the guess
    (``image_cache.GUESSED_WIPE_CHANCE``); 0 under ``--fast`` unless given, like the other
    random processes, so tests that rent a machine twice see the same start every time."""
    if args.image_wipe_chance is not None:
        return args.image_wipe_chance
    return 0.0 if args.fast else GUESSED_WIPE_CHANCE


def _probability(text: str) -> float:
    value = _number(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def _image_size(text: str) -> tuple[str, int]:
    name, sep, size = text.rpartition("=")
    if not sep or not name or not size.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not IMAGE=BYTES")
    return image_name(name), int(size)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if math.isnan(value):
        raise argparse.ArgumentTypeError("not a number")
    return value


def _non_negative(text: str) -> float:
    value = _number(text)
    if value < 0 or math.isinf(value):
        raise argparse.ArgumentTypeError("must be a finite number >= 0")
    return value


def _positive(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _percent(text: str) -> float:
    value = _non_negative(text)
    if value >= 100:
        raise argparse.ArgumentTypeError("must be under 100")
    return value


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def inject(args: argparse.Namespace) -> int:
    """``inject ACTION INSTANCE_ID [ARG]``; ``inject ratelimit SECONDS``, ``inject refuse-ask
    ASK_ID``, ``inject double-sell ASK_ID`` and ``inject create-timeout ASK_ID`` need no
    instance."""
    if args.action in GLOBAL_ACTIONS:
        value = args.arg if args.arg is not None else args.target
        return _print(
            _call(args.url, "POST", "/sandbox/inject", {"action": args.action, "arg": value})
        )
    if not args.target or not args.target.isdigit():
        print(f"inject {args.action}: give the instance id", file=sys.stderr)
        return 2
    arg = args.arg
    if args.action == "gpu-fault" and arg is None:
        arg = "error"
    return _print(
        _call(
            args.url, "POST", f"/sandbox/inject/{args.target}", {"action": args.action, "arg": arg}
        )
    )


def _call(base: str, method: str, path: str, body: dict | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(  # noqa: S310 - the URL is the operator's own sandbox
        base.rstrip("/") + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    # The sandbox is local; never send this through an instance's metering proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except urllib.error.URLError as exc:
        return 0, {"success": False, "msg": f"cannot reach the sandbox at {base}: {exc.reason}"}


def _print(result: tuple[int, Any]) -> int:
    status, body = result
    print(json.dumps(body, indent=2))
    return 0 if 200 <= status < 300 else 1
